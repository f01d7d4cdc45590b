"""The controller's read cache: informer plus write-through (extender/lease/mirror.py)."""

from __future__ import annotations

import asyncio
import contextlib

from extender.lease.mirror import Mirror
from flexlease.store.base import EventType, JsonObj, Kind
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
