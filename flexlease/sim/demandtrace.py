"""The online job's demand as a trace, in GPUs over time (issue #40), and the metrics source that
serves it to the lease autopilot inside a simulation. Pure but for the clock the source reads.

:class:`DemandTrace` takes a tide (:mod:`flexlease.sim.tide`: the Fig. 2 cosine shaped by the
Helios signal, or the irregular stress tide; a ratio 0–1 of the job's peak allocation) and adds

* day-to-day noise: each day ``d`` has a level ``1 + day_noise × N(0, 1)`` (seeded per day),
  linearly interpolated between the days' noons so that the demand has no step at midnight;
* surprise peaks: arrivals of a Poisson process with ``peaks_per_day`` per day (seeded); each
  lasts a log-uniform time between ``peak_shortest`` and ``peak_longest`` seconds and lifts the
  demand to at least a level drawn uniformly from ``peak_low``–1.0 of the peak.

The trace is defined before t = 0 too (the tides are periodic, noise and peaks are drawn from
``-history`` on), so a forecast can be trained on the 14+ days before the simulation starts.
With ``day_noise = 0`` and ``peaks_per_day = 0`` the trace is the tide itself.

:class:`TraceSource` is a :class:`extender.autopilot.prometheus.MetricsSource` (structurally: this
package does not import the extender): its one query :data:`DEMAND_QUERY` answers the trace's
demand × :data:`PER_GPU` (the job's input rate, samples per second) at the simulation's clock,
and its range queries the same at ``step``-aligned points, as Prometheus' ``query_range`` does.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from flexlease.errors import MetricsError
from flexlease.sim import tide
from flexlease.sim.traces import DAY

DEMAND_QUERY: Final = 'sum(rate(trainer_input_samples_total{namespace="online"}[5m]))'
"""The PromQL the simulated job's policy reads: its input rate, samples per second."""
PER_GPU: Final = 1000.0
"""Samples per second one GPU of the simulated job trains (the policy's ``perGPU``)."""
MAX_POINTS: Final = 11_000
"""Prometheus refuses a range query of more points (``exceeded maximum resolution``)."""


@dataclass(frozen=True, slots=True)
class Peak:
    """A surprise peak: from ``start`` to ``end`` (s), demand at least ``level`` (ratio 0–1)."""

    start: float
    end: float
    level: float


