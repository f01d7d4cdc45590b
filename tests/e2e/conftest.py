"""End-to-end tests start real processes; the demo test also needs the real containerd testbed."""

from tests.nodeagent.conftest import ContainerdTestbed, containerd_testbed

__all__ = ["ContainerdTestbed", "containerd_testbed"]
