"""Pod JSON shaped like the API server's (and kube-scheduler's extender payloads), for tests."""

from __future__ import annotations

import uuid
from typing import Any


def make_pod(
    name: str = "trainer-0",
    namespace: str = "recsys",
    *,
    gpus: int | str | None = 1,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    node_name: str | None = None,
    phase: str = "Pending",
    owner: str | None = "trainer",
    init_gpus: list[tuple[int, bool]] | None = None,
    resource: str = "nvidia.com/gpu",
    image: str = "registry.local/recsys/trainer:v1",
) -> dict[str, Any]:
    """A full Pod object: metadata with uid, ownerReferences and managedFields, spec, status.

    ``init_gpus``: init containers as ``(gpus, is_sidecar)``.
    """
    uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{name}"))
    limits: dict[str, Any] = {"cpu": "8", "memory": "64Gi"}
    if gpus is not None:
        limits[resource] = str(gpus) if isinstance(gpus, int) else gpus
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid,
        "resourceVersion": "4711",
        "creationTimestamp": "2026-11-21T08:00:00Z",
        "labels": {"app": "trainer", **(labels or {})},
        "annotations": dict(annotations or {}),
        "managedFields": [
            {
                "manager": "kube-controller-manager",
                "operation": "Update",
                "apiVersion": "v1",
                "time": "2026-11-21T08:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}},
            }
        ],
    }
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "name": owner,
                "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, owner)),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "trainer",
                "image": image,
                "resources": {"limits": limits, "requests": dict(limits)},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "schedulerName": "default-scheduler",
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
        ],
    }
    if init_gpus:
        spec["initContainers"] = [
            {
                "name": f"init-{i}",
                "image": "busybox",
                "resources": {"limits": {resource: str(n)}},
                **({"restartPolicy": "Always"} if sidecar else {}),
            }
            for i, (n, sidecar) in enumerate(init_gpus)
        ]
    if node_name:
        spec["nodeName"] = node_name
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": meta,
        "spec": spec,
        "status": {
            "phase": phase,
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
            "qosClass": "Guaranteed",
        },
    }
