"""flexlease.sim.demandtrace: the online job's demand trace (tide + day-to-day noise + surprise
peaks, seeded) and the metrics source that serves it to the autopilot in a simulation."""

from __future__ import annotations

import pytest

from flexlease.errors import MetricsError
from flexlease.sim import demandtrace, tide
from flexlease.sim.demandtrace import DEMAND_QUERY, PER_GPU, DemandTrace, TraceSource

DAY = 86400.0


def _trace(seed: int = 1, **kw: float) -> DemandTrace:
    return DemandTrace(base=tide.Tide(), peak_gpus=64, seed=seed, horizon=10 * DAY, **kw)


def test_without_noise_and_peaks_the_trace_is_the_tide() -> None:
    plain = _trace()
    base = tide.Tide()
    for t in (-5 * DAY + 123.0, 0.0, 3 * 3600.0, 15 * 3600.0, 4 * DAY + 999.0):
        assert plain.ratio(t) == base.demand(t)
        assert plain.demand(t) == base.demand(t)
    assert plain.peaks == ()
    assert "the tide itself" in plain.describe()


def test_same_seed_same_trace_another_seed_another() -> None:
    times = [k * 600.0 for k in range(-14 * 144, 10 * 144)]
    a = [_trace(7, day_noise=0.1, peaks_per_day=0.5).gpus(t) for t in times]
    b = [_trace(7, day_noise=0.1, peaks_per_day=0.5).gpus(t) for t in times]
    c = [_trace(8, day_noise=0.1, peaks_per_day=0.5).gpus(t) for t in times]
    assert a == b
    assert a != c
    assert all(0.0 <= g <= 64.0 for g in a)


def test_day_to_day_noise_changes_days_without_a_step_at_midnight() -> None:
    noisy = _trace(3, day_noise=0.2)
    base = tide.Tide()
    noons = [noisy.ratio(d * DAY + DAY / 2) / base.demand(d * DAY + DAY / 2) for d in range(7)]
    assert len({round(x, 6) for x in noons}) == 7  # each day its own level
    for d in range(1, 7):  # continuous across midnight (a second apart: a hair)
        assert abs(noisy.ratio(d * DAY - 0.5) - noisy.ratio(d * DAY + 0.5)) < 1e-3


def test_surprise_peaks_lift_demand_to_their_level_while_they_last() -> None:
    peaky = _trace(5, peaks_per_day=2.0)
    inside = [p for p in peaky.peaks if p.start >= 0 and p.end < 10 * DAY]
    assert inside, "two a day over ten days: some peaks"
    for p in inside:
        assert 1800.0 <= p.end - p.start <= 3 * 3600.0
        assert 0.8 <= p.level <= 1.0
        mid = (p.start + p.end) / 2
        assert peaky.ratio(mid) >= p.level
    # before the run too: a forecast's history has them
    assert any(p.start < 0 for p in peaky.peaks)


def test_needed_is_the_ceiling_in_whole_gpus() -> None:
    trace = _trace()
    t = 15 * 3600.0
    assert trace.needed(t) == pytest.approx(trace.gpus(t), abs=1)
    assert trace.needed(t) >= trace.gpus(t) - 1e-9


def test_invalid_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="peak_gpus"):
        DemandTrace(base=tide.Tide(), peak_gpus=0, seed=1, horizon=DAY)
    with pytest.raises(ValueError, match="day_noise"):
        _trace(day_noise=-0.1)
    with pytest.raises(ValueError, match="peak_low"):
        _trace(peak_low=1.5)


async def test_the_source_answers_the_demand_query_at_the_simulated_clock() -> None:
    trace = _trace(2, day_noise=0.1, peaks_per_day=1.0)
    now = [1_000_000.0 + 15 * 3600.0]
    source = TraceSource(trace, now=lambda: now[0], origin=1_000_000.0)
    assert await source.instant(DEMAND_QUERY) == trace.gpus(15 * 3600.0) * PER_GPU
    now[0] += 600.0
    assert await source.instant(DEMAND_QUERY) == trace.gpus(15 * 3600.0 + 600.0) * PER_GPU
    history = await source.series(DEMAND_QUERY, seconds=14 * DAY, step=600.0)
    assert 14 * 144 <= len(history) <= 14 * 144 + 1
    assert [t for t, _ in history] == sorted(t for t, _ in history)
    assert all(t % 600.0 == 0 for t, _ in history)  # step-aligned, as query_range's points
    assert history[-1][0] <= now[0]
    t0, v0 = history[0]
    assert v0 == trace.gpus(t0 - 1_000_000.0) * PER_GPU  # before the simulation: the trace's past
    assert (source.instant_queries, source.range_queries) == (2, 1)


async def test_the_source_has_no_series_for_another_query_and_refuses_too_many_points() -> None:
    source = TraceSource(_trace(), now=lambda: 0.0, origin=0.0)
    with pytest.raises(MetricsError, match="no series"):
        await source.instant("up")
    with pytest.raises(MetricsError, match="no series"):
        await source.series("up", seconds=DAY, step=60.0)
    with pytest.raises(MetricsError, match="maximum resolution"):
        await source.series(DEMAND_QUERY, seconds=30 * DAY, step=60.0)
    assert demandtrace.MAX_POINTS == 11_000
