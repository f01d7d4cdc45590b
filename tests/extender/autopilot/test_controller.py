"""The autopilot's controller against a real MemoryStore (every custom resource it writes checked
against its CRD), beside the real lease controller: a day of a schedule lends and reclaims
through GPULeases; the lead time starts a Reclaim early; a dry run writes no lease; never two
leases of an owner in flight; critical pods' GPUs are never lent; a restart after a lost status
write neither doubles a lease nor reuses a name; invalid policies are reported."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from extender.autopilot.controller import AutopilotController, created_within_second, in_flight, policy_key
from extender.lease.controller import LeaseController
from flexlease.api import keys
from flexlease.api.policy import DecisionAction, GPULeasePolicy
from flexlease.clock import ManualClock
from flexlease.config import AutopilotSettings, LeaseSettings, Settings
from flexlease.errors import StoreError
from flexlease.store.base import Kind, Store
from flexlease.store.memory import MemoryStore
from tests.extender.lease.builders import gpunode, lease, pod
from tests.extender.lease.test_controller import _true, eventually
from tests.store.faults import FaultyStore

OWNER = "online/rec"
NS = "online"
START = datetime(2026, 6, 1, 0, 50, tzinfo=UTC)
HOUR = 3600.0


def at_hour(hour: float) -> float:
    return datetime(2026, 6, 1, tzinfo=UTC).timestamp() + hour * HOUR


def settings() -> Settings:
    return Settings(
        lease=LeaseSettings(resync_seconds=600),
        autopilot=AutopilotSettings(resync_seconds=600, retry_base_seconds=0.1),
    )


def policy(name: str = "rec", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "owner": OWNER,
        "minGPUs": 2,
        "maxGPUs": 8,
        "leadTime": 0,
        "stabilization": {"tauSeconds": 0},
        "demand": {
            "schedule": {"timeZone": "UTC", "windows": [{"start": "01:00", "end": "09:00", "gpus": 4}]}
        },
    }
    body.update(spec)
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.GPULEASEPOLICY_KIND,
        "metadata": {"name": name, "namespace": NS},
        "spec": body,
    }


async def create_with_status(store: Store, kind: Kind, obj: dict[str, Any]) -> None:
    status = obj.pop("status")
    meta = obj["metadata"]
    await store.create(kind, obj)
    await store.patch(
        kind, meta["name"], {"status": status}, namespace=meta.get("namespace"), subresource="status"
    )


def job_pod(i: int, *, critical: bool = False) -> dict[str, Any]:
    labels = {keys.LABEL_FRAMEWORK: "mpi", keys.LABEL_ROLE: "coordinator"} if critical else None
    return pod(
        f"rec-{i}", f"gpu-{i // 4}", [i % 4], namespace=NS, priority="high", owner=OWNER, labels=labels
    )


@pytest.fixture
async def store() -> AsyncIterator[FaultyStore]:
    inner = MemoryStore()
    faulty = FaultyStore(inner, check_crds=True)
    for node in ("gpu-0", "gpu-1"):
        await create_with_status(faulty, Kind.GPUNODE, gpunode(node, count=4))
    yield faulty
    assert faulty.crd_violations == []
    await inner.close()


@contextlib.asynccontextmanager
async def running(
    store: Store, clock: ManualClock, *, lease_controller: bool = True
) -> AsyncIterator[tuple[AutopilotController, CollectorRegistry]]:
    registry = CollectorRegistry()
    autopilot = AutopilotController(settings(), store, registry=registry, clock=clock, instance="test")
    controllers: list[Any] = [autopilot]
    if lease_controller:
        controllers.append(
            LeaseController(settings(), store, registry=CollectorRegistry(), clock=clock, instance="t")
        )
    running_tasks = [asyncio.create_task(c.run(), name=f"under-test-{i}") for i, c in enumerate(controllers)]
    try:
        await eventually(lambda: _true(all(c.ready for c in controllers)))
        yield autopilot, registry
    finally:
        for task in running_tasks:
            task.cancel()
        for task in running_tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def read_policy(store: Store, name: str = "rec") -> GPULeasePolicy:
    return GPULeasePolicy.model_validate(await store.get(Kind.GPULEASEPOLICY, name, namespace=NS))


def decided(
    store: Store, action: DecisionAction, *, name: str = "rec", **fields: Any
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        d = (await read_policy(store, name)).status.last_decision
        return d is not None and d.action is action and all(getattr(d, k) == v for k, v in fields.items())

    return check


def plan_target(store: Store, gpus: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        plan = (await read_policy(store)).status.plan
        return plan is not None and plan.target_gpus == gpus

    return check


async def leases(store: Store) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in (await store.list(Kind.GPULEASE, namespace=NS)).items}


def lease_phase(store: Store, name: str, phase: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        obj = (await leases(store)).get(name)
        return obj is not None and obj.get("status", {}).get("phase") == phase

    return check


async def events(store: Store, reason: str) -> list[dict[str, Any]]:
    return [e for e in (await store.list(Kind.EVENT, namespace=NS)).items if e["reason"] == reason]


async def test_a_day_of_a_schedule_lends_and_reclaims_through_the_lease_controller(
    store: FaultyStore,
) -> None:
    clock = ManualClock(START)
    for i in range(8):
        await create_with_status(store, Kind.POD, job_pod(i))
    await store.create(Kind.GPULEASEPOLICY, policy(leadTime=1800))
    async with running(store, clock) as (_, registry):
        await eventually(decided(store, DecisionAction.HOLD, reason="at target (8 GPUs)"))
        status = (await read_policy(store)).status
        assert status.plan is not None and status.plan.target_gpus == 8 and status.plan.allocated_gpus == 8
        assert [(s.start.hour, s.gpus) for s in status.plan.segments] == [(0, 8), (1, 4), (9, 8)]
        assert not await leases(store)

        # 01:00: the window starts; the autopilot writes one count Lend, the job releases 4 GPUs
        await clock.set(at_hour(1))
        await eventually(decided(store, DecisionAction.LEND, count=4, lease="rec-lend-1"))
        lend = (await leases(store))["rec-lend-1"]
        assert lend["spec"] == {"owner": OWNER, "action": "Lend", "count": 4, "gracePeriodSeconds": 45}
        assert lend["metadata"]["labels"] == {keys.LABEL_POLICY: "rec", keys.LABEL_POLICY_SEQUENCE: "1"}
        for i in range(4, 8):  # the job's controller scales down as the lease says
            await store.delete(Kind.POD, f"rec-{i}", namespace=NS, grace_period_seconds=0)
        await eventually(lease_phase(store, "rec-lend-1", "Done"))
        await eventually(decided(store, DecisionAction.HOLD, reason="at target (4 GPUs)"))
        tags = (await store.get(Kind.GPUNODE, "gpu-1"))["spec"]["devices"]
        assert {i: d["owner"] for i, d in tags.items()} == {str(i): OWNER for i in range(4)}

        # the Reclaim comes a lead time (30 min) before the 09:00 rise, not earlier
        await clock.set(at_hour(8.5) - 1)
        await asyncio.sleep(0.05)
        assert set(await leases(store)) == {"rec-lend-1"}
        await clock.set(at_hour(8.5))
        await eventually(decided(store, DecisionAction.RECLAIM, count=4, lease="rec-reclaim-2"))
        reclaim = (await leases(store))["rec-reclaim-2"]
        assert reclaim["spec"]["count"] == 4 and reclaim["spec"]["action"] == "Reclaim"
        for i in range(4, 8):  # the job scales up onto its lent GPUs
            await create_with_status(store, Kind.POD, job_pod(i))
        await eventually(lease_phase(store, "rec-reclaim-2", "Done"))
        await eventually(decided(store, DecisionAction.HOLD, reason="at target (8 GPUs)"))

    assert [e["message"].split(":")[0] for e in await events(store, "Lend")] == ["GPULease rec-lend-1"]
    assert [e["message"].split(":")[0] for e in await events(store, "Reclaim")] == ["GPULease rec-reclaim-2"]
    decisions = "flexlease_autopilot_decisions_total"
    labels = {"policy": "online/rec", "dry_run": "false"}
    assert registry.get_sample_value(decisions, {**labels, "action": "Lend"}) == 1
    assert registry.get_sample_value(decisions, {**labels, "action": "Reclaim"}) == 1
    assert registry.get_sample_value("flexlease_autopilot_allocated_gpus", {"policy": "online/rec"}) == 8
    final = (await read_policy(store)).status
    assert {c.type: c.status for c in final.conditions} == {
        "Valid": "True",
        "DemandKnown": "True",
        "LeaseInFlight": "False",
    }


async def test_dry_run_shows_the_plan_and_writes_no_lease(store: FaultyStore) -> None:
    clock = ManualClock(START)
    for i in range(8):
        await create_with_status(store, Kind.POD, job_pod(i))
    await store.create(Kind.GPULEASEPOLICY, policy(dryRun=True))
    async with running(store, clock) as (_, registry):
        await clock.set(at_hour(1))
        await eventually(decided(store, DecisionAction.LEND, count=4, dry_run=True, lease=None))
        await clock.set(at_hour(2))  # reconciled again: still nothing written, the decision stands
        await asyncio.sleep(0.05)
    assert await leases(store) == {}
    assert len(await events(store, "DryRun")) == 1
    status = (await read_policy(store)).status
    assert status.plan is not None and status.plan.target_gpus == 4
    assert (
        registry.get_sample_value(
            "flexlease_autopilot_decisions_total",
            {"policy": "online/rec", "action": "Lend", "dry_run": "true"},
        )
        == 1
    )


def test_only_leases_in_a_final_phase_are_out_of_flight() -> None:
    """Done, Failed and Cancelled (superseded by a newer lease of the owner) are final; a lease
    with no phase yet, Pending or InProgress is in flight; other owners' leases do not count."""
    objs = [
        lease(p.lower(), "Lend", count=1) for p in ("Done", "Failed", "Cancelled", "Pending", "InProgress")
    ]
    for obj, phase in zip(objs, ("Done", "Failed", "Cancelled", "Pending", "InProgress"), strict=True):
        obj["status"] = {"phase": phase}
    other = lease("other", "Lend", owner="online/other", count=1)
    fresh = lease("fresh", "Reclaim", count=1)
    assert in_flight([*objs, other, fresh], OWNER) == ["pending", "inprogress", "fresh"]


