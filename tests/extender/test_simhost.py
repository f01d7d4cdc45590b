"""extender.simhost: the real extender app served in-process on loopback HTTP, on a manual
clock, with a quiescence check that sees store changes in flight and controller work."""

from __future__ import annotations

import gc

import aiohttp

from extender import simhost
from flexlease.api.resources import LeaseAction, Pool
from flexlease.clock import ManualClock
from flexlease.config import LeaseSettings, Settings, StoreSettings
from flexlease.sim import objects
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
