"""A rate-limited work queue of keys, as client-go's ``workqueue`` (used by kopf and Kruise).

Handlers only :meth:`WorkQueue.add` keys; a worker :meth:`WorkQueue.get`-s one, reconciles
it and calls :meth:`WorkQueue.done` (:meth:`WorkQueue.process_next` does all three, as
client-go's ``processNextWorkItem``). A key is queued at most once however often it is added
(duplicates collapse), and never handed to two workers at once: a key added while it is being
reconciled is queued again when that reconcile is done. Failures back off per key
exponentially (``base * 2**failures`` seconds, capped at ``maximum``) until :meth:`forget`.
Delays run on the injected :class:`flexlease.clock.Clock`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from flexlease.clock import Clock
from flexlease.logging import ctx

OnError = Callable[[str, Exception, float], None]
"""What :meth:`WorkQueue.process_next` calls on a failed reconcile: (key, error, back-off seconds)."""


def warn_and_retry(what: str, *, quiet: type[Exception], logger: logging.Logger) -> OnError:
    """An ``on_error`` that logs ``"<what> failed; retrying"`` at warning on ``logger`` (the
    controller's own, so its warnings keep their logger name) with the key, the error and the
    back-off, with the traceback unless the error is a ``quiet`` one (an expected failure such
    as a conflict or a store error)."""

    def on_error(key: str, exc: Exception, backoff: float) -> None:
        logger.warning(
            "%s failed; retrying",
            what,
            exc_info=not isinstance(exc, quiet),
            extra=ctx(key=key, error=str(exc), retry_seconds=backoff),
        )

    return on_error


class WorkQueue:
    """Keys waiting to be reconciled. One event loop; not thread-safe."""

    def __init__(self, clock: Clock, *, base_delay: float, max_delay: float) -> None:
        if base_delay <= 0 or max_delay < base_delay:
            raise ValueError("need 0 < base_delay <= max_delay")
        self._clock = clock
        self._base = base_delay
        self._max = max_delay
        self._ready: collections.deque[str] = collections.deque()
        self._queued: set[str] = set()
        self._active: set[str] = set()
        self._again: set[str] = set()
        self._delayed: dict[str, datetime] = {}
        self._failures: dict[str, int] = {}
        self._wake = asyncio.Event()

    def __len__(self) -> int:
        """Keys ready now (not counting delayed ones or those being reconciled)."""
        return len(self._ready)

    @property
    def active(self) -> int:
        """Keys being reconciled now."""
        return len(self._active)

    @property
    def idle(self) -> bool:
        """No key is ready or being reconciled (delayed keys may still be waiting)."""
        return not self._ready and not self._active

    def add(self, key: str) -> None:
        """Queue ``key`` now (no-op when already queued)."""
        if key in self._active:
            self._again.add(key)
            return
        if key not in self._queued:
            self._queued.add(key)
            self._ready.append(key)
            self._wake.set()

    def add_after(self, key: str, seconds: float) -> None:
        """Queue ``key`` once ``seconds`` of clock time have passed (the earliest wins)."""
        if seconds <= 0:
            self.add(key)
            return
        due = self._clock.now_utc() + timedelta(seconds=seconds)
        if key not in self._delayed or due < self._delayed[key]:
            self._delayed[key] = due
            self._wake.set()

    def fail(self, key: str) -> float:
        """Queue ``key`` again after its back-off; returns the delay in seconds."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = min(self._max, self._base * 2.0**failures)
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        """Reset ``key``'s back-off (after a successful reconcile)."""
        self._failures.pop(key, None)

    def failures(self, key: str) -> int:
        """Consecutive failures of ``key`` since the last :meth:`forget`."""
        return self._failures.get(key, 0)

    async def get(self) -> str:
        """The next ready key, waiting for one as long as needed. The key is *active* until
        :meth:`done`."""
        while True:
            self._promote()
            if self._ready:
                key = self._ready.popleft()
                self._queued.discard(key)
                self._active.add(key)
                return key
            self._wake.clear()
            timeout = None
            if self._delayed:
                timeout = (min(self._delayed.values()) - self._clock.now_utc()).total_seconds()
            await self._clock.wait(self._wake, timeout)

    def done(self, key: str) -> None:
        """The reconcile of ``key`` finished; queue it again when it was added meanwhile."""
        self._active.discard(key)
        if key in self._again:
            self._again.discard(key)
            self.add(key)

    async def process_next(
        self,
        reconcile: Callable[[str], Awaitable[float | None]],
        *,
        on_error: OnError,
        admit: Callable[[], bool] | None = None,
    ) -> None:
        """Wait for the next key and reconcile it, as client-go's ``processNextWorkItem``:
        success forgets its back-off (and a returned delay, in seconds, queues it again
        after that long); a failure queues it again after its back-off and calls
        ``on_error(key, error, back-off seconds)``; cancellation (shutdown, lost leadership)
        queues it again and propagates. ``admit``: checked once the key is taken; when
        false the key goes back unreconciled (a worker paused while it waited)."""
        key = await self.get()
        if admit is not None and not admit():
            self.add(key)  # still active: queued again by done()
            self.done(key)
            return
        try:
            delay = await reconcile(key)
        except asyncio.CancelledError:
            self.add(key)  # interrupted: do it again next time
            raise
        except Exception as exc:
            on_error(key, exc, self.fail(key))
        else:
            self.forget(key)
            if delay is not None:
                self.add_after(key, delay)
        finally:
            self.done(key)

    def _promote(self) -> None:
        now = self._clock.now_utc()
        for key, due in list(self._delayed.items()):
            if due <= now:
                del self._delayed[key]
                self.add(key)