@dataclass(frozen=True, slots=True)
class DemandTrace:
    """Demand of a job of ``peak_gpus`` GPUs (see the module docstring). ``history``: seconds
    before t = 0 the noise and the peaks are drawn for; ``horizon``: seconds after."""

    base: tide.Demand
    peak_gpus: int
    seed: int
    horizon: float
    history: float = 28 * DAY
    day_noise: float = 0.0
    peaks_per_day: float = 0.0
    peak_shortest: float = 1800.0
    peak_longest: float = 3 * 3600.0
    peak_low: float = 0.8
    peaks: tuple[Peak, ...] = field(init=False, default=())
    _starts: tuple[float, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        if self.peak_gpus < 1:
            raise ValueError("peak_gpus must be >= 1")
        if self.day_noise < 0 or self.peaks_per_day < 0:
            raise ValueError("day_noise and peaks_per_day must be >= 0")
        if not 0 < self.peak_shortest <= self.peak_longest:
            raise ValueError("need 0 < peak_shortest <= peak_longest")
        if not 0.0 <= self.peak_low <= 1.0:
            raise ValueError("peak_low must be within [0, 1]")
        rng = random.Random(f"demand-peaks:{self.seed}")
        out: list[Peak] = []
        t = -self.history
        while self.peaks_per_day > 0:
            t += rng.expovariate(self.peaks_per_day / DAY)
            if t > self.horizon:
                break
            length = math.exp(rng.uniform(math.log(self.peak_shortest), math.log(self.peak_longest)))
            out.append(Peak(t, t + length, rng.uniform(self.peak_low, 1.0)))
        object.__setattr__(self, "peaks", tuple(out))
        object.__setattr__(self, "_starts", tuple(p.start for p in out))

    def _day_level(self, day: int) -> float:
        if self.day_noise == 0:
            return 1.0
        return 1.0 + self.day_noise * random.Random(f"demand-noise:{self.seed}:{day}").gauss(0.0, 1.0)

    def ratio(self, t: float) -> float:
        """Demand at ``t`` seconds since the start (negative: before it), ratio 0–1 of the peak."""
        noon = t / DAY - 0.5
        day = math.floor(noon)
        frac = noon - day
        level = (1 - frac) * self._day_level(day) + frac * self._day_level(day + 1)
        value = min(1.0, max(0.0, self.base.demand(t) * level))
        # peaks last at most peak_longest: only those starting within that much before t count
        i = bisect.bisect_right(self._starts, t)
        while i > 0 and self.peaks[i - 1].start > t - self.peak_longest:
            i -= 1
            peak = self.peaks[i]
            if peak.start <= t < peak.end:
                value = max(value, peak.level)
        return value

    def demand(self, t: float) -> float:
        """:meth:`ratio` (the :class:`flexlease.sim.tide.Demand` protocol the tide policy reads)."""
        return self.ratio(t)

    def gpus(self, t: float) -> float:
        """Demand at ``t`` in GPUs (fractional; the job needs the ceiling)."""
        return self.ratio(t) * self.peak_gpus

    def needed(self, t: float) -> int:
        """Whole GPUs the job needs at ``t``: ``ceil(gpus(t))`` (a hair of float noise ignored)."""
        return math.ceil(self.gpus(t) - 1e-9)

    def describe(self) -> str:
        """One line for the report."""
        if self.day_noise == 0 and self.peaks_per_day == 0:
            return "the tide itself (no noise, no surprise peaks)"
        peaks = sum(1 for p in self.peaks if 0 <= p.start < self.horizon)
        return (
            f"the tide × a daily level 1 + {self.day_noise:g}·N(0,1), surprise peaks "
            f"{self.peaks_per_day:g}/day of {self.peak_shortest / 60:g}–{self.peak_longest / 60:g} min "
            f"to ≥ {self.peak_low:g}–1.0 of the peak (seed {self.seed}; {peaks} in the run)"
        )


class TraceSource:
    """The simulation's Prometheus: answers :data:`DEMAND_QUERY` from ``trace`` at simulated
    time ``now() - origin`` (``now``: the simulation's clock, epoch seconds). Another query has
    no series (:class:`MetricsError`, as an empty Prometheus result is for the autopilot)."""

    def __init__(self, trace: DemandTrace, *, now: Callable[[], float], origin: float) -> None:
        self.trace = trace
        self._now = now
        self._origin = origin
        self.instant_queries = 0
        self.range_queries = 0

    def _check(self, query: str) -> None:
        if query != DEMAND_QUERY:
            raise MetricsError(f"query {query!r} returned no series (the simulation serves {DEMAND_QUERY})")

    def value(self, t: float) -> float:
        """The metric at simulated ``t``: the demand in GPUs × :data:`PER_GPU`."""
        return self.trace.gpus(t) * PER_GPU

    async def instant(self, query: str) -> float:
        self._check(query)
        self.instant_queries += 1
        return self.value(self._now() - self._origin)

    async def series(self, query: str, *, seconds: float, step: float) -> list[tuple[float, float]]:
        self._check(query)
        if step <= 0 or seconds < 0:
            raise MetricsError(f"query {query!r}: step {step} and range {seconds} must be positive")
        if seconds / step + 1 > MAX_POINTS:
            raise MetricsError(f"query {query!r}: exceeded maximum resolution of {MAX_POINTS} points")
        self.range_queries += 1
        end = self._now()
        first = math.ceil((end - seconds) / step) * step
        out: list[tuple[float, float]] = []
        t = first
        while t <= end:
            out.append((t, self.value(t - self._origin)))
            t += step
        return out
