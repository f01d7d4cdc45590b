"""A small work queue of object keys (client-go's ``workqueue`` semantics), so reconciles are
level-triggered and one key is never reconciled by two workers at once.

``add`` a key (duplicates collapse); workers ``await get()`` a key, reconcile it and call
``done``. A key added while it is being reconciled is handed out again after ``done``.
``add_after`` schedules an add with a timer (retries with back-off); ``close`` cancels the
timers. No tasks are created.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        self._dirty: set[K] = set()
        self._timers: set[asyncio.TimerHandle] = set()
        self._closed = False

    def __len__(self) -> int:
        return self._queue.qsize()

    def add(self, key: K) -> None:
        """Queue ``key`` unless it is queued already; if a worker holds it, queue it again
        once that worker calls :meth:`done`."""
        if self._closed:
            return
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._queue.put_nowait(key)

    def add_after(self, key: K, delay_seconds: float) -> None:
        """:meth:`add` ``key`` after ``delay_seconds`` seconds."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle

        def fire() -> None:
            self._timers.discard(handle)
            self.add(key)

        handle = loop.call_later(delay_seconds, fire)
        self._timers.add(handle)

    async def get(self) -> K:
        """Wait for a key and hand it to the caller, who must call :meth:`done` with it."""
        key = await self._queue.get()
        self._queued.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def close(self) -> None:
        """Cancel pending timers; later adds are ignored."""
        self._closed = True
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()
