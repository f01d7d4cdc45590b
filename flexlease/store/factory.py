"""Build the configured store: ``memory``, ``sqlite`` (the default) or ``kube`` (DESIGN §5)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from flexlease.config import StoreSettings
from flexlease.errors import StoreError
from flexlease.store.base import JsonObj, Store
from flexlease.store.memory import MemoryStore
from flexlease.store.sqlite import SqliteStore


async def open_store(
    settings: StoreSettings, *, pod_filter: Callable[[JsonObj], bool] | None = None
) -> Store:
    """A ready store for ``settings.kind``; the caller owns it and must ``await store.close()``.

    * ``memory``: :class:`~flexlease.store.memory.MemoryStore` with its own history bound
      (``history_revisions`` is the SQLite log's: 100,000 objects held in memory would be
      too many);
    * ``sqlite``: :class:`~flexlease.store.sqlite.SqliteStore` on ``sqlite_path`` (created
      with its parent directory when missing), opened now so a bad path fails here;
      ``history_revisions`` log rows, ``sqlite_poll_seconds`` watch polling,
      ``request_timeout_seconds`` as the SQLite busy timeout;
    * ``kube``: ``flexlease.store.kube.KubeStore.connect(settings, pod_filter=pod_filter)``
      (imported only here). ``pod_filter`` keeps only the pods the caller cares about
      (e.g. :class:`flexlease.store.kube_filter.ManagedPods`), since a label selector cannot
      say "requests GPUs"; the embedded stores hold only flexlease's own objects and ignore it.

    Raises ``StoreError`` when the store cannot be opened (cause chained).
    """
    if settings.kind == "memory":
        return MemoryStore()
    if settings.kind == "sqlite":
        store = SqliteStore(
            settings.sqlite_path,
            history_revisions=settings.history_revisions,
            poll_seconds=settings.sqlite_poll_seconds,
            busy_timeout_seconds=settings.request_timeout_seconds,
        )
        try:
            await store.open()
        except BaseException:
            await store.close()
            raise
        return store
    if settings.kind == "kube":
        try:
            kube = importlib.import_module("flexlease.store.kube")
            store_class = kube.KubeStore
        except (ImportError, AttributeError) as exc:
            raise StoreError(f"store kind 'kube' is unavailable: {exc}") from exc
        connected: Store = await store_class.connect(settings, pod_filter=pod_filter)
        return connected
    raise StoreError(f"unknown store kind {settings.kind!r}")
