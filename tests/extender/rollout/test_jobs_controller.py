"""In-place rollouts of training-operator jobs (PyTorchJob, MPIJob, RayCluster) through the
store interface, on a MemoryStore and on the Kubernetes API stand-in (the jobs as real
kubeflow.org/v1 and ray.io/v1 JSON, their pods as the operators label them), with the simulated
node agent: a template image edit restarts the job's pods in place — in profile order, a wave
at once when the profile says the job restarts together, else one pod at a time — pods are
matched by owner reference and replica labels, jobs that did not opt in are left alone, and a
cluster without those CRDs still runs the controller."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from flexlease.api import keys
from flexlease.clock import ManualClock
from flexlease.config import StoreSettings
from flexlease.store.base import Kind, Store
from flexlease.store.kube import Backoff, KubeStore
from standins.apiserver import FakeApiServer
from tests.extender.rollout.agent import SimAgent
from tests.extender.rollout.test_controller import (
    IN_PLACE,
    NS,
    edit_image,
    eventually,
    images,
    make_set,
    pending_is,
    phase,
    reasons,
    requested,
    rollout_status,
    running,
    statefulset,
)
from tests.store import operator_payloads as ops
from tests.store.stores import any_store


@pytest.fixture(params=["memory", "kube"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    async with any_store(request.param, tmp_path) as s:
        yield s


async def pytorch_job(store: Store, name: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    job = await store.create(
        Kind.PYTORCHJOB,
        ops.pytorchjob(name, NS, image="reg/pt:v1", labels=IN_PLACE if labels is None else labels),
    )
    for rtype, count in (("Master", 1), ("Worker", 2)):
        for i in range(count):
            await store.create(
                Kind.POD,
                ops.job_pod(
                    job,
                    f"{name}-{rtype.lower()}-{i}",
                    labels=ops.kubeflow_labels(name, rtype, i),
                    container="pytorch",
                    image="reg/pt:v1",
                ),
            )
    return job


def template_edit(field: str, replica: str, container: str, image: str) -> dict[str, Any]:
    spec = {"template": {"spec": {"containers": [{"name": container, "image": image}]}}}
    return {"spec": {field: {replica: spec}}}


async def test_a_pytorchjob_image_edit_restarts_master_then_workers_together(store: Store) -> None:
    """The pytorch profile: the master first (workers wait for its rendezvous), then every
    worker at once (``restartTogether``); the status lands on the job."""
    await pytorch_job(store, "pt")
    agent = SimAgent(store, gated=True)
    async with running(store, agent) as (_, registry):
        await eventually(phase(store, "pt", "Complete", Kind.PYTORCHJOB))  # nothing to do yet
        for replica in ("Master", "Worker"):
            await store.patch(
                Kind.PYTORCHJOB,
                "pt",
                template_edit("pytorchReplicaSpecs", replica, "pytorch", "reg/pt:v2"),
                namespace=NS,
            )
        await eventually(pending_is(agent, ["pt-master-0"]))
        await asyncio.sleep(0.05)
        assert len(agent.pending) == 1, "a worker restarted before the master was back"
        await agent.finish()
        await eventually(pending_is(agent, ["pt-worker-1", "pt-worker-0"]))  # together
        status = await rollout_status(store, Kind.PYTORCHJOB, "pt")
        assert (status["phase"], status["updated"], status["total"]) == ("Progressing", 1, 3)
        assert status["current"] == ["pt-worker-0", "pt-worker-1"]
        await agent.finish(2)
        await eventually(phase(store, "pt", "Complete", Kind.PYTORCHJOB))
        assert await images(store) == {n: "reg/pt:v2" for n in ("pt-master-0", "pt-worker-0", "pt-worker-1")}
        assert {(r["container"], r["image"]) for _, r in agent.requests} == {("pytorch", "reg/pt:v2")}
        assert ("pt", "RolloutComplete", "Normal") in await reasons(store)
        assert (
            registry.get_sample_value("flexlease_rollouts_total", {"trigger": "image", "outcome": "complete"})
            == 1
        )


async def test_max_unavailable_on_the_job_overrides_the_profile(store: Store) -> None:
    await pytorch_job(store, "pt", labels={**IN_PLACE})
    await store.patch(
        Kind.PYTORCHJOB, "pt", {"metadata": {"annotations": {keys.ANN_MAX_UNAVAILABLE: "1"}}}, namespace=NS
    )
    agent = SimAgent(store, gated=True)
    async with running(store, agent):
        await store.patch(
            Kind.PYTORCHJOB,
            "pt",
            template_edit("pytorchReplicaSpecs", "Worker", "pytorch", "reg/pt:v2"),
            namespace=NS,
        )
        for expect in ("pt-worker-1", "pt-worker-0"):
            await eventually(pending_is(agent, [expect]))
            await asyncio.sleep(0.05)
            assert len(agent.pending) == 1
            await agent.finish()
        await eventually(restarted(store, Kind.PYTORCHJOB, "pt", {"pt-worker-0", "pt-worker-1"}))
        assert "pt-master-0" not in await requested(store)  # its template did not change


async def test_a_raycluster_worker_group_edit_rolls_its_workers_one_by_one(store: Store) -> None:
    """Ray tolerates a worker leaving (the profile does not restart together): one at a time.
    Pods match their group's template by ``ray.io/node-type`` and ``ray.io/group``; a pod of
    the cluster whose labels name no template is left alone and reported."""
    ray = await store.create(
        Kind.RAYCLUSTER,
        ops.raycluster("rc", NS, image="reg/ray:v1", groups={"gpu": 2, "cpu": 1}, labels=IN_PLACE),
    )
    pods = [
        ("rc-head-x1", ops.ray_labels("rc", "head", "headgroup"), "ray-head"),
        ("rc-gpu-worker-a", ops.ray_labels("rc", "worker", "gpu"), "ray-worker"),
        ("rc-gpu-worker-b", ops.ray_labels("rc", "worker", "gpu"), "ray-worker"),
        ("rc-cpu-worker-c", ops.ray_labels("rc", "worker", "cpu"), "ray-worker"),
        ("rc-stray", {"ray.io/cluster": "rc"}, "ray-worker"),
    ]
    for name, labels, container in pods:
        await store.create(
            Kind.POD, ops.job_pod(ray, name, labels=labels, container=container, image="reg/ray:v1")
        )
    agent = SimAgent(store, gated=True)
    async with running(store, agent):
        groups = ray["spec"]["workerGroupSpecs"]
        groups[0]["template"]["spec"]["containers"][0]["image"] = "reg/ray:v2"
        await store.patch(Kind.RAYCLUSTER, "rc", {"spec": {"workerGroupSpecs": groups}}, namespace=NS)
        seen = []
        for _ in range(2):
            await eventually(lambda: _async(len(agent.pending) == 1))
            await asyncio.sleep(0.05)
            assert len(agent.pending) == 1, "two ray workers restarted at once"
            seen += await agent.finish()
        assert sorted(seen) == ["rc-gpu-worker-a", "rc-gpu-worker-b"]
        await eventually(phase(store, "rc", "Complete", Kind.RAYCLUSTER))
        status = await rollout_status(store, Kind.RAYCLUSTER, "rc")
        assert (status["updated"], status["total"]) == (4, 4)
        assert set(await requested(store)) == {"rc-gpu-worker-a", "rc-gpu-worker-b"}
        assert ("rc", "PodNotMatched", "Warning") in await reasons(store)


async def _async(value: bool) -> bool:
    return value


def restarted(store: Store, kind: Kind, name: str, pods: set[str]) -> Callable[[], Awaitable[bool]]:
    """The job's rollout is Complete and restarted exactly ``pods``."""

    async def check() -> bool:
        status = await rollout_status(store, kind, name)
        return status.get("phase") == "Complete" and set(status.get("restartSeconds") or {}) == pods

    return check


