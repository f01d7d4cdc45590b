"""Time for the lease controller: the system clock, or a manual one for tests and the simulator.

Grace periods (30–60 s) and back-offs are measured on the injected clock, so a test or a
simulated day advances :class:`ManualClock` instead of sleeping.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """``now()``: aware UTC time. ``wait(event, after)``: return once ``event`` is set; the
    clock sets ``event`` itself when ``after`` seconds of *its* time have passed (None:
    never), so callers treat ``event`` as "something may have changed, look again"."""

    def now(self) -> datetime: ...

    async def wait(self, event: asyncio.Event, after: float | None) -> None: ...


class SystemClock:
    """Wall-clock time (``datetime.now(UTC)``) and the event loop's timers."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def wait(self, event: asyncio.Event, after: float | None) -> None:
        loop = asyncio.get_running_loop()
        handle = None if after is None else loop.call_later(max(0.0, after), event.set)
        try:
            await event.wait()
        finally:
            if handle is not None:
                handle.cancel()


class ManualClock:
    """A clock that moves only when :meth:`advance` is called (tests, the simulator).

    ``start`` must be timezone-aware; it is converted to UTC.
    """

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("ManualClock needs an aware start time")
        self._now = start.astimezone(UTC)
        self._timers: list[tuple[datetime, asyncio.Event]] = []

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0) and wake every wait whose time has come.
        Raises ``ValueError`` for negative ``seconds``."""
        if seconds < 0:
            raise ValueError("time only moves forward")
        self._now += timedelta(seconds=seconds)
        for due, event in list(self._timers):
            if due <= self._now:
                event.set()

    async def wait(self, event: asyncio.Event, after: float | None) -> None:
        timer = None
        if after is not None:
            timer = (self._now + timedelta(seconds=max(0.0, after)), event)
            if timer[0] <= self._now:
                event.set()
            self._timers.append(timer)
        try:
            await event.wait()
        finally:
            if timer is not None:
                self._timers.remove(timer)


class ScaledClock:
    """Accelerated wall time for the demo and the simulator: from ``start`` (default: now),
    time runs ``speedup`` times faster than real time (``speedup`` > 0; 1 = real time), so a
    45 s grace period passes in 45/``speedup`` real seconds. Raises ``ValueError`` for
    ``speedup`` <= 0."""

    def __init__(self, speedup: float, *, start: datetime | None = None) -> None:
        if speedup <= 0:
            raise ValueError(f"clock speed-up must be > 0, got {speedup!r}")
        self._speedup = speedup
        self._start = (start or datetime.now(UTC)).astimezone(UTC)
        self._t0 = time.monotonic()

    def now(self) -> datetime:
        return self._start + timedelta(seconds=(time.monotonic() - self._t0) * self._speedup)

    async def wait(self, event: asyncio.Event, after: float | None) -> None:
        await SystemClock().wait(event, None if after is None else after / self._speedup)
