"""flexlease.sim.failures: the failure process reproduces WeFlex Fig. 5."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexlease.sim import failures
from flexlease.sim.failures import FailureModel
from flexlease.sim.traces import DAY


def test_calibration_meets_both_fig5_points() -> None:
    m = FailureModel.calibrated()
    assert m.no_outage_probability(14) == pytest.approx(0.70, abs=1e-6)
    assert m.no_outage_probability(30) == pytest.approx(0.58, abs=1e-6)
    assert 0 < m.flaky_fraction < 0.3
    assert m.good_rate < m.flaky_rate


def test_calibration_rejects_impossible_points() -> None:
    with pytest.raises(ValueError):
        FailureModel.calibrated(ha_short=0.5, ha_long=0.6)


def _share_without_outage(m: FailureModel, nodes: int, days: float) -> float:
    clean = total = 0
    for n in range(nodes):
        for i in range(8):
            outs = failures.outages(m, f"n{n}", i, seed=11, start=-DAY, end=days * DAY)
            clean += failures.downtime(outs, 0.0, days * DAY) == 0.0
            total += 1
    return clean / total


def test_sampled_fleet_matches_fig5() -> None:
    m = FailureModel.calibrated()
    assert _share_without_outage(m, 400, 14) == pytest.approx(0.70, abs=0.03)
    assert _share_without_outage(m, 400, 30) == pytest.approx(0.58, abs=0.03)


def test_outages_are_deterministic_and_independent_of_call_order() -> None:
    m = FailureModel.calibrated()
    a = failures.outages(m, "gpu-1", 3, seed=5, start=0, end=100 * DAY)
    failures.outages(m, "gpu-2", 0, seed=5, start=0, end=100 * DAY)
    assert failures.outages(m, "gpu-1", 3, seed=5, start=0, end=100 * DAY) == a


@given(seed=st.integers(0, 10_000), index=st.integers(0, 7))
def test_outages_are_sorted_disjoint_and_in_range(seed: int, index: int) -> None:
    m = FailureModel.calibrated(flaky_rate_per_day=2.0)
    outs = failures.outages(m, "node", index, seed=seed, start=-5 * DAY, end=20 * DAY)
    for (s1, e1), (s2, _) in itertools.pairwise(outs):
        assert s1 < e1 <= s2
    assert all(-5 * DAY <= s < 20 * DAY for s, _ in outs)


def test_bad_nodes_hold_most_flaky_gpus() -> None:
    m = FailureModel.calibrated()
    assert m.flaky_probability(bad_node=True) > 3 * m.flaky_probability(bad_node=False)
    with pytest.raises(ValueError):
        FailureModel(flaky_fraction=0.9, good_rate=0, flaky_rate=1, bad_node_fraction=0.1)


def test_downtime_and_is_down() -> None:
    outs = ((10.0, 20.0), (30.0, 40.0))
    assert failures.downtime(outs, 0, 100) == 20
    assert failures.downtime(outs, 15, 35) == 10
    assert failures.is_down(outs, 10) and not failures.is_down(outs, 20)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.integers(0, 9),
        st.lists(st.tuples(st.floats(-50, 200), st.floats(0.1, 60)), max_size=4).map(
            lambda xs: tuple(sorted((s, s + d) for s, d in xs))
        ),
        max_size=6,
    ),
    st.floats(5, 30),
)
def test_outage_sweep_finds_every_key_an_outage_can_touch(
    histories: dict[int, tuple[failures.Interval, ...]], step: float
) -> None:
    """Windows moving forward by ``step``: the sweep names exactly the keys with an outage
    starting by the window's end and ending after its start, in the mapping's order — every
    key that is down at the end or lost time in the window among them."""
    sweep = failures.OutageSweep(histories)
    hi = -60.0
    while hi < 260:
        lo, hi = hi, hi + step
        touching = sweep.touching(lo, hi)
        expected = [k for k, ivs in histories.items() if any(s <= hi and e > lo for s, e in ivs)]
        assert touching == expected
        for k, ivs in histories.items():
            if failures.is_down(ivs, hi) or failures.downtime(ivs, lo, hi) > 0:
                assert k in touching
    with pytest.raises(ValueError, match="backwards"):
        sweep.touching(lo - 1, hi)
