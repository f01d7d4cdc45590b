"""What a simulation run measures, and the summaries of the report (pure; no I/O).

* Fig. 14 — :class:`Sample`: every simulated hour, the online job's GPUs and how many are
  HA, the cluster's HA share, the job's size and standby use.
* Fig. 10 — :class:`LpRequest`: every low-priority pod's arrival, GPUs and bind time;
  :func:`fulfilment_by_hour` is the share of requested GPUs granted within the patience
  window, by hour of day of the request (WeFlex §4.3.2: "if the tenant requests 100 GPUs,
  only roughly 40 are granted immediately").
* Reclaim completeness — :class:`Cycle`: per lend/reclaim cycle, the GPUs released, the
  GPUs lent (tagged, in kind), and how each ended (before the reclaim, back as the same device,
  supplemented from the standby pool, unrecoverable, still lent, lost), and latencies.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from flexlease.sim.traces import DAY


@dataclass(frozen=True, slots=True)
class Sample:
    """One hourly observation. ``t`` in seconds since the start; counts in GPUs."""

    t: float
    job_gpus: int
    job_ha: int
    cluster_ha_share: float
    full: bool
    job_standby_gpus: int
    standby_in_use: int
    lp_running_gpus: int
    static_ha_share: float
    standby_idle: int = 0
    """Standby-pool GPUs that are healthy, held by no pod and untagged: waiting for a Reclaim."""

    @property
    def job_ha_share(self) -> float | None:
        return self.job_ha / self.job_gpus if self.job_gpus else None


@dataclass(frozen=True, slots=True)
class LpRequest:
    """A low-priority pod: arrival (s), GPUs, and bind time (s) or None if never bound."""

    arrival: float
    gpus: int
    bound: float | None


OUTCOMES: Final = (
    "returned_before_reclaim",
    "reclaimed_same",
    "supplemented",
    "unrecoverable",
    "still_lent",
    "left_on_loan",
    "lost",
)
"""The :class:`Cycle` fields that count how lent GPUs ended, in the report's order: each lent
(or carried-in) GPU is counted in exactly one of them."""


@dataclass(slots=True)
class Cycle:
    """One scale-down/scale-up cycle of the online job (times in simulated seconds), accounted
    per lent GPU from device identities (:class:`flexlease.rightofreturn.Audit`).

    Its Lend (``lend``) lent ``lent_tagged`` GPUs with the job's tag and ``lent_in_kind`` standby
    supplements back to the standby pool; its Reclaim (``reclaim``) also took ``carried_in``
    GPUs a Cancelled Reclaim had handed back. Each ended as exactly one of
    ``returned_before_reclaim`` (the job's pods took it before the Reclaim), ``reclaimed_same``
    (back as itself), ``supplemented`` (its standby replacement held by the job),
    ``unrecoverable`` (listed by the Reclaim, with ``unrecoverable_reasons``) or ``still_lent``
    (the Reclaim was Cancelled by the next Lend: it carries over); ``lost``: lent GPUs left with
    none of these when the cycle closed (an invariant violation). ``closed``: the Reclaim
    finished and the cycle was accounted. ``lend_s``/``reclaim_s``: how long the Lend/Reclaim
    took on the simulated clock."""

    down_at: float
    released: int
    up_at: float | None = None
    lend: str | None = None
    reclaim: str | None = None
    lent_tagged: int = 0
    lent_in_kind: int = 0
    lent_untagged: int = 0
    carried_in: int = 0
    earlier_loans: int = 0
    """Targets of its Reclaim lent in an earlier cycle and left out by that cycle's Reclaim."""
    returned_before_reclaim: int = 0
    reclaimed_same: int = 0
    supplemented: int = 0
    unrecoverable: int = 0
    unrecoverable_reasons: dict[str, int] = field(default_factory=dict)
    still_lent: int = 0
    left_on_loan: int = 0
    """Lent by its Lend, not claimed by its Reclaim and still out on loan when the cycle closed
    (the autopilot reclaims what its plan needs, not every loan): a later Reclaim's earlier
    loans. Always 0 with the tide policy, whose Reclaims take every loan."""
    lost: int = 0
    same_devices_back: int = 0
    lend_phase: str | None = None
    reclaim_phase: str | None = None
    lend_s: float | None = None
    reclaim_s: float | None = None
    closed: bool = False
    supplement_model_mismatches: list[str] = field(default_factory=list)
    supplements_listed: int = 0
    """Replacements in the Reclaim's ``status.supplementedFromStandby``."""
    supplement_events: int | None = None
    """``Supplemented`` Events the lease controller wrote for the Reclaim, counted once it
    finished (None: it did not finish); each replacement is announced by one."""
    restored_at: float | None = None
    lp_pods_evicted: int = 0
    lp_pods_preempted: int = 0
    fallback_preemptions: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def lent(self) -> int:
        """GPUs its Lend lent with a right of return (tagged or in kind)."""
        return self.lent_tagged + self.lent_in_kind

    @property
    def complete(self) -> bool:
        """Closed, and every GPU lent or carried in came back as itself or as a standby
        replacement (none unrecoverable, none still lent, none lost)."""
        return (
            self.up_at is not None
            and self.closed
            and self.lost == 0
            and self.unrecoverable == 0
            and self.still_lent == 0
        )

    def balance(self) -> int:
        """``lent + carried in + earlier loans`` less the :data:`OUTCOMES` (returned before
        the reclaim, back, replaced, unrecoverable, still lent, lost): 0 when every GPU is
        counted once."""
        ended = sum(int(getattr(self, name)) for name in OUTCOMES)
        return self.lent + self.carried_in + self.earlier_loans - ended

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["lent"] = self.lent
        out["complete"] = self.complete
        return out


def fulfilment_by_hour(
    requests: Sequence[LpRequest], *, patience: float, since: float = 0.0
) -> list[float | None]:
    """Per hour of day (24 entries) of the request: Σ GPUs bound within ``patience`` seconds
    of arrival / Σ GPUs requested (ratio 0–1; None for an hour with no request). Requests
    before ``since`` (the warm-up) are ignored."""
    asked = [0] * 24
    granted = [0] * 24
    for r in requests:
        if r.arrival < since:
            continue
        h = int((r.arrival % DAY) // 3600)
        asked[h] += r.gpus
        if r.bound is not None and r.bound - r.arrival <= patience:
            granted[h] += r.gpus
    return [g / a if a else None for g, a in zip(granted, asked, strict=True)]


def gpus_by_hour(
    requests: Sequence[LpRequest], *, patience: float, since: float = 0.0
) -> tuple[list[int], list[int]]:
    """Per hour of day of the request (24 entries): GPUs requested and GPUs granted within
    ``patience`` seconds, summed over the requests from ``since`` on."""
    asked = [0] * 24
    granted = [0] * 24
    for r in requests:
        if r.arrival < since:
            continue
        h = int((r.arrival % DAY) // 3600)
        asked[h] += r.gpus
        if r.bound is not None and r.bound - r.arrival <= patience:
            granted[h] += r.gpus
    return asked, granted


def overall_fulfilment(
    requests: Sequence[LpRequest], *, patience: float, since: float = 0.0, hours: range = range(24)
) -> float | None:
    """GPU-weighted fulfilment over the requests whose hour of day is in ``hours``."""
    asked = granted = 0
    for r in requests:
        if r.arrival < since or int((r.arrival % DAY) // 3600) not in hours:
            continue
        asked += r.gpus
        if r.bound is not None and r.bound - r.arrival <= patience:
            granted += r.gpus
    return granted / asked if asked else None


def ha_share_summary(samples: Sequence[Sample], *, days: float = 7.0) -> dict[str, float | None]:
    """The job's HA share at full size: at the start (first sample), mean over the first
    and the last ``days`` days, and the cluster's mean HA share over the last ``days``."""
    full = [s for s in samples if s.full and s.job_gpus]
    if not full:
        return {
            "start": None,
            "first_days_mean": None,
            "last_days_mean": None,
            "cluster_last_days_mean": None,
        }
    end = full[-1].t
    first = [s.job_ha / s.job_gpus for s in full if s.t <= full[0].t + days * DAY]
    last = [s.job_ha / s.job_gpus for s in full if s.t >= end - days * DAY]
    cluster_last = [s.cluster_ha_share for s in samples if s.t >= end - days * DAY]
    static_last = [s.static_ha_share for s in samples if s.t >= end - days * DAY]
    return {
        "start": full[0].job_ha / full[0].job_gpus,
        "first_days_mean": statistics.fmean(first),
        "last_days_mean": statistics.fmean(last),
        "cluster_last_days_mean": statistics.fmean(cluster_last) if cluster_last else None,
        "static_last_days_mean": statistics.fmean(static_last) if static_last else None,
    }


def cycle_summary(cycles: Sequence[Cycle]) -> dict[str, Any]:
    """Totals over the cycles that scaled back up: how many closed and were complete, GPUs lent
    with a tag and in kind, carried in, and each outcome (returned before the reclaim, back as
    the same GPU, supplemented, unrecoverable by reason, still lent, lost); reclaim time
    (simulated s) mean and max; restore delay (simulated s) mean and max."""
    done = [c for c in cycles if c.up_at is not None]
    walls = [c.reclaim_s for c in done if c.reclaim_s is not None]
    delays = [c.restored_at - c.up_at for c in done if c.restored_at is not None and c.up_at is not None]
    reasons: dict[str, int] = {}
    for c in done:
        for reason, n in c.unrecoverable_reasons.items():
            reasons[reason] = reasons.get(reason, 0) + n
    return {
        "cycles": len(done),
        "closed_cycles": sum(1 for c in done if c.closed),
        "complete_cycles": sum(1 for c in done if c.complete),
        "released_gpus": sum(c.released for c in done),
        "lent_tagged": sum(c.lent_tagged for c in done),
        "lent_in_kind": sum(c.lent_in_kind for c in done),
        "lent_untagged": sum(c.lent_untagged for c in done),
        "carried_in": sum(c.carried_in for c in done),
        "earlier_loans": sum(c.earlier_loans for c in done),
        "returned_before_reclaim": sum(c.returned_before_reclaim for c in done),
        "reclaimed_same": sum(c.reclaimed_same for c in done),
        "supplemented": sum(c.supplemented for c in done),
        "unrecoverable": sum(c.unrecoverable for c in done),
        "unrecoverable_reasons": dict(sorted(reasons.items())),
        "still_lent": sum(c.still_lent for c in done),
        "left_on_loan": sum(c.left_on_loan for c in done),
        "lost": sum(c.lost for c in done),
        "same_devices_back": sum(c.same_devices_back for c in done),
        "restored_cycles": sum(1 for c in done if c.restored_at is not None),
        "reclaim_s_mean": statistics.fmean(walls) if walls else None,
        "reclaim_s_max": max(walls) if walls else None,
        "restore_delay_s_mean": statistics.fmean(delays) if delays else None,
        "restore_delay_s_max": max(delays) if delays else None,
        "lp_pods_evicted": sum(c.lp_pods_evicted for c in done),
        "lp_pods_preempted": sum(c.lp_pods_preempted for c in done),
        "fallback_preemptions": sum(c.fallback_preemptions for c in done),
    }
