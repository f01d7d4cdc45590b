"""Hot restart end to end on the testbed's real containerd, with pods in a MemoryStore: the
controller watches the node's pods, restarts the container in its sandbox and writes the
status annotation."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from flexlease import errors
from flexlease.api import keys
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore
from nodeagent.cache.images import ImageMetrics, ImagePuller
from nodeagent.cri import podspec
from nodeagent.cri.client import ContainerInfo, ContainerState, GrpcCri
from nodeagent.hotrestart.controller import HotRestartController
from nodeagent.hotrestart.model import HotRestartStatus, Phase, Strategy, parse_status
from nodeagent.hotrestart.restarter import HotRestarter
from tests.nodeagent.conftest import ContainerdTestbed, Pod, Pods

pytestmark = pytest.mark.containerd

NODE = "gpu-node-1"


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    s = MemoryStore()
    try:
        yield s
    finally:
        await s.close()


async def _pod(
    store: MemoryStore, pods: Pods, name: str, image: str, *, mounts: tuple[podspec.HostMount, ...] = ()
) -> Pod:
    """A pod in the store bound to NODE, and its sandbox + container on containerd."""
    obj = await store.create(
        Kind.POD,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": NODE, "containers": [{"name": "trainer", "image": image}]},
        },
    )
    return await pods.run(name, {"trainer": image}, uid=obj["metadata"]["uid"], mounts=mounts)


def _controller(
    store: MemoryStore, runtime: Any, *, strategy: Strategy = Strategy.DIRECT, kubelet_wait: float = 20.0
) -> HotRestartController:
    puller = ImagePuller(runtime, ImageMetrics(CollectorRegistry()))
    restarter = HotRestarter(runtime, puller, stop_timeout_seconds=5, kubelet_wait_seconds=kubelet_wait)
    return HotRestartController(store, runtime, restarter, node=NODE, default_strategy=strategy)


@contextlib.asynccontextmanager
async def _running(controller: HotRestartController) -> AsyncIterator[HotRestartController]:
    task = asyncio.create_task(controller.run(), name="test:hotrestart")
    try:
        await asyncio.wait_for(controller.listed.wait(), 10)
        yield controller
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _request(store: MemoryStore, name: str, **request: str) -> None:
    value = json.dumps(request)
    await store.patch(
        Kind.POD, name, {"metadata": {"annotations": {keys.ANN_HOT_RESTART: value}}}, namespace="default"
    )


async def _final_status(
    store: MemoryStore, name: str, request_id: str, *, within: float = 30
) -> HotRestartStatus:
    async with asyncio.timeout(within):
        while True:
            pod = await store.get(Kind.POD, name, namespace="default")
            status = parse_status(pod["metadata"].get("annotations", {}).get(keys.ANN_HOT_RESTART_STATUS))
            if status is not None and status.id == request_id and status.phase.final:
                return status
            await asyncio.sleep(0.05)


async def _trainers(cri: GrpcCri, sandbox_id: str) -> list[ContainerInfo]:
    return [c for c in await cri.list_containers(sandbox_id=sandbox_id) if c.name == "trainer"]


async def _version(cri: GrpcCri, container_id: str) -> bytes:
    out = await cri.exec_sync(container_id, ["cat", "/etc/trainer-version"], timeout_seconds=5)
    return out.stdout.strip()


async def _namespaces(cri: GrpcCri, container_id: str) -> tuple[str, str]:
    """The network and IPC namespace ids of the container's process (``net:[4026532...]``)."""
    out = await cri.exec_sync(
        container_id, ["ls", "-l", "/proc/1/ns/net", "/proc/1/ns/ipc"], timeout_seconds=5
    )
    links = dict(line.split(" -> ") for line in out.stdout.decode().splitlines() if " -> " in line)
    net = next(v for k, v in links.items() if k.endswith("/net"))
    ipc = next(v for k, v in links.items() if k.endswith("/ipc"))
    assert net.startswith("net:[") and ipc.startswith("ipc:[")
    return net, ipc


