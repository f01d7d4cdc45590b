"""Low-priority job arrivals and cluster-utilisation signals from public traces (pure parsing).

Inputs are the CSV extracts in the repository's ``data/`` folder (one page per file there gives
its source, licence and columns; ``data/README.md``): ``jobs_philly.csv``
and ``jobs_alibaba_crux2023.csv`` (columns ``submit_time_s, gpus, duration_s, ...``; seconds)
and the Helios/Philly utilisation series (``time_s, mean_util, ...``; ratio 0–1). Parsing takes
text, so it is tested without files; :func:`read_text` is the only file access.

Arrivals are *scaled to the simulated cluster*: GPU counts by ``gpu_scale`` (for traces from
much larger clusters), durations capped, the 14-day trace tiled over the simulated horizon,
and each job thinned or replicated (seeded) so that the offered load — GPU-seconds requested
per second — hits a target. A job larger than one node is split into pods of at most
``gpus_per_node`` GPUs (the simulator schedules a job's pods as one gang). A trace
without wall-clock times (Alibaba Crux) is put in the day by its own rhythm
(:func:`daily_phase`).
When no trace is present, :func:`synthetic_arrivals` draws a seeded Poisson process with a
diurnal rate instead (the report says so).
"""

from __future__ import annotations

import csv
import io
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from flexlease.errors import RequestError

DAY: Final = 86400.0
PHILLY_JOBS: Final = "jobs_philly.csv"
ALIBABA_JOBS: Final = "jobs_alibaba_crux2023.csv"
HELIOS_MONTH: Final = "cluster_util_helios_earth_may2020_10min.csv"
HELIOS_48H: Final = "cluster_util_helios_earth.csv"
PHILLY_UTIL: Final = "cluster_util_philly.csv"

TRACE_FILES: Final = {"philly": PHILLY_JOBS, "alibaba": ALIBABA_JOBS}
"""Trace name → job file under the data directory."""


class TraceError(RequestError):
    """A trace file is malformed (missing column, non-numeric or negative value)."""


@dataclass(frozen=True, slots=True)
class Job:
    """One job of a trace: submit time and duration in seconds, GPUs (≥ 1)."""

    submit: float
    gpus: int
    duration: float


@dataclass(frozen=True, slots=True)
class PodArrival:
    """One low-priority pod to create: arrival time (s since sim start), GPUs (1–8), run
    time (s), and the id of the job it belongs to (pods of one job share it)."""

    time: float
    gpus: int
    duration: float
    job: int


@dataclass(frozen=True, slots=True)
class UtilSeries:
    """A utilisation signal: ``times`` (s from the series start, increasing) and ``values``
    (ratio 0–1). ``period`` is the span the series covers (s), used to tile it."""

    times: tuple[float, ...]
    values: tuple[float, ...]
    period: float


def read_text(path: Path) -> str:
    """The file's text. Raises ``OSError`` when it cannot be read."""
    return path.read_text(encoding="utf-8")


def _rows(text: str, required: Sequence[str], source: str) -> list[dict[str, str]]:
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in required if c not in (reader.fieldnames or [])]
    if missing:
        raise TraceError(f"{source}: missing column(s) {missing}")
    return list(reader)


def _number(row: dict[str, str], column: str, source: str, line: int) -> float:
    raw = row.get(column, "")
    try:
        value = float(raw)
    except ValueError as exc:
        raise TraceError(f"{source}:{line}: {column}={raw!r} is not a number") from exc
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{source}:{line}: {column}={raw!r} must be finite and >= 0")
    return value


def parse_jobs(text: str, *, source: str = "jobs") -> list[Job]:
    """Jobs from a ``submit_time_s,gpus,duration_s,...`` CSV, sorted by submit time.

    Rows with 0 GPUs or a zero duration are dropped (they request nothing). Raises
    :class:`TraceError` on a missing column or a non-numeric/negative value.
    """
    jobs: list[Job] = []
    for line, row in enumerate(_rows(text, ("submit_time_s", "gpus", "duration_s"), source), start=2):
        gpus = _number(row, "gpus", source, line)
        duration = _number(row, "duration_s", source, line)
        if gpus < 1 or duration <= 0:
            continue
        jobs.append(Job(_number(row, "submit_time_s", source, line), int(gpus), duration))
    jobs.sort(key=lambda j: j.submit)
    return jobs


