"""Prometheus metrics of the extender (prefix ``flexlease_``), on an injected registry.

Role: per-verb latency histograms (observed by the timing middleware of
:mod:`extender.server`), decisions by verb, outcome and cause, and inventory gauges (free,
used, unhealthy and lent GPUs by node pool, tier and type) read from :class:`extender.state.Inventory`
at scrape time by a custom collector. Label values are bounded (verbs, outcomes,
:class:`extender.scheduling.Cause`, tiers, GPU models) — never pod names or UIDs.

Neighbours: created by :func:`extender.server.create_app` with the process's (or a
test's) ``CollectorRegistry``; served on ``GET /metrics`` with prometheus-client's
aiohttp handler.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from extender.scheduling import Cause, Code, Verdict
from extender.state import Inventory

VERBS: Final = ("filter", "prioritize", "bind", "preempt")
OUTCOMES: Final = ("success", "unschedulable", "unresolvable")
LATENCY_BUCKETS: Final = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
"""Seconds; kube-scheduler's default extender timeout is 5 s."""

REQUEST_SECONDS: Final = "flexlease_extender_request_duration_seconds"
DECISIONS: Final = "flexlease_extender_decisions"
BAD_REQUESTS: Final = "flexlease_extender_bad_requests"
BIND_POD_SOURCES: Final = "flexlease_extender_bind_pod_sources"
POD_SOURCES: Final = ("watch", "read", "stale_watch")
"""``source`` label values of ``bind_pod_sources_total`` (:attr:`extender.binder.BindOutcome.source`)."""
GPUS: Final = "flexlease_extender_gpus"


