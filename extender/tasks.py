"""Owned background tasks for aiohttp cleanup contexts (house rule 7: every task is named and
owned). Used by the watch loops (:mod:`extender.server`), the leader election
(:mod:`extender.main`) and the lease controller (:mod:`extender.lease.controller`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from flexlease.logging import ctx
from flexlease.tasks import stop

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def running(coro: Coroutine[Any, Any, None], *, name: str) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``coro`` as the task ``name`` for the ``async with`` body; on exit stop it
    (:func:`flexlease.tasks.stop`: cancel it and wait for it to finish; its error, if any,
    propagates, and so does a cancel of the task leaving the block while it waits).
    A task that ends on its own before that is logged at once (critical for an exception),
    like kopf's guarded tasks: background work must never vanish silently."""
    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(_report_exit)
    try:
        yield task
    finally:
        task.remove_done_callback(_report_exit)
        await stop(task)


def _report_exit(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.critical(
            "background task %s failed", task.get_name(), exc_info=exc, extra=ctx(task=task.get_name())
        )
    else:
        log.error("background task %s ended unexpectedly", task.get_name(), extra=ctx(task=task.get_name()))
