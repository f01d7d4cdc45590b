"""The rate-limited work queue (extender/lease/workqueue.py) on a manual clock."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import pytest

from extender.lease.workqueue import WorkQueue, warn_and_retry
from flexlease.clock import ManualClock


def make() -> tuple[WorkQueue, ManualClock]:
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    return WorkQueue(clock, base_delay=1.0, max_delay=8.0), clock


async def handed_out_after(queue: WorkQueue, clock: ManualClock, seconds: int) -> str:
    """The key :meth:`WorkQueue.get` hands out once ``seconds`` of clock time have passed,
    checking that it waits until then (not handed out a second earlier)."""
    getter = asyncio.create_task(queue.get(), name="get")
    await asyncio.sleep(0.01)
    await clock.advance(seconds - 1)
    await asyncio.sleep(0.01)
    assert not getter.done()
    await clock.advance(1)
    return await asyncio.wait_for(getter, 1)


async def test_duplicates_collapse_and_order_is_kept() -> None:
    queue, _ = make()
    for key in ("a", "b", "a", "c", "b"):
        queue.add(key)
    assert len(queue) == 3
    assert [await queue.get() for _ in range(3)] == ["a", "b", "c"]


async def test_a_key_added_while_active_is_queued_again_after_done() -> None:
    queue, _ = make()
    assert queue.idle
    queue.add("a")
    assert not queue.idle
    assert await queue.get() == "a"
    queue.add("a")
    assert len(queue) == 0  # never handed out twice at once
    assert not queue.idle  # "a" is being reconciled
    queue.done("a")
    assert await queue.get() == "a"
    queue.done("a")
    queue.add_after("b", 5)
    assert queue.idle  # delayed keys wait on the clock


async def test_add_after_waits_for_clock_time() -> None:
    queue, clock = make()
    queue.add_after("a", 10)
    queue.add_after("a", 30)  # the earliest wins
    assert await handed_out_after(queue, clock, 10) == "a"


async def test_failures_back_off_exponentially_up_to_the_cap_until_forgotten() -> None:
    queue, _ = make()
    assert [queue.fail("a") for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert queue.failures("a") == 6
    queue.forget("a")
    assert queue.fail("a") == 1.0


def test_bad_delays_are_refused() -> None:
    with pytest.raises(ValueError, match="base_delay"):
        WorkQueue(ManualClock(datetime(2026, 1, 1, tzinfo=UTC)), base_delay=2.0, max_delay=1.0)


async def test_process_next_settles_each_outcome_as_client_gos_worker_does() -> None:
    queue, clock = make()
    errors: list[tuple[str, str, float]] = []

    def on_error(key: str, exc: Exception, backoff: float) -> None:
        errors.append((key, str(exc), backoff))

    async def fails(key: str) -> float | None:
        raise RuntimeError(f"{key} broke")

    async def again_in_5(key: str) -> float | None:
        return 5.0

    queue.add("a")
    await queue.process_next(fails, on_error=on_error)
    assert errors == [("a", "a broke", 1.0)] and queue.failures("a") == 1 and queue.idle  # back-off
    await clock.advance(1)
    await queue.process_next(again_in_5, on_error=on_error)  # success: forgotten, due again in 5 s
    assert queue.failures("a") == 0 and queue.idle
    assert await handed_out_after(queue, clock, 5) == "a"
    queue.done("a")

    queue.add("b")
    await queue.process_next(fails, on_error=on_error, admit=lambda: False)  # paused: back, untouched
    assert len(queue) == 1 and queue.failures("b") == 0 and len(errors) == 1

    started = asyncio.Event()

    async def hangs(key: str) -> float | None:
        started.set()
        await asyncio.Event().wait()
        return None

    worker = asyncio.create_task(queue.process_next(hangs, on_error=on_error), name="worker")
    await started.wait()
    worker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await worker
    assert len(queue) == 1 and not queue.active  # interrupted: queued again


async def test_a_success_without_a_delay_is_not_queued_again() -> None:
    queue, _ = make()

    async def done_for_now(key: str) -> float | None:
        return None

    queue.add("a")
    queue.fail("a")
    await queue.process_next(done_for_now, on_error=lambda key, exc, backoff: None)
    assert queue.idle and queue.failures("a") == 0 and len(queue) == 0


def test_warn_and_retry_logs_on_the_callers_logger_with_a_traceback_unless_quiet(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("tests.controller")
    on_error = warn_and_retry("rollout reconcile", quiet=KeyError, logger=logger)
    with caplog.at_level(logging.WARNING, logger="tests.controller"):
        for exc in (KeyError("gone"), RuntimeError("bug")):
            try:
                raise exc
            except Exception as raised:  # on_error runs inside the except block, as process_next calls it
                on_error("ns/job", raised, 2.0)
    quiet, loud = caplog.records
    assert quiet.name == loud.name == "tests.controller"
    assert quiet.getMessage() == "rollout reconcile failed; retrying"
    assert not quiet.exc_info and loud.exc_info and loud.exc_info[0] is RuntimeError
    assert (loud.__dict__["key"], loud.__dict__["error"], loud.__dict__["retry_seconds"]) == (
        "ns/job",
        "bug",
        2.0,
    )
