"""An orchestrator run on lease completion with the CRI ExecSync executor on real containerd:
the pods' containers run on the testbed, the Pod objects (with their real container ids) and the
GPULease live in a MemoryStore, and the commands leave marks inside the containers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from extender.orchestrator import profile
from extender.orchestrator.executors import CriExecutor
from extender.orchestrator.runstatus import RunPhase
from extender.orchestrator.snapshot import PodState
from flexlease.api import keys
from flexlease.clock import ManualClock
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore
from tests.extender.orchestrator.pods import NS, pod
from tests.extender.orchestrator.test_relaunch import (
    done_lease,
    put_pod,
    running,
    status_of,
    until,
)
from tests.nodeagent.conftest import ContainerdTestbed, Pods

PROFILE = """\
apiVersion: flexlease.io/v1alpha1
kind: FrameworkProfile
name: marks
roles:
  head: {critical: true}
  worker: {}
commands:
  - name: head-up
    role: head
    run: [sh, -c, "echo head-up > /tmp/mark"]
  - name: worker-join
    role: worker
    run: [sh, -c, "echo joined {head.names} >> /tmp/mark"]
    preconditions: [{completed: head-up}, {ready: head}]
"""


async def test_a_completed_lease_execs_the_profile_in_real_containers(
    containerd_testbed: ContainerdTestbed, pods: Pods
) -> None:
    store = MemoryStore()
    clock = ManualClock(datetime(2026, 11, 22, 18, 0, tzinfo=UTC))
    marks = profile.parse(PROFILE, source="marks.yaml")
    ids: dict[str, str] = {}
    for name, role in (("head-0", "head"), ("w-0", "worker")):
        run = await pods.run(f"relaunch-{name}", {"main": containerd_testbed.trainer_v1}, namespace=NS)
        ids[name] = run.containers["main"]
        obj: dict[str, Any] = pod(name, role, owner="job", framework="marks")
        obj["status"]["containerStatuses"][0]["containerID"] = f"containerd://{ids[name]}"
        await put_pod(store, obj)
    try:
        async with (
            CriExecutor(containerd_testbed.endpoint) as executor,
            running(store, clock, executor, profiles_by_name={"marks": marks}),
        ):
            await done_lease(store)

            async def finished() -> bool:
                status = await status_of(store)
                return status is not None and status.final

            await until(finished, within=60)
            status = await status_of(store)
            assert status.phase is RunPhase.SUCCEEDED, status.message
            head = await executor.exec(_state(ids["head-0"]), ["cat", "/tmp/mark"], timeout_seconds=10)
            worker = await executor.exec(_state(ids["w-0"]), ["cat", "/tmp/mark"], timeout_seconds=10)
        assert (head.stdout, worker.stdout) == (b"head-up\n", b"joined head-0\n")
        events = (await store.list(Kind.EVENT, namespace=NS)).items
        assert sorted(e["reason"] for e in events) == ["OrchestrationStarted", "OrchestrationSucceeded"]
        lease = await store.get(Kind.GPULEASE, "lend-1", namespace=NS)
        assert keys.ANN_ORCHESTRATION_STATUS in lease["metadata"]["annotations"]
    finally:
        await store.close()


def _state(container_id: str) -> PodState:
    return PodState(NS, "x", "uid", "head", True, True, "main", container_id, "127.0.0.1", 0)
