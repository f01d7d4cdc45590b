"""The ``kubelet`` strategy end to end on the testbed's real containerd, with the faithful stand-in
kubelet (``standins.kubelet_pods``) running the pods from a MemoryStore: containers created by
image ID, restarts on a spec-hash change, crash-loop back-off, restartPolicy, kubelet's
container statuses; a replacement that cannot start reported in seconds and rolled back; a
restart or a rollback resumed after the agent was stopped mid-way."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from flexlease.api import keys
from flexlease.store.base import JsonObj, Kind, Store
from flexlease.store.kube_util import EventRecorder
from flexlease.store.memory import MemoryStore
from nodeagent.cache.checkpoints import CheckpointCache, CheckpointMetrics
from nodeagent.cache.images import ImageMetrics, ImagePuller
from nodeagent.cri.client import ANN_CONTAINER_HASH, ContainerInfo, ContainerState, GrpcCri
from nodeagent.hotrestart.controller import HotRestartController
from nodeagent.hotrestart.decide import Restart
from nodeagent.hotrestart.model import HotRestartStatus, Phase, Strategy, parse_status
from nodeagent.hotrestart.restarter import HotRestarter
from standins.kubelet_pods import StandInKubelet
from tests.nodeagent.conftest import ContainerdTestbed, KubeletFactory

pytestmark = pytest.mark.containerd

NODE = "gpu-node-1"


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    s = MemoryStore()
    try:
        yield s
    finally:
        await s.close()


async def _kpod(store: MemoryStore, name: str, image: str, *, policy: str = "Always") -> JsonObj:
    return await store.create(
        Kind.POD,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": "trainer"}},
            "spec": {
                "nodeName": NODE,
                "restartPolicy": policy,
                "terminationGracePeriodSeconds": 5,
                "containers": [{"name": "trainer", "image": image, "env": [{"name": "POD", "value": name}]}],
            },
        },
    )


def _controller(
    store: Store,
    cri: GrpcCri,
    *,
    kubelet_wait: float = 30.0,
    checkpoints: CheckpointCache | None = None,
    rollback: bool = True,
) -> HotRestartController:
    puller = ImagePuller(cri, ImageMetrics(CollectorRegistry()))
    restarter = HotRestarter(
        cri,
        puller,
        checkpoints=checkpoints,
        stop_timeout_seconds=5,
        kubelet_wait_seconds=kubelet_wait,
        rollback=rollback,
    )
    return HotRestartController(
        store,
        cri,
        restarter,
        node=NODE,
        default_strategy=None,
        events=EventRecorder(store, component="flexlease-agent", instance=NODE),
        rollback=rollback,
    )


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


async def _started(
    store: MemoryStore, standin_kubelet: KubeletFactory, name: str, image: str, *, policy: str = "Always"
) -> tuple[StandInKubelet, str]:
    """A pod running ``image`` under a stand-in kubelet (one sync, not running on); the kubelet
    and the pod's sandbox id."""
    await _kpod(store, name, image, policy=policy)
    kubelet = standin_kubelet(store, NODE)
    await kubelet.sync_once()
    return kubelet, kubelet.sandbox_id("default", name)


async def _request(store: MemoryStore, name: str, **request: str) -> None:
    await store.patch(
        Kind.POD,
        name,
        {"metadata": {"annotations": {keys.ANN_HOT_RESTART: json.dumps(request)}}},
        namespace="default",
    )


async def _final(store: MemoryStore, name: str, request_id: str, *, within: float = 60) -> HotRestartStatus:
    async with asyncio.timeout(within):
        while True:
            pod = await store.get(Kind.POD, name, namespace="default")
            status = parse_status(pod["metadata"].get("annotations", {}).get(keys.ANN_HOT_RESTART_STATUS))
            if status is not None and status.id == request_id and status.phase.final:
                return status
            await asyncio.sleep(0.05)


