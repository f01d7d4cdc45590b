from __future__ import annotations

import dataclasses

import pytest

from flexlease.api import keys
from flexlease.api.pod import (
    Assignment,
    Priority,
    owner_from_label,
    owner_label_value,
    parse_pod,
    pod_gpu_count,
)
from flexlease.api.resources import DeviceKey
from flexlease.api.tiers import Tier
from flexlease.errors import PodSpecError, RequestError
from tests.flexlease.pods import make_pod


def test_defaults_for_a_plain_gpu_pod() -> None:
    req = parse_pod(make_pod(gpus=4))
    assert req.count == 4
    assert req.priority is Priority.LOW
    assert req.required_tier is Tier.LA
    assert req.owner == "recsys/trainer"  # controller ownerReference
    assert req.gpu_type is None and req.checkpoint is None
    assert not req.reclaim and not req.terminated
    assert req.assignment is None and req.node_name is None
    assert req.images == ("registry.local/recsys/trainer:v1",)
    assert req.key == "recsys/trainer-0"


def test_labels_and_annotations_are_read() -> None:
    pod = make_pod(
        gpus=8,
        labels={keys.LABEL_PRIORITY: "high", keys.LABEL_OWNER: "ranker"},
        annotations={
            keys.ANN_RELIABILITY: "HA",
            keys.ANN_GPU_TYPE: "NVIDIA H20",
            keys.ANN_RECLAIM: "true",
            keys.ANN_CHECKPOINT: "ckpt-42",
            keys.ANN_ASSIGNED_GPUS: "gpu-7:0,3",
        },
        node_name="gpu-7",
        phase="Running",
    )
    req = parse_pod(pod)
    assert req.priority is Priority.HIGH
    assert req.owner == "recsys/ranker"  # label value completed with the pod's namespace
    assert req.required_tier is Tier.HA
    assert req.gpu_type == "NVIDIA H20"
    assert req.reclaim
    assert req.checkpoint == "ckpt-42"
    assert req.assignment == Assignment("gpu-7", (0, 3))
    assert req.node_name == "gpu-7"


@pytest.mark.parametrize(
    "value",
    [
        "other-ns/ranker",  # names another namespace's job: would claim its tagged GPUs
        "recsys/ranker",  # '/' is no label value, even with the pod's own namespace
        "-ranker",
        "ranker_",
        "r" * 64,
        "ränker",
    ],
)
def test_owner_label_must_be_a_label_value_naming_a_job_in_the_pods_namespace(value: str) -> None:
    pod = make_pod(gpus=1, labels={keys.LABEL_PRIORITY: "high", keys.LABEL_OWNER: value})
    with pytest.raises(PodSpecError, match=r"flexlease\.io/owner"):
        parse_pod(pod)


def test_owner_label_value_round_trips_the_job_identity() -> None:
    assert owner_label_value("recsys/ranker") == "ranker"
    assert owner_label_value("ranker") == "ranker"
    assert owner_from_label(owner_label_value("recsys/ranker.v2"), "recsys") == "recsys/ranker.v2"
    assert owner_from_label("r" * 63, "ns") == "ns/" + "r" * 63


def test_pod_without_gpus_counts_zero() -> None:
    assert parse_pod(make_pod(gpus=None)).count == 0


def test_configurable_resource_name() -> None:
    pod = make_pod(gpus=2, resource="example.com/h20")
    assert parse_pod(pod).count == 0
    assert parse_pod(pod, "example.com/h20").count == 2


@pytest.mark.parametrize(
    ("app", "inits", "want"),
    [
        (2, [(4, False)], 4),  # a larger init container dominates
        (4, [(2, False)], 4),
        (2, [(1, True), (2, False)], 3),  # sidecar runs beside the later init and the app
        (1, [(1, True), (1, True)], 3),  # sidecars add to the app's sum
        (0, [(3, False), (1, False)], 3),
    ],
)
def test_init_containers_counted_as_kube_scheduler_does(
    app: int, inits: list[tuple[int, bool]], want: int
) -> None:
    assert pod_gpu_count(make_pod(gpus=app, init_gpus=inits)) == want


def test_terminated_pods_are_flagged() -> None:
    assert parse_pod(make_pod(phase="Succeeded")).terminated
    assert parse_pod(make_pod(phase="Failed")).terminated
    assert not parse_pod(make_pod(phase="Running")).terminated


