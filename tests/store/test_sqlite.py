"""SqliteStore: the store contract, separate processes sharing one file, restart, compaction."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from flexlease.errors import Gone, StoreError
from flexlease.store.base import EventType, Kind, Store, WatchEvent
from flexlease.store.sqlite import SqliteStore
from tests.store.contract import NS, StoreContract, make_pod, next_events, no_more_events, watching

REPO = Path(__file__).resolve().parents[2]


class TestSqliteStore(StoreContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        s = SqliteStore(tmp_path / "state.db", poll_seconds=0.01, bookmark_seconds=0.05)
        yield s
        await s.close()

    async def compact(self, store: Store) -> None:
        assert isinstance(store, SqliteStore)
        await store.compact()


async def run_writer(path: Path, prefix: str, count: int) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.store.sqlite_writer",
        str(path),
        prefix,
        str(count),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


def expected_events(prefix: str, count: int) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for i in range(count):
        name = f"{prefix}-{i}"
        out += [("ADDED", name), ("MODIFIED", name)]
        if i % 3 == 0:
            out.append(("DELETED", name))
    return out


async def collect(watch: AsyncIterator[WatchEvent], count: int) -> list[WatchEvent]:
    """The next ``count`` non-BOOKMARK events, within 30 s (the writers are processes)."""
    out: list[WatchEvent] = []
    async with asyncio.timeout(30.0):
        while len(out) < count:
            event = await anext(watch)
            if event.type is not EventType.BOOKMARK:
                out.append(event)
    return out


async def test_another_process_writes_this_one_watches_every_event_in_order(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    store = SqliteStore(path, poll_seconds=0.01)
    try:
        listed = await store.list(Kind.POD)
        count = 60
        want = expected_events("w", count)
        async with watching(store, Kind.POD, listed.resource_version) as watch:
            proc = await run_writer(path, "w", count)
            events = await collect(watch, len(want))
            out, err = await proc.communicate()
            assert proc.returncode == 0, err.decode()
            await no_more_events(watch, wait=0.2)
        assert [(e.type.value, e.object["metadata"]["name"]) for e in events] == want
        versions = [int(e.resource_version) for e in events]
        # one writer: revisions are contiguous, each seen once
        assert versions == list(
            range(int(listed.resource_version) + 1, int(listed.resource_version) + 1 + len(want))
        )
        last_modified = [e for e in events if e.type is EventType.MODIFIED][-1]
        assert last_modified.resource_version == out.decode().strip()
        assert events[1].object["metadata"]["labels"] == {"i": "0"}
    finally:
        await store.close()


async def test_two_writer_processes_are_serialized(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    store = SqliteStore(path, poll_seconds=0.01)
    try:
        await store.open()
        start = (await store.list(Kind.POD)).resource_version
        count = 40
        async with watching(store, Kind.POD, start) as watch:
            procs = [await run_writer(path, prefix, count) for prefix in ("a", "b")]
            results = [await p.communicate() for p in procs]
            assert [p.returncode for p in procs] == [0, 0], [err.decode() for _, err in results]
            total = 2 * len(expected_events("x", count))
            events = await collect(watch, total)
            await no_more_events(watch, wait=0.2)
        versions = [int(e.resource_version) for e in events]
        assert versions == list(range(int(start) + 1, int(start) + 1 + total))
        for prefix in ("a", "b"):  # each writer's own order is kept
            mine = [(e.type.value, e.object["metadata"]["name"]) for e in events]
            mine = [x for x in mine if x[1].startswith(prefix + "-")]
            assert mine == expected_events(prefix, count)
        listed = await store.list(Kind.POD)
        assert len(listed.items) == 2 * (count - len(range(0, count, 3)))
    finally:
        await store.close()


async def test_restart_keeps_objects_and_watch_resumes(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    first = SqliteStore(path)
    created = await first.create(Kind.POD, make_pod("a"))
    seen_rv = created["metadata"]["resourceVersion"]  # a consumer stored this, then stopped
    patched = await first.patch(Kind.POD, "a", {"metadata": {"labels": {"x": "1"}}}, namespace=NS)
    await first.close()

    second = SqliteStore(path, poll_seconds=0.01)
    try:
        assert await second.get(Kind.POD, "a", namespace=NS) == patched
        listed = await second.list(Kind.POD)
        assert listed.resource_version == patched["metadata"]["resourceVersion"]
        async with watching(second, Kind.POD, seen_rv) as watch:
            later = await second.create(Kind.POD, make_pod("b"))
            events = await next_events(watch, 2)
        assert [e.object for e in events] == [patched, later]
        assert int(later["metadata"]["resourceVersion"]) == int(patched["metadata"]["resourceVersion"]) + 1
    finally:
        await second.close()


async def test_history_is_compacted_to_history_revisions(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db", history_revisions=10, poll_seconds=0.01)
    try:
        first = await store.create(Kind.POD, make_pod("a"))
        for i in range(100):
            await store.patch(Kind.POD, "a", {"metadata": {"labels": {"i": str(i)}}}, namespace=NS)
        with pytest.raises(Gone):
            async with watching(store, Kind.POD, first["metadata"]["resourceVersion"]) as watch:
                await next_events(watch, 1)
        rows = sqlite3.connect(tmp_path / "state.db").execute("SELECT COUNT(*) FROM log").fetchone()[0]
        assert 10 <= rows <= 10 + 64 + 1
        current = int((await store.list(Kind.POD)).resource_version)
        async with watching(store, Kind.POD, str(current - 5)) as watch:  # recent: still there
            events = await next_events(watch, 5)
        assert [int(e.resource_version) for e in events] == list(range(current - 4, current + 1))
    finally:
        await store.close()


async def test_write_that_fails_leaves_nothing(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    try:
        await store.create(Kind.POD, make_pod("a"))
        before = await store.list(Kind.POD)
        with pytest.raises(StoreError) as info:
            await store.patch(Kind.POD, "a", {"metadata": {"labels": {"bad": float("nan")}}}, namespace=NS)
        assert info.value.status == 400
        after = await store.list(Kind.POD)
        assert after == before  # same objects, no revision taken
    finally:
        await store.close()


async def test_unusable_path_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = SqliteStore(blocker / "state.db")
    with pytest.raises(StoreError):
        await store.open()
    await store.close()


async def test_not_a_database_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"this is not an SQLite file" * 100)
    store = SqliteStore(path)
    with pytest.raises(StoreError):
        await store.list(Kind.POD)
    await store.close()


async def test_closed_store_refuses_calls(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    await store.close()
    with pytest.raises(StoreError):
        await store.list(Kind.POD)
    with pytest.raises(StoreError):
        await anext(store.watch(Kind.POD, resource_version="1"))
