"""Critical ReplicaSet pods get the highest ``controller.kubernetes.io/pod-deletion-cost``
(extender/lease/deletion_cost.py): pure planning, then the lease controller writing it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Any

from extender.lease import deletion_cost
from extender.lease.deletion_cost import ANN_POD_DELETION_COST, CRITICAL_DELETION_COST
from extender.orchestrator import profile as profiles
from flexlease.api import keys
from flexlease.clock import ManualClock
from flexlease.store import graceful
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore
from tests.extender.lease.builders import pod
from tests.extender.lease.test_controller import add_pod, eventually, running

CRITICAL = profiles.builtin_critical()


def rs_pod(name: str, role: str, *, framework: str = "ray", kind: str = "ReplicaSet") -> dict[str, Any]:
    obj = pod(name, "n1", [0], labels={keys.LABEL_ROLE: role, keys.LABEL_FRAMEWORK: framework})
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": kind, "name": "ray-7d9f", "uid": "rs-uid", "controller": True}
    ]
    return obj


def test_only_live_critical_replicaset_pods_without_the_cost_need_it() -> None:
    head = rs_pod("head", "head")
    assert deletion_cost.needs_cost(head, CRITICAL)
    assert not deletion_cost.needs_cost(rs_pod("w", "worker"), CRITICAL)
    assert not deletion_cost.needs_cost(rs_pod("sts-0", "head", kind="StatefulSet"), CRITICAL)
    done = rs_pod("old", "head")
    done["status"]["phase"] = "Succeeded"
    leaving = rs_pod("leaving", "head")
    leaving["metadata"]["deletionTimestamp"] = "2026-11-22T18:00:00Z"
    has = rs_pod("has", "head")
    has["metadata"]["annotations"][ANN_POD_DELETION_COST] = CRITICAL_DELETION_COST
    low = rs_pod("low", "head")
    low["metadata"]["annotations"][ANN_POD_DELETION_COST] = "-5"  # someone else's value: raised
    patches = deletion_cost.plan_costs([low, done, leaving, has, head, {"metadata": "x"}], CRITICAL)
    assert [p.name for p in patches] == ["head", "low"]
    assert patches[0].body() == {"metadata": {"annotations": {ANN_POD_DELETION_COST: "2147483647"}}}


async def test_the_lease_controller_writes_the_cost_on_critical_replicaset_pods() -> None:
    store = MemoryStore()
    clock = ManualClock(datetime.now(UTC).replace(microsecond=0))
    try:
        async with running(store, clock):
            await add_pod(store, rs_pod("head", "head"))
            await add_pod(store, rs_pod("worker", "worker"))

            async def head_costs_most() -> bool:
                obj = await store.get(Kind.POD, "head", namespace="lp")
                return bool(
                    obj["metadata"]["annotations"].get(ANN_POD_DELETION_COST) == CRITICAL_DELETION_COST
                )

            await eventually(head_costs_most)
            worker = await store.get(Kind.POD, "worker", namespace="lp")
            assert ANN_POD_DELETION_COST not in worker["metadata"]["annotations"]
            # an operator lowering it gets it raised again
            await store.patch(
                Kind.POD, "head", {"metadata": {"annotations": {ANN_POD_DELETION_COST: "0"}}}, namespace="lp"
            )
            await eventually(head_costs_most)
    finally:
        await store.close()


async def test_pods_listed_before_the_start_or_made_critical_later_get_the_cost_and_only_they() -> None:
    store = MemoryStore()
    clock = ManualClock(datetime.now(UTC).replace(microsecond=0))
    await add_pod(store, rs_pod("early-head", "head"))  # there before the controller lists

    async def cost(name: str) -> str | None:
        obj = await store.get(Kind.POD, name, namespace="lp")
        value: str | None = obj["metadata"]["annotations"].get(ANN_POD_DELETION_COST)
        return value

    try:
        async with running(store, clock) as (controller, _):
            await eventually(lambda: _is(cost("early-head"), CRITICAL_DELETION_COST))
            await add_pod(store, rs_pod("promoted", "worker"))
            for _ in range(20):
                await asyncio.sleep(0)
            assert await cost("promoted") is None  # a worker: left alone
            await store.patch(
                Kind.POD, "promoted", {"metadata": {"labels": {keys.LABEL_ROLE: "head"}}}, namespace="lp"
            )
            await eventually(lambda: _is(cost("promoted"), CRITICAL_DELETION_COST))
            await store.delete(Kind.POD, "promoted", namespace="lp")
            await graceful.confirm_pod_deletion(store, "lp", "promoted")  # as its kubelet would
            await add_pod(store, rs_pod("promoted", "head"))  # the same name again, a new uid
            await eventually(lambda: _is(cost("promoted"), CRITICAL_DELETION_COST))
            await store.delete(Kind.POD, "early-head", namespace="lp")
            await store.delete(Kind.POD, "promoted", namespace="lp")
            await eventually(lambda: _true(not controller._cost_due))  # nothing left to look at
    finally:
        await store.close()


async def _is(value: Awaitable[str | None], expected: str) -> bool:
    return await value == expected


async def _true(value: bool) -> bool:
    return value
