from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from flexlease import tasks


async def _forever(started: asyncio.Event) -> None:
    started.set()
    await asyncio.Event().wait()


async def slow_to_stop(cancelled: asyncio.Event, release: asyncio.Event, *, error: str | None = None) -> None:
    """Runs until cancelled, then holds on until ``release`` is set (a clean-up that takes
    a while and sees through further cancels) and ends cancelled, or with RuntimeError(error)."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        cancelled.set()
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()
        if error is not None:
            raise RuntimeError(error) from None
        raise


async def test_a_running_task_is_stopped_and_the_caller_goes_on() -> None:
    started = asyncio.Event()
    task = asyncio.create_task(_forever(started), name="worker")
    await started.wait()

    await tasks.stop(task)

    assert task.cancelled()
    await asyncio.sleep(0)  # the caller is not cancelled: it still awaits


async def test_a_cancel_of_the_caller_while_it_stops_a_task_propagates() -> None:
    # The old pattern (`task.cancel(); with suppress(CancelledError): await task`) fails this:
    # the caller's CancelledError comes out of `await task`, is swallowed, and `went_on` is set.
    cancelled, release = asyncio.Event(), asyncio.Event()
    worker = asyncio.create_task(slow_to_stop(cancelled, release), name="worker")
    went_on = False

    async def owner() -> None:
        nonlocal went_on
        await asyncio.sleep(0)  # let the worker start
        await tasks.stop(worker)
        went_on = True

    caller = asyncio.create_task(owner(), name="owner")
    await cancelled.wait()
    caller.cancel()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not caller.done()  # it waits for the worker to finish its clean-up
    release.set()

    with pytest.raises(asyncio.CancelledError):
        await caller
    assert caller.cancelled()
    assert worker.cancelled()
    assert not went_on


async def test_a_stop_in_the_clean_up_of_a_cancelled_caller_lets_the_clean_up_finish() -> None:
    # The caller's cancelling() count is already 1 here: the stop must not take that for a
    # cancel of its own and cut the rest of the clean-up short.
    started = asyncio.Event()
    worker = asyncio.create_task(_forever(started), name="worker")
    cleaned = False

    async def owner() -> None:
        nonlocal cleaned
        try:
            await asyncio.Event().wait()
        finally:
            await tasks.stop(worker)
            cleaned = True

    caller = asyncio.create_task(owner(), name="owner")
    await started.wait()
    caller.cancel()

    with pytest.raises(asyncio.CancelledError):
        await caller
    assert worker.cancelled()
    assert cleaned


async def test_the_error_a_task_died_with_is_raised() -> None:
    async def boom() -> None:
        raise RuntimeError("watch crashed")

    task = asyncio.create_task(boom(), name="watch")
    await asyncio.sleep(0)
    assert task.done()

    with pytest.raises(RuntimeError, match="watch crashed"):
        await tasks.stop(task)


async def test_an_error_raised_on_the_cancel_is_raised() -> None:
    cancelled, release = asyncio.Event(), asyncio.Event()
    release.set()
    task = asyncio.create_task(slow_to_stop(cancelled, release, error="clean-up failed"), name="w")
    await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="clean-up failed"):
        await tasks.stop(task)


async def test_a_task_that_returned_counts_as_stopped() -> None:
    async def quick() -> None:
        return None

    async def returns_on_cancel() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return

    done = asyncio.create_task(quick(), name="quick")
    polite = asyncio.create_task(returns_on_cancel(), name="polite")
    await asyncio.sleep(0)

    await tasks.stop(done, polite)

    assert done.done() and not done.cancelled()
    assert polite.done() and not polite.cancelled()


async def test_every_task_is_stopped_the_first_error_raised_the_others_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cancelled, release = asyncio.Event(), asyncio.Event()
    release.set()
    started = asyncio.Event()
    quiet = asyncio.create_task(_forever(started), name="quiet")
    first = asyncio.create_task(slow_to_stop(cancelled, release, error="first"), name="first")
    second = asyncio.create_task(slow_to_stop(cancelled, release, error="second"), name="second")
    await started.wait()

    with pytest.raises(RuntimeError, match="first"):
        await tasks.stop(quiet, first, second)

    assert quiet.cancelled() and first.done() and second.done()
    logged = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in logged] == ["stopped task second had failed"]
    assert logged[0].exc_info is not None and str(logged[0].exc_info[1]) == "second"


async def test_a_cancelled_caller_logs_the_error_it_cannot_raise(caplog: pytest.LogCaptureFixture) -> None:
    cancelled, release = asyncio.Event(), asyncio.Event()
    worker = asyncio.create_task(slow_to_stop(cancelled, release, error="clean-up failed"), name="worker")
    caller = asyncio.create_task(tasks.stop(worker), name="owner")
    await cancelled.wait()
    caller.cancel()
    await asyncio.sleep(0)
    release.set()

    with pytest.raises(asyncio.CancelledError):
        await caller
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        "stopped task worker had failed"
    ]
