"""``SqliteStore``: the embedded default store, one SQLite file shared by separate processes.

Layout (as k3s's kine keeps Kubernetes objects in SQL in place of etcd): ``objects`` holds
the current state of every object; ``log`` holds one row per revision (the change type, the
object after it, and for MODIFIED the object before it, so a watch can tell selector
transitions); ``meta`` holds the store's ``revision`` and the ``compacted`` revision (the
oldest one a watch may start from). Watches poll ``log``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

from flexlease.errors import Conflict, Gone, NotFound, StoreError
from flexlease.logging import ctx
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

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_HISTORY_REVISIONS: Final = 100_000
DEFAULT_POLL_SECONDS: Final = 0.05
DEFAULT_BUSY_TIMEOUT_SECONDS: Final = 10.0
DEFAULT_BOOKMARK_SECONDS: Final = 1.0
WATCH_BATCH: Final = 512
"""Log rows a watch reads per query."""

_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID",
    f"INSERT OR IGNORE INTO meta (key, value) VALUES ('revision', {semantics.FIRST_REVISION}),"
    f" ('compacted', {semantics.FIRST_REVISION})",
    "CREATE TABLE IF NOT EXISTS objects ("
    " kind TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,"
    " revision INTEGER NOT NULL, body TEXT NOT NULL,"
    " PRIMARY KEY (kind, namespace, name)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS log ("
    " revision INTEGER PRIMARY KEY, kind TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,"
    " type TEXT NOT NULL, body TEXT NOT NULL, prev TEXT)",
    "CREATE INDEX IF NOT EXISTS log_by_kind ON log (kind, revision)",
)


@dataclass(frozen=True, slots=True)
class _Row:
    """One ``log`` row as a watch reads it."""

    revision: int
    namespace: str
    type: EventType
    body: str
    prev: str | None


_Rows = list[_Row]


class SqliteStore:
    """A :class:`~flexlease.store.base.Store` in one SQLite file (stdlib ``sqlite3``, WAL).

    Several processes (the extender, node agents) open the same ``path``; each write is one
    ``BEGIN IMMEDIATE`` transaction, so it is applied whole or not at all and writers from
    all processes are serialized. Semantics are those of ``MemoryStore`` (both share
    :mod:`flexlease.store.semantics` and ``tests/store/contract.py``):

    * one revision counter for the whole file (``meta.revision``; a fresh file is at 1),
      each write takes the next one; evict writes two (the PDB, then the pod's deletion);
      a patch that changes nothing writes nothing;
    * ``list`` reads a consistent snapshot (one read transaction) and returns its revision;
    * ``watch`` yields every change strictly after ``resource_version`` from the ``log``
      table, in revision order, exactly once; changes committed by other processes are seen
      within ``poll_seconds``, those of this process at once. ``"0"``/``""``: the current
      objects as ADDED, then changes. Selector transitions arrive as ADDED/DELETED, and
      BOOKMARKs (after ``bookmark_seconds`` without a delivered event) carry the revision
      reached past filtered-out changes;
    * compaction keeps the last ``history_revisions`` log rows (checked on every write,
      done in batches of an eighth); a watch from before ``meta.compacted`` raises ``Gone``.
      :meth:`compact` forces it;
    * the file outlives the process: reopen it and watch on from a stored resourceVersion.

    Limits: all SQLite calls run on one dedicated thread per store (never on the event
    loop), so one process's calls are serialized; a call cancelled while its transaction
    runs still completes or rolls back whole. ``synchronous=NORMAL`` in WAL mode: a commit
    survives a process crash, but the last transactions may be lost on power failure.
    A writer blocked longer than ``busy_timeout_seconds`` by another process fails with
    ``StoreError``. Every SQLite failure is a ``StoreError`` with the cause chained; after
    :meth:`close` running watches end and every verb raises ``StoreError``.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        history_revisions: int = DEFAULT_HISTORY_REVISIONS,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        busy_timeout_seconds: float = DEFAULT_BUSY_TIMEOUT_SECONDS,
        bookmark_seconds: float = DEFAULT_BOOKMARK_SECONDS,
    ) -> None:
        if history_revisions < 1:
            raise ValueError("history_revisions must be at least 1")
        self._path = Path(path)
        self._history_revisions = history_revisions
        self._poll_seconds = poll_seconds
        self._busy_timeout_seconds = busy_timeout_seconds
        self._bookmark_seconds = bookmark_seconds
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"sqlite-store-{self._path.name}"
        )
        self._conn: sqlite3.Connection | None = None  # used only on the executor's thread
        self._watches: dict[Kind, WatchRegistry[_SqliteWatch]] = {k: WatchRegistry() for k in Kind}
        self._closed = False

    @property
    def path(self) -> Path:
        return self._path

    # -- the thread --------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        """The store's connection (executor thread only), opened and migrated on first use."""
        if self._conn is not None:
            return self._conn
        self._path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self._path, timeout=self._busy_timeout_seconds, isolation_level=None, check_same_thread=True
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_seconds * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"sqlite {self._path}: cannot use WAL mode (journal_mode={mode})")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA:
                    conn.execute(statement)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        log.debug("opened sqlite store", extra=ctx(path=str(self._path)))
        return conn

    async def _call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the store's thread. SQLite failures become ``StoreError``."""
        if self._closed:
            raise StoreError("the store is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn)
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite {self._path}: {exc}") from exc
        except OSError as exc:
            raise StoreError(f"sqlite {self._path}: {exc}") from exc
        except RuntimeError as exc:  # the executor was shut down by close()
            if self._closed:
                raise StoreError("the store is closed") from exc
            raise

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` in one read transaction (a consistent snapshot)."""
        conn = self._connection()
        conn.execute("BEGIN")
        try:
            return fn(conn)
        finally:
            conn.execute("COMMIT")

    def _write(self, fn: Callable[[sqlite3.Connection, _Revisions], T]) -> T:
        """``fn`` in one ``BEGIN IMMEDIATE`` transaction: committed whole, or rolled back
        when ``fn`` or the commit raises."""
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            revisions = _Revisions(conn)
            result = fn(conn, revisions)
            revisions.save(self._history_revisions)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result

    async def open(self) -> None:
        """Open the file and create the schema now (the first call does it otherwise), so a
        bad path or a locked file fails early. Raises ``StoreError``."""
        await self._call(self._connection)

    def _wake(self, kind: Kind) -> None:
        for watch in self._watches[kind]:
            watch.wake()

    # -- reads -------------------------------------------------------------------------

    async def list(
        self, kind: Kind, *, namespace: str | None = None, selector: Selector = EVERYTHING
    ) -> ObjectList:
        """Objects of ``kind`` (in ``namespace``, or all) matching ``selector``, and the
        revision of that snapshot. Raises ``StoreError``."""
        ns = semantics.namespace_filter(kind, namespace)
        return await self._call(
            functools.partial(
                self._read, functools.partial(_list, kind=kind, namespace=ns, selector=selector)
            )
        )

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> JsonObj:
        """One object. Raises ``NotFound``; ``StoreError`` (400) without a namespace for a
        namespaced kind."""
        key = semantics.object_key(kind, name, namespace)

        def read(conn: sqlite3.Connection) -> JsonObj:
            return semantics.decode(_fetch(conn, kind, key))

        return await self._call(functools.partial(self._read, read))

    def watch(
        self,
        kind: Kind,
        *,
        resource_version: str,
        namespace: str | None = None,
        selector: Selector = EVERYTHING,
    ) -> AsyncIterator[WatchEvent]:
        """Changes to ``kind`` strictly after ``resource_version`` (see the class docstring).
        Raises ``Gone`` at the first ``__anext__`` (or later, when the consumer falls behind
        compaction), ``StoreError`` (400) on a malformed version. Has ``aclose()``."""
        start = None if resource_version in ("", "0") else semantics.parse_revision(resource_version)
        watch = _SqliteWatch(
            self,
            kind,
            start=start,
            namespace=semantics.namespace_filter(kind, namespace),
            selector=selector,
        )
        return watch

    def _read_log(self, kind: Kind, namespace: str | None, after: int) -> tuple[_Rows, int]:
        """Log rows of ``kind`` after ``after`` (at most :data:`WATCH_BATCH`) and the
        revision the reader may continue from. Raises ``Gone`` when compacted past it."""

        def read(conn: sqlite3.Connection) -> tuple[_Rows, int]:
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            if after < meta["compacted"]:
                raise Gone(f"too old resource version: {after} (the oldest available is {meta['compacted']})")
            sql = "SELECT revision, namespace, type, body, prev FROM log WHERE kind = ? AND revision > ?"
            args: tuple[object, ...] = (kind.value, after)
            if namespace is not None:
                sql += " AND namespace = ?"
                args += (namespace,)
            sql += f" ORDER BY revision LIMIT {WATCH_BATCH}"
            rows = [_Row(r[0], r[1], EventType(r[2]), r[3], r[4]) for r in conn.execute(sql, args)]
            # a short batch is everything up to the snapshot's revision
            reached = meta["revision"] if len(rows) < WATCH_BATCH else rows[-1].revision
            return rows, max(after, reached)

        return self._read(read)

    # -- writes ------------------------------------------------------------------------

    async def create(self, kind: Kind, obj: JsonObj) -> JsonObj:
        """Create (see :func:`semantics.prepare_create`). Returns the stored object. Raises
        ``Conflict`` when the name exists, ``StoreError`` (400) on an invalid object."""
        key, new = semantics.prepare_create(kind, obj)

        def write(conn: sqlite3.Connection, revs: _Revisions) -> JsonObj:
            if _lookup(conn, kind, key) is not None:
                where = f"{key[0]}/{key[1]}" if key[0] else key[1]
                raise Conflict(f"{kind} {where} already exists")
            return _put(conn, revs, kind=kind, key=key, change=EventType.ADDED, obj=new, prev_text=None)

        created = await self._call(functools.partial(self._write, write))
        self._wake(kind)
        return created

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
        it. Raises ``NotFound``, ``Conflict`` (precondition), ``StoreError`` (400)."""
        key = semantics.object_key(kind, name, namespace)
        if not isinstance(patch, dict):
            raise semantics.bad_request(f"{kind} {name}: a merge patch must be a JSON object")

        def write(conn: sqlite3.Connection, revs: _Revisions) -> JsonObj:
            text = _fetch(conn, kind, key)
            current = semantics.decode(text)
            semantics.check_precondition(current, patch, resource_version=resource_version)
            new = semantics.apply_patch(kind, current, patch, subresource=subresource)
            if new == current:
                return current
            return _put(conn, revs, kind=kind, key=key, change=EventType.MODIFIED, obj=new, prev_text=text)

        patched = await self._call(functools.partial(self._write, write))
        self._wake(kind)
        return patched

    async def delete(
        self, kind: Kind, name: str, *, namespace: str | None = None, grace_period_seconds: int | None = None
    ) -> None:
        """Delete; a bound Pod gracefully (see :func:`semantics.delete_pod`), other kinds at
        once (no finalizers). Raises ``NotFound``."""
        key = semantics.object_key(kind, name, namespace)

        def write(conn: sqlite3.Connection, revs: _Revisions) -> None:
            text = _fetch(conn, kind, key)
            _delete_row(conn, revs, kind=kind, key=key, text=text, grace_period_seconds=grace_period_seconds)

        await self._call(functools.partial(self._write, write))
        self._wake(kind)

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
        key = semantics.object_key(Kind.POD, name, namespace)

        def write(conn: sqlite3.Connection, revs: _Revisions) -> None:
            text = _fetch(conn, Kind.POD, key)
            new = semantics.apply_bind(
                semantics.decode(text),
                uid=uid,
                node=node,
                annotations=annotations,
                resource_version=resource_version,
            )
            _put(conn, revs, kind=Kind.POD, key=key, change=EventType.MODIFIED, obj=new, prev_text=text)

        await self._call(functools.partial(self._write, write))
        self._wake(Kind.POD)

    async def evict(self, namespace: str, name: str, *, grace_period_seconds: int | None = None) -> None:
        """Eviction API (see :func:`semantics.eviction_budget`), then graceful deletion of the
        pod (as :meth:`delete`), in one transaction. Raises ``NotFound``, ``TooManyRequests``
        (budget exhausted), ``StoreError`` (500: several budgets select the pod)."""
        key = semantics.object_key(Kind.POD, name, namespace)

        def write(conn: sqlite3.Connection, revs: _Revisions) -> None:
            pod_text = _fetch(conn, Kind.POD, key)
            pod = semantics.decode(pod_text)
            rows = conn.execute(
                "SELECT body FROM objects WHERE kind = ? AND namespace = ?", (Kind.PDB.value, key[0])
            ).fetchall()
            pdb = semantics.eviction_budget(pod, (semantics.decode(r[0]) for r in rows))
            if pdb is not None:
                pdb_key = (key[0], pdb["metadata"]["name"])
                pdb_text = semantics.encode(Kind.PDB, pdb)
                spent = semantics.spend_budget(pdb, name)
                _put(
                    conn,
                    revs,
                    kind=Kind.PDB,
                    key=pdb_key,
                    change=EventType.MODIFIED,
                    obj=spent,
                    prev_text=pdb_text,
                )
            _delete_row(
                conn, revs, kind=Kind.POD, key=key, text=pod_text, grace_period_seconds=grace_period_seconds
            )

        await self._call(functools.partial(self._write, write))
        self._wake(Kind.PDB)
        self._wake(Kind.POD)

    async def compact(self, keep: int = 0) -> int:
        """Drop log rows older than the last ``keep`` revisions (0: all), as etcd's
        compaction; watches from before then raise ``Gone``. Returns the compacted revision
        (the oldest one a watch may start from)."""

        def write(conn: sqlite3.Connection, revs: _Revisions) -> int:
            revs.compact(max(revs.compacted, revs.revision - keep))
            return revs.compacted

        compacted = await self._call(functools.partial(self._write, write))
        for kind in Kind:
            self._wake(kind)
        return compacted

    async def close(self) -> None:
        """End every running watch, close the connection and stop the thread; later calls
        raise ``StoreError``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for kind in Kind:
            self._wake(kind)
        loop = asyncio.get_running_loop()
        with contextlib.suppress(sqlite3.Error):
            await loop.run_in_executor(self._executor, self._close_connection)
        self._executor.shutdown(wait=False)

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class _Revisions:
    """The ``meta`` row values inside one write transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        self.revision: int = meta["revision"]
        self.compacted: int = meta["compacted"]
        self._start = self.revision

    def next(self) -> int:
        self.revision += 1
        return self.revision

    def compact(self, upto: int) -> None:
        """Delete log rows ≤ ``upto``; watches may then start from ``upto``."""
        if upto > self.compacted:
            self._conn.execute("DELETE FROM log WHERE revision <= ?", (upto,))
            self._conn.execute("UPDATE meta SET value = ? WHERE key = 'compacted'", (upto,))
            self.compacted = upto

    def save(self, history_revisions: int) -> None:
        if self.revision == self._start:
            return
        self._conn.execute("UPDATE meta SET value = ? WHERE key = 'revision'", (self.revision,))
        excess = self.revision - self.compacted - history_revisions
        if excess > max(64, history_revisions // 8):
            self.compact(self.revision - history_revisions)


def _lookup(conn: sqlite3.Connection, kind: Kind, key: semantics.ObjectKey) -> str | None:
    row = conn.execute(
        "SELECT body FROM objects WHERE kind = ? AND namespace = ? AND name = ?", (kind.value, *key)
    ).fetchone()
    return None if row is None else str(row[0])


def _fetch(conn: sqlite3.Connection, kind: Kind, key: semantics.ObjectKey) -> str:
    text = _lookup(conn, kind, key)
    if text is None:
        where = f"{key[0]}/{key[1]}" if key[0] else key[1]
        raise NotFound(f"{kind} {where} not found")
    return text


def _put(
    conn: sqlite3.Connection,
    revs: _Revisions,
    *,
    kind: Kind,
    key: semantics.ObjectKey,
    change: EventType,
    obj: JsonObj,
    prev_text: str | None,
) -> JsonObj:
    """Write one revision: the object row and the log row. Returns the stored object."""
    revision = revs.revision + 1
    text = semantics.encode(kind, semantics.stamp(obj, revision))  # validates before writing
    revs.next()
    if change is EventType.DELETED:
        conn.execute("DELETE FROM objects WHERE kind = ? AND namespace = ? AND name = ?", (kind.value, *key))
    else:
        conn.execute(
            "INSERT OR REPLACE INTO objects (kind, namespace, name, revision, body) VALUES (?, ?, ?, ?, ?)",
            (kind.value, *key, revision, text),
        )
    conn.execute(
        "INSERT INTO log (revision, kind, namespace, name, type, body, prev) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (revision, kind.value, *key, change.value, text, prev_text if change is EventType.MODIFIED else None),
    )
    return semantics.decode(text)


def _delete_row(
    conn: sqlite3.Connection,
    revs: _Revisions,
    *,
    kind: Kind,
    key: semantics.ObjectKey,
    text: str,
    grace_period_seconds: int | None,
) -> None:
    """Delete the object stored as ``text``: a bound Pod gracefully (a MODIFIED that marks it
    Terminating, or nothing when it already is with a grace period no longer), else a
    DELETED."""
    obj = semantics.decode(text)
    if kind is Kind.POD:
        kept = semantics.delete_pod(obj, grace_period_seconds=grace_period_seconds)
        if kept is obj:
            return
        if kept is not None:
            _put(conn, revs, kind=kind, key=key, change=EventType.MODIFIED, obj=kept, prev_text=text)
            return
    _put(conn, revs, kind=kind, key=key, change=EventType.DELETED, obj=obj, prev_text=text)


def _list(conn: sqlite3.Connection, *, kind: Kind, namespace: str | None, selector: Selector) -> ObjectList:
    revision = conn.execute("SELECT value FROM meta WHERE key = 'revision'").fetchone()[0]
    if namespace is None:
        rows = conn.execute("SELECT body FROM objects WHERE kind = ?", (kind.value,))
    else:
        rows = conn.execute(
            "SELECT body FROM objects WHERE kind = ? AND namespace = ?", (kind.value, namespace)
        )
    everything = not selector.labels and not selector.fields
    items = [obj for obj in (semantics.decode(r[0]) for r in rows) if everything or selector.matches(obj)]
    return ObjectList(items=items, resource_version=str(revision))


class _SqliteWatch(EmbeddedWatch):
    """One watch on a :class:`SqliteStore`: an async iterator over :class:`WatchEvent`."""

    def __init__(
        self,
        store: SqliteStore,
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

    async def __anext__(self) -> WatchEvent:
        store = self._store
        if self._refused:
            raise StoreError("the store is closed")
        while True:
            if self._stopped or store._closed:
                self._stopped = True
                raise StopAsyncIteration
            if self._pending:
                self._yielded_at = time.monotonic()
                return self._pending.popleft()
            self._wakeup.clear()
            try:
                if self._last is None:
                    listed = await store.list(self._kind, namespace=self._namespace, selector=self._selector)
                    self._pending.extend(WatchEvent(EventType.ADDED, obj) for obj in listed.items)
                    self._last = int(listed.resource_version)
                    continue
                rows, reached = await store._call(
                    functools.partial(store._read_log, self._kind, self._namespace, self._last)
                )
            except StoreError:
                if store._closed:
                    continue  # ends the iteration above
                raise
            self._select(rows, reached)
            if self._pending:
                continue
            if self._skipped and time.monotonic() - self._yielded_at >= store._bookmark_seconds:
                self._skipped = False
                self._yielded_at = time.monotonic()
                return semantics.bookmark(self._kind, self._last)
            if len(rows) >= WATCH_BATCH:
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(store._poll_seconds):
                    await self._wakeup.wait()

    def _select(self, rows: _Rows, reached: int) -> None:
        assert self._last is not None
        for row in rows:
            obj = semantics.decode(row.body)
            prev = semantics.decode(row.prev) if row.prev is not None and not self._everything else None
            seen = semantics.watch_transition(self._selector, row.type, obj=obj, prev=prev)
            if seen is None:
                self._skipped = True
                continue
            event_type, use_prev = seen
            if use_prev:
                assert prev is not None
                obj = semantics.with_revision(prev, row.revision)
            self._pending.append(WatchEvent(event_type, obj))
            self._skipped = False
        if reached > self._last:
            if not rows or reached > rows[-1].revision:
                self._skipped = True
            self._last = reached

    @property
    def _everything(self) -> bool:
        return not self._selector.labels and not self._selector.fields
