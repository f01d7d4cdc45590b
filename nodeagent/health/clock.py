"""Clocks for the node agent: wall time in seconds since the epoch, and sleeping on that time.

The health watch, the ledger and the status reporter read time only through a :class:`Clock`
so that tests and the simulator can drive hours or weeks of GPU history in milliseconds:
:class:`SystemClock` in production, :class:`ScaledClock` for the demo (simulated time runs
``speed`` times faster than real time), :class:`ManualClock` for tests (time moves only when
the test calls :meth:`ManualClock.advance`).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Wall-clock seconds since the Unix epoch, and sleeping on that clock."""

    def now(self) -> float:
        """Seconds since the epoch (float)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` of this clock's time have passed (at once when <= 0)."""
        ...


class SystemClock:
    """The real clock: ``time.time()`` and ``asyncio.sleep``."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class ScaledClock:
    """Simulated time that runs ``speed`` times faster than real time, from ``start``
    (epoch seconds; default the real time at construction). ``speed`` must be > 0."""

    def __init__(self, speed: float, *, start: float | None = None) -> None:
        if speed <= 0:
            raise ValueError(f"clock speed must be > 0, got {speed!r}")
        self._speed = speed
        self._start = time.time() if start is None else start
        self._origin = time.monotonic()

    def now(self) -> float:
        return self._start + (time.monotonic() - self._origin) * self._speed

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self._speed)


class ManualClock:
    """A clock that moves only when told to (tests). Sleepers wake in deadline order once
    :meth:`advance` (or :meth:`set`) moves time to or past their deadline."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), fut))
        await fut

    @property
    def sleepers(self) -> int:
        """How many sleeps are pending (tests wait for the agent to settle on this)."""
        return sum(1 for _, _, f in self._sleepers if not f.done())

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0), one sleeper's deadline at a time, letting
        woken tasks run before time moves on."""
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards ({seconds!r} s)")
        await self.set(self._now + seconds)

    async def set(self, when: float) -> None:
        """Move time forward to ``when`` (epoch seconds, not before :meth:`now`)."""
        if when < self._now:
            raise ValueError(f"cannot move a clock backwards from {self._now} to {when}")
        while self._sleepers and self._sleepers[0][0] <= when:
            deadline, _, fut = heapq.heappop(self._sleepers)
            if fut.done():
                continue
            self._now = max(self._now, deadline)
            fut.set_result(None)
            for _ in range(20):
                await asyncio.sleep(0)
        self._now = when
        for _ in range(20):
            await asyncio.sleep(0)