async def test_jobs_that_did_not_opt_in_and_pods_of_other_jobs_are_left_alone(store: Store) -> None:
    mpi = await store.create(Kind.MPIJOB, ops.mpijob("plain", NS, image="reg/mpi:v1"))
    await store.create(
        Kind.POD,
        ops.job_pod(
            mpi,
            "plain-worker-0",
            labels=ops.kubeflow_labels("plain", "Worker", 0),
            container="mpi",
            image="reg/mpi:v1",
        ),
    )
    opted = await store.create(
        Kind.MPIJOB, ops.mpijob("opted", NS, image="reg/mpi:v1", workers=1, labels=IN_PLACE)
    )
    for rtype in ("Launcher", "Worker"):
        await store.create(
            Kind.POD,
            ops.job_pod(
                opted,
                f"opted-{rtype.lower()}-0",
                labels=ops.kubeflow_labels("opted", rtype, 0),
                container="mpi",
                image="reg/mpi:v1",
            ),
        )
    # a pod left by an earlier MPIJob of the same name (another uid) is not this job's
    stale = ops.job_pod(
        {**opted, "metadata": {**opted["metadata"], "uid": "an-old-uid"}},
        "opted-worker-9",
        labels=ops.kubeflow_labels("opted", "Worker", 9),
        container="mpi",
        image="reg/mpi:v1",
    )
    await store.create(Kind.POD, stale)
    agent = SimAgent(store)
    async with running(store, agent):
        for name in ("plain", "opted"):
            await store.patch(
                Kind.MPIJOB,
                name,
                template_edit("mpiReplicaSpecs", "Worker", "mpi", "reg/mpi:v2"),
                namespace=NS,
            )
        await eventually(restarted(store, Kind.MPIJOB, "opted", {"opted-worker-0"}))
        await asyncio.sleep(0.05)
        assert set(await requested(store)) == {"opted-worker-0"}
        assert await rollout_status(store, Kind.MPIJOB, "plain") == {}


