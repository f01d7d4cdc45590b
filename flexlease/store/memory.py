"""``MemoryStore``: the whole store in one process's memory, for unit tests and the simulator."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from flexlease.clock import Clock, format_time
from flexlease.errors import Conflict, Gone, NotFound, StoreError
from flexlease.store import semantics
from flexlease.store.base import (
    EVERYTHING,
    EventType,
    JsonObj,
    Kind,
    ObjectList,
    Selector,
    WatchEvent,
)
from flexlease.store.watching import EmbeddedWatch, WatchRegistry

DEFAULT_HISTORY_REVISIONS: Final = 10_000
DEFAULT_BOOKMARK_SECONDS: Final = 1.0

SHARED_EVENT_OBJECTS: Final = 32
"""How many changes' decoded objects a :class:`MemoryStore` keeps for the watches that have
not delivered them yet (a watch further behind decodes its own). Watches that keep up take
each change within a few writes; the kept objects are young trees of dicts for the garbage
collector of the process under test (256 made the extender benchmark's longest collection
7.5 ms where 32 makes it 5.3, and its GC CPU a half larger: docs/results/benchmarks.md, round 9)."""

_Entry = tuple[JsonObj, str]
"""A stored object, decoded afresh from its JSON text, and that text. The store keeps only
the text (:attr:`MemoryStore._objects`); callers get their own decoded copy."""


@dataclass(frozen=True, slots=True)
class _Change:
    """One revision: ``text`` the state after (DELETED: the last state, carrying the
    deletion's resourceVersion), ``prev_text`` the state before a MODIFIED. Text only, no
    dicts: the history holds thousands of changes, which the garbage collector would
    otherwise traverse as millions of objects; a watch with a selector decodes what it
    matches (:meth:`_MemoryWatch._scan`)."""

    revision: int
    kind: Kind
    namespace: str
    type: EventType
    text: str
    prev_text: str | None


class MemoryStore:
    """An in-process :class:`~flexlease.store.base.Store` with the API server's semantics.

    Semantics (shared with ``SqliteStore`` through :mod:`flexlease.store.semantics`, checked
    by ``tests/store/contract.py``):

    * one revision counter for the whole store, as etcd's: a fresh store is at 1, every
      write (create, effective patch, delete, bind; evict writes two: the PDB, then the pod's
      deletion) takes the next integer, which becomes the object's ``resourceVersion``. A
      patch that changes nothing writes nothing and returns the object as it is;
    * ``list`` is a consistent snapshot at the store's current revision;
    * ``watch`` yields every change strictly after ``resource_version`` in revision order,
      exactly once, from a bounded history of the last ``history_revisions`` revisions;
      older → ``Gone`` (also raised mid-watch when a consumer falls that far behind). As
      the API server's watch cache, which keeps each resource's own history, a watch falls
      behind only by changes of its kind: one whose kind had no change among the dropped
      revisions goes on from the oldest kept one (an idle GPULease watch outlives a burst
      of Pod writes).
      ``"0"`` or ``""`` mean "from now": the current objects as ADDED, then changes. A
      selector transition arrives as ADDED (starts matching) or DELETED (stops matching;
      the previous state with the change's resourceVersion). When filtered-out changes
      were skipped and nothing was yielded for ``bookmark_seconds``, a BOOKMARK carries
      the revision reached;
    * create drops ``status`` of Pods, GPUNodes and GPULeases (Pods start ``Pending``);
      ``patch`` is a JSON merge patch with the ``status`` subresource and resourceVersion
      preconditions (``Conflict``); ``bind`` sets ``spec.nodeName`` and ``PodScheduled``;
      ``evict`` honours one PodDisruptionBudget per pod (``TooManyRequests`` at 0 allowed
      disruptions, else it spends one), then deletes the pod as ``delete`` does;
    * a bound Pod is deleted gracefully (:func:`semantics.delete_pod`): it stays Terminating
      with ``deletionTimestamp`` until a delete with grace period 0 confirms it (the
      kubelet's part; :mod:`flexlease.store.graceful` has the helpers);
    * every object handed out by a verb is a private copy; objects passed in are copied on
      write. A watch event's object is decoded once per change and shared by every watch that
      delivers that change (the last :data:`SHARED_EVENT_OBJECTS` changes are kept decoded):
      consumers treat it as read-only, as an informer's cache must be treated.
      ``check_shared=True`` verifies, each time a decoded change is handed out again, that
      no earlier consumer changed it (``StoreError`` otherwise; for tests).

    Limits: one event loop (not thread-safe; every method runs without awaiting, so each
    verb is atomic); nothing persists. Costs: a write is O(object size) plus one wake-up per
    watch of that kind; a list is O(objects of the kind); each watch checks every change of
    its kind against its selector. History holds ``history_revisions`` changes (about twice
    the JSON size of each). After :meth:`close` every running watch ends and every verb
    raises ``StoreError``.
    """

    def __init__(
        self,
        *,
        history_revisions: int = DEFAULT_HISTORY_REVISIONS,
        bookmark_seconds: float = DEFAULT_BOOKMARK_SECONDS,
        clock: Clock | None = None,
        uids: Callable[[], str] | None = None,
        check_shared: bool = False,
    ) -> None:
        """``clock``: where ``creationTimestamp`` comes from (default: the system clock).
        ``uids``: makes each new object's ``metadata.uid`` (default: random UUIDs); a
        simulation passes both so that a run is reproducible. ``check_shared``: verify that
        watch consumers leave the shared event objects unchanged (see the class docstring)."""
        if history_revisions < 1:
            raise ValueError("history_revisions must be at least 1")
        self._history_revisions = history_revisions
        self._bookmark_seconds = bookmark_seconds
        self._objects: dict[Kind, dict[semantics.ObjectKey, str]] = {k: {} for k in Kind}
        """Each object's JSON text, as the API server's storage keeps bytes: a verb decodes the
        objects it needs. No dicts: the store runs inside the process under test (the
        extender's benchmark), whose garbage collector would otherwise traverse a fresh tree
        of dicts and lists for every write (docs/results/benchmarks.md, round 9)."""
        self._revision = semantics.FIRST_REVISION
        self._compacted = semantics.FIRST_REVISION
        """Watches may start from any revision ≥ this; ``_history[i]`` is revision compacted+1+i."""
        self._history: list[_Change] = []
        self._dropped: dict[Kind, int] = {}
        """The revision of each kind's newest change dropped from the history."""
        self._watches: dict[Kind, WatchRegistry[_MemoryWatch]] = {k: WatchRegistry() for k in Kind}
        self._closed = False
        self._clock = clock
        self._uids = uids
        self._kind_revision: dict[Kind, int] = {}
        """The revision of each kind's last write (for :attr:`idle`)."""
        self._watches_opened = 0
        self._idle_at: tuple[int, int] | None = None
        """(revision, watches opened) when :attr:`idle` last found every watch caught up."""
        self._decoded: dict[int, JsonObj] = {}
        """Revision → the change's object as watches deliver it (the newest few, oldest first)."""
        self._check_shared = check_shared

    @property
    def idle(self) -> bool:
        """True when every open watch has yielded every change of its kind: nothing is in
        flight from this store to its consumers (a simulation's quiescence check, asked at
        every turn of its event loop). A watch falls behind only by a write or by being
        opened, so once every watch was caught up the answer stays True until one of those
        happens."""
        mark = (self._revision, self._watches_opened)
        if self._idle_at == mark:
            return True
        for kind, watches in self._watches.items():
            last = self._kind_revision.get(kind, 0)
            if not all(w.caught_up(last) for w in watches):
                return False
        self._idle_at = mark
        return True

    # -- reads ---------------------------------------------------------------------------

    @property
    def revision(self) -> int:
        """The store's current revision (the last write's)."""
        return self._revision

    async def list(
        self, kind: Kind, *, namespace: str | None = None, selector: Selector = EVERYTHING
    ) -> ObjectList:
        """Objects of ``kind`` (in ``namespace``, or all) matching ``selector``, and the
        store's revision as the list's resourceVersion. Raises ``StoreError`` when closed."""
        self._check_open()
        return ObjectList(
            items=list(self._select(kind, namespace, selector)),
            resource_version=str(self._revision),
        )

    def _select(self, kind: Kind, namespace: str | None, selector: Selector) -> Iterator[JsonObj]:
        """The objects of ``kind`` in ``namespace`` (None: all) that ``selector`` matches, each
        decoded afresh."""
        ns = semantics.namespace_filter(kind, namespace)
        everything = not selector.labels and not selector.fields
        for (obj_ns, _), text in self._objects[kind].items():
            if ns is None or obj_ns == ns:
                obj = semantics.decode(text)
                if everything or selector.matches(obj):
                    yield obj

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> JsonObj:
        """One object (a copy). Raises ``NotFound``; ``StoreError`` (400) without a
        namespace for a namespaced kind."""
        self._check_open()
        return semantics.decode(self._text(kind, semantics.object_key(kind, name, namespace)))

    def _entry(self, kind: Kind, key: semantics.ObjectKey) -> _Entry:
        """The object at ``key``, decoded, and its text. Raises ``NotFound``."""
        text = self._text(kind, key)
        return semantics.decode(text), text

    def _text(self, kind: Kind, key: semantics.ObjectKey) -> str:
        try:
            return self._objects[kind][key]
        except KeyError:
            where = f"{key[0]}/{key[1]}" if key[0] else key[1]
            raise NotFound(f"{kind} {where} not found") from None

    def watch(
        self,
        kind: Kind,
        *,
        resource_version: str,
        namespace: str | None = None,
        selector: Selector = EVERYTHING,
    ) -> AsyncIterator[WatchEvent]:
        """Changes to ``kind`` strictly after ``resource_version`` (see the class docstring).
        Raises ``Gone`` at the first ``__anext__`` (or later, when the consumer falls
        behind the history), ``StoreError`` (400) on a malformed version. The iterator
        also has ``aclose()``; it ends when the store closes."""
        start = None if resource_version in ("", "0") else semantics.parse_revision(resource_version)
        self._watches_opened += 1
        watch = _MemoryWatch(
            self,
            kind,
            start=start,
            namespace=semantics.namespace_filter(kind, namespace),
            selector=selector,
        )
        return watch

    # -- writes --------------------------------------------------------------------------

    async def create(self, kind: Kind, obj: JsonObj) -> JsonObj:
        """Create (see :func:`semantics.prepare_create`). Returns the stored object (a copy).
        Raises ``Conflict`` when the name exists, ``StoreError`` (400) on an invalid object."""
        self._check_open()
        key, new = semantics.prepare_create(
            kind,
            obj,
            uid=self._uids() if self._uids is not None else None,
            created=format_time(self._clock.now_utc()) if self._clock is not None else None,
        )
        if key in self._objects[kind]:
            where = f"{key[0]}/{key[1]}" if key[0] else key[1]
            raise Conflict(f"{kind} {where} already exists")
        return self._write(kind, key, change=EventType.ADDED, obj=new, prev=None)

    async def patch(
        self,
        kind: Kind,
        name: str,
        patch: JsonObj,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        resource_version: str | None = None,
    ) -> JsonObj:
        """JSON merge patch (see :func:`semantics.apply_patch`). Returns the object after
        it (a copy). Raises ``NotFound``, ``Conflict`` (precondition), ``StoreError`` (400)."""
        self._check_open()
        key = semantics.object_key(kind, name, namespace)
        current, text = self._entry(kind, key)
        if not isinstance(patch, dict):
            raise semantics.bad_request(f"{kind} {name}: a merge patch must be a JSON object")
        semantics.check_precondition(current, patch, resource_version=resource_version)
        new = semantics.apply_patch(kind, current, patch, subresource=subresource)
        if new == current:
            return current  # decoded for this call (_entry), and left unchanged by the patch
        return self._write(kind, key, change=EventType.MODIFIED, obj=new, prev=(current, text))

    async def delete(
        self, kind: Kind, name: str, *, namespace: str | None = None, grace_period_seconds: int | None = None
    ) -> None:
        """Delete; a bound Pod gracefully (see :func:`semantics.delete_pod`), other kinds at
        once (no finalizers). Raises ``NotFound``."""
        self._check_open()
        key = semantics.object_key(kind, name, namespace)
        self._delete(kind, key, self._entry(kind, key), grace_period_seconds)

    def _delete(
        self,
        kind: Kind,
        key: semantics.ObjectKey,
        entry: tuple[JsonObj, str],
        grace_period_seconds: int | None,
    ) -> None:
        current = entry[0]
        if kind is Kind.POD:
            kept = semantics.delete_pod(current, grace_period_seconds=grace_period_seconds)
            if kept is current:
                return
            if kept is not None:
                self._write(kind, key, change=EventType.MODIFIED, obj=kept, prev=entry)
                return
        self._write(kind, key, change=EventType.DELETED, obj=current, prev=entry)

    async def bind(
        self,
        namespace: str,
        name: str,
        *,
        uid: str | None,
        node: str,
        annotations: Mapping[str, str] | None = None,
        resource_version: str | None = None,
    ) -> None:
        """The pod's Binding (see :func:`semantics.apply_bind`). Raises ``NotFound``,
        ``Conflict`` (already bound, uid or resourceVersion mismatch)."""
        self._check_open()
        key = semantics.object_key(Kind.POD, name, namespace)
        current, text = self._entry(Kind.POD, key)
        new = semantics.apply_bind(
            current, uid=uid, node=node, annotations=annotations, resource_version=resource_version
        )
        self._write(Kind.POD, key, change=EventType.MODIFIED, obj=new, prev=(current, text))

    async def evict(self, namespace: str, name: str, *, grace_period_seconds: int | None = None) -> None:
        """Eviction API (see :func:`semantics.eviction_budget`), then graceful deletion of the pod.
        Raises ``NotFound``, ``TooManyRequests`` (budget exhausted), ``StoreError`` (500:
        several budgets select the pod)."""
        self._check_open()
        key = semantics.object_key(Kind.POD, name, namespace)
        pod_entry = self._entry(Kind.POD, key)
        pdbs = self._select(Kind.PDB, key[0], EVERYTHING)
        pdb = semantics.eviction_budget(pod_entry[0], pdbs)
        if pdb is not None:
            pdb_key = (key[0], pdb["metadata"]["name"])
            pdb_entry = self._entry(Kind.PDB, pdb_key)
            self._write(
                Kind.PDB,
                pdb_key,
                change=EventType.MODIFIED,
                obj=semantics.spend_budget(pdb, name),
                prev=pdb_entry,
            )
        pod_entry = self._entry(Kind.POD, key)
        self._delete(Kind.POD, key, pod_entry, grace_period_seconds)

    def _write(
        self,
        kind: Kind,
        key: semantics.ObjectKey,
        *,
        change: EventType,
        obj: JsonObj,
        prev: _Entry | None,
    ) -> JsonObj:
        """Commit one revision: ``obj`` (the new state; for DELETED the last one) gets the
        next resourceVersion. Validates (encodes) before touching any state. Returns the
        stored state, decoded from its text: a private copy for the verb's reply (create and
        patch; delete, bind and evict reply with none)."""
        revision = self._revision + 1
        text, stored = semantics.encode_copy(kind, semantics.stamp(obj, revision))  # validated
        self._revision = revision
        self._kind_revision[kind] = revision
        if change is EventType.DELETED:
            del self._objects[kind][key]
        else:
            self._objects[kind][key] = text
        self._history.append(
            _Change(
                revision=revision,
                kind=kind,
                namespace=key[0],
                type=change,
                text=text,
                prev_text=prev[1] if prev is not None and change is EventType.MODIFIED else None,
            )
        )
        excess = len(self._history) - self._history_revisions
        if excess > max(64, self._history_revisions // 8):
            self._drop_history(excess)
        for watch in self._watches[kind]:
            watch.wake()
        return stored

    def _drop_history(self, count: int) -> None:
        for change in self._history[:count]:
            self._dropped[change.kind] = change.revision
        del self._history[:count]
        self._compacted += count

    async def compact(self, keep: int = 0) -> int:
        """Drop history older than the last ``keep`` revisions (0: all of it), as etcd's
        compaction does; watches from before that raise ``Gone``. Returns the compacted
        revision (the oldest one a watch may start from)."""
        self._check_open()
        self._drop_history(max(0, len(self._history) - keep))
        for watches in self._watches.values():
            for watch in watches:
                watch.wake()
        return self._compacted

    async def close(self) -> None:
        """End every running watch; later calls raise ``StoreError``. Idempotent."""
        self._closed = True
        for watches in self._watches.values():
            for watch in watches:
                watch.wake()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

    # -- watch support -------------------------------------------------------------------

    def _event_object(self, change: _Change) -> JsonObj:
        """The object a watch delivers for ``change``: decoded at the first watch that
        delivers it, then shared (read-only) with the others."""
        decoded = self._decoded
        obj = decoded.get(change.revision)
        if obj is None:
            obj = decoded[change.revision] = semantics.decode(change.text)
            if len(decoded) > SHARED_EVENT_OBJECTS:
                del decoded[next(iter(decoded))]
        elif self._check_shared and obj != semantics.decode(change.text):
            raise StoreError(
                f"a watch consumer changed the shared object of revision {change.revision} "
                f"({change.kind.value} in {change.namespace or 'the cluster'}); event objects are read-only"
            )
        return obj

    def _next_change(self, after: int, kind: Kind) -> Iterator[_Change]:
        """Changes with revision > ``after``, in order. Raises ``Gone`` when a change of
        ``kind`` after ``after`` was compacted away."""
        if after < self._compacted and self._dropped.get(kind, 0) > after:
            raise Gone(f"too old resource version: {after} (the oldest available is {self._compacted})")
        start = max(0, after - self._compacted)
        for i in range(start, len(self._history)):
            yield self._history[i]


class _MemoryWatch(EmbeddedWatch):
    """One watch on a :class:`MemoryStore`: an async iterator over :class:`WatchEvent`."""

    def __init__(
        self,
        store: MemoryStore,
        kind: Kind,
        *,
        start: int | None,
        namespace: str | None,
        selector: Selector,
    ) -> None:
        super().__init__(
            kind,
            start=start,
            namespace=namespace,
            selector=selector,
            store_closed=store._closed,
            registry=store._watches[kind],
        )
        self._store = store
        self._everything = not selector.labels and not selector.fields

    async def __anext__(self) -> WatchEvent:
        store = self._store
        if self._refused:
            raise StoreError("the store is closed")
        while True:
            if self._stopped or store._closed:
                self._stopped = True
                raise StopAsyncIteration
            if self._last is None:
                self._snapshot()
            if self._pending:
                return self._pending.popleft()
            event = self._scan()
            if event is not None:
                self._yielded_at = time.monotonic()
                return event
            self._wakeup.clear()
            await self._wakeup.wait()

    def _snapshot(self) -> None:
        store = self._store
        for obj in store._select(self._kind, self._namespace, self._selector):
            self._pending.append(WatchEvent(EventType.ADDED, obj))
        self._last = store._revision

    def _scan(self) -> WatchEvent | None:
        assert self._last is not None
        for change in self._store._next_change(self._last, self._kind):
            self._last = change.revision
            if change.kind is not self._kind or (
                self._namespace is not None and change.namespace != self._namespace
            ):
                self._skipped = True
                continue
            if self._everything:
                seen: tuple[EventType, bool] | None = (change.type, False)
            else:
                prev = semantics.decode(change.prev_text) if change.prev_text is not None else None
                seen = semantics.watch_transition(
                    self._selector, change.type, obj=self._store._event_object(change), prev=prev
                )
            if seen is None:
                self._skipped = True
                continue
            self._skipped = False
            event_type, use_prev = seen
            if use_prev:
                assert change.prev_text is not None
                obj = semantics.with_revision(semantics.decode(change.prev_text), change.revision)
            else:
                obj = self._store._event_object(change)
            return WatchEvent(event_type, obj)
        if self._skipped and time.monotonic() - self._yielded_at >= self._store._bookmark_seconds:
            self._skipped = False
            return semantics.bookmark(self._kind, self._last)
        return None
