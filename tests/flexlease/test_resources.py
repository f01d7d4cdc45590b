from __future__ import annotations

import pytest
from pydantic import ValidationError

from flexlease.api import resources
from flexlease.api.resources import DeviceKey, GPULease, GPUNode, Health, Pool
from flexlease.api.tiers import Tier


def _node() -> GPUNode:
    return GPUNode.model_validate(
        {
            "apiVersion": "flexlease.io/v1alpha1",
            "kind": "GPUNode",
            "metadata": {"name": "gpu-7", "resourceVersion": "12"},
            "spec": {"pool": "standby", "devices": {"1": {"owner": "recsys/ranker", "tierOverride": "LA"}}},
            "status": {
                "nodeIP": "10.1.2.7",
                "devices": {
                    str(i): {
                        "uuid": f"GPU-{i}",
                        "model": "NVIDIA H20",
                        "memoryMiB": 97871,
                        "health": "Healthy",
                        "tier": "HA",
                        "availability": {
                            "windowSeconds": 1209600,
                            "observedSeconds": 1209600,
                            "unavailableSeconds": 0,
                            "ratio": 1.0,
                        },
                    }
                    for i in range(2)
                },
            },
        }
    )


def test_gpunode_round_trips_camel_case() -> None:
    node = _node()
    assert node.spec.pool is Pool.STANDBY
    assert node.status.devices["0"].health is Health.HEALTHY
    out = node.to_json_obj()
    assert out["status"]["nodeIP"] == "10.1.2.7"  # type: ignore[index]
    assert out["status"]["devices"]["0"]["memoryMiB"] == 97871  # type: ignore[index]
    assert GPUNode.model_validate(out) == node


def test_effective_tier_honours_override() -> None:
    node = _node()
    assert node.effective_tier(0) is Tier.HA
    assert node.effective_tier(1) is Tier.LA
    assert node.effective_tier(5) is None


def test_gpulease_needs_devices_xor_count() -> None:
    base = {"metadata": {"name": "l", "namespace": "recsys"}}
    ok = GPULease.model_validate(
        {**base, "spec": {"owner": "recsys/ranker", "action": "Reclaim", "count": 4}}
    )
    assert ok.spec.grace_period_seconds == resources.DEFAULT_GRACE_SECONDS
    for spec in (
        {"owner": "recsys/ranker", "action": "Lend"},
        {"owner": "recsys/ranker", "action": "Lend", "count": 1, "devices": [{"node": "n", "index": 0}]},
        {"owner": "recsys/ranker", "action": "Lend", "count": 1, "gracePeriodSeconds": 10},
        {"owner": "ranker", "action": "Lend", "count": 1},
        {"owner": "recsys/ranker", "action": "Borrow", "count": 1},
    ):
        with pytest.raises(ValidationError):
            GPULease.model_validate({**base, "spec": spec})


def test_device_key_is_hashable_and_ordered() -> None:
    keys = {DeviceKey("b", 1), DeviceKey("a", 2), DeviceKey("a", 2)}
    assert sorted(keys) == [DeviceKey("a", 2), DeviceKey("b", 1)]
    assert str(DeviceKey("gpu-7", 3)) == "gpu-7/3"
    key = DeviceKey("gpu-7", 3)
    assert (key.node, key.index) == ("gpu-7", 3) and repr(key) == "DeviceKey(node='gpu-7', index=3)"
    assert {key: 1}[DeviceKey("gpu-7", 3)] == 1 and DeviceKey("gpu-10", 0) < DeviceKey("gpu-7", 0)
