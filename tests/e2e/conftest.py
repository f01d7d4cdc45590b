"""End-to-end tests start real processes; the demo and orchestrator tests also need the real
containerd testbed (one per session for this directory)."""

from tests.nodeagent.conftest import ContainerdTestbed, Pods, containerd_testbed, cri, pods

__all__ = ["ContainerdTestbed", "Pods", "containerd_testbed", "cri", "pods"]
