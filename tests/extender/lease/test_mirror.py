"""The controller's read cache: informer plus write-through (extender/lease/mirror.py)."""

from __future__ import annotations

import asyncio
import contextlib

from hypothesis import given, settings
from hypothesis import strategies as st

from extender.lease.mirror import Mirror, _version
from flexlease.store.base import EventType, JsonObj, Kind, WatchEvent
from flexlease.store.informer import object_key
from flexlease.store.memory import MemoryStore
from tests.extender.lease.builders import gpunode


async def test_own_writes_are_seen_at_once_and_the_watch_takes_over() -> None:
    store = MemoryStore()
    seen: list[tuple[EventType, str]] = []

    def on_change(type: EventType, obj: JsonObj) -> None:
        seen.append((type, obj["metadata"]["resourceVersion"]))

    mirror = Mirror(store, Kind.GPUNODE, on_change=on_change)
    await store.create(Kind.GPUNODE, gpunode("n1"))
    task = asyncio.create_task(mirror.run(), name="mirror")
    try:
        await asyncio.wait_for(mirror.listed.wait(), 2)
        old = mirror.get(None, "n1")
        assert old is not None
        new = await store.patch(Kind.GPUNODE, "n1", {"spec": {"pool": "standby"}})
        stale = dict(old)
        mirror.put(new)
        mirror.put(stale)  # an older version never replaces a newer one
        got = mirror.get(None, "n1")
        assert got is not None and got["spec"]["pool"] == "standby"
        assert [o["spec"]["pool"] for o in mirror.values()] == ["standby"]
        for _ in range(100):
            if len(seen) >= 2:
                break
            await asyncio.sleep(0.01)
        assert [t for t, _ in seen] == [EventType.ADDED, EventType.MODIFIED]
        await store.delete(Kind.GPUNODE, "n1")
        for _ in range(100):
            if mirror.get(None, "n1") is None:
                break
            await asyncio.sleep(0.01)
        assert mirror.get(None, "n1") is None and mirror.values() == []
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await store.close()


def _values_from_scratch(mirror: Mirror) -> list[JsonObj]:
    """What ``values`` returned before it was made cheap: every delivered object, replaced by
    the controller's write when that is newer."""
    out = {object_key(o): o for o in mirror._informer.items()}
    for key, obj in mirror._written.items():
        if key in out and _version(obj) > _version(out[key]):
            out[key] = obj
    return list(out.values())


_STEP = st.tuples(
    st.sampled_from(["deliver", "delete", "put"]), st.sampled_from(["a", "b", "c"]), st.integers(1, 30)
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_STEP, max_size=40))
def test_values_equal_a_rebuild_and_generation_moves_with_every_change(
    steps: list[tuple[str, str, int]],
) -> None:
    mirror = Mirror(MemoryStore(), Kind.GPUNODE, on_change=lambda type, obj: None)

    async def play() -> None:
        for action, name, version in steps:
            before = mirror.generation
            obj = {"metadata": {"name": name, "uid": name, "resourceVersion": str(version)}}
            if action == "put":
                mirror.put(obj)
            else:  # as the store's watch delivers it, through the informer
                type_ = EventType.DELETED if action == "delete" else EventType.MODIFIED
                await mirror._informer._deliver(WatchEvent(type_, obj))
            values = mirror.values()
            assert values == _values_from_scratch(mirror)
            assert values == [mirror.current(None, o["metadata"]["name"]) for o in values]
            if values != before_values[0]:
                assert mirror.generation > before
            before_values[0] = values

    before_values: list[list[JsonObj]] = [[]]
    asyncio.run(play())
