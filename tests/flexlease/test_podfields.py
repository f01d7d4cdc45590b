"""The pod fields a request brings (flexlease.api.podfields): what Kubernetes allows in each,
errors located at the field."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from flexlease.api import keys, podfields
from flexlease.errors import PodSpecError
from tests.extender import payloads


def test_the_schemas_name_the_keys_flexlease_reads() -> None:
    assert set(podfields.Labels.__annotations__) == {
        keys.LABEL_PRIORITY,
        keys.LABEL_OWNER,
        keys.LABEL_ROLE,
        keys.LABEL_FRAMEWORK,
    }
    assert set(podfields.Annotations.__annotations__) == {
        keys.ANN_RELIABILITY,
        keys.ANN_GPU_TYPE,
        keys.ANN_RECLAIM,
        keys.ANN_CHECKPOINT,
        keys.ANN_ASSIGNED_GPUS,
    }


def test_pods_as_kubernetes_writes_them_pass() -> None:
    for pod in (
        payloads.pod("train-0", gpus=2, priority="high", owner="job-a", tier="HA", checkpoint="ckpt-1"),
        payloads.pod("bound", node_name="n-1", phase="Running", annotations=payloads.assigned("n-1", 0, 3)),
        {"metadata": {"name": "minimal"}},
        {"metadata": {"name": "p", "namespace": None, "labels": None}, "spec": None},
    ):
        podfields.check_pod(pod)


def _with(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    pod = copy.deepcopy(payloads.pod("p", priority="low"))
    node: Any = pod
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return pod


@pytest.mark.parametrize(
    ("path", "value", "where"),
    [
        (("metadata", "name"), "P", "Pod.metadata.name"),
        (("metadata", "namespace"), "a.b", "Pod.metadata.namespace"),
        (("metadata", "uid"), "u id", "Pod.metadata.uid"),
        (
            ("metadata", "labels", keys.LABEL_PRIORITY),
            "l" * 64,
            'Pod.metadata.labels["flexlease.io/priority"]',
        ),
        (
            ("metadata", "annotations", keys.ANN_ASSIGNED_GPUS),
            "n1:x",
            'Pod.metadata.annotations["flexlease.io/assigned-gpus"]',
        ),
        (("metadata", "ownerReferences", 0, "name"), "", "Pod.metadata.ownerReferences[0].name"),
        (("metadata", "ownerReferences", 0, "controller"), [], "Pod.metadata.ownerReferences[0].controller"),
        (("spec", "priority"), 2**31, "Pod.spec.priority"),
        (("spec", "schedulerName"), "A", "Pod.spec.schedulerName"),
        (("spec", "containers", 0, "image"), "x ", "Pod.spec.containers[0].image"),
        (("metadata",), None, "Pod.metadata"),
    ],
)
def test_a_field_kubernetes_refuses_is_named(path: tuple[str | int, ...], value: Any, where: str) -> None:
    with pytest.raises(PodSpecError) as info:
        podfields.check_pod(_with(path, value))
    assert str(info.value).startswith(where), str(info.value)


def test_victims_need_a_uid_and_valid_role_labels() -> None:
    podfields.check_victim(
        {"metadata": {"uid": "u-1", "labels": {keys.LABEL_ROLE: "coordinator"}}}, where="V"
    )
    for bad in ({"metadata": {}}, {"metadata": {"uid": "u-1", "labels": {keys.LABEL_ROLE: "a/b"}}}):
        with pytest.raises(PodSpecError, match=r"^V\.metadata"):
            podfields.check_victim(bad, where="V")


def test_locations_read_like_kubectl() -> None:
    assert podfields.location("Pod", ("metadata", "labels", "flexlease.io/owner")) == (
        'Pod.metadata.labels["flexlease.io/owner"]'
    )
    assert podfields.location("", ("NodeNames", 3)) == "NodeNames[3]"
    assert podfields.location("", ("x", "\ud800")) == 'x["\\ud800"]'
