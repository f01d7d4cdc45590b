"""Deriving the lease controller's cluster view (extender/lease/view.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.lease.view import (
    ClusterView,
    Holder,
    IncrementalView,
    assemble,
    build_view,
    parse_time,
    read_holder,
)
from flexlease.api import keys
from flexlease.api.pod import Priority
from flexlease.api.resources import DeviceKey, Health, Pool, parse_gpunode
from flexlease.api.tiers import Tier
from flexlease.clock import format_time
from tests.extender.lease.builders import H20, gpunode, pod


def test_view_joins_gpunodes_and_the_pods_holding_their_gpus() -> None:
    node = gpunode("n1", ["HA", "MA"], count=2, tags={1: "online/rec"}, health={1: "Unhealthy"})
    node["spec"]["devices"]["5"] = {"owner": "online/rec"}  # tagged, no longer reported: vanished
    node["spec"]["devices"]["0"] = {"tierOverride": "LA"}
    pods = [
        pod("lp", "n1", [0], deadline="2026-03-01T12:00:45Z"),
        pod("done", "n1", [1], phase="Succeeded"),  # terminated pods hold nothing
        pod("bad", "n1", [1], priority="urgent"),  # malformed: named, kept as a conservative holder
    ]
    view = build_view([parse_gpunode(node)], pods)
    gpu0, gpu1, gpu5 = (view.gpus[DeviceKey("n1", i)] for i in (0, 1, 5))
    assert (gpu0.tier, gpu0.model, gpu0.pool, gpu0.owner) == (Tier.LA, H20, Pool.GENERAL, None)
    assert gpu0.holder is not None and gpu0.holder.priority is Priority.LOW
    assert gpu0.holder.deadline == datetime(2026, 3, 1, 12, 0, 45, tzinfo=UTC)
    assert (gpu1.health, gpu1.failed, gpu1.free, gpu1.owner) == (Health.UNHEALTHY, True, False, "online/rec")
    assert gpu1.holder is not None and gpu1.holder.priority is Priority.HIGH and gpu1.holder.owner is None
    assert (gpu5.present, gpu5.failed, gpu5.model) == (False, True, None)
    assert [g.key.index for g in view.tagged("online/rec")] == [1, 5]
    assert len(view.problems) == 1 and "'bad'" in view.problems[0]


def test_a_device_claimed_twice_goes_to_the_first_pod_and_is_reported() -> None:
    view = build_view([parse_gpunode(gpunode("n1", count=2))], [pod("b", "n1", [0]), pod("a", "n1", [0, 1])])
    holder = view.gpus[DeviceKey("n1", 0)].holder
    assert holder is not None and holder.name == "a"
    assert view.problems == ("n1/0 is claimed by lp/a and lp/b",)


def test_held_by_uses_the_owner_label_completed_by_the_namespace() -> None:
    pods = [pod("rec", "n1", [0, 1], namespace="online", priority="high", owner="online/rec")]
    view = build_view([parse_gpunode(gpunode("n1", count=2))], pods)
    assert view.held_by("online/rec") == {DeviceKey("n1", 0), DeviceKey("n1", 1)}


def test_a_malformed_deadline_is_a_pod_problem() -> None:
    bad = pod("lp", "n1", [0])
    bad["metadata"]["annotations"][keys.ANN_PREEMPT_DEADLINE] = "soon"
    view = build_view([parse_gpunode(gpunode("n1", count=1))], [bad])
    # a label or annotation typo never frees GPUs in use: kept as a holder nobody preempts
    holder = view.gpus[DeviceKey("n1", 0)].holder
    assert holder is not None and holder.priority is Priority.HIGH and holder.owner is None
    assert "preempt-deadline" in view.problems[0]


def test_times_round_trip_as_rfc3339_utc() -> None:
    value = datetime(2026, 3, 1, 12, 0, 45, tzinfo=UTC)
    assert format_time(value) == "2026-03-01T12:00:45Z"
    assert parse_time("2026-03-01T14:00:45+02:00") == value
    with pytest.raises(ValueError, match="time zone"):
        parse_time("2026-03-01T12:00:45")


def test_read_holder_marks_critical_roles() -> None:
    def holder(labels: dict[str, str], critical: dict[str, frozenset[str]] | None = None) -> bool:
        obj = pod("p", "n1", [0], labels=labels)
        h = read_holder(obj, critical=critical)
        assert h is not None
        return h.critical

    role, fw = keys.LABEL_ROLE, keys.LABEL_FRAMEWORK
    assert holder({role: "head", fw: "ray"})
    assert holder({role: "coordinator"})  # no framework label: any shipped profile's critical role
    assert not holder({role: "worker", fw: "mpi"})
    assert not holder({})
    custom = {"mine": frozenset({"launcher"})}
    assert holder({role: "launcher", fw: "mine"}, custom)
    assert not holder({role: "head", fw: "ray"}, custom)


# ---------------------------------------------------------------------------- IncrementalView

NODES = ("n0", "n1", "n2")
PODS = ("lp/a", "lp/b", "lp/c", "online/d")


def _node(name: str, version: int, tiers: list[str], tags: dict[int, str], pool: str, bad: bool) -> Any:
    obj = gpunode(name, tiers, count=len(tiers), tags=tags, pool=pool)
    obj["metadata"]["resourceVersion"] = str(version)
    if bad:
        obj["status"]["devices"]["x"] = obj["status"]["devices"]["0"]  # not an index: a problem
    return parse_gpunode(obj)


_nodes = st.builds(
    _node,
    st.sampled_from(NODES),
    st.integers(1, 1000),
    st.lists(st.sampled_from(["HA", "MA", "LA"]), min_size=1, max_size=4),
    st.dictionaries(st.integers(0, 5), st.sampled_from(["online/d", "other/x"]), max_size=2),
    st.sampled_from(["general", "standby"]),
    st.booleans(),
)
_devices = st.lists(
    st.builds(DeviceKey, st.sampled_from(NODES), st.integers(0, 4)), min_size=0, max_size=3
).map(tuple)


def _holder(key: str, devices: tuple[DeviceKey, ...], high: bool, version: int) -> Holder:
    namespace, name = key.split("/")
    return Holder(
        namespace=namespace,
        name=name,
        uid=f"uid-{name}",
        owner="online/d" if namespace == "online" else None,
        priority=Priority.HIGH if high else Priority.LOW,
        deadline=None,
        resource_version=str(version),
        devices=devices,
    )


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("node"), st.sampled_from(NODES), st.one_of(st.none(), _nodes)),
        st.tuples(
            st.just("pod"),
            st.sampled_from(PODS),
            st.one_of(st.none(), st.tuples(_devices, st.booleans(), st.integers(1, 1000))),
            st.one_of(st.none(), st.just("malformed")),
        ),
        st.tuples(st.just("view")),
    ),
    max_size=40,
)


def _from_scratch(nodes: dict[str, Any], pods: dict[str, tuple[Holder | None, str | None]]) -> ClusterView:
    holders = [h for k in sorted(pods) if (h := pods[k][0]) is not None]
    problems = [p for k in sorted(pods) if (p := pods[k][1]) is not None]
    return assemble([nodes[n] for n in sorted(nodes)], holders, problems=problems)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_the_incremental_view_equals_a_rebuild_from_scratch(ops: list[tuple[Any, ...]]) -> None:
    """After any sequence of GPUNode and pod changes (added, changed, gone, malformed, two
    pods claiming one device), the incremental view equals assemble() over the same objects,
    including the per-node index, and it is one object until something changes."""
    inc = IncrementalView()
    nodes: dict[str, Any] = {}
    pods: dict[str, tuple[Holder | None, str | None]] = {}
    for op in [*ops, ("view",)]:
        if op[0] == "node":
            _, name, node = op
            if node is not None:
                node = parse_gpunode({**node.to_json_obj(), "metadata": {"name": name}})  # named as set
                nodes[name] = node
            else:
                nodes.pop(name, None)
            inc.set_node(name, node)
        elif op[0] == "pod":
            _, key, held, problem = op
            holder = None if held is None else _holder(key, *held)
            if holder is None and problem is None:
                pods.pop(key, None)
            else:
                pods[key] = (holder, problem)
            inc.set_pod(key, holder, problem=problem)
        else:
            view = inc.view()
            expected = _from_scratch(nodes, pods)
            assert view == expected
            assert view.by_node == expected.by_node
            assert all(view.node_gpus(n) == expected.node_gpus(n) for n in NODES)
            assert inc.view() is view
