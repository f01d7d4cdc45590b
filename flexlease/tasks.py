"""Stopping background tasks: the one way every package stops an asyncio task it owns
(house rule 7: every task is named and owned, so every task is also stopped by its owner).

The pattern it replaces, ``task.cancel()`` then ``await task`` under
``contextlib.suppress(asyncio.CancelledError)``, cannot tell the task's ``CancelledError``
(the cancel just sent) from the caller's own: when the coroutine doing the stopping is
cancelled while it waits, ``await task`` raises ``CancelledError`` and the ``suppress``
swallows it, so the caller runs on as if nobody had cancelled it (a TaskGroup or
``asyncio.timeout`` above it then waits for a task that never ends).

:func:`stop` waits through :func:`asyncio.gather` with ``return_exceptions=True``, which
hands each task's ``CancelledError`` back as a value and raises ``CancelledError`` only
when the gather itself, that is the caller, is cancelled ("If gather() itself is
cancelled, the cancellation is propagated regardless of return_exceptions", asyncio
docs, Running Tasks Concurrently). Counting :meth:`asyncio.Task.cancelling` instead
would misjudge the common call from a ``finally`` block of a caller already being
cancelled: its count is above zero before :func:`stop` starts, and the rest of the
clean-up must still run.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from flexlease.logging import ctx

log = logging.getLogger(__name__)


async def stop(*tasks: asyncio.Task[Any]) -> None:
    """Cancel ``tasks`` and wait until every one of them has finished.

    In: the tasks to stop, in any state (a task already done is only collected). Out:
    ``None`` once all have finished; a task that returned (before the cancel, or by
    catching it) counts as stopped.

    Raises:
        asyncio.CancelledError: the calling task was cancelled while it waited; the
            cancel is passed on to the tasks (as ``await task`` would), and this is raised
            only once all of them have finished. An exception a task ended with is then
            logged, not raised.
        BaseException: otherwise, the exception the first task (in argument order) ended
            with, other than ``CancelledError``: an error never vanishes with a stop.
            Later tasks' exceptions are logged (one exception can be raised). A caller
            that must not fail on a task's error wraps the call in
            ``contextlib.suppress(Exception)``, which leaves ``CancelledError`` alone.

    A task that catches its ``CancelledError`` and keeps running keeps this waiting.
    """
    for task in tasks:
        task.cancel()
    try:
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    except asyncio.CancelledError:
        for task in tasks:
            if task.done() and not task.cancelled() and (error := task.exception()) is not None:
                _log_error(task, error)
        raise
    errors = [
        (task, outcome)
        for task, outcome in zip(tasks, outcomes, strict=True)
        if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError)
    ]
    for task, error in errors[1:]:
        _log_error(task, error)
    if errors:
        raise errors[0][1]


def _log_error(task: asyncio.Task[Any], error: BaseException) -> None:
    log.error(
        "stopped task %s had failed",
        task.get_name(),
        exc_info=error,
        extra=ctx(task=task.get_name()),
    )