async def _trainers(cri: GrpcCri, sandbox_id: str, *, running: bool = True) -> list[ContainerInfo]:
    found = [c for c in await cri.list_containers(sandbox_id=sandbox_id) if c.name == "trainer"]
    found = [c for c in found if c.state is ContainerState.RUNNING or not running]
    return sorted(found, key=lambda c: c.attempt)


async def _version(cri: GrpcCri, container_id: str) -> bytes:
    out = await cri.exec_sync(container_id, ["cat", "/etc/trainer-version"], timeout_seconds=5)
    return out.stdout.strip()


async def _spec_image(store: MemoryStore, name: str) -> str:
    pod = await store.get(Kind.POD, name, namespace="default")
    return str(pod["spec"]["containers"][0]["image"])


async def _events(store: MemoryStore, reason: str) -> list[JsonObj]:
    return [e for e in (await store.list(Kind.EVENT)).items if e["reason"] == reason]


async def test_kubelet_strategy_patches_the_image_and_confirms_by_image_id(
    cri: GrpcCri, store: MemoryStore, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    tb = containerd_testbed
    kubelet, sandbox_id = await _started(store, standin_kubelet, "job-k1", tb.trainer_v1)
    before = await cri.pod_sandbox_status(sandbox_id)
    [old] = await _trainers(cri, sandbox_id)
    v1 = await cri.image_status(tb.trainer_v1)
    v2 = await cri.image_status(tb.trainer_v2)
    assert v1 is not None and v2 is not None
    # kubelet creates containers by image ID: the tag is nowhere in what CRI lists.
    assert old.image == v1.id and old.image_ref == v1.id and ANN_CONTAINER_HASH in old.annotations

    async with _running(kubelet.run(), _controller(store, cri).run()):
        await _request(store, "job-k1", id="r1", container="trainer", image=tb.trainer_v2)
        status = await _final(store, "job-k1", "r1")

    assert status.phase is Phase.SUCCEEDED, status.message
    assert status.strategy is Strategy.KUBELET
    assert status.spec_image == tb.trainer_v2 and await _spec_image(store, "job-k1") == tb.trainer_v2
    assert status.image_id == v2.id
    assert status.previous_container_id == old.id and status.attempt == 1
    assert status.pause_seconds is not None and status.pause_seconds >= 0
    [new] = await _trainers(cri, sandbox_id)
    assert status.container_id == new.id and new.image == v2.id and new.attempt == 1
    assert await _version(cri, new.id) == b"v2"
    after = await cri.pod_sandbox_status(sandbox_id)
    assert (after.id, after.uid, after.ip) == (before.id, before.uid, before.ip)
    # kubelet did the restart (spec change), the agent stopped nothing; no back-off.
    reasons = [(e.reason, e.message) for e in kubelet.events]
    assert ("Killing", "Container trainer definition changed, will be restarted") in reasons
    assert not [r for r, _ in reasons if r == "BackOff"]


async def test_same_image_restart_switches_tag_and_digest_without_backoff(
    cri: GrpcCri, store: MemoryStore, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    image = containerd_testbed.registry_trainer  # pulled from the registry: it has a repo digest
    kubelet, sandbox_id = await _started(store, standin_kubelet, "job-k2", image)
    info = await cri.image_status(image)
    assert info is not None and info.repo_digests
    digest_form = f"{image.rsplit(':', 1)[0]}@{info.repo_digests[0].split('@', 1)[1]}"

    async with _running(kubelet.run(), _controller(store, cri).run()):
        await _request(store, "job-k2", id="same-1", container="trainer", image=image)
        first = await _final(store, "job-k2", "same-1")
        # A second reconfiguration soon after: the spec switches back, again no back-off.
        await _request(store, "job-k2", id="same-2", container="trainer", image=image)
        second = await _final(store, "job-k2", "same-2")

    assert first.phase is Phase.SUCCEEDED, first.message
    assert first.spec_image == digest_form and first.image_id == info.id and first.attempt == 1
    assert second.phase is Phase.SUCCEEDED, second.message
    assert second.spec_image == image and second.attempt == 2
    assert await _spec_image(store, "job-k2") == image
    [running] = await _trainers(cri, sandbox_id)
    assert running.id == second.container_id and running.image == info.id and running.attempt == 2
    assert kubelet.starts == 3
    assert not [e for e in kubelet.events if e.reason == "BackOff"]


async def test_jobs_refuse_same_image_restarts_and_take_image_changes(
    cri: GrpcCri, store: MemoryStore, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    tb = containerd_testbed
    kubelet, sandbox_id = await _started(store, standin_kubelet, "job-k3", tb.trainer_v1, policy="OnFailure")
    [old] = await _trainers(cri, sandbox_id)

    async with _running(kubelet.run(), _controller(store, cri).run()):
        await _request(store, "job-k3", id="same", container="trainer", image=tb.trainer_v1)
        refused = await _final(store, "job-k3", "same")
        assert refused.phase is Phase.FAILED
        assert refused.message is not None and "restartPolicy OnFailure" in refused.message
        assert refused.container_id == old.id  # names what runs: the untouched old container
        [event] = await _events(store, "HotRestartRefused")
        assert event["type"] == "Warning" and "restartPolicy OnFailure" in event["message"]
        assert [c.id for c in await _trainers(cri, sandbox_id)] == [old.id]

        await _request(store, "job-k3", id="new", container="trainer", image=tb.trainer_v2)
        changed = await _final(store, "job-k3", "new")

    assert changed.phase is Phase.SUCCEEDED, changed.message
    assert kubelet.phase("default", "job-k3") == "Running"  # the Job's pod lives on
    [new] = await _trainers(cri, sandbox_id)
    assert new.id == changed.container_id and await _version(cri, new.id) == b"v2"


async def test_direct_is_refused_on_a_kubelet_pod(
    cri: GrpcCri, store: MemoryStore, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    kubelet, sandbox_id = await _started(store, standin_kubelet, "job-k4", containerd_testbed.trainer_v1)
    [old] = await _trainers(cri, sandbox_id)
    async with _running(kubelet.run(), _controller(store, cri).run()):
        await _request(
            store,
            "job-k4",
            id="d",
            container="trainer",
            image=containerd_testbed.trainer_v2,
            strategy="direct",
        )
        status = await _final(store, "job-k4", "d")
    assert status.phase is Phase.FAILED and status.strategy is Strategy.DIRECT
    assert status.message is not None and "managed by kubelet" in status.message
    assert await _events(store, "HotRestartRefused")
    assert [c.id for c in await _trainers(cri, sandbox_id)] == [old.id]


class _KubeletSyncsAfterStop:
    """The real client; right after each StopContainer the stand-in kubelet syncs — the moment
    a real kubelet's PLEG sees the old container die before the agent starts its replacement."""

    def __init__(self, inner: GrpcCri, kubelet: StandInKubelet) -> None:
        self._inner = inner
        self._kubelet = kubelet

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def stop_container(self, container_id: str, *, timeout_seconds: int) -> None:
        await self._inner.stop_container(container_id, timeout_seconds=timeout_seconds)
        await self._kubelet.sync_once()


async def test_the_standin_reproduces_the_direct_race(
    cri: GrpcCri, store: MemoryStore, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    """Why ``direct`` is refused on kubelet pods: forced through the restarter, kubelet starts
    its own copy from the spec and two trainers run in one sandbox."""
    tb = containerd_testbed
    kubelet, sandbox_id = await _started(store, standin_kubelet, "job-k5", tb.trainer_v1)
    [old] = await _trainers(cri, sandbox_id)
    racing = _KubeletSyncsAfterStop(cri, kubelet)
    restarter = HotRestarter(
        racing, ImagePuller(cri, ImageMetrics(CollectorRegistry())), stop_timeout_seconds=5
    )  # type: ignore[arg-type]
    outcome = await restarter.execute(
        Restart(sandbox_id, old, 1, tb.trainer_v2, Strategy.DIRECT), pod="default/job-k5"
    )
    assert outcome.succeeded  # the agent alone cannot tell
    running = await _trainers(cri, sandbox_id)
    assert len(running) == 2
    assert sorted([await _version(cri, c.id) for c in running]) == [b"v1", b"v2"]


async def test_kubelet_strategy_without_a_running_kubelet_times_out_and_stops_nothing(
    cri: GrpcCri, store: MemoryStore, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    # The pod ran, then the kubelet stopped syncing.
    _, sandbox_id = await _started(store, standin_kubelet, "job-k6", containerd_testbed.trainer_v1)
    [old] = await _trainers(cri, sandbox_id)
    async with _running(_controller(store, cri, kubelet_wait=0.5).run()):
        await _request(store, "job-k6", id="t", container="trainer", image=containerd_testbed.trainer_v2)
        status = await _final(store, "job-k6", "t")
    assert status.phase is Phase.FAILED
    assert status.message == (
        f"kubelet did not restart 'trainer' within 0.5 s of the pod spec's image being set to "
        f"{containerd_testbed.trainer_v2}"
    )
    assert status.container_id == old.id
    assert [c.id for c in await _trainers(cri, sandbox_id)] == [old.id]
    # Undone: the spec names the running image again, so a kubelet coming back restarts nothing.
    assert await _spec_image(store, "job-k6") == containerd_testbed.trainer_v1
    assert status.rollback is not None and status.rollback.phase is Phase.SUCCEEDED
    assert status.rollback.container_id == old.id and status.pause_seconds == 0.0


@pytest.fixture
async def checkpoint_url() -> AsyncIterator[tuple[str, bytes]]:
    data = os.urandom(1024 * 1024)

    async def serve(request: web.Request) -> web.Response:
        return web.Response(body=data)

    app = web.Application()
    app.router.add_get("/ckpt/step-7", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/ckpt/step-7", data
    finally:
        await runner.cleanup()


async def test_prelaunch_fetches_the_checkpoint_before_the_spec_patch(
    cri: GrpcCri,
    store: MemoryStore,
    containerd_testbed: ContainerdTestbed,
    standin_kubelet: KubeletFactory,
    checkpoint_url: tuple[str, bytes],
    tmp_path: Path,
) -> None:
    url, data = checkpoint_url
    tb = containerd_testbed
    cache = CheckpointCache(
        tmp_path / "ckpt", capacity_bytes=1 << 30, metrics=CheckpointMetrics(CollectorRegistry())
    )
    await cache.open()
    kubelet, sandbox_id = await _started(store, standin_kubelet, "job-k7", tb.trainer_v1)
    [old] = await _trainers(cri, sandbox_id)
    good = {"id": "job-k7/step-7", "url": url, "sha256": hashlib.sha256(data).hexdigest()}
    bad = {**good, "id": "job-k7/bad", "sha256": "0" * 64}
    async with _running(kubelet.run(), _controller(store, cri, checkpoints=cache).run()):
        # A checkpoint that does not verify: nothing is touched, the spec keeps v1.
        await store.patch(
            Kind.POD,
            "job-k7",
            {
                "metadata": {
                    "annotations": {
                        keys.ANN_HOT_RESTART: json.dumps(
                            {"id": "bad", "container": "trainer", "image": tb.trainer_v2, "checkpoint": bad}
                        )
                    }
                }
            },
            namespace="default",
        )
        failed = await _final(store, "job-k7", "bad")
        assert failed.phase is Phase.FAILED
        assert failed.message is not None and failed.message.startswith(
            "prelaunch failed (old container left running)"
        )
        assert failed.prelaunch is not None and not failed.prelaunch.ready
        assert await _spec_image(store, "job-k7") == tb.trainer_v1
        assert [c.id for c in await _trainers(cri, sandbox_id)] == [old.id]

        await store.patch(
            Kind.POD,
            "job-k7",
            {
                "metadata": {
                    "annotations": {
                        keys.ANN_HOT_RESTART: json.dumps(
                            {"id": "ok", "container": "trainer", "image": tb.trainer_v2, "checkpoint": good}
                        )
                    }
                }
            },
            namespace="default",
        )
        status = await _final(store, "job-k7", "ok")
    assert status.phase is Phase.SUCCEEDED, status.message
    report = status.prelaunch
    assert report is not None and report.ready and report.ready_at is not None
    assert report.checkpoint_result == "miss" and report.image_cached is True
    assert report.window_seconds > 0 and report.measured_window_seconds is not None
    entry = cache.get("job-k7/step-7")
    assert entry is not None and entry.path.read_bytes() == data


async def _status(store: MemoryStore, name: str) -> HotRestartStatus | None:
    pod = await store.get(Kind.POD, name, namespace="default")
    return parse_status(pod["metadata"].get("annotations", {}).get(keys.ANN_HOT_RESTART_STATUS))


NORMAL_FINAL_FIELDS = {
    "id",
    "phase",
    "strategy",
    "container",
    "image",
    "node",
    "sandboxId",
    "podIP",
    "containerId",
    "previousContainerId",
    "previousAttempt",
    "attempt",
    "imageCached",
    "imageId",
    "specImage",
    "previousSpecImage",
    "pullSeconds",
    "stopSeconds",
    "startSeconds",
    "pauseSeconds",
    "totalSeconds",
    "startedAt",
    "finishedAt",
}


async def test_a_broken_image_is_reported_in_seconds_and_rolled_back(
    cri: GrpcCri, store: MemoryStore, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    """The sequence seen on kubelet v1.36: an image whose entrypoint does not exist fails every
    start (StartError, exit code 128) and kubelet crash-loops it. With the default 120 s wait the
    agent reports Failed as soon as the replacement failed, then writes the previous image back
    into the spec, and the job trains on it again. (Before: Failed after 120 s, attempt 1, the pod
    left crash-looping.)"""
    tb = containerd_testbed
    kubelet, sandbox_id = await _started(store, standin_kubelet, "job-b1", tb.trainer_v1)
    [old] = await _trainers(cri, sandbox_id)
    broken = await cri.image_status(tb.trainer_broken)
    assert broken is not None

    async with _running(kubelet.run(), _controller(store, cri, kubelet_wait=120.0).run()):
        await _request(store, "job-b1", id="broken", container="trainer", image=tb.trainer_broken)
        status = await _final(store, "job-b1", "broken", within=30)  # seconds, not the 120 s wait
        assert status.phase is Phase.FAILED
        if status.rollback is not None and status.rollback.phase is Phase.IN_PROGRESS:
            status = await _rolled_back(store, "job-b1")

    assert status.message is not None
    assert "failed: StartError (exit code 128)" in status.message and "no-such-entrypoint" in status.message
    assert status.rollback is not None and status.rollback.phase is Phase.SUCCEEDED, status.rollback
    assert status.rollback.image == tb.trainer_v1 and status.previous_spec_image == tb.trainer_v1
    assert await _spec_image(store, "job-b1") == tb.trainer_v1
    [running] = await _trainers(cri, sandbox_id)
    assert await _version(cri, running.id) == b"v1"  # the job trains again
    assert status.container_id == running.id == status.rollback.container_id
    # kubelet starts the broken image once for the spec change and once more at once (its
    # back-off is armed only then), so the rolled-back container is attempt 2 or 3.
    assert status.attempt == running.attempt and running.attempt >= 2
    assert status.image_id == broken.id and status.spec_image == tb.trainer_broken
    assert status.pause_seconds is not None and 0 <= status.pause_seconds < 30
    assert status.previous_container_id == old.id
    assert (NORMAL_FINAL_FIELDS - {"containerId"}) <= set(status.to_json_obj())
    reasons = [(e.reason, e.message) for e in kubelet.events if e.container == "trainer"]
    assert any(r == "Failed" and "no-such-entrypoint" in m for r, m in reasons)
    [event] = await _events(store, "HotRestartFailed")
    assert "StartError" in event["message"]


async def _rolled_back(store: MemoryStore, name: str, *, within: float = 30) -> HotRestartStatus:
    async with asyncio.timeout(within):
        while True:
            status = await _status(store, name)
            if status is not None and status.rollback is not None and status.rollback.phase.final:
                return status
            await asyncio.sleep(0.05)


async def test_a_replacement_kubelet_cannot_create_is_reported_from_its_status_and_rolled_back(
    cri: GrpcCri, store: MemoryStore, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    """No container ever exists for the new image (CreateContainer refuses it: no command), so
    CRI shows nothing failing: kubelet's waiting reason in the pod's status says it."""
    tb = containerd_testbed
    kubelet, sandbox_id = await _started(store, standin_kubelet, "job-b2", tb.trainer_v1)
    async with _running(kubelet.run(), _controller(store, cri, kubelet_wait=120.0).run()):
        await _request(store, "job-b2", id="nocmd", container="trainer", image=tb.trainer_nocmd)
        await _final(store, "job-b2", "nocmd", within=30)
        status = await _rolled_back(store, "job-b2")
    assert status.phase is Phase.FAILED and status.message is not None
    # kubelet says CreateContainerError, and CrashLoopBackOff from its next sync on (the back-off
    # counts from the old container's exit): the agent reports whichever it sees first.
    prefix = "kubelet cannot run the replacement of 'trainer': "
    assert status.message.startswith(prefix), status.message
    reason = status.message.removeprefix(prefix)
    assert reason.startswith(("CreateContainerError: ", "CrashLoopBackOff: ")), reason
    assert "no command specified" in reason or "back-off 10s" in reason
    assert any("no command specified" in e.message for e in kubelet.events if e.reason == "Failed")
    assert status.rollback is not None and status.rollback.phase is Phase.SUCCEEDED
    [running] = await _trainers(cri, sandbox_id)
    assert await _version(cri, running.id) == b"v1" and status.container_id == running.id


async def test_with_rollback_off_a_failed_restart_is_only_reported(
    cri: GrpcCri, store: MemoryStore, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    tb = containerd_testbed
    kubelet, sandbox_id = await _started(store, standin_kubelet, "job-b3", tb.trainer_v1)
    async with _running(kubelet.run(), _controller(store, cri, kubelet_wait=120.0, rollback=False).run()):
        await _request(store, "job-b3", id="broken", container="trainer", image=tb.trainer_broken)
        status = await _final(store, "job-b3", "broken", within=30)
    assert status.phase is Phase.FAILED and status.rollback is None
    assert status.container_id is None and status.attempt is not None and status.attempt >= 1
    assert await _spec_image(store, "job-b3") == tb.trainer_broken  # left as it is
    assert await _trainers(cri, sandbox_id) == []


async def test_a_restart_resumed_after_the_agent_was_killed_ends_with_every_field(
    cri: GrpcCri, store: MemoryStore, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    """The agent is killed after it wrote the image into the spec; kubelet restarts the container
    meanwhile; the next agent finds the replacement running and ends the request with every
    field a restart it saw through carries (imageId, pauseSeconds, totalSeconds, …)."""
    tb = containerd_testbed
    kubelet, sandbox_id = await _started(store, standin_kubelet, "job-r1", tb.trainer_v1)
    async with _running(kubelet.run(), _controller(store, cri).run()):
        await _request(store, "job-r1", id="normal", container="trainer", image=tb.trainer_v2)
        normal = await _final(store, "job-r1", "normal")
    assert normal.phase is Phase.SUCCEEDED, normal.message
    assert set(normal.to_json_obj()) >= NORMAL_FINAL_FIELDS

    agent = asyncio.create_task(_controller(store, cri).run())
    try:
        await _request(store, "job-r1", id="resumed", container="trainer", image=tb.trainer_v1)
        async with asyncio.timeout(30):
            while True:  # until the agent wrote the image into the spec
                if await _spec_image(store, "job-r1") == tb.trainer_v1:
                    break
                await asyncio.sleep(0.02)
    finally:
        agent.cancel()  # killed mid-way: the spec is patched, kubelet has not acted yet
        with contextlib.suppress(asyncio.CancelledError):
            await agent
    interrupted = await _status(store, "job-r1")
    assert interrupted is not None and interrupted.phase is Phase.IN_PROGRESS
    await kubelet.sync_once()  # kubelet restarts the container while no agent runs
    async with _running(_controller(store, cri).run()):
        resumed = await _final(store, "job-r1", "resumed")

    assert resumed.phase is Phase.SUCCEEDED, resumed.message
    fields = resumed.to_json_obj()
    assert set(fields) >= NORMAL_FINAL_FIELDS, NORMAL_FINAL_FIELDS - set(fields)
    v1 = await cri.image_status(tb.trainer_v1)
    assert v1 is not None and resumed.image_id == v1.id
    assert resumed.pause_seconds is not None and 0 <= resumed.pause_seconds < 10
    assert resumed.total_seconds is not None and resumed.total_seconds >= resumed.pause_seconds
    assert resumed.stop_seconds == 0.0 and resumed.start_seconds is not None and resumed.start_seconds >= 0
    assert resumed.pull_seconds == interrupted.pull_seconds
    [running] = await _trainers(cri, sandbox_id)
    assert resumed.container_id == running.id and resumed.attempt == running.attempt == 2
    assert resumed.started_at == interrupted.started_at


class _DiesBeforeTheRollbackPatch:
    """The store as the agent sees it, until the agent dies: the patch writing the previous
    image back into the spec never completes (the agent was killed right before it)."""

    def __init__(self, inner: MemoryStore, image: str) -> None:
        self._inner = inner
        self._image = image
        self.reached = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def patch(self, kind: Kind, name: str, patch: dict[str, Any], **kw: Any) -> JsonObj:
        if "spec" in patch and self._image in json.dumps(patch):
            self.reached.set()
            await asyncio.Event().wait()  # until cancelled
        return await self._inner.patch(kind, name, patch, **kw)


async def test_a_rollback_interrupted_by_an_agent_restart_is_finished_by_the_next_agent(
    cri: GrpcCri, store: MemoryStore, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    tb = containerd_testbed
    kubelet, sandbox_id = await _started(store, standin_kubelet, "job-r2", tb.trainer_v1)
    dying = _DiesBeforeTheRollbackPatch(store, tb.trainer_v1)
    async with _running(kubelet.run()):
        agent = asyncio.create_task(_controller(dying, cri).run())
        try:
            await _request(store, "job-r2", id="broken", container="trainer", image=tb.trainer_broken)
            await asyncio.wait_for(dying.reached.wait(), 30)
        finally:
            agent.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await agent
        reported = await _status(store, "job-r2")
        assert reported is not None and reported.phase is Phase.FAILED
        assert reported.rollback is not None and reported.rollback.phase is Phase.IN_PROGRESS
        assert await _spec_image(store, "job-r2") == tb.trainer_broken  # the agent died before undoing
        async with _running(_controller(store, cri).run()):
            status = await _rolled_back(store, "job-r2")
    assert status.rollback is not None and status.rollback.phase is Phase.SUCCEEDED
    assert status.message == reported.message  # the failure's reason is kept
    assert await _spec_image(store, "job-r2") == tb.trainer_v1
    [running] = await _trainers(cri, sandbox_id)
    assert await _version(cri, running.id) == b"v1" and status.container_id == running.id