async def test_never_two_leases_of_an_owner_in_flight(store: FaultyStore) -> None:
    """A lease of the owner that no lease controller finishes (here none runs) holds every
    decision, whoever wrote it."""
    clock = ManualClock(START)
    for i in range(8):
        await create_with_status(store, Kind.POD, job_pod(i))
    await store.create(Kind.GPULEASE, lease("by-hand", "Lend", count=1))
    await store.create(Kind.GPULEASEPOLICY, policy())
    async with running(store, clock, lease_controller=False):
        await clock.set(at_hour(1))
        await eventually(
            decided(store, DecisionAction.HOLD, reason="GPULease by-hand in flight: one at a time")
        )
        assert set(await leases(store)) == {"by-hand"}
        await store.patch(
            Kind.GPULEASE, "by-hand", {"status": {"phase": "Done"}}, namespace=NS, subresource="status"
        )
        await eventually(decided(store, DecisionAction.LEND, lease="rec-lend-1"))
        await clock.set(at_hour(9))  # the rise comes while rec-lend-1 is still in flight
        await eventually(plan_target(store, 8))
        await asyncio.sleep(0.05)
        last = (await read_policy(store)).status.last_decision
        assert last is not None and last.lease == "rec-lend-1"  # shown while it is carried out
    assert set(await leases(store)) == {"by-hand", "rec-lend-1"}
    status = (await read_policy(store)).status
    assert {c.type: (c.status, c.message) for c in status.conditions}["LeaseInFlight"] == (
        "True",
        "rec-lend-1",
    )


