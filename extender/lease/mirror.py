"""The lease controller's read cache of one kind: a store :class:`~flexlease.store.informer.Informer`
plus the controller's own writes.

The informer (list + watch, re-list on ``Gone``, back-off on errors) delivers every change;
the mirror reports each to ``on_change`` so the controller can enqueue keys, and decides
nothing. :meth:`Mirror.put` writes the controller's own results through until the watch
catches up (a newer resourceVersion wins; stores guarantee increasing integers), so the next
reconcile does not plan from a state older than what it just wrote.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from flexlease.store.base import EventType, JsonObj, Kind, Store, WatchEvent
from flexlease.store.informer import Informer, object_key


def _version(obj: JsonObj | None) -> int:
    if obj is None:
        return -1
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


class Mirror:
    """The objects of one ``kind`` as the store's watch and the controller's writes left them."""

    def __init__(self, store: Store, kind: Kind, *, on_change: Callable[[EventType, JsonObj], None]) -> None:
        self.kind = kind
        self._on_change = on_change
        self._informer = Informer(store, kind, handler=self._deliver, name=f"lease-informer-{kind.value}")
        self._written: dict[tuple[str, str], JsonObj] = {}
        self._changed: set[tuple[str, str]] = set()
        self._generation = 0

    @property
    def generation(self) -> int:
        """A number that grows with every change this mirror delivers or is told of
        (:meth:`put`): what :meth:`values` returns can differ only after it moved, so a
        caller may keep something derived from :meth:`values` until then."""
        return self._generation

    @property
    def listed(self) -> asyncio.Event:
        """Set once the first list has been mirrored."""
        return self._informer.listed

    async def run(self) -> None:
        """List and watch until cancelled (the informer retries store errors itself)."""
        await self._informer.run()

    def get(self, namespace: str | None, name: str) -> JsonObj | None:
        """The newest known state of one object, or None. Treat it as read-only."""
        seen = self._informer.get(name, namespace=namespace)
        written = self._written.get((namespace or "", name))
        return written if written is not None and _version(written) > _version(seen) else seen

    def current(self, namespace: str | None, name: str) -> JsonObj | None:
        """One object as :meth:`values` has it: None until the watch has delivered it (or
        once it delivered its deletion), else the newer of that and the controller's own
        write. Treat it as read-only."""
        seen = self._informer.get(name, namespace=namespace)
        if seen is None:
            return None
        written = self._written.get((namespace or "", name))
        return written if written is not None and _version(written) > _version(seen) else seen

    def take_changed(self) -> set[tuple[str, str]]:
        """Keys ``(namespace or "", name)`` of the objects delivered or written since the last
        call (their :meth:`current` state may differ from what the caller last read)."""
        changed, self._changed = self._changed, set()
        return changed

    def values(self) -> list[JsonObj]:
        """The newest known state of every object (in the informer's order), as
        :meth:`current` has each. Treat them as read-only."""
        written = self._written
        if not written:  # the usual case: the watch has caught up with every write
            return list(self._informer.items())
        out: list[JsonObj] = []
        for key, seen in self._informer.entries():
            mine = written.get(key)
            out.append(mine if mine is not None and _version(mine) > _version(seen) else seen)
        return out

    def put(self, obj: JsonObj) -> None:
        """Remember ``obj`` (returned by one of the controller's writes) until the watch
        delivers it or something newer."""
        key = object_key(obj)
        if _version(obj) > max(
            _version(self._written.get(key)), _version(self._informer.get(key[1], namespace=key[0]))
        ):
            self._written[key] = obj
            self._changed.add(key)
            self._generation += 1

    async def _deliver(self, event: WatchEvent) -> None:
        key = object_key(event.object)
        written = self._written.get(key)
        if written is not None and (
            event.type is EventType.DELETED or _version(event.object) >= _version(written)
        ):
            del self._written[key]
        self._changed.add(key)
        self._generation += 1
        self._on_change(event.type, event.object)
