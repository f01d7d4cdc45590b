"""extender.simhost: the real extender app served in-process on loopback HTTP (and through
in-process pipes to the same server), on a manual clock, with a quiescence check that sees
store changes in flight and controller work."""

from __future__ import annotations

import gc
import re

import aiohttp
import orjson
import pytest

from extender import simhost
from flexlease.api.resources import LeaseAction, Pool
from flexlease.clock import ManualClock
from flexlease.config import LeaseSettings, Settings, StoreSettings
from flexlease.sim import leasepolicy, objects
from flexlease.sim.demandtrace import DemandTrace, TraceSource
from flexlease.sim.http1 import Http1Client, HttpError
from flexlease.sim.scenario import Scenario
from flexlease.sim.tide import Tide
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore


async def test_hosted_extender_serves_http_and_settles_on_the_virtual_clock() -> None:
    clock = ManualClock(1_800_000_000.0)
    store = MemoryStore(clock=clock)
    settings = Settings(store=StoreSettings(kind="memory"), lease=LeaseSettings(resync_seconds=3600))
    try:
        async with simhost.hosted(settings, store, clock) as host, aiohttp.ClientSession() as session:
            assert host.quiet
            async with session.get(f"{host.url}/readyz") as resp:
                assert resp.status == 200
            assert host.url.startswith("http://127.0.0.1:")
            await store.create(Kind.GPUNODE, objects.gpunode("gpu-000", pool=Pool.GENERAL))
            assert not host.quiet  # the change is not yet with the extender's watches
            assert await host.settle() >= simhost.SETTLE_QUIET_ROUNDS
            assert host.quiet
            lease = objects.gpulease(
                "reclaim-1", "online/trainer", action=LeaseAction.RECLAIM, count=1, grace_period_seconds=30
            )
            assert gc.get_threshold()[:2] == (simhost.SIM_GEN0_THRESHOLD, simhost.SIM_GEN1_THRESHOLD)
            async with host.paused():  # a scheduling round: the controller waits
                async with host.paused():  # nested: the outer body still holds it afterwards
                    pass
                await store.create(Kind.GPULEASE, lease)
                await host.settle()
                held = await store.get(Kind.GPULEASE, "reclaim-1", namespace="online")
                assert not (held.get("status") or {}).get("phase")
            await host.settle()
            status = (await store.get(Kind.GPULEASE, "reclaim-1", namespace="online")).get("status") or {}
            assert status.get("phase")  # the controller took it up without any time passing
            assert clock.now() == 1_800_000_000.0
            due = clock.next_due()
            assert due is not None and due <= clock.now() + 3600  # its timers are on this clock
    finally:
        await store.close()
    assert gc.get_threshold()[:2] != (simhost.SIM_GEN0_THRESHOLD, simhost.SIM_GEN1_THRESHOLD)


async def test_connect_reaches_the_same_server_as_the_loopback_url() -> None:
    clock = ManualClock(1_800_000_000.0)
    store = MemoryStore(clock=clock)
    settings = Settings(store=StoreSettings(kind="memory"), lease=LeaseSettings(enabled=False))
    pod = objects.pod("lp-1", "tenants", gpus=1, priority="low", owner="lp-1")
    body = orjson.dumps({"Pod": pod, "NodeNames": ["gpu-000", "gpu-001"]})
    try:
        await store.create(Kind.GPUNODE, objects.gpunode("gpu-000", pool=Pool.GENERAL))
        async with (
            simhost.hosted(settings, store, clock) as host,
            aiohttp.ClientSession() as session,
            Http1Client(host.url, connect=host.connect) as piped,
        ):
            async with session.post(f"{host.url}/filter", data=body) as resp:
                over_tcp = (resp.status, await resp.read())
            through_pipe = await piped.request("POST", "/filter", body, limit_s=5)
            assert (through_pipe.status, through_pipe.body) == over_tcp
            reply = orjson.loads(through_pipe.body)
            assert reply["NodeNames"] == [] and set(reply["FailedAndUnresolvableNodes"]) == {
                "gpu-000",
                "gpu-001",
            }
            assert (
                "reports no GPUs" in reply["FailedAndUnresolvableNodes"]["gpu-000"]
            )  # its status not yet patched
            metrics = await piped.request("GET", "/metrics", limit_s=5)  # the same app: its counters
            assert re.search(
                rb"flexlease_extender_request_duration_seconds_count\{[^}]*verb=\"filter\"[^}]*\} 2\.0",
                metrics.body,
            )
        with pytest.raises(HttpError, match="stopped"):  # the pipe's listener is closed too
            await Http1Client(host.url, connect=host.connect).request("GET", "/readyz", limit_s=5)
    finally:
        await store.close()


async def test_with_a_metrics_source_the_real_autopilot_runs_on_the_virtual_clock() -> None:
    """``metrics_source``: the lease autopilot runs in the hosted extender, reads its demand from
    that source at the manual clock's time, and the settle waits for it; without one it does
    not run (the policy is never reconciled)."""
    scenario = Scenario(nodes=4, autopilot="prometheus")
    settings = Settings(store=StoreSettings(kind="memory"), lease=LeaseSettings(resync_seconds=3600))
    policy = leasepolicy.policy_object("prometheus", scenario, owner="online/trainer")
    for with_source in (True, False):
        clock = ManualClock(1_800_000_000.0)
        store = MemoryStore(clock=clock)
        trace = DemandTrace(base=Tide(), peak_gpus=scenario.job_gpus, seed=1, horizon=86400.0)
        source = TraceSource(trace, now=clock.now, origin=clock.now())
        try:
            async with simhost.hosted(
                settings, store, clock, metrics_source=source if with_source else None
            ) as host:
                await store.create(Kind.GPULEASEPOLICY, policy)
                await host.settle()
                status = (await store.get(Kind.GPULEASEPOLICY, "trainer", namespace="online")).get("status")
                if not with_source:
                    assert not status and source.instant_queries == 0
                    continue
                assert status and status["demand"]["source"] == "prometheus"
                assert status["demand"]["gpus"] == trace.needed(0.0)
                assert source.instant_queries == 1
                clock.jump(clock.now() + 6 * 3600.0)  # the autopilot's resync is on this clock
                await host.settle()
                status = (await store.get(Kind.GPULEASEPOLICY, "trainer", namespace="online"))["status"]
                assert status["demand"]["gpus"] == trace.needed(6 * 3600.0)
                assert status["demand"]["observedAt"].startswith("2027-01-15T14:00")
        finally:
            await store.close()
