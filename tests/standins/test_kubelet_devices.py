"""The test kubelet behaves like upstream kubelet where it matters: it refuses bad
registrations, lists one ContainerDevices entry per device, on restart deletes the plugin
sockets (keeping its checkpoint) and recreates kubelet.sock, and calls PreStartContainer
before each container start only for a plugin that requires it — failing the start while
that plugin is gone."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from nodeagent.deviceplugin import deviceplugin_pb2 as pb
from nodeagent.deviceplugin import podresources_pb2 as prpb
from nodeagent.deviceplugin import rpc
from standins.kubelet_devices import CHECKPOINT, AdmissionError, DeviceKubelet, PreStartError
from tests.standins.throwaway_plugin import ThrowawayPlugin


@pytest.fixture
async def kubelet() -> AsyncIterator[DeviceKubelet]:
    base = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))
    k = DeviceKubelet(base / "dp", base / "pr" / "kubelet.sock")
    await k.start()
    try:
        yield k
    finally:
        await k.stop()
        shutil.rmtree(base, ignore_errors=True)


async def _register(k: DeviceKubelet, request: pb.RegisterRequest) -> None:
    async with grpc.aio.insecure_channel(f"unix:{k.kubelet_socket}") as channel:
        await rpc.unary_call(channel, rpc.REGISTRATION, "Register", pb.Empty)(request, timeout=5)


@pytest.mark.parametrize(
    ("version", "resource"),
    [("v1alpha", "nvidia.com/gpu"), ("v1beta1", "gpu"), ("v1beta1", "kubernetes.io/gpu")],
)
async def test_bad_registrations_are_refused(kubelet: DeviceKubelet, version: str, resource: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _register(
            kubelet, pb.RegisterRequest(version=version, endpoint="x.sock", resource_name=resource)
        )
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert not kubelet.plugins


async def test_restart_deletes_plugin_sockets_keeps_the_checkpoint_and_recreates_kubelet_sock(
    kubelet: DeviceKubelet,
) -> None:
    (kubelet.plugin_dir / "vendor.sock").write_text("")
    (kubelet.plugin_dir / CHECKPOINT).write_text("{}")
    await kubelet.restart()
    assert sorted(p.name for p in kubelet.plugin_dir.iterdir()) == sorted([CHECKPOINT, "kubelet.sock"])
    assert kubelet.restarts == 1
    async with grpc.aio.insecure_channel(f"unix:{kubelet.pod_resources_socket}") as channel:
        listed = await rpc.unary_call(channel, rpc.POD_RESOURCES, "List", prpb.ListPodResourcesResponse)(
            prpb.ListPodResourcesRequest(), timeout=5
        )
    assert list(listed.pod_resources) == []


async def _until_stopped(k: DeviceKubelet, resource: str) -> None:
    plugin = k.plugins[resource]
    async with asyncio.timeout(10):
        while not plugin.stopped:
            await plugin.changed.wait()


async def test_pre_start_container_runs_before_each_start_and_fails_once_the_plugin_is_gone(
    kubelet: DeviceKubelet,
) -> None:
    """kubelet's ``callPreStartContainerIfNeeded``: a plugin registered with
    ``pre_start_required`` is called before every start of a container holding its devices (not
    at admission); once its endpoint stopped, the start fails with kubelet's message until the
    plugin registers again."""
    plugin = ThrowawayPlugin(kubelet.plugin_dir, "example.com/dev", ["d0", "d1"], pre_start_required=True)
    await plugin.start(kubelet.kubelet_socket)
    try:
        await kubelet.wait_registered("example.com/dev")
        got = await kubelet.admit("default", "p", [("main", 2), ("sidecar", 0)], resource="example.com/dev")
        assert got["main"].response.envs["DEVICES"] in ("d0,d1", "d1,d0")
        assert plugin.pre_starts == []  # admission does not call it
        await kubelet.pre_start_container("default", "p", "main")
        await kubelet.pre_start_container("default", "p", "main")  # a restart: called again
        assert [sorted(ids) for ids in plugin.pre_starts] == [["d0", "d1"], ["d0", "d1"]]

        await plugin.stop()
        await _until_stopped(kubelet, "example.com/dev")
        with pytest.raises(PreStartError) as err:
            await kubelet.pre_start_container("default", "p", "main")
        assert str(err.value) == (
            "device plugin PreStartContainer rpc failed with err: "
            f"endpoint &{{{plugin.socket} example.com/dev}} has been stopped"
        )
        await kubelet.pre_start_container("default", "p", "sidecar")  # holds no device: not affected
        with pytest.raises(AdmissionError, match="has been stopped"):
            await kubelet.admit("default", "q", [("main", 1)], resource="example.com/dev")

        await plugin.start(kubelet.kubelet_socket)  # back: starts work again
        await kubelet.wait_registered("example.com/dev", registrations=2)
        await kubelet.pre_start_container("default", "p", "main")
        assert len(plugin.pre_starts) == 3
    finally:
        await plugin.stop()


async def test_a_plugin_that_does_not_require_pre_start_is_never_called_there(kubelet: DeviceKubelet) -> None:
    plugin = ThrowawayPlugin(kubelet.plugin_dir, "example.com/dev", ["d0"], pre_start_required=False)
    await plugin.start(kubelet.kubelet_socket)
    try:
        await kubelet.wait_registered("example.com/dev")
        await kubelet.admit("default", "p", [("main", 1)], resource="example.com/dev")
        await kubelet.pre_start_container("default", "p", "main")
        await plugin.stop()
        await _until_stopped(kubelet, "example.com/dev")
        await kubelet.pre_start_container("default", "p", "main")  # gone, and the start goes on
        assert plugin.pre_starts == []
        assert not [c for c in kubelet.calls if c.method == "PreStartContainer"]
    finally:
        await plugin.stop()
