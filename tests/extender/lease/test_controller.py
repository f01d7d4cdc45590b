"""The lease controller against a real MemoryStore (and SqliteStore): lend, graceful reclaim,
standby supplement, restart mid-reclaim, PodDisruptionBudgets, idempotency, standby pool."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpClient

from extender.lease.controller import (
    CLUSTER_KEY,
    LEASE_CONTROLLER,
    LeaseController,
    cleanup_ctx,
    lease_key,
    serve,
)
from extender.lease.ledger import owner_ledger
from extender.lease.view import parse_time, read_holder
from flexlease.api import keys
from flexlease.api.resources import DeviceKey, parse_gpulease
from flexlease.clock import ManualClock, format_time
from flexlease.config import LeaseSettings, OrchestratorSettings, Settings, StandbySettings
from flexlease.errors import ProfileError
from flexlease.rightofreturn import Audit
from flexlease.store.base import Kind, Store
from flexlease.store.graceful import confirm_terminating
from flexlease.store.memory import MemoryStore
from flexlease.store.sqlite import SqliteStore
from tests.extender.lease.builders import A100, gpunode, lease, pdb, pod
from tests.store.faults import FaultyStore

OWNER = "online/rec"
CRDS = Path(__file__).resolve().parents[3] / "manifests" / "base" / "crds"


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    s = MemoryStore()
    yield s
    await s.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(datetime.now(UTC).replace(microsecond=0))


def make_settings(**lease_fields: Any) -> Settings:
    return Settings(lease=LeaseSettings(**lease_fields))


async def eventually(check: Callable[[], Awaitable[bool]], *, within: float = 10.0) -> None:
    """Wait (real time) until ``check()`` is true; fail after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not await check():
        if loop.time() > end:
            pytest.fail("condition not reached in time")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def running(
    store: Store, clock: ManualClock, settings: Settings | None = None
) -> AsyncIterator[tuple[LeaseController, CollectorRegistry]]:
    registry = CollectorRegistry()
    controller = LeaseController(
        settings or make_settings(), store, registry=registry, clock=clock, instance="test"
    )
    task = asyncio.create_task(controller.run(), name="lease-controller-under-test")
    try:
        await eventually(lambda: _true(controller.ready))
        yield controller, registry
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _true(value: bool) -> bool:
    return value


async def add_node(store: Store, obj: dict[str, Any]) -> None:
    status = obj.pop("status")
    created = await store.create(Kind.GPUNODE, obj)
    await store.patch(Kind.GPUNODE, created["metadata"]["name"], {"status": status}, subresource="status")


async def add_pod(store: Store, obj: dict[str, Any]) -> None:
    status = obj.pop("status")
    meta = obj["metadata"]
    await store.create(Kind.POD, obj)
    await store.patch(
        Kind.POD, meta["name"], {"status": status}, namespace=meta["namespace"], subresource="status"
    )


async def add_lease(store: Store, obj: dict[str, Any]) -> None:
    obj["metadata"].pop("creationTimestamp", None)
    await store.create(Kind.GPULEASE, obj)


async def get_lease(store: Store, name: str) -> dict[str, Any]:
    return await store.get(Kind.GPULEASE, name, namespace="online")


