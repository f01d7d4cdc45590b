"""The readiness snapshot is kept from watches filtered by the job's owner and role labels."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from extender.orchestrator import profile
from extender.orchestrator.watch import ReadinessWatch
from flexlease.clock import ManualClock
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore
from tests.extender.orchestrator.pods import NS, OWNER, pod, status


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    s = MemoryStore()
    yield s
    await s.close()


async def test_snapshot_follows_the_jobs_pods_by_role(store: MemoryStore) -> None:
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    await store.create(Kind.POD, pod("head-0", "head"))
    await store.create(Kind.POD, pod("other-w", "worker", owner="team-a/other"))  # another job
    await store.create(Kind.POD, pod("odd", "driver"))  # a role the profile does not have
    watch = ReadinessWatch(store, namespace=NS, owner=OWNER, roles=profile.builtin()["ray"].roles)
    assert watch.latest().version == 0
    async with watch.running():
        snap = await watch.wait_newer(0, clock=clock, within=None)
        while snap.listed != {"head", "worker"}:
            snap = await watch.wait_newer(snap.version, clock=clock, within=None)
        assert [p.name for p in snap.role("head")] == ["head-0"]
        assert snap.role("worker") == () and "driver" not in snap.pods
        assert not snap.role("head")[0].ready  # created: status dropped, phase Pending

        await store.create(Kind.POD, pod("w-1", "worker"))
        await store.create(Kind.POD, pod("w-0", "worker"))
        await store.patch(
            Kind.POD,
            "head-0",
            {"status": status(ready=True, running=True)},
            namespace=NS,
            subresource="status",
        )
        while not (len(snap.role("worker")) == 2 and snap.role("head")[0].ready):
            snap = await watch.wait_newer(snap.version, clock=clock, within=None)
        assert [p.name for p in snap.role("worker")] == ["w-0", "w-1"]  # sorted: ranks

        await store.delete(Kind.POD, "w-0", namespace=NS)
        while len(snap.role("worker")) != 1:
            snap = await watch.wait_newer(snap.version, clock=clock, within=None)
        assert snap.role("worker")[0].name == "w-1"

        # Nothing changes: the wait ends when the clock says so, with the same version.
        version = snap.version
        waiter = asyncio.create_task(watch.wait_newer(version, clock=clock, within=5), name="waiter")
        await asyncio.sleep(0.01)
        assert not waiter.done()
        await clock.advance(5)
        assert (await waiter).version == version
