"""Informer: list, readiness, watch, re-list on Gone with a consumer state that equals a fresh
list, back-off on store errors, bookmarks, the iterator form and clean cancellation. Runs on
real stores (MemoryStore, SqliteStore); store failures are injected by a thin proxy."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from flexlease.errors import StoreError
from flexlease.store.base import EVERYTHING, EventType, JsonObj, Kind, ObjectList, Selector, WatchEvent
from flexlease.store.informer import Backoff, Informer, object_key
from flexlease.store.memory import MemoryStore
from flexlease.store.sqlite import SqliteStore
from tests.store.contract import NS, TIMEOUT, make_pod

FAST = Backoff(initial=0.01, maximum=0.05, jitter=0.0)


class Mirror:
    """A consumer that keeps the objects the informer tells it about and checks each event
    makes sense (no ADDED for a known object, no MODIFIED/DELETED for an unknown one)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], JsonObj] = {}
        self.events: list[WatchEvent] = []
        self.changed = asyncio.Event()
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, event: WatchEvent) -> None:
        await self.gate.wait()
        key = object_key(event.object)
        if event.type is EventType.ADDED:
            assert key not in self.objects, f"ADDED twice: {key}"
            self.objects[key] = event.object
        elif event.type is EventType.MODIFIED:
            assert key in self.objects, f"MODIFIED unknown: {key}"
            self.objects[key] = event.object
        elif event.type is EventType.DELETED:
            assert key in self.objects, f"DELETED unknown: {key}"
            del self.objects[key]
        else:
            raise AssertionError(f"handler got {event.type}")
        self.events.append(event)
        self.changed.set()

    async def wait_for(self, want: dict[tuple[str, str], JsonObj]) -> None:
        async with asyncio.timeout(TIMEOUT):
            while self.objects != want:
                self.changed.clear()
                await self.changed.wait()


async def fresh_state(
    store: Any, kind: Kind = Kind.POD, selector: Selector = EVERYTHING
) -> dict[Any, JsonObj]:
    listed = await store.list(kind, selector=selector)
    return {object_key(o): o for o in listed.items}


async def test_lists_then_watches() -> None:
    store = MemoryStore()
    mirror = Mirror()
    await store.create(Kind.POD, make_pod("a"))
    await store.create(Kind.POD, make_pod("b"))
    informer = Informer(store, Kind.POD, handler=mirror)
    async with informer.running():
        async with asyncio.timeout(TIMEOUT):
            await informer.listed.wait()
        assert [e.type for e in mirror.events] == [EventType.ADDED, EventType.ADDED]
        assert informer.resource_version == str(store.revision)
        await store.patch(Kind.POD, "a", {"metadata": {"labels": {"x": "1"}}}, namespace=NS)
        await store.delete(Kind.POD, "b", namespace=NS)
        await store.create(Kind.POD, make_pod("c"))
        await mirror.wait_for(await fresh_state(store))
    assert [(e.type.value, e.object["metadata"]["name"]) for e in mirror.events[2:]] == [
        ("MODIFIED", "a"),
        ("DELETED", "b"),
        ("ADDED", "c"),
    ]
    assert informer.get("a", namespace=NS) == await store.get(Kind.POD, "a", namespace=NS)
    assert sorted(o["metadata"]["name"] for o in informer.items()) == ["a", "c"]
    assert informer.lists == 1
    await store.close()


async def test_relist_after_gone_delivers_only_the_difference() -> None:
    store = MemoryStore()
    mirror = Mirror()
    for name in ("keep", "change", "vanish", "recreate"):
        await store.create(Kind.POD, make_pod(name))
    informer = Informer(store, Kind.POD, handler=mirror, backoff=FAST)
    async with informer.running():
        async with asyncio.timeout(TIMEOUT):
            await informer.listed.wait()
        mirror.gate.clear()  # the consumer stalls ...
        await store.patch(Kind.POD, "keep", {"metadata": {"labels": {"x": "0"}}}, namespace=NS)
        await asyncio.sleep(0.05)  # ... holding that event, while the world moves on:
        await store.patch(Kind.POD, "change", {"metadata": {"labels": {"x": "1"}}}, namespace=NS)
        await store.delete(Kind.POD, "vanish", namespace=NS)
        old_uid = (await store.get(Kind.POD, "recreate", namespace=NS))["metadata"]["uid"]
        await store.delete(Kind.POD, "recreate", namespace=NS)
        await store.create(Kind.POD, make_pod("recreate"))
        await store.create(Kind.POD, make_pod("new"))
        await store.compact()  # and the history it would need is gone
        mirror.gate.set()
        await mirror.wait_for(await fresh_state(store))
        assert informer.lists == 2
    after_list = [(e.type.value, e.object["metadata"]["name"]) for e in mirror.events[4:]]
    assert after_list[0] == ("MODIFIED", "keep")  # the event it held
    assert sorted(after_list[1:]) == sorted(
        [
            ("MODIFIED", "change"),
            ("DELETED", "vanish"),
            ("DELETED", "recreate"),
            ("ADDED", "recreate"),
            ("ADDED", "new"),
        ]
    )
    deleted = next(
        e for e in mirror.events if e.type is EventType.DELETED and e.object["metadata"]["name"] == "recreate"
    )
    assert deleted.object["metadata"]["uid"] == old_uid
    await store.close()


class FlakyStore:
    """A real store whose next ``failures`` watch calls fail (as a dropped connection does)."""

    def __init__(self, store: MemoryStore, *, failures: int) -> None:
        self.store = store
        self.failures = failures
        self.watch_versions: list[str] = []

    async def list(
        self, kind: Kind, *, namespace: str | None = None, selector: Selector = EVERYTHING
    ) -> ObjectList:
        return await self.store.list(kind, namespace=namespace, selector=selector)

    def watch(self, kind: Kind, **kwargs: Any) -> AsyncIterator[WatchEvent]:
        self.watch_versions.append(kwargs["resource_version"])
        if self.failures > 0:
            self.failures -= 1
            return _failing()
        return self.store.watch(kind, **kwargs)