def parse_util(text: str, *, source: str = "util") -> UtilSeries:
    """A ``time_s,mean_util,...`` CSV as a :class:`UtilSeries`. The period is the last time
    plus one sampling step. Raises :class:`TraceError` on bad rows, values outside 0–1, or
    fewer than two rows."""
    times: list[float] = []
    values: list[float] = []
    for line, row in enumerate(_rows(text, ("time_s", "mean_util"), source), start=2):
        value = _number(row, "mean_util", source, line)
        if value > 1:
            raise TraceError(f"{source}:{line}: mean_util={value} is above 1")
        times.append(_number(row, "time_s", source, line))
        values.append(value)
    if len(times) < 2:
        raise TraceError(f"{source}: needs at least two rows")
    order = sorted(range(len(times)), key=times.__getitem__)
    ts = tuple(times[i] for i in order)
    vs = tuple(values[i] for i in order)
    return UtilSeries(ts, vs, ts[-1] + (ts[-1] - ts[-2]))


def offered_load(jobs: Iterable[Job], *, span: float, max_duration: float) -> float:
    """Mean GPUs requested over ``span`` seconds: Σ gpus·min(duration, max_duration) / span."""
    if span <= 0:
        raise ValueError("span must be positive")
    return sum(j.gpus * min(j.duration, max_duration) for j in jobs) / span


def split_pods(gpus: int, gpus_per_node: int) -> list[int]:
    """A job's GPUs as pod sizes of at most ``gpus_per_node`` (full pods first):
    ``split_pods(19, 8) == [8, 8, 3]``."""
    if gpus < 1 or gpus_per_node < 1:
        raise ValueError("gpus and gpus_per_node must be >= 1")
    full, rest = divmod(gpus, gpus_per_node)
    return [gpus_per_node] * full + ([rest] if rest else [])


@dataclass(frozen=True, slots=True)
class Scaling:
    """How a trace is fitted to the simulated cluster.

    ``target_load``: mean GPUs the LP arrivals should request (GPU-seconds per second);
    ``gpu_scale``: factor on each job's GPU count (rounded, at least 1); ``max_job_gpus``:
    cap after scaling; ``max_duration``: run-time cap, s; ``horizon``: simulated span, s;
    ``gpus_per_node``: the pod size limit.
    """

    target_load: float
    horizon: float
    gpu_scale: float = 1.0
    max_job_gpus: int = 64
    max_duration: float = DAY
    gpus_per_node: int = 8
    shift: float = 0.0
    """Seconds added to every submit time (0 ≤ shift < 1 day), wrapping the trace's last
    ``shift`` seconds to its start: the daily phase of a trace without wall-clock times
    (:func:`daily_phase`)."""


def scale_jobs(jobs: Sequence[Job], scaling: Scaling, *, seed: int) -> list[PodArrival]:
    """LP pod arrivals over ``[0, scaling.horizon)`` from a trace, sorted by time.

    The trace (its span = last submit rounded up to whole days) is tiled over the horizon;
    every job of every tile is kept ``floor(m)`` times plus once more with probability
    ``m - floor(m)``, where ``m = target_load / offered_load(trace)``, so the expected offered
    load equals ``target_load``. Deterministic for a given ``seed``. Raises ``ValueError`` on
    an empty trace or a non-positive target.
    """
    if not jobs:
        raise ValueError("the trace holds no jobs")
    if scaling.target_load <= 0:
        raise ValueError("target_load must be positive")
    fitted = [
        Job(
            j.submit - jobs[0].submit,
            min(scaling.max_job_gpus, max(1, round(j.gpus * scaling.gpu_scale))),
            min(j.duration, scaling.max_duration),
        )
        for j in jobs
    ]
    span = max(DAY, math.ceil((fitted[-1].submit + 1) / DAY) * DAY)
    if not 0.0 <= scaling.shift < DAY:
        raise ValueError("shift must be within [0, 1 day)")
    if scaling.shift:  # span is whole days, so wrapping keeps every job's hour of day
        fitted = sorted(
            (Job((j.submit + scaling.shift) % span, j.gpus, j.duration) for j in fitted),
            key=lambda j: j.submit,
        )
    multiplier = scaling.target_load / offered_load(fitted, span=span, max_duration=scaling.max_duration)
    rng = random.Random(f"lp-trace:{seed}")
    out: list[PodArrival] = []
    job_id = 0
    tiles = math.ceil(scaling.horizon / span)
    for tile in range(tiles):
        base = tile * span
        for job in fitted:
            t = base + job.submit
            if t >= scaling.horizon:
                break
            copies = int(multiplier) + (1 if rng.random() < multiplier - int(multiplier) else 0)
            for _ in range(copies):
                for size in split_pods(job.gpus, scaling.gpus_per_node):
                    out.append(PodArrival(t, size, job.duration, job_id))
                job_id += 1
    out.sort(key=lambda p: (p.time, p.job))
    return out


