"""Extender metrics (extender.metrics): instruments on an injected registry, inventory read at scrape time."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from extender.metrics import ExtenderMetrics
from extender.scheduling import PASS, Cause, Code, Verdict
from extender.state import Inventory
from flexlease.store.base import EventType, WatchEvent
from tests.extender import payloads


def test_inventory_gauges_are_read_at_scrape_time() -> None:
    registry = CollectorRegistry()
    inv = Inventory()
    ExtenderMetrics(registry, inv)
    assert registry.get_sample_value("flexlease_extender_ready") == 0.0
    inv.replace_nodes([payloads.gpunode("n1", gpus=4, tiers=["HA", "HA", "MA", "LA"], owners={2: "ml/o"})])
    inv.replace_pods(
        [
            payloads.pod(
                "a", node_name="n1", phase="Running", annotations=payloads.assigned("n1", 0, 2), gpus=2
            )
        ]
    )
    get = registry.get_sample_value

    def gpus(state: str, tier: str) -> float | None:
        labels = {"pool": "general", "state": state, "tier": tier, "type": payloads.H20}
        return get("flexlease_extender_gpus", labels)

    assert get("flexlease_extender_ready") == 1.0
    assert get("flexlease_extender_nodes") == 1.0
    assert gpus("free", "HA") == 1.0
    assert gpus("used", "HA") == 1.0
    assert gpus("used", "MA") == 1.0
    assert gpus("lent", "MA") == 1.0
    inv.assume(uid="u", key="ml/u", node="n1", indices=(3,))
    assert get("flexlease_extender_reservations") == 1.0
    assert gpus("used", "LA") == 1.0
    inv.forget("u")
    assert get("flexlease_extender_reservation_events_total", {"event": "forgotten"}) == 1.0
    assert get("flexlease_extender_claim_events_total", {"event": "conflict"}) == 0.0
    copy = payloads.pod("copy", annotations=payloads.assigned("n1", 0), gpus=1)  # unbound, claims a's GPU
    inv.apply_pod_event(WatchEvent(EventType.ADDED, copy))
    assert get("flexlease_extender_claim_events_total", {"event": "conflict"}) == 1.0
    assert get("flexlease_extender_claim_events_total", {"event": "released"}) == 0.0


def test_known_labels_are_preinitialised_and_decisions_counted() -> None:
    registry = CollectorRegistry()
    metrics = ExtenderMetrics(registry, Inventory())
    text = generate_latest(registry).decode()
    for verb in ("filter", "prioritize", "bind", "preempt"):
        assert f'flexlease_extender_request_duration_seconds_count{{status="200",verb="{verb}"}} 0.0' in text
    metrics.count_decisions("filter", {("success", "fits"): 3, ("unresolvable", "wrong_type"): 2})
    get = registry.get_sample_value
    assert (
        get("flexlease_extender_decisions_total", {"verb": "filter", "outcome": "success", "cause": "fits"})
        == 3
    )
    labels = {"verb": "filter", "outcome": "unresolvable", "cause": "wrong_type"}
    assert get("flexlease_extender_decisions_total", labels) == 2


def test_filter_verdicts_are_counted_by_outcome_and_cause() -> None:
    """Two verdicts with the same code and cause (other reasons) add up under one label set."""
    registry = CollectorRegistry()
    metrics = ExtenderMetrics(registry, Inventory())
    few_ha = Verdict(Code.UNRESOLVABLE, Cause.TOO_FEW_GPUS, "fewer than 2 usable GPUs of tier HA")
    few_ma = Verdict(Code.UNRESOLVABLE, Cause.TOO_FEW_GPUS, "fewer than 2 usable GPUs of tier MA")
    held = Verdict(Code.UNSCHEDULABLE, Cause.HELD_PREEMPTABLE, "held by lower-priority pods")
    for _ in range(2):
        metrics.count_verdicts("filter", {PASS: 4, few_ha: 2, few_ma: 3, held: 1})
    get = registry.get_sample_value
    total = "flexlease_extender_decisions_total"
    assert get(total, {"verb": "filter", "outcome": "success", "cause": "fits"}) == 8
    assert get(total, {"verb": "filter", "outcome": "unresolvable", "cause": "too_few_gpus"}) == 10
    assert get(total, {"verb": "filter", "outcome": "unschedulable", "cause": "held_preemptable"}) == 2
    metrics.count_decisions("bind", {("bound", "fits"): 1})
    assert get(total, {"verb": "bind", "outcome": "bound", "cause": "fits"}) == 1


def test_one_registry_per_app_instance() -> None:
    # two extenders in one process (tests) need their own registries; the same one twice is refused
    inv = Inventory()
    registry = CollectorRegistry()
    ExtenderMetrics(registry, inv)
    ExtenderMetrics(CollectorRegistry(), inv)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        ExtenderMetrics(registry, inv)
