"""The health watch and the ledger keeper as agent components: NVML init retries, failing
rounds, ledger writes that fail and recover, and the real pynvml code path under the watch."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest

from flexlease.api.resources import Health
from flexlease.clock import ManualClock, SystemClock
from flexlease.errors import NvmlError
from flexlease.store.memory import MemoryStore
from nodeagent.agent import build_context
from nodeagent.context import AgentContext
from nodeagent.health.backend import DeviceEvent, DeviceInfo, DeviceSample, GpuBackend
from nodeagent.health.keeper import LedgerKeeper
from nodeagent.health.nvml import NvmlBackend
from nodeagent.health.simulated import SimulatedBackend
from nodeagent.health.watch import FAILED_ROUNDS_BEFORE_DOWN, HealthWatch
from nodeagent.metrics import AgentMetrics
from tests.nodeagent.health.kit import START, eventually, make_settings, node_config
from tests.nodeagent.health.test_nvml import PATCHED, FakeGpu, FakeNvml


class Flaky:
    """A simulated backend whose start fails ``start_failures`` times and whose queries fail
    while ``query_failures`` > 0."""

    def __init__(self, inner: SimulatedBackend) -> None:
        self.inner = inner
        self.start_failures = 0
        self.query_failures = 0
        self.starts = 0
        self.stops = 0

    @property
    def driver_version(self) -> str | None:
        return self.inner.driver_version

    async def start(self) -> list[DeviceInfo]:
        self.starts += 1
        if self.start_failures > 0:
            self.start_failures -= 1
            raise NvmlError("nvmlInit failed: Driver Not Loaded")
        return await self.inner.start()

    async def wait_events(self, timeout_seconds: float) -> list[DeviceEvent]:
        return await self.inner.wait_events(timeout_seconds)

    async def query(self, index: int) -> DeviceSample:
        if self.query_failures > 0:
            self.query_failures -= 1
            raise NvmlError("nvmlDeviceGetTemperature on GPU 0 failed: Unknown Error")
        return await self.inner.query(index)

    async def stop(self) -> None:
        self.stops += 1
        await self.inner.stop()


async def flaky_context(tmp_path: Path, clock: ManualClock) -> tuple[AgentContext, Flaky]:
    flaky = Flaky(SimulatedBackend(node_config(count=2), clock))

    def make(_m: AgentMetrics) -> GpuBackend:
        return flaky

    ctx = await build_context(make_settings(tmp_path), MemoryStore(), make_backend=make, clock=clock)
    return ctx, flaky


async def test_nvml_init_is_retried_until_it_works(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock(START)
    ctx, flaky = await flaky_context(tmp_path, clock)
    flaky.start_failures = 2
    watch = HealthWatch()
    task = asyncio.create_task(watch.run(ctx), name="test:health")
    await eventually(lambda: clock.sleepers == 1)
    assert watch.ready() and ctx.board.nvml_up is False
    assert ctx.board.devices == {}  # a new node: nothing to advertise
    await clock.advance(30)  # heartbeat_seconds: second try fails the same way (logged once)
    await eventually(lambda: flaky.starts == 2 and clock.sleepers == 1)
    await clock.advance(30)
    await eventually(lambda: ctx.board.nvml_up is True and clock.sleepers == 1)
    assert [h.health for h in ctx.board.health.values()] == [Health.HEALTHY, Health.HEALTHY]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and "NVML failed" in r.getMessage()]
    assert len(errors) == 1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert flaky.stops == 3  # after each failed start, and on the way out


async def test_failing_rounds_mark_gpus_unknown_until_nvml_answers(tmp_path: Path) -> None:
    clock = ManualClock(START)
    ctx, flaky = await flaky_context(tmp_path, clock)
    task = asyncio.create_task(HealthWatch().run(ctx), name="test:health")
    await eventually(lambda: clock.sleepers == 1 and bool(ctx.board.health))
    flaky.query_failures = FAILED_ROUNDS_BEFORE_DOWN
    for _ in range(FAILED_ROUNDS_BEFORE_DOWN - 1):
        await clock.advance(5)
        await eventually(lambda: clock.sleepers == 1)
    assert {h.health for h in ctx.board.health.values()} == {Health.HEALTHY}
    await clock.advance(5)
    await eventually(lambda: ctx.board.nvml_up is False)
    assert {h.health for h in ctx.board.health.values()} == {Health.UNKNOWN}
    assert ctx.board.nvml_error is not None and "Unknown Error" in ctx.board.nvml_error
    await clock.advance(5)  # the back-off sleep
    await eventually(lambda: clock.sleepers == 1)
    await clock.advance(5)
    await eventually(lambda: {h.health for h in ctx.board.health.values()} == {Health.HEALTHY})
    assert ctx.board.nvml_up is True and ctx.board.nvml_error is None
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_keeper_reports_failed_writes_and_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(START)
    ctx, _ = await flaky_context(tmp_path, clock)
    state = tmp_path / "state"
    state.rmdir()
    state.write_text("not a directory")  # writes fail (modes would not stop root)
    keeper = LedgerKeeper()
    task = asyncio.create_task(keeper.run(ctx), name="test:ledger")
    await eventually(lambda: clock.sleepers == 1)
    assert not keeper.ready()
    assert any("ledger write failed" in r.getMessage() for r in caplog.records)
    state.unlink()
    await clock.advance(5)
    await eventually(keeper.ready)
    assert (state / "ledger.json").exists()
    before = (state / "ledger.json").read_bytes()
    await clock.advance(2)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert (state / "ledger.json").read_bytes() != before  # the final write on the way out


async def test_real_nvml_backend_under_the_watch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NvmlBackend on patched pynvml functions, driven by the health watch in real time."""
    fake = FakeNvml(
        [FakeGpu(uuid="GPU-a", minor=0), FakeGpu(uuid="GPU-b", bus_id="00000000:2A:00.0", minor=1)]
    )
    real_wait = fake.nvmlEventSetWait_v2

    def wait(event_set: Any, timeout_ms: int) -> Any:
        if not fake.events:
            time.sleep(min(timeout_ms, 20) / 1000)  # the C call blocks up to the timeout
        return real_wait(event_set, timeout_ms)

    for name in PATCHED:
        monkeypatch.setattr(pynvml, name, getattr(fake, name))
    monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", wait)
    ctx = await build_context(
        make_settings(tmp_path, poll_seconds=0.05, recovery_hold_down_seconds=0.2),
        MemoryStore(),
        make_backend=lambda m: NvmlBackend(on_error=m.nvml_error),
        clock=SystemClock(),
    )
    task = asyncio.create_task(HealthWatch().run(ctx), name="test:health")
    try:
        await eventually(lambda: [h.health for h in ctx.board.health.values()] == [Health.HEALTHY] * 2)
        assert ctx.board.devices[1].pci_bus_id == "00000000:2A:00.0"
        fake.event(1, pynvml.nvmlEventTypeXidCriticalError, 79)
        await eventually(lambda: ctx.board.health[1].health is Health.UNHEALTHY)
        assert ctx.board.health[1].reason == "XID 79"
        fake.gpus[0].lost = True
        await eventually(lambda: ctx.board.health[0].health is Health.UNHEALTHY)
        assert ctx.board.health[0].reason == "GPU is lost (fallen off the bus)"
        fake.gpus[0].lost = False
        await eventually(lambda: ctx.board.health[1].health is Health.HEALTHY, rounds=400)
        await eventually(lambda: ctx.board.health[0].health is Health.HEALTHY, rounds=400)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert fake.freed and fake.shutdown
    errors = {
        (s.labels["call"], s.labels["error"]): s.value
        for m in ctx.registry.collect()
        if m.name == "flexlease_nvml_errors"
        for s in m.samples
        if s.name.endswith("_total")
    }
    assert errors[("nvmlDeviceGetTemperature", "GpuIsLost")] >= 1
