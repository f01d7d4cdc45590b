"""The node agent's composition root (after OpenKruise's ``pkg/daemon/daemon.go``).

:func:`build_context` builds the one :class:`~nodeagent.context.AgentContext` every component shares
(settings, store, metrics registry, clock, GPU backend, the in-memory GPU board and the
availability ledger, restored from disk). :func:`run` runs the components in one
``asyncio.TaskGroup``: the first component to fail stops them all and its error propagates;
setting the ``stop`` event (SIGTERM, in :mod:`nodeagent.main`) stops them cleanly.

A component is anything with a ``name`` and ``async run(ctx)`` that runs until cancelled
(:class:`~nodeagent.context.Component`); one that also has ``ready() -> bool`` gets a named
``/readyz`` check (:class:`~nodeagent.context.ReadinessCheck`). To add one, append it in
:func:`components`. The context and the protocols live in :mod:`nodeagent.context`, so this
module only imports the components and none of them imports it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry

from flexlease.clock import Clock
from flexlease.config import Settings
from flexlease.store.base import Store
from nodeagent import ledger
from nodeagent.context import AgentContext, Component, ReadinessCheck
from nodeagent.deviceplugin.component import DevicePluginComponent
from nodeagent.health.backend import GpuBackend
from nodeagent.health.board import NodeBoard
from nodeagent.health.keeper import LedgerKeeper
from nodeagent.health.policy import HealthPolicy
from nodeagent.health.watch import HealthWatch
from nodeagent.hotrestart.component import runtime_components
from nodeagent.metrics import AgentMetrics, BoardCollector, MetricsServer, Readiness
from nodeagent.status import StatusReporter

log = logging.getLogger(__name__)


def components(ctx: AgentContext) -> list[Component]:
    """The agent's components, in start order; ``deviceplugin`` only with
    ``agent.device_plugin``. Add new ones here."""
    return [
        HealthWatch(),
        LedgerKeeper(),
        StatusReporter(),
        MetricsServer(),
        *([DevicePluginComponent()] if ctx.settings.agent.device_plugin else []),
        *runtime_components(ctx),
    ]


async def build_context(
    settings: Settings,
    store: Store,
    *,
    make_backend: Callable[[AgentMetrics], GpuBackend],
    clock: Clock,
    registry: CollectorRegistry | None = None,
) -> AgentContext:
    """Everything the components share. Restores the ledger from ``agent.state_dir`` (a
    corrupt file is moved aside and counted). Raises ``ValueError`` when ``agent.node_name``
    is empty and ``OSError`` when the state directory is unusable. ``make_backend`` gets the
    metrics so that the backend can count NVML errors."""
    node = settings.agent.node_name
    if not node:
        raise ValueError("agent.node_name is required (NODE_NAME, --node-name or agent.node_name)")
    registry = registry if registry is not None else CollectorRegistry()
    metrics = AgentMetrics(registry, node)
    file = ledger.LedgerFile(
        settings.agent.state_dir,
        on_corrupt=lambda _moved, _why: metrics.ledger_corrupt.labels(node=node).inc(),
    )
    decoded = await asyncio.to_thread(file.load)
    t = settings.tiers
    thresholds = ledger.Thresholds(
        ha=t.ha_threshold,
        ma=t.ma_threshold,
        window_seconds=t.window_seconds,
        refresh_seconds=t.refresh_seconds,
    )
    book = ledger.Ledger.restored(node, thresholds, decoded=decoded, now=clock.now())
    policy = HealthPolicy(
        application_xids=settings.agent.application_xids,
        recovery_hold_down_seconds=settings.agent.recovery_hold_down_seconds,
    )
    board = NodeBoard(node, policy, book=book)
    registry.register(BoardCollector(board))
    return AgentContext(
        settings=settings,
        store=store,
        registry=registry,
        clock=clock,
        backend=make_backend(metrics),
        metrics=metrics,
        board=board,
        ledger_file=file,
        readiness=Readiness(),
    )


class _Stopped(Exception):
    """Raised inside the task group to stop every component."""


async def run(ctx: AgentContext, parts: Sequence[Component], *, stop: asyncio.Event | None = None) -> None:
    """Run ``parts`` until ``stop`` is set (returns normally) or one fails (its exception
    propagates, in an ``ExceptionGroup`` with any others that failed while stopping). A
    component whose ``run`` returns is a failure (``RuntimeError``)."""
    for part in parts:
        if isinstance(part, ReadinessCheck):
            ctx.readiness.add(part.name, part.ready)
    stop = stop if stop is not None else asyncio.Event()
    log.info("agent starting", extra={"node": ctx.node, "components": [p.name for p in parts]})
    try:
        async with asyncio.TaskGroup() as tg:
            for part in parts:
                tg.create_task(_guard(part, ctx), name=f"agent:{part.name}")
            tg.create_task(_until(stop), name="agent:stop")
    except* _Stopped:
        log.info("agent stopped", extra={"node": ctx.node})


async def _guard(part: Component, ctx: AgentContext) -> None:
    await part.run(ctx)
    raise RuntimeError(f"agent component {part.name!r} returned; components must run until cancelled")


async def _until(stop: asyncio.Event) -> None:
    await stop.wait()
    raise _Stopped
