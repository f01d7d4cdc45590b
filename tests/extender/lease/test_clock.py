"""System and manual clocks (extender/lease/clock.py)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from extender.lease.clock import ManualClock, ScaledClock, SystemClock


async def test_manual_clock_wakes_a_wait_only_when_its_time_comes() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    clock = ManualClock(start)
    event = asyncio.Event()
    waiter = asyncio.create_task(clock.wait(event, 45), name="wait")
    await asyncio.sleep(0.01)
    clock.advance(44.5)
    await asyncio.sleep(0.01)
    assert not waiter.done()
    clock.advance(0.5)
    await asyncio.wait_for(waiter, 1)
    assert event.is_set() and clock.now() == start + timedelta(seconds=45)


async def test_manual_clock_wait_returns_when_the_event_is_set_first() -> None:
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    event = asyncio.Event()
    waiter = asyncio.create_task(clock.wait(event, None), name="wait")
    await asyncio.sleep(0)
    event.set()
    await asyncio.wait_for(waiter, 1)


def test_manual_clock_rejects_naive_times_and_going_back() -> None:
    with pytest.raises(ValueError, match="aware"):
        ManualClock(datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="forward"):
        ManualClock(datetime(2026, 1, 1, tzinfo=UTC)).advance(-1)


async def test_system_clock_sets_the_event_after_the_delay() -> None:
    clock = SystemClock()
    event = asyncio.Event()
    before = clock.now()
    await asyncio.wait_for(clock.wait(event, 0.02), 1)
    assert event.is_set() and clock.now() - before >= timedelta(seconds=0.015)
    assert clock.now().tzinfo is UTC


async def test_scaled_clock_runs_faster_than_real_time() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    clock = ScaledClock(1000, start=start)
    event = asyncio.Event()
    await asyncio.wait_for(clock.wait(event, 30), 2)  # 30 simulated seconds in ~30 ms
    assert event.is_set()
    assert clock.now() - start >= timedelta(seconds=30)
    with pytest.raises(ValueError):
        ScaledClock(0)