async def _failing() -> AsyncIterator[WatchEvent]:
    raise StoreError("connection reset by peer")
    yield  # pragma: no cover - makes this an async generator


async def test_store_errors_back_off_and_watch_on_without_relisting() -> None:
    memory = MemoryStore()
    flaky = FlakyStore(memory, failures=3)
    mirror = Mirror()
    await memory.create(Kind.POD, make_pod("a"))
    informer = Informer(flaky, Kind.POD, handler=mirror, backoff=FAST)  # type: ignore[arg-type]
    async with informer.running():
        async with asyncio.timeout(TIMEOUT):
            await informer.listed.wait()
        await memory.create(Kind.POD, make_pod("b"))
        await mirror.wait_for(await fresh_state(memory))
    assert informer.lists == 1
    assert len(flaky.watch_versions) == 4
    assert len(set(flaky.watch_versions)) == 1  # every retry from the list's version
    assert [e.object["metadata"]["name"] for e in mirror.events] == ["a", "b"]
    await memory.close()


async def test_no_busy_loop_when_watches_keep_failing() -> None:
    """Every refused watch is followed by a back-off that grows with the consecutive
    failures (recorded, not timed)."""
    delays: list[tuple[int, float]] = []

    class Recording(Backoff):
        def delay(self, failures: int, *, rng: random.Random | None = None) -> float:
            out = Backoff.delay(self, failures, rng=rng)
            delays.append((failures, out))
            return out

    memory = MemoryStore()
    counting = FlakyStore(memory, failures=0)
    backoff = Recording(initial=FAST.initial, maximum=FAST.maximum, jitter=0.0)
    informer = Informer(counting, Kind.POD, handler=Mirror(), backoff=backoff)  # type: ignore[arg-type]
    async with informer.running():
        async with asyncio.timeout(TIMEOUT):
            await informer.listed.wait()
        await memory.close()  # the watch ends; every new one is refused
        async with asyncio.timeout(TIMEOUT):
            while len(delays) < 5:  # noqa: ASYNC110 - counts back-offs taken by the informer's task
                await asyncio.sleep(0.01)
    assert [n for n, _ in delays[:5]] == [1, 2, 3, 4, 5]
    assert [d for _, d in delays[:5]] == [0.01, 0.02, 0.04, 0.05, 0.05]
    assert len(counting.watch_versions) <= len(delays) + 1  # no watch without a back-off before it


def test_backoff_is_bounded_exponential_with_jitter() -> None:
    backoff = Backoff(initial=0.5, maximum=8.0, factor=2.0, jitter=0.25)
    rng = random.Random(7)
    for failures, base in [(1, 0.5), (2, 1.0), (3, 2.0), (5, 8.0), (50, 8.0)]:
        for _ in range(20):
            assert base * 0.75 <= backoff.delay(failures, rng=rng) <= base * 1.25
    assert Backoff(jitter=0.0).delay(1) == Backoff().initial


async def test_bookmarks_advance_the_version_only(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db", poll_seconds=0.01, bookmark_seconds=0.0)
    mirror = Mirror()
    selector = Selector(labels={"app": "mine"})
    await store.create(Kind.POD, make_pod("mine", labels={"app": "mine"}))
    informer = Informer(store, Kind.POD, handler=mirror, selector=selector, backoff=FAST)
    async with informer.running():
        async with asyncio.timeout(TIMEOUT):
            await informer.listed.wait()
        listed_rv = int(informer.resource_version)
        for i in range(5):
            await store.create(Kind.POD, make_pod(f"other-{i}", labels={"app": "other"}))
        target = str(listed_rv + 5)
        async with asyncio.timeout(TIMEOUT):
            while informer.resource_version != target:  # noqa: ASYNC110 - no event to wait on: polled
                await asyncio.sleep(0.01)
    assert [e.object["metadata"]["name"] for e in mirror.events] == ["mine"]
    await store.close()


async def test_stream_yields_events_and_stops_cleanly() -> None:
    store = MemoryStore()
    await store.create(Kind.POD, make_pod("a"))
    async with Informer.stream(store, Kind.POD, namespace=NS, backoff=FAST) as events:
        async with asyncio.timeout(TIMEOUT):
            first = await anext(events)
            await store.delete(Kind.POD, "a", namespace=NS)
            second = await anext(events)
    seen = [(e.type.value, e.object["metadata"]["name"]) for e in (first, second)]
    assert seen == [("ADDED", "a"), ("DELETED", "a")]
    await store.close()


async def test_handler_error_ends_the_informer() -> None:
    store = MemoryStore()
    await store.create(Kind.POD, make_pod("a"))

    async def broken(event: WatchEvent) -> None:
        raise ValueError("consumer bug")

    informer = Informer(store, Kind.POD, handler=broken)
    with pytest.raises(ValueError, match="consumer bug"):
        async with asyncio.timeout(TIMEOUT):
            await informer.run()
    assert not informer.listed.is_set()
    await store.close()


async def test_cancellation_closes_the_watch() -> None:
    store = MemoryStore()
    mirror = Mirror()
    informer = Informer(store, Kind.POD, handler=mirror, name="pods-under-test")
    async with informer.running():
        async with asyncio.timeout(TIMEOUT):
            await informer.listed.wait()
        await asyncio.sleep(0.01)
        assert "pods-under-test" in {t.get_name() for t in asyncio.all_tasks()}
    assert "pods-under-test" not in {t.get_name() for t in asyncio.all_tasks()}
    await store.close()
