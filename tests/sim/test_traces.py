"""flexlease.sim.traces: parsing, scaling to the cluster, synthetic arrivals, util signals."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexlease.sim import traces
from flexlease.sim.traces import DAY, Job, Scaling

PHILLY_HEAD = "submit_time_s,gpus,duration_s,tenant,status,source_job_index,submit_time_local\n"


def test_parse_jobs_reads_the_public_columns_and_sorts() -> None:
    text = PHILLY_HEAD + "717,2,66,,,21890,2017-10-09 00:11:57\n116,1,66,,,21889,2017-10-09 00:01:56\n"
    jobs = traces.parse_jobs(text)
    assert jobs == [Job(116.0, 1, 66.0), Job(717.0, 2, 66.0)]


def test_parse_jobs_drops_jobs_that_request_nothing() -> None:
    text = "submit_time_s,gpus,duration_s\n0,0,60\n1,1,0\n2,4,10\n"
    assert traces.parse_jobs(text) == [Job(2.0, 4, 10.0)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("submit_time_s,gpus\n0,1\n", "missing column"),
        ("submit_time_s,gpus,duration_s\n0,x,10\n", "not a number"),
        ("submit_time_s,gpus,duration_s\n0,-1,10\n", "must be finite and >= 0"),
        ("submit_time_s,gpus,duration_s\n0,1,nan\n", "must be finite"),
    ],
)
def test_parse_jobs_rejects_bad_rows(text: str, message: str) -> None:
    with pytest.raises(traces.TraceError, match=message):
        traces.parse_jobs(text, source="t.csv")


def test_parse_util_and_value_at_tile_the_series() -> None:
    text = "time_s,mean_util,running_gpus\n0,0.5,1\n600,0.7,1\n1200,0.9,1\n"
    series = traces.parse_util(text)
    assert series.period == 1800
    assert traces.value_at(series, 0) == 0.5
    assert traces.value_at(series, 599) == 0.5
    assert traces.value_at(series, 1200) == 0.9
    assert traces.value_at(series, 1800 + 650) == 0.7  # tiled


def test_parse_util_rejects_values_above_one_and_short_series() -> None:
    with pytest.raises(traces.TraceError, match="above 1"):
        traces.parse_util("time_s,mean_util\n0,1.5\n60,0.1\n")
    with pytest.raises(traces.TraceError, match="two rows"):
        traces.parse_util("time_s,mean_util\n0,0.5\n")


def test_hour_of_day_profile_ignores_zero_gaps() -> None:
    rows = [f"{h * 3600},{0.5 + h / 100}" for h in range(24)] + [f"{86400 + h * 3600},0" for h in range(24)]
    series = traces.parse_util("time_s,mean_util\n" + "\n".join(rows) + "\n")
    profile = traces.hour_of_day_profile(series)
    assert profile[0] == pytest.approx(0.5)
    assert profile[23] == pytest.approx(0.73)


def test_split_pods() -> None:
    assert traces.split_pods(19, 8) == [8, 8, 3]
    assert traces.split_pods(8, 8) == [8]
    assert traces.split_pods(1, 8) == [1]
    with pytest.raises(ValueError):
        traces.split_pods(0, 8)


@given(gpus=st.integers(1, 300), per_node=st.integers(1, 16))
def test_split_pods_keeps_every_gpu_within_node_size(gpus: int, per_node: int) -> None:
    pods = traces.split_pods(gpus, per_node)
    assert sum(pods) == gpus
    assert all(1 <= p <= per_node for p in pods)


def _trace(n: int = 400) -> list[Job]:
    return [Job(i * 3000.0, 1 + (i % 3) * 3, 1800.0 + (i % 7) * 600) for i in range(n)]


def test_scale_jobs_hits_the_target_load_and_tiles_the_horizon() -> None:
    jobs = _trace()
    horizon = 30 * DAY
    arrivals = traces.scale_jobs(jobs, Scaling(target_load=40.0, horizon=horizon), seed=3)
    offered = sum(a.gpus * a.duration for a in arrivals) / horizon
    assert offered == pytest.approx(40.0, rel=0.1)
    assert arrivals[-1].time > 20 * DAY  # the 14-day trace was tiled
    assert all(0 <= a.time < horizon for a in arrivals)
    assert [a.time for a in arrivals] == sorted(a.time for a in arrivals)


def test_scale_jobs_splits_large_jobs_and_caps() -> None:
    jobs = [Job(0.0, 20, 10 * DAY), Job(100.0, 3, 60.0)]
    load = (16 * DAY + 3 * 60.0) / DAY  # m = 1: every job kept exactly once
    scaling = Scaling(target_load=load, horizon=DAY, max_job_gpus=16, max_duration=DAY)
    arrivals = traces.scale_jobs(jobs, scaling, seed=1)
    assert all(a.gpus <= 8 and a.duration <= DAY for a in arrivals)
    big = [a for a in arrivals if a.time == 0.0]
    by_job: dict[int, int] = {}
    for a in big:
        by_job[a.job] = by_job.get(a.job, 0) + a.gpus
    assert set(by_job.values()) == {16}  # capped at 16, split 8 + 8


def test_scale_jobs_is_deterministic_per_seed() -> None:
    jobs = _trace(100)
    scaling = Scaling(target_load=10.0, horizon=5 * DAY)
    assert traces.scale_jobs(jobs, scaling, seed=1) == traces.scale_jobs(jobs, scaling, seed=1)
    assert traces.scale_jobs(jobs, scaling, seed=1) != traces.scale_jobs(jobs, scaling, seed=2)


def test_scale_jobs_gpu_scale_shrinks_gangs() -> None:
    arrivals = traces.scale_jobs(
        [Job(0.0, 512, 3600.0)], Scaling(target_load=41 * 3600 / DAY, horizon=DAY, gpu_scale=0.08), seed=1
    )
    assert [a.gpus for a in arrivals] == [8, 8, 8, 8, 8, 1]  # round(512 * 0.08) = 41 GPUs


def test_scale_jobs_rejects_empty_trace() -> None:
    with pytest.raises(ValueError):
        traces.scale_jobs([], Scaling(target_load=1.0, horizon=DAY), seed=1)


def test_synthetic_arrivals_match_the_target_load_and_follow_the_day() -> None:
    horizon = 40 * DAY
    arrivals = traces.synthetic_arrivals(50.0, horizon, seed=7)
    offered = sum(a.gpus * a.duration for a in arrivals) / horizon
    assert offered == pytest.approx(50.0, rel=0.25)
    peak = sum(1 for a in arrivals if 12 <= (a.time % DAY) / 3600 < 16)
    night = sum(1 for a in arrivals if 0 <= (a.time % DAY) / 3600 < 4)
    assert peak > night
    assert traces.synthetic_arrivals(50.0, DAY, seed=7) == traces.synthetic_arrivals(50.0, DAY, seed=7)


@settings(max_examples=30)
@given(t=st.floats(0, 1e7))
def test_diurnal_rate_is_positive_and_bounded(t: float) -> None:
    r = traces.diurnal_rate(t)
    assert 0.7 - 1e-9 <= r <= 1.3 + 1e-9


def test_offered_load() -> None:
    assert traces.offered_load([Job(0, 2, 100), Job(0, 1, 1000)], span=100, max_duration=500) == 7.0
    assert math.isclose(traces.offered_load([], span=1, max_duration=1), 0.0)


def _daily_jobs(days: int, busy_hours: range) -> list[Job]:
    """One job every 20 minutes during ``busy_hours`` of each day (trace time), one at 12 h
    offset otherwise every 3 hours: a clear daily rhythm."""
    jobs = []
    for d in range(days):
        for m in range(0, 24 * 60, 20):
            h = m // 60
            if h in busy_hours or m % 180 == 0:
                jobs.append(Job(d * DAY + m * 60.0, 1, 600.0))
    return jobs


def _reference(peak_hour: int) -> list[float]:
    return [math.cos(2 * math.pi * (h + 0.5 - peak_hour) / 24) for h in range(24)]


def test_daily_phase_aligns_a_rhythmic_trace_to_the_reference() -> None:
    # busy 02:00–08:00 in trace time, the reference peaks at 14:00: shift ≈ 9 h
    phase = traces.daily_phase(_daily_jobs(6, range(2, 8)), _reference(14))
    assert phase.periodic and phase.autocorrelation > 0.7
    assert 8 * 3600 <= phase.shift <= 10 * 3600 and phase.shift % 600 == 0
    assert phase.correlation is not None and phase.correlation > 0.6
    shifted = traces.hourly_arrivals(_daily_jobs(6, range(2, 8)), shift=phase.shift)
    assert max(range(24), key=shifted.__getitem__) in range(10, 18)  # the busy hours moved to the afternoon


def test_daily_phase_keeps_a_trace_without_daily_rhythm_as_recorded() -> None:
    # one burst: no correlation a day later
    jobs = [Job(3600.0 * 30 + i, 1, 60.0) for i in range(200)] + [Job(4 * DAY, 1, 60.0)]
    phase = traces.daily_phase(jobs, _reference(14))
    assert not phase.periodic and phase.shift == 0.0 and phase.correlation is None


def test_daily_phase_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="24 hourly"):
        traces.daily_phase(_daily_jobs(3, range(2, 8)), [1.0] * 12)
    with pytest.raises(ValueError, match="no jobs"):
        traces.daily_phase([], _reference(14))


def test_scale_jobs_shift_wraps_and_keeps_the_hour_of_day() -> None:
    jobs = _daily_jobs(3, range(2, 8))
    base = Scaling(target_load=5.0, horizon=3 * DAY)
    shifted = traces.scale_jobs(jobs, Scaling(target_load=5.0, horizon=3 * DAY, shift=9 * 3600.0), seed=1)
    plain = traces.scale_jobs(jobs, base, seed=1)
    assert all(0 <= p.time < 3 * DAY for p in shifted)
    busiest = [0] * 24
    for p in shifted:
        busiest[int((p.time % DAY) // 3600)] += 1
    assert max(range(24), key=busiest.__getitem__) in range(11, 17)
    assert len(shifted) == pytest.approx(len(plain), rel=0.2)
    with pytest.raises(ValueError, match="shift"):
        traces.scale_jobs(jobs, Scaling(target_load=5.0, horizon=DAY, shift=DAY), seed=1)
