"""The agent's ValidatingAdmissionPolicy, evaluated as kube-apiserver does (match conditions,
then variables, then validations; any false validation denies) with a real CEL interpreter
(``common-expression-language``) on the admission request's ``request`` and ``object``: an agent
token may write its own node's GPUNode and the pods bound to its node, nothing else."""

from __future__ import annotations

from typing import Any

import cel
import pytest

from tests.manifests.render import NAMESPACE, base, find

AGENT = f"system:serviceaccount:{NAMESPACE}:flexlease-agent"
NODE_NAME = "authentication.kubernetes.io/node-name"


def admit(user: str, extra: dict[str, list[str]], resource: str, obj: dict[str, Any]) -> str | None:
    """None when the policy admits the request, else the denial message."""
    spec = find(base(), "ValidatingAdmissionPolicy", "flexlease-agent-own-node")["spec"]
    request = {
        "userInfo": {"username": user, "extra": extra},
        "resource": {"group": "" if resource == "pods" else "flexlease.io", "resource": resource},
        "operation": "UPDATE",
    }
    env: dict[str, Any] = {"request": request, "object": obj}
    if not all(cel.evaluate(c["expression"], env) for c in spec["matchConditions"]):
        return None
    env["variables"] = {v["name"]: cel.evaluate(v["expression"], env) for v in spec["variables"]}
    for rule in spec["validations"]:
        if not cel.evaluate(rule["expression"], env):
            message = rule.get("message") or cel.evaluate(rule["messageExpression"], env)
            return str(message)
    return None


def gpunode(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"pool": "general"}}


def pod(node: str | None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "team-a"}, "spec": {"nodeName": node} if node else {}}


ON_N1 = {NODE_NAME: ["gpu-1"], "authentication.kubernetes.io/pod-name": ["flexlease-agent-x7k2p"]}


@pytest.mark.parametrize(
    ("resource", "obj"),
    [("gpunodes", gpunode("gpu-1")), ("pods", pod("gpu-1"))],
)
def test_an_agent_may_write_its_own_node_s_objects(resource: str, obj: dict[str, Any]) -> None:
    assert admit(AGENT, ON_N1, resource, obj) is None


@pytest.mark.parametrize(
    ("resource", "obj", "message"),
    [
        ("gpunodes", gpunode("gpu-2"), "flexlease-agent on node gpu-1 may write only GPUNode gpu-1"),
        ("pods", pod("gpu-2"), "flexlease-agent on node gpu-1 may write only pods bound to it"),
        ("pods", pod(None), "flexlease-agent on node gpu-1 may write only pods bound to it"),
    ],
)
def test_an_agent_may_not_write_other_nodes_objects(resource: str, obj: dict[str, Any], message: str) -> None:
    assert admit(AGENT, ON_N1, resource, obj) == message


def test_an_agent_token_without_a_node_is_refused() -> None:
    message = admit(AGENT, {}, "gpunodes", gpunode("gpu-1"))
    assert message is not None and "no node name" in message


def test_other_users_are_not_matched() -> None:
    extender = f"system:serviceaccount:{NAMESPACE}:flexlease-extender"
    assert admit(extender, {}, "gpunodes", gpunode("gpu-2")) is None
    assert admit("kubernetes-admin", {}, "pods", pod(None)) is None
