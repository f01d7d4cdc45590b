"""Clocks: the manual clock wakes sleepers in deadline order; the scaled clock runs faster."""

from __future__ import annotations

import asyncio
import time

import pytest

from nodeagent.health.clock import Clock, ManualClock, ScaledClock, SystemClock


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


async def test_cancelled_sleepers_are_not_counted() -> None:
    clock = ManualClock()
    task = asyncio.create_task(clock.sleep(5), name="test:sleep")
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert clock.sleepers == 0
    await clock.advance(10)


async def test_scaled_clock_runs_speed_times_faster() -> None:
    clock = ScaledClock(1000.0, start=0.0)
    t0 = time.monotonic()
    await clock.sleep(50)  # 50 simulated seconds = 0.05 s
    assert 0.04 <= time.monotonic() - t0 < 1.0
    assert clock.now() >= 50
    with pytest.raises(ValueError):
        ScaledClock(0)


def test_clocks_satisfy_the_protocol() -> None:
    for clock in (SystemClock(), ScaledClock(2.0), ManualClock()):
        assert isinstance(clock, Clock)
    assert abs(SystemClock().now() - time.time()) < 1
