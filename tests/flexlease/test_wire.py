"""The extender wire types against k8s.io/kube-scheduler/extender/v1 (types.go)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from flexlease.api import wire
from tests.flexlease.pods import make_pod


def test_args_as_kube_scheduler_sends_them_with_node_cache() -> None:
    body = json.dumps({"Pod": make_pod(), "Nodes": None, "NodeNames": ["gpu-1", "gpu-2"]})
    args = wire.ExtenderArgs.model_validate_json(body)
    assert args.candidate_names() == ["gpu-1", "gpu-2"]
    assert args.pod["metadata"]["name"] == "trainer-0"


def test_keys_are_case_insensitive_like_go() -> None:
    args = wire.ExtenderArgs.model_validate({"pod": make_pod(), "nodenames": ["a"]})
    assert args.candidate_names() == ["a"]
    b = wire.ExtenderBindingArgs.model_validate(
        {"podname": "p", "PODNAMESPACE": "ns", "PodUid": "u", "node": "n"}
    )
    assert (b.pod_name, b.pod_namespace, b.pod_uid, b.node) == ("p", "ns", "u", "n")


def test_args_without_node_cache_use_node_list() -> None:
    nodes = {"kind": "NodeList", "items": [{"metadata": {"name": "gpu-1"}}, {"metadata": {"name": "gpu-2"}}]}
    args = wire.ExtenderArgs.model_validate({"Pod": make_pod(), "Nodes": nodes, "NodeNames": None})
    assert args.candidate_names() == ["gpu-1", "gpu-2"]


def test_filter_result_uses_go_field_names() -> None:
    out = wire.ExtenderFilterResult(
        node_names=["a"], failed_nodes={"b": "2 GPUs free, 4 needed"}, failed_and_unresolvable_nodes={}
    ).to_wire()
    assert out == {
        "Nodes": None,
        "NodeNames": ["a"],
        "FailedNodes": {"b": "2 GPUs free, 4 needed"},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def test_host_priority_bounds_are_extender_priorities() -> None:
    assert wire.HostPriority(host="a", score=10).to_wire() == {"Host": "a", "Score": 10}
    with pytest.raises(ValidationError):
        wire.HostPriority(host="a", score=11)


def test_preemption_args_in_both_forms() -> None:
    meta = wire.ExtenderPreemptionArgs.model_validate(
        {
            "Pod": make_pod(),
            "NodeNameToMetaVictims": {"gpu-1": {"Pods": [{"UID": "u1"}], "NumPDBViolations": 1}},
        }
    )
    assert meta.victims_by_node()["gpu-1"].pods[0].uid == "u1"
    full = wire.ExtenderPreemptionArgs.model_validate(
        {
            "Pod": make_pod(),
            "NodeNameToVictims": {"gpu-1": {"Pods": [make_pod("lp-0")], "NumPDBViolations": 0}},
        }
    )
    victims = full.victims_by_node()["gpu-1"]
    assert victims.pods[0].uid == make_pod("lp-0")["metadata"]["uid"]
    result = wire.ExtenderPreemptionResult(node_name_to_meta_victims={"gpu-1": victims}).to_wire()
    assert result == {
        "NodeNameToMetaVictims": {"gpu-1": {"Pods": [{"UID": victims.pods[0].uid}], "NumPDBViolations": 0}}
    }


def test_binding_args_require_names() -> None:
    with pytest.raises(ValidationError):
        wire.ExtenderBindingArgs.model_validate(
            {"PodName": "", "PodNamespace": "ns", "PodUID": "", "Node": "n"}
        )


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"Pod": make_pod(), "NodeNames": ["gpu-1", "GPU-2"]}, ("NodeNames", 1)),
        ({"Pod": make_pod(), "NodeNames": ["gpu-1\n"]}, ("NodeNames", 0)),
        ({"Pod": make_pod(), "NodeNames": ["g" * 254]}, ("NodeNames", 0)),
        ({"Pod": make_pod(), "Nodes": {"items": [{"metadata": {"name": "Gpu"}}]}}, ("Nodes",)),
        ({"Pod": {"metadata": {"name": "p", "namespace": "Team"}}, "NodeNames": []}, ("Pod",)),
    ],
)
def test_args_refuse_names_kubernetes_refuses(body: dict[str, object], where: tuple[object, ...]) -> None:
    """Issue #37: node names are DNS-1123 subdomains and the embedded pod's read fields
    follow their rules; the error is located at the field."""
    with pytest.raises(ValidationError) as info:
        wire.ExtenderArgs.model_validate(body)
    assert info.value.errors()[0]["loc"] == where


def test_preemption_and_binding_args_refuse_names_and_counts_kubernetes_refuses() -> None:
    pod = make_pod()
    for bad in (
        {"Pod": pod, "NodeNameToMetaVictims": {"Gpu-1": {"Pods": []}}},
        {"Pod": pod, "NodeNameToMetaVictims": {"gpu-1": {"Pods": [{"UID": "u\x00"}]}}},
        {"Pod": pod, "NodeNameToMetaVictims": {"gpu-1": {"Pods": [], "NumPDBViolations": 2**63}}},
        {"Pod": pod, "NodeNameToVictims": {"gpu-1": {"Pods": [{"metadata": {"name": "v"}}]}}},  # no uid
    ):
        with pytest.raises(ValidationError):
            wire.ExtenderPreemptionArgs.model_validate(bad)
    for field, value in (("PodName", "P"), ("PodNamespace", "a.b"), ("PodUID", "-u"), ("Node", "n_1")):
        args = {"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n", field: value}
        with pytest.raises(ValidationError) as info:
            wire.ExtenderBindingArgs.model_validate(args)
        assert info.value.errors()[0]["loc"] == (field,)
    ok = wire.ExtenderBindingArgs.model_validate(
        {"PodName": "p", "PodNamespace": "ns", "PodUID": "", "Node": "n"}
    )
    assert ok.pod_uid == ""  # an empty UID: unchecked, as before
