"""The node agent's Prometheus metrics and its HTTP endpoints ``/metrics``, ``/healthz``,
``/readyz``.

Metric names (prefix ``flexlease_``; per-GPU labels ``node``, ``gpu`` (NVML index), ``uuid``,
``model``):

==========================================  =======  ===============================================
``flexlease_gpu_health``                    gauge    1 for the GPU's current state, 0 for the others
                                                     (label ``state``: Healthy, Unhealthy, Unknown)
``flexlease_gpu_tier``                      gauge    reliability tier rank: 0 LA, 1 MA, 2 HA
``flexlease_gpu_availability_ratio``        gauge    ratio 0–1 over the window (paper §3.5)
``flexlease_gpu_unhealthy_seconds``         gauge    unhealthy seconds within the window
``flexlease_gpu_unknown_seconds``           gauge    seconds not observed (agent or NVML down)
``flexlease_gpu_temperature_celsius``       gauge    last queried core temperature, °C
``flexlease_gpu_xid_events_total``          counter  XID events by code (label ``xid``)
``flexlease_nvml_up``                       gauge    1 when NVML initialised, else 0
``flexlease_nvml_errors_total``             counter  NVML errors (labels ``call``, ``error``)
``flexlease_ledger_corrupt_total``          counter  ledger files found corrupt and moved aside
``flexlease_agent_heartbeat_timestamp_seconds`` gauge last successful GPUNode status write, epoch s
``flexlease_agent_status_writes_total``     counter  status writes (label ``result``: ok, conflict,
                                                     error)
==========================================  =======  ===============================================

The per-GPU gauges come from a custom collector reading the agent's in-memory
:class:`~nodeagent.health.board.NodeBoard` at scrape time (prometheus_client's
``docs/content/collector/custom.md``); NVML is never called inside ``collect()``. The
registry is injected; one per process, a fresh one per test.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.aiohttp import make_aiohttp_handler
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from flexlease.api.resources import Health
from nodeagent.health.board import NodeBoard

if TYPE_CHECKING:
    from nodeagent.context import AgentContext

log = logging.getLogger(__name__)

PREFIX: Final = "flexlease_"
GPU_LABELS: Final = ("node", "gpu", "uuid", "model")


class AgentMetrics:
    """The agent's counters and gauges that are updated as things happen, registered in
    ``registry`` for node ``node``."""

    def __init__(self, registry: CollectorRegistry, node: str) -> None:
        self.node = node
        self.xid_events = Counter(
            PREFIX + "gpu_xid_events",
            "XID events reported by NVML, by XID code.",
            [*GPU_LABELS, "xid"],
            registry=registry,
        )
        self.nvml_errors = Counter(
            PREFIX + "nvml_errors",
            "NVML calls that returned an error, by call and NVML error name.",
            ["node", "call", "error"],
            registry=registry,
        )
        self.ledger_corrupt = Counter(
            PREFIX + "ledger_corrupt",
            "Availability ledger files found corrupt and moved aside.",
            ["node"],
            registry=registry,
        )
        self.ledger_corrupt.labels(node=node)
        self.heartbeat = Gauge(
            PREFIX + "agent_heartbeat_timestamp_seconds",
            "Time of the agent's last successful GPUNode status write, seconds since the epoch.",
            ["node"],
            registry=registry,
        )
        self.status_writes = Counter(
            PREFIX + "agent_status_writes",
            "GPUNode status writes by result.",
            ["node", "result"],
            registry=registry,
        )
        for result in ("ok", "conflict", "error"):
            self.status_writes.labels(node=node, result=result)

    def nvml_error(self, call: str, error: str) -> None:
        """Count one NVML error (the backend's ``on_error``)."""
        self.nvml_errors.labels(node=self.node, call=call, error=error).inc()

    def xid(self, *, gpu: int, uuid: str, model: str, xid: int) -> None:
        """Count one XID event."""
        self.xid_events.labels(node=self.node, gpu=str(gpu), uuid=uuid, model=model, xid=str(xid)).inc()


class BoardCollector(Collector):
    """Per-GPU gauges read from ``board`` at scrape time."""

    def __init__(self, board: NodeBoard) -> None:
        self._board = board

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        b = self._board
        health = GaugeMetricFamily(
            PREFIX + "gpu_health", "GPU health: 1 for the current state.", labels=[*GPU_LABELS, "state"]
        )
        tier = GaugeMetricFamily(
            PREFIX + "gpu_tier", "Reliability tier rank: 0 LA, 1 MA, 2 HA.", labels=GPU_LABELS
        )
        ratio = GaugeMetricFamily(
            PREFIX + "gpu_availability_ratio", "Availability ratio (0-1) over the window.", labels=GPU_LABELS
        )
        unhealthy = GaugeMetricFamily(
            PREFIX + "gpu_unhealthy_seconds", "Unhealthy seconds within the window.", labels=GPU_LABELS
        )
        unknown = GaugeMetricFamily(
            PREFIX + "gpu_unknown_seconds",
            "Seconds within the window not observed (agent or NVML down).",
            labels=GPU_LABELS,
        )
        temp = GaugeMetricFamily(
            PREFIX + "gpu_temperature_celsius", "Last queried GPU core temperature.", labels=GPU_LABELS
        )
        for index, ident in sorted(b.devices.items()):
            labels = [b.node, str(index), ident.uuid, ident.model]
            state = b.health.get(index)
            for h in Health:
                health.add_metric([*labels, h.value], 1.0 if state is not None and state.health is h else 0.0)
            view = b.tiers.get(index)
            if view is not None:
                tier.add_metric(labels, float(view.tier.rank))
                ratio.add_metric(labels, view.availability.ratio)
                unhealthy.add_metric(labels, view.availability.unavailable_seconds)
                unknown.add_metric(labels, view.availability.unknown_seconds)
            sample = b.samples.get(index)
            if sample is not None and sample.temperature_c is not None:
                temp.add_metric(labels, float(sample.temperature_c))
        up = GaugeMetricFamily(PREFIX + "nvml_up", "1 when NVML initialised, else 0.", labels=["node"])
        up.add_metric([b.node], 1.0 if b.nvml_up else 0.0)
        yield from (health, tier, ratio, unhealthy, unknown, temp, up)


# ---------------------------------------------------------------------------- endpoints

Check = Callable[[], bool]


class Readiness:
    """Named readiness checks registered by the agent's components (after OpenKruise's
    ``pkg/daemon/util/healthz.go``); ``/readyz`` is 200 when every check passes."""

    def __init__(self) -> None:
        self._checks: dict[str, Check] = {}

    def add(self, name: str, check: Check) -> None:
        """Register ``check`` as ``name``. Raises ``ValueError`` when the name is taken."""
        if name in self._checks:
            raise ValueError(f"readiness check {name!r} already registered")
        self._checks[name] = check

    def results(self) -> dict[str, bool]:
        """Each check's current result; a check that raises counts as not ready (logged)."""
        out: dict[str, bool] = {}
        for name, check in self._checks.items():
            try:
                out[name] = bool(check())
            except Exception:
                log.exception("readiness check failed", extra={"check": name})
                out[name] = False
        return out


READINESS: Final = web.AppKey("readiness", Readiness)


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _readyz(request: web.Request) -> web.Response:
    """``/readyz``: 200 when every named check passes, else 503; the body lists each check as
    ``[+]name ok`` / ``[-]name failed`` (the Kubernetes ``?verbose`` form)."""
    results = request.app[READINESS].results()
    lines = [
        f"[{'+' if ok else '-'}]{name} {'ok' if ok else 'failed'}" for name, ok in sorted(results.items())
    ]
    ready = all(results.values())
    lines.append("readyz check passed" if ready else "readyz check failed")
    return web.Response(status=200 if ready else 503, text="\n".join(lines) + "\n")


def create_app(registry: CollectorRegistry, readiness: Readiness) -> web.Application:
    """The agent's HTTP app: ``GET /metrics`` (Prometheus text or OpenMetrics, negotiated),
    ``GET /healthz`` (200 while the process serves), ``GET /readyz`` (named checks)."""
    app = web.Application()
    app[READINESS] = readiness
    app.router.add_get("/metrics", make_aiohttp_handler(registry))
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    return app


class MetricsServer:
    """Agent component ``metrics``: serves :func:`create_app` on ``agent.metrics_host``:
    ``agent.metrics_port`` (port 0 picks a free one; :attr:`port` tells which) with an
    ``AppRunner`` that leaves signals to the agent. Ready once listening."""

    name = "metrics"

    def __init__(self) -> None:
        self.port: int | None = None

    def ready(self) -> bool:
        return self.port is not None

    async def run(self, ctx: AgentContext) -> None:
        """Serve until cancelled. Raises ``OSError`` when the port cannot be bound."""
        s = ctx.settings.agent
        runner = web.AppRunner(
            create_app(ctx.registry, ctx.readiness),
            handle_signals=False,
            access_log=None,
            shutdown_timeout=2.0,
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, s.metrics_host, s.metrics_port)
            await site.start()
            sockets = [a for a in runner.addresses if isinstance(a, tuple)]
            self.port = int(sockets[0][1]) if sockets else s.metrics_port
            log.info("serving /metrics, /healthz, /readyz", extra={"host": s.metrics_host, "port": self.port})
            await asyncio.Event().wait()
        finally:
            self.port = None
            await runner.cleanup()