def phase_is(store: Store, name: str, phase: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return bool((await get_lease(store, name)).get("status", {}).get("phase") == phase)

    return check


async def tags(store: Store, node: str) -> dict[int, str | None]:
    obj = await store.get(Kind.GPUNODE, node)
    return {int(i): d.get("owner") for i, d in (obj["spec"].get("devices") or {}).items() if d.get("owner")}


async def pod_names(store: Store, namespace: str = "lp") -> set[str]:
    return {p["metadata"]["name"] for p in (await store.list(Kind.POD, namespace=namespace)).items}


async def events(store: Store) -> list[dict[str, Any]]:
    return (await store.list(Kind.EVENT)).items


def reasons(evts: list[dict[str, Any]], kind: str | None = None) -> list[str]:
    return [e["reason"] for e in evts if kind is None or e["involvedObject"]["kind"] == kind]


def sample(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float:
    value = registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


async def lend_four(store: Store) -> None:
    """The online job held n1:0-3, scaled down, and lent them (all HA)."""
    await add_lease(store, lease("lend", "Lend", devices=[("n1", i) for i in range(4)]))
    await eventually(phase_is(store, "lend", "Done"))
    assert await tags(store, "n1") == {i: OWNER for i in range(4)}


async def bind_owner(store: Store, name: str, node: str, indices: list[int]) -> None:
    await add_pod(store, pod(name, node, indices, namespace="online", priority="high", owner=OWNER))


def returned(status: dict[str, Any]) -> tuple[str, str]:
    """A Reclaim's condition ``Returned``: (status, reason)."""
    cond = next(c for c in status.get("conditions", []) if c["type"] == "Returned")
    return cond["status"], cond["reason"]


# --------------------------------------------------------------------------- scenarios


async def test_lend_then_reclaim_notifies_waits_the_grace_period_and_evicts(
    store: MemoryStore, clock: ManualClock
) -> None:
    await add_node(store, gpunode("n1", ["HA", "HA", "HA", "MA", "LA", "HA", "HA", "HA"]))
    audit = Audit()
    async with running(store, clock) as (controller, registry):
        await add_lease(store, lease("lend", "Lend", devices=[("n1", i) for i in range(5)]))
        await eventually(phase_is(store, "lend", "Done"))
        assert await audit_store(audit, store) == []
        assert await tags(store, "n1") == {0: OWNER, 1: OWNER, 2: OWNER, 3: OWNER}  # LA n1/4 untagged
        status = (await get_lease(store, "lend"))["status"]
        assert [(d["index"], d["tier"]) for d in status["lent"]] == [
            (0, "HA"),
            (1, "HA"),
            (2, "HA"),
            (3, "MA"),
        ]
        await eventually(
            lambda: _true(
                sample(registry, "flexlease_lease_lent_gpus", {"model": "NVIDIA H20", "tier": "HA"}) == 3
            )
        )

        # LP tenants use the lent GPUs
        await add_pod(store, pod("lp-a", "n1", [0, 1]))
        await add_pod(store, pod("lp-b", "n1", [2]))
        await add_pod(store, pod("lp-c", "n1", [5]))  # untagged GPU: left alone

        await add_lease(store, lease("reclaim", "Reclaim", count=4, grace=45))
        deadline = clock.now_utc() + timedelta(seconds=45)

        async def noticed() -> bool:
            pods = (await store.list(Kind.POD, namespace="lp")).items
            marks = {
                p["metadata"]["name"]: p["metadata"]["annotations"].get(keys.ANN_PREEMPT_DEADLINE)
                for p in pods
            }
            return marks["lp-a"] is not None and marks["lp-b"] is not None

        await eventually(noticed)
        lp = {p["metadata"]["name"]: p for p in (await store.list(Kind.POD, namespace="lp")).items}
        assert parse_time(lp["lp-a"]["metadata"]["annotations"][keys.ANN_PREEMPT_DEADLINE]) == deadline
        assert keys.ANN_PREEMPT_DEADLINE not in lp["lp-c"]["metadata"]["annotations"]
        notices = [e for e in await events(store) if e["reason"] == "PreemptNotice"]
        assert sorted(e["involvedObject"]["name"] for e in notices) == ["lp-a", "lp-b"]
        assert all(e["type"] == "Warning" and e["count"] == 1 and e["source"]["component"] for e in notices)
        status = (await get_lease(store, "reclaim"))["status"]
        assert status["phase"] == "InProgress" and status["preemptedPods"] == ["lp/lp-a", "lp/lp-b"]
        assert returned(status) == ("False", "GracePeriod")
        assert sample(registry, "flexlease_lease_outstanding_reclaims") == 1
        assert await audit_store(audit, store) == []

        await clock.advance(44)
        await eventually(lambda: _true(controller.idle))
        assert sample(registry, "flexlease_lease_evictions_total") == 0  # still in the grace period
        assert await _terminating_are(store, set())
        await clock.advance(1)
        # evicted: Terminating, still on their GPUs until the kubelet confirms
        await eventually(lambda: _terminating_are(store, {"lp-a", "lp-b"}))
        assert sample(registry, "flexlease_lease_evictions_total") == 2

        async def freed() -> bool:
            conds = (await get_lease(store, "reclaim"))["status"].get("conditions", [])
            return any(c["type"] == "GPUsFreed" and c["status"] == "True" for c in conds)

        await eventually(
            lambda: _true(
                all(controller.view().holders[f"lp/{n}"].terminating for n in ("lp-a", "lp-b"))
                and controller.idle
            )
        )
        assert not await freed()  # holders still Terminating: their GPUs are not free
        assert await confirm_terminating(store) == ["lp/lp-a", "lp/lp-b"]  # the kubelet
        await eventually(lambda: _pods_are(store, {"lp-c"}))
        await eventually(freed)
        assert await tags(store, "n1") == {i: OWNER for i in range(4)}  # still reserved for the owner
        # every target free, none held by the owner yet: not Done, and it says what it waits for
        await clock.advance(20)
        await eventually(lambda: _true(controller.idle))
        status = (await get_lease(store, "reclaim"))["status"]
        assert status["phase"] == "InProgress" and returned(status) == ("False", "WaitingForOwner")
        assert await audit_store(audit, store) == []

        await bind_owner(store, "rec-0", "n1", [0, 1, 2, 3])
        await eventually(phase_is(store, "reclaim", "Done"))
        assert await audit_store(audit, store) == []
        assert audit.tally("online/reclaim").back == 4
        status = (await get_lease(store, "reclaim"))["status"]
        assert [d["index"] for d in status["reclaimed"]] == [0, 1, 2, 3]
        assert returned(status) == ("True", "Returned")
        await eventually(lambda: _tags_are(store, "n1", {}))
        assert sample(registry, "flexlease_lease_reclaim_duration_seconds_count") == 1
        assert sample(registry, "flexlease_lease_reclaimed_gpus_total") == 4  # once each, not per reconcile
        assert sample(registry, "flexlease_lease_reclaim_duration_seconds_sum") >= 65
        lease_events = reasons(await events(store), "GPULease")
        assert lease_events.count("ReclaimDone") == 1 and "ReclaimStarted" in lease_events


async def _pods_are(store: Store, names: set[str]) -> bool:
    return await pod_names(store) == names


async def evicted_and_confirmed(store: Store, names: set[str]) -> None:
    """Wait until the LP pods ``names`` are evicted (Terminating), then confirm their
    deletion as their kubelet would, and wait until they are gone."""
    await eventually(lambda: _terminating_are(store, names))
    await confirm_terminating(store, namespace="lp")
    await eventually(lambda: _pods_are(store, set()))


async def _terminating_are(store: Store, names: set[str]) -> bool:
    pods = (await store.list(Kind.POD, namespace="lp")).items
    return {p["metadata"]["name"] for p in pods if p["metadata"].get("deletionTimestamp")} == names


async def _tags_are(store: Store, node: str, want: dict[int, str]) -> bool:
    return await tags(store, node) == want


async def test_failed_gpu_is_supplemented_from_standby(store: MemoryStore, clock: ManualClock) -> None:
    await add_node(store, gpunode("n1"))
    await add_node(store, gpunode("s1", ["MA", "MA", "HA", "HA", "HA", "HA", "HA", "HA"], pool="standby"))
    await add_node(store, gpunode("s2", "HA", model="NVIDIA A100-SXM4-80GB", pool="standby"))
    audit = Audit()
    async with running(store, clock) as (controller, registry):
        await lend_four(store)
        assert await audit_store(audit, store) == []
        # the node agent reports n1/2 failed (and downgrades its tier at once)
        await store.patch(
            Kind.GPUNODE,
            "n1",
            {"status": {"devices": {"2": {"health": "Unhealthy", "tier": "LA", "lastXid": 79}}}},
            subresource="status",
        )
        await add_lease(store, lease("reclaim", "Reclaim", count=4))

        async def supplemented() -> bool:
            return bool((await get_lease(store, "reclaim")).get("status", {}).get("supplementedFromStandby"))

        await eventually(supplemented)
        [sup] = (await get_lease(store, "reclaim"))["status"]["supplementedFromStandby"]
        assert sup["original"] == {"node": "n1", "index": 2}
        # same type, tier >= HA (the lend-time tier), not the cheaper MA ones
        assert (sup["replacement"]["node"], sup["replacement"]["index"], sup["replacement"]["tier"]) == (
            "s1",
            2,
            "HA",
        )
        assert await tags(store, "s1") == {2: OWNER}
        assert await tags(store, "n1") == {0: OWNER, 1: OWNER, 3: OWNER}
        assert "Supplemented" in reasons(await events(store), "GPULease")
        assert sample(registry, "flexlease_lease_standby_supplements_total") == 1

        await eventually(lambda: _true(controller.idle))
        assert await audit_store(audit, store) == []
        await bind_owner(store, "rec-0", "n1", [0, 1, 3])
        await bind_owner(store, "rec-1", "s1", [2])
        await eventually(phase_is(store, "reclaim", "Done"))
        await eventually(lambda: _tags_are(store, "s1", {}))
        assert await audit_store(audit, store) == []
        tally = audit.tally("online/reclaim")
        assert (tally.back, tally.replaced, tally.unrecoverable) == (3, 1, 0)
        # the three healthy GPUs came back; the failed one's replacement is a supplement
        assert sample(registry, "flexlease_lease_reclaimed_gpus_total") == 3


async def test_restarted_controller_finishes_a_reclaim_mid_grace_period(
    store: MemoryStore, clock: ManualClock
) -> None:
    await add_node(store, gpunode("n1"))
    async with running(store, clock):
        await lend_four(store)
        await add_pod(store, pod("lp-a", "n1", [0, 1, 2, 3]))
        await add_lease(store, lease("reclaim", "Reclaim", count=4, grace=30))

        async def noticed() -> bool:
            p = await store.get(Kind.POD, "lp-a", namespace="lp")
            return keys.ANN_PREEMPT_DEADLINE in p["metadata"]["annotations"]

        await eventually(noticed)
    first = (await store.get(Kind.POD, "lp-a", namespace="lp"))["metadata"]["annotations"][
        keys.ANN_PREEMPT_DEADLINE
    ]
    notices_before = reasons(await events(store)).count("PreemptNotice")

    await clock.advance(31)  # the grace period ends while no controller runs
    async with running(store, clock):  # a new process: nothing in memory
        await evicted_and_confirmed(store, {"lp-a"})
        await bind_owner(store, "rec-0", "n1", [0, 1, 2, 3])
        await eventually(phase_is(store, "reclaim", "Done"))
    assert reasons(await events(store)).count("PreemptNotice") == notices_before == 1  # not noticed twice
    assert first  # the deadline written before the restart was the one honoured
    status = (await get_lease(store, "reclaim"))["status"]
    assert status["preemptedPods"] == ["lp/lp-a"] and len(status["reclaimed"]) == 4


async def test_a_pdb_delays_the_eviction_until_it_allows_it(store: MemoryStore, clock: ManualClock) -> None:
    await add_node(store, gpunode("n1"))
    async with running(store, clock, make_settings(eviction_retry_seconds=5)) as (_, registry):
        await lend_four(store)
        await add_pod(store, pod("lp-a", "n1", [0], labels={"app": "batch"}))
        await store.create(Kind.PDB, pdb("batch", namespace="lp", match={"app": "batch"}, allowed=0))
        await add_lease(store, lease("reclaim", "Reclaim", devices=[("n1", 0)], grace=30))
        await eventually(lambda: _has_reason(store, "PreemptNotice"))
        await clock.advance(30)

        async def blocked() -> bool:
            conds = (await get_lease(store, "reclaim"))["status"].get("conditions", [])
            return any(c["reason"] == "EvictionBlocked" for c in conds)

        await eventually(blocked)
        assert await pod_names(store) == {"lp-a"}
        assert sample(registry, "flexlease_lease_evictions_refused_total") >= 1
        assert "EvictionBlocked" in reasons(await events(store), "Pod")
        status = (await get_lease(store, "reclaim"))["status"]
        assert "refused by a PodDisruptionBudget" in status["message"]

        refused = sample(registry, "flexlease_lease_evictions_refused_total")
        await clock.advance(5)  # retried, refused again
        await eventually(lambda: _true(sample(registry, "flexlease_lease_evictions_refused_total") > refused))
        assert reasons(await events(store), "Pod").count("EvictionBlocked") == 1  # warned once

        await store.patch(Kind.PDB, "batch", {"status": {"disruptionsAllowed": 1}}, namespace="lp")
        await clock.advance(5)
        await evicted_and_confirmed(store, {"lp-a"})
        await bind_owner(store, "rec-0", "n1", [0])
        await eventually(phase_is(store, "reclaim", "Done"))


async def _has_reason(store: Store, reason: str) -> bool:
    return reason in reasons(await events(store))


async def test_repeated_reconciles_write_nothing_new(store: MemoryStore, clock: ManualClock) -> None:
    await add_node(store, gpunode("n1"))
    async with running(store, clock) as (controller, _):
        await lend_four(store)
        await add_pod(store, pod("lp-a", "n1", [0]))
        await add_lease(store, lease("reclaim", "Reclaim", count=4))
        await eventually(lambda: _has_reason(store, "PreemptNotice"))
        await asyncio.sleep(0.05)
        revision = store.revision
        n_events = len(await events(store))
        for _ in range(3):
            for key in (lease_key("online", "reclaim"), lease_key("online", "lend"), CLUSTER_KEY):
                await controller.reconcile(key)
        assert store.revision == revision and len(await events(store)) == n_events


async def test_invalid_lease_fails_with_a_message(store: MemoryStore, clock: ManualClock) -> None:
    async with running(store, clock):
        bad = lease("bad", "Reclaim", count=1)
        bad["spec"]["gracePeriodSeconds"] = 5
        await add_lease(store, bad)
        await eventually(phase_is(store, "bad", "Failed"))
        status = (await get_lease(store, "bad"))["status"]
        assert "gracePeriodSeconds" in status["message"]
        assert "InvalidSpec" in reasons(await events(store))


async def test_standby_pool_is_kept_at_its_size_with_whole_free_nodes(
    store: MemoryStore, clock: ManualClock
) -> None:
    await add_node(store, gpunode("busy"))
    await add_node(store, gpunode("free-la", "LA"))
    await add_node(store, gpunode("free-ha", "HA"))
    await add_pod(store, pod("lp-a", "busy", [0]))
    async with running(store, clock, make_settings(standby_pool_size=8)) as (_, registry):

        async def pool_of(node: str) -> str:
            return str((await store.get(Kind.GPUNODE, node))["spec"]["pool"])

        async def standby_ready() -> bool:
            return await pool_of("free-ha") == "standby"

        await eventually(standby_ready)
        assert await pool_of("free-la") == "general" and await pool_of("busy") == "general"
        await eventually(
            lambda: _true(
                sample(registry, "flexlease_lease_standby_gpus", {"model": "NVIDIA H20", "tier": "HA"}) == 8
            )
        )
        assert "StandbyPool" in reasons(await events(store), "GPUNode")


async def add_done_reclaim(
    store: Store, name: str, *, at: datetime, lent: list[tuple[str, int]], short: list[tuple[str, int]]
) -> None:
    """A Reclaim as the lease controller leaves it Done: ``lent`` targets, ``short`` of them
    replaced from the standby pool, the ``Returned`` condition at ``at``."""
    await add_lease(store, lease(name, "Reclaim", count=len(lent)))

    def dev(node: str, index: int) -> dict[str, Any]:
        return {"node": node, "index": index, "model": "NVIDIA H20", "tier": "HA"}

    status = {
        "phase": "Done",
        "lent": [dev(n, i) for n, i in lent],
        "reclaimed": [dev(n, i) for n, i in lent if (n, i) not in short],
        "supplementedFromStandby": [
            {"original": dev(n, i), "replacement": dev("gone", k), "returned": True}
            for k, (n, i) in enumerate(short)
        ],
        "conditions": [
            {
                "type": "Returned",
                "status": "True",
                "reason": "Returned",
                "lastTransitionTime": format_time(at),
            }
        ],
    }
    await store.patch(Kind.GPULEASE, name, {"status": status}, namespace="online", subresource="status")


async def test_adaptive_standby_pool_follows_the_done_reclaims_shortfalls(
    store: MemoryStore, clock: ManualClock
) -> None:
    day = 86400.0
    await add_node(store, gpunode("h-ma", "MA", count=4))
    await add_node(store, gpunode("h-ha", "HA", count=4))
    await add_node(store, gpunode("a", "HA", model=A100, count=4))
    lent = [("old", i) for i in range(4)]
    await add_done_reclaim(store, "r1", at=clock.now_utc() - timedelta(hours=1), lent=lent, short=lent[:3])
    await add_done_reclaim(store, "r2", at=clock.now_utc() - timedelta(hours=2), lent=lent, short=[])
    adaptive = StandbySettings(mode="adaptive", window_seconds=7 * day, hold_seconds=day)
    # the fixed size is not used; resync twice a day (the clock jumps days ahead)
    settings = make_settings(standby=adaptive, standby_pool_size=100, resync_seconds=day / 2)

    async def pool_of(node: str) -> str:
        return str((await store.get(Kind.GPUNODE, node))["spec"]["pool"])

    target = {"model": "NVIDIA H20"}
    async with running(store, clock, settings) as (_, registry):
        await eventually(lambda: _has_pool(store, "h-ha", "standby"))
        assert await pool_of("h-ma") == "general" and await pool_of("a") == "general"
        await eventually(lambda: _true(sample(registry, "flexlease_lease_standby_target_gpus", target) == 3))
        assert sample(registry, "flexlease_lease_standby_shortfall_gpus", target) == 3
        assert sample(registry, "flexlease_lease_standby_target_gpus", {"model": A100}) == 0
        pool_events = [e["message"] for e in await events(store) if e["reason"] == "StandbyPool"]
        assert pool_events == [
            "node joined the standby pool with 4 spare GPUs (target NVIDIA H20: p99 of 2 Reclaim shortfall(s)"
            " in 7d = 3 GPU(s) (largest 3) + floor 0 = 3)"
        ]
    # a restarted controller derives the same target from the same leases: nothing moves
    async with running(store, clock, settings) as (controller, registry):
        await eventually(lambda: _true(sample(registry, "flexlease_lease_standby_target_gpus", target) == 3))
        assert controller.idle and await pool_of("h-ha") == "standby" and await pool_of("h-ma") == "general"
        # past the window the target is 0, but the hold keeps the node for another day
        await clock.advance(7 * day + 60)
        await eventually(lambda: _true(sample(registry, "flexlease_lease_standby_target_gpus", target) == 0))
        assert await pool_of("h-ha") == "standby"
        await clock.advance(day)
        await eventually(lambda: _has_pool(store, "h-ha", "general"))
    assert len([e for e in await events(store) if e["reason"] == "StandbyPool"]) == 2


async def _has_pool(store: Store, node: str, pool: str) -> bool:
    return bool((await store.get(Kind.GPUNODE, node))["spec"]["pool"] == pool)


async def test_lend_and_reclaim_on_sqlite(tmp_path: Path, clock: ManualClock) -> None:
    sqlite = SqliteStore(tmp_path / "state.db", poll_seconds=0.01)
    try:
        await add_node(sqlite, gpunode("n1"))
        async with running(sqlite, clock):
            await lend_four(sqlite)
            await add_pod(sqlite, pod("lp-a", "n1", [1]))
            await add_lease(sqlite, lease("reclaim", "Reclaim", count=4, grace=30))
            await eventually(lambda: _has_reason(sqlite, "PreemptNotice"))
            await clock.advance(30)
            await evicted_and_confirmed(sqlite, {"lp-a"})
            await bind_owner(sqlite, "rec-0", "n1", [0, 1, 2, 3])
            await eventually(phase_is(sqlite, "reclaim", "Done"))
    finally:
        await sqlite.close()


async def test_cleanup_ctx_runs_the_controller_for_the_apps_lifetime(
    aiohttp_client: AiohttpClient, store: MemoryStore, clock: ManualClock
) -> None:
    await add_node(store, gpunode("n1"))
    app = web.Application()
    app.cleanup_ctx.append(cleanup_ctx(make_settings(), store, registry=CollectorRegistry(), clock=clock))
    client = await aiohttp_client(app)
    controller = app[LEASE_CONTROLLER]
    await eventually(lambda: _true(controller.ready))
    await lend_four(store)
    await client.close()
    tasks = [t.get_name() for t in asyncio.all_tasks()]
    assert "lease-controller" not in tasks


async def test_cleanup_ctx_runs_nothing_when_disabled(
    aiohttp_client: AiohttpClient, store: MemoryStore
) -> None:
    app = web.Application()
    app.cleanup_ctx.append(cleanup_ctx(make_settings(enabled=False), store, registry=CollectorRegistry()))
    client = await aiohttp_client(app)
    assert LEASE_CONTROLLER not in app
    await client.close()


async def test_every_write_of_the_controller_passes_the_crd_schemas_unpruned(clock: ManualClock) -> None:
    """Each GPUNode/GPULease the controller creates or patches is checked, as it is written,
    against the CRDs: nothing the API server would refuse (422) or prune."""
    store = FaultyStore(MemoryStore(), check_crds=True)
    await add_node(store, gpunode("n1"))
    await add_node(store, gpunode("s1", pool="standby"))
    written_by_test = store.crd_checked
    async with running(store, clock):
        await lend_four(store)
        await add_pod(store, pod("lp-a", "n1", [0]))
        await store.patch(
            Kind.GPUNODE, "n1", {"status": {"devices": {"3": {"health": "Unhealthy"}}}}, subresource="status"
        )
        await add_lease(store, lease("reclaim", "Reclaim", count=4))

        async def progressed() -> bool:
            status = (await get_lease(store, "reclaim")).get("status", {})
            return bool(status.get("supplementedFromStandby")) and bool(status.get("preemptedPods"))

        await eventually(progressed)
    assert store.crd_violations == []
    assert store.crd_checked - written_by_test >= 6  # lend tags, lease statuses, standby supplement
    await store.close()


async def test_with_leader_election_only_the_leader_reconciles_and_a_successor_takes_over(
    store: MemoryStore, clock: ManualClock
) -> None:
    settings = make_settings(leader_election=True, leader_lease_seconds=1.5)
    await add_node(store, gpunode("n1"))
    a = LeaseController(settings, store, registry=CollectorRegistry(), clock=clock, instance="a")
    b = LeaseController(settings, store, registry=CollectorRegistry(), clock=clock, instance="b")
    task_a = asyncio.create_task(serve(a, settings, store=store, instance="a"), name="serve-a")
    await eventually(lambda: _true(a.ready))
    task_b = asyncio.create_task(serve(b, settings, store=store, instance="b"), name="serve-b")
    try:
        await lend_four(store)
        assert not b.ready  # never started: not the leader
        task_a.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task_a  # releases the Lease
        await eventually(lambda: _true(b.ready))
        await add_lease(store, lease("reclaim", "Reclaim", count=4))
        await bind_owner(store, "rec-0", "n1", [0, 1, 2, 3])
        await eventually(phase_is(store, "reclaim", "Done"))
        held = await store.get(Kind.LEASE, "flexlease-extender", namespace="flexlease-system")
        assert held["spec"]["holderIdentity"] == "b"
    finally:
        for task in (task_a, task_b):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_gpus_of_a_vanished_gpunode_are_supplemented_from_the_lend_record(
    store: MemoryStore, clock: ManualClock
) -> None:
    await add_node(store, gpunode("n1"))
    await add_node(store, gpunode("s1", ["MA", "MA", "HA", "HA", "HA", "HA", "HA", "HA"], pool="standby"))
    audit = Audit()
    async with running(store, clock):
        await lend_four(store)
        assert await audit_store(audit, store) == []
        await store.delete(Kind.GPUNODE, "n1")  # the node is decommissioned while lent
        await add_lease(store, lease("reclaim", "Reclaim", count=4))

        async def four_supplements() -> bool:
            status = (await get_lease(store, "reclaim")).get("status", {})
            return len(status.get("supplementedFromStandby", [])) == 4

        await eventually(four_supplements)
        status = (await get_lease(store, "reclaim"))["status"]
        replacements = sorted(s["replacement"]["index"] for s in status["supplementedFromStandby"])
        assert replacements == [2, 3, 4, 5]  # HA, like the originals at lend time; never the MA ones
        await bind_owner(store, "rec-0", "s1", [2, 3, 4, 5])
        await eventually(phase_is(store, "reclaim", "Done"))
        assert await audit_store(audit, store) == []
        assert audit.tally("online/reclaim").replaced == 4


USER_PROFILE = """\
apiVersion: flexlease.io/v1alpha1
kind: FrameworkProfile
name: horovod-elastic
roles:
  driver: {critical: true}
  worker: {}
commands:
  - name: launch
    role: driver
    run: [horovodrun, --host-discovery-script, /app/hosts.sh, python, train.py]
    preconditions: [{ready: worker}]
"""


async def test_a_user_profiles_critical_pod_keeps_its_lent_gpu(
    store: MemoryStore, clock: ManualClock, tmp_path: Path
) -> None:
    """Coordinator protection with a profile from ``orchestrator.profile_dirs``: the LP job's
    driver is never noticed or evicted; its lent GPU is replaced from the standby pool."""
    (tmp_path / "horovod.yaml").write_text(USER_PROFILE)
    settings = Settings(orchestrator=OrchestratorSettings(profile_dirs=(tmp_path,)))
    await add_node(store, gpunode("n1", "HA", count=2))
    await add_node(store, gpunode("s1", "HA", count=1, pool="standby"))
    async with running(store, clock, settings):
        await add_lease(store, lease("lend", "Lend", devices=[("n1", 0), ("n1", 1)]))
        await eventually(phase_is(store, "lend", "Done"))
        role = {keys.LABEL_FRAMEWORK: "horovod-elastic"}
        await add_pod(store, pod("driver", "n1", [0], labels={**role, keys.LABEL_ROLE: "driver"}))
        await add_pod(store, pod("worker", "n1", [1], labels={**role, keys.LABEL_ROLE: "worker"}))
        await add_lease(store, lease("reclaim", "Reclaim", count=2, grace=30))

        async def supplemented() -> bool:
            status = (await get_lease(store, "reclaim")).get("status", {})
            return bool(status.get("supplementedFromStandby"))

        await eventually(supplemented)
        await clock.advance(31)
        await eventually(lambda: _terminating_are(store, {"worker"}))
        await confirm_terminating(store, namespace="lp")  # the worker's kubelet
        await eventually(lambda: _pods_are(store, {"driver"}))
        status = (await get_lease(store, "reclaim"))["status"]
        assert status["preemptedPods"] == ["lp/worker"]
        assert [
            (s["original"]["node"], s["replacement"]["node"]) for s in status["supplementedFromStandby"]
        ] == [("n1", "s1")]


def test_a_malformed_user_profile_stops_the_controller_at_start(store: MemoryStore, tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(USER_PROFILE.replace("ready: worker", "ready: workers"))
    settings = Settings(orchestrator=OrchestratorSettings(profile_dirs=(tmp_path,)))
    with pytest.raises(
        ProfileError,
        match=r"bad\.yaml:11:29: commands\[0\]\.preconditions\[0\]\.ready: unknown role 'workers'",
    ):
        LeaseController(settings, store, registry=CollectorRegistry())


async def test_open_lease_keys_follow_every_lease_change(store: MemoryStore, clock: ManualClock) -> None:
    """Every pod change enqueues the leases not yet Done or Failed; the controller keeps that
    list until the lease mirror changes. It must always equal the list made from scratch."""

    def from_scratch(controller: LeaseController) -> list[str]:
        return [
            lease_key(o["metadata"]["namespace"], o["metadata"]["name"])
            for o in controller._leases.values()
            if (o.get("status") or {}).get("phase") not in ("Done", "Failed")
        ]

    async with running(store, clock) as (controller, _):
        assert controller._open_lease_keys() == from_scratch(controller) == []
        assert controller._ledger(OWNER, exclude="a") == owner_ledger([], OWNER)
        for name in ("a", "b", "c"):
            await add_lease(store, lease(name, "Reclaim", count=1))
        await eventually(lambda: _true(len(controller._leases.values()) == 3))
        await store.patch(
            Kind.GPULEASE, "b", {"status": {"phase": "Failed"}}, namespace="online", subresource="status"
        )
        await store.delete(Kind.GPULEASE, "c", namespace="online")
        await eventually(lambda: _true(len(controller._leases.values()) == 2))
        await eventually(
            lambda: _true(all(o.get("status", {}).get("phase") for o in controller._leases.values()))
        )
        assert controller._open_lease_keys() == from_scratch(controller)
        for exclude in ("a", "b", "zzz"):  # the ledger kept per mirror generation, too
            assert controller._ledger(OWNER, exclude=exclude) == owner_ledger(
                controller._parsed_leases(), OWNER, exclude=exclude
            )
        assert lease_key("online", "b") not in controller._open_lease_keys()
        assert lease_key("online", "c") not in controller._open_lease_keys()


async def test_cluster_reconciles_keep_the_configured_interval(
    store: MemoryStore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lease.cluster_min_interval_seconds``: a cluster reconcile asked for sooner is put off
    until the interval has passed (the delay is returned for the work queue), not run."""
    controller = LeaseController(
        make_settings(cluster_min_interval_seconds=1.0), store, registry=CollectorRegistry(), clock=clock
    )
    ran: list[float] = []

    async def reconcile_cluster() -> None:
        ran.append(clock.now())

    monkeypatch.setattr(controller, "_reconcile_cluster", reconcile_cluster)
    assert await controller.reconcile(CLUSTER_KEY) is None
    assert await controller.reconcile(CLUSTER_KEY) == pytest.approx(1.0)
    await clock.advance(0.4)
    assert await controller.reconcile(CLUSTER_KEY) == pytest.approx(0.6)
    assert len(ran) == 1
    await clock.advance(0.6)
    assert await controller.reconcile(CLUSTER_KEY) is None
    assert ran == [pytest.approx(ran[0]), pytest.approx(ran[0] + 1.0)]

    every = LeaseController(make_settings(), store, registry=CollectorRegistry(), clock=clock)
    monkeypatch.setattr(every, "_reconcile_cluster", reconcile_cluster)
    assert [await every.reconcile(CLUSTER_KEY) for _ in range(3)] == [None, None, None]
    assert len(ran) == 5


# --------------------------------------------------------------------------- right-of-return at the edges (#38)


async def audit_store(audit: Audit, store: Store) -> list[str]:
    """One observation of the right-of-return invariants (:mod:`flexlease.rightofreturn`) from
    the store: every GPULease, the GPUNodes' tags and the owner of each pod's GPUs."""
    leases = [parse_gpulease(o) for o in (await store.list(Kind.GPULEASE)).items]
    nodes = (await store.list(Kind.GPUNODE)).items
    tagged = {
        DeviceKey(n["metadata"]["name"], int(i)): str(d["owner"])
        for n in nodes
        for i, d in (n["spec"].get("devices") or {}).items()
        if (d or {}).get("owner")
    }
    holders: dict[DeviceKey, str | None] = {}
    for obj in (await store.list(Kind.POD)).items:
        holder = read_holder(obj)
        if holder is not None and not holder.terminating:
            holders.update(dict.fromkeys(holder.devices, holder.owner))
    found = audit.observe(leases, tags=tagged, holders=holders, nodes={n["metadata"]["name"] for n in nodes})
    return [f"{v.invariant}: {v.detail}" for v in found]


async def settled(controller: LeaseController, audit: Audit, store: Store) -> None:
    """Wait until the controller has nothing to do, then check the invariants."""
    await eventually(lambda: _true(controller.idle))
    assert await audit_store(audit, store) == []


@pytest.fixture
async def clocked(clock: ManualClock) -> AsyncIterator[MemoryStore]:
    """A store whose creationTimestamps come from the test's clock (leases are ordered by them)."""
    s = MemoryStore(clock=clock)
    yield s
    await s.close()


async def test_a_lend_during_an_open_reclaim_cancels_it_and_the_next_reclaim_takes_every_lent_gpu(
    clocked: MemoryStore, clock: ManualClock
) -> None:
    """#38: the job scales up, then down again while its Reclaim still waits for an LP pod's
    grace period, then up again. The second Lend supersedes the open Reclaim, which is
    Cancelled and hands back the GPU it had not brought back; the next Reclaim takes every
    lent GPU (on the old code it claimed none and was Done at once, the first Reclaim still
    holding the claim)."""
    store, audit = clocked, Audit()
    await add_node(store, gpunode("n1"))
    async with running(store, clock) as (controller, registry):
        await add_lease(store, lease("a-lend", "Lend", devices=[("n1", i) for i in range(4)]))
        await eventually(phase_is(store, "a-lend", "Done"))
        await add_pod(store, pod("lp-a", "n1", [3]))
        await settled(controller, audit, store)
        await clock.advance(60)
        await add_lease(store, lease("b-reclaim", "Reclaim", count=4, grace=30))
        await eventually(lambda: _has_reason(store, "PreemptNotice"))
        await bind_owner(store, "rec-0", "n1", [0, 1, 2])
        await settled(controller, audit, store)
        assert (await get_lease(store, "b-reclaim"))["status"]["phase"] == "InProgress"

        await clock.advance(10)  # traffic falls again within the grace period
        await store.delete(Kind.POD, "rec-0", namespace="online")
        await confirm_terminating(store, namespace="online")
        await add_lease(store, lease("c-lend", "Lend", devices=[("n1", i) for i in range(3)]))
        await eventually(phase_is(store, "c-lend", "Done"))
        await settled(controller, audit, store)

        await clock.advance(60)  # and up again
        await add_lease(store, lease("d-reclaim", "Reclaim", count=4, grace=30))

        async def accepted() -> bool:
            return (await get_lease(store, "d-reclaim")).get("status", {}).get("phase") not in (
                None,
                "Pending",
            )

        await eventually(accepted)
        await settled(controller, audit, store)  # the old code: reclaim_skipped_lent_gpus
        new = (await get_lease(store, "d-reclaim"))["status"]
        assert sorted(d["index"] for d in new["lent"]) == [0, 1, 2, 3] and new["phase"] == "InProgress"
        old = (await get_lease(store, "b-reclaim"))["status"]
        assert old["phase"] == "Cancelled" and old["supersededBy"] == "c-lend"
        assert [(d["node"], d["index"]) for d in old["stillLent"]] == [("n1", 3)]
        assert await tags(store, "n1") == {i: OWNER for i in range(4)}
        assert "ReclaimCancelled" in reasons(await events(store), "GPULease")
        cancelled = {"action": "Reclaim", "phase": "Cancelled"}
        assert sample(registry, "flexlease_lease_superseded_total", cancelled) == 1
        await clock.advance(31)
        await evicted_and_confirmed(store, {"lp-a"})
        await bind_owner(store, "rec-1", "n1", [0, 1, 2, 3])
        await eventually(phase_is(store, "d-reclaim", "Done"))
        await settled(controller, audit, store)
        assert audit.tally("online/d-reclaim").back == 4 and audit.tally("online/d-reclaim").carried_in == 1


async def test_a_reclaim_right_after_a_count_lend_waits_for_it_and_takes_what_it_lent(
    clocked: MemoryStore, clock: ManualClock
) -> None:
    """The job asks to lend 3 GPUs (count) and has released two when traffic rises again: the
    Reclaim waits for the Lend, which lends what was released and is Cancelled for the rest
    (status says so); the Reclaim then takes both lent GPUs back through the usual path."""
    store, audit = clocked, Audit()
    await add_node(store, gpunode("n1"))
    await bind_owner(store, "rec-a", "n1", [0, 1])
    await bind_owner(store, "rec-b", "n1", [2])
    await bind_owner(store, "rec-c", "n1", [3])
    async with running(store, clock) as (controller, _):
        await add_lease(store, lease("a-lend", "Lend", count=3))
        await eventually(phase_is(store, "a-lend", "InProgress"))
        await store.delete(Kind.POD, "rec-a", namespace="online")
        await confirm_terminating(store, namespace="online")
        await eventually(lambda: _tags_are(store, "n1", {0: OWNER, 1: OWNER}))
        await settled(controller, audit, store)
        assert (await get_lease(store, "a-lend"))["status"]["phase"] == "InProgress"  # one more to go
        await clock.advance(60)
        await add_lease(store, lease("b-reclaim", "Reclaim", count=8))
        await eventually(phase_is(store, "a-lend", "Cancelled"))
        await eventually(phase_is(store, "b-reclaim", "InProgress"))
        await settled(controller, audit, store)
        lend = (await get_lease(store, "a-lend"))["status"]
        assert lend["supersededBy"] == "b-reclaim" and [d["index"] for d in lend["lent"]] == [0, 1]
        superseded = next(c for c in lend["conditions"] if c["type"] == "Superseded")
        assert (
            superseded["reason"] == "Cancelled"
            and "1 GPUs its owner's pods did not release" in lend["message"]
        )
        reclaim = (await get_lease(store, "b-reclaim"))["status"]
        assert sorted(d["index"] for d in reclaim["lent"]) == [0, 1]
        await bind_owner(store, "rec-d", "n1", [0, 1])
        await eventually(phase_is(store, "b-reclaim", "Done"))
        await settled(controller, audit, store)
        assert reasons(await events(store), "GPULease").count("LendCancelled") == 1


async def test_a_standby_supplement_is_lent_in_kind_and_reclaimed_as_another_standby_gpu(
    clocked: MemoryStore, clock: ManualClock
) -> None:
    """The job holds standby s1/0 (a supplement) and n1/0 and lends both: s1/0 goes back to the
    standby pool untagged (lent in kind). Another job's reclaim pod takes it meanwhile; the
    next Reclaim replaces it with s1/1, of the same model and tier."""
    store, audit = clocked, Audit()
    await add_node(store, gpunode("n1"))
    await add_node(store, gpunode("s1", pool="standby"))
    async with running(store, clock) as (controller, _):
        await add_lease(store, lease("a-lend", "Lend", devices=[("n1", 0), ("s1", 0)]))
        await eventually(phase_is(store, "a-lend", "Done"))
        await settled(controller, audit, store)
        status = (await get_lease(store, "a-lend"))["status"]
        assert [(d["node"], d.get("inKind")) for d in status["lent"]] == [("n1", None), ("s1", True)]
        assert await tags(store, "n1") == {0: OWNER} and await tags(store, "s1") == {}
        other = pod("other-rec", "s1", [0], namespace="team", priority="high", owner="team/x")
        await add_pod(store, other)
        await settled(controller, audit, store)
        await clock.advance(60)
        await add_lease(store, lease("b-reclaim", "Reclaim", count=2))
        await eventually(phase_is(store, "b-reclaim", "InProgress"))
        [sup] = (await get_lease(store, "b-reclaim"))["status"]["supplementedFromStandby"]
        assert (sup["original"]["node"], sup["replacement"]["node"], sup["replacement"]["index"]) == (
            "s1",
            "s1",
            1,
        )
        await settled(controller, audit, store)
        await bind_owner(store, "rec-0", "n1", [0])
        await bind_owner(store, "rec-1", "s1", [1])
        await eventually(phase_is(store, "b-reclaim", "Done"))
        await settled(controller, audit, store)
        assert (audit.tally("online/b-reclaim").back, audit.tally("online/b-reclaim").replaced) == (1, 1)


async def test_a_gpu_failing_during_a_lend_without_its_model_in_standby_is_unrecoverable(
    clocked: MemoryStore, clock: ManualClock
) -> None:
    """A mixed cluster: the job lent two H20s and an A100; one of each fails while lent. The
    H20 is replaced from the H20 standby node; no standby GPU is an A100, so after
    ``standby_wait_seconds`` (600 s) the A100 is listed unrecoverable (NoStandbyOfModel, an Event, a
    metric), its tag released, and the Reclaim is Done once the rest is back."""
    store, audit = clocked, Audit()
    await add_node(store, gpunode("n1"))
    await add_node(store, gpunode("n2", model=A100))
    await add_node(store, gpunode("s1", pool="standby"))
    async with running(store, clock) as (controller, registry):  # standby_wait_seconds: 600
        await add_lease(store, lease("a-lend", "Lend", devices=[("n1", 0), ("n1", 1), ("n2", 0)]))
        await eventually(phase_is(store, "a-lend", "Done"))
        for node, index in (("n1", 1), ("n2", 0)):
            await store.patch(
                Kind.GPUNODE,
                node,
                {"status": {"devices": {str(index): {"health": "Unhealthy", "tier": "LA", "lastXid": 79}}}},
                subresource="status",
            )
        await settled(controller, audit, store)
        await clock.advance(60)
        await add_lease(store, lease("b-reclaim", "Reclaim", count=3))
        await eventually(phase_is(store, "b-reclaim", "InProgress"))
        await bind_owner(store, "rec-0", "n1", [0])
        await settled(controller, audit, store)
        status = (await get_lease(store, "b-reclaim"))["status"]
        assert [s["replacement"]["node"] for s in status["supplementedFromStandby"]] == ["s1"]
        assert returned(status) == ("False", "StandbyShortfall")
        await clock.advance(600)
        await eventually(lambda: _has_reason(store, "Unrecoverable"))
        await settled(controller, audit, store)
        status = (await get_lease(store, "b-reclaim"))["status"]
        assert status["phase"] == "InProgress"  # the H20 replacement is not held yet
        [gone] = status["unrecoverable"]
        assert (gone["node"], gone["index"], gone["reason"], gone["model"]) == (
            "n2",
            0,
            "NoStandbyOfModel",
            A100,
        )
        assert await tags(store, "n2") == {}
        assert (
            sample(registry, "flexlease_lease_unrecoverable_gpus_total", {"reason": "NoStandbyOfModel"}) == 1
        )
        replacement = status["supplementedFromStandby"][0]["replacement"]
        await bind_owner(store, "rec-1", "s1", [replacement["index"]])
        await eventually(phase_is(store, "b-reclaim", "Done"))
        await settled(controller, audit, store)
        tally = audit.tally("online/b-reclaim")
        assert (tally.back, tally.replaced, tally.unrecoverable) == (1, 1, 1)
