"""Stopping an owned asyncio task without swallowing the caller's own cancellation.

The usual ``task.cancel(); with suppress(CancelledError): await task`` has a flaw: when
the *awaiting* task is itself cancelled while it waits, its ``CancelledError`` is the one
suppressed, so a shutdown (aiohttp's cleanup contexts, a watch's ``running()`` block) goes
on as if nothing had happened. :func:`cancel_and_wait` tells the two apart with
:meth:`asyncio.Task.cancelling` (Python 3.11+).
"""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait until it has finished.

    In: a task (or future) this code owns. Its own ``CancelledError`` is swallowed; any other
    exception it ends with propagates. Raises ``CancelledError`` when the *calling* task is
    cancelled meanwhile (its cancel request is counted by :meth:`asyncio.Task.cancelling`),
    so the caller's cancellation is never lost."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
