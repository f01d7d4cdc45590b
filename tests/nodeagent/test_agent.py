"""The agent end to end with the simulated backend: real components in one TaskGroup, the
real MemoryStore/SqliteStore, the real aiohttp metrics server; time from a ManualClock. Plus
``flexlease-agent`` as a real process stopped by SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from flexlease.api.resources import Health, parse_gpunode
from flexlease.clock import ManualClock
from flexlease.store.base import Kind, Store
from flexlease.store.memory import MemoryStore
from nodeagent import agent
from nodeagent import main as agent_main
from nodeagent.context import AgentContext, Component
from nodeagent.health.keeper import LedgerKeeper
from nodeagent.health.watch import HealthWatch
from nodeagent.metrics import MetricsServer
from nodeagent.status import StatusReporter
from tests.nodeagent.health.kit import NODE, START, eventually, make_context, make_settings, node_config

SCRIPT = [
    {"at": 100, "gpu": 1, "event": "xid", "xid": 79},
    {"at": 200, "gpu": 0, "event": "xid", "xid": 13},
    {"at": 300, "gpu": 0, "event": "lost"},
    {"at": 400, "gpu": 0, "event": "recovered"},
]
SLEEPERS = 3  # health watch, ledger keeper, status reporter each sleep on the clock when idle


def mine() -> list[Component]:
    """This engineer's components (the containerd ones are tested in their own suites)."""
    return [HealthWatch(), LedgerKeeper(), StatusReporter(), MetricsServer()]


async def test_the_agent_runs_the_health_components_first(tmp_path: Path) -> None:
    ctx, _ = await make_context(make_settings(tmp_path), MemoryStore(), ManualClock(START), node_config())
    names = [p.name for p in agent.components(ctx)]
    assert names[:4] == ["health", "ledger", "status", "metrics"]
    assert len(set(names)) == len(names)


class Running:
    """An agent running in a task, driven by a ManualClock."""

    def __init__(self, ctx: AgentContext, clock: ManualClock) -> None:
        self.ctx = ctx
        self.clock = clock
        self.parts = mine()
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(agent.run(ctx, self.parts, stop=self.stop), name="test:agent")

    async def ready(self) -> None:
        await eventually(lambda: all(self.ctx.readiness.results().values()) and self.idle())

    def idle(self) -> bool:
        return self.clock.sleepers >= SLEEPERS

    async def advance(self, seconds: float, *, step: float = 5.0) -> None:
        target = self.clock.now() + seconds
        while self.clock.now() < target:
            await eventually(self.idle)
            await self.clock.advance(min(step, target - self.clock.now()))
        await eventually(self.idle)

    async def status(self, store: Store) -> Any:
        return parse_gpunode(await store.get(Kind.GPUNODE, NODE)).status

    @property
    def port(self) -> int:
        server = next(p for p in self.parts if isinstance(p, MetricsServer))
        assert server.port is not None
        return server.port

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 10)


async def scrape(port: int) -> dict[str, float]:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as resp:
        text = await resp.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (
                s.name
                + "{"
                + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k not in ("uuid", "model"))
            )
            out[key + "}"] = s.value
    return out


