"""flexlease.sim.metrics: Fig. 10 fulfilment, Fig. 14 HA share, reclaim completeness."""

from __future__ import annotations

import pytest

from flexlease.sim import metrics
from flexlease.sim.metrics import Cycle, LpRequest, Sample

H = 3600.0


def test_fulfilment_by_hour_weights_gpus_and_uses_patience() -> None:
    reqs = [
        LpRequest(1 * H, 4, 1 * H + 60),  # granted
        LpRequest(1 * H + 10, 4, None),  # never bound
        LpRequest(2 * H, 2, 2 * H + 7200),  # bound too late
        LpRequest(25 * H, 8, 25 * H),  # day 2, hour 1
    ]
    by_hour = metrics.fulfilment_by_hour(reqs, patience=1800)
    assert by_hour[1] == pytest.approx(12 / 16)
    assert by_hour[2] == 0.0
    assert by_hour[3] is None
    assert metrics.overall_fulfilment(reqs, patience=1800) == pytest.approx(12 / 18)
    assert metrics.overall_fulfilment(reqs, patience=1800, since=24 * H) == 1.0
    assert metrics.overall_fulfilment(reqs, patience=1800, hours=range(2, 3)) == 0.0


def _sample(t: float, gpus: int, ha: int, *, full: bool = True) -> Sample:
    return Sample(t, gpus, ha, 0.7, full, 0, 0, 0, 0.75)


def test_ha_share_summary_uses_full_size_samples() -> None:
    day = 24 * H
    samples = [_sample(0, 100, 80), _sample(H, 50, 50, full=False), _sample(20 * day, 100, 70)]
    s = metrics.ha_share_summary(samples, days=7)
    assert s["start"] == 0.8
    assert s["first_days_mean"] == 0.8
    assert s["last_days_mean"] == 0.7
    assert s["cluster_last_days_mean"] == pytest.approx(0.7)
    assert metrics.ha_share_summary([])["start"] is None


def test_cycle_completeness_and_summary() -> None:
    ok = Cycle(
        down_at=0,
        released=16,
        up_at=100,
        lent_tagged=14,
        reclaimed_same=13,
        supplemented=1,
        reclaim_s=30.0,
        restored_at=700,
    )
    short = Cycle(down_at=1000, released=16, up_at=2000, lent_tagged=14, reclaimed_same=12, missing=2)
    open_cycle = Cycle(down_at=3000, released=16)
    assert ok.complete and not short.complete and not open_cycle.complete
    s = metrics.cycle_summary([ok, short, open_cycle])
    assert s["cycles"] == 2 and s["complete_cycles"] == 1
    assert s["lent_tagged"] == 28 and s["missing"] == 2 and s["supplemented"] == 1
    assert s["restore_delay_s_mean"] == 600
    assert ok.as_dict()["complete"] is True
