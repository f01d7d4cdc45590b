"""Kubernetes objects the simulator writes: GPUNodes, Pods and GPULeases (pure builders).

Pods are full camelCase ``v1.Pod`` JSON, as kube-scheduler would send them to the extender:
GPUs as the extended resource ``nvidia.com/gpu`` in both requests and limits (Kubernetes
requires them equal), the flexlease labels and annotations (DESIGN §2), ``priority`` /
``priorityClassName``, and for pods pinned to nodes a required node affinity on
``kubernetes.io/hostname`` which :func:`affinity_nodes` evaluates as kube-scheduler's
NodeAffinity filter does for this one form.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from flexlease.api import keys, resources
from flexlease.api.tiers import Tier
from flexlease.store.base import JsonObj

HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
SIM_MODEL: Final = "NVIDIA H20"
SIM_MEMORY_MIB: Final = 97871
MEMORY_MIB: Final = {"NVIDIA H20": 97871, "NVIDIA H100 80GB HBM3": 81559, "NVIDIA A100-SXM4-80GB": 81920}
"""``memory.total`` NVML reports for the models the simulator knows (others: :data:`SIM_MEMORY_MIB`)."""
HIGH_PRIORITY_VALUE: Final = 1000
LOW_PRIORITY_VALUE: Final = 0
AGENT_VERSION: Final = "flexlease-sim"


def gpu_uuid(node: str, index: int) -> str:
    """A stable NVML-style UUID for a simulated GPU."""
    digest = f"{zlib.crc32(f'{node}/{index}'.encode()):08x}"
    return f"GPU-sim-{node}-{index}-{digest}"


def gpunode(name: str, *, pool: resources.Pool) -> JsonObj:
    """A new ``GPUNode`` (spec only; the status is patched separately, as the agent does)."""
    node = resources.GPUNode(
        metadata=resources.ObjectMeta(name=name),
        spec=resources.GPUNodeSpec(pool=pool),
    )
    obj = node.to_json_obj()
    obj.pop("status", None)
    return obj


def device_status(
    node: str,
    index: int,
    *,
    healthy: bool,
    tier: Tier,
    availability: resources.Availability,
    computed_at: datetime,
    model: str = SIM_MODEL,
) -> resources.DeviceStatus:
    """One device as the node agent reports it (``model``: NVML's product name)."""
    return resources.DeviceStatus(
        uuid=gpu_uuid(node, index),
        model=model,
        memory_mib=MEMORY_MIB.get(model, SIM_MEMORY_MIB),
        health=resources.Health.HEALTHY if healthy else resources.Health.UNHEALTHY,
        reason=None if healthy else "simulated outage",
        availability=availability,
        tier=tier,
        tier_computed_at=computed_at,
        minor_number=index,
    )


def gpunode_status(
    node_ip: str,
    devices: dict[str, resources.DeviceStatus],
    *,
    spec: resources.GPUNodeSpec,
    heartbeat: datetime | None = None,
) -> JsonObj:
    """The ``status`` body of a GPUNode status patch (with the printer-column summary)."""
    status = resources.GPUNodeStatus(
        node_ip=node_ip,
        agent=resources.AgentInfo(version=AGENT_VERSION, heartbeat=heartbeat or datetime.now(UTC)),
        devices=devices,
        summary=resources.summarize(spec, devices),
    )
    return status.to_json_obj()


def pod(
    name: str,
    namespace: str,
    *,
    gpus: int,
    priority: str,
    owner: str,
    reliability: Tier = Tier.LA,
    reclaim: bool = False,
    pin_nodes: Sequence[str] = (),
    gpu_type: str | None = None,
    image: str = "registry.local/train:1",
    gpu_resource: str = keys.DEFAULT_GPU_RESOURCE,
) -> JsonObj:
    """A pending pod requesting ``gpus`` GPUs. ``owner`` is the job name (the label value; the
    namespace completes it to ``<ns>/<job>``); ``pin_nodes`` adds a required hostname affinity;
    ``gpu_type`` asks for that GPU model (the ``gpu-type`` annotation)."""
    if gpus < 1:
        raise ValueError("gpus must be >= 1")
    if priority not in (keys.PRIORITY_HIGH, keys.PRIORITY_LOW):
        raise ValueError(f"priority must be {keys.PRIORITY_HIGH!r} or {keys.PRIORITY_LOW!r}")
    quantity = str(gpus)
    annotations = {keys.ANN_RELIABILITY: reliability.value}
    if reclaim:
        annotations[keys.ANN_RECLAIM] = "true"
    if gpu_type:
        annotations[keys.ANN_GPU_TYPE] = gpu_type
    high = priority == keys.PRIORITY_HIGH
    spec: dict[str, Any] = {
        "schedulerName": keys.DEFAULT_SCHEDULER_NAME,
        "priorityClassName": "flexlease-high" if high else "flexlease-low",
        "priority": HIGH_PRIORITY_VALUE if high else LOW_PRIORITY_VALUE,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "containers": [
            {
                "name": "main",
                "image": image,
                "resources": {
                    "requests": {gpu_resource: quantity, "cpu": "4"},
                    "limits": {gpu_resource: quantity},
                },
            }
        ],
    }
    if pin_nodes:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": HOSTNAME_LABEL, "operator": "In", "values": list(pin_nodes)}
                            ]
                        }
                    ]
                }
            }
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {keys.LABEL_PRIORITY: priority, keys.LABEL_OWNER: owner},
            "annotations": annotations,
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def affinity_nodes(pod_obj: JsonObj, nodes: Iterable[str]) -> list[str]:
    """``nodes`` that pass the pod's required node affinity (only the ``kubernetes.io/hostname
    In`` form the simulator writes; terms are ORed). All of them when the pod has none.
    Raises ``ValueError`` for any other affinity form."""
    names = list(nodes)
    required = (((pod_obj.get("spec") or {}).get("affinity") or {}).get("nodeAffinity", {})).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return names
    allowed: set[str] = set()
    for term in required.get("nodeSelectorTerms") or []:
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") != HOSTNAME_LABEL or expr.get("operator") != "In":
                raise ValueError(f"unsupported node affinity expression {expr!r}")
            allowed.update(expr.get("values") or [])
    return [n for n in names if n in allowed]


def gpulease(
    name: str,
    owner: str,
    *,
    action: resources.LeaseAction,
    devices: Sequence[resources.DeviceKey] = (),
    count: int | None = None,
    grace_period_seconds: int = resources.DEFAULT_GRACE_SECONDS,
) -> JsonObj:
    """A ``GPULease`` in the owner's namespace: Lend with ``devices`` or Reclaim with ``count``.
    Validated through :class:`flexlease.api.resources.GPULeaseSpec` (raises
    ``pydantic.ValidationError`` on a bad owner, both/neither of devices and count, or a
    grace period outside 30–60 s)."""
    namespace = owner.split("/", 1)[0]
    spec = resources.GPULeaseSpec(
        owner=owner,
        action=action,
        devices=[resources.LeaseDevice(node=d.node, index=d.index) for d in devices] if devices else None,
        count=count,
        grace_period_seconds=grace_period_seconds,
    )
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.GPULEASE_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec.to_json_obj(),
    }
