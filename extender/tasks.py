"""Owned background tasks for aiohttp cleanup contexts (house rule 7: every task is named and
owned). Used by the watch loops (:mod:`extender.server`), the leader election
(:mod:`extender.main`) and the lease controller (:mod:`extender.lease.controller`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any


@contextlib.asynccontextmanager
async def running(coro: Coroutine[Any, Any, None], *, name: str) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``coro`` as the task ``name`` for the ``async with`` body; on exit cancel it and
    wait for it to finish (its ``CancelledError`` is swallowed, any other error propagates)."""
    task = asyncio.create_task(coro, name=name)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
