"""GrpcCri against the real containerd of the testbed, plus deadline/version checks against an
in-process gRPC server built from the generated ``api_pb2_grpc`` servicer."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from flexlease import errors
from flexlease.cri import api_pb2, api_pb2_grpc
from nodeagent.cri import podspec
from nodeagent.cri.client import (
    LABEL_CONTAINER_NAME,
    LABEL_POD_UID,
    ContainerState,
    GrpcCri,
    ImageService,
    RuntimeService,
    SandboxState,
)
from tests.nodeagent.conftest import ContainerdTestbed, Pods

pytestmark = pytest.mark.containerd


async def test_connect_probes_version(cri: GrpcCri) -> None:
    assert cri.runtime is not None
    assert cri.runtime.runtime_name == "containerd"
    assert cri.runtime.runtime_api_version == "v1"
    assert isinstance(cri, RuntimeService)
    assert isinstance(cri, ImageService)


async def test_sandbox_gets_a_cni_pod_ip(
    cri: GrpcCri, pods: Pods, containerd_testbed: ContainerdTestbed
) -> None:
    pod = await pods.run("net", {})
    status = await cri.pod_sandbox_status(pod.sandbox_id)
    assert status.state is SandboxState.READY
    assert status.uid == pod.ref.uid
    assert status.ip is not None
    assert ipaddress.ip_address(status.ip) in ipaddress.ip_network(containerd_testbed.cni_subnet)
    listed = await cri.list_pod_sandboxes(labels={LABEL_POD_UID: pod.ref.uid}, state=SandboxState.READY)
    assert [s.id for s in listed] == [pod.sandbox_id]
    config = await cri.pod_sandbox_config(pod.sandbox_id)
    assert config.metadata.uid == pod.ref.uid
    assert config.linux.cgroup_parent == containerd_testbed.cgroup_parent


async def test_container_lifecycle(
    cri: GrpcCri, pods: Pods, containerd_testbed: ContainerdTestbed, tmp_path: Path
) -> None:
    volume = tmp_path / "vol"
    volume.mkdir()
    (volume / "marker").write_text("kept")
    pod = await pods.run(
        "life",
        {"trainer": containerd_testbed.trainer_v1},
        mounts=(podspec.HostMount(volume, "/data"),),
    )
    cid = pod.containers["trainer"]
    status = await cri.container_status(cid)
    assert status.state is ContainerState.RUNNING
    assert status.sandbox_id == pod.sandbox_id
    assert status.name == "trainer" and status.attempt == 0
    assert status.image == containerd_testbed.trainer_v1
    assert status.started_at_ns > 0

    out = await cri.exec_sync(cid, ["cat", "/etc/trainer-version", "/data/marker"], timeout_seconds=5)
    assert out.exit_code == 0
    assert out.stdout == b"v1\nkept"

    config = await cri.container_config(cid)
    assert config.metadata.name == "trainer"
    assert config.image.image == containerd_testbed.trainer_v1
    assert [(m.host_path, m.container_path) for m in config.mounts] == [(str(volume), "/data")]
    assert {e.key: e.value for e in config.envs} == {"POD_NAME": "life"}
    assert config.labels[LABEL_CONTAINER_NAME] == "trainer"
    assert config.linux.security_context.namespace_options.pid == api_pb2.CONTAINER

    listed = await cri.list_containers(sandbox_id=pod.sandbox_id, labels={LABEL_CONTAINER_NAME: "trainer"})
    assert [c.id for c in listed] == [cid]

    await cri.stop_container(cid, timeout_seconds=10)
    await cri.stop_container(cid, timeout_seconds=10)  # idempotent
    stopped = await cri.container_status(cid)
    assert stopped.state is ContainerState.EXITED
    assert stopped.exit_code == 0  # the trainer traps SIGTERM and exits 0
    assert await cri.list_containers(sandbox_id=pod.sandbox_id, state=ContainerState.RUNNING) == []
    await cri.remove_container(cid)
    with pytest.raises(errors.CriNotFound):
        await cri.container_status(cid)


async def test_pull_list_remove_image(cri: GrpcCri, containerd_testbed: ContainerdTestbed) -> None:
    image = containerd_testbed.large_image
    await cri.remove_image(image)  # idempotent; other tests may have pulled it
    assert await cri.image_status(image) is None
    ref = await cri.pull_image(image)
    info = await cri.image_status(image)
    assert info is not None and info.id == ref
    assert info.size_bytes > 32 * 1024 * 1024  # the large layer came over the wire
    assert image in {tag for i in await cri.list_images() for tag in i.repo_tags}
    await cri.remove_image(image)
    assert await cri.image_status(image) is None


async def test_runtime_errors_are_cri_errors(
    cri: GrpcCri, pods: Pods, containerd_testbed: ContainerdTestbed
) -> None:
    with pytest.raises(errors.CriNotFound, match="deadbeef"):
        await cri.container_status("deadbeef")
    with pytest.raises(errors.CriNotFound):
        await cri.pull_image(f"{containerd_testbed.registry}/flexlease/missing:v0")
    pod = await pods.run("refuse", {})
    spec = podspec.ContainerSpec(name="c", image="localhost/flexlease/not-loaded:v0")
    with pytest.raises(errors.CriError) as info:
        await cri.create_container(
            pod.sandbox_id, podspec.container_config(pod.ref, spec), pod.sandbox_config
        )
    assert not isinstance(info.value, errors.CriUnavailable)


async def test_absent_runtime_is_unavailable(tmp_path: Path) -> None:
    client = GrpcCri(f"unix://{tmp_path}/absent.sock", timeout_seconds=1)
    with pytest.raises(errors.CriUnavailable, match=r"absent\.sock"):
        await client.connect()
    with pytest.raises(errors.CriUnavailable, match="not connected"):
        await client.version()


class _SlowRuntime(api_pb2_grpc.RuntimeServiceServicer):
    """A CRI server that answers Version as ``api_version`` and sleeps in ListContainers."""

    def __init__(self, api_version: str) -> None:
        self.api_version = api_version

    async def Version(self, request: api_pb2.VersionRequest, context: object) -> api_pb2.VersionResponse:
        return api_pb2.VersionResponse(
            version="0.1.0",
            runtime_name="stand-in",
            runtime_version="0",
            runtime_api_version=self.api_version,
        )

    async def ListContainers(
        self, request: api_pb2.ListContainersRequest, context: object
    ) -> api_pb2.ListContainersResponse:
        await asyncio.sleep(5)
        return api_pb2.ListContainersResponse()


async def _serve(tmp_path: Path, api_version: str) -> AsyncIterator[str]:
    server = grpc.aio.server()
    api_pb2_grpc.add_RuntimeServiceServicer_to_server(_SlowRuntime(api_version), server)
    endpoint = f"unix://{tmp_path}/cri.sock"
    server.add_insecure_port(endpoint)
    await server.start()
    try:
        yield endpoint
    finally:
        await server.stop(grace=None)


async def test_every_call_has_a_deadline(tmp_path: Path) -> None:
    async for endpoint in _serve(tmp_path, "v1"):
        async with GrpcCri(endpoint, timeout_seconds=0.3) as client:
            with pytest.raises(errors.CriUnavailable, match=r"within 0\.3 s"):
                await client.list_containers()


async def test_connect_refuses_other_cri_versions(tmp_path: Path) -> None:
    async for endpoint in _serve(tmp_path, "v1alpha2"):
        client = GrpcCri(endpoint, timeout_seconds=2)
        with pytest.raises(errors.CriError, match="v1alpha2"):
            await client.connect()
