"""The stand-in kubelet (standins.kubelet_pods) behaves like kubelet on a real containerd: image
IDs and kubelet's annotations, crash-loop back-off on an injectable clock, restartPolicy,
spec-change restarts, container statuses with kubelet's waiting reasons, and device
admission with PreStartContainer before each start."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from flexlease import errors
from flexlease.api import keys
from flexlease.store.base import JsonObj, Kind
from flexlease.store.memory import MemoryStore
from flexlease.tasks import stop
from nodeagent.cri.client import (
    ANN_CONTAINER_HASH,
    ANN_CONTAINER_RESTART_COUNT,
    LABEL_POD_UID,
    ContainerInfo,
    ContainerState,
    GrpcCri,
    SandboxState,
)
from standins.kubelet_devices import DeviceKubelet
from standins.kubelet_pods import StandInKubelet, hash_container
from tests.nodeagent.conftest import ContainerdTestbed, KubeletFactory
from tests.standins.throwaway_plugin import ThrowawayPlugin

pytestmark = pytest.mark.containerd

NODE = "node-a"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    s = MemoryStore()
    try:
        yield s
    finally:
        await s.close()


async def _pod(store: MemoryStore, name: str, image: str, policy: str = "Always") -> JsonObj:
    return await store.create(
        Kind.POD,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "nodeName": NODE,
                "restartPolicy": policy,
                "terminationGracePeriodSeconds": 3,
                "containers": [{"name": "trainer", "image": image}],
            },
        },
    )


async def _trainers(cri: GrpcCri, kubelet: StandInKubelet, name: str) -> list[ContainerInfo]:
    sid = kubelet.sandbox_id("default", name)
    return sorted(
        (c for c in await cri.list_containers(sandbox_id=sid) if c.name == "trainer"), key=lambda c: c.attempt
    )


async def _running(cri: GrpcCri, kubelet: StandInKubelet, name: str) -> list[ContainerInfo]:
    return [c for c in await _trainers(cri, kubelet, name) if c.state is ContainerState.RUNNING]


async def _trap_set(testbed: ContainerdTestbed, pod: JsonObj, attempt: int = 0) -> None:
    """Until the trainer printed that it started, after setting its SIGTERM trap: stopped before
    that, its shell dies of the signal (exit 143) instead of exiting 0."""
    meta = pod["metadata"]
    log = (
        testbed.log_root / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / "trainer" / f"{attempt}.log"
    )
    async with asyncio.timeout(10):
        while True:  # a file, not an event to wait on
            if log.exists() and b"started" in log.read_bytes():
                return
            await asyncio.sleep(0.02)


async def test_runs_pods_like_kubelet(
    cri: GrpcCri, store: MemoryStore, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    pod = await _pod(store, "p1", containerd_testbed.trainer_v1)
    kubelet = standin_kubelet(store, NODE)
    await kubelet.sync_once()
    sandbox = await cri.pod_sandbox_status(kubelet.sandbox_id("default", "p1"))
    assert sandbox.labels[LABEL_POD_UID] == pod["metadata"]["uid"]
    assert keys.LABEL_NO_KUBELET not in sandbox.labels
    [c] = await _running(cri, kubelet, "p1")
    image = await cri.image_status(containerd_testbed.trainer_v1)
    assert image is not None and c.image == image.id  # created by image ID
    assert c.annotations[ANN_CONTAINER_HASH] == hash_container(pod["spec"]["containers"][0])
    assert c.annotations[ANN_CONTAINER_RESTART_COUNT] == "0" and c.attempt == 0
    config = await cri.container_config(c.id)
    assert config.image.image == image.id  # (containerd 1.6 keeps no user_specified_image)
    await kubelet.sync_once()  # nothing to do
    assert [x.id for x in await _running(cri, kubelet, "p1")] == [c.id]


async def test_crash_loop_backoff_on_an_unchanged_spec(
    cri: GrpcCri, store: MemoryStore, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    clock = Clock()
    await _pod(store, "p2", containerd_testbed.trainer_v1)
    kubelet = standin_kubelet(store, NODE, clock=clock)
    await kubelet.sync_once()

    async def exit_and_sync() -> None:
        [c] = await _running(cri, kubelet, "p2")
        await cri.stop_container(c.id, timeout_seconds=3)
        await kubelet.sync_once()

    await exit_and_sync()  # first restart: at once
    assert [c.attempt for c in await _running(cri, kubelet, "p2")] == [1]
    await exit_and_sync()  # second exit within 10 s: back-off
    assert await _running(cri, kubelet, "p2") == []
    assert kubelet.events[-1].reason == "BackOff"
    assert kubelet.events[-1].message.startswith(
        "back-off 10s restarting failed container=trainer pod=p2_default"
    )
    clock.now += 9.9
    await kubelet.sync_once()
    assert await _running(cri, kubelet, "p2") == []
    clock.now += 0.1
    await kubelet.sync_once()
    assert [c.attempt for c in await _running(cri, kubelet, "p2")] == [2]
    await exit_and_sync()
    assert kubelet.events[-1].message.startswith("back-off 20s")
    clock.now += 20
    await kubelet.sync_once()
    # Container GC keeps only the newest dead instance.
    assert [(c.attempt, c.state) for c in await _trainers(cri, kubelet, "p2")] == [
        (2, ContainerState.EXITED),
        (3, ContainerState.RUNNING),
    ]
    clock.now += 601  # ran for more than 10 min: back-off starts over
    await exit_and_sync()
    assert [c.attempt for c in await _running(cri, kubelet, "p2")] == [4]
    await exit_and_sync()
    assert kubelet.events[-1].message.startswith("back-off 10s")


@pytest.mark.parametrize("policy", ["OnFailure", "Never"])
async def test_a_clean_exit_ends_a_job_pod(
    policy: str,
    cri: GrpcCri,
    store: MemoryStore,
    containerd_testbed: ContainerdTestbed,
    standin_kubelet: KubeletFactory,
) -> None:
    name = f"job-{policy.lower()}"
    pod = await _pod(store, name, containerd_testbed.trainer_v1, policy)
    kubelet = standin_kubelet(store, NODE)
    await kubelet.sync_once()
    [c] = await _running(cri, kubelet, name)
    await _trap_set(containerd_testbed, pod)
    await cri.stop_container(c.id, timeout_seconds=3)  # SIGTERM: the trainer exits 0
    await kubelet.sync_once()
    assert kubelet.phase("default", name) == "Succeeded"
    pod = await store.get(Kind.POD, name, namespace="default")
    assert pod["status"]["phase"] == "Succeeded"
    sandbox = await cri.pod_sandbox_status(kubelet.sandbox_id("default", name))
    assert sandbox.state is SandboxState.NOTREADY
    assert await _running(cri, kubelet, name) == []


async def test_a_spec_change_restarts_whatever_the_policy(
    cri: GrpcCri, store: MemoryStore, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    pod = await _pod(store, "p3", containerd_testbed.trainer_v1, "Never")
    kubelet = standin_kubelet(store, NODE)
    await kubelet.sync_once()
    [old] = await _running(cri, kubelet, "p3")
    containers = [{**pod["spec"]["containers"][0], "image": containerd_testbed.trainer_v2}]
    await store.patch(Kind.POD, "p3", {"spec": {"containers": containers}}, namespace="default")
    await kubelet.sync_once()
    [new] = await _running(cri, kubelet, "p3")
    assert new.id != old.id and new.attempt == 1
    assert (await cri.container_status(old.id)).state is ContainerState.EXITED
    assert ("Killing", "Container trainer definition changed, will be restarted") in [
        (e.reason, e.message) for e in kubelet.events
    ]
    out = await cri.exec_sync(new.id, ["cat", "/etc/trainer-version"], timeout_seconds=5)
    assert out.stdout.strip() == b"v2"
    assert kubelet.phase("default", "p3") == "Running"


async def test_a_pod_that_cannot_run_keeps_its_errors_and_backs_off(
    cri: GrpcCri, store: MemoryStore, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    clock = Clock()
    missing = f"{containerd_testbed.registry}/flexlease/missing:v0"
    await _pod(store, "bad", missing)
    await _pod(store, "good", containerd_testbed.trainer_v1)
    kubelet = standin_kubelet(store, NODE, clock=clock)

    def bad_events() -> list[tuple[str, str]]:
        return [(e.reason, e.message) for e in kubelet.events if e.pod == "default/bad"]

    await kubelet.sync_once()  # the bad pod's pull fails; the good pod runs all the same
    assert len(await _running(cri, kubelet, "good")) == 1
    assert kubelet.sync_errors == 1
    [(reason, message)] = bad_events()
    assert reason == "Failed" and message.startswith(f'Failed to pull image "{missing}": ')
    clock.now += 9.9  # the pod worker's back-off: not synced again yet
    await kubelet.sync_once()
    assert len(bad_events()) == 1 and kubelet.sync_errors == 1
    clock.now += 0.1  # 10 s: synced again; the image back-off (10 s since the pull) is over
    await kubelet.sync_once()
    assert [r for r, _ in bad_events()] == ["Failed", "Failed"] and kubelet.sync_errors == 2
    clock.now += 10  # synced again, but within the image back-off (now 20 s): no pull
    await kubelet.sync_once()
    assert bad_events()[-1] == ("BackOff", f'Back-off pulling image "{missing}"')
    assert kubelet.sync_errors == 3
    assert len(await _running(cri, kubelet, "good")) == 1


async def test_run_outlives_a_store_that_cannot_list(
    cri: GrpcCri, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    closed = MemoryStore()
    await closed.close()
    kubelet = standin_kubelet(closed, NODE, period_seconds=0.01)
    task = asyncio.create_task(kubelet.run())
    await asyncio.sleep(0.1)  # several passes, each failing to list
    assert not task.done()
    await stop(task)


async def test_a_pod_update_is_synced_at_once_and_each_container_is_tried(
    cri: GrpcCri, store: MemoryStore, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    clock = Clock()
    missing = f"{containerd_testbed.registry}/flexlease/missing:v0"
    sidecar = {"name": "sidecar", "image": containerd_testbed.trainer_v1}
    containers = [{"name": "trainer", "image": missing}, sidecar]
    await store.create(
        Kind.POD,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "mixed", "namespace": "default"},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 3, "containers": containers},
        },
    )
    kubelet = standin_kubelet(store, NODE, clock=clock)
    await kubelet.sync_once()  # the trainer's pull fails; the sidecar starts all the same
    sid = kubelet.sandbox_id("default", "mixed")
    running = {c.name for c in await cri.list_containers(sandbox_id=sid) if c.state is ContainerState.RUNNING}
    assert running == {"sidecar"} and kubelet.sync_errors == 1
    fixed = [{**containers[0], "image": containerd_testbed.trainer_v1}, sidecar]
    await store.patch(Kind.POD, "mixed", {"spec": {"containers": fixed}}, namespace="default")
    await kubelet.sync_once()  # within the back-off, but the pod changed: synced now
    running = {c.name for c in await cri.list_containers(sandbox_id=sid) if c.state is ContainerState.RUNNING}
    assert running == {"trainer", "sidecar"} and kubelet.sync_errors == 1


async def test_a_pod_end_that_could_not_be_recorded_is_recorded_later(
    cri: GrpcCri,
    store: MemoryStore,
    containerd_testbed: ContainerdTestbed,
    standin_kubelet: KubeletFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    await _pod(store, "job", containerd_testbed.trainer_v1, "Never")
    kubelet = standin_kubelet(store, NODE, clock=clock)
    await kubelet.sync_once()
    [c] = await _running(cri, kubelet, "job")
    await cri.stop_container(c.id, timeout_seconds=3)  # exits 0
    real_patch = store.patch

    async def unavailable(*args: object, **kwargs: object) -> JsonObj:
        raise errors.StoreError("the API server is away", status=503)

    monkeypatch.setattr(store, "patch", unavailable)
    await kubelet.sync_once()
    assert kubelet.sync_errors == 1 and kubelet.phase("default", "job") == "Running"
    monkeypatch.setattr(store, "patch", real_patch)
    clock.now += 10
    await kubelet.sync_once()
    assert kubelet.phase("default", "job") == "Succeeded"
    assert (await store.get(Kind.POD, "job", namespace="default"))["status"]["phase"] == "Succeeded"


async def test_a_gpu_container_cannot_restart_while_a_plugin_requiring_pre_start_is_gone(
    cri: GrpcCri, store: MemoryStore, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    """The sequence seen on kubelet v1.36: the plugin registered with PreStartRequired is gone,
    the container's process ends, and kubelet cannot create its replacement
    (CreateContainerConfigError, "device plugin PreStartContainer rpc failed … has been
    stopped") until the plugin is back."""
    base = Path(tempfile.mkdtemp(prefix="kp-", dir="/tmp"))  # unix socket paths stay short
    devices = DeviceKubelet(base / "dp", base / "pr" / "kubelet.sock")
    await devices.start()
    plugin = ThrowawayPlugin(devices.plugin_dir, "example.com/dev", ["d0"], pre_start_required=True)
    try:
        await plugin.start(devices.kubelet_socket)
        await devices.wait_registered("example.com/dev")
        container = {
            "name": "trainer",
            "image": containerd_testbed.trainer_v1,
            "resources": {"limits": {"example.com/dev": "1"}},
        }
        pod = await store.create(
            Kind.POD,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "gpu", "namespace": "default"},
                "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 3, "containers": [container]},
            },
        )
        clock = Clock()
        kubelet = standin_kubelet(store, NODE, clock=clock, devices=devices)
        await kubelet.sync_once()  # admitted (Allocate), PreStartContainer, started
        [c] = await _running(cri, kubelet, "gpu")
        out = await cri.exec_sync(c.id, ["sh", "-c", "echo $DEVICES"], timeout_seconds=5)
        assert out.stdout.strip() == b"d0" and plugin.pre_starts == [["d0"]]
        await _trap_set(containerd_testbed, pod)

        await plugin.stop()
        stopped = devices.plugins["example.com/dev"]
        async with asyncio.timeout(10):
            while not stopped.stopped:
                await stopped.changed.wait()
        await cri.stop_container(c.id, timeout_seconds=3)
        await kubelet.sync_once()
        assert await _running(cri, kubelet, "gpu") == []
        message = (
            "device plugin PreStartContainer rpc failed with err: "
            f"endpoint &{{{plugin.socket} example.com/dev}} has been stopped"
        )
        assert (kubelet.events[-1].reason, kubelet.events[-1].message) == ("Failed", f"Error: {message}")
        [status] = (await store.get(Kind.POD, "gpu", namespace="default"))["status"]["containerStatuses"]
        assert status["state"] == {"waiting": {"reason": "CreateContainerConfigError", "message": message}}
        assert status["lastState"]["terminated"]["exitCode"] == 0 and status["restartCount"] == 0
        clock.now += 10  # the pod worker's back-off: tried again, failing the same way
        await kubelet.sync_once()
        assert await _running(cri, kubelet, "gpu") == [] and kubelet.events[-1].message == f"Error: {message}"

        await plugin.start(devices.kubelet_socket)  # the plugin is back
        await devices.wait_registered("example.com/dev", registrations=2)
        clock.now += 20  # past the crash-loop back-off (now 20 s)
        await kubelet.sync_once()
        [again] = await _running(cri, kubelet, "gpu")
        assert again.attempt == 1 and len(plugin.pre_starts) == 2
        [status] = (await store.get(Kind.POD, "gpu", namespace="default"))["status"]["containerStatuses"]
        assert "running" in status["state"] and status["ready"] and status["restartCount"] == 1
    finally:
        await plugin.stop()
        await devices.stop()
        shutil.rmtree(base, ignore_errors=True)


