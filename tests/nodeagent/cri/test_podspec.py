"""CRI configs built the way kubelet builds them, and the node's network for hostNetwork pods."""

from __future__ import annotations

from pathlib import Path

from flexlease.cri import api_pb2
from nodeagent.cri import podspec

REF = podspec.PodRef("ml", "trainer-0", "uid-1")


def test_pod_network_by_default() -> None:
    sandbox = podspec.sandbox_config(REF, Path("/logs"))
    container = podspec.container_config(REF, podspec.ContainerSpec("trainer", "img"))
    for ns in (
        sandbox.linux.security_context.namespace_options,
        container.linux.security_context.namespace_options,
    ):
        assert (ns.network, ns.pid, ns.ipc) == (api_pb2.POD, api_pb2.CONTAINER, api_pb2.POD)
    assert sandbox.hostname == "trainer-0"


def test_host_network_shares_the_nodes_network_and_hostname() -> None:
    sandbox = podspec.sandbox_config(REF, Path("/logs"), host_network=True)
    container = podspec.container_config(REF, podspec.ContainerSpec("trainer", "img"), host_network=True)
    for ns in (
        sandbox.linux.security_context.namespace_options,
        container.linux.security_context.namespace_options,
    ):
        assert (ns.network, ns.pid, ns.ipc) == (api_pb2.NODE, api_pb2.CONTAINER, api_pb2.POD)
    assert sandbox.hostname == ""  # runc refuses a hostname without a private UTS namespace
