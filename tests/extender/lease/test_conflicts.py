"""The lease controller's optimistic-concurrency paths, through faults injected in the store
(tests/store/faults.py): tag and notice writes that meet 409 Conflict are re-read and retried;
a reconcile that keeps failing backs off on the controller's clock, then completes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from extender.lease.controller import CONFLICT_RETRIES
from flexlease.api import keys
from flexlease.clock import ManualClock
from flexlease.errors import StoreError
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore
from tests.extender.lease.builders import gpunode, lease, pod
from tests.extender.lease.test_controller import (
    OWNER,
    add_lease,
    add_node,
    add_pod,
    events,
    eventually,
    get_lease,
    make_settings,
    phase_is,
    reasons,
    running,
    sample,
    tags,
)
from tests.store.faults import FaultyStore


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(datetime.now(UTC).replace(microsecond=0))


async def test_tag_writes_that_conflict_are_reread_and_retried(clock: ManualClock) -> None:
    store = FaultyStore(MemoryStore())
    await add_node(store, gpunode("n1"))
    conflicts = store.fail("patch", kind=Kind.GPUNODE, match=OWNER, times=CONFLICT_RETRIES - 1)
    gets_before = store.calls.get("get", 0)
    async with running(store, clock) as (_, registry):
        await add_lease(store, lease("lend", "Lend", devices=[("n1", i) for i in range(4)]))
        await eventually(phase_is(store, "lend", "Done"))
        assert conflicts.fired == CONFLICT_RETRIES - 1
        assert store.calls["get"] - gets_before >= CONFLICT_RETRIES - 1  # re-read before each retry
        assert sample(registry, "flexlease_lease_reconcile_errors_total", {"kind": "lease"}) == 0
    assert await tags(store, "n1") == {i: OWNER for i in range(4)}
    await store.close()


async def test_a_reconcile_that_keeps_conflicting_backs_off_on_the_clock(clock: ManualClock) -> None:
    store = FaultyStore(MemoryStore())
    await add_node(store, gpunode("n1"))
    # each reconcile re-plans CONFLICT_RETRIES times, each plan re-reads and retries the tag
    # write CONFLICT_RETRIES times: this many conflicts fail one reconcile
    failing = CONFLICT_RETRIES * CONFLICT_RETRIES
    conflicts = store.fail("patch", kind=Kind.GPUNODE, match=OWNER, times=failing)
    settings = make_settings(retry_base_seconds=30.0, retry_max_seconds=60.0)
    async with running(store, clock, settings) as (controller, registry):
        await add_lease(store, lease("lend", "Lend", devices=[("n1", 0)]))
        await eventually(
            lambda: _true(sample(registry, "flexlease_lease_reconcile_errors_total", {"kind": "lease"}) == 1)
        )
        assert conflicts.fired == failing
        await eventually(lambda: _true(controller.idle))  # nothing runs until the back-off ends
        assert (await get_lease(store, "lend")).get("status", {}).get("phase") != "Done"
        assert await tags(store, "n1") == {}
        await clock.advance(30)
        await eventually(phase_is(store, "lend", "Done"))
    assert await tags(store, "n1") == {0: OWNER}
    await store.close()


async def test_a_notice_that_conflicts_is_written_once_after_a_reread(clock: ManualClock) -> None:
    store = FaultyStore(MemoryStore())
    await add_node(store, gpunode("n1"))
    async with running(store, clock):
        await add_lease(store, lease("lend", "Lend", devices=[("n1", i) for i in range(4)]))
        await eventually(phase_is(store, "lend", "Done"))
        await add_pod(store, pod("lp-a", "n1", [0]))
        conflict = store.fail("patch", kind=Kind.POD, match=keys.ANN_PREEMPT_DEADLINE, times=2)
        await add_lease(store, lease("reclaim", "Reclaim", count=4, grace=30))

        async def noticed() -> bool:
            p = await store.get(Kind.POD, "lp-a", namespace="lp")
            return keys.ANN_PREEMPT_DEADLINE in p["metadata"].get("annotations", {})

        await eventually(noticed)
        await eventually(lambda: _has(store, "PreemptNotice"))
        assert conflict.fired == 2
        assert reasons(await events(store)).count("PreemptNotice") == 1
    await store.close()


async def test_a_failed_status_write_is_retried(clock: ManualClock) -> None:
    """The tags land before the status; the status write fails once (500), the reconcile is
    retried (here at once: the tag write changed the world, and a change re-queues the lease
    as client-go's work queue does) and completes without tagging twice."""
    store = FaultyStore(MemoryStore())
    await add_node(store, gpunode("n1"))
    failing = store.fail(
        "patch",
        kind=Kind.GPULEASE,
        match='"Done"',
        error=lambda: StoreError("etcdserver: request timed out", status=500),
    )
    async with running(store, clock, make_settings(retry_base_seconds=10.0)) as (_, registry):
        await add_lease(store, lease("lend", "Lend", devices=[("n1", 0)]))
        await eventually(
            lambda: _true(sample(registry, "flexlease_lease_reconcile_errors_total", {"kind": "lease"}) >= 1)
        )
        await clock.advance(10)
        await eventually(phase_is(store, "lend", "Done"))
        assert failing.fired == 1
    assert await tags(store, "n1") == {0: OWNER}
    await store.close()


async def _true(value: bool) -> bool:
    return value


async def _has(store: FaultyStore, reason: str) -> bool:
    await asyncio.sleep(0)
    return reason in reasons(await events(store))
