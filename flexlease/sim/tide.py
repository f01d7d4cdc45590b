"""The online-training job's tidal demand (WeFlex Fig. 2) and its scale policy (§4.4). Pure.

Fig. 2: the GPU utilisation of online training follows the daily traffic tide between 39 %
(off-peak) and 92 % (peak). :class:`Tide` gives demand as a ratio 0–1 of the job's peak
allocation: a cosine between ``low`` and ``high`` with its minimum at ``trough_hour``,
optionally shaped by a real cluster signal (the Helios utilisation series), which adds its
relative day-to-day and minute-to-minute deviation from its own hour-of-day mean.

§4.4 / §4.7: "during each scale-down, half of the GPUs were released, and during each
scale-up, all loaned GPUs were reclaimed". :func:`decide` is that policy with hysteresis:
scale down when demand falls below ``down_below`` (half the GPUs then suffice), back up when
it rises above ``up_above``.

:class:`IrregularTide` is a stress tide for right-of-return at the edges: troughs and peaks of
random length, from minutes (a scale-up one scheduling round after a scale-down: back-to-back
lend and reclaim) to hours.
"""

from __future__ import annotations

import bisect
import enum
import math
import random
from dataclasses import dataclass, field
from typing import Final, Protocol

from flexlease.sim import traces

FIG2_LOW: Final = 0.39
FIG2_HIGH: Final = 0.92


class Scale(enum.StrEnum):
    """The online job's size: ``full`` (its peak allocation) or ``half`` (after a lend)."""

    FULL = "full"
    HALF = "half"


class Demand(Protocol):
    """A demand curve: :meth:`demand` at ``t`` seconds since the start, ratio 0–1 of the peak."""

    def demand(self, t: float) -> float: ...


@dataclass(frozen=True, slots=True)
class Tide:
    """Demand curve. ``low``/``high``: ratio 0–1 of the peak allocation (Fig. 2: 0.39/0.92);
    ``trough_hour``: hour of day (0–24) of the minimum; ``shape``: an optional real signal
    whose relative deviation from its hour-of-day profile is added with weight ``gain``."""

    low: float = FIG2_LOW
    high: float = FIG2_HIGH
    trough_hour: float = 3.0
    shape: traces.UtilSeries | None = None
    shape_profile: tuple[float, ...] | None = None
    gain: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.low <= self.high <= 1.0:
            raise ValueError(f"need 0 <= low ({self.low}) <= high ({self.high}) <= 1")
        if (self.shape is None) != (self.shape_profile is None):
            raise ValueError("shape and shape_profile go together (see Tide.shaped)")

    @classmethod
    def shaped(cls, series: traces.UtilSeries, *, gain: float = 1.0, trough_hour: float = 3.0) -> Tide:
        """A Fig. 2 tide modulated by ``series`` (e.g. Helios May 2020, 10-min means)."""
        return cls(
            trough_hour=trough_hour,
            shape=series,
            shape_profile=traces.hour_of_day_profile(series),
            gain=gain,
        )

    def demand(self, t: float) -> float:
        """Demand at ``t`` seconds since the start (hour of day = (t mod 86400)/3600), ratio 0–1."""
        hour = (t % traces.DAY) / 3600.0
        phase = (1.0 - math.cos(2 * math.pi * (hour - self.trough_hour) / 24.0)) / 2.0  # 0 at trough
        base = self.low + (self.high - self.low) * phase
        if self.shape is None or self.shape_profile is None:
            return base
        value = traces.value_at(self.shape, t)
        mean = self.shape_profile[int(hour) % 24]
        deviation = 0.0 if value <= 0 else value / mean - 1.0  # zero samples are gaps
        return min(1.0, max(0.0, base * (1.0 + self.gain * deviation)))


@dataclass(frozen=True, slots=True)
class IrregularTide:
    """Peaks and troughs of random length: demand is ``high`` from t = 0, then alternates with
    ``low``; each phase lasts a log-uniform time between ``shortest`` and ``longest`` seconds
    (drawn from ``seed``, up to ``horizon``), so troughs range from one scheduling round to
    hours, and short ones put a scale-up right after a scale-down."""

    seed: int
    horizon: float
    low: float = FIG2_LOW
    high: float = FIG2_HIGH
    shortest: float = 600.0
    longest: float = 6 * 3600.0
    switches: tuple[float, ...] = field(init=False, default=())
    """Times at which the demand flips (the first to ``low``)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.low <= self.high <= 1.0:
            raise ValueError(f"need 0 <= low ({self.low}) <= high ({self.high}) <= 1")
        if not 0 < self.shortest <= self.longest:
            raise ValueError("need 0 < shortest <= longest")
        rng = random.Random(f"irregular-tide:{self.seed}")
        out: list[float] = []
        t = 0.0
        while t <= self.horizon:
            t += math.exp(rng.uniform(math.log(self.shortest), math.log(self.longest)))
            out.append(t)
        object.__setattr__(self, "switches", tuple(out))

    def demand(self, t: float) -> float:
        """``high`` before the first switch and after every second one, else ``low``."""
        return self.high if bisect.bisect_right(self.switches, t) % 2 == 0 else self.low


@dataclass(frozen=True, slots=True)
class ScalePolicy:
    """Hysteresis thresholds on demand (ratio 0–1 of peak): half below ``down_below``, full
    above ``up_above``. ``down_below <= up_above``; with 0.5 both ways half the GPUs carry
    the trough exactly."""

    down_below: float = 0.45
    up_above: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 < self.down_below <= self.up_above <= 1.0:
            raise ValueError("need 0 < down_below <= up_above <= 1")


def decide(current: Scale, demand: float, policy: ScalePolicy) -> Scale:
    """The job's next size given its ``current`` size and ``demand`` (ratio 0–1)."""
    if current is Scale.FULL and demand < policy.down_below:
        return Scale.HALF
    if current is Scale.HALF and demand > policy.up_above:
        return Scale.FULL
    return current


def released_count(full_gpus: int) -> int:
    """GPUs a scale-down releases (§4.4: half; the larger half stays)."""
    if full_gpus < 0:
        raise ValueError("full_gpus must be >= 0")
    return full_gpus // 2
