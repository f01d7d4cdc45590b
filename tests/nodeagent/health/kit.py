"""Helpers shared by the node-health tests: settings, a simulated node, an agent context."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from flexlease.clock import ManualClock
from flexlease.config import AgentSettings, Settings, TierSettings
from flexlease.store.base import Store
from nodeagent.agent import build_context
from nodeagent.context import AgentContext
from nodeagent.health.backend import GpuBackend
from nodeagent.health.simulated import NodeConfig, SimulatedBackend
from nodeagent.metrics import AgentMetrics

NODE = "gpu-node-1"
START = 1_700_000_000.0


def make_settings(tmp_path: Path, *, tiers: dict[str, Any] | None = None, **agent: Any) -> Settings:
    base: dict[str, Any] = {
        "node_name": NODE,
        "node_ip": "10.0.0.7",
        "state_dir": tmp_path / "state",
        "metrics_host": "127.0.0.1",
        "metrics_port": 0,
        "poll_seconds": 5.0,
        "heartbeat_seconds": 30.0,
        "recovery_hold_down_seconds": 60.0,
    }
    base.update(agent)
    return Settings(agent=AgentSettings(**base), tiers=TierSettings(**(tiers or {})))


def node_config(count: int = 2, events: list[dict[str, Any]] | None = None, **extra: Any) -> NodeConfig:
    return NodeConfig.model_validate(
        {
            "name": NODE,
            "gpus": {"count": count, "model": "NVIDIA H20", "memoryMiB": 97871},
            "events": events or [],
        }
        | extra
    )


async def make_context(
    settings: Settings,
    store: Store,
    clock: ManualClock,
    node: NodeConfig,
    *,
    registry: CollectorRegistry | None = None,
) -> tuple[AgentContext, SimulatedBackend]:
    backend = SimulatedBackend(node, clock)

    def make_backend(_m: AgentMetrics) -> GpuBackend:
        return backend

    ctx = await build_context(settings, store, make_backend=make_backend, clock=clock, registry=registry)
    return ctx, backend


async def eventually(check: Callable[[], bool], *, rounds: int = 200) -> None:
    """Let the loop run until ``check()`` holds (no wall-clock waiting beyond loop turns)."""
    for _ in range(rounds):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")