async def test_agent_end_to_end_with_restart(tmp_path: Path) -> None:
    clock = ManualClock(START)
    store = MemoryStore()
    settings = make_settings(tmp_path, recovery_hold_down_seconds=60.0)
    ctx, _ = await make_context(settings, store, clock, node_config(count=2, events=SCRIPT))
    run = Running(ctx, clock)
    await run.ready()
    status = await run.status(store)
    assert [d.health for d in status.devices.values()] == [Health.HEALTHY, Health.HEALTHY]

    await run.advance(100)
    status = await run.status(store)
    assert (status.devices["1"].health, status.devices["1"].reason, status.devices["1"].last_xid) == (
        Health.UNHEALTHY,
        "XID 79",
        79,
    )
    await run.advance(5)  # the next ledger tick sees unhealthy time: downgraded, no refresh needed
    status = await run.status(store)
    assert status.devices["1"].tier.value == "LA"
    assert status.devices["0"].tier.value == "HA"
    metrics = await scrape(run.port)
    assert metrics["flexlease_gpu_xid_events_total{gpu=1,node=gpu-node-1,xid=79}"] == 1.0
    assert metrics["flexlease_gpu_health{gpu=1,node=gpu-node-1,state=Unhealthy}"] == 1.0

    await run.advance(50)  # t=155: still inside the 60 s hold-down
    assert (await run.status(store)).devices["1"].health is Health.UNHEALTHY
    await run.advance(10)  # t=165: recovered (tier stays LA until the refresh)
    status = await run.status(store)
    assert status.devices["1"].health is Health.HEALTHY
    assert status.devices["1"].tier.value == "LA"

    await run.advance(50)  # t=215: application XID 13 on GPU 0 — recorded, still healthy
    status = await run.status(store)
    assert (status.devices["0"].health, status.devices["0"].last_xid) == (Health.HEALTHY, 13)

    await run.advance(90)  # t=305: GPU 0 fell off the bus
    status = await run.status(store)
    assert status.devices["0"].health is Health.UNHEALTHY
    assert status.devices["0"].reason == "GPU is lost (fallen off the bus)"
    await run.advance(145)  # t=450: back since 400; last seen lost by the poll at 395: hold-down to 455
    assert (await run.status(store)).devices["0"].health is Health.UNHEALTHY
    await run.advance(5)
    assert (await run.status(store)).devices["0"].health is Health.HEALTHY

    await run.finish()
    stopped_at = clock.now()
    assert (tmp_path / "state" / "ledger.json").exists()
    assert all(not t.get_name().startswith("agent:") for t in asyncio.all_tasks())

    # the agent is down for an hour; the next one reports it as unknown time
    await clock.advance(3600)
    ctx2, _ = await make_context(settings, store, clock, node_config(count=2))
    run2 = Running(ctx2, clock)
    await run2.ready()
    status = await run2.status(store)
    avail = status.devices["1"].availability
    assert avail is not None
    assert avail.unknown_seconds == pytest.approx(clock.now() - stopped_at, abs=1.0)
    assert avail.unknown_seconds >= 3600
    assert avail.unavailable_seconds == pytest.approx(60, abs=5.0)  # the XID 79 hold-down
    assert status.devices["1"].tier.value == "LA"  # no upgrade across the restart
    await run2.finish()


async def test_nvml_init_failure_reports_known_gpus_unknown(tmp_path: Path) -> None:
    clock = ManualClock(START)
    store = MemoryStore()
    settings = make_settings(tmp_path)
    ctx, _ = await make_context(settings, store, clock, node_config(count=2))
    run = Running(ctx, clock)
    await run.ready()
    await run.finish()
    # the driver is gone after a reboot: NVML fails to initialise
    broken = node_config(count=2, nvmlInitFails=True)
    ctx2, _ = await make_context(settings, store, clock, broken)
    run2 = Running(ctx2, clock)
    await run2.ready()
    status = await run2.status(store)
    assert sorted(status.devices) == ["0", "1"]
    for dev in status.devices.values():
        assert dev.health is Health.UNKNOWN
        assert dev.reason is not None and "nvmlInit failed" in dev.reason
    metrics = await scrape(run2.port)
    assert metrics["flexlease_nvml_up{node=gpu-node-1}"] == 0.0
    await run2.finish()


async def test_nvml_init_failure_on_a_new_node_advertises_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(START)
    store = MemoryStore()
    ctx, _ = await make_context(
        make_settings(tmp_path), store, clock, node_config(count=4, nvmlInitFails=True)
    )
    run = Running(ctx, clock)
    await run.ready()
    assert (await run.status(store)).devices == {}
    assert any(
        r.levelname == "ERROR" and "NVML failed to initialise" in r.getMessage() for r in caplog.records
    )
    await run.finish()


class Exploding:
    name = "exploding"

    async def run(self, ctx: AgentContext) -> None:
        await ctx.clock.sleep(10)
        raise RuntimeError("component failed")


async def test_first_fatal_error_stops_the_agent(tmp_path: Path) -> None:
    clock = ManualClock(START)
    ctx, backend = await make_context(make_settings(tmp_path), MemoryStore(), clock, node_config(count=1))
    parts = [*mine(), Exploding()]
    task = asyncio.create_task(agent.run(ctx, parts), name="test:agent")
    await eventually(lambda: clock.sleepers >= 4)
    await clock.advance(10)
    with pytest.raises(ExceptionGroup) as info:
        await asyncio.wait_for(task, 10)
    assert [str(e) for e in info.value.exceptions] == ["component failed"]
    assert backend.driver_version is None  # the health watch stopped the backend on its way out


async def test_a_component_that_returns_is_fatal(tmp_path: Path) -> None:
    class Quitter:
        name = "quitter"

        async def run(self, ctx: AgentContext) -> None:
            return None

    ctx, _ = await make_context(
        make_settings(tmp_path), MemoryStore(), ManualClock(START), node_config(count=1)
    )
    with pytest.raises(ExceptionGroup) as info:
        await agent.run(ctx, [Quitter()])
    assert "must run until cancelled" in str(info.value.exceptions[0])


