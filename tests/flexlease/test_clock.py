"""flexlease.clock: the system, scaled and manual clocks, in both waiting styles."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta, timezone

import pytest

from flexlease.clock import Clock, ManualClock, ScaledClock, SystemClock, format_time

START = datetime(2026, 1, 1, tzinfo=UTC)


async def test_manual_clock_wakes_a_wait_only_when_its_time_comes() -> None:
    clock = ManualClock(START)
    event = asyncio.Event()
    waiter = asyncio.create_task(clock.wait(event, 45), name="wait")
    await asyncio.sleep(0)
    assert clock.next_due() == START.timestamp() + 45
    await clock.advance(44.5)
    assert not waiter.done()
    await clock.advance(0.5)
    await asyncio.wait_for(waiter, 1)
    assert event.is_set() and clock.now_utc() == START + timedelta(seconds=45)
    assert clock.next_due() is None


async def test_manual_clock_wait_returns_when_the_event_is_set_first() -> None:
    clock = ManualClock(START)
    event = asyncio.Event()
    waiter = asyncio.create_task(clock.wait(event, 30), name="wait")
    await asyncio.sleep(0)
    event.set()
    await asyncio.wait_for(waiter, 1)
    assert clock.sleepers == 0 and clock.next_due() is None  # its timer was withdrawn
    await clock.wait(asyncio.Event(), 0)  # already due: returns at once


async def test_manual_clock_wakes_sleepers_in_deadline_order() -> None:
    clock = ManualClock(start=100.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.now()))

    tasks = [
        asyncio.create_task(sleeper(n, s), name=f"test:{n}") for n, s in [("c", 30), ("a", 10), ("b", 20)]
    ]
    await asyncio.sleep(0)
    assert clock.sleepers == 3
    await clock.advance(15)
    assert woke == [("a", 110.0)]
    assert clock.now() == 115.0
    await clock.advance(100)
    assert woke == [("a", 110.0), ("b", 120.0), ("c", 130.0)]
    assert clock.now() == 215.0
    await asyncio.gather(*tasks)
    await clock.sleep(0)  # no wait
    with pytest.raises(ValueError, match="backwards"):
        await clock.advance(-1)
    with pytest.raises(ValueError, match="backwards"):
        await clock.set(0)


async def test_jump_wakes_what_is_due_without_yielding() -> None:
    clock = ManualClock(start=0.0)
    first, second = asyncio.Event(), asyncio.Event()
    waits = [
        asyncio.create_task(clock.wait(first, 10), name="w1"),
        asyncio.create_task(clock.wait(second, 20), name="w2"),
    ]
    await asyncio.sleep(0)
    assert clock.jump(15) == 1 and first.is_set() and not second.is_set()
    assert clock.next_due() == 20
    assert clock.jump(20) == 1
    await asyncio.gather(*waits)
    with pytest.raises(ValueError, match="backwards"):
        clock.jump(5)


async def test_cancelled_sleepers_are_not_counted() -> None:
    clock = ManualClock()
    task = asyncio.create_task(clock.sleep(5), name="test:sleep")
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert clock.sleepers == 0
    await clock.advance(10)


def test_manual_clock_rejects_naive_times() -> None:
    with pytest.raises(ValueError, match="aware"):
        ManualClock(datetime(2026, 1, 1))


async def test_system_clock_sets_the_event_after_the_delay() -> None:
    clock = SystemClock()
    event = asyncio.Event()
    await asyncio.wait_for(clock.wait(event, 0.02), 1)
    assert event.is_set()
    assert clock.now_utc().tzinfo is UTC
    assert abs(clock.now() - time.time()) < 1


async def test_scaled_clock_runs_speedup_times_faster() -> None:
    clock = ScaledClock(1000.0, start=START)
    event = asyncio.Event()
    await asyncio.wait_for(clock.wait(event, 30), 2)  # 30 simulated seconds in ~30 ms
    assert event.is_set()
    assert clock.now_utc() - START >= timedelta(seconds=30)
    await clock.sleep(20)
    assert clock.now() - START.timestamp() >= 50
    with pytest.raises(ValueError):
        ScaledClock(0)


def test_clocks_satisfy_the_protocol() -> None:
    for clock in (SystemClock(), ScaledClock(2.0), ManualClock()):
        assert isinstance(clock, Clock)


def test_format_time_writes_rfc3339_utc_whole_seconds() -> None:
    assert format_time(datetime(2026, 1, 2, 15, 4, 5, 999_999, tzinfo=UTC)) == "2026-01-02T15:04:05Z"
    plus_two = datetime(2026, 1, 2, 15, 4, 5, tzinfo=UTC).astimezone(timezone(timedelta(hours=2)))
    assert format_time(plus_two) == "2026-01-02T15:04:05Z"
    assert format_time(datetime(999, 1, 1, tzinfo=UTC)) == "0999-01-01T00:00:00Z"  # four digits
