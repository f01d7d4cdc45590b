"""Objects shaped as a real cluster holds them, for seeding :class:`FakeApiServer` with
:meth:`~standins.apiserver.FakeApiServer.put`.

``replicaset_pod`` is a Pod created by a Deployment's ReplicaSet, scheduled and running:
the fields kube-apiserver defaulting, the ServiceAccount admission plugin, kube-scheduler
and kubelet add, with ``ownerReferences`` and ``managedFields`` from
kube-controller-manager, kube-scheduler and kubelet (modelled on ``kubectl get pod -o json``
of a kind v1.30 cluster). ``gpunode`` and ``gpulease`` are the flexlease CRDs as the agent
and the lease controller write them.
"""

from __future__ import annotations

import uuid
from typing import Any

JsonObj = dict[str, Any]
T0 = "2026-11-20T08:15:02Z"
T1 = "2026-11-20T08:15:09Z"


def replicaset_pod(
    name: str,
    *,
    namespace: str = "team-a",
    deployment: str = "trainer",
    node: str | None = "gpu-node-1",
    gpus: int = 1,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    running: bool = True,
    image: str = "registry.local/team-a/trainer:2.4.1",
) -> JsonObj:
    """A Deployment-owned Pod; ``gpus=0`` omits the GPU resource; ``node=None`` leaves it
    unscheduled (Pending, PodScheduled=False)."""
    rs = f"{deployment}-7d9c6b8f5"
    rs_uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"rs/{namespace}/{rs}"))
    limits: JsonObj = {"cpu": "8", "memory": "64Gi"}
    requests: JsonObj = {"cpu": "4", "memory": "32Gi"}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
        requests["nvidia.com/gpu"] = str(gpus)
    all_labels = {"app": deployment, "pod-template-hash": "7d9c6b8f5", **(labels or {})}
    pod: JsonObj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "generateName": f"{rs}-",
            "namespace": namespace,
            "labels": all_labels,
            "annotations": dict(annotations or {}),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": rs,
                    "uid": rs_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": T0,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {
                            "f:generateName": {},
                            "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}},
                            "f:ownerReferences": {".": {}, f'k:{{"uid":"{rs_uid}"}}': {}},
                        },
                        "f:spec": {
                            "f:containers": {
                                'k:{"name":"trainer"}': {
                                    ".": {},
                                    "f:image": {},
                                    "f:imagePullPolicy": {},
                                    "f:name": {},
                                    "f:resources": {".": {}, "f:limits": {}, "f:requests": {}},
                                }
                            },
                            "f:dnsPolicy": {},
                            "f:restartPolicy": {},
                            "f:schedulerName": {},
                        },
                    },
                },
            ],
        },
        "spec": {
            "volumes": [
                {
                    "name": "kube-api-access-x7k2q",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {
                                                "apiVersion": "v1",
                                                "fieldPath": "metadata.namespace",
                                            },
                                        }
                                    ]
                                }
                            },
                        ],
                        "defaultMode": 420,
                    },
                }
            ],
            "containers": [
                {
                    "name": "trainer",
                    "image": image,
                    "command": ["torchrun", "--nproc-per-node=1", "train.py"],
                    "ports": [{"name": "metrics", "containerPort": 9100, "protocol": "TCP"}],
                    "resources": {"limits": limits, "requests": requests},
                    "volumeMounts": [
                        {
                            "name": "kube-api-access-x7k2q",
                            "readOnly": True,
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        }
                    ],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }
    if node is None:
        pod["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "lastProbeTime": None,
                "lastTransitionTime": T0,
                "reason": "Unschedulable",
                "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
            }
        ]
        return pod
    pod["spec"]["nodeName"] = node
    pod["metadata"]["managedFields"].append(
        {
            "manager": "kube-scheduler",
            "operation": "Update",
            "apiVersion": "v1",
            "time": T0,
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:status": {"f:conditions": {'k:{"type":"PodScheduled"}': {".": {}, "f:status": {}}}}
            },
            "subresource": "status",
        }
    )
    conditions: list[JsonObj] = [
        {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": T0}
    ]
    if running:
        conditions = [
            {
                "type": "PodReadyToStartContainers",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": T1,
            },
            {"type": "Initialized", "status": "True", "lastProbeTime": None, "lastTransitionTime": T0},
            {"type": "Ready", "status": "True", "lastProbeTime": None, "lastTransitionTime": T1},
            {"type": "ContainersReady", "status": "True", "lastProbeTime": None, "lastTransitionTime": T1},
            *conditions,
        ]
        pod["status"].update(
            {
                "phase": "Running",
                "hostIP": "172.18.0.3",
                "hostIPs": [{"ip": "172.18.0.3"}],
                "podIP": "10.244.1.17",
                "podIPs": [{"ip": "10.244.1.17"}],
                "startTime": T0,
                "containerStatuses": [
                    {
                        "name": "trainer",
                        "state": {"running": {"startedAt": T1}},
                        "lastState": {},
                        "ready": True,
                        "restartCount": 0,
                        "image": image,
                        "imageID": f"{image.rsplit(':', 1)[0]}@sha256:{'3f' * 32}",
                        "containerID": "containerd://" + "9a" * 32,
                        "started": True,
                    }
                ],
            }
        )
        pod["metadata"]["managedFields"].append(
            {
                "manager": "kubelet",
                "operation": "Update",
                "apiVersion": "v1",
                "time": T1,
                "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:status": {
                        "f:conditions": {'k:{"type":"Ready"}': {".": {}, "f:status": {}}},
                        "f:containerStatuses": {},
                        "f:hostIP": {},
                        "f:phase": {},
                        "f:podIP": {},
                        "f:startTime": {},
                    }
                },
                "subresource": "status",
            }
        )
    pod["status"]["conditions"] = conditions
    return pod


def gpunode(name: str, *, devices: int = 8, owners: dict[int, str] | None = None) -> JsonObj:
    """A GPUNode with ``devices`` H100s, healthy and HA, as the agent reports them."""
    owners = owners or {}
    return {
        "apiVersion": "flexlease.io/v1alpha1",
        "kind": "GPUNode",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {
            "pool": "general",
            "devices": {str(i): {"owner": owners.get(i), "tierOverride": None} for i in range(devices)},
        },
        "status": {
            "nodeIP": "172.18.0.3",
            "agent": {"version": "0.1.0", "heartbeat": T1},
            "devices": {
                str(i): {
                    "uuid": f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{name}/{i}')}",
                    "model": "NVIDIA H100 80GB HBM3",
                    "memoryMiB": 81559,
                    "health": "Healthy",
                    "reason": "",
                    "availability": {
                        "windowSeconds": 1209600,
                        "observedSeconds": 1209600,
                        "unavailableSeconds": 0,
                        "ratio": 1.0,
                    },
                    "tier": "HA",
                    "tierComputedAt": T0,
                    "lastXid": None,
                }
                for i in range(devices)
            },
            "cache": {"images": [], "checkpoints": []},
        },
    }