async def test_build_context_requires_a_node_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="node_name is required"):
        await make_context(make_settings(tmp_path, node_name=""), MemoryStore(), ManualClock(), node_config())


def test_flexlease_agent_process_runs_and_stops_on_sigterm(tmp_path: Path) -> None:
    """The console script's module as a real process: simulated GPUs, SQLite store, SIGTERM."""
    node_file = tmp_path / "node.yaml"
    node_file.write_text(json.dumps({"name": "proc", "gpus": {"count": 2, "model": "NVIDIA H20"}}))
    db = tmp_path / "state.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXLEASE_")}
    env["FLEXLEASE_LOG_FORMAT"] = "text"
    cmd = [sys.executable, "-m", "nodeagent.main", "--nvml=simulated", f"--node-config={node_file}",
           "--node-name=proc-node", f"--state-dir={tmp_path / 'state'}", "--store=sqlite", f"--sqlite-path={db}",
           "--metrics-host=127.0.0.1", "--metrics-port=0"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        status: dict[str, Any] | None = None
        while time.monotonic() < deadline and status is None:
            time.sleep(0.2)
            if db.exists():
                with sqlite3.connect(db) as conn:
                    try:
                        tables = [
                            r[0] for r in conn.execute("select name from sqlite_master where type='table'")
                        ]
                    except sqlite3.OperationalError:
                        continue
                    for table in tables:
                        for (text,) in _texts(conn, table):
                            if '"proc-node"' in text and '"devices"' in text:
                                status = json.loads(text).get("status")
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert status is not None, "the agent never wrote its GPUNode status"
        assert sorted(status["devices"]) == ["0", "1"]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert "agent stopped" in out
    assert (tmp_path / "state" / "ledger.json").exists()


def _texts(conn: sqlite3.Connection, table: str) -> list[tuple[str]]:
    cols = [r[1] for r in conn.execute(f"pragma table_info({table})")]
    rows: list[tuple[str]] = []
    for col in cols:
        rows += [(v,) for (v,) in conn.execute(f"select {col} from {table}") if isinstance(v, str)]
    return rows


def test_flexlease_agent_rejects_bad_configuration(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXLEASE_")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nodeagent.main",
            "--nvml=simulated",
            "--node-name=x",
            f"--state-dir={tmp_path}",
            "--store=memory",
            "--metrics-port=0",
        ],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "needs --node-config" in proc.stderr


def test_command_line_options_go_over_the_environment_and_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text("agent:\n  poll_seconds: 2.5\n  node_name: from-file\n")
    monkeypatch.setenv("FLEXLEASE_AGENT__HEARTBEAT_SECONDS", "7")
    monkeypatch.setenv("FLEXLEASE_CONFIG", str(config))  # load() sets it; restored after the test
    args = agent_main.parse_args(
        ["--config", str(config), "--nvml=simulated", "--node-name=cli", "--store=memory"]
    )
    settings = agent_main.settings_from(args)
    assert settings.agent.node_name == "cli"
    assert settings.agent.nvml == "simulated"
    assert settings.agent.heartbeat_seconds == 7.0
    assert settings.agent.poll_seconds == 2.5
    assert settings.store.kind == "memory"


async def test_recovery_hold_down_spans_an_agent_restart(tmp_path: Path) -> None:
    clock = ManualClock(START)
    store = MemoryStore()
    settings = make_settings(tmp_path, recovery_hold_down_seconds=60.0)
    ctx, _ = await make_context(settings, store, clock, node_config(count=1, events=[SCRIPT[2] | {"at": 10}]))
    run = Running(ctx, clock)
    await run.ready()
    await run.advance(20)
    assert (await run.status(store)).devices["0"].health is Health.UNHEALTHY
    await run.finish()  # the last write: t=20, GPU 0 still lost
    await clock.advance(10)
    ctx2, _ = await make_context(settings, store, clock, node_config(count=1))  # the GPU looks fine now
    run2 = Running(ctx2, clock)
    await run2.ready()
    dev = (await run2.status(store)).devices["0"]
    assert dev.health is Health.UNHEALTHY
    assert dev.reason is not None and "before the agent restarted" in dev.reason
    await run2.advance(45)  # t=75: hold-down runs to 20 + 60
    assert (await run2.status(store)).devices["0"].health is Health.UNHEALTHY
    await run2.advance(5)
    assert (await run2.status(store)).devices["0"].health is Health.HEALTHY
    await run2.finish()
