"""The API server's object semantics shared by MemoryStore and SqliteStore (pure functions)."""

from __future__ import annotations

import pytest

from flexlease.errors import Conflict, StoreError, TooManyRequests
from flexlease.store import semantics
from flexlease.store.base import EventType, Kind, Selector
from tests.store.contract import make_pdb, make_pod


def test_create_generate_name_and_server_fields() -> None:
    key, obj = semantics.prepare_create(
        Kind.EVENT, {"metadata": {"generateName": "reclaim-", "namespace": "ns"}, "reason": "Preempt"}
    )
    assert key[0] == "ns" and key[1].startswith("reclaim-") and len(key[1]) == len("reclaim-") + 5
    assert obj["apiVersion"] == "v1" and obj["kind"] == "Event" and obj["reason"] == "Preempt"
    assert obj["metadata"]["generation"] == 1 and obj["metadata"]["uid"]


@pytest.mark.parametrize(
    "obj",
    [
        {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "5"}},
        {"kind": "Event", "metadata": {"name": "a", "namespace": "ns"}},
        {"metadata": {"namespace": "ns"}},
        {"metadata": "nope"},
    ],
)
def test_create_refuses_bad_objects(obj: dict[str, object]) -> None:
    with pytest.raises(StoreError) as info:
        semantics.prepare_create(Kind.POD, obj)
    assert info.value.status == 400


def test_patch_keeps_server_fields_and_counts_generation() -> None:
    _, node = semantics.prepare_create(
        Kind.GPUNODE, {"metadata": {"name": "gpu-1"}, "spec": {"pool": "general"}}
    )
    node = semantics.stamp(node, 7)
    labelled = semantics.apply_patch(
        Kind.GPUNODE,
        node,
        {"metadata": {"labels": {"a": "b"}, "uid": None, "generation": 9}},
        subresource=None,
    )
    assert labelled["metadata"]["uid"] == node["metadata"]["uid"]
    assert labelled["metadata"]["generation"] == 1  # metadata only
    respec = semantics.apply_patch(Kind.GPUNODE, node, {"spec": {"pool": "standby"}}, subresource=None)
    assert respec["metadata"]["generation"] == 2
    with pytest.raises(StoreError) as info:
        semantics.apply_patch(Kind.GPUNODE, node, {"metadata": {"name": "other"}}, subresource=None)
    assert info.value.status == 400
    with pytest.raises(StoreError) as info:
        semantics.apply_patch(Kind.GPUNODE, node, {}, subresource="scale")
    assert info.value.status == 404


def test_uid_precondition_in_patch() -> None:
    _, pod = semantics.prepare_create(Kind.POD, make_pod("p"))
    pod = semantics.stamp(pod, 3)
    semantics.check_precondition(pod, {"metadata": {"uid": pod["metadata"]["uid"]}}, resource_version="3")
    with pytest.raises(Conflict):
        semantics.check_precondition(pod, {"metadata": {"uid": "other"}}, resource_version=None)


def test_bind_replaces_pod_scheduled_condition() -> None:
    _, pod = semantics.prepare_create(Kind.POD, make_pod("p"))
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    bound = semantics.apply_bind(pod, uid=None, node="gpu-2")
    assert bound["spec"]["nodeName"] == "gpu-2"
    assert [(c["type"], c["status"]) for c in bound["status"]["conditions"]] == [("PodScheduled", "True")]
    assert "nodeName" not in pod["spec"]  # input untouched
    with pytest.raises(StoreError):
        semantics.apply_bind(pod, uid=None, node="")


def test_bind_refuses_a_terminating_pod_as_the_api_server_does() -> None:
    _, pod = semantics.prepare_create(Kind.POD, make_pod("p"))
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # e.g. held by a finalizer
    with pytest.raises(Conflict, match="pod p is being deleted, cannot be assigned to a host"):
        semantics.apply_bind(pod, uid=None, node="gpu-2")


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        (None, False),
        ({}, True),
        ({"matchLabels": {"app": "x"}}, True),
        ({"matchLabels": {"app": "y"}}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["lp", "hp"]}]}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["lp"]}]}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, False),
    ],
)
def test_label_selector(selector: object, matches: bool) -> None:
    assert semantics.label_selector_matches(selector, {"app": "x", "tier": "lp"}) is matches


def test_label_selector_bad_operator() -> None:
    with pytest.raises(StoreError):
        semantics.label_selector_matches({"matchExpressions": [{"key": "a", "operator": "Gt"}]}, {})