async def test_direct_hot_restart_keeps_the_sandbox(
    cri: GrpcCri, pods: Pods, store: MemoryStore, containerd_testbed: ContainerdTestbed, tmp_path: Path
) -> None:
    volume = tmp_path / "vol"
    volume.mkdir()
    pod = await _pod(
        store, pods, "job-0", containerd_testbed.trainer_v1, mounts=(podspec.HostMount(volume, "/data"),)
    )
    old_id = pod.containers["trainer"]
    # Something the old process leaves in the pod's volume survives the restart.
    await cri.exec_sync(old_id, ["sh", "-c", "echo step-100 > /data/checkpoint"], timeout_seconds=5)
    before = await cri.pod_sandbox_status(pod.sandbox_id)
    assert before.ip is not None
    namespaces_before = await _namespaces(cri, old_id)

    async with _running(_controller(store, cri)) as controller:
        await _request(store, "job-0", id="r1", container="trainer", image=containerd_testbed.trainer_v2)
        status = await _final_status(store, "job-0", "r1")

        assert status.phase is Phase.SUCCEEDED, status.message
        assert status.strategy is Strategy.DIRECT
        assert status.node == NODE
        assert status.sandbox_id == pod.sandbox_id
        assert status.pod_ip == before.ip
        assert status.previous_container_id == old_id
        assert status.previous_attempt == 0 and status.attempt == 1
        assert status.image_cached is True  # v2 was already on the node: no pull
        for seconds in (status.pull_seconds, status.stop_seconds, status.start_seconds, status.total_seconds):
            assert seconds is not None and seconds >= 0

        after = await cri.pod_sandbox_status(pod.sandbox_id)
        assert (after.id, after.uid, after.ip) == (before.id, before.uid, before.ip)
        new = await cri.container_status(status.container_id or "")
        assert new.state is ContainerState.RUNNING
        assert new.sandbox_id == pod.sandbox_id
        assert (new.image, new.attempt) == (containerd_testbed.trainer_v2, 1)
        assert await _version(cri, new.id) == b"v2"
        assert await _namespaces(cri, new.id) == namespaces_before  # same pod network and IPC
        out = await cri.exec_sync(new.id, ["cat", "/data/checkpoint"], timeout_seconds=5)
        assert out.stdout == b"step-100\n"
        with pytest.raises(errors.CriNotFound):
            await cri.container_status(old_id)
        assert [c.id for c in await _trainers(cri, pod.sandbox_id)] == [new.id]

        # The same request again is a no-op: nothing restarts, the status stays.
        pod_obj = await store.get(Kind.POD, "job-0", namespace="default")
        await store.patch(
            Kind.POD, "job-0", {"metadata": {"annotations": {"touch": "1"}}}, namespace="default"
        )
        await controller.reconcile("default", "job-0")
        again = await store.get(Kind.POD, "job-0", namespace="default")
        assert (
            again["metadata"]["annotations"][keys.ANN_HOT_RESTART_STATUS]
            == pod_obj["metadata"]["annotations"][keys.ANN_HOT_RESTART_STATUS]
        )
        assert [c.id for c in await _trainers(cri, pod.sandbox_id)] == [new.id]


async def test_missing_image_fails_and_keeps_the_old_container(
    cri: GrpcCri, pods: Pods, store: MemoryStore, containerd_testbed: ContainerdTestbed
) -> None:
    pod = await _pod(store, pods, "job-1", containerd_testbed.trainer_v1)
    missing = f"{containerd_testbed.registry}/flexlease/trainer:does-not-exist"
    async with _running(_controller(store, cri)):
        await _request(store, "job-1", id="r-missing", container="trainer", image=missing)
        status = await _final_status(store, "job-1", "r-missing")
    assert status.phase is Phase.FAILED
    assert status.message is not None and "image pull failed" in status.message
    assert "not found" in status.message
    old = await cri.container_status(pod.containers["trainer"])
    assert old.state is ContainerState.RUNNING
    assert await _version(cri, old.id) == b"v1"


async def test_container_gone_fails(
    cri: GrpcCri, pods: Pods, store: MemoryStore, containerd_testbed: ContainerdTestbed
) -> None:
    pod = await _pod(store, pods, "job-2", containerd_testbed.trainer_v1)
    cid = pod.containers["trainer"]
    await cri.stop_container(cid, timeout_seconds=5)
    await cri.remove_container(cid)
    async with _running(_controller(store, cri)):
        await _request(store, "job-2", id="r-gone", container="trainer", image=containerd_testbed.trainer_v2)
        status = await _final_status(store, "job-2", "r-gone")
        await _request(store, "job-2", id="r-typo", container="trainr", image=containerd_testbed.trainer_v2)
        typo = await _final_status(store, "job-2", "r-typo")
    assert status.phase is Phase.FAILED
    assert status.message == f"container 'trainer' not found in sandbox {pod.sandbox_id}"
    assert typo.phase is Phase.FAILED and "'trainr' not found" in (typo.message or "")
    assert await _trainers(cri, pod.sandbox_id) == []


