"""RetryOnConflict and the Event recorder, on every store (memory, sqlite, KubeStore on the
stand-in API server)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from flexlease.errors import Conflict, NotFound, StoreError
from flexlease.store.base import JsonObj, Kind, Selector, Store
from flexlease.store.kube_util import EventRecorder, RetryPolicy, retry_on_conflict, update_with_retry
from tests.store.contract import NS, make_gpunode, make_pod
from tests.store.stores import STORE_KINDS, any_store

NO_WAIT = RetryPolicy(steps=50, delay=0.0, jitter=0.0)


@pytest.fixture(params=STORE_KINDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    async with any_store(request.param, tmp_path) as s:
        yield s


def count_of(obj: JsonObj) -> int:
    return int((obj["metadata"].get("annotations") or {}).get("count", "0"))


async def test_concurrent_read_modify_writes_all_land(store: Store) -> None:
    await store.create(Kind.GPUNODE, make_gpunode("gpu-1"))

    def bump(node: JsonObj) -> JsonObj:
        return {"metadata": {"annotations": {"count": str(count_of(node) + 1)}}}

    await asyncio.gather(
        *(update_with_retry(store, Kind.GPUNODE, "gpu-1", bump, policy=NO_WAIT) for _ in range(12))
    )
    assert count_of(await store.get(Kind.GPUNODE, "gpu-1")) == 12


async def test_nothing_to_change_writes_nothing(store: Store) -> None:
    created = await store.create(Kind.GPUNODE, make_gpunode("gpu-1"))
    same = await update_with_retry(store, Kind.GPUNODE, "gpu-1", lambda _: None)
    assert same == created


async def test_status_subresource_and_namespaced_objects(store: Store) -> None:
    await store.create(Kind.POD, make_pod("p1"))
    pod = await update_with_retry(
        store,
        Kind.POD,
        "p1",
        lambda p: {"status": {"phase": "Running"}},
        namespace=NS,
        subresource="status",
    )
    assert pod["status"]["phase"] == "Running"
    with pytest.raises(NotFound):
        await update_with_retry(store, Kind.POD, "nope", lambda p: {}, namespace=NS)


async def test_conflict_is_raised_when_every_attempt_loses(store: Store) -> None:
    await store.create(Kind.GPUNODE, make_gpunode("gpu-1"))
    attempts = 0

    async def racing_attempt() -> JsonObj:
        nonlocal attempts
        attempts += 1
        node = await store.get(Kind.GPUNODE, "gpu-1")
        # another writer gets in between the read and the write, every time
        await store.patch(Kind.GPUNODE, "gpu-1", {"metadata": {"annotations": {"other": str(attempts)}}})
        return await store.patch(
            Kind.GPUNODE,
            "gpu-1",
            {"spec": {"pool": "standby"}},
            resource_version=node["metadata"]["resourceVersion"],
        )

    with pytest.raises(Conflict):
        await retry_on_conflict(racing_attempt, policy=RetryPolicy(steps=3, delay=0.0))
    assert attempts == 3
    assert (await store.get(Kind.GPUNODE, "gpu-1"))["spec"]["pool"] == "general"  # never half-applied


async def test_other_errors_are_not_retried() -> None:
    attempts = 0

    async def failing() -> None:
        nonlocal attempts
        attempts += 1
        raise StoreError("boom", status=500)

    with pytest.raises(StoreError):
        await retry_on_conflict(failing)
    assert attempts == 1


def test_retry_policy_waits() -> None:
    policy = RetryPolicy(steps=4, delay=0.01, factor=5.0, jitter=0.0, maximum=0.2)
    assert [policy.wait(n) for n in (1, 2, 3)] == pytest.approx([0.01, 0.05, 0.2])


async def events_about(store: Store, name: str, namespace: str) -> list[JsonObj]:
    listed = await store.list(Kind.EVENT, namespace=namespace)
    return [e for e in listed.items if e["involvedObject"]["name"] == name]


async def test_recorder_writes_core_v1_events(store: Store) -> None:
    pod = await store.create(Kind.POD, make_pod("lp-1"))
    recorder = EventRecorder(store, component="flexlease-extender", instance="extender-0")
    event = await recorder.record(pod, type="Warning", reason="Reclaim", message="GPU gpu-1:0 is reclaimed")
    assert event is not None
    (stored,) = await events_about(store, "lp-1", NS)
    assert stored == event
    assert stored["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "lp-1",
        "namespace": NS,
        "uid": pod["metadata"]["uid"],
        "resourceVersion": pod["metadata"]["resourceVersion"],
    }
    assert (stored["type"], stored["reason"], stored["count"]) == ("Warning", "Reclaim", 1)
    assert stored["source"] == {"component": "flexlease-extender", "host": "extender-0"}
    assert stored["reportingComponent"] == "flexlease-extender"
    assert stored["metadata"]["name"].startswith("lp-1.")

    again = await recorder.record(pod, type="Warning", reason="Reclaim", message="GPU gpu-1:0 is reclaimed")
    assert again is not None and again["metadata"]["name"] == stored["metadata"]["name"]
    (aggregated,) = await events_about(store, "lp-1", NS)
    assert aggregated["count"] == 2

    await recorder.record(pod, type="Normal", reason="Evicted", message="evicted after the grace period")
    assert len(await events_about(store, "lp-1", NS)) == 2


async def test_recorder_puts_cluster_scoped_objects_in_default(store: Store) -> None:
    node = await store.create(Kind.GPUNODE, make_gpunode("gpu-1"))
    recorder = EventRecorder(store, component="flexlease-agent", instance="gpu-1")
    await recorder.record(node, type="Warning", reason="XidError", message="XID 79 on GPU 3" + "!" * 2000)
    (event,) = await events_about(store, "gpu-1", "default")
    assert "namespace" not in event["involvedObject"]
    assert len(event["message"]) == 1024
    by_field = await store.list(Kind.EVENT, selector=Selector(fields={"metadata.namespace": "default"}))
    assert len(by_field.items) == 1


async def test_recorder_writes_anew_when_the_event_expired(store: Store) -> None:
    pod = await store.create(Kind.POD, make_pod("lp-1"))
    recorder = EventRecorder(store, component="flexlease-extender")
    first = await recorder.record(pod, type="Normal", reason="Lend", message="lent")
    assert first is not None
    await store.delete(Kind.EVENT, first["metadata"]["name"], namespace=NS)  # the API server's 1 h TTL
    second = await recorder.record(pod, type="Normal", reason="Lend", message="lent")
    assert second is not None and second["count"] == 1


async def test_recorder_reports_failures_instead_of_raising(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    pod = await store.create(Kind.POD, make_pod("lp-1"))
    recorder = EventRecorder(store, component="flexlease-extender")
    await store.close()
    with caplog.at_level(logging.WARNING, logger="flexlease.store.kube_util"):
        assert await recorder.record(pod, type="Normal", reason="Lend", message="lent") is None
    mine = [r for r in caplog.records if r.name == "flexlease.store.kube_util"]
    assert [(r.levelname, r.getMessage()) for r in mine] == [("WARNING", "event not recorded")]