def diurnal_rate(t: float, *, amplitude: float = 0.3, peak_hour: float = 14.0) -> float:
    """A relative arrival rate with a daily cycle: ``1 + amplitude·cos(2π(h − peak_hour)/24)``
    where h is the hour of day at ``t`` seconds. Mean 1 over a day."""
    hour = (t % DAY) / 3600.0
    return 1.0 + amplitude * math.cos(2 * math.pi * (hour - peak_hour) / 24.0)


SYNTHETIC_SIZES: Final = ((1, 0.70), (2, 0.10), (4, 0.10), (8, 0.10))
"""GPU count distribution of synthetic jobs (Philly: 92 % of jobs use 1 GPU)."""


def synthetic_arrivals(
    target_load: float,
    horizon: float,
    *,
    seed: int,
    median_duration: float = 3600.0,
    max_duration: float = DAY,
) -> list[PodArrival]:
    """A seeded Poisson arrival process with a diurnal rate (:func:`diurnal_rate`), GPU counts
    from :data:`SYNTHETIC_SIZES` and log-normal run times (median ``median_duration`` s,
    σ = 1.2, capped at ``max_duration``), thinned to an expected offered load of
    ``target_load`` GPUs. Used only when no trace file is present."""
    if target_load <= 0 or horizon <= 0:
        raise ValueError("target_load and horizon must be positive")
    rng = random.Random(f"lp-synthetic:{seed}")
    sigma = 1.2
    mean_gpus = sum(g * p for g, p in SYNTHETIC_SIZES)
    # E[min(lognormal, cap)] is close to the uncapped mean for caps far above the median.
    mean_duration = min(median_duration * math.exp(sigma**2 / 2), max_duration)
    rate = target_load / (mean_gpus * mean_duration)  # jobs per second
    peak = rate * 1.3
    out: list[PodArrival] = []
    t = 0.0
    job = 0
    sizes = [g for g, _ in SYNTHETIC_SIZES]
    weights = [p for _, p in SYNTHETIC_SIZES]
    while True:
        t += rng.expovariate(peak)
        if t >= horizon:
            break
        if rng.random() * peak > rate * diurnal_rate(t):
            continue
        gpus = rng.choices(sizes, weights)[0]
        duration = min(max_duration, median_duration * math.exp(rng.gauss(0.0, sigma)))
        out.append(PodArrival(t, gpus, max(60.0, duration), job))
        job += 1
    return out


def value_at(series: UtilSeries, t: float) -> float:
    """The series' value at ``t`` seconds, tiling it with its period (step interpolation:
    the last sample at or before ``t``)."""
    local = t % series.period
    lo, hi = 0, len(series.times) - 1
    while lo < hi:  # last index with times[i] <= local
        mid = (lo + hi + 1) // 2
        if series.times[mid] <= local:
            lo = mid
        else:
            hi = mid - 1
    return series.values[lo]


