"""Coordinator protection in ``/preempt`` (issue #14): a pod whose ``flexlease.io/role`` its
framework profile marks critical is never accepted as a victim. Pure victim selection, then the
real server over HTTP with ExtenderPreemptionArgs as kube-scheduler sends them (both forms)."""

from __future__ import annotations

from typing import Any

from extender import scheduling
from extender.scheduling import Holder
from extender.state import Inventory
from flexlease.api import keys
from flexlease.store.base import EventType, WatchEvent
from flexlease.store.memory import MemoryStore
from tests.extender import payloads
from tests.extender.conftest import add_node, add_pod
from tests.extender.test_scheduling import hp, node
from tests.extender.test_server import post


def test_a_critical_holder_is_replaced_by_other_victims() -> None:
    holders = {
        "coord": Holder(uid="coord", key="ml/coord", indices=(0, 1), low=True, critical=True),
        "w-1": Holder(uid="w-1", key="ml/w-1", indices=(2,), low=True),
        "w-2": Holder(uid="w-2", key="ml/w-2", indices=(3,), low=True),
    }
    n = node(gpus=4, held={0: "coord", 1: "coord", 2: "w-1", 3: "w-2"}, holders=holders)
    v = scheduling.select_victims(hp(2), n, proposed=["coord"], preemptor_priority=1000)
    assert v is not None and set(v.uids) == {"w-1", "w-2"}
    # three GPUs can only be freed with the coordinator: no answer for this node
    assert scheduling.select_victims(hp(3), n, proposed=["coord"], preemptor_priority=1000) is None
    # the filter does not count GPUs held by a critical pod as preemptable
    f = scheduling.fit(scheduling.FitKey.of(hp(3)), n)
    assert f.low_held == (0, 0)


def test_a_protected_uid_counts_as_critical_and_a_protected_cpu_victim_gives_the_node_up() -> None:
    holders = {"w-1": Holder(uid="w-1", key="ml/w-1", indices=(0,), low=True)}
    n = node(gpus=2, held={0: "w-1"}, holders=holders)
    assert scheduling.select_victims(hp(2), n, proposed=["w-1"], protected={"w-1"}) is None
    # the scheduler needs the CPU-only coordinator gone too: another GPU pod cannot stand in
    assert scheduling.select_victims(hp(2), n, proposed=["w-1", "cpu-coord"], protected={"cpu-coord"}) is None
    v = scheduling.select_victims(hp(2), n, proposed=["w-1", "cpu-other"], protected={"cpu-coord"})
    assert v is not None and set(v.uids) == {"w-1", "cpu-other"}


def _role(obj: dict[str, Any], role: str, framework: str | None = "mpi") -> dict[str, Any]:
    obj["metadata"]["labels"][keys.LABEL_ROLE] = role
    if framework is not None:
        obj["metadata"]["labels"][keys.LABEL_FRAMEWORK] = framework
    return obj


async def _lp_job(store: MemoryStore, node_name: str, roles: list[str]) -> dict[str, str]:
    """One LP pod per GPU of ``node_name`` with the given roles; returns name → uid."""
    out = {}
    for i, role in enumerate(roles):
        name = f"{node_name}-{role}-{i}"
        pod = payloads.pod(
            name, node_name=node_name, phase="Running", annotations=payloads.assigned(node_name, i)
        )
        out[name] = (await add_pod(store, _role(pod, role)))["metadata"]["uid"]
    return out


async def test_preempt_never_accepts_a_critical_pod(start: Any, store: MemoryStore) -> None:
    await add_node(store, payloads.gpunode("n-spare", gpus=3))
    await add_node(store, payloads.gpunode("n-tight", gpus=2))
    await add_node(store, payloads.gpunode("n-cpu", gpus=1))
    spare = await _lp_job(store, "n-spare", ["coordinator", "worker", "worker"])
    tight = await _lp_job(store, "n-tight", ["coordinator", "worker"])
    cpu = await _lp_job(store, "n-cpu", ["worker"])
    # a CPU-only Ray head on n-cpu (no GPUs, role label only: judged by every profile)
    head = await add_pod(
        store, _role(payloads.pod("head", gpus=0, node_name="n-cpu", phase="Running"), "head", None)
    )
    client = await start()
    pod = payloads.pod("r", gpus=2, priority="high", spec_priority=1000)
    body = payloads.preemption_args(
        pod,
        {
            "n-spare": [spare["n-spare-coordinator-0"]],
            "n-tight": list(tight.values()),
            "n-cpu": [cpu["n-cpu-worker-0"], head["metadata"]["uid"]],
        },
    )
    reply = await post(client, "preempt", body)
    victims = reply["NodeNameToMetaVictims"]
    assert set(victims) == {"n-spare"}  # n-tight needs its coordinator, n-cpu its head
    assert {p["UID"] for p in victims["n-spare"]["Pods"]} == {
        spare["n-spare-worker-1"],
        spare["n-spare-worker-2"],
    }
    text = await (await client.get("/metrics")).text()
    assert (
        'flexlease_extender_decisions_total{cause="dropped",outcome="unschedulable",verb="preempt"} 2.0'
        in text
    )


