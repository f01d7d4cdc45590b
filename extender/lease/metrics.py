"""Prometheus metrics of the lease controller (prefix ``flexlease_lease_``), on an injected
``CollectorRegistry``.

Counters and the histogram are updated as the controller acts; the gauges (lent GPUs,
outstanding reclaims, standby pool) are yielded fresh at scrape time from the controller's
last cluster snapshot by a custom collector, as prometheus_client's ``process_collector``
does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LENT_GPUS: Final = "flexlease_lease_lent_gpus"
OUTSTANDING_RECLAIMS: Final = "flexlease_lease_outstanding_reclaims"
STANDBY_GPUS: Final = "flexlease_lease_standby_gpus"
STANDBY_TARGET: Final = "flexlease_lease_standby_target_gpus"
STANDBY_SHORTFALL: Final = "flexlease_lease_standby_shortfall_gpus"
RECLAIM_DURATION: Final = "flexlease_lease_reclaim_duration_seconds"
EVICTIONS_REFUSED: Final = "flexlease_lease_evictions_refused"
EVICTIONS: Final = "flexlease_lease_evictions"
NOTICES: Final = "flexlease_lease_preempt_notices"
SUPPLEMENTS: Final = "flexlease_lease_standby_supplements"
RECLAIMED_GPUS: Final = "flexlease_lease_reclaimed_gpus"
RECONCILE_ERRORS: Final = "flexlease_lease_reconcile_errors"
UNRECOVERABLE: Final = "flexlease_lease_unrecoverable_gpus"
SUPERSEDED: Final = "flexlease_lease_superseded"
UNRECOVERABLE_REASONS: Final = ("NoStandbyOfModel", "StandbyExhausted", "LendRecordIncomplete")
"""The ``reason`` values of :data:`UNRECOVERABLE` (``extender.lease.planner.UNRECOVERABLE_*``)."""

RECLAIM_BUCKETS: Final = (5.0, 15.0, 30.0, 45.0, 60.0, 90.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
"""Seconds; the grace period alone is 30–60 s, so most reclaims with LP pods land past 30."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Gauges:
    """State read at scrape time. ``lent``/``standby``: GPU counts by ``(model, tier)``."""

    lent: Mapping[tuple[str, str], int] = field(default_factory=dict)
    outstanding_reclaims: int = 0
    standby: Mapping[tuple[str, str], int] = field(default_factory=dict)
    standby_target: Mapping[str, int] = field(default_factory=dict)
    """Adaptive standby pool: the GPUs it grows to, by model (empty with ``mode: fixed``)."""
    standby_shortfall: Mapping[str, int] = field(default_factory=dict)
    """Adaptive standby pool: the quantile of the window's Reclaim shortfalls, by model."""


class _GaugeCollector(Collector):
    def __init__(self, metrics: LeaseMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        gauges = self._metrics.gauges
        lent = GaugeMetricFamily(
            LENT_GPUS, "GPUs tagged for an owner (lent with right of return), by type and tier.",
            labels=["model", "tier"],
        )  # fmt: skip
        for (model, tier), n in sorted(gauges.lent.items()):
            lent.add_metric([model, tier], n)
        yield lent
        yield GaugeMetricFamily(
            OUTSTANDING_RECLAIMS,
            "Reclaim GPULeases not yet Done or Failed.",
            value=gauges.outstanding_reclaims,
        )
        standby = GaugeMetricFamily(
            STANDBY_GPUS, "Spare standby-pool GPUs (healthy, free, untagged), by type and tier.",
            labels=["model", "tier"],
        )  # fmt: skip
        for (model, tier), n in sorted(gauges.standby.items()):
            standby.add_metric([model, tier], n)
        yield standby
        target = GaugeMetricFamily(
            STANDBY_TARGET,
            "Adaptive standby pool (lease.standby.mode adaptive): spare GPUs it is kept at, by type: "
            "the quantile of recent Reclaims' shortfalls plus the floor.",
            labels=["model"],
        )
        for model, n in sorted(gauges.standby_target.items()):
            target.add_metric([model], n)
        yield target
        shortfall = GaugeMetricFamily(
            STANDBY_SHORTFALL,
            "Adaptive standby pool: the configured quantile of the lent GPUs per Reclaim that did not "
            "come back themselves (supplemented or unrecoverable) within the window, by type.",
            labels=["model"],
        )
        for model, n in sorted(gauges.standby_shortfall.items()):
            shortfall.add_metric([model], n)
        yield shortfall


class LeaseMetrics:
    """The controller's metric families, registered on ``registry`` (raises ``ValueError`` on
    duplicate names, as prometheus_client does)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._gauges: Gauges | Callable[[], Gauges] = Gauges()
        self.reclaim_duration = Histogram(
            RECLAIM_DURATION,
            "Seconds from a Reclaim GPULease's creation until the owner holds every GPU again.",
            buckets=RECLAIM_BUCKETS,
            registry=registry,
        )
        self.evictions_refused = Counter(
            EVICTIONS_REFUSED,
            "Evictions of LP pods refused by a PodDisruptionBudget (retried).",
            registry=registry,
        )
        self.evictions = Counter(EVICTIONS, "LP pods evicted after their grace period.", registry=registry)
        self.notices = Counter(NOTICES, "Graceful-reclaim notices written on LP pods.", registry=registry)
        self.supplements = Counter(
            SUPPLEMENTS, "Lent GPUs replaced one-for-one from the standby pool.", registry=registry
        )
        self.reclaimed_gpus = Counter(
            RECLAIMED_GPUS,
            "Lent GPUs back with their owner's pods after a Reclaim (the same GPU: status.reclaimed; "
            "replacements are counted by flexlease_lease_standby_supplements_total).",
            registry=registry,
        )
        self.reconcile_errors = Counter(
            RECONCILE_ERRORS,
            "Reconciles that failed and were retried with back-off.",
            ["kind"],
            registry=registry,
        )
        for kind in ("lease", "cluster"):
            self.reconcile_errors.labels(kind=kind)
        self.unrecoverable = Counter(
            UNRECOVERABLE,
            "Lent GPUs a Reclaim could neither bring back nor replace from the standby pool, by reason.",
            ["reason"],
            registry=registry,
        )
        for reason in UNRECOVERABLE_REASONS:
            self.unrecoverable.labels(reason=reason)
        self.superseded = Counter(
            SUPERSEDED,
            "GPULeases ended by a newer lease of the opposite action of their owner, by action and"
            " outcome (Done: it had reached its end state; Cancelled).",
            ["action", "phase"],
            registry=registry,
        )
        for action in ("Lend", "Reclaim"):
            for phase in ("Done", "Cancelled"):
                self.superseded.labels(action=action, phase=phase)
        registry.register(_GaugeCollector(self))

    @property
    def gauges(self) -> Gauges:
        """The gauges' values (computed now, once, when :meth:`defer_gauges` left them
        pending)."""
        if not isinstance(self._gauges, Gauges):
            self._gauges = self._gauges()
        return self._gauges

    @gauges.setter
    def gauges(self, value: Gauges) -> None:
        self._gauges = value

    def defer_gauges(self, compute: Callable[[], Gauges]) -> None:
        """Make ``compute()`` the gauges' values, called only when they are read (a scrape):
        the controller refreshes them after every cluster reconcile, far more often than
        they are scraped. ``compute`` must use only what it captured."""
        self._gauges = compute
