"""flexlease.sim.tide: the Fig. 2 demand curve and the §4.4 scale policy."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexlease.sim import tide, traces
from flexlease.sim.tide import Scale, ScalePolicy, Tide


def test_plain_tide_spans_fig2() -> None:
    t = Tide()
    assert t.demand(3 * 3600) == pytest.approx(0.39)  # trough at 03:00
    assert t.demand(15 * 3600) == pytest.approx(0.92)  # peak 12 h later
    assert t.demand(traces.DAY + 3 * 3600) == pytest.approx(0.39)  # daily


def test_shaped_tide_follows_the_signal_deviation() -> None:
    rows = [f"{m * 600},{0.6 if (m // 6) % 24 != 15 else 0.66}" for m in range(144)]
    rows += [f"{86400 + m * 600},{0.6}" for m in range(144)]
    series = traces.parse_util("time_s,mean_util\n" + "\n".join(rows) + "\n")
    shaped = Tide.shaped(series, gain=1.0)
    plain = Tide()
    # day 0 at 15:00 the signal is at its hour mean (0.63): +4.8 %; day 1 at 15:00 below it
    assert shaped.demand(15 * 3600) == pytest.approx(plain.demand(15 * 3600) * (0.66 / 0.63))
    assert shaped.demand(traces.DAY + 15 * 3600) < plain.demand(15 * 3600)


def test_tide_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError):
        Tide(low=0.9, high=0.4)


@given(t=st.floats(0, 120 * traces.DAY), low=st.floats(0, 0.5), high=st.floats(0.5, 1.0))
def test_demand_stays_within_bounds(t: float, low: float, high: float) -> None:
    d = Tide(low=low, high=high).demand(t)
    assert low - 1e-9 <= d <= high + 1e-9


def test_decide_has_hysteresis() -> None:
    p = ScalePolicy(down_below=0.45, up_above=0.5)
    assert tide.decide(Scale.FULL, 0.44, p) is Scale.HALF
    assert tide.decide(Scale.FULL, 0.47, p) is Scale.FULL
    assert tide.decide(Scale.HALF, 0.47, p) is Scale.HALF
    assert tide.decide(Scale.HALF, 0.51, p) is Scale.FULL


def test_one_scale_down_and_up_per_day_with_fig2() -> None:
    t = Tide()
    p = ScalePolicy()
    size = Scale.FULL
    changes = []
    for k in range(0, 2 * 144):
        new = tide.decide(size, t.demand(k * 600), p)
        if new is not size:
            changes.append((k * 600 / 3600, new))
        size = new
    assert [c[1] for c in changes] == [Scale.HALF, Scale.FULL] * 2
    down_hour = changes[0][0] % 24
    assert down_hour < 3 or down_hour > 21  # the night trough


def test_released_count_is_half() -> None:
    assert tide.released_count(256) == 128
    assert tide.released_count(9) == 4
    with pytest.raises(ValueError):
        tide.released_count(-1)
