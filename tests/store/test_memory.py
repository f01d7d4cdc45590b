"""MemoryStore: the store contract, plus what only an in-process store can show."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from flexlease.clock import ManualClock
from flexlease.errors import Gone, StoreError
from flexlease.store.base import EventType, Kind, Store
from flexlease.store.memory import SHARED_EVENT_OBJECTS, MemoryStore
from tests.store.contract import NS, StoreContract, make_pod, next_events, watching


class TestMemoryStore(StoreContract):
    @pytest.fixture
    async def store(self) -> AsyncIterator[Store]:
        s = MemoryStore(bookmark_seconds=0.05)
        yield s
        await s.close()

    async def compact(self, store: Store) -> None:
        assert isinstance(store, MemoryStore)
        await store.compact()


async def test_an_idle_watch_outlives_a_burst_of_other_kinds() -> None:
    """As the API server's per-resource watch cache: history dropped for Pod writes does not
    expire a GPULease watch that had nothing to deliver; a Pod watch as old does expire."""
    store = MemoryStore(history_revisions=10)
    try:
        start = (await store.list(Kind.GPULEASE)).resource_version
        async with watching(store, Kind.GPULEASE, start) as leases:
            await store.create(Kind.POD, make_pod("a"))
            for i in range(100):
                await store.patch(Kind.POD, "a", {"metadata": {"labels": {"i": str(i)}}}, namespace=NS)
            await store.create(Kind.GPULEASE, {"metadata": {"name": "l", "namespace": NS}, "spec": {}})
            (event,) = await next_events(leases, 1)
        assert event.type is EventType.ADDED and event.object["metadata"]["name"] == "l"
        with pytest.raises(Gone):
            async with watching(store, Kind.POD, start) as pods:
                await next_events(pods, 1)
    finally:
        await store.close()


async def test_history_is_bounded_and_a_slow_watch_gets_gone() -> None:
    store = MemoryStore(history_revisions=10)
    try:
        await store.create(Kind.POD, make_pod("a"))
        start = (await store.list(Kind.POD)).resource_version
        async with watching(store, Kind.POD, start) as watch:
            await store.patch(Kind.POD, "a", {"metadata": {"labels": {"i": "first"}}}, namespace=NS)
            (first,) = await next_events(watch, 1)  # the watch is live ...
            for i in range(100):  # ... then falls behind more than the history holds
                await store.patch(Kind.POD, "a", {"metadata": {"labels": {"i": str(i)}}}, namespace=NS)
            with pytest.raises(Gone):
                await next_events(watch, 1)
        assert first.object["metadata"]["labels"] == {"i": "first"}
        recent = str(store.revision - 5)
        async with watching(store, Kind.POD, recent) as watch:
            events = await next_events(watch, 5)
        assert [int(e.resource_version) for e in events] == list(
            range(store.revision - 4, store.revision + 1)
        )
    finally:
        await store.close()


async def test_idle_until_every_watch_has_taken_every_change_of_its_kind() -> None:
    store = MemoryStore()
    try:
        assert store.idle  # no watches
        async with watching(store, Kind.POD, str(store.revision)) as watch:
            assert store.idle
            await store.create(Kind.POD, make_pod("a"))
            assert not store.idle  # written, not yet taken
            await next_events(watch, 1)
            assert store.idle
            await store.create(Kind.GPUNODE, {"metadata": {"name": "n"}})
            assert store.idle  # a change of another kind is nothing this watch waits for
    finally:
        await store.close()


async def test_idle_is_asked_again_after_a_new_watch_or_a_write() -> None:
    """Once idle, the store answers from what it last found until a watch opens or a write
    lands; each of those makes it look at the watches again."""
    store = MemoryStore()
    try:
        await store.create(Kind.POD, make_pod("a"))
        async with watching(store, Kind.POD, str(store.revision)) as first:
            assert store.idle and store.idle  # the second answer is the remembered one
            async with watching(store, Kind.POD, "0") as fresh:  # "from now": a snapshot to take
                assert not store.idle
                await next_events(fresh, 1)
                assert store.idle
                async with watching(store, Kind.POD, str(store.revision - 1)) as behind:
                    assert not store.idle  # opened behind the store's revision
                    await next_events(behind, 1)
                    assert store.idle
                    await store.patch(Kind.POD, "a", {"metadata": {"labels": {"x": "1"}}}, namespace=NS)
                    assert not store.idle
                    for watch in (first, fresh):
                        await next_events(watch, 1)
                    assert not store.idle  # ``behind`` has not taken it yet
                    await next_events(behind, 1)
                    assert store.idle
    finally:
        await store.close()


async def test_uids_and_creation_times_can_come_from_the_caller() -> None:
    clock = ManualClock(datetime(2026, 1, 5, 12, 0, 7, tzinfo=UTC))
    uids = iter(["uid-1", "uid-2"])
    store = MemoryStore(clock=clock, uids=lambda: next(uids))
    try:
        a = await store.create(Kind.POD, make_pod("a"))
        await clock.advance(60)
        b = await store.create(Kind.POD, make_pod("b"))
        assert (a["metadata"]["uid"], a["metadata"]["creationTimestamp"]) == ("uid-1", "2026-01-05T12:00:07Z")
        assert (b["metadata"]["uid"], b["metadata"]["creationTimestamp"]) == ("uid-2", "2026-01-05T12:01:07Z")
    finally:
        await store.close()


async def test_watches_share_one_decoded_object_per_change() -> None:
    """Each change is decoded once for every watch that delivers it (read-only, like an
    informer's cache); a verb's reply is still a private copy."""
    store = MemoryStore()
    try:
        start = (await store.list(Kind.POD)).resource_version
        async with watching(store, Kind.POD, start) as first, watching(store, Kind.POD, start) as second:
            created = await store.create(Kind.POD, make_pod("a"))
            (a,) = await next_events(first, 1)
            (b,) = await next_events(second, 1)
            assert a.object is b.object and a.object == created and a.object is not created
            assert (await store.get(Kind.POD, "a", namespace=NS)) is not a.object
    finally:
        await store.close()


@pytest.mark.parametrize("check", [True, False])
async def test_a_consumer_that_changes_a_shared_event_object_is_caught_when_checking(check: bool) -> None:
    store = MemoryStore(check_shared=check)
    try:
        start = (await store.list(Kind.POD)).resource_version
        async with watching(store, Kind.POD, start) as first, watching(store, Kind.POD, start) as second:
            await store.create(Kind.POD, make_pod("a"))
            (a,) = await next_events(first, 1)
            a.object["metadata"]["labels"] = {"changed": "by a consumer"}
            if check:
                with pytest.raises(StoreError, match="changed the shared object of revision"):
                    await next_events(second, 1)
            else:  # not checking: the change is seen by the other consumer (hence read-only)
                (b,) = await next_events(second, 1)
                assert b.object["metadata"]["labels"] == {"changed": "by a consumer"}
    finally:
        await store.close()


async def test_a_watch_far_behind_decodes_its_own_object() -> None:
    """Only the newest changes stay decoded: a watch that delivers a change after
    :data:`SHARED_EVENT_OBJECTS` later ones were delivered decodes it again."""
    store = MemoryStore()
    try:
        start = (await store.list(Kind.POD)).resource_version
        async with watching(store, Kind.POD, start) as busy:
            await store.create(Kind.POD, make_pod("a"))
            (a,) = await next_events(busy, 1)
            for i in range(SHARED_EVENT_OBJECTS):
                await store.patch(Kind.POD, "a", {"metadata": {"labels": {"i": str(i)}}}, namespace=NS)
            await next_events(busy, SHARED_EVENT_OBJECTS)
        async with watching(store, Kind.POD, start) as late:
            (b,) = await next_events(late, 1)
        assert b.object == a.object and b.object is not a.object
    finally:
        await store.close()


async def test_objects_are_kept_as_text_and_every_read_is_a_private_copy() -> None:
    """The store keeps each object's JSON text only (no dict tree for the collector of the
    process it runs in); each verb that returns an object decodes a copy of its own."""
    store = MemoryStore()
    try:
        await store.create(Kind.POD, make_pod("a"))
        patched = await store.patch(Kind.POD, "a", {"metadata": {"labels": {"x": "1"}}}, namespace=NS)
        await store.bind(NS, "a", uid=None, node="n1", annotations={"k": "v"})
        assert all(isinstance(text, str) for text in store._objects[Kind.POD].values())
        patched["metadata"]["labels"]["x"] = "changed by the caller"
        first = await store.get(Kind.POD, "a", namespace=NS)
        second = await store.get(Kind.POD, "a", namespace=NS)
        assert first == second and first is not second
        assert first["metadata"]["labels"]["x"] == "1"
        assert first["spec"]["nodeName"] == "n1" and first["metadata"]["annotations"]["k"] == "v"
        (listed,) = (await store.list(Kind.POD, namespace=NS)).items
        assert listed == first and listed is not first
    finally:
        await store.close()