async def test_preempt_reads_roles_from_full_victim_pods(start: Any, store: MemoryStore) -> None:
    """``NodeNameToVictims`` (nodeCacheCapable off) carries whole pods: their labels count even
    for a pod the extender's watch has not seen."""
    await add_node(store, payloads.gpunode("n1", gpus=2, tiers="HA"))
    worker = await add_pod(
        store,
        payloads.pod("w", node_name="n1", phase="Running", annotations=payloads.assigned("n1", 0, 1), gpus=2),
    )
    client = await start()
    unseen = _role(payloads.pod("chief", gpus=0, node_name="n1", uid="uid-chief"), "chief", "tensorflow")
    pod = payloads.pod("r", gpus=2, priority="high", tier="HA", spec_priority=1000)
    full: dict[str, Any] = {
        "Pod": pod,
        "NodeNameToVictims": {"n1": {"Pods": [worker, unseen], "NumPDBViolations": 0}},
        "NodeNameToMetaVictims": None,
    }
    assert (await post(client, "preempt", full)) == {"NodeNameToMetaVictims": {}}
    full["NodeNameToVictims"]["n1"]["Pods"] = [worker]
    reply = await post(client, "preempt", full)
    assert reply["NodeNameToMetaVictims"]["n1"]["Pods"] == [{"UID": worker["metadata"]["uid"]}]


async def test_preempt_drops_a_node_it_would_answer_with_no_victims(start: Any, store: MemoryStore) -> None:
    """kube-scheduler rejects an empty victim list for a node it proposed victims on
    ("expected at least one victim pod on node"): such a node is left out instead."""
    await add_node(store, payloads.gpunode("n1", gpus=4))
    coord = await add_pod(
        store,
        _role(
            payloads.pod("c", node_name="n1", phase="Running", annotations=payloads.assigned("n1", 0)),
            "coordinator",
        ),
    )
    client = await start()
    pod = payloads.pod("r", gpus=2, priority="high", spec_priority=1000)
    reply = await post(client, "preempt", payloads.preemption_args(pod, {"n1": [coord["metadata"]["uid"]]}))
    assert reply == {"NodeNameToMetaVictims": {}}


def test_the_inventory_follows_role_labels_and_forgets_terminated_pods() -> None:
    inv = Inventory()
    pod = _role(payloads.pod("c", uid="u-c", gpus=0, node_name="n1", phase="Running"), "master", "pytorch")
    inv.replace_pods([pod])
    assert inv.is_critical("u-c")
    pod["metadata"]["labels"][keys.LABEL_ROLE] = "worker"
    inv.apply_pod_event(WatchEvent(EventType.MODIFIED, pod))
    assert not inv.is_critical("u-c")
    pod["metadata"]["labels"][keys.LABEL_ROLE] = "master"
    inv.apply_pod_event(WatchEvent(EventType.MODIFIED, pod))
    assert inv.is_critical("u-c")
    pod["status"]["phase"] = "Succeeded"
    inv.apply_pod_event(WatchEvent(EventType.MODIFIED, pod))
    assert not inv.is_critical("u-c")
    pod["status"]["phase"] = "Running"
    inv.apply_pod_event(WatchEvent(EventType.MODIFIED, pod))
    inv.apply_pod_event(WatchEvent(EventType.DELETED, pod))
    assert not inv.is_critical("u-c")
    # a user's profile decides for its own framework: 'master' is not critical in 'mine'
    own = Inventory(critical_roles={"mine": frozenset({"lead"})})
    own.replace_pods([_role(payloads.pod("m", uid="u-m", gpus=0), "master", "mine")])
    assert not own.is_critical("u-m")
