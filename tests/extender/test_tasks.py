from __future__ import annotations

import asyncio
import logging

import pytest

from extender import tasks
from tests.flexlease.test_tasks import slow_to_stop


async def test_a_task_that_dies_is_reported_at_once(caplog: pytest.LogCaptureFixture) -> None:
    async def boom() -> None:
        raise RuntimeError("controller crashed")

    with pytest.raises(RuntimeError, match="crashed"):
        async with tasks.running(boom(), name="lease-controller"):
            await asyncio.sleep(0.01)
            assert any(
                r.levelno == logging.CRITICAL and "lease-controller" in r.getMessage() for r in caplog.records
            )


async def test_a_running_task_is_cancelled_quietly_on_exit(caplog: pytest.LogCaptureFixture) -> None:
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    async with tasks.running(forever(), name="watch") as task:
        await started.wait()
    assert task.cancelled()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_cancel_of_the_owner_while_the_task_stops_propagates() -> None:
    cancelled, release = asyncio.Event(), asyncio.Event()
    went_on = False

    async def owner() -> None:
        nonlocal went_on
        async with tasks.running(slow_to_stop(cancelled, release), name="watch"):
            await asyncio.sleep(0)
        went_on = True

    caller = asyncio.create_task(owner(), name="owner")
    await cancelled.wait()
    caller.cancel()
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert not went_on
