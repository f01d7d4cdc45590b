"""The rollout controller against a MemoryStore and a KubeStore on the Kubernetes API
stand-in (``standins/apiserver.py``), with a simulated node agent answering
``hot-restart-status``: a 4-pod StatefulSet image edit rolled one pod at a time, ``all`` at
once, a failure stopping the rollout, a superseding edit, a pod vanishing mid-rollout, workloads
left to Kubernetes, and a completed reclaim restarting the job's pods in profile order."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from extender.rollout.controller import RolloutController
from flexlease.api import keys
from flexlease.clock import ManualClock
from flexlease.config import Settings
from flexlease.store.base import Kind, Store
from tests.extender.rollout.agent import SimAgent
from tests.store.stores import any_store

NS = "online"
IN_PLACE = {keys.LABEL_RESTART_POLICY: keys.RESTART_POLICY_IN_PLACE}


@pytest.fixture(params=["memory", "kube"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A MemoryStore, and a KubeStore on the Kubernetes API stand-in (real HTTP, list+watch)."""
    async with any_store(request.param, tmp_path) as s:
        yield s


async def eventually(check: Callable[[], Awaitable[bool]], *, within: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not await check():
        if loop.time() > end:
            pytest.fail("condition not reached in time")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def running(
    store: Store, agent: SimAgent, *, clock: ManualClock | None = None
) -> AsyncIterator[tuple[RolloutController, CollectorRegistry]]:
    registry = CollectorRegistry()
    clock = clock or ManualClock(datetime.now(UTC).replace(microsecond=0))
    controller = RolloutController(Settings(), store, registry=registry, clock=clock, instance="test")
    tasks = [
        asyncio.create_task(controller.run(), name="rollout-under-test"),
        asyncio.create_task(agent.run(), name="sim-agent"),
    ]
    try:
        await eventually(lambda: _true(controller.ready))
        yield controller, registry
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _true(value: bool) -> bool:
    return value


def statefulset(
    name: str,
    image: str,
    *,
    labels: dict[str, str] | None = None,
    strategy: str = "OnDelete",
    replicas: int = 4,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": IN_PLACE if labels is None else labels,
            "annotations": annotations or {},
        },
        "spec": {
            "replicas": replicas,
            "updateStrategy": {"type": strategy},
            "template": {"spec": {"containers": [{"name": "trainer", "image": image}]}},
        },
    }


def pod(
    name: str, image: str, *, owner: tuple[str, str], labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": labels or {},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": owner[0],
                    "name": owner[1],
                    "uid": "u-" + owner[1],
                    "controller": True,
                }
            ],
        },
        "spec": {"nodeName": "node-a", "containers": [{"name": "trainer", "image": image}]},
    }


async def make_set(store: Store, sts: dict[str, Any]) -> None:
    await store.create(Kind.STATEFULSET, sts)
    name = sts["metadata"]["name"]
    image = sts["spec"]["template"]["spec"]["containers"][0]["image"]
    for i in range(sts["spec"]["replicas"]):
        await store.create(Kind.POD, pod(f"{name}-{i}", image, owner=("StatefulSet", name)))


async def edit_image(store: Store, name: str, image: str) -> None:
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "trainer", "image": image}]}}}}
    await store.patch(Kind.STATEFULSET, name, patch, namespace=NS)


async def rollout_status(store: Store, kind: Kind, name: str) -> dict[str, Any]:
    obj = await store.get(kind, name, namespace=NS)
    raw = (obj["metadata"].get("annotations") or {}).get(keys.ANN_ROLLOUT_STATUS)
    return json.loads(raw) if raw else {}


def phase(store: Store, name: str, want: str, kind: Kind = Kind.STATEFULSET) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await rollout_status(store, kind, name)).get("phase") == want

    return check


async def requested(store: Store) -> dict[str, str]:
    """Pod → id of its hot-restart request."""
    out = {}
    for p in (await store.list(Kind.POD, namespace=NS)).items:
        raw = (p["metadata"].get("annotations") or {}).get(keys.ANN_HOT_RESTART)
        if raw:
            out[p["metadata"]["name"]] = json.loads(raw)["id"]
    return out


async def images(store: Store) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["spec"]["containers"][0]["image"]
        for p in (await store.list(Kind.POD, namespace=NS)).items
    }


async def reasons(store: Store) -> list[tuple[str, str, str]]:
    return [
        (e["involvedObject"]["name"], e["reason"], e["type"])
        for e in (await store.list(Kind.EVENT, namespace=NS)).items
    ]


def current_is(store: Store, name: str, pods: list[str]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await rollout_status(store, Kind.STATEFULSET, name)).get("current") == pods

    return check


