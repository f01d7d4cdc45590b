"""The parameters of one simulation (a frozen value) and the policies it compares."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from flexlease.api.tiers import Tier
from flexlease.sim.traces import DAY

DEFAULT_DATA_DIR: Final = Path(__file__).resolve().parents[2].parent / "shared" / "data"
"""``../shared/data`` relative to the repository root."""


class Policy(enum.StrEnum):
    """``ror``: right-of-return (Lend tags, Reclaim with graceful eviction and standby
    supplements); ``plain``: plain leasing (scale-down deletes pods, scale-up takes any GPUs)."""

    ROR = "ror"
    PLAIN = "plain"


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything a run depends on. Times in simulated seconds, loads in GPUs, ratios 0–1.

    * cluster: ``nodes`` general nodes and ``standby_nodes`` standby nodes of
      ``gpus_per_node`` GPUs;
    * online job: ``online_gpus`` at peak (default: half the general GPUs), placed at t = 0
      on the nodes with the most HA GPUs (the operators' whitelist of §2/C3), pods of
      ``gpus_per_node`` GPUs, requiring ``online_reliability``;
    * LP load: ``trace`` (``philly``, ``alibaba`` or ``synthetic``; a missing file falls back
      to synthetic) from ``data_dir``, offered load ``lp_load`` × the GPUs the online job
      leaves free at peak, run times capped at ``lp_max_duration``, pods withdrawn after
      ``lp_patience`` pending;
    * time: ``days`` simulated, one scheduling round every ``tick``; the first ``warmup``
      seconds are left out of the fulfilment figures;
    * tiers: ``tier_window`` and ``tier_refresh`` (the node agents' settings);
    * lease controller: ``grace_period_seconds`` on every GPULease, ``lend_timeout`` (how
      long a Lend may take before it is reported), ``lease_enabled`` (False runs the
      extender without its controller, to show that it is noticed), ``standby_pool_size``
      (the controller keeps the standby pool at that many GPUs; 0 leaves it as set up).
    """

    nodes: int = 64
    gpus_per_node: int = 8
    standby_nodes: int = 4
    days: float = 60.0
    seed: int = 1
    tick: float = 600.0
    warmup: float = DAY
    online_gpus: int | None = None
    online_reliability: Tier = Tier.LA
    trace: str = "philly"
    data_dir: Path = DEFAULT_DATA_DIR
    shape_tide: bool = True
    lp_load: float = 3.0
    lp_max_duration: float = 7 * DAY
    lp_patience: float = 600.0
    alibaba_gpu_scale: float = 0.08
    tier_window: float = 14 * DAY
    tier_refresh: float = DAY
    grace_period_seconds: int = 30
    lend_timeout: float = 300.0
    lease_enabled: bool = True
    standby_pool_size: int = 0

    def __post_init__(self) -> None:
        if self.nodes < 2 or self.gpus_per_node < 1 or self.standby_nodes < 0:
            raise ValueError("need nodes >= 2, gpus_per_node >= 1, standby_nodes >= 0")
        if self.days <= 0 or self.tick <= 0 or self.tick > 3600 or 3600 % self.tick:
            raise ValueError("days must be positive and tick must divide an hour")
        if self.trace not in ("philly", "alibaba", "synthetic"):
            raise ValueError(f"trace must be philly, alibaba or synthetic, not {self.trace!r}")
        if self.online_gpus is not None and not 0 < self.online_gpus <= self.general_gpus:
            raise ValueError("online_gpus must be within 1..general GPUs")
        if self.lp_load <= 0 or self.lp_patience < 0:
            raise ValueError("lp_load must be positive, lp_patience >= 0")

    @property
    def general_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def job_gpus(self) -> int:
        """The online job's GPUs at peak."""
        if self.online_gpus is not None:
            return self.online_gpus
        return (self.nodes // 2) * self.gpus_per_node

    @property
    def horizon(self) -> float:
        return self.days * DAY

    @property
    def lp_target_load(self) -> float:
        """Mean GPUs the LP arrivals request."""
        return self.lp_load * (self.general_gpus - self.job_gpus)
