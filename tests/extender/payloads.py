"""Request bodies and objects shaped exactly as Kubernetes and kube-scheduler send them.

Pods are full camelCase ``v1.Pod`` JSON (metadata with uid, labels, annotations,
ownerReferences and managedFields; spec with containers and resources.limits; status), the
extender envelopes are PascalCase (``k8s.io/kube-scheduler/extender/v1``) with ``Nodes: null``
as a ``nodeCacheCapable`` scheduler sends them. GPUNodes follow DESIGN §2.
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

from flexlease.api import keys

H20 = "NVIDIA H20"
A100 = "NVIDIA A100-SXM4-80GB"


def pod(
    name: str,
    *,
    namespace: str = "ml",
    uid: str | None = None,
    gpus: int = 1,
    priority: str | None = None,
    owner: str | None = None,
    job: str = "job-a",
    tier: str | None = None,
    gpu_type: str | None = None,
    reclaim: bool = False,
    checkpoint: str | None = None,
    image: str = "registry.local/ml/train:1.4",
    annotations: dict[str, str] | None = None,
    node_name: str | None = None,
    phase: str = "Pending",
    spec_priority: int = 0,
    resource: str = keys.DEFAULT_GPU_RESOURCE,
) -> dict[str, Any]:
    """A Pod as the API server returns it (and kube-scheduler forwards it)."""
    uid = uid or str(uuidlib.uuid4())
    labels = {"app.kubernetes.io/name": "trainer", "batch.kubernetes.io/job-name": job}
    if priority is not None:
        labels[keys.LABEL_PRIORITY] = priority
    if owner is not None:
        labels[keys.LABEL_OWNER] = owner
    ann: dict[str, str] = {"kubectl.kubernetes.io/default-container": "trainer"}
    if tier is not None:
        ann[keys.ANN_RELIABILITY] = tier
    if gpu_type is not None:
        ann[keys.ANN_GPU_TYPE] = gpu_type
    if reclaim:
        ann[keys.ANN_RECLAIM] = "true"
    if checkpoint is not None:
        ann[keys.ANN_CHECKPOINT] = checkpoint
    ann.update(annotations or {})
    limits: dict[str, str] = {"cpu": "8", "memory": "64Gi"}
    if gpus:
        limits[resource] = str(gpus)
    spec: dict[str, Any] = {
        "volumes": [
            {
                "name": "kube-api-access-abcde",
                "projected": {
                    "sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]
                },
            }
        ],
        "containers": [
            {
                "name": "trainer",
                "image": image,
                "command": ["torchrun", "--nproc-per-node=auto", "train.py"],
                "resources": {"limits": limits, "requests": dict(limits)},
                "volumeMounts": [
                    {
                        "name": "kube-api-access-abcde",
                        "readOnly": True,
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                    }
                ],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "securityContext": {},
        "schedulerName": keys.DEFAULT_SCHEDULER_NAME,
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        ],
        "priorityClassName": "batch" if spec_priority == 0 else "online",
        "priority": spec_priority,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    if node_name is not None:
        spec["nodeName"] = node_name
    status: dict[str, Any] = {"phase": phase, "qosClass": "Guaranteed"}
    if node_name is None and phase == "Pending":
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "lastProbeTime": None,
                "lastTransitionTime": "2026-11-21T23:00:00Z",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            }
        ]
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "generateName": f"{job}-",
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": "1042",
            "creationTimestamp": "2026-11-21T23:00:00Z",
            "labels": labels,
            "annotations": ann,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job,
                    "uid": "0d3c1c1e-7d3f-4a8e-9d0e-2b8e6c1f0a11",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-21T23:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:labels": {".": {}, "f:batch.kubernetes.io/job-name": {}}},
                        "f:spec": {"f:containers": {'k:{"name":"trainer"}': {".": {}, "f:image": {}}}},
                    },
                }
            ],
        },
        "spec": spec,
        "status": status,
    }


def gpunode(
    name: str,
    *,
    gpus: int = 8,
    model: str = H20,
    tiers: str | list[str] = "HA",
    owners: dict[int, str] | None = None,
    overrides: dict[int, str] | None = None,
    unhealthy: set[int] | frozenset[int] = frozenset(),
    pool: str = "general",
    images: list[str] | None = None,
    checkpoints: list[str] | None = None,
) -> dict[str, Any]:
    """A ``GPUNode`` with ``gpus`` devices as its agent reports them."""
    tier_list = [tiers] * gpus if isinstance(tiers, str) else list(tiers)
    owners = owners or {}
    overrides = overrides or {}
    spec_devices: dict[str, Any] = {}
    for i in set(owners) | set(overrides):
        spec_devices[str(i)] = {
            "owner": owners.get(i),
            "leasedAt": "2026-11-21T01:30:00Z" if i in owners else None,
            "tierOverride": overrides.get(i),
        }
    devices = {
        str(i): {
            "uuid": f"GPU-{name}-{i:02d}-4c1e-9d2b-7a51",
            "model": model,
            "memoryMiB": 97871,
            "health": "Unhealthy" if i in unhealthy else "Healthy",
            "reason": "XID 79: GPU has fallen off the bus" if i in unhealthy else None,
            "availability": {
                "windowSeconds": 1209600.0,
                "observedSeconds": 1209600.0,
                "unavailableSeconds": 0.0,
                "ratio": 1.0,
            },
            "tier": tier_list[i],
            "tierComputedAt": "2026-11-20T00:00:00Z",
        }
        for i in range(gpus)
    }
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.GPUNODE_KIND,
        "metadata": {"name": name, "uid": str(uuidlib.uuid4()), "resourceVersion": "7", "labels": {}},
        "spec": {"pool": pool, "devices": spec_devices},
        "status": {
            "nodeIP": "10.0.0.1",
            "agent": {"version": "0.1.0", "heartbeat": "2026-11-21T23:59:00Z"},
            "devices": devices,
            "cache": {
                "images": images or [],
                "checkpoints": [
                    {"id": c, "sizeBytes": 1 << 30, "sha256": "0" * 64} for c in checkpoints or []
                ],
            },
        },
    }


def node(name: str) -> dict[str, Any]:
    """A core/v1 Node as the API server returns it (a CPU-only worker, Ready)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
        },
        "spec": {"podCIDR": "10.244.3.0/24", "providerID": f"kind://docker/cluster/{name}"},
        "status": {
            "capacity": {"cpu": "16", "memory": "65Gi", "pods": "110"},
            "allocatable": {"cpu": "15800m", "memory": "64Gi", "pods": "110"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "10.0.3.7"},
                {"type": "Hostname", "address": name},
            ],
        },
    }


def assigned(node: str, *indices: int) -> dict[str, str]:
    """The ``assigned-*`` annotations bind writes."""
    return {
        keys.ANN_ASSIGNED_GPUS: f"{node}:{','.join(map(str, indices))}",
        keys.ANN_ASSIGNED_UUIDS: ",".join(f"GPU-{node}-{i:02d}-4c1e-9d2b-7a51" for i in indices),
        keys.ANN_ASSIGNED_AT: "2026-11-21T23:10:00Z",
    }


def extender_args(pod_obj: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """``ExtenderArgs`` as a nodeCacheCapable kube-scheduler sends it."""
    return {"Pod": pod_obj, "Nodes": None, "NodeNames": names}


def binding_args(pod_obj: dict[str, Any], node: str) -> dict[str, Any]:
    """``ExtenderBindingArgs``."""
    meta = pod_obj["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}


def preemption_args(pod_obj: dict[str, Any], victims: dict[str, list[str]]) -> dict[str, Any]:
    """``ExtenderPreemptionArgs`` with ``NodeNameToMetaVictims`` (nodeCacheCapable)."""
    return {
        "Pod": pod_obj,
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0}
            for node, uids in victims.items()
        },
    }
