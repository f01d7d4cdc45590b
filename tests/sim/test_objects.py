"""flexlease.sim.objects: the objects the simulator writes read back as flexlease reads them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from flexlease.api import keys, pod, resources
from flexlease.api.resources import DeviceKey, LeaseAction, Pool
from flexlease.api.tiers import Tier
from flexlease.sim import objects


def test_pod_parses_as_the_extender_reads_it() -> None:
    obj = objects.pod(
        "trainer-1",
        "online",
        gpus=8,
        priority="high",
        owner="trainer",
        reliability=Tier.MA,
        reclaim=True,
        pin_nodes=["gpu-001"],
    )
    obj["metadata"]["uid"] = "u1"
    req = pod.parse_pod(obj)
    assert req.count == 8
    assert req.priority is pod.Priority.HIGH
    assert req.owner == "online/trainer"
    assert req.required_tier is Tier.MA
    assert req.reclaim
    limits = obj["spec"]["containers"][0]["resources"]
    assert limits["limits"][keys.DEFAULT_GPU_RESOURCE] == limits["requests"][keys.DEFAULT_GPU_RESOURCE] == "8"
    assert obj["spec"]["priority"] > 0


def test_pod_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        objects.pod("p", "ns", gpus=0, priority="low", owner="x")
    with pytest.raises(ValueError):
        objects.pod("p", "ns", gpus=1, priority="urgent", owner="x")


def test_affinity_nodes_is_kube_schedulers_hostname_filter() -> None:
    pinned = objects.pod("p", "ns", gpus=1, priority="low", owner="x", pin_nodes=["b", "c"])
    assert objects.affinity_nodes(pinned, ["a", "b", "c"]) == ["b", "c"]
    free = objects.pod("p", "ns", gpus=1, priority="low", owner="x")
    assert objects.affinity_nodes(free, ["a", "b"]) == ["a", "b"]
    terms = pinned["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    terms["nodeSelectorTerms"][0]["matchExpressions"][0]["operator"] = "NotIn"
    with pytest.raises(ValueError, match="unsupported"):
        objects.affinity_nodes(pinned, ["a"])


def test_gpunode_and_status_validate_as_crd_models() -> None:
    node = resources.parse_gpunode(objects.gpunode("gpu-000", pool=Pool.STANDBY) | {"status": {}})
    assert node.spec.pool is Pool.STANDBY
    avail = resources.Availability(window_seconds=10, observed_seconds=10, unavailable_seconds=1, ratio=0.9)
    dev = objects.device_status(
        "gpu-000",
        3,
        healthy=False,
        tier=Tier.LA,
        availability=avail,
        computed_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    status = objects.gpunode_status("10.0.0.1", {"3": dev}, spec=node.spec)
    parsed = resources.GPUNodeStatus.model_validate(status)
    assert parsed.devices["3"].health is resources.Health.UNHEALTHY
    assert parsed.devices["3"].uuid == objects.gpu_uuid("gpu-000", 3)
    assert parsed.summary is not None and parsed.summary.la == 1


def test_gpu_uuid_is_stable() -> None:
    assert objects.gpu_uuid("n", 1) == objects.gpu_uuid("n", 1) != objects.gpu_uuid("n", 2)


def test_gpulease_lend_and_reclaim() -> None:
    lend = objects.gpulease(
        "lend-1", "online/trainer", action=LeaseAction.LEND, devices=[DeviceKey("gpu-1", 2)]
    )
    parsed = resources.parse_gpulease(lend | {"metadata": {"name": "lend-1", "namespace": "online"}})
    assert parsed.spec.devices is not None and parsed.spec.devices[0].key == DeviceKey("gpu-1", 2)
    assert lend["metadata"]["namespace"] == "online"
    reclaim = objects.gpulease(
        "r", "online/trainer", action=LeaseAction.RECLAIM, count=5, grace_period_seconds=30
    )
    assert reclaim["spec"]["count"] == 5 and reclaim["spec"]["gracePeriodSeconds"] == 30
    with pytest.raises(ValidationError):
        objects.gpulease("r", "online/trainer", action=LeaseAction.RECLAIM, count=5, grace_period_seconds=5)