async def test_without_the_operators_crds_the_controller_still_rolls_statefulsets(tmp_path: Path) -> None:
    """A cluster with neither the training-operator nor KubeRay: their lists answer 404; the
    controller is ready without them, and picks a kind up once its CRD is installed."""
    unserved = frozenset({"pytorchjobs", "mpijobs", "rayclusters"})
    async with FakeApiServer(bookmark_interval=0.05, unserved=unserved) as api:
        settings = StoreSettings(kind="kube", request_timeout_seconds=5.0, watch_timeout_seconds=30.0)
        store = KubeStore.for_host(api.url, settings, reconnect=Backoff(initial=0.02, maximum=0.2))
        try:
            await make_set(store, statefulset("rec", "reg/trainer:v1", replicas=2))
            agent = SimAgent(store)
            clock = ManualClock(datetime.now(UTC).replace(microsecond=0))
            async with running(store, agent, clock=clock) as (controller, _):
                assert controller.ready
                await edit_image(store, "rec", "reg/trainer:v2")
                await eventually(restarted(store, Kind.STATEFULSET, "rec", {"rec-0", "rec-1"}))
                assert not controller.serves(Kind.PYTORCHJOB)
                api.unserved.clear()  # the training-operator is installed
                await clock.advance(30.0)  # the next probe (lease.resync_seconds)
                await eventually(lambda: _async(controller.serves(Kind.PYTORCHJOB)))
                await pytorch_job(store, "pt")
                await store.patch(
                    Kind.PYTORCHJOB,
                    "pt",
                    template_edit("pytorchReplicaSpecs", "Worker", "pytorch", "reg/pt:v2"),
                    namespace=NS,
                )
                await eventually(restarted(store, Kind.PYTORCHJOB, "pt", {"pt-worker-0", "pt-worker-1"}))
        finally:
            await store.close()


async def test_a_completed_reclaim_restarts_an_opted_in_pytorchjob_in_profile_order(store: Store) -> None:
    """The opt-in label on the job covers its pods (they carry only the operator's labels);
    the roles come from the replica types: the master first, then the workers together."""
    await pytorch_job(store, "pt")
    await store.create(
        Kind.GPULEASE,
        {
            "metadata": {"name": "reclaim-pt", "namespace": NS},
            "spec": {"owner": f"{NS}/pt", "action": "Reclaim", "count": 1},
        },
    )
    agent = SimAgent(store, gated=True)
    async with running(store, agent):
        await store.patch(
            Kind.GPULEASE, "reclaim-pt", {"status": {"phase": "Done"}}, namespace=NS, subresource="status"
        )
        await eventually(pending_is(agent, ["pt-master-0"]))
        await asyncio.sleep(0.05)
        assert len(agent.pending) == 1, "a worker restarted before the master"
        await agent.finish()
        await eventually(pending_is(agent, ["pt-worker-1", "pt-worker-0"]))
        await agent.finish(2)
        await eventually(phase(store, "reclaim-pt", "Complete", Kind.GPULEASE))
        assert {r["image"] for _, r in agent.requests} == {"reg/pt:v1"}  # same image: a reconfiguration
