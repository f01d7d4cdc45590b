"""The GPUNode status reporter against the real MemoryStore and SqliteStore."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from flexlease.api.resources import Health, parse_gpunode
from flexlease.api.tiers import Tier
from flexlease.clock import ManualClock
from flexlease.errors import Conflict, StoreError
from flexlease.store.base import JsonObj, Kind, Store
from flexlease.store.memory import MemoryStore
from flexlease.store.sqlite import SqliteStore
from nodeagent.context import AgentContext
from nodeagent.health.backend import DeviceEvent, DeviceSample, EventKind
from nodeagent.status import StatusReporter, merge_diff, status_patch
from tests.nodeagent.health.kit import NODE, START, make_context, make_settings, node_config
from tests.store.faults import FaultyStore


@pytest.fixture(params=["memory", "sqlite", "crd-checked"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """Each store; ``crd-checked`` also checks every GPUNode written (by the test or the
    reporter) against the CRD, as the API server would, and fails on a refusal or a prune."""
    if request.param == "crd-checked":
        checked = FaultyStore(MemoryStore(), check_crds=True)
        yield checked
        await checked.close()
        assert checked.crd_violations == []
        return
    s: Store = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "state.db")
    yield s
    await s.close()


async def started(tmp_path: Path, store: Store, clock: ManualClock, **agent: Any) -> AgentContext:
    ctx, backend = await make_context(make_settings(tmp_path, **agent), store, clock, node_config(count=2))
    ctx.board.set_devices(await backend.start(), clock.now())
    for i in range(2):
        ctx.board.apply_sample(DeviceSample(index=i, at=clock.now(), temperature_c=40))
    ctx.board.retier(clock.now())
    return ctx


async def test_creates_the_gpunode_and_writes_status(tmp_path: Path, store: Store) -> None:
    clock = ManualClock(START)
    ctx = await started(tmp_path, store, clock)
    assert await StatusReporter().sync(ctx)
    if isinstance(store, FaultyStore):
        assert store.crd_checked >= 2  # the create and the status patch
    obj = await store.get(Kind.GPUNODE, NODE)
    node = parse_gpunode(obj)
    assert node.spec.devices == {} and obj["spec"] == {"pool": "general"}  # POOL column reads general
    assert node.status.node_ip == "10.0.0.7"
    assert node.status.agent is not None and node.status.agent.heartbeat.timestamp() == START
    assert sorted(node.status.devices) == ["0", "1"]
    dev = node.status.devices["0"]
    assert (dev.health, dev.tier, dev.model, dev.memory_mib, dev.minor_number) == (
        Health.HEALTHY,
        Tier.HA,
        "NVIDIA H20",
        97871,
        0,
    )
    assert dev.uuid.startswith("GPU-") and dev.pci_bus_id == "00000000:18:00.0"
    assert dev.availability is not None and dev.availability.ratio == 1.0
    assert dev.reason is None
    assert node.status.summary is not None
    assert (node.status.summary.gpus, node.status.summary.ha, node.status.summary.lent) == (2, 2, 0)


async def test_never_touches_spec_or_foreign_status(tmp_path: Path, store: Store) -> None:
    spec = {"pool": "standby", "devices": {"0": {"owner": "team-a/trainer", "tierOverride": "MA"}}}
    await store.create(
        Kind.GPUNODE,
        {"apiVersion": "flexlease.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": NODE}, "spec": spec},
    )
    cache = {"images": ["registry.local/trainer:v2"], "checkpoints": []}
    obj = await store.get(Kind.GPUNODE, NODE)
    await store.patch(Kind.GPUNODE, NODE, {"status": {"cache": cache}}, subresource="status")
    clock = ManualClock(START)
    ctx = await started(tmp_path, store, clock)
    await StatusReporter().sync(ctx)
    obj = await store.get(Kind.GPUNODE, NODE)
    assert obj["spec"] == spec
    assert obj["status"]["cache"] == cache
    assert set(obj["status"]) == {"cache", "nodeIP", "agent", "devices", "summary"}
    # printer columns: the override makes GPU 0 MA, the tag counts as lent
    assert obj["status"]["summary"] == {"gpus": 2, "healthy": 2, "ha": 1, "ma": 1, "la": 0, "lent": 1}


async def test_writes_only_on_change_or_heartbeat(tmp_path: Path, store: Store) -> None:
    clock = ManualClock(START)
    ctx = await started(tmp_path, store, clock, heartbeat_seconds=30.0)
    reporter = StatusReporter()
    assert await reporter.sync(ctx)
    rv = (await store.get(Kind.GPUNODE, NODE))["metadata"]["resourceVersion"]
    await clock.advance(10)
    ctx.board.retier(clock.now())
    assert not await reporter.sync(ctx)  # only the availability seconds moved
    assert (await store.get(Kind.GPUNODE, NODE))["metadata"]["resourceVersion"] == rv
    # a critical XID: written at once, with the reason and the downgraded tier
    ctx.board.apply_event(DeviceEvent(index=1, kind=EventKind.XID, at=clock.now(), xid=79))
    ctx.board.retier(clock.now() + 1)
    assert await reporter.sync(ctx)
    dev = (await store.get(Kind.GPUNODE, NODE))["status"]["devices"]["1"]
    assert (dev["health"], dev["reason"], dev["lastXid"], dev["tier"]) == ("Unhealthy", "XID 79", 79, "LA")
    await clock.advance(29)
    assert not await reporter.sync(ctx)
    await clock.advance(1)
    assert await reporter.sync(ctx)  # heartbeat due
    heartbeat = (await store.get(Kind.GPUNODE, NODE))["status"]["agent"]["heartbeat"]
    assert parse_gpunode(await store.get(Kind.GPUNODE, NODE)).status.agent is not None
    assert heartbeat.startswith("2023-11-14T22:")  # START + 40 s, RFC 3339 UTC


async def test_cleared_fields_and_gone_gpus_are_removed(tmp_path: Path, store: Store) -> None:
    clock = ManualClock(START)
    ctx = await started(tmp_path, store, clock, recovery_hold_down_seconds=0.0)
    reporter = StatusReporter()
    ctx.board.apply_event(DeviceEvent(index=0, kind=EventKind.LOST, at=clock.now()))
    await reporter.sync(ctx)
    assert (await store.get(Kind.GPUNODE, NODE))["status"]["devices"]["0"]["reason"].startswith("GPU is lost")
    await clock.advance(5)
    ctx.board.apply_sample(DeviceSample(index=0, at=clock.now()))
    await reporter.sync(ctx)
    dev0 = (await store.get(Kind.GPUNODE, NODE))["status"]["devices"]["0"]
    assert dev0["health"] == "Healthy" and "reason" not in dev0
    # GPU 1 disappears (NVML enumerates one GPU after a driver reload)
    ctx.board.set_devices([d for d in (await ctx.backend.start()) if d.index == 0], clock.now())
    await reporter.sync(ctx)
    assert list((await store.get(Kind.GPUNODE, NODE))["status"]["devices"]) == ["0"]


class RacingStore:
    """A store where someone else writes the GPUNode between our read and our patch,
    ``races`` times: the resourceVersion precondition then fails with a real Conflict."""

    def __init__(self, inner: Store, races: int) -> None:
        self.inner = inner
        self.races = races
        self.patches = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def patch(self, kind: Kind, name: str, patch: JsonObj, **kw: Any) -> JsonObj:
        self.patches += 1
        if self.races > 0:
            self.races -= 1
            await self.inner.patch(kind, name, {"spec": {"pool": "standby" if self.races % 2 else "general"}})
        return await self.inner.patch(kind, name, patch, **kw)


async def test_conflict_rereads_and_retries(tmp_path: Path, store: Store) -> None:
    racing = RacingStore(store, races=2)
    clock = ManualClock(START)
    ctx = await started(tmp_path, racing, clock)
    assert await StatusReporter().sync(ctx)
    assert racing.patches == 3
    obj = await store.get(Kind.GPUNODE, NODE)
    assert set(obj["status"]["devices"]) == {"0", "1"}
    samples = {s.name: s.samples for s in ctx.registry.collect() if s.name == "flexlease_agent_status_writes"}
    results = {
        x.labels["result"]: x.value
        for x in samples["flexlease_agent_status_writes"]
        if x.name.endswith("_total")
    }
    assert results == {"ok": 1.0, "conflict": 2.0, "error": 0.0}


async def test_endless_conflicts_raise_conflict(tmp_path: Path, store: Store) -> None:
    racing = RacingStore(store, races=100)
    clock = ManualClock(START)
    ctx = await started(tmp_path, racing, clock)
    with pytest.raises(Conflict, match="lost 5 races"):
        await StatusReporter().sync(ctx)


async def test_store_errors_do_not_stop_the_reporter(tmp_path: Path) -> None:
    store = MemoryStore()
    clock = ManualClock(START)
    ctx = await started(tmp_path, store, clock)
    await store.close()
    reporter = StatusReporter()
    with pytest.raises(StoreError):
        await reporter.sync(ctx)
    assert not reporter.ready()


def test_merge_diff_is_rfc7386() -> None:
    cur = {"a": 1, "b": {"c": 2, "d": 3}, "e": [1, 2]}
    want = {"a": 1, "b": {"c": 5}, "e": [1], "f": "new"}
    assert merge_diff(cur, want) == {"b": {"c": 5, "d": None}, "e": [1], "f": "new"}
    assert merge_diff(cur, cur) == {}
    assert status_patch({"cache": {"images": []}, "nodeIP": "1"}, {"nodeIP": "2"}) == {"nodeIP": "2"}


async def test_a_malformed_spec_does_not_stop_the_reporter(tmp_path: Path, store: Store) -> None:
    """The embedded stores have no CRD schema: an operator's typo in spec (``tierOverride: ha``)
    must not stop status reporting; the summary then ignores spec. (Through an API server
    the CRD refuses the typo, so the CRD-checked store is bypassed here.)"""
    if isinstance(store, FaultyStore):
        store = store.inner
    spec = {"pool": "general", "devices": {"0": {"tierOverride": "ha", "owner": "a/b"}}}
    await store.create(
        Kind.GPUNODE,
        {"apiVersion": "flexlease.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": NODE}, "spec": spec},
    )
    clock = ManualClock(START)
    ctx = await started(tmp_path, store, clock)
    assert await StatusReporter().sync(ctx)
    obj = await store.get(Kind.GPUNODE, NODE)
    assert obj["spec"] == spec
    assert obj["status"]["summary"] == {"gpus": 2, "healthy": 2, "ha": 2, "ma": 0, "la": 0, "lent": 0}
