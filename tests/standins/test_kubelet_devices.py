"""The test kubelet behaves like upstream kubelet where it matters: it refuses bad
registrations, lists one ContainerDevices entry per device, and on restart deletes the
plugin sockets (keeping its checkpoint) and recreates kubelet.sock."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from nodeagent.deviceplugin import deviceplugin_pb2 as pb
from nodeagent.deviceplugin import podresources_pb2 as prpb
from nodeagent.deviceplugin import rpc
from standins.kubelet_devices import CHECKPOINT, DeviceKubelet


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
