"""Every store kind for tests written against the Store Protocol."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from flexlease.config import StoreSettings
from flexlease.store.base import Store
from flexlease.store.kube import Backoff, KubeStore
from flexlease.store.memory import MemoryStore
from flexlease.store.sqlite import SqliteStore
from standins.apiserver import FakeApiServer


@contextlib.asynccontextmanager
async def any_store(kind: str, tmp_path: Path) -> AsyncIterator[Store]:
    """A store of ``kind`` for tests written against the Store Protocol: ``memory``,
    ``sqlite`` (a file under ``tmp_path``) or ``kube`` (KubeStore on a FakeApiServer)."""
    if kind == "memory":
        memory = MemoryStore(bookmark_seconds=0.05)
        try:
            yield memory
        finally:
            await memory.close()
    elif kind == "sqlite":
        sqlite = SqliteStore(tmp_path / "state.db", poll_seconds=0.01, bookmark_seconds=0.05)
        try:
            yield sqlite
        finally:
            await sqlite.close()
    else:
        async with FakeApiServer(bookmark_interval=0.05) as api:
            settings = StoreSettings(kind="kube", request_timeout_seconds=5.0, watch_timeout_seconds=30.0)
            kube = KubeStore.for_host(api.url, settings, reconnect=Backoff(initial=0.02, maximum=0.2))
            try:
                yield kube
            finally:
                await kube.close()


STORE_KINDS = ("memory", "sqlite", "kube")
