"""Single-flight: concurrent requests for one key share one execution (Go's
``golang.org/x/sync/singleflight``), so N pods asking for one checkpoint cause one download.

The first caller (the leader) runs the work in its own task; followers wait on a future. If
the leader is cancelled, followers do not inherit the cancellation: one of them becomes the
next leader and runs the work again. No tasks are created.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _LeaderCancelled(Exception):
    """The leader was cancelled before finishing; a follower retries as the new leader."""


class SingleFlight(Generic[K, V]):
    """``await flight.do(key, work)`` → ``(value, shared)``; ``shared`` is True for followers.

    ``work`` is a zero-argument coroutine function. Its exception is raised in the leader and
    in every follower that waited for it.
    """

    def __init__(self) -> None:
        self._inflight: dict[K, asyncio.Future[V]] = {}

    def in_flight(self, key: K) -> bool:
        return key in self._inflight

    async def do(self, key: K, work: Callable[[], Awaitable[V]]) -> tuple[V, bool]:
        while (pending := self._inflight.get(key)) is not None:
            try:
                return await asyncio.shield(pending), True
            except _LeaderCancelled:
                continue
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            value = await work()
        except asyncio.CancelledError:
            _fail(future, _LeaderCancelled())
            raise
        except BaseException as exc:
            _fail(future, exc)
            raise
        else:
            future.set_result(value)
            return value, False
        finally:
            del self._inflight[key]


def _fail(future: asyncio.Future[V], exc: BaseException) -> None:
    future.set_exception(exc)
    future.exception()  # mark it retrieved: no "never retrieved" log when nobody followed
