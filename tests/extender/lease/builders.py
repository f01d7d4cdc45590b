"""Kubernetes-shaped JSON for lease tests: GPUNodes, pods, GPULeases, PDBs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flexlease.api import keys

H20 = "NVIDIA H20"
A100 = "NVIDIA A100-SXM4-80GB"
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def device(model: str = H20, tier: str = "HA", health: str = "Healthy", *, index: int = 0) -> dict[str, Any]:
    return {
        "uuid": f"GPU-{model[-3:]}-{index}",
        "model": model,
        "memoryMiB": 97871,
        "health": health,
        "tier": tier,
    }


def gpunode(
    name: str,
    tiers: list[str] | str = "HA",
    *,
    count: int = 8,
    model: str = H20,
    pool: str = "general",
    tags: dict[int, str] | None = None,
    health: dict[int, str] | None = None,
) -> dict[str, Any]:
    """A GPUNode with ``count`` devices; ``tiers`` is one tier for all or one per index."""
    tier_list = [tiers] * count if isinstance(tiers, str) else tiers
    health = health or {}
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.GPUNODE_KIND,
        "metadata": {"name": name},
        "spec": {
            "pool": pool,
            "devices": {
                str(i): {"owner": owner, "leasedAt": "2026-03-01T00:00:00Z"}
                for i, owner in (tags or {}).items()
            },
        },
        "status": {
            "nodeIP": "10.0.0.1",
            "devices": {
                str(i): device(model, tier_list[i], health.get(i, "Healthy"), index=i)
                for i in range(len(tier_list))
            },
        },
    }


def pod(
    name: str,
    node: str,
    indices: list[int],
    *,
    namespace: str = "lp",
    priority: str = "low",
    owner: str | None = None,
    deadline: str | None = None,
    phase: str = "Running",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    pod_labels = {keys.LABEL_PRIORITY: priority, **(labels or {})}
    if owner is not None:
        pod_labels[keys.LABEL_OWNER] = owner.split("/", 1)[1]
    annotations = {keys.ANN_ASSIGNED_GPUS: f"{node}:{','.join(str(i) for i in indices)}"}
    if deadline is not None:
        annotations[keys.ANN_PREEMPT_DEADLINE] = deadline
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": pod_labels, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": len(indices)}},
                }
            ],
        },
        "status": {"phase": phase},
    }


def lease(
    name: str,
    action: str,
    *,
    owner: str = "online/rec",
    devices: list[tuple[str, int]] | None = None,
    count: int | None = None,
    grace: int = 45,
    created: datetime = T0,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"owner": owner, "action": action, "gracePeriodSeconds": grace}
    if devices is not None:
        spec["devices"] = [{"node": n, "index": i} for n, i in devices]
    if count is not None:
        spec["count"] = count
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.GPULEASE_KIND,
        "metadata": {
            "name": name,
            "namespace": owner.split("/", 1)[0],
            "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "spec": spec,
    }


def pdb(name: str, *, namespace: str, match: dict[str, str], allowed: int) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"matchLabels": match}, "maxUnavailable": 0},
        "status": {"disruptionsAllowed": allowed},
    }
