"""Pod JSON as kubelet reports it, for the orchestrator tests."""

from __future__ import annotations

from typing import Any

from flexlease.api import keys
from flexlease.api.pod import owner_label_value

OWNER = "team-a/job"
NS = "team-a"


def pod(
    name: str,
    role: str,
    *,
    ready: bool = True,
    running: bool = True,
    port: int = 0,
    uid: str | None = None,
    owner: str = OWNER,
    framework: str | None = None,
) -> dict[str, Any]:
    """A pod of ``role`` in the test job; ``running``: its container has started (and an id)."""
    labels = {keys.LABEL_OWNER: owner_label_value(owner), keys.LABEL_ROLE: role}
    if framework:
        labels[keys.LABEL_FRAMEWORK] = framework
    container: dict[str, Any] = {"name": "main", "image": "trainer:v1"}
    if port:
        container["ports"] = [{"containerPort": port}]
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "uid": uid or f"uid-{name}", "labels": labels},
        "spec": {"containers": [container]},
        "status": status(ready=ready, running=running, name=name),
    }
    return obj


def status(*, ready: bool, running: bool, name: str = "x") -> dict[str, Any]:
    """``status`` of a pod whose one container ``main`` has (not) started and is (not) Ready."""
    cstatus: dict[str, Any] = {"name": "main", "ready": ready}
    if running:
        cstatus["containerID"] = f"containerd://cid-{name}"
        cstatus["state"] = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    else:
        cstatus["state"] = {"waiting": {"reason": "ContainerCreating"}}
    return {
        "phase": "Running" if running else "Pending",
        "podIP": "127.0.0.1",
        "conditions": [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                **({} if ready else {"reason": "ContainersNotReady"}),
            }
        ],
        "containerStatuses": [cstatus],
    }