async def test_critical_pods_gpus_are_never_lent(store: FaultyStore) -> None:
    """Six of the eight pods hold a critical role (an MPI coordinator by the shipped profile):
    the trough asks for 4 GPUs back, the autopilot lends only the 2 of the other pods."""
    clock = ManualClock(START)
    for i in range(8):
        await create_with_status(store, Kind.POD, job_pod(i, critical=i < 6))
    await store.create(Kind.GPULEASEPOLICY, policy())
    async with running(store, clock):
        await clock.set(at_hour(1))
        await eventually(decided(store, DecisionAction.LEND, count=2))
        (lend,) = (await leases(store)).values()
        assert lend["spec"]["count"] == 2
        last = (await read_policy(store)).status.last_decision
        assert last is not None and "capped: critical-role pods hold 6" in last.reason
        # the lease controller accepts it: the baseline holds only the non-critical GPUs
        await eventually(lease_phase(store, lend["metadata"]["name"], "InProgress"))
        annotations = (await leases(store))[lend["metadata"]["name"]]["metadata"]["annotations"]
        assert annotations[keys.ANN_LEND_BASELINE] == "gpu-1:2,3"


async def test_only_critical_pods_means_hold(store: FaultyStore) -> None:
    clock = ManualClock(START)
    for i in range(8):
        await create_with_status(store, Kind.POD, job_pod(i, critical=True))
    await store.create(Kind.GPULEASEPOLICY, policy())
    async with running(store, clock):
        await clock.set(at_hour(1))
        await eventually(
            decided(
                store,
                DecisionAction.HOLD,
                reason="target 4 < allocated 8, but only critical-role pods hold GPUs",
            )
        )
    assert await leases(store) == {}


