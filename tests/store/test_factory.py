"""open_store: one store per configured kind, opened and ready, or a clear StoreError."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flexlease.config import StoreSettings
from flexlease.errors import StoreError
from flexlease.store.base import Kind, Store
from flexlease.store.factory import open_store
from flexlease.store.kube_filter import ManagedPods
from flexlease.store.memory import MemoryStore
from flexlease.store.sqlite import SqliteStore
from tests.store.contract import make_pod


async def test_memory() -> None:
    store = await open_store(StoreSettings(kind="memory"))
    assert isinstance(store, MemoryStore) and isinstance(store, Store)
    await store.create(Kind.POD, make_pod("a"))
    await store.close()


async def test_sqlite_creates_the_file_and_its_directory(tmp_path: Path) -> None:
    path = tmp_path / "var" / "lib" / "flexlease" / "state.db"
    store = await open_store(StoreSettings(kind="sqlite", sqlite_path=path, sqlite_poll_seconds=0.01))
    try:
        assert isinstance(store, SqliteStore) and isinstance(store, Store)
        assert path.exists()
        await store.create(Kind.POD, make_pod("a"))
    finally:
        await store.close()
    reopened = await open_store(StoreSettings(kind="sqlite", sqlite_path=path))
    assert len((await reopened.list(Kind.POD)).items) == 1
    await reopened.close()


async def test_sqlite_unusable_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreError):
        await open_store(StoreSettings(kind="sqlite", sqlite_path=tmp_path / "file" / "state.db"))


async def test_kube_without_configuration(tmp_path: Path) -> None:
    with pytest.raises(StoreError):
        await open_store(StoreSettings(kind="kube", kubeconfig=tmp_path / "missing-kubeconfig"))


async def test_kube_with_kubeconfig(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "local", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "me", "user": {"token": "t"}}],
                "contexts": [{"name": "local", "context": {"cluster": "local", "user": "me"}}],
                "current-context": "local",
            }
        )
    )
    pods = ManagedPods()
    store = await open_store(StoreSettings(kind="kube", kubeconfig=kubeconfig), pod_filter=pods)
    try:
        assert type(store).__name__ == "KubeStore" and isinstance(store, Store)
        assert store._pod_filter is pods  # type: ignore[attr-defined]  # the extender's pod scoping
    finally:
        await store.close()