async def test_malformed_request_is_reported(
    cri: GrpcCri, pods: Pods, store: MemoryStore, containerd_testbed: ContainerdTestbed
) -> None:
    pod = await _pod(store, pods, "job-3", containerd_testbed.trainer_v1)
    async with _running(_controller(store, cri)):
        await store.patch(
            Kind.POD,
            "job-3",
            {"metadata": {"annotations": {keys.ANN_HOT_RESTART: '{"container": "trainer"}'}}},
            namespace="default",
        )
        status = await _final_status(store, "job-3", "")
    assert status.phase is Phase.FAILED
    assert status.message is not None and keys.ANN_HOT_RESTART in status.message and "id" in status.message
    assert (await cri.container_status(pod.containers["trainer"])).state is ContainerState.RUNNING


class _ContainerdDiesBeforeStart:
    """The real client, except that the first StartContainer finds containerd killed (it is
    started again right after the call failed): a restart of containerd mid-operation."""

    def __init__(self, inner: GrpcCri, testbed: ContainerdTestbed) -> None:
        self._inner = inner
        self._testbed = testbed
        self.tripped = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def start_container(self, container_id: str) -> None:
        if not self.tripped:
            self.tripped = True
            await asyncio.to_thread(self._testbed.stop_containerd)
            try:
                await self._inner.start_container(container_id)
            finally:
                await asyncio.to_thread(self._testbed.start_containerd)
        await self._inner.start_container(container_id)


async def test_containerd_restart_during_the_operation_resumes(
    cri: GrpcCri, pods: Pods, store: MemoryStore, containerd_testbed: ContainerdTestbed
) -> None:
    pod = await _pod(store, pods, "job-4", containerd_testbed.trainer_v1)
    before = await cri.pod_sandbox_status(pod.sandbox_id)
    flaky = _ContainerdDiesBeforeStart(cri, containerd_testbed)
    async with _running(_controller(store, flaky)):
        await _request(
            store, "job-4", id="r-restart", container="trainer", image=containerd_testbed.trainer_v2
        )
        status = await _final_status(store, "job-4", "r-restart", within=60)
    assert flaky.tripped
    assert status.phase is Phase.SUCCEEDED, status.message
    after = await cri.pod_sandbox_status(pod.sandbox_id)
    assert (after.id, after.ip) == (before.id, before.ip)
    running = [c for c in await _trainers(cri, pod.sandbox_id) if c.state is ContainerState.RUNNING]
    assert [c.id for c in running] == [status.container_id]
    assert running[0].attempt == 1
    assert await _version(cri, running[0].id) == b"v2"


async def test_direct_restart_to_an_image_that_cannot_start_is_reported_and_rolled_back(
    cri: GrpcCri, pods: Pods, store: MemoryStore, containerd_testbed: ContainerdTestbed
) -> None:
    """containerd refuses to start the replacement (StartError, exit code 128): the old
    container's config runs again as the next attempt, and the status says so."""
    pod = await _pod(store, pods, "job-5", containerd_testbed.trainer_v1)
    async with _running(_controller(store, cri)):
        await _request(
            store, "job-5", id="broken", container="trainer", image=containerd_testbed.trainer_broken
        )
        status = await _final_status(store, "job-5", "broken")
    assert status.phase is Phase.FAILED and status.message is not None
    assert status.message.startswith("the replacement did not start: ")
    assert "no-such-entrypoint" in status.message and "; rolled back to " in status.message
    running = [c for c in await _trainers(cri, pod.sandbox_id) if c.state is ContainerState.RUNNING]
    assert [c.id for c in running] == [status.container_id] and running[0].attempt == 2
    assert await _version(cri, running[0].id) == b"v1"
    assert status.attempt == 2
    assert status.rollback is not None and status.rollback.phase is Phase.SUCCEEDED
    assert status.rollback.container_id == status.container_id
    assert status.rollback.image == containerd_testbed.trainer_v1
    assert status.pause_seconds is not None and status.pause_seconds >= 0
    failed = [c for c in await _trainers(cri, pod.sandbox_id) if c.attempt == 1]
    assert failed == []  # the failed replacement was removed
