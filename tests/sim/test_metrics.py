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
        lent_tagged=13,
        lent_in_kind=1,
        reclaimed_same=13,
        supplemented=1,
        reclaim_s=30.0,
        restored_at=700,
        closed=True,
    )
    short = Cycle(
        down_at=1000,
        released=16,
        up_at=2000,
        lent_tagged=14,
        carried_in=1,
        reclaimed_same=12,
        unrecoverable=2,
        unrecoverable_reasons={"NoStandbyOfModel": 2},
        still_lent=1,
        closed=True,
    )
    lossy = Cycle(down_at=2000, released=16, up_at=2500, lent_tagged=2, reclaimed_same=1, lost=1, closed=True)
    unclosed = Cycle(down_at=2800, released=16, up_at=2900, lent_tagged=2, reclaimed_same=2)
    open_cycle = Cycle(down_at=3000, released=16)
    assert ok.complete and not short.complete and not lossy.complete
    assert not unclosed.complete and not open_cycle.complete
    assert ok.balance() == short.balance() == lossy.balance() == 0
    assert Cycle(down_at=0, released=2, lent_tagged=2, reclaimed_same=1).balance() == 1
    s = metrics.cycle_summary([ok, short, lossy, unclosed, open_cycle])
    assert s["cycles"] == 4 and s["closed_cycles"] == 3 and s["complete_cycles"] == 1
    assert s["lent_tagged"] == 31 and s["lent_in_kind"] == 1 and s["carried_in"] == 1
    assert (s["unrecoverable"], s["still_lent"], s["lost"], s["supplemented"]) == (2, 1, 1, 1)
    assert s["unrecoverable_reasons"] == {"NoStandbyOfModel": 2}
    assert s["restore_delay_s_mean"] == 600
    assert ok.as_dict()["complete"] is True and ok.as_dict()["lent"] == 14
