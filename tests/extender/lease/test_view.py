"""Deriving the lease controller's cluster view (extender/lease/view.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from extender.lease.view import build_view, parse_time, read_holder
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
