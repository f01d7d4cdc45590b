"""Defence in depth in the handlers (issue #18): /bind refuses other schedulers' pods, GPU
pods on nodes without a GPUNode and nodes that do not exist; filter, prioritize and preempt
pass other schedulers' pods through untouched. Every refusal is logged with the caller and
counted."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from extender import admission, server
from flexlease.api import keys
from flexlease.errors import StoreError
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore
from tests.extender import payloads
from tests.extender.conftest import add_node, add_pod, make_settings
from tests.extender.test_server import post


def refusals(registry: CollectorRegistry, verb: str, reason: str) -> float:
    value = registry.get_sample_value("flexlease_extender_refusals_total", {"verb": verb, "reason": reason})
    return value or 0.0


def other_scheduler(pod: dict[str, Any], name: str | None = "default-scheduler") -> dict[str, Any]:
    if name is None:
        del pod["spec"]["schedulerName"]  # the API server would default it to default-scheduler
    else:
        pod["spec"]["schedulerName"] = name
    return pod


async def test_the_issue_scenario_bind_of_another_schedulers_pod_is_refused(
    start: Any, store: MemoryStore, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    """The report: an unauthenticated POST /bind placed other-team/victim (default-scheduler,
    pending) on control-plane-0, a node without a GPUNode."""
    await add_node(store, payloads.gpunode("n1"))
    await store.create(Kind.NODE, payloads.node("control-plane-0"))
    victim = await add_pod(store, other_scheduler(payloads.pod("victim", namespace="other-team", gpus=0)))
    client = await start()
    with caplog.at_level(logging.WARNING, logger="extender.admission"):
        reply = await post(client, "bind", payloads.binding_args(victim, "control-plane-0"))
    assert reply["Error"] == (
        "pod other-team/victim: pod has spec.schedulerName 'default-scheduler'; this extender "
        "serves only flexlease-scheduler (extender.scheduler_names)"
    )
    stored = await store.get(Kind.POD, "victim", namespace="other-team")
    assert not stored["spec"].get("nodeName")
    assert refusals(registry, "bind", "foreign_scheduler") == 1
    [record] = [r for r in caplog.records if r.name == "extender.admission"]
    assert record.__dict__["caller"] == "127.0.0.1"  # plain HTTP: the peer address
    assert record.__dict__["reason"] == "foreign_scheduler"
    assert (record.__dict__["pod"], record.__dict__["node"]) == ("other-team/victim", "control-plane-0")
    # the same pod, bound to a GPU node, is refused too: the node is not the point
    reply = await post(client, "bind", payloads.binding_args(victim, "n1"))
    assert "spec.schedulerName 'default-scheduler'" in reply["Error"]


async def test_a_pod_without_scheduler_name_counts_as_default_scheduler(
    start: Any, store: MemoryStore
) -> None:
    await add_node(store, payloads.gpunode("n1"))
    pod = await add_pod(store, other_scheduler(payloads.pod("p"), None))
    client = await start()
    reply = await post(client, "bind", payloads.binding_args(pod, "n1"))
    assert "spec.schedulerName 'default-scheduler'" in reply["Error"]


async def test_configured_profiles_are_served(start: Any, store: MemoryStore) -> None:
    await add_node(store, payloads.gpunode("n1"))
    pod = await add_pod(store, other_scheduler(payloads.pod("p"), "gpu-batch"))
    settings = make_settings(scheduler_names=("flexlease-scheduler", "gpu-batch"))
    client = await start(app_settings=settings)
    assert await post(client, "bind", payloads.binding_args(pod, "n1")) == {"Error": ""}


async def test_bind_refuses_a_gpu_pod_on_a_node_without_gpunode(
    start: Any, store: MemoryStore, registry: CollectorRegistry
) -> None:
    await add_node(store, payloads.gpunode("n1"))
    await store.create(Kind.NODE, payloads.node("cpu-0"))  # exists, but no GPUNode
    pod = await add_pod(store, payloads.pod("p", gpus=1))
    client = await start()
    reply = await post(client, "bind", payloads.binding_args(pod, "cpu-0"))
    assert reply["Error"] == "pod ml/p requests GPUs; node cpu-0 has no GPUNode (not a flexlease node)"
    assert refusals(registry, "bind", "no_gpunode") == 1
    stored = await store.get(Kind.POD, "p", namespace="ml")
    assert not stored["spec"].get("nodeName")
    assert keys.ANN_ASSIGNED_GPUS not in stored["metadata"]["annotations"]


async def test_bind_refuses_a_node_that_does_not_exist(
    start: Any, store: MemoryStore, registry: CollectorRegistry
) -> None:
    await add_node(store, payloads.gpunode("n1"))
    pod = await add_pod(store, payloads.pod("web", gpus=0))
    client = await start()
    reply = await post(client, "bind", payloads.binding_args(pod, "ghost-node"))
    assert reply["Error"] == "node ghost-node does not exist"
    assert refusals(registry, "bind", "no_node") == 1
    assert not (await store.get(Kind.POD, "web", namespace="ml"))["spec"].get("nodeName")
    # a pod without GPUs may go to a node with a GPUNode without a Node lookup
    assert await post(client, "bind", payloads.binding_args(pod, "n1")) == {"Error": ""}


async def test_bind_refuses_when_the_node_cannot_be_checked(
    start: Any, store: MemoryStore, registry: CollectorRegistry
) -> None:
    pod = await add_pod(store, payloads.pod("web", gpus=0))
    real_get = store.get

    async def failing_get(kind: Kind, name: str, *, namespace: str | None = None) -> Any:
        if kind is Kind.NODE:
            raise StoreError("apiserver unavailable", status=503)
        return await real_get(kind, name, namespace=namespace)

    store.get = failing_get  # type: ignore[method-assign]
    client = await start()
    reply = await post(client, "bind", payloads.binding_args(pod, "cpu-0"))
    assert reply["Error"].startswith("cannot check that node cpu-0 exists")
    assert refusals(registry, "bind", "node_unknown") == 1


async def test_filter_prioritize_preempt_pass_another_schedulers_pod_untouched(
    start: Any, store: MemoryStore, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    """A GPU pod of default-scheduler asks for 8 GPUs on nodes with 2: the extender answers as
    for a pod without managed GPUs — every candidate passes, scores 0, victims unchanged —
    and reads nothing: no verdict counted, no layout leaked in FailedNodes."""
    await add_node(store, payloads.gpunode("n1", gpus=2))
    await add_node(store, payloads.gpunode("n2", gpus=2))
    pod = other_scheduler(payloads.pod("big", gpus=8))
    client = await start()
    app = client.app
    with caplog.at_level(logging.WARNING, logger="extender.admission"):
        reply = await post(client, "filter", payloads.extender_args(pod, ["n1", "n2", "cpu-0"]))
    [record] = [r for r in caplog.records if r.name == "extender.admission"]
    assert (record.__dict__["verb"], record.__dict__["pod"]) == ("filter", "ml/big")
    assert reply == {
        "Nodes": None,
        "NodeNames": ["n1", "n2", "cpu-0"],
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    scores = await post(client, "prioritize", payloads.extender_args(pod, ["n1", "n2"]))
    assert scores == [{"Host": "n1", "Score": 0}, {"Host": "n2", "Score": 0}]
    proposal = payloads.preemption_args(pod, {"n1": ["uid-a", "uid-b"]})
    victims = await post(client, "preempt", proposal)
    assert victims["NodeNameToMetaVictims"] == {
        "n1": {"Pods": [{"UID": "uid-a"}, {"UID": "uid-b"}], "NumPDBViolations": 0}
    }
    for verb in ("filter", "prioritize", "preempt"):
        assert refusals(registry, verb, "foreign_scheduler") == 1
    decisions = [
        s
        for m in registry.collect()
        if m.name == "flexlease_extender_decisions"
        for s in m.samples
        if s.name.endswith("_total") and s.value
    ]
    assert decisions == []  # no verdict was computed
    assert app[server.INVENTORY].summary()["reservations"] == 0


def test_scheduler_name_and_foreign_scheduler_are_pure() -> None:
    assert admission.scheduler_name({"spec": {"schedulerName": "x"}}) == "x"
    assert admission.scheduler_name({"spec": {"schedulerName": 7}}) == "default-scheduler"
    assert admission.scheduler_name({"spec": None}) == "default-scheduler"
    assert admission.scheduler_name({}) == "default-scheduler"
    assert admission.foreign_scheduler({"spec": {"schedulerName": "a"}}, ("a", "b")) is None
    refusal = admission.foreign_scheduler({}, ("a",))
    assert refusal is not None and refusal.reason == admission.FOREIGN_SCHEDULER