async def test_a_restart_after_a_lost_status_write_neither_doubles_nor_reuses(store: FaultyStore) -> None:
    """The lease is created, then the status write fails (the extender dies there): the next
    controller finds the lease in flight and writes no second one; the decision after it takes
    the next sequence although the status never recorded the first."""
    clock = ManualClock(START)
    for i in range(8):
        await create_with_status(store, Kind.POD, job_pod(i))
    await store.create(Kind.GPULEASEPOLICY, policy())
    await clock.set(at_hour(1))
    first = AutopilotController(settings(), store, registry=CollectorRegistry(), clock=clock, instance="a")
    fault = store.fail(
        "patch", kind=Kind.GPULEASEPOLICY, match="status", error=lambda: StoreError("connection reset")
    )
    with pytest.raises(StoreError, match="connection reset"):
        await first.reconcile(policy_key(NS, "rec"))
    assert fault.fired == 1
    assert set(await leases(store)) == {"rec-lend-1"}
    assert (await read_policy(store)).status.last_decision is None

    async with running(store, clock, lease_controller=False):  # a new process
        await eventually(
            decided(store, DecisionAction.HOLD, reason="GPULease rec-lend-1 in flight: one at a time")
        )
        await store.patch(
            Kind.GPULEASE, "rec-lend-1", {"status": {"phase": "Failed"}}, namespace=NS, subresource="status"
        )
        await eventually(decided(store, DecisionAction.LEND, lease="rec-lend-2", sequence=2))
    assert set(await leases(store)) == {"rec-lend-1", "rec-lend-2"}


async def test_invalid_policies_are_reported_not_acted_on(store: FaultyStore) -> None:
    """The API server's schema cannot see the namespace: an owner in another namespace is
    refused by the controller (condition Valid=False and a Warning Event, once)."""
    clock = ManualClock(START)
    await store.create(Kind.GPULEASEPOLICY, policy(owner="other/rec"))
    async with running(store, clock):

        async def invalid() -> bool:
            conditions = (
                (await store.get(Kind.GPULEASEPOLICY, "rec", namespace=NS))
                .get("status", {})
                .get("conditions", [])
            )
            return any(c["type"] == "Valid" and c["status"] == "False" for c in conditions)

        await eventually(invalid)
        await clock.set(at_hour(2))
        await asyncio.sleep(0.05)
    (event,) = await events(store, "InvalidPolicy")
    assert event["type"] == "Warning"
    assert "spec.owner other/rec is not in the policy's namespace online" in event["message"]
    assert await leases(store) == {}


def test_a_cancelled_lease_is_not_in_flight_and_no_lease_follows_within_its_second() -> None:
    """Found by the simulator (issue #40): a Reclaim finished at once, the autopilot wrote a
    Lend in the same second, the lease controller ordered the two by name and Cancelled the
    Lend as superseded — and the autopilot, counting Cancelled as in flight, held for ever.
    Cancelled is final, and the next lease waits for the next second."""
    now = datetime(2026, 6, 1, 3, tzinfo=UTC)

    def obj(name: str, phase: str | None, created: datetime) -> dict[str, Any]:
        out = lease(name, "Lend", count=1)
        out["metadata"]["creationTimestamp"] = created.strftime("%Y-%m-%dT%H:%M:%SZ")
        if phase is not None:
            out["status"] = {"phase": phase}
        return out

    earlier = datetime(2026, 6, 1, 2, 59, 59, tzinfo=UTC)
    leases_ = [obj("a", "Cancelled", earlier), obj("b", "Done", earlier), obj("c", "Failed", earlier)]
    assert in_flight(leases_, OWNER) == []
    assert in_flight([*leases_, obj("d", "InProgress", earlier), obj("e", None, earlier)], OWNER) == [
        "d",
        "e",
    ]
    assert not created_within_second(leases_, OWNER, now.timestamp() + 0.5)
    recent = [*leases_, obj("f", "Done", now)]
    assert created_within_second(recent, OWNER, now.timestamp() + 0.5)
    assert not created_within_second(recent, "other/job", now.timestamp())
    assert not created_within_second(recent, OWNER, now.timestamp() + 1.0)
    assert not created_within_second(recent, OWNER, now.timestamp() - 5.0)  # a clock behind the server's
