"""The orchestrator's CRI ExecSync executor against the real containerd testbed."""

from __future__ import annotations

import pytest

from extender.orchestrator.executors import CriExecutor
from extender.orchestrator.snapshot import PodState
from flexlease.errors import ExecError
from tests.nodeagent.conftest import ContainerdTestbed, Pods


def _state(name: str, container_id: str) -> PodState:
    return PodState("default", name, "uid", "worker", True, True, "main", container_id, "127.0.0.1", 0)


async def test_exec_sync_runs_in_the_container(containerd_testbed: ContainerdTestbed, pods: Pods) -> None:
    pod = await pods.run("orch-exec", {"main": containerd_testbed.trainer_v1})
    target = _state("orch-exec", pod.containers["main"])
    async with CriExecutor(containerd_testbed.endpoint) as executor:
        ok = await executor.exec(
            target, ["sh", "-c", "cat /etc/trainer-version; echo oops >&2; exit 3"], timeout_seconds=10
        )
        assert (ok.exit_code, ok.stdout, ok.stderr) == (3, b"v1\n", b"oops\n")
        with pytest.raises(ExecError, match="DEADLINE_EXCEEDED"):
            await executor.exec(target, ["sleep", "5"], timeout_seconds=1)
        with pytest.raises(ExecError, match="NOT_FOUND"):
            await executor.exec(_state("gone", "0" * 64), ["true"], timeout_seconds=5)
        with pytest.raises(ExecError, match="no container id"):
            await executor.exec(_state("new", ""), ["true"], timeout_seconds=5)
