"""Custom resources through the stand-in API server are pruned and validated against the
CRDs in manifests/base/crds, as kube-apiserver does: unknown fields vanish, invalid values get
422 Invalid with per-field causes and change nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from flexlease.config import StoreSettings
from flexlease.errors import StoreError
from flexlease.store.base import Kind
from flexlease.store.kube import Backoff, KubeStore
from flexlease.store.memory import MemoryStore
from standins.apiserver import FakeApiServer
from standins.crd_schema import SchemaError, prune, prune_and_validate
from tests.store.faults import FaultyStore

SETTINGS = StoreSettings(kind="kube", request_timeout_seconds=5.0, watch_timeout_seconds=30.0)


@pytest.fixture
async def kube() -> AsyncIterator[tuple[FakeApiServer, KubeStore]]:
    async with FakeApiServer() as api:
        store = KubeStore.for_host(
            api.url, SETTINGS, reconnect=Backoff(initial=0.02, maximum=0.2, jitter=0.0)
        )
        try:
            yield api, store
        finally:
            await store.close()


def node(**spec: object) -> dict[str, object]:
    return {
        "apiVersion": "flexlease.io/v1alpha1",
        "kind": "GPUNode",
        "metadata": {"name": "gpu-1"},
        "spec": {"pool": "general", **spec},
    }


async def test_unknown_fields_are_pruned_at_every_depth(kube: tuple[FakeApiServer, KubeStore]) -> None:
    api, store = kube
    created = await store.create(
        Kind.GPUNODE, node(devices={"0": {"owner": "ns/job", "color": "red"}}, colour="blue")
    )
    assert created["spec"] == {"pool": "general", "devices": {"0": {"owner": "ns/job"}}}
    patched = await store.patch(
        Kind.GPUNODE, "gpu-1", {"status": {"nodeIP": "10.0.0.1", "extra": 1}}, subresource="status"
    )
    assert patched["status"] == {"nodeIP": "10.0.0.1"}
    assert sorted(api.pruned) == ["spec.colour", "spec.devices.0.color", "status.extra"]


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"spec": {"pool": "spare"}}, "spec.pool"),
        ({"spec": {"devices": {"1": {"tierOverride": "XA"}}}}, "spec.devices.1.tierOverride"),
        ({"spec": {"devices": {"1": {"owner": 7}}}}, "spec.devices.1.owner"),
    ],
)
async def test_invalid_values_get_422_and_change_nothing(
    kube: tuple[FakeApiServer, KubeStore], patch: dict[str, object], field: str
) -> None:
    _api, store = kube
    before = await store.create(Kind.GPUNODE, node())
    with pytest.raises(StoreError) as info:
        await store.patch(Kind.GPUNODE, "gpu-1", patch)
    assert info.value.status == 422
    assert 'GPUNode.flexlease.io "gpu-1" is invalid' in str(info.value) and field in str(info.value)
    after = await store.get(Kind.GPUNODE, "gpu-1")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


async def test_an_invalid_lease_is_refused_at_create(kube: tuple[FakeApiServer, KubeStore]) -> None:
    api, store = kube
    lease = {
        "apiVersion": "flexlease.io/v1alpha1",
        "kind": "GPULease",
        "metadata": {"name": "l", "namespace": "online"},
        "spec": {"owner": "online/rec", "action": "Lend", "gracePeriodSeconds": 5},
    }
    with pytest.raises(StoreError) as info:
        await store.create(Kind.GPULEASE, lease)
    assert info.value.status == 422 and "spec.gracePeriodSeconds" in str(info.value)
    assert api.objects("GPULease") == []


def test_nullable_admits_null_but_not_other_invalid_values() -> None:
    ok = prune_and_validate(node(devices={"0": {"owner": None, "tierOverride": None, "leasedAt": None}}))
    assert ok["spec"]["devices"]["0"] == {"owner": None, "tierOverride": None, "leasedAt": None}
    with pytest.raises(SchemaError) as info:
        prune_and_validate(node(devices={"0": {"tierOverride": "XA"}}, pool=None))
    assert sorted({field for field, _ in info.value.causes}) == ["spec.devices.0.tierOverride", "spec.pool"]


def test_prune_keeps_preserved_unknown_fields_and_drops_undescribed_ones() -> None:
    schema = {
        "type": "object",
        "properties": {
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "closed": {"type": "object"},
            "items": {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "integer"}}}},
        },
    }
    dropped: list[str] = []
    out = prune(schema, {"free": {"x": 1}, "closed": {"y": 2}, "items": [{"a": 1, "b": 2}]}, dropped=dropped)
    assert out == {"free": {"x": 1}, "closed": {}, "items": [{"a": 1}]}
    assert dropped == ["closed.y", "items.0.b"]


async def test_the_checking_store_reports_what_the_server_would_refuse_or_prune() -> None:
    store = FaultyStore(MemoryStore(), check_crds=True)
    await store.create(Kind.GPUNODE, node())
    await store.patch(Kind.GPUNODE, "gpu-1", {"spec": {"devices": {"0": {"owner": "ns/j", "note": "x"}}}})
    with pytest.raises(StoreError) as info:
        await store.patch(Kind.GPUNODE, "gpu-1", {"spec": {"pool": "spare"}})
    assert info.value.status == 422
    assert store.crd_checked == 3
    assert len(store.crd_violations) == 2
    assert "would prune ['spec.devices.0.note']" in store.crd_violations[0]
    assert "spec.pool" in store.crd_violations[1]
    await store.close()
