from __future__ import annotations

import asyncio
import contextlib

import pytest

from flexlease.aiotask import cancel_and_wait


async def _forever() -> None:
    await asyncio.Event().wait()


async def _slow_to_stop(stopping: asyncio.Event, release: asyncio.Event) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        stopping.set()
        await release.wait()  # cleanup that takes a while


async def test_the_owned_tasks_cancellation_is_swallowed() -> None:
    task = asyncio.create_task(_forever())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert task.cancelled()


async def test_another_error_of_the_owned_task_propagates() -> None:
    async def fail_on_cancel() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            raise RuntimeError("cleanup failed")

    task = asyncio.create_task(fail_on_cancel())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="cleanup failed"):
        await cancel_and_wait(task)


async def test_the_callers_cancellation_is_not_lost() -> None:
    stopping, release = asyncio.Event(), asyncio.Event()
    owned = asyncio.create_task(_slow_to_stop(stopping, release))
    after = []

    async def owner() -> None:
        await cancel_and_wait(owned)
        after.append("went on")  # must not run: the owner itself was cancelled

    outer = asyncio.create_task(owner())
    await stopping.wait()
    outer.cancel()  # the owner is cancelled while it waits for the owned task
    await asyncio.sleep(0)
    release.set()
    with contextlib.suppress(asyncio.CancelledError):
        await outer
    assert outer.cancelled() and after == []


async def test_the_old_pattern_loses_the_callers_cancellation() -> None:
    """What cancel_and_wait fixes: ``suppress(CancelledError)`` around the await swallows the
    owner's own cancellation, and the owner goes on."""
    stopping, release = asyncio.Event(), asyncio.Event()
    owned = asyncio.create_task(_slow_to_stop(stopping, release))
    after = []

    async def owner() -> None:
        owned.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await owned
        after.append("went on")

    outer = asyncio.create_task(owner())
    await stopping.wait()
    outer.cancel()
    await asyncio.sleep(0)
    release.set()
    await outer
    assert after == ["went on"]
