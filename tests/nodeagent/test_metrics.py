"""Prometheus metrics: the custom collector over the agent's state, counters, and the
``/metrics``, ``/healthz``, ``/readyz`` endpoints on a real aiohttp server."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from pytest_aiohttp import AiohttpClient

import nodeagent
from flexlease.clock import ManualClock
from flexlease.store.memory import MemoryStore
from nodeagent.context import AgentContext
from nodeagent.health.backend import DeviceEvent, DeviceSample, EventKind
from nodeagent.metrics import Readiness, create_app
from tests.nodeagent.health.kit import NODE, START, make_context, make_settings, node_config


def samples(text: str) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def value(found: dict[str, list[Sample]], name: str, **labels: str) -> float:
    matches = [s.value for s in found.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matches) == 1, (name, labels, matches)
    return matches[0]


async def context(tmp_path: Path) -> AgentContext:
    clock = ManualClock(START)
    ctx, backend = await make_context(make_settings(tmp_path), MemoryStore(), clock, node_config(count=2))
    ctx.board.set_devices(await backend.start(), clock.now())
    ctx.board.apply_sample(DeviceSample(index=0, at=clock.now(), temperature_c=44))
    ctx.board.apply_sample(DeviceSample(index=1, at=clock.now(), temperature_c=51))
    ctx.board.retier(clock.now())
    await clock.advance(3600)
    ctx.board.apply_event(DeviceEvent(index=1, kind=EventKind.XID, at=clock.now(), xid=79))
    ctx.metrics.xid(gpu=1, uuid=ctx.board.devices[1].uuid, model="NVIDIA H20", xid=79)
    ctx.metrics.xid(gpu=1, uuid=ctx.board.devices[1].uuid, model="NVIDIA H20", xid=79)
    ctx.metrics.xid(gpu=0, uuid=ctx.board.devices[0].uuid, model="NVIDIA H20", xid=13)
    ctx.metrics.nvml_error("nvmlDeviceGetTemperature", "GpuIsLost")
    await clock.advance(400)
    ctx.board.retier(clock.now())
    return ctx


async def test_per_gpu_metrics_read_from_agent_state(tmp_path: Path) -> None:
    ctx = await context(tmp_path)
    found = samples(generate_latest(ctx.registry).decode())
    uuid1 = ctx.board.devices[1].uuid
    gpu1 = {"node": NODE, "gpu": "1", "uuid": uuid1, "model": "NVIDIA H20"}
    gpu0 = {"node": NODE, "gpu": "0"}
    assert value(found, "flexlease_gpu_health", **gpu1, state="Unhealthy") == 1.0
    assert value(found, "flexlease_gpu_health", **gpu1, state="Healthy") == 0.0
    assert value(found, "flexlease_gpu_health", **gpu1, state="Unknown") == 0.0
    assert value(found, "flexlease_gpu_health", **gpu0, state="Healthy") == 1.0
    assert value(found, "flexlease_gpu_tier", **gpu0) == 2.0  # HA
    assert value(found, "flexlease_gpu_tier", **gpu1) == 0.0  # LA: 400 s down in 4000 s
    assert value(found, "flexlease_gpu_availability_ratio", **gpu1) == 1 - 400 / 4000
    assert value(found, "flexlease_gpu_unhealthy_seconds", **gpu1) == 400.0
    assert value(found, "flexlease_gpu_unknown_seconds", **gpu1) == 0.0
    assert value(found, "flexlease_gpu_temperature_celsius", **gpu0) == 44.0
    assert value(found, "flexlease_gpu_xid_events_total", **gpu1, xid="79") == 2.0
    assert value(found, "flexlease_gpu_xid_events_total", **gpu0, xid="13") == 1.0
    assert value(found, "flexlease_nvml_errors_total", node=NODE, call="nvmlDeviceGetTemperature") == 1.0
    assert value(found, "flexlease_nvml_up", node=NODE) == 1.0
    assert value(found, "flexlease_ledger_corrupt_total", node=NODE) == 0.0
    for name in found:
        assert name.startswith("flexlease_"), name


async def test_nvml_down_reports_unknown_and_nvml_up_zero(tmp_path: Path) -> None:
    ctx = await context(tmp_path)
    ctx.board.set_backend_down("NVML unavailable: Driver Not Loaded", START + 5000)
    found = samples(generate_latest(ctx.registry).decode())
    assert value(found, "flexlease_nvml_up", node=NODE) == 0.0
    for gpu in ("0", "1"):
        assert value(found, "flexlease_gpu_health", node=NODE, gpu=gpu, state="Unknown") == 1.0
        assert value(found, "flexlease_gpu_health", node=NODE, gpu=gpu, state="Healthy") == 0.0


async def test_collect_reads_state_only(tmp_path: Path) -> None:
    """Scraping never reaches the backend: with the backend stopped, a scrape still works."""
    ctx = await context(tmp_path)
    await ctx.backend.stop()
    assert b"flexlease_gpu_health" in generate_latest(ctx.registry)


async def test_corrupt_ledger_is_counted(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "ledger.json").write_text("{not json")
    ctx = await context(tmp_path)
    found = samples(generate_latest(ctx.registry).decode())
    assert value(found, "flexlease_ledger_corrupt_total", node=NODE) == 1.0
    assert len(list(state.glob("ledger.json.corrupt-*"))) == 1


async def test_endpoints(aiohttp_client: AiohttpClient, tmp_path: Path) -> None:
    ctx = await context(tmp_path)
    readiness = Readiness()
    flags = {"health": True, "status": False}
    readiness.add("health", lambda: flags["health"])
    readiness.add("status", lambda: flags["status"])
    client: TestClient[web.Request, web.Application] = await aiohttp_client(
        create_app(ctx.registry, readiness)
    )

    resp = await client.get("/healthz")
    assert resp.status == 200
    resp = await client.get("/readyz")
    assert resp.status == 503
    assert (await resp.text()).splitlines() == ["[+]health ok", "[-]status failed", "readyz check failed"]
    flags["status"] = True
    resp = await client.get("/readyz")
    assert resp.status == 200
    assert (await resp.text()).splitlines()[-1] == "readyz check passed"

    resp = await client.get("/metrics")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    found = samples(await resp.text())
    assert value(found, "flexlease_gpu_health", node=NODE, gpu="1", state="Unhealthy") == 1.0


async def test_readiness_names_are_unique_and_failing_checks_count_as_not_ready() -> None:
    readiness = Readiness()
    readiness.add("a", lambda: 1 / 0 == 0)
    try:
        readiness.add("a", lambda: True)
    except ValueError as exc:
        assert "already registered" in str(exc)
    else:
        raise AssertionError("duplicate name accepted")
    assert readiness.results() == {"a": False}


def test_registry_is_injected_not_global() -> None:
    registry = CollectorRegistry()
    assert generate_latest(registry) == b""


async def test_the_agent_serves_no_mutating_route(aiohttp_client: AiohttpClient) -> None:
    """Issue #18: the agent's HTTP endpoints stay read-only. Every route of its one HTTP app
    is GET (aiohttp adds HEAD), a POST/PUT/PATCH/DELETE to any of them is 405, and no module
    of the agent registers another route or app."""
    app = create_app(CollectorRegistry(), Readiness())
    routes = {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource is not None}
    assert {method for method, _ in routes} <= {"GET", "HEAD"}
    assert {path for _, path in routes} == {"/metrics", "/healthz", "/readyz"}
    client: TestClient[web.Request, web.Application] = await aiohttp_client(app)
    for path in ("/metrics", "/healthz", "/readyz", "/"):
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            resp = await client.request(method, path, data=b"{}")
            assert resp.status in (404, 405), (method, path, resp.status)
    package = Path(nodeagent.__file__).parent
    for source in package.rglob("*.py"):
        text = source.read_text()
        for call in ("add_post(", "add_put(", "add_patch(", "add_delete(", "add_route(", "add_routes("):
            assert call not in text, f"{source.relative_to(package)} registers a route with {call}"
        if source.name != "metrics.py":
            assert "web.Application(" not in text, f"{source.relative_to(package)} builds an HTTP app"
