"""Prelaunch for a reclaim: a reclaim pod bound to this node starts staging its job's input
(the agent's real staging hook, Stager and a real nats-server) and pre-pulls its images
(FakeCri); the staging's restart ends once kubelet reports its containers running, or when
the pod goes away. Other pods are left alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from flexlease import errors
from flexlease.api import keys
from flexlease.clock import ManualClock
from flexlease.store.base import JsonObj, Kind
from flexlease.store.memory import MemoryStore
from flexlease.streaming.jetstream import JetStreamBroker, ensure_live_stream
from nodeagent.cache.images import ImageMetrics, ImagePuller
from nodeagent.cri.fake import FakeCri
from nodeagent.hotrestart.component import RuntimeStaging, runtime_components
from nodeagent.reclaim import ReclaimPrelaunch, containers_running, images
from nodeagent.staging import Stager, StagingMetrics
from tests.natsserver import NatsServer
from tests.nodeagent.health.kit import NODE, START, make_context, make_settings, node_config

IMAGE, SIDECAR = "registry.local/trainer:v2", "registry.local/sidecar:v1"
BOUND = {
    keys.ANN_RECLAIM: "true",
    keys.ANN_STREAM: "LIVE",
    keys.ANN_STREAM_SUBJECT: "live.job",
    keys.ANN_STREAM_DURABLE: "job-1",
    keys.ANN_STAGING_MARGIN: "7",
}


class NoCheckpoints:
    def get(self, checkpoint_id: str) -> None:
        return None


def pod(name: str, annotations: dict[str, str], *, node: str = NODE, running: bool = False) -> JsonObj:
    """A pod (the store drops ``status`` on create, as the API server does)."""
    obj: JsonObj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "annotations": annotations},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "trainer", "image": IMAGE}, {"name": "sidecar", "image": SIDECAR}],
        },
    }
    if running:
        obj["status"] = running_status()
    return obj


def running_status() -> JsonObj:
    return {
        "phase": "Running",
        "containerStatuses": [
            {"name": n, "state": {"running": {"startedAt": "2026-11-22T18:00:00Z"}}}
            for n in ("trainer", "sidecar")
        ],
    }


@pytest.fixture
async def env(
    nats_server: NatsServer,
) -> AsyncIterator[tuple[MemoryStore, FakeCri, Stager, ReclaimPrelaunch]]:
    store = MemoryStore()
    registry = CollectorRegistry()
    cri = FakeCri(registry={IMAGE: 3_000_000, SIDECAR: 1_000})
    cri.add_image(SIDECAR, 1_000)
    async with JetStreamBroker(nats_server.url, timeout=2) as broker:
        await ensure_live_stream(broker, "LIVE", subjects=["live.job"], max_msgs=100)
        stager = Stager(
            broker,
            store,
            StagingMetrics(registry, node=NODE),
            node=NODE,
            rate_sample_seconds=0.05,
            poll_seconds=0.05,
        )
        runtime: Any = SimpleNamespace(cri=cri, checkpoints=NoCheckpoints())
        reclaims = ReclaimPrelaunch(
            store, RuntimeStaging(stager, runtime), node=NODE, puller=ImagePuller(cri, ImageMetrics(registry))
        )
        tasks: list[asyncio.Task[None]] = []

        async def start() -> ReclaimPrelaunch:
            tasks.append(asyncio.create_task(stager.run(), name="stager"))
            tasks.append(asyncio.create_task(reclaims.run(), name="reclaims"))
            await asyncio.wait_for(reclaims.listed.wait(), 10)
            return reclaims

        try:
            yield store, cri, stager, start
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await store.close()


async def set_status(store: MemoryStore, name: str, status: JsonObj) -> None:
    await store.patch(Kind.POD, name, {"status": status}, namespace="ml", subresource="status")


async def until(predicate: Any, *, within: float = 10.0) -> None:
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110 - state changed by tasks with no event to await
            await asyncio.sleep(0.02)


async def test_a_reclaim_pod_is_staged_and_pulled_until_its_containers_run(env: Any) -> None:
    store, cri, stager, start = env
    reclaims = await start()
    created = await store.create(Kind.POD, pod("trainer-3", BOUND))
    await until(lambda: "ml/trainer-3" in stager.stagings and IMAGE in cri.pulls)
    staging = stager.stagings["ml/trainer-3"]
    # the hot restart's W: the image was not on the node (its size unknown before the pull: 0)
    # and no checkpoint is cached, so W = 0 and W_stage = the pod's margin
    assert staging.window_seconds == 0.0 and staging.binding.margin_seconds == 7.0
    assert staging.restarted_at is None  # kubelet has not started the containers yet
    assert cri.pulls == [IMAGE]  # the sidecar image was present already
    entry = reclaims.reclaims[created["metadata"]["uid"]]
    assert entry.staged and not entry.over

    await set_status(store, "trainer-3", {"phase": "Running", "containerStatuses": [
        {"name": "trainer", "state": {"running": {}}}, {"name": "sidecar", "state": {"waiting": {}}}]})  # fmt: skip
    await asyncio.sleep(0.2)
    assert staging.restarted_at is None  # one container still waiting
    await set_status(store, "trainer-3", running_status())
    await until(lambda: staging.restarted_at is not None)
    assert entry.over
    # no commit from live yet: the staging holds until the job caught up
    assert not staging.done.is_set()


async def test_a_deleted_reclaim_pod_ends_its_window(env: Any) -> None:
    store, _, stager, start = env
    await start()
    await store.create(Kind.POD, pod("trainer-4", BOUND))
    await until(lambda: "ml/trainer-4" in stager.stagings)
    await store.delete(Kind.POD, "trainer-4", namespace="ml")
    await until(lambda: stager.stagings["ml/trainer-4"].restarted_at is not None)


async def test_other_pods_are_left_alone(env: Any) -> None:
    store, cri, stager, start = env
    await store.create(Kind.POD, pod("running-already", BOUND))
    await set_status(store, "running-already", running_status())  # e.g. the agent restarted since
    reclaims = await start()
    await store.create(
        Kind.POD, pod("not-reclaim", {k: v for k, v in BOUND.items() if k != keys.ANN_RECLAIM})
    )
    await store.create(Kind.POD, pod("elsewhere", BOUND, node="gpu-2"))
    unbound = await store.create(Kind.POD, pod("unbound", {keys.ANN_RECLAIM: "true"}))
    await until(lambda: IMAGE in cri.pulls)  # the reclaim pod without a stream binding is pre-pulled
    await asyncio.sleep(0.2)
    assert stager.stagings == {}
    assert set(reclaims.reclaims) == {unbound["metadata"]["uid"]}
    assert not reclaims.reclaims[unbound["metadata"]["uid"]].staged


def test_pod_helpers() -> None:
    p = pod("x", {})
    p["spec"]["initContainers"] = [{"name": "init", "image": SIDECAR}]
    assert images(p) == [SIDECAR, IMAGE]
    assert not containers_running(p)
    assert not containers_running({"spec": {"containers": []}, "status": running_status()})
    assert containers_running(pod("y", {}, running=True))


async def test_the_agent_prelaunches_reclaim_pods_when_staging_is_configured(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    settings = make_settings(
        tmp_path,
        staging_nats_url=nats_server.url,
        staging_rate_sample_seconds=0.05,
        staging_poll_seconds=0.05,
        cri_endpoint=f"unix://{tmp_path}/no-containerd.sock",  # W and the pull go without CRI
        checkpoint_dir=tmp_path / "ckpt",
    )
    store = MemoryStore()
    ctx, _ = await make_context(settings, store, ManualClock(START), node_config())
    [cache, hotrestart] = runtime_components(ctx)
    async with JetStreamBroker(nats_server.url, timeout=2) as broker:
        await ensure_live_stream(broker, "LIVE", subjects=["live.job"], max_msgs=100)
        task = asyncio.create_task(hotrestart.run(ctx), name="hotrestart")
        try:
            await store.create(Kind.POD, pod("trainer-5", BOUND))
            async with asyncio.timeout(10):
                while True:
                    try:
                        await broker.stream_state("FLEXLEASE_STAGE_job-1")
                        break
                    except errors.StreamNotFound:
                        await asyncio.sleep(0.05)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await cache.runtime.cri.close()  # type: ignore[attr-defined]
            await store.close()
