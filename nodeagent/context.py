"""What the node agent's components share and what they are (after OpenKruise's
``pkg/daemon/options``): :class:`AgentContext`, built once by
:func:`nodeagent.agent.build_context`, and the :class:`Component` and :class:`ReadinessCheck`
protocols :func:`nodeagent.agent.run` runs. Components import this module, never the
composition root (:mod:`nodeagent.agent`), which imports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from prometheus_client import CollectorRegistry

from flexlease.clock import Clock
from flexlease.config import Settings
from flexlease.store.base import Store
from nodeagent import ledger
from nodeagent.health.backend import GpuBackend
from nodeagent.health.board import NodeBoard
from nodeagent.metrics import AgentMetrics, Readiness


@dataclass(frozen=True, slots=True)
class AgentContext:
    """What every component gets: shared, built once in :func:`nodeagent.agent.build_context`."""

    settings: Settings
    store: Store
    registry: CollectorRegistry
    clock: Clock
    backend: GpuBackend
    metrics: AgentMetrics
    board: NodeBoard
    ledger_file: ledger.LedgerFile
    readiness: Readiness

    @property
    def node(self) -> str:
        return self.settings.agent.node_name


@runtime_checkable
class Component(Protocol):
    """A long-running part of the agent. ``run`` returns only by being cancelled; raising
    stops the whole agent."""

    @property
    def name(self) -> str: ...

    async def run(self, ctx: AgentContext) -> None: ...


@runtime_checkable
class ReadinessCheck(Protocol):
    """A component with a readiness check (``/readyz`` lists it under its name)."""

    def ready(self) -> bool: ...