def test_namespace_defaults_and_owner_may_be_absent() -> None:
    pod = make_pod(owner=None)
    del pod["metadata"]["namespace"]
    req = parse_pod(pod)
    assert req.namespace == "default"
    assert req.owner is None


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda p: p["metadata"]["labels"].update({keys.LABEL_PRIORITY: "urgent"}), "priority"),
        (lambda p: p["metadata"]["annotations"].update({keys.ANN_RELIABILITY: "XA"}), "reliability"),
        (lambda p: p["metadata"]["annotations"].update({keys.ANN_RECLAIM: "yes"}), "reclaim"),
        (lambda p: p["metadata"]["annotations"].update({keys.ANN_ASSIGNED_GPUS: "gpu-7"}), "assigned"),
        (lambda p: p["metadata"]["annotations"].update({keys.ANN_ASSIGNED_GPUS: "n:1,x"}), "integers"),
        (lambda p: p["metadata"]["annotations"].update({keys.ANN_ASSIGNED_GPUS: "n:1,1"}), "distinct"),
        (
            lambda p: p["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": "0.5"}),
            "0.5",
        ),
        (
            lambda p: p["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": -1}),
            "negative",
        ),
        (
            lambda p: p["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": True}),
            "not a quantity",
        ),
        (
            lambda p: p["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": "1_000"}),
            "not a quantity",
        ),
        (
            lambda p: p["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": "1500m"}),
            "whole number",
        ),
        # wrong JSON types in every field the extender reads (found by fuzzing: TypeErrors)
        (lambda p: p["metadata"].update({"ownerReferences": 7}), "ownerReferences must be a list"),
        (
            lambda p: p["metadata"].update({"ownerReferences": ["x"]}),
            r"ownerReferences\[0\] must be an object",
        ),
        (
            lambda p: p["metadata"].update({"ownerReferences": [{"controller": True, "name": 3}]}),
            r"ownerReferences\[0\].name",
        ),
        (lambda p: p["metadata"].update({"uid": {"a": 1}}), "uid must be a string"),
        (lambda p: p["metadata"].update({"labels": []}), "labels must be an object"),
        (lambda p: p["metadata"].update({"namespace": 5}), "namespace must be a string"),
        (lambda p: p["spec"].update({"priority": "high"}), "priority must be an integer"),
        (lambda p: p["spec"].update({"priority": True}), "priority must be an integer"),
        (lambda p: p["spec"].update({"preemptionPolicy": 0}), "preemptionPolicy must be a string"),
        (lambda p: p["spec"].update({"nodeName": ["n"]}), "nodeName must be a string"),
        (lambda p: p["spec"]["containers"][0].update({"image": 5}), "image must be a string"),
        (lambda p: p.update({"status": "Running"}), "status must be an object"),
        (lambda p: p["spec"].update({"containers": {"a": 1}}), "lists"),
        (lambda p: p["metadata"].pop("name"), "metadata.name"),
        (lambda p: p.pop("spec"), "pod.spec"),
    ],
)
def test_malformed_pods_raise_a_request_error(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    pod = make_pod()
    mutate(pod)
    with pytest.raises(PodSpecError, match=message) as info:
        parse_pod(pod)
    assert isinstance(info.value, RequestError)


def test_gpu_counts_in_canonical_quantity_forms() -> None:
    """kube-scheduler forwards Go's canonical Quantity strings: 2,000 GPUs arrive as "2k"."""
    for value, want in (
        ("2", 2),
        ("2k", 2000),
        ("1000m", 1),
        (3, 3),
        ("1e3", 1000),
        (" 4 ", 4),
        ("0007", 7),
        ("9" * 18, 10**18 - 1),
        ("9" * 30, 2**63),  # clamped, as the general path clamps
    ):
        pod = make_pod()
        pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = value
        assert parse_pod(pod).count == want


@pytest.mark.parametrize("value", ["\u0663", "\u00b2", "-1", "1.5"])
def test_digits_other_than_ascii_are_no_quantity(value: str) -> None:
    """Only ASCII digits make a number: an Arabic-Indic three or a superscript two (which
    ``str.isdigit`` accepts) are refused by the quantity grammar."""
    pod = make_pod()
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = value
    with pytest.raises(PodSpecError, match=r"nvidia\.com/gpu"):
        parse_pod(pod)


def test_priority_and_preemption_policy_are_read() -> None:
    pod = make_pod()
    assert parse_pod(pod).priority_value == 0 and parse_pod(pod).preempts
    pod["spec"].update({"priority": 1000, "preemptionPolicy": "Never"})
    req = parse_pod(pod)
    assert req.priority_value == 1000 and not req.preempts


def test_assignment_round_trip() -> None:
    a = Assignment.parse("gpu-node-7:0,3,5")
    assert a.format() == "gpu-node-7:0,3,5"
    assert [str(d) for d in a.devices] == ["gpu-node-7/0", "gpu-node-7/3", "gpu-node-7/5"]


def test_an_assignment_is_parsed_once_per_text_and_stays_immutable() -> None:
    a = Assignment.parse("gpu-node-7:0,3")
    assert Assignment.parse("gpu-node-7:0,3") is a  # every watcher of the pod reads the same text
    assert a == Assignment("gpu-node-7", (0, 3)) and hash(a) == hash(Assignment("gpu-node-7", (0, 3)))
    moved = dataclasses.replace(a, node="gpu-node-8")
    assert moved.devices == (DeviceKey("gpu-node-8", 0), DeviceKey("gpu-node-8", 3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.devices = ()  # type: ignore[misc]
    for bad in ("gpu-node-7:0,0", "gpu-node-7:x", "gpu-node-7"):  # errors are not remembered
        for _ in range(2):
            with pytest.raises(PodSpecError):
                Assignment.parse(bad)