def pending_is(agent: SimAgent, pods: list[str]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return [p for _, p, _ in agent.pending] == pods

    return check


async def test_a_4_pod_statefulset_image_edit_rolls_one_pod_at_a_time(store: Store) -> None:
    await make_set(store, statefulset("rec", "reg/trainer:v1"))
    agent = SimAgent(store, gated=True)
    async with running(store, agent) as (_, registry):
        await eventually(phase(store, "rec", "Complete"))  # nothing to do yet
        assert await requested(store) == {}
        await edit_image(store, "rec", "reg/trainer:v2")
        for expect in ("rec-3", "rec-2", "rec-1", "rec-0"):  # highest ordinal first, one at a time
            await eventually(pending_is(agent, [expect]))
            # the status patch follows the request the agent already sees
            await eventually(current_is(store, "rec", [expect]))
            status = await rollout_status(store, Kind.STATEFULSET, "rec")
            assert status["phase"] == "Progressing"
            assert set(await requested(store)) == {f"rec-{i}" for i in range(3, int(expect[-1]) - 1, -1)}
            await asyncio.sleep(0.05)
            assert len(agent.pending) == 1, "a second pod was restarted while one was unavailable"
            await agent.finish()
        await eventually(phase(store, "rec", "Complete"))
        status = await rollout_status(store, Kind.STATEFULSET, "rec")
        assert (status["updated"], status["total"], status["current"]) == (4, 4, [])
        assert status["restartSeconds"] == {f"rec-{i}": 0.25 for i in range(4)}
        assert status["pauseSeconds"] == {f"rec-{i}": 0.125 for i in range(4)}
        assert await images(store) == {f"rec-{i}": "reg/trainer:v2" for i in range(4)}
        assert [name for name, _ in agent.requests] == ["rec-3", "rec-2", "rec-1", "rec-0"]
        assert {r["image"] for _, r in agent.requests} == {"reg/trainer:v2"}
        events = await reasons(store)
        assert ("rec", "RolloutStarted", "Normal") in events
        assert ("rec", "RolloutComplete", "Normal") in events
        assert sum(1 for e in events if e[1] == "HotRestartRequested") == 4
        assert (
            registry.get_sample_value("flexlease_rollouts_total", {"trigger": "image", "outcome": "complete"})
            == 1
        )
        assert registry.get_sample_value("flexlease_rollout_restart_seconds_count", {"trigger": "image"}) == 4
        assert registry.get_sample_value("flexlease_rollout_restarts_in_progress", {"trigger": "image"}) == 0


async def test_max_unavailable_all_restarts_every_pod_at_once(store: Store) -> None:
    await make_set(store, statefulset("rec", "reg/trainer:v1", annotations={keys.ANN_MAX_UNAVAILABLE: "all"}))
    agent = SimAgent(store, gated=True)
    async with running(store, agent) as (_, registry):
        await edit_image(store, "rec", "reg/trainer:v2")
        await eventually(lambda: _true(len(agent.pending) == 4))
        await eventually(
            lambda: _true(
                registry.get_sample_value("flexlease_rollout_restarts_in_progress", {"trigger": "image"}) == 4
            )
        )
        await agent.finish(4)
        await eventually(phase(store, "rec", "Complete"))


async def test_a_failed_restart_stops_the_rollout_with_a_clear_status(store: Store) -> None:
    await make_set(store, statefulset("rec", "reg/trainer:v1"))
    agent = SimAgent(store, fail={"rec-2": "pull reg/trainer:v2: not found"})
    async with running(store, agent) as (_, registry):
        await edit_image(store, "rec", "reg/trainer:v2")
        await eventually(phase(store, "rec", "Failed"))
        status = await rollout_status(store, Kind.STATEFULSET, "rec")
        assert status["lastError"] == "pod rec-2: pull reg/trainer:v2: not found"
        assert (status["updated"], status["total"]) == (1, 4)
        await asyncio.sleep(0.1)
        assert set(await requested(store)) == {"rec-3", "rec-2"}, "the rollout went on after a failure"
        events = await reasons(store)
        assert ("rec", "RolloutFailed", "Warning") in events
        assert ("rec-2", "HotRestartFailed", "Warning") in events
        assert (
            registry.get_sample_value("flexlease_rollout_restart_failures_total", {"trigger": "image"}) == 1
        )
        assert (
            registry.get_sample_value("flexlease_rollouts_total", {"trigger": "image", "outcome": "failed"})
            == 1
        )
        # a new edit supersedes the failed rollout and rolls again
        await edit_image(store, "rec", "reg/trainer:v3")
        agent._fail.clear()
        await eventually(phase(store, "rec", "Complete"))
        assert await images(store) == {f"rec-{i}": "reg/trainer:v3" for i in range(4)}


async def test_a_superseding_edit_waits_for_the_restart_in_flight_then_rolls_the_new_image(
    store: Store,
) -> None:
    await make_set(store, statefulset("rec", "reg/trainer:v1"))
    agent = SimAgent(store, gated=True)
    async with running(store, agent):
        await edit_image(store, "rec", "reg/trainer:v2")
        await eventually(pending_is(agent, ["rec-3"]))
        first = (await rollout_status(store, Kind.STATEFULSET, "rec"))["revision"]
        await edit_image(store, "rec", "reg/trainer:v3")

        async def superseded() -> bool:
            status = await rollout_status(store, Kind.STATEFULSET, "rec")
            return bool(status.get("superseded") == first) and status["revision"] != first

        await eventually(superseded)
        await asyncio.sleep(0.05)
        assert [p for _, p, _ in agent.pending] == ["rec-3"], (
            "rec-3's restart was overwritten, or another began"
        )
        assert set(await requested(store)) == {"rec-3"}
        await agent.finish()  # rec-3 now runs v2: it gets the v3 request next
        for expect in ("rec-3", "rec-2", "rec-1", "rec-0"):
            await eventually(pending_is(agent, [expect]))
            assert agent.pending[0][2]["image"] == "reg/trainer:v3"
            await agent.finish()
        await eventually(phase(store, "rec", "Complete"))
        assert await images(store) == {f"rec-{i}": "reg/trainer:v3" for i in range(4)}
        assert ("rec", "RolloutSuperseded", "Normal") in await reasons(store)


async def test_a_pod_that_vanishes_mid_rollout_is_skipped_and_reported(store: Store) -> None:
    await make_set(store, statefulset("rec", "reg/trainer:v1"))
    agent = SimAgent(store, gated=True)
    async with running(store, agent):
        await edit_image(store, "rec", "reg/trainer:v2")
        await eventually(pending_is(agent, ["rec-3"]))
        await store.delete(Kind.POD, "rec-1", namespace=NS)
        await agent.finish()
        for expect in ("rec-2", "rec-0"):
            await eventually(pending_is(agent, [expect]))
            await agent.finish()
        await eventually(phase(store, "rec", "Complete"))
        status = await rollout_status(store, Kind.STATEFULSET, "rec")
        assert (status["updated"], status["total"], status["skipped"]) == (3, 4, ["rec-1"])
        assert ("rec", "PodSkipped", "Warning") in await reasons(store)


async def test_workloads_that_did_not_opt_in_are_left_to_kubernetes(store: Store) -> None:
    await make_set(store, statefulset("plain", "reg/a:v1", labels={}))
    await make_set(store, statefulset("rolling", "reg/b:v1", strategy="RollingUpdate"))
    agent = SimAgent(store)
    async with running(store, agent):
        await edit_image(store, "plain", "reg/a:v2")
        await edit_image(store, "rolling", "reg/b:v2")

        async def warned() -> bool:
            return ("rolling", "InPlaceIgnored", "Warning") in await reasons(store)

        await eventually(warned)
        await asyncio.sleep(0.1)
        assert await requested(store) == {}
        assert await rollout_status(store, Kind.STATEFULSET, "plain") == {}
        assert await rollout_status(store, Kind.STATEFULSET, "rolling") == {}


async def test_a_completed_reclaim_restarts_the_job_s_pods_in_profile_order(store: Store) -> None:
    owner = ("MPIJob", "job")
    mpi = {keys.LABEL_FRAMEWORK: "mpi", keys.LABEL_OWNER: "job", **IN_PLACE}
    await store.create(
        Kind.POD,
        pod("job-launcher", "reg/mpi:v1", owner=owner, labels={**mpi, keys.LABEL_ROLE: "coordinator"}),
    )
    for i in range(2):
        await store.create(
            Kind.POD,
            pod(f"job-worker-{i}", "reg/mpi:v1", owner=owner, labels={**mpi, keys.LABEL_ROLE: "worker"}),
        )
    # not restarted: another job's pod, and a pod of this job that did not opt in
    await store.create(Kind.POD, pod("other-0", "reg/x:v1", owner=("MPIJob", "other"), labels=IN_PLACE))
    await store.create(
        Kind.POD, pod("job-sidecar", "reg/s:v1", owner=owner, labels={keys.LABEL_OWNER: "job"})
    )
    # nor a pod created to take the GPUs back: it starts on the new GPU set
    back = pod("job-worker-2", "reg/mpi:v1", owner=owner, labels={**mpi, keys.LABEL_ROLE: "worker"})
    back["metadata"]["annotations"] = {keys.ANN_RECLAIM: "true"}
    await store.create(Kind.POD, back)
    lease = {
        "metadata": {"name": "reclaim-1", "namespace": NS},
        "spec": {"owner": f"{NS}/job", "action": "Reclaim", "count": 2},
    }
    await store.create(Kind.GPULEASE, lease)
    agent = SimAgent(store, gated=True)
    async with running(store, agent) as (_, registry):
        await asyncio.sleep(0.05)
        assert await requested(store) == {}, "restarted before the reclaim was done"
        await store.patch(
            Kind.GPULEASE, "reclaim-1", {"status": {"phase": "Done"}}, namespace=NS, subresource="status"
        )
        await eventually(pending_is(agent, ["job-worker-1", "job-worker-0"]))  # the workers together
        await asyncio.sleep(0.05)
        assert "job-launcher" not in await requested(store), "mpirun's pod restarted before its workers"
        status = await rollout_status(store, Kind.GPULEASE, "reclaim-1")
        assert (status["phase"], status["current"]) == ("Progressing", ["job-worker-0", "job-worker-1"])
        await agent.finish(2)
        await eventually(pending_is(agent, ["job-launcher"]))
        await agent.finish()
        await eventually(phase(store, "reclaim-1", "Complete", Kind.GPULEASE))
        status = await rollout_status(store, Kind.GPULEASE, "reclaim-1")
        assert (status["updated"], status["total"]) == (3, 3)
        assert set(status["restartSeconds"]) == {"job-launcher", "job-worker-0", "job-worker-1"}
        assert {r["image"] for _, r in agent.requests} == {"reg/mpi:v1"}  # same image: a reconfiguration
        assert set(await requested(store)) == {"job-launcher", "job-worker-0", "job-worker-1"}
        assert (
            registry.get_sample_value("flexlease_rollouts_total", {"trigger": "lease", "outcome": "complete"})
            == 1
        )


async def test_only_lease_completions_the_controller_observes_are_reconfigured(store: Store) -> None:
    """The age guard (extender.rollout.age): leases already ``Done`` when the controller starts
    — an upgrade, a new leader — and completions older than the maximum age restart nothing;
    their rollout status says ``Skipped`` and why, so each is decided once."""
    owner = ("MPIJob", "job")
    labels = {keys.LABEL_OWNER: "job", **IN_PLACE}
    for i in range(2):
        await store.create(Kind.POD, pod(f"job-worker-{i}", "reg/mpi:v1", owner=owner, labels=labels))
    long_ago = "2026-01-01T00:00:00Z"

    async def make_lease(name: str, *, status: dict[str, Any] | None = None) -> None:
        await store.create(
            Kind.GPULEASE,
            {
                "metadata": {"name": name, "namespace": NS},
                "spec": {"owner": f"{NS}/job", "action": "Reclaim", "count": 1},
            },
        )
        if status is not None:
            await store.patch(Kind.GPULEASE, name, {"status": status}, namespace=NS, subresource="status")

    freed = {"type": "GPUsFreed", "status": "True", "reason": "Freed", "lastTransitionTime": long_ago}
    await make_lease("done-long-ago", status={"phase": "Done", "conditions": [freed]})
    await make_lease("done-no-time", status={"phase": "Done"})
    await make_lease("stale", status={"phase": "InProgress"})
    agent = SimAgent(store)
    async with running(store, agent):
        await asyncio.sleep(0.1)
        assert await requested(store) == {}, "an old completed lease restarted the job at start-up"
        # seen InProgress, but its completion (by its conditions) is older than the maximum age
        await store.patch(
            Kind.GPULEASE,
            "stale",
            {"status": {"phase": "Done", "conditions": [freed]}},
            namespace=NS,
            subresource="status",
        )
        await make_lease("fresh", status={"phase": "InProgress"})
        await store.patch(
            Kind.GPULEASE, "fresh", {"status": {"phase": "Done"}}, namespace=NS, subresource="status"
        )
        await eventually(phase(store, "fresh", "Complete", Kind.GPULEASE))
        await asyncio.sleep(0.05)
        reasons_ = {
            "done-long-ago": "over the maximum age",  # also before the start
            "done-no-time": "done before this controller started, completion time unknown",
            "stale": "over the maximum age",
        }
        for name, reason in reasons_.items():
            status = await rollout_status(store, Kind.GPULEASE, name)
            assert (status["phase"], status["total"]) == ("Skipped", 0), name
            assert reason in status["message"], (name, status["message"])
        assert len(agent.requests) == 2
        fresh = await store.get(Kind.GPULEASE, "fresh", namespace=NS)
        assert {r["id"] for _, r in agent.requests} == {f"rc-{fresh['metadata']['uid'][:8]}-trainer"}