def hour_of_day_profile(series: UtilSeries) -> tuple[float, ...]:
    """Mean value per hour of day (24 entries), ignoring zero samples (outages, data gaps —
    e.g. Helios 2020-05-10). Raises ``ValueError`` when an hour has no non-zero sample."""
    sums = [0.0] * 24
    counts = [0] * 24
    for t, v in zip(series.times, series.values, strict=True):
        if v <= 0:
            continue
        h = int((t % DAY) // 3600)
        sums[h] += v
        counts[h] += 1
    if any(c == 0 for c in counts):
        raise ValueError("the series has an hour of day with no data")
    return tuple(s / c for s, c in zip(sums, counts, strict=True))


PERIODIC_THRESHOLD: Final = 0.3
"""Autocorrelation at a one-day lag above which a trace's arrivals count as daily-periodic."""


@dataclass(frozen=True, slots=True)
class DailyPhase:
    """Where a trace without wall-clock times sits in the day.

    ``shift``: seconds to add to its submit times (0 ≤ shift < 1 day); ``correlation``:
    Pearson r between its hour-of-day arrival profile after the shift and the reference
    profile; ``autocorrelation``: of its hourly arrival counts at a one-day lag (how daily
    its rhythm is; at or below :data:`PERIODIC_THRESHOLD` no phase is derived: shift 0).
    """

    shift: float
    correlation: float | None
    autocorrelation: float

    @property
    def periodic(self) -> bool:
        return self.autocorrelation > PERIODIC_THRESHOLD


def _pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else 0.0


def arrival_autocorrelation(jobs: Sequence[Job], *, lag: float = DAY, step: float = 3600.0) -> float:
    """Autocorrelation of the arrival counts per ``step`` seconds at ``lag`` seconds (the
    sample autocorrelation: lagged covariance over the variance). 0 for a trace shorter
    than two lags or with a constant rate."""
    if not jobs:
        return 0.0
    start = jobs[0].submit
    n = int((jobs[-1].submit - start) // step) + 1
    k = round(lag / step)
    if n < 2 * k or k < 1:
        return 0.0
    counts = [0.0] * n
    for j in jobs:
        counts[int((j.submit - start) // step)] += 1
    mean = sum(counts) / n
    var = sum((c - mean) ** 2 for c in counts)
    if var == 0:
        return 0.0
    return sum((counts[i] - mean) * (counts[i + k] - mean) for i in range(n - k)) / var


def hourly_arrivals(jobs: Iterable[Job], *, shift: float = 0.0) -> tuple[int, ...]:
    """Jobs submitted in each hour of day (24 counts), times taken from the trace's start
    plus ``shift`` seconds."""
    counts = [0] * 24
    for j in jobs:
        counts[int(((j.submit + shift) % DAY) // 3600)] += 1
    return tuple(counts)


def daily_phase(jobs: Sequence[Job], reference: Sequence[float], *, step: float = 600.0) -> DailyPhase:
    """The daily phase of a trace whose times start at an unknown hour (Alibaba Crux: times
    from its first submission, no dates).

    The trace's own rhythm decides whether there is a phase to find: when its hourly
    arrival counts correlate with themselves a day later (:func:`arrival_autocorrelation`
    above :data:`PERIODIC_THRESHOLD`), the shift (a multiple of ``step`` seconds within a
    day; the smallest on ties) is the one that best aligns its hour-of-day arrival profile
    (:func:`hourly_arrivals`) with ``reference`` (24 values, hour 0 first — the online
    tide's demand: tenants submit when people are awake, as the tide's traffic rises), by
    Pearson correlation. Otherwise the shift is 0 and ``correlation`` None. Raises
    ``ValueError`` on an empty trace or a reference of another length than 24.
    """
    if not jobs:
        raise ValueError("the trace holds no jobs")
    if len(reference) != 24:
        raise ValueError("the reference profile needs 24 hourly values")
    auto = arrival_autocorrelation(jobs)
    if auto <= PERIODIC_THRESHOLD:
        return DailyPhase(0.0, None, round(auto, 4))
    start = jobs[0].submit
    rebased = [Job(j.submit - start, j.gpus, j.duration) for j in jobs]
    best = (-2.0, 0.0)
    for k in range(int(DAY // step)):
        r = _pearson([float(c) for c in hourly_arrivals(rebased, shift=k * step)], reference)
        if r > best[0] + 1e-12:
            best = (r, k * step)
    return DailyPhase(best[1], round(best[0], 4), round(auto, 4))
