"""The parameters of one simulation (a frozen value) and the policies it compares."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from flexlease.api.tiers import Tier
from flexlease.sim.traces import DAY

DEFAULT_DATA_DIR: Final = Path(__file__).resolve().parents[2] / "data"
"""The repository's ``data/`` folder (the trace extracts, each with a page giving its source and
licence: ``data/README.md``). It is found from this file, so a run from a clone (editable install
or ``PYTHONPATH``) reads it; an installed wheel carries no data, and the simulator then falls back
to synthetic arrivals and says so in its report."""


TIDE_KINDS: Final = ("fig2", "irregular")
"""The online job's demand curves (``Scenario.tide_kind``)."""
AUTOPILOT_MODES: Final = ("off", "prometheus", "forecast", "schedule")
"""Who sizes the online job (``Scenario.autopilot``): ``off`` — the hand-written tide policy
(§4.4: half the GPUs lent below a threshold, all reclaimed above one); else the lease autopilot
with a ``GPULeasePolicy`` of that demand source."""


class Policy(enum.StrEnum):
    """``ror``: right-of-return (Lend tags, Reclaim with graceful eviction and standby
    supplements); ``plain``: plain leasing (scale-down deletes pods, scale-up takes any GPUs);
    ``static``: no scaling — the job keeps its peak allocation, nothing is lent (the paper's
    "no scaling" line of Fig. 14 and the "no leasing" LP baseline of Fig. 10)."""

    ROR = "ror"
    PLAIN = "plain"
    STATIC = "static"


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything a run depends on. Times in simulated seconds, loads in GPUs, ratios 0–1.

    * cluster: ``nodes`` general nodes and ``standby_nodes`` standby nodes of
      ``gpus_per_node`` GPUs; ``gpu_models``: (NVML product name, share of the nodes) —
      with more than one model every job asks for one (the ``gpu-type`` annotation): the
      online job for the first, each LP job for one drawn by the shares;
    * online job: ``online_gpus`` at peak (default: half the general GPUs), scheduled at
      t = 0 like any job, pods of ``gpus_per_node`` GPUs, requiring ``online_reliability``;
    * LP load: ``trace`` (``philly``, ``alibaba`` or ``synthetic``; a missing file falls back
      to synthetic) from ``data_dir``, offered load ``lp_load`` × the GPUs the online job
      leaves free at peak, run times capped at ``lp_max_duration``; a job is a gang of pods
      scheduled all or nothing, retried after ``lp_retry_base`` doubling up to
      ``lp_retry_max``, withdrawn after ``lp_max_wait`` without running; a request counts as
      granted when its gang runs within ``lp_patience`` of its arrival (Fig. 10);
    * restarts of the online job (scale events, a pod lost to a GPU failure):
      ``restart_in_situ_s`` with right-of-return (the paper's interruption-mitigation
      pipeline: "a few tens of seconds", §4.5), ``restart_full_s`` otherwise (native
      scaling: "roughly 30 minutes", §2 Fig. 4, §4.5 Fig. 13);
    * stress (right-of-return at the edges): ``tide_kind`` ``fig2`` (the Fig. 2 tide, shaped by
      the Helios signal unless ``shape_tide`` is off) or ``irregular``
      (:class:`flexlease.sim.tide.IrregularTide`: troughs and peaks from 10 minutes to 6 hours,
      seeded); ``failure_scale`` multiplies the failure rates of the Fig. 5 model (more GPUs
      fail while lent, more standby supplements are held and lent again);
    * time: ``days`` simulated, one scheduling round every ``tick``; the first ``warmup``
      seconds are left out of the fulfilment figures;
    * tiers: ``tier_window`` and ``tier_refresh`` (the node agents' settings; both 14 days
      by default, as in the paper);
    * lease controller: ``grace_period_seconds`` on every GPULease, ``lend_timeout`` (how
      long a Lend may take before it is reported), ``standby_wait`` (the controller's
      ``lease.standby_wait_seconds``: how long a Reclaim waits for a standby replacement before
      it lists the GPU unrecoverable), ``lease_enabled`` (False runs the
      extender without its controller, to show that it is noticed), ``standby_refill``
      (the controller keeps the standby pool at its initial size, ``standby_nodes`` ×
      ``gpus_per_node`` GPUs, moving whole free nodes into it; False leaves it as set up),
      ``standby_mode`` (``fixed``: that size; ``adaptive``: the controller's
      ``lease.standby.mode: adaptive``, per model the p99 of the Done Reclaims' shortfalls
      within ``standby_window`` + ``standby_floor``, starting from the ``standby_nodes`` set up);
    * demand (:class:`flexlease.sim.demandtrace.DemandTrace`): the tide with day-to-day noise
      ``demand_noise`` (standard deviation of a daily level around 1) and ``surprise_peaks`` per
      day (both 0: the tide itself, as before issue #40);
    * ``autopilot`` (right-of-return only): ``off`` (the hand-written tide policy) or the real
      lease autopilot in the hosted extender with a ``GPULeasePolicy`` whose demand source is
      ``prometheus`` (the demand now, with a reactive threshold fallback), ``forecast`` (the
      seasonal model trained on the trace's 14 days before t = 0 and retrained daily) or
      ``schedule`` (the Fig. 2 tide's hours as windows); ``autopilot_lead`` is its ``leadTime``
      (seconds). The job then follows the autopilot's leases: a Lend of N releases N GPUs, a
      Reclaim of N takes N back.
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
    tide_kind: str = "fig2"
    failure_scale: float = 1.0
    lp_load: float = 3.0
    lp_max_duration: float = 7 * DAY
    lp_patience: float = 600.0
    lp_retry_base: float = 600.0
    lp_retry_max: float = 3600.0
    lp_max_wait: float = 3600.0
    restart_in_situ_s: float = 30.0
    restart_full_s: float = 1800.0
    alibaba_gpu_scale: float = 0.08
    tier_window: float = 14 * DAY
    tier_refresh: float = 14 * DAY
    grace_period_seconds: int = 30
    lend_timeout: float = 300.0
    standby_wait: float = 600.0
    lease_enabled: bool = True
    standby_refill: bool = True
    standby_mode: str = "fixed"
    standby_floor: int = 0
    standby_window: float = 14 * DAY
    gpu_models: tuple[tuple[str, float], ...] = (("NVIDIA H20", 1.0),)
    demand_noise: float = 0.0
    surprise_peaks: float = 0.0
    autopilot: str = "off"
    autopilot_lead: int = 600

    def __post_init__(self) -> None:
        if self.nodes < 2 or self.gpus_per_node < 1 or self.standby_nodes < 0:
            raise ValueError("need nodes >= 2, gpus_per_node >= 1, standby_nodes >= 0")
        if self.days <= 0 or self.tick <= 0 or self.tick > 3600 or 3600 % self.tick:
            raise ValueError("days must be positive and tick must divide an hour")
        if self.trace not in ("philly", "alibaba", "synthetic"):
            raise ValueError(f"trace must be philly, alibaba or synthetic, not {self.trace!r}")
        if self.online_gpus is not None and not 0 < self.online_gpus <= self.general_gpus:
            raise ValueError("online_gpus must be within 1..general GPUs")
        if not self.gpu_models or any(not m or f <= 0 for m, f in self.gpu_models):
            raise ValueError("gpu_models needs at least one (model, share > 0)")
        if len({m for m, _ in self.gpu_models}) != len(self.gpu_models):
            raise ValueError("gpu_models names a model twice")
        if self.tide_kind not in TIDE_KINDS:
            raise ValueError(f"tide must be one of {', '.join(TIDE_KINDS)}, not {self.tide_kind!r}")
        if self.standby_mode not in ("fixed", "adaptive"):
            raise ValueError(f"standby_mode must be fixed or adaptive, not {self.standby_mode!r}")
        if self.standby_floor < 0 or self.standby_window <= 0:
            raise ValueError("standby_floor must be >= 0 and standby_window positive")
        if self.autopilot not in AUTOPILOT_MODES:
            raise ValueError(f"autopilot must be one of {', '.join(AUTOPILOT_MODES)}, not {self.autopilot!r}")
        if not 0 <= self.demand_noise <= 1 or self.surprise_peaks < 0:
            raise ValueError("demand_noise must be within [0, 1] and surprise_peaks >= 0")
        if not 0 <= self.autopilot_lead <= 86_400:
            raise ValueError("autopilot_lead must be within [0, 86400] seconds")
        if self.standby_wait <= 0:
            raise ValueError("standby_wait must be positive")
        if not 0 < self.failure_scale <= 100:
            raise ValueError("failure_scale must be within (0, 100]")
        if self.lp_load <= 0 or self.lp_patience < 0:
            raise ValueError("lp_load must be positive, lp_patience >= 0")

    @property
    def general_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def mixed(self) -> bool:
        """More than one GPU model: jobs ask for a type."""
        return len(self.gpu_models) > 1

    @property
    def standby_pool_size(self) -> int:
        """GPUs the lease controller keeps in the standby pool (0: leave it alone)."""
        return self.standby_nodes * self.gpus_per_node if self.standby_refill else 0

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


def parse_gpu_models(text: str) -> tuple[tuple[str, float], ...]:
    """``"NVIDIA H20:0.7,NVIDIA H100 80GB HBM3:0.3"`` → ((model, share), ...); shares are
    normalised to sum to 1. Raises ``ValueError`` on a malformed entry or a share <= 0."""
    out: list[tuple[str, float]] = []
    for part in text.split(","):
        name, sep, share = part.strip().rpartition(":")
        if not sep or not name.strip():
            raise ValueError(f"--gpu-models entry {part!r} is not MODEL:SHARE")
        try:
            value = float(share)
        except ValueError as exc:
            raise ValueError(f"--gpu-models share {share!r} is not a number") from exc
        if value <= 0:
            raise ValueError(f"--gpu-models share of {name.strip()!r} must be > 0")
        out.append((name.strip(), value))
    total = sum(v for _, v in out)
    return tuple((m, v / total) for m, v in out)


def assign_models(names: list[str], models: tuple[tuple[str, float], ...]) -> dict[str, str]:
    """Give each node of ``names`` a model so that the counts follow the shares (largest
    remainders; every model at least one node when there are enough nodes), spread over
    the names round-robin so that no model is bunched at one end."""
    n = len(names)
    counts = [int(share * n) for _, share in models]
    if n >= len(models):
        counts = [max(1, c) for c in counts]
    order = sorted(range(len(models)), key=lambda i: -(models[i][1] * n - int(models[i][1] * n)))
    i = 0
    while sum(counts) < n:
        counts[order[i % len(order)]] += 1
        i += 1
    while sum(counts) > n:
        j = max(range(len(counts)), key=lambda k: counts[k])
        counts[j] -= 1
    sequence: list[str] = []
    left = list(counts)
    while len(sequence) < n:
        for k, (model, _) in enumerate(models):
            if left[k] > 0:
                sequence.append(model)
                left[k] -= 1
    return dict(zip(names, sequence, strict=True))
