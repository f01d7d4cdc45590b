"""The lease controller's Prometheus families (extender/lease/metrics.py)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from extender.lease import metrics
from extender.lease.metrics import Gauges, LeaseMetrics


def test_gauges_are_read_at_scrape_time_and_counters_are_preinitialised() -> None:
    registry = CollectorRegistry()
    m = LeaseMetrics(registry)
    m.gauges = Gauges(
        lent={("NVIDIA H20", "HA"): 3}, outstanding_reclaims=2, standby={("NVIDIA H20", "MA"): 8}
    )
    m.reclaim_duration.observe(47.0)
    text = generate_latest(registry).decode()
    assert 'flexlease_lease_lent_gpus{model="NVIDIA H20",tier="HA"} 3.0' in text
    assert "flexlease_lease_outstanding_reclaims 2.0" in text
    assert 'flexlease_lease_standby_gpus{model="NVIDIA H20",tier="MA"} 8.0' in text
    assert 'flexlease_lease_reclaim_duration_seconds_bucket{le="60.0"} 1.0' in text
    assert "flexlease_lease_evictions_refused_total 0.0" in text
    assert 'flexlease_lease_reconcile_errors_total{kind="cluster"} 0.0' in text
    assert 'flexlease_lease_unrecoverable_gpus_total{reason="NoStandbyOfModel"} 0.0' in text
    assert 'flexlease_lease_superseded_total{action="Reclaim",phase="Cancelled"} 0.0' in text
    m.gauges = Gauges()
    assert registry.get_sample_value(metrics.OUTSTANDING_RECLAIMS) == 0.0


def test_registering_twice_on_one_registry_fails() -> None:
    registry = CollectorRegistry()
    LeaseMetrics(registry)
    with pytest.raises(ValueError, match="Duplicated"):
        LeaseMetrics(registry)


def test_deferred_gauges_are_computed_once_and_only_when_read() -> None:
    registry = CollectorRegistry()
    m = LeaseMetrics(registry)
    calls: list[int] = []

    def compute(n: int) -> Gauges:
        calls.append(n)
        return Gauges(outstanding_reclaims=n)

    m.defer_gauges(lambda: compute(1))
    m.defer_gauges(lambda: compute(2))  # replaced before anyone read it
    assert calls == []
    assert registry.get_sample_value(metrics.OUTSTANDING_RECLAIMS) == 2.0
    assert registry.get_sample_value(metrics.OUTSTANDING_RECLAIMS) == 2.0
    assert calls == [2]