async def test_an_image_that_cannot_start_crash_loops_with_kubelets_back_off(
    cri: GrpcCri, store: MemoryStore, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    """The sequence seen on kubelet v1.36 with an image whose entrypoint does not exist: each start
    fails (containerd: StartError, exit code 128); the second try comes at once (the back-off is
    armed then), the next ones after 10 s, 20 s, … capped at 300 s, with CrashLoopBackOff in
    between."""
    clock = Clock()
    await _pod(store, "broken", containerd_testbed.trainer_broken)
    kubelet = standin_kubelet(store, NODE, clock=clock)

    async def status() -> JsonObj:
        [entry] = (await store.get(Kind.POD, "broken", namespace="default"))["status"]["containerStatuses"]
        return dict(entry)

    await kubelet.sync_once()  # attempt 0: StartError
    first = await status()
    assert first["state"]["waiting"]["reason"] == "RunContainerError"
    assert first["lastState"]["terminated"]["exitCode"] == 128
    assert first["lastState"]["terminated"]["reason"] == "StartError"
    assert "no-such-entrypoint" in first["lastState"]["terminated"]["message"]
    await kubelet.sync_once()  # PLEG saw it die: attempt 1 at once
    await kubelet.sync_once()  # now in back-off
    assert [c.attempt for c in await _trainers(cri, kubelet, "broken")] == [1]  # GC keeps the newest
    waiting = (await status())["state"]["waiting"]
    assert waiting["reason"] == "CrashLoopBackOff"
    assert waiting["message"].startswith(
        "back-off 10s restarting failed container=trainer pod=broken_default"
    )
    attempt = 1
    for backoff, after in ((10, 20), (20, 40), (40, 80), (80, 160), (160, 300), (300, 300)):
        clock.now += backoff - 0.1
        await kubelet.sync_once()
        assert [c.attempt for c in await _trainers(cri, kubelet, "broken")] == [attempt]
        clock.now += 0.1
        await kubelet.sync_once()  # restarted: fails again
        await kubelet.sync_once()
        attempt += 1
        assert [c.attempt for c in await _trainers(cri, kubelet, "broken")] == [attempt]
        current = await status()
        assert current["restartCount"] == attempt
        assert current["state"]["waiting"]["message"].startswith(f"back-off {after}s restarting failed")
        assert current["lastState"]["terminated"]["exitCode"] == 128
    assert await _running(cri, kubelet, "broken") == []