def _running(labels: dict[str, str]) -> dict[str, object]:
    pod = make_pod("p", labels=labels)
    pod["status"] = {"phase": "Running"}
    return pod


def test_eviction_budget() -> None:
    pdb = make_pdb("b", match={"app": "x"})
    assert semantics.eviction_budget(_running({"app": "y"}), [pdb]) is None
    with pytest.raises(TooManyRequests):
        semantics.eviction_budget(_running({"app": "x"}), [pdb])
    pdb["status"] = {"disruptionsAllowed": 2}
    assert semantics.eviction_budget(_running({"app": "x"}), [pdb]) is pdb
    spent = semantics.spend_budget(pdb, "p")
    assert spent["status"]["disruptionsAllowed"] == 1 and "p" in spent["status"]["disruptedPods"]
    with pytest.raises(StoreError) as info:
        semantics.eviction_budget(_running({"app": "x"}), [pdb, make_pdb("c", match={})])
    assert info.value.status == 500
    done = _running({"app": "x"})
    done["status"] = {"phase": "Succeeded"}
    assert semantics.eviction_budget(done, [make_pdb("z", match={"app": "x"})]) is None


@pytest.mark.parametrize(
    ("change", "now", "before", "seen"),
    [
        (EventType.ADDED, True, None, (EventType.ADDED, False)),
        (EventType.ADDED, False, None, None),
        (EventType.MODIFIED, True, True, (EventType.MODIFIED, False)),
        (EventType.MODIFIED, True, False, (EventType.ADDED, False)),
        (EventType.MODIFIED, False, True, (EventType.DELETED, True)),
        (EventType.MODIFIED, False, False, None),
        (EventType.DELETED, True, None, (EventType.DELETED, False)),
        (EventType.DELETED, False, None, None),
    ],
)
def test_watch_transition(change: EventType, now: bool, before: bool | None, seen: object) -> None:
    selector = Selector(labels={"app": "x"})

    def obj(match: bool) -> dict[str, object]:
        return make_pod("p", labels={"app": "x" if match else "y"})

    prev = None if before is None else obj(before)
    assert semantics.watch_transition(selector, change, obj=obj(now), prev=prev) == seen


def test_pod_update_rules() -> None:
    spec = make_pod("p")["spec"]
    tol = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    with_tol = {**spec, "tolerations": [tol]}
    semantics.check_pod_update(spec, with_tol)  # adding a toleration
    semantics.check_pod_update(spec, {**spec, "activeDeadlineSeconds": 60})
    semantics.check_pod_update(spec, {**spec, "containers": [{**spec["containers"][0], "image": "other:2"}]})
    for forbidden in (
        {**spec, "nodeName": "gpu-1"},
        {**spec, "containers": [{**spec["containers"][0], "resources": {}}]},
        {**spec, "containers": spec["containers"] * 2},
    ):
        with pytest.raises(StoreError) as info:
            semantics.check_pod_update(spec, forbidden)
        assert info.value.status == 422
    with pytest.raises(StoreError):
        semantics.check_pod_update(with_tol, spec)  # removing one


@pytest.mark.parametrize(
    ("obj", "stored"),
    [
        ({"a": [1, 2.5, "é", None, True]}, {"a": [1, 2.5, "é", None, True]}),  # orjson's path
        ({"a": (1, 2)}, {"a": [1, 2]}),  # json's path: a tuple does not read back equal
        ({"a": {1: "x"}}, {"a": {"1": "x"}}),  # json's path: orjson refuses non-str keys
        ({"a": "\ud800"}, {"a": "\ud800"}),  # json's path: a lone surrogate orjson refuses
        ({"a": 2**63 - 1, "b": -(2**63)}, {"a": 2**63 - 1, "b": -(2**63)}),
    ],
)
def test_encode_copy_reads_back_through_decode(obj: dict[str, object], stored: dict[str, object]) -> None:
    text, copy = semantics.encode_copy(Kind.POD, obj)
    assert copy == stored and semantics.decode(text) == stored
    assert semantics.encode(Kind.POD, obj) == text


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        float("inf"),
        object(),
        2**64,
        -(2**64) - 1,
        {"when": __import__("datetime").date.today()},
    ],
)
def test_encode_refuses_what_is_not_json_or_would_not_read_back(value: object) -> None:
    with pytest.raises(StoreError) as info:
        semantics.encode_copy(Kind.POD, {"a": value})
    assert info.value.status == 400
