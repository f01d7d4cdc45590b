"""ManagedPods: which pods the extender keeps when the API server sends all of them."""

from __future__ import annotations

from flexlease.store.kube_filter import ManagedPods
from tests.store.contract import make_pod
from tests.store.fake_apiserver_payloads import replicaset_pod


def test_gpu_requests_match_wherever_they_are() -> None:
    keep = ManagedPods()
    assert keep(replicaset_pod("a", gpus=2, node=None))
    only_requests = make_pod("b")
    only_requests["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "1"}}
    assert keep(only_requests)
    init = make_pod("c", gpus=0)
    init["spec"]["containers"][0]["resources"] = {}
    init["spec"]["initContainers"] = [
        {"name": "warm", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    ]
    assert keep(init)
    assert not ManagedPods(resource="example.com/npu")(replicaset_pod("d", gpus=1, node="cpu-1"))


def test_flexlease_keys_match() -> None:
    keep = ManagedPods()
    assert keep(replicaset_pod("a", gpus=0, node="cpu-1", annotations={"flexlease.io/checkpoint": "ck"}))
    assert keep(replicaset_pod("b", gpus=0, node="cpu-1", labels={"flexlease.io/priority": "low"}))
    assert not keep(replicaset_pod("c", gpus=0, node="cpu-1", annotations={"example.com/flexlease.io": "x"}))


def test_pods_on_gpu_nodes_match() -> None:
    nodes = {"gpu-node-1"}
    keep = ManagedPods(gpu_nodes=lambda: nodes)
    assert keep(replicaset_pod("a", gpus=0, node="gpu-node-1"))
    assert not keep(replicaset_pod("b", gpus=0, node="cpu-1"))
    assert not keep(replicaset_pod("c", gpus=0, node=None))
    nodes.add("cpu-1")  # the live set is read per pod
    assert keep(replicaset_pod("b", gpus=0, node="cpu-1"))


def test_malformed_gpu_quantity_matches_so_it_can_be_reported() -> None:
    pod = make_pod("a")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1.5"
    assert ManagedPods()(pod)
    assert not ManagedPods()(make_pod("b", gpus=0))
