"""The one clock abstraction of flexlease: wall time, and waiting on it.

Every component that measures time — the node agent's health watch, ledger and status
reporter, the lease controller's grace periods, back-offs and resyncs, and the simulator —
reads it through a :class:`Clock`, so tests and the simulator can drive hours or weeks in
milliseconds and a simulation runs every component on one virtual time:

* :class:`SystemClock` — production: ``time.time()`` and the event loop's timers;
* :class:`ScaledClock` — the demo: time runs ``speedup`` times faster than real time;
* :class:`ManualClock` — tests and the simulator: time moves only when told to
  (:meth:`ManualClock.advance`, :meth:`ManualClock.set`, :meth:`ManualClock.jump`), and
  :meth:`ManualClock.next_due` tells when the next sleeper or waiter wants to wake, so a
  driver can step time from one deadline to the next and let everything settle in between.

Two ways to wait, for the two styles in the code base: ``sleep(seconds)`` and
``wait(event, after)`` (return once ``event`` is set; the clock sets it itself when
``after`` seconds of *its* time have passed, so callers treat ``event`` as "something may
have changed, look again").
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

DEFAULT_MANUAL_START = 1_700_000_000.0
"""Where a :class:`ManualClock` starts unless told otherwise (epoch seconds, Nov 2023)."""

SETTLE_YIELDS = 20
"""Loop iterations :meth:`ManualClock.set` yields after each wake-up, letting woken tasks run."""


def format_time(when: datetime) -> str:
    """An aware datetime as Kubernetes writes ``metav1.Time``: RFC 3339 in UTC, whole seconds,
    ``Z`` suffix (``2026-01-02T15:04:05Z``). A naive datetime is taken as local time
    (``datetime.astimezone``). Years below 1000 keep four digits (``0999-…``), as RFC 3339
    requires."""
    return when.astimezone(UTC).replace(microsecond=0, tzinfo=None).isoformat() + "Z"


@runtime_checkable
class Clock(Protocol):
    """Wall-clock time and waiting on that clock."""

    def now(self) -> float:
        """Seconds since the Unix epoch (float)."""
        ...

    def now_utc(self) -> datetime:
        """The same instant as an aware UTC ``datetime``."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` of this clock's time have passed (at once when <= 0)."""
        ...

    async def wait(self, event: asyncio.Event, after: float | None) -> None:
        """Return once ``event`` is set; the clock sets it when ``after`` seconds of its time
        have passed (None: never)."""
        ...


def _epoch(start: float | datetime) -> float:
    if isinstance(start, datetime):
        if start.tzinfo is None:
            raise ValueError("a clock needs an aware start time")
        return start.timestamp()
    return float(start)


def _utc(seconds: float) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)


class SystemClock:
    """The real clock: ``time.time()`` and the event loop's timers."""

    def now(self) -> float:
        return time.time()

    def now_utc(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def wait(self, event: asyncio.Event, after: float | None) -> None:
        loop = asyncio.get_running_loop()
        handle = None if after is None else loop.call_later(max(0.0, after), event.set)
        try:
            await event.wait()
        finally:
            if handle is not None:
                handle.cancel()


class ScaledClock:
    """Accelerated wall time for the demo: from ``start`` (epoch seconds or an aware
    datetime; default: now) time runs ``speedup`` times faster than real time (1 = real
    time), so a 45 s grace period passes in 45/``speedup`` real seconds. Raises
    ``ValueError`` for ``speedup`` <= 0 or a naive ``start``."""

    def __init__(self, speedup: float, *, start: float | datetime | None = None) -> None:
        if speedup <= 0:
            raise ValueError(f"clock speed-up must be > 0, got {speedup!r}")
        self._speedup = speedup
        self._start = time.time() if start is None else _epoch(start)
        self._origin = time.monotonic()

    def now(self) -> float:
        return self._start + (time.monotonic() - self._origin) * self._speedup

    def now_utc(self) -> datetime:
        return _utc(self.now())

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self._speedup)

    async def wait(self, event: asyncio.Event, after: float | None) -> None:
        await SystemClock().wait(event, None if after is None else after / self._speedup)


class ManualClock:
    """A clock that moves only when told to (tests, the simulator).

    ``start``: epoch seconds or an aware datetime. Sleepers and waiters wake in deadline
    order (ties: the order they started waiting) once time reaches their deadline.
    :meth:`jump` moves time synchronously and only marks the due ones runnable;
    :meth:`set` / :meth:`advance` move one deadline at a time and yield to the event loop
    after each, so woken tasks run before time moves on.
    """

    def __init__(self, start: float | datetime = DEFAULT_MANUAL_START) -> None:
        self._now = _epoch(start)
        self._timers: list[tuple[float, int, Callable[[], None], list[bool]]] = []
        """Heap of (deadline, sequence, wake, [alive])."""
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def now_utc(self) -> datetime:
        return _utc(self._now)

    def _add(self, seconds: float, wake: Callable[[], None]) -> list[bool]:
        alive = [True]
        heapq.heappush(self._timers, (self._now + max(0.0, seconds), next(self._seq), wake, alive))
        return alive

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        alive = self._add(seconds, wake)
        try:
            await fut
        finally:
            alive[0] = False

    async def wait(self, event: asyncio.Event, after: float | None) -> None:
        alive: list[bool] | None = None
        if after is not None:
            if after <= 0:
                event.set()
            else:
                alive = self._add(after, event.set)
        try:
            await event.wait()
        finally:
            if alive is not None:
                alive[0] = False

    def _drop_dead(self) -> None:
        while self._timers and not self._timers[0][3][0]:
            heapq.heappop(self._timers)

    @property
    def sleepers(self) -> int:
        """How many sleeps and timed waits are pending (tests wait for components to settle
        on this)."""
        return sum(1 for *_, alive in self._timers if alive[0])

    def next_due(self) -> float | None:
        """The earliest deadline of a pending sleep or timed wait (epoch seconds), or None."""
        self._drop_dead()
        return self._timers[0][0] if self._timers else None

    def jump(self, when: float) -> int:
        """Move time to ``when`` (epoch seconds, not before :meth:`now`) and wake every
        sleeper and waiter due by then, without yielding; returns how many were woken.
        Raises ``ValueError`` when ``when`` is in the past."""
        if when < self._now:
            raise ValueError(f"cannot move a clock backwards from {self._now} to {when}")
        self._now = when
        woken = 0
        while True:
            self._drop_dead()
            if not self._timers or self._timers[0][0] > when:
                return woken
            _, _, wake, alive = heapq.heappop(self._timers)
            alive[0] = False
            wake()
            woken += 1

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0), one deadline at a time (see :meth:`set`).
        Raises ``ValueError`` for negative ``seconds``."""
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards ({seconds!r} s)")
        await self.set(self._now + seconds)

    async def set(self, when: float) -> None:
        """Move time forward to ``when`` (epoch seconds, not before :meth:`now`): to each
        pending deadline in turn, waking what is due and yielding :data:`SETTLE_YIELDS`
        times so woken tasks run (and may start new sleeps) before time moves on."""
        if when < self._now:
            raise ValueError(f"cannot move a clock backwards from {self._now} to {when}")
        while (due := self.next_due()) is not None and due <= when:
            self.jump(max(self._now, due))
            for _ in range(SETTLE_YIELDS):
                await asyncio.sleep(0)
        self._now = when
        for _ in range(SETTLE_YIELDS):
            await asyncio.sleep(0)
