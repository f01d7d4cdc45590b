"""What the embedded stores' watches share: the iterator's bookkeeping (pending events, wake-up,
stop, bookmark timing) and closing. Each store supplies ``__anext__`` (MemoryStore scans its
in-process history; SqliteStore polls the revision log)."""

from __future__ import annotations

import asyncio
import collections
import time
import weakref
from collections.abc import Iterator
from typing import Any, Generic, Self, TypeVar

from flexlease.store.base import Kind, Selector, WatchEvent

W = TypeVar("W")


class WatchRegistry(Generic[W]):
    """A store's live watches of one kind, held by weak reference (a watch dropped without
    ``aclose`` leaves by itself). Iterating gives the live ones at that moment; cheaper than
    ``weakref.WeakSet``, which guards every item (a store iterates these on every write)."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[W]] = {}

    def add(self, watch: W) -> None:
        key = id(watch)

        def gone(ref: weakref.ref[W]) -> None:
            if self._refs.get(key) is ref:
                del self._refs[key]

        self._refs[key] = weakref.ref(watch, gone)

    def discard(self, watch: W) -> None:
        ref = self._refs.get(id(watch))
        if ref is not None and ref() is watch:
            del self._refs[id(watch)]

    def __iter__(self) -> Iterator[W]:
        return iter([w for ref in tuple(self._refs.values()) if (w := ref()) is not None])

    def __len__(self) -> int:
        return sum(1 for ref in self._refs.values() if ref() is not None)


class EmbeddedWatch:
    """Base of one watch on an embedded store (an async iterator over :class:`WatchEvent`).

    ``last``: the resourceVersion (revision) delivered up to; None until a watch "from now"
    took its snapshot. ``pending``: events ready to yield. ``skipped``: changes were passed
    over since the last yield (a BOOKMARK is then due after the store's bookmark interval,
    counted from ``yielded_at``, monotonic seconds)."""

    def __init__(
        self,
        kind: Kind,
        *,
        start: int | None,
        namespace: str | None,
        selector: Selector,
        store_closed: bool,
        registry: WatchRegistry[Any],
    ) -> None:
        """``registry``: the store's live watches of ``kind`` (woken on its writes); the
        watch is in it from now until :meth:`aclose`."""
        self._registry = registry
        registry.add(self)
        self._kind = kind
        self._last = start
        self._namespace = namespace
        self._selector = selector
        self._pending: collections.deque[WatchEvent] = collections.deque()
        self._wakeup = asyncio.Event()
        self._stopped = False
        self._refused = store_closed
        self._skipped = False
        self._yielded_at = time.monotonic()

    def caught_up(self, revision: int) -> bool:
        """True when this watch has nothing left to yield up to ``revision`` (the store's
        last write of this watch's kind), or has stopped."""
        if self._stopped:
            return True
        return not self._pending and self._last is not None and self._last >= revision

    def wake(self) -> None:
        """A write happened in this process: look again now."""
        self._wakeup.set()

    def __aiter__(self) -> Self:
        return self

    async def aclose(self) -> None:
        """Stop this watch (later ``__anext__`` calls end the iteration)."""
        self._stopped = True
        self._registry.discard(self)
        self._wakeup.set()
