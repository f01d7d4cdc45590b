"""Scale-down protection for critical pods (WeFlex §3.4) where Kubernetes picks the victims.

flexlease never chooses which of a job's pods go when the job shrinks to lend GPUs: the job's
own controller deletes them. A ReplicaSet (so a Deployment) honours the annotation
``controller.kubernetes.io/pod-deletion-cost`` (KEP-2255; beta and on by default since
Kubernetes 1.22, GA in 1.24): among otherwise equal pods it deletes the lower cost first, and
the value is an int32. So every live ReplicaSet pod whose ``flexlease.io/role`` its framework
profile marks critical (coordinator, Ray head, rank 0) gets the highest cost, ``2147483647``.
ReplicaSet still deletes unscheduled, pending or not-Ready pods before Ready ones whatever the
cost. A StatefulSet ignores the annotation and removes the highest ordinal first: give the
critical role ordinal 0. Pure: reads Pod JSON, returns the patches to write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from extender.orchestrator import profile as profiles
from flexlease.api.pod import is_terminated

ANN_POD_DELETION_COST: Final = "controller.kubernetes.io/pod-deletion-cost"
"""Kubernetes' own annotation (k8s.io/api/core/v1 ``PodDeletionCost``), read by ReplicaSet."""
CRITICAL_DELETION_COST: Final = str(2**31 - 1)
"""The largest int32: delete this pod last."""


@dataclass(frozen=True, slots=True)
class CostPatch:
    """Write ``controller.kubernetes.io/pod-deletion-cost`` on one pod (at its resourceVersion)."""

    namespace: str
    name: str
    resource_version: str

    def body(self) -> dict[str, Any]:
        return {"metadata": {"annotations": {ANN_POD_DELETION_COST: CRITICAL_DELETION_COST}}}


def needs_cost(pod: Mapping[str, Any], critical: Mapping[str, frozenset[str]]) -> bool:
    """Whether ``pod`` is a live, critical ReplicaSet pod without the highest deletion cost."""
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        return False
    labels = meta.get("labels")  # the cheap test first: most pods hold no critical role
    if not isinstance(labels, dict) or not profiles.is_critical(labels, critical):
        return False
    if meta.get("deletionTimestamp") or is_terminated(dict(pod)):
        return False
    refs = meta.get("ownerReferences")
    if not isinstance(refs, list) or not any(
        isinstance(r, dict) and r.get("controller") is True and r.get("kind") == "ReplicaSet" for r in refs
    ):
        return False
    annotations = meta.get("annotations")
    current = annotations.get(ANN_POD_DELETION_COST) if isinstance(annotations, dict) else None
    return current != CRITICAL_DELETION_COST


def plan_costs(pods: Iterable[Mapping[str, Any]], critical: Mapping[str, frozenset[str]]) -> list[CostPatch]:
    """The patches that give every critical ReplicaSet pod in ``pods`` the highest deletion
    cost, sorted by namespace and name; empty when all have it."""
    out: list[CostPatch] = []
    for pod in pods:
        if needs_cost(pod, critical):
            meta = pod["metadata"]
            out.append(
                CostPatch(
                    namespace=str(meta.get("namespace") or ""),
                    name=str(meta.get("name") or ""),
                    resource_version=str(meta.get("resourceVersion") or ""),
                )
            )
    return sorted(out, key=lambda p: (p.namespace, p.name))
