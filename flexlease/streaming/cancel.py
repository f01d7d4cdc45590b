"""Cancellation that survives nats-py.

nats-py swallows a ``CancelledError`` that lands while it flushes its write buffer
(``except asyncio.CancelledError: pass`` in ``Client._flush_pending``, which ``publish``,
``subscribe``, ``unsubscribe`` and ``flush`` reach, and in ``Client.drain``). The task's
cancel request is then still counted (:meth:`asyncio.Task.cancelling`) but no
``CancelledError`` is delivered again, so a loop of broker calls keeps running after its
cancel — a reader polling an empty stream, a staging watch — until something else ends it.
Such loops call :func:`raise_if_cancelling` after their broker calls.
"""

from __future__ import annotations

import asyncio


def raise_if_cancelling() -> None:
    """Raise ``CancelledError`` when the current task has a pending cancel request
    (:meth:`asyncio.Task.cancelling` > 0); no-op outside a task."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
