"""A list+watch reflector over any :class:`~flexlease.store.base.Store` (client-go's Reflector
and informer cache, kopf's ``watching.py``), used by the extender and the node agent.

:class:`Informer` lists a kind, hands the items to its handler as ADDED events, sets
:attr:`Informer.listed` (readiness), then watches from the list's resourceVersion. ``Gone``
→ list again, delivering only the difference (DELETED for objects that vanished, ADDED and
MODIFIED for the rest), so a consumer's state always equals a fresh list: nothing lost,
nothing doubled. Any other ``StoreError`` → watch again from the last resourceVersion after
a bounded exponential back-off with jitter (a failed list is retried the same way). BOOKMARKs
only advance the resourceVersion.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Final

from flexlease import tasks
from flexlease.errors import Gone, StoreError
from flexlease.logging import ctx
from flexlease.store.base import EVERYTHING, EventType, JsonObj, Kind, Selector, Store, WatchEvent

log = logging.getLogger(__name__)

Handler = Callable[[WatchEvent], Awaitable[None]]
"""Receives each ADDED/MODIFIED/DELETED event, one at a time, in order."""

ObjectKey = tuple[str, str]
"""(namespace, name); namespace ``""`` for cluster-scoped kinds."""

_STREAM_END: Final = object()


@dataclass(frozen=True, slots=True)
class Backoff:
    """Bounded exponential back-off with jitter: the n-th consecutive failure waits
    ``min(maximum, initial * factor**(n-1))`` seconds, times a random factor in
    ``[1 - jitter, 1 + jitter]``."""

    initial: float = 0.2
    maximum: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2

    def delay(self, failures: int, *, rng: random.Random | None = None) -> float:
        """Seconds to wait after ``failures`` (≥ 1) consecutive failures."""
        base = min(self.maximum, self.initial * self.factor ** max(0, failures - 1))
        spread = (rng or random).uniform(1.0 - self.jitter, 1.0 + self.jitter)
        return base * spread


def object_key(obj: JsonObj) -> ObjectKey:
    """``(namespace, name)`` of an object."""
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _uid(obj: JsonObj) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _rv(obj: JsonObj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class Informer:
    """List+watch of one kind (optionally one namespace and a selector) into ``handler``.

    In: a store, a kind, an async ``handler`` called for each ADDED/MODIFIED/DELETED event in
    store order (a DELETED carries the object's last known state; when a re-list finds an
    object gone it is the last state this informer saw). The informer keeps the objects it
    delivered (:meth:`get`, :meth:`items`) to compute re-list differences and to normalize
    events (an ADDED for a known object arrives as MODIFIED; a DELETED for an unknown one is
    dropped; an object re-created under the same name arrives as DELETED then ADDED).

    Run it with ``await informer.run()`` inside a TaskGroup or ``async with
    informer.running():`` (a task named :attr:`name`, cancelled and awaited on exit). It runs
    until cancelled; an exception from ``handler`` ends it with that exception.
    """

    def __init__(
        self,
        store: Store,
        kind: Kind,
        *,
        handler: Handler,
        namespace: str | None = None,
        selector: Selector = EVERYTHING,
        backoff: Backoff = Backoff(),
        name: str | None = None,
    ) -> None:
        self._store = store
        self._kind = kind
        self._handler = handler
        self._namespace = namespace
        self._selector = selector
        self._backoff = backoff
        self.name = name or _default_name(kind, namespace, selector)
        self._objects: dict[ObjectKey, JsonObj] = {}
        self._resource_version = ""
        self._listed = asyncio.Event()
        self._lists = 0
        self._progress = 0  # lists and events so far: a retry after progress is not a failure

    # -- what consumers read -----------------------------------------------------------

    @property
    def listed(self) -> asyncio.Event:
        """Set once the first list has been delivered to the handler (readiness)."""
        return self._listed

    @property
    def resource_version(self) -> str:
        """The last resourceVersion seen (list, event or BOOKMARK); ``""`` before the list."""
        return self._resource_version

    @property
    def lists(self) -> int:
        """How many lists were made (1 + re-lists after ``Gone``)."""
        return self._lists

    def get(self, name: str, *, namespace: str | None = None) -> JsonObj | None:
        """The last delivered state of one object, or None. Treat it as read-only."""
        return self._objects.get((namespace or "", name))

    def items(self) -> Iterator[JsonObj]:
        """Every object as last delivered. Treat them as read-only."""
        return iter(list(self._objects.values()))

    def entries(self) -> list[tuple[ObjectKey, JsonObj]]:
        """Every object as last delivered with its ``(namespace, name)`` key, in the order
        :meth:`items` has them. Treat the objects as read-only."""
        return list(self._objects.items())

    # -- running -----------------------------------------------------------------------

    async def run(self) -> None:
        """List, then watch, forever (see the class docstring). Cancel to stop.

        After a failure that followed progress (a list, an event) it retries at once;
        failures in a row without progress wait the ``backoff`` delays (1st, 2nd, ...)."""
        failures = 0
        need_list = True
        while True:
            mark = self._progress
            error: StoreError | None = None
            try:
                if need_list:
                    await self._list()
                    need_list = False
                await self._watch()  # returns when the stream ends (a server-side timeout)
            except Gone as exc:
                need_list = True
                error = exc
            except StoreError as exc:
                error = exc
            failures = 0 if self._progress != mark else failures + 1
            context = ctx(
                informer=self.name,
                resource_version=self._resource_version,
                failures=failures,
                error=None if error is None else str(error),
            )
            if isinstance(error, Gone):
                log.info("watch expired; listing again", extra=context)
            elif error is not None:
                log.warning("store call failed; retrying", extra=context)
            else:
                log.debug("watch ended; watching again", extra=context)
            if failures:
                await asyncio.sleep(self._backoff.delay(failures))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Informer]:
        """Run in a task named :attr:`name` for the duration of the block; on exit the task
        is cancelled and awaited. An exception from the task is raised at exit."""
        task = asyncio.create_task(self.run(), name=self.name)
        try:
            yield self
        finally:
            await tasks.stop(task)

    async def _list(self) -> None:
        listed = await self._store.list(self._kind, namespace=self._namespace, selector=self._selector)
        self._lists += 1
        fresh: dict[ObjectKey, JsonObj] = {object_key(obj): obj for obj in listed.items}
        for key, old in list(self._objects.items()):
            new = fresh.get(key)
            if new is None or _uid(new) != _uid(old):
                del self._objects[key]
                await self._handler(WatchEvent(EventType.DELETED, old))
        for key, obj in fresh.items():
            known = self._objects.get(key)
            self._objects[key] = obj
            if known is None:
                await self._handler(WatchEvent(EventType.ADDED, obj))
            elif _rv(known) != _rv(obj):
                await self._handler(WatchEvent(EventType.MODIFIED, obj))
        self._resource_version = listed.resource_version
        self._progress += 1
        if not self._listed.is_set():
            log.debug("listed", extra=ctx(informer=self.name, objects=len(fresh)))
            self._listed.set()

    async def _watch(self) -> None:
        """Watch until the stream ends."""
        watch = self._store.watch(
            self._kind,
            resource_version=self._resource_version,
            namespace=self._namespace,
            selector=self._selector,
        )
        try:
            async for event in watch:
                await self._deliver(event)
        finally:
            aclose = getattr(watch, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _deliver(self, event: WatchEvent) -> None:
        self._progress += 1
        if event.resource_version:
            self._resource_version = event.resource_version
        if event.type is EventType.BOOKMARK:
            return
        key = object_key(event.object)
        old = self._objects.get(key)
        if event.type is EventType.DELETED:
            if old is None:
                return
            del self._objects[key]
            await self._handler(event)
            return
        self._objects[key] = event.object
        if old is None:
            await self._handler(
                event if event.type is EventType.ADDED else WatchEvent(EventType.ADDED, event.object)
            )
        elif _uid(old) != _uid(event.object):
            await self._handler(WatchEvent(EventType.DELETED, old))
            await self._handler(WatchEvent(EventType.ADDED, event.object))
        else:
            await self._handler(
                event if event.type is EventType.MODIFIED else WatchEvent(EventType.MODIFIED, event.object)
            )

    # -- iterator form -----------------------------------------------------------------

    @classmethod
    @contextlib.asynccontextmanager
    async def stream(
        cls,
        store: Store,
        kind: Kind,
        *,
        namespace: str | None = None,
        selector: Selector = EVERYTHING,
        backoff: Backoff = Backoff(),
        name: str | None = None,
        max_pending: int = 1024,
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        """The informer as an async iterator of events, for the duration of the block::

            async with Informer.stream(store, Kind.POD) as events:
                async for event in events: ...

        At most ``max_pending`` events wait for the consumer (then the informer waits). The
        iterator raises what ends the informer's task; the task is cancelled on exit."""
        queue: asyncio.Queue[WatchEvent | object] = asyncio.Queue(maxsize=max_pending)
        informer = cls(
            store, kind, handler=queue.put, namespace=namespace, selector=selector, backoff=backoff, name=name
        )
        failure: list[BaseException] = []

        async def run() -> None:
            try:
                await informer.run()
            except Exception as exc:
                failure.append(exc)
                await queue.put(_STREAM_END)
                raise

        async def events() -> AsyncGenerator[WatchEvent, None]:
            while True:
                item = await queue.get()
                if item is _STREAM_END:
                    raise StoreError(f"informer {informer.name} stopped: {failure[0]}") from failure[0]
                assert isinstance(item, WatchEvent)
                yield item

        task = asyncio.create_task(run(), name=informer.name)
        iterator = events()
        try:
            yield iterator
        finally:
            await iterator.aclose()
            with contextlib.suppress(Exception):  # a failure reaches the consumer through the iterator
                await tasks.stop(task)


def _default_name(kind: Kind, namespace: str | None, selector: Selector) -> str:
    parts = [f"informer/{kind.value}"]
    if namespace:
        parts.append(f"ns={namespace}")
    parts.extend(f"{k}={v}" for k, v in {**selector.labels, **selector.fields}.items())
    return " ".join(parts)
