from __future__ import annotations

import asyncio

import pytest

from nodeagent.cache.singleflight import SingleFlight


async def test_concurrent_calls_share_one_execution() -> None:
    flight: SingleFlight[str, int] = SingleFlight()
    calls = 0
    gate = asyncio.Event()

    async def work() -> int:
        nonlocal calls
        calls += 1
        await gate.wait()
        return 42

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(flight.do("k", work), name=f"caller-{i}") for i in range(5)]
        while calls == 0:  # noqa: ASYNC110 - the leader starts in another task
            await asyncio.sleep(0)
        for _ in range(5):  # let every follower reach the flight
            await asyncio.sleep(0)
        assert flight.in_flight("k")
        gate.set()
    results = [t.result() for t in tasks]
    assert calls == 1
    assert sorted(results) == [(42, False)] + [(42, True)] * 4
    assert not flight.in_flight("k")


async def test_errors_reach_every_waiter_and_the_next_call_runs_again() -> None:
    flight: SingleFlight[str, int] = SingleFlight()
    gate = asyncio.Event()
    calls = 0

    async def boom() -> int:
        nonlocal calls
        calls += 1
        await gate.wait()
        raise ValueError(f"boom {calls}")

    leader = asyncio.create_task(flight.do("k", boom), name="leader")
    await asyncio.sleep(0)
    follower = asyncio.create_task(flight.do("k", boom), name="follower")
    await asyncio.sleep(0)
    assert flight.in_flight("k")
    gate.set()
    results = await asyncio.gather(leader, follower, return_exceptions=True)
    assert calls == 1  # one execution: the follower got the leader's error, not its own
    assert [str(r) for r in results] == ["boom 1", "boom 1"]

    async def ok() -> int:
        return 1

    assert await flight.do("k", ok) == (1, False)
    assert calls == 1


async def test_a_cancelled_leader_hands_over_to_a_follower() -> None:
    flight: SingleFlight[str, str] = SingleFlight()
    started = asyncio.Event()
    runs = 0

    async def work() -> str:
        nonlocal runs
        runs += 1
        started.set()
        await asyncio.sleep(0.05)
        return "done"

    leader = asyncio.create_task(flight.do("k", work), name="leader")
    await started.wait()
    follower = asyncio.create_task(flight.do("k", work), name="follower")
    await asyncio.sleep(0)
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    assert await follower == ("done", False)
    assert runs == 2
