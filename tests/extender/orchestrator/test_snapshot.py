"""The readiness snapshot, command templates and the DAG: pure logic."""

from __future__ import annotations

import pytest

from extender.orchestrator import dag, profile, template
from extender.orchestrator.snapshot import PodState, Snapshot, pod_state
from tests.extender.orchestrator.pods import pod


def _snap(
    *objs: dict[str, object], listed: tuple[str, ...] = ("coordinator", "worker", "head", "master")
) -> Snapshot:
    states = [pod_state(o) for o in objs]
    by_role: dict[str, list[PodState]] = {}
    for s in states:
        by_role.setdefault(s.role, []).append(s)
    return Snapshot(
        version=1,
        pods={r: tuple(sorted(v, key=lambda s: s.name)) for r, v in by_role.items()},
        listed=frozenset(listed),
    )


def test_pod_state_reads_kubelet_status() -> None:
    s = pod_state(pod("w-0", "worker", port=7000))
    assert (s.ready, s.running, s.container, s.container_id, s.ip, s.port) == (
        True,
        True,
        "main",
        "cid-w-0",
        "127.0.0.1",
        7000,
    )
    assert s.endpoint == "127.0.0.1:7000" and s.key == "team-a/w-0" and s.reason == ""
    not_ready = pod_state(pod("w-1", "worker", ready=False))
    assert (not_ready.ready, not_ready.running, not_ready.reason) == (False, True, "ContainersNotReady")
    pending = pod_state(pod("w-2", "worker", ready=False, running=False))
    assert (pending.running, pending.container_id, pending.reason) == (False, None, "Pending")
    deleting = pod("w-3", "worker")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # type: ignore[index]
    assert pod_state(deleting).reason == "Terminating" and not pod_state(deleting).ready


@pytest.mark.parametrize(
    "junk", [{}, {"status": "x", "spec": []}, {"spec": {"containers": [1, {"ports": "x"}]}}]
)
def test_pod_state_never_raises(junk: dict[str, object]) -> None:
    s = pod_state(junk)
    assert not s.ready and not s.running


def test_ready_unmet_counts_expected_pods_and_says_why() -> None:
    snap = _snap(pod("w-0", "worker"), pod("w-1", "worker", ready=False))
    assert snap.ready_unmet("worker", 2) == "worker: 1/2 ready (team-a/w-1: ContainersNotReady)"
    assert snap.ready_unmet("worker", 3) == (
        "worker: 1/3 ready (team-a/w-1: ContainersNotReady; 1 of 3 pods missing)"
    )
    assert _snap(pod("w-0", "worker")).ready_unmet("worker", 1) is None
    assert _snap(pod("w-0", "worker")).ready_unmet("worker", None) is None
    assert _snap().ready_unmet("worker", None) == "worker: 0/1 ready (1 of 1 pods missing)"
    assert _snap(listed=()).ready_unmet("worker", 1) == "worker: pods not listed yet"
    assert snap.running_unmet("worker", 2) is None


def test_template_renders_from_the_snapshot() -> None:
    snap = _snap(
        pod("c-0", "coordinator", port=5000), pod("w-1", "worker", port=7001), pod("w-0", "worker", port=7000)
    )
    me = snap.role("worker")[1]
    argv = template.render(
        [
            "{worker.hosts}",
            "{worker.endpoints}",
            "{worker.count}",
            "{coordinator.endpoint}",
            "rank={self.rank}",
            "{{literal}}",
            "{self.name}@{self.namespace}:{self.port}",
            "{worker.names}",
        ],
        pods=snap.pods,
        self_pod=me,
    )
    assert argv == [
        "127.0.0.1,127.0.0.1",
        "127.0.0.1:7000,127.0.0.1:7001",
        "2",
        "127.0.0.1:5000",
        "rank=1",
        "{literal}",
        "w-1@team-a:7001",
        "w-0,w-1",
    ]
    with pytest.raises(ValueError, match="role 'head' has no pods"):
        template.render(["{head.ip}"], pods=snap.pods, self_pod=me)
    assert template.render(["{head.hosts}"], pods=snap.pods, self_pod=me) == [""]


@pytest.mark.parametrize(
    "bad", ["{x}", "{a.b.c}", "{worker.ip!r}", "{worker.ip:>5}", "{self.hosts}", "{", "}", "{w[0].ip}"]
)
def test_template_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        template.placeholders(bad)


def test_dag_order_and_descendants() -> None:
    ray = dag.build(profile.builtin()["ray"])
    assert ray.order == ("head-start", "worker-join")
    assert ray.upstream["worker-join"] == ("head-start",)
    assert ray.descendants("head-start") == {"worker-join"}
    sorter = ray.sorter()
    assert sorter.get_ready() == ("head-start",)
    sorter.done("head-start")
    assert sorter.get_ready() == ("worker-join",)


def test_unmet_checks_ready_running_and_template_roles() -> None:
    mpi = profile.builtin()["mpi"].command("mpirun")
    snap = _snap(pod("c-0", "coordinator"), pod("w-0", "worker"), pod("w-1", "worker", ready=False))
    assert dag.unmet(mpi, snap, {"worker": 2}) == ["ready worker: 1/2 ready (team-a/w-1: ContainersNotReady)"]
    assert dag.unmet(mpi, snap, {"worker": 1}) == ["ready worker: 1/1 ready (team-a/w-1: ContainersNotReady)"]
    snap2 = _snap(pod("c-0", "coordinator"), pod("w-0", "worker"), pod("w-1", "worker"))
    assert dag.unmet(mpi, snap2, {"worker": 2}) == []
    join = profile.builtin()["ray"].command("worker-join")
    starting = _snap(pod("w-0", "worker", ready=False, running=False))
    assert dag.unmet(join, starting, {}) == [
        "ready head: 0/1 ready (1 of 1 pods missing)",
        "running worker: 0/1 running (team-a/w-0: Pending)",
        "template {head.endpoint}: role 'head' has no pods",
    ]
