"""An in-place rollout end to end: the extender's rollout controller, the node agent's real
hot-restart controller (``kubelet`` strategy) and the faithful stand-in kubelet
(``standins.kubelet_pods``) running a 2-pod StatefulSet's pods on the testbed's real containerd,
all over one MemoryStore. A template image edit is rolled pod by pod: the agent prelaunches and
patches each pod's spec image, kubelet restarts the container in the same sandbox."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from extender.rollout.controller import RolloutController
from flexlease.api import keys
from flexlease.clock import ManualClock
from flexlease.config import Settings
from flexlease.store.base import Kind
from flexlease.store.kube_util import EventRecorder
from flexlease.store.memory import MemoryStore
from nodeagent.cache.images import ImageMetrics, ImagePuller
from nodeagent.cri.client import ContainerState, GrpcCri
from nodeagent.hotrestart.controller import HotRestartController
from nodeagent.hotrestart.model import Phase, Strategy, parse_status
from nodeagent.hotrestart.restarter import HotRestarter
from tests.nodeagent.conftest import ContainerdTestbed, KubeletFactory, standin_kubelet

__all__ = ["standin_kubelet"]  # the fixture, used by name

pytestmark = pytest.mark.containerd

NODE = "gpu-node-1"
NS = "default"


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    s = MemoryStore()
    try:
        yield s
    finally:
        await s.close()


@contextlib.asynccontextmanager
async def _running(*coros: Any) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(c) for c in coros]
    try:
        yield
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t


async def test_a_statefulset_image_edit_rolls_through_the_agent_and_kubelet_in_place(
    cri: GrpcCri, store: MemoryStore, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    tb = containerd_testbed
    template = {"containers": [{"name": "trainer", "image": tb.trainer_v1}]}
    sts = {
        "metadata": {
            "name": "rec",
            "namespace": NS,
            "labels": {keys.LABEL_RESTART_POLICY: keys.RESTART_POLICY_IN_PLACE},
        },
        "spec": {"replicas": 2, "updateStrategy": {"type": "OnDelete"}, "template": {"spec": template}},
    }
    created = await store.create(Kind.STATEFULSET, sts)
    owner = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": "rec",
        "uid": created["metadata"]["uid"],
        "controller": True,
    }
    for i in range(2):
        await store.create(
            Kind.POD,
            {
                "metadata": {"name": f"rec-{i}", "namespace": NS, "ownerReferences": [owner]},
                "spec": {
                    "nodeName": NODE,
                    "restartPolicy": "Always",
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{"name": "trainer", "image": tb.trainer_v1}],
                },
            },
        )
    kubelet = standin_kubelet(store, NODE)
    await kubelet.sync_once()
    sandboxes = {f"rec-{i}": kubelet.sandbox_id(NS, f"rec-{i}") for i in range(2)}
    puller = ImagePuller(cri, ImageMetrics(CollectorRegistry()))
    agent = HotRestartController(
        store,
        cri,
        HotRestarter(cri, puller, stop_timeout_seconds=5, kubelet_wait_seconds=30),
        node=NODE,
        default_strategy=None,
        events=EventRecorder(store, component="flexlease-agent", instance=NODE),
    )
    rollout = RolloutController(
        Settings(), store, registry=CollectorRegistry(), clock=ManualClock(datetime.now(UTC)), instance="test"
    )

    async with _running(kubelet.run(), agent.run(), rollout.run()):
        new_template = {"containers": [{"name": "trainer", "image": tb.trainer_v2}]}
        await store.patch(
            Kind.STATEFULSET, "rec", {"spec": {"template": {"spec": new_template}}}, namespace=NS
        )
        async with asyncio.timeout(120):
            while True:
                obj = await store.get(Kind.STATEFULSET, "rec", namespace=NS)
                raw = obj["metadata"].get("annotations", {}).get(keys.ANN_ROLLOUT_STATUS)
                status = json.loads(raw) if raw else {}
                if status.get("phase") in ("Complete", "Failed") and status.get("updated", 0) > 0:
                    break
                await asyncio.sleep(0.05)

    assert (status["phase"], status["updated"], status["total"]) == ("Complete", 2, 2), status
    results = {}
    for name, sandbox_id in sandboxes.items():
        pod = await store.get(Kind.POD, name, namespace=NS)
        assert pod["spec"]["containers"][0]["image"] == tb.trainer_v2  # patched by the agent, not the rollout
        result = parse_status(pod["metadata"]["annotations"][keys.ANN_HOT_RESTART_STATUS])
        assert result is not None and result.phase is Phase.SUCCEEDED, result
        assert result.strategy is Strategy.KUBELET and result.sandbox_id == sandbox_id
        running = [
            c for c in await cri.list_containers(sandbox_id=sandbox_id) if c.state is ContainerState.RUNNING
        ]
        assert [c.id for c in running] == [result.container_id]
        assert (
            await cri.exec_sync(running[0].id, ["cat", "/etc/trainer-version"], timeout_seconds=5)
        ).stdout.strip() == b"v2"
        results[name] = result
        assert status["restartSeconds"][name] == result.total_seconds
    # one pod at a time, highest ordinal first: rec-0's restart began after rec-1's ended
    first, second = results["rec-1"], results["rec-0"]
    assert first.finished_at is not None and second.started_at is not None
    assert second.started_at >= first.finished_at
