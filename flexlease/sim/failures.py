"""A GPU failure process calibrated to WeFlex Fig. 5 (pure, seeded).

Fig. 5: 70 % of GPUs stay fully available over two weeks, 58 % over a month; the rest are
mid- (97–100 %) or low-availability (< 97 %). A single failure rate cannot give both numbers
(homogeneous Poisson failures with 70 % at 14 days give 0.70^(30/14) ≈ 47 % at 30 days), so
GPUs are a mixture: a *flaky* share fails often (``flaky_rate``), the rest rarely
(``good_rate``). :meth:`FailureModel.calibrated` solves for the flaky share and the good rate
from the two Fig. 5 points. Flaky GPUs cluster on *bad nodes* (a share of nodes holding most
of them), as in production fleets where a board, NVLink or cooling fault hits a whole server.

Each outage lasts a log-normal time (median ``repair_median`` s). Everything is drawn from
string seeds ``(seed, node, index)``, so a GPU's history does not depend on cluster size or
on the order of calls.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from flexlease.sim.traces import DAY

Interval = tuple[float, float]
"""An outage ``[start, end)`` in seconds since the simulation start (may be negative: history)."""
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class FailureModel:
    """Per-GPU failure process. Rates are failures per second; durations are seconds.

    ``flaky_fraction`` of all GPUs are flaky; ``bad_node_fraction`` of nodes are bad and hold
    ``bad_node_flaky_share`` of the flaky GPUs.
    """

    flaky_fraction: float
    good_rate: float
    flaky_rate: float
    bad_node_fraction: float = 0.25
    bad_node_flaky_share: float = 0.65
    repair_median: float = 2 * 3600.0
    repair_sigma: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.flaky_fraction <= 1.0 or not 0.0 < self.bad_node_fraction < 1.0:
            raise ValueError("flaky_fraction must be within 0..1 and bad_node_fraction within (0, 1)")
        if self.good_rate < 0 or self.flaky_rate < 0 or self.repair_median <= 0:
            raise ValueError("rates must be >= 0 and repair_median > 0")
        if max(self.flaky_probability(bad_node=True), self.flaky_probability(bad_node=False)) > 1.0:
            raise ValueError("bad_node_flaky_share is too high for bad_node_fraction")

    @classmethod
    def calibrated(
        cls,
        *,
        ha_short: float = 0.70,
        short_days: float = 14.0,
        ha_long: float = 0.58,
        long_days: float = 30.0,
        flaky_rate_per_day: float = 0.5,
        repair_median: float = 2 * 3600.0,
    ) -> FailureModel:
        """The model whose GPUs have no outage over ``short_days`` with probability
        ``ha_short`` and over ``long_days`` with probability ``ha_long`` (Fig. 5: 0.70 over
        14 days, 0.58 over 30), for a given flaky failure rate (failures per day).

        Solves ``(1-f)·exp(-g·T) + f·exp(-b·T) = p`` at both points for the flaky share ``f``
        and the good rate ``g`` (per day) by fixed-point iteration. Raises ``ValueError`` when
        the points are not ``1 > ha_short > ha_long > 0`` with ``short_days < long_days``.
        """
        if not (1.0 > ha_short > ha_long > 0.0 and 0 < short_days < long_days):
            raise ValueError("need 1 > ha_short > ha_long > 0 and 0 < short_days < long_days")
        b = flaky_rate_per_day
        f = 0.0
        g = 0.0
        for _ in range(100):
            a_short = ha_short - f * math.exp(-b * short_days)
            a_long = ha_long - f * math.exp(-b * long_days)
            g = math.log(a_short / a_long) / (long_days - short_days)
            f = 1.0 - a_short * math.exp(g * short_days)
        if not 0.0 <= f < 1.0 or g < 0:
            raise ValueError("Fig. 5 points cannot be met with this flaky rate")
        return cls(flaky_fraction=f, good_rate=g / DAY, flaky_rate=b / DAY, repair_median=repair_median)

    def flaky_probability(self, *, bad_node: bool) -> float:
        """Chance that one GPU on a bad (or ordinary) node is flaky."""
        if bad_node:
            return self.flaky_fraction * self.bad_node_flaky_share / self.bad_node_fraction
        return self.flaky_fraction * (1 - self.bad_node_flaky_share) / (1 - self.bad_node_fraction)

    def no_outage_probability(self, days: float) -> float:
        """Expected share of GPUs with no outage starting within ``days`` (ratio 0–1)."""
        return (1 - self.flaky_fraction) * math.exp(
            -self.good_rate * days * DAY
        ) + self.flaky_fraction * math.exp(-self.flaky_rate * days * DAY)


def is_bad_node(model: FailureModel, node: str, *, seed: int) -> bool:
    """Whether ``node`` is one of the bad nodes (seeded by node name)."""
    return random.Random(f"node:{seed}:{node}").random() < model.bad_node_fraction


def outages(
    model: FailureModel, node: str, index: int, *, seed: int, start: float, end: float
) -> tuple[Interval, ...]:
    """Outages of GPU ``(node, index)`` starting in ``[start, end)``, sorted and disjoint."""
    if end < start:
        raise ValueError("end must not be before start")
    bad = is_bad_node(model, node, seed=seed)
    rng = random.Random(f"gpu:{seed}:{node}:{index}")
    flaky = rng.random() < model.flaky_probability(bad_node=bad)
    rate = model.flaky_rate if flaky else model.good_rate
    out: list[Interval] = []
    if rate <= 0:
        return ()
    t = start
    while True:
        t += rng.expovariate(rate)
        if t >= end:
            break
        duration = model.repair_median * math.exp(rng.gauss(0.0, model.repair_sigma))
        out.append((t, t + duration))
        t += duration
    return tuple(out)


def is_down(intervals: tuple[Interval, ...], t: float) -> bool:
    """True when ``t`` falls inside one of the outages."""
    return any(s <= t < e for s, e in intervals)


def downtime(intervals: tuple[Interval, ...], lo: float, hi: float) -> float:
    """Seconds of outage within ``[lo, hi)``."""
    return sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in intervals if s < hi and e > lo)


class OutageSweep(Generic[K]):
    """The keys whose outages touch a window that only moves forward, without looking at the
    others: a sweep over every outage sorted by start. ``outages``: each key's intervals (as
    :func:`outages` returns them); keys come back in this mapping's order."""

    def __init__(self, outages: Mapping[K, tuple[Interval, ...]]) -> None:
        self._keys = list(outages)
        self._starts = sorted((s, e, i) for i, ivs in enumerate(outages.values()) for s, e in ivs)
        self._next = 0
        self._active: list[tuple[float, int]] = []
        self._lo = -math.inf
        self._hi = -math.inf

    def touching(self, lo: float, hi: float) -> list[K]:
        """Keys with an outage ``(s, e)`` where ``s <= hi`` and ``e > lo``: every key for which
        :func:`is_down` at ``hi`` or :func:`downtime` over ``[lo, hi)`` can be non-zero. Raises
        ``ValueError`` when the window moves backwards (``lo`` or ``hi`` below the last call's)."""
        if lo < self._lo or hi < self._hi:
            raise ValueError(f"the window moved backwards: [{lo}, {hi}] after [{self._lo}, {self._hi}]")
        self._lo, self._hi = lo, hi
        while self._next < len(self._starts) and self._starts[self._next][0] <= hi:
            _, end, i = self._starts[self._next]
            self._active.append((end, i))
            self._next += 1
        self._active = [(end, i) for end, i in self._active if end > lo]
        return [self._keys[i] for i in sorted({i for _, i in self._active})]