class ExtenderMetrics:
    """The extender's instruments, registered on ``registry``.

    ``request_seconds{verb, status}``: handler latency in seconds (status = HTTP code).
    ``decisions_total{verb, outcome, cause}``: filter verdicts per node, bind and preempt
    outcomes. ``bad_requests_total{verb, reason}``: 4xx replies.
    """

    def __init__(self, registry: CollectorRegistry, inventory: Inventory) -> None:
        self.registry = registry
        self.request_seconds = Histogram(
            REQUEST_SECONDS,
            "Extender verb latency in seconds, measured in the server.",
            ["verb", "status"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._decisions: dict[tuple[str, str, str], float] = {}
        """``decisions_total`` by (verb, outcome, cause), read at scrape time
        (:class:`DecisionsCollector`): counting a filter's verdicts is a few dict updates,
        not a locked prometheus-client child per label set."""
        self._verdict_labels: dict[Verdict, tuple[str, str]] = {}
        """(outcome, cause) of each interned :class:`~extender.scheduling.Verdict` seen."""
        self.bad_requests = Counter(
            BAD_REQUESTS,
            "Requests answered 4xx (malformed JSON, wrong types, unknown verb, body too large).",
            ["verb", "reason"],
            registry=registry,
        )
        self.bind_sources = Counter(
            BIND_POD_SOURCES,
            "Binds by the copy of the pod they decided on: watch (the Pod watch's copy), read "
            "(the pod read from the API server), stale_watch (read after the watch's copy did not bind).",
            ["source"],
            registry=registry,
        )
        self._request_children: dict[tuple[str, int], Any] = {}
        """``request_seconds`` children by verb and status code."""
        for verb in VERBS:
            self.request_seconds.labels(verb, "200")
        self._source_children = {source: self.bind_sources.labels(source) for source in POD_SOURCES}
        """``bind_sources`` children by source, made once (``labels()`` per bind cost more
        than the increment)."""
        for outcome, cause in (
            ("success", Cause.FITS),
            ("unschedulable", Cause.HELD_PREEMPTABLE),
            ("unresolvable", Cause.TOO_FEW_GPUS),
        ):
            self._decisions[("filter", outcome, cause.value)] = 0.0
        registry.register(DecisionsCollector(self._decisions))
        registry.register(InventoryCollector(inventory))

    def observe_request(self, verb: str, status: int, seconds: float) -> None:
        """Observe one ``verb`` request answered with HTTP ``status`` after ``seconds``."""
        child = self._request_children.get((verb, status))
        if child is None:  # labels() per call costs more than the observation itself
            child = self._request_children[(verb, status)] = self.request_seconds.labels(verb, str(status))
        child.observe(seconds)

    def count_bind_source(self, source: str) -> None:
        """Count one bind decided on the pod copy ``source`` (:data:`POD_SOURCES`)."""
        child = self._source_children.get(source)
        if child is None:  # not one of POD_SOURCES: counted all the same
            child = self._source_children[source] = self.bind_sources.labels(source)
        child.inc()

    def count_decisions(self, verb: str, counts: Mapping[tuple[str, str], int]) -> None:
        """Add ``{(outcome, cause): n}`` to ``decisions_total`` for ``verb`` (``n`` >= 0)."""
        decisions = self._decisions
        for (outcome, cause), n in counts.items():
            key = (verb, outcome, cause)
            decisions[key] = decisions.get(key, 0.0) + n

    def count_verdicts(self, verb: str, counts: Mapping[Verdict, int]) -> None:
        """Add a filter's ``{verdict: nodes}`` to ``decisions_total`` for ``verb``: outcome
        from the verdict's :class:`~extender.scheduling.Code`, cause from its
        :class:`~extender.scheduling.Cause`. Verdicts are interned, so each one's labels
        are worked out once, looked up by identity (an enum member's ``.value`` is a
        Python-level property, read per verdict before)."""
        decisions, labels = self._decisions, self._verdict_labels
        for v, n in counts.items():
            outcome_cause = labels.get(v)
            if outcome_cause is None:
                if len(labels) >= _VERDICT_LABELS_LIMIT:
                    labels.clear()
                outcome_cause = labels[v] = (_OUTCOMES[v.code], v.cause.value)
            key = (verb, *outcome_cause)
            decisions[key] = decisions.get(key, 0.0) + n


_OUTCOMES: Final = dict(zip((Code.SUCCESS, Code.UNSCHEDULABLE, Code.UNRESOLVABLE), OUTCOMES, strict=True))
"""The ``outcome`` label (:data:`OUTCOMES`) of a verdict's code."""
_VERDICT_LABELS_LIMIT: Final = 4096
"""Verdicts whose labels are kept at the most (then the table starts again)."""


class DecisionsCollector(Collector):
    """``flexlease_extender_decisions_total{verb, outcome, cause}`` from the counts
    :class:`ExtenderMetrics` keeps (read at scrape time, in the event loop's thread)."""

    def __init__(self, decisions: Mapping[tuple[str, str, str], float]) -> None:
        self._decisions = decisions

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            DECISIONS,
            "Extender decisions by verb, outcome and cause (filter: one per candidate node).",
            labels=["verb", "outcome", "cause"],
        )
        for labels, value in sorted(self._decisions.items()):
            family.add_metric(list(labels), value)
        yield family


class InventoryCollector(Collector):
    """Inventory gauges read at scrape time: ``flexlease_extender_gpus{pool, state, tier, type}``
    (state = free, used, unhealthy, lent), nodes, reservations and reservation events."""

    def __init__(self, inventory: Inventory) -> None:
        self._inventory = inventory

    def collect(self) -> Iterator[Metric]:
        inv = self._inventory
        gpus = GaugeMetricFamily(
            GPUS,
            "GPUs known to the extender by node pool (general, standby), state (free, used, "
            "unhealthy; lent = tagged by an owner), effective tier and type.",
            labels=["pool", "state", "tier", "type"],
        )
        for c in inv.device_counts():
            gpus.add_metric([c.pool, c.state, c.tier, c.model], c.count)
        yield gpus
        summary = inv.summary()
        nodes = GaugeMetricFamily("flexlease_extender_nodes", "Nodes with a GPUNode in the inventory.")
        nodes.add_metric([], summary["nodes"])
        yield nodes
        pending = GaugeMetricFamily(
            "flexlease_extender_reservations", "Assumed binds not yet confirmed by the watch."
        )
        pending.add_metric([], summary["reservations"])
        yield pending
        ready = GaugeMetricFamily(
            "flexlease_extender_ready", "1 once Pods and GPUNodes have been listed, else 0."
        )
        ready.add_metric([], 1.0 if inv.ready else 0.0)
        yield ready
        events = CounterMetricFamily(
            "flexlease_extender_reservation_events",
            "Reservations confirmed by the watch, expired unconfirmed, or forgotten after a failed bind.",
            labels=["event"],
        )
        events.add_metric(["confirmed"], inv.stats.confirmed)
        events.add_metric(["expired"], inv.stats.expired)
        events.add_metric(["forgotten"], inv.stats.forgotten)
        yield events
        claims = CounterMetricFamily(
            "flexlease_extender_claim_events",
            "assigned-gpus claims resolved by the inventory: conflict (a pod claims a GPU another "
            "pod claims; one keeps it), released (a pod stayed unbound past the reservation TTL).",
            labels=["event"],
        )
        claims.add_metric(["conflict"], inv.stats.claim_conflicts)
        claims.add_metric(["released"], inv.stats.claims_released)
        yield claims
        bad = CounterMetricFamily(
            "flexlease_extender_ignored_objects",
            "GPUNode or Pod objects (or devices) ignored because they were malformed.",
        )
        bad.add_metric([], inv.stats.bad_objects)
        yield bad
