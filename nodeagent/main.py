"""``flexlease-agent``: the node agent's entry point.

Loads :class:`flexlease.config.Settings` (YAML file from ``--config`` or ``$FLEXLEASE_CONFIG``,
``FLEXLEASE_*`` environment, then these options), sets up logging, opens the store, builds
the agent (:mod:`nodeagent.agent`) and runs it until SIGTERM or SIGINT.

Exit status: 0 after a clean stop, 1 when a component failed, 2 on bad configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

import flexlease.logging
from flexlease import config
from flexlease.clock import Clock, ScaledClock, SystemClock
from flexlease.config import Settings
from flexlease.store import factory
from nodeagent import agent
from nodeagent.health.backend import GpuBackend
from nodeagent.health.nvml import NvmlBackend
from nodeagent.health.simulated import SimulatedBackend, load_node_config
from nodeagent.metrics import AgentMetrics

log = logging.getLogger(__name__)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="flexlease-agent", description="flexlease node agent (DaemonSet).")
    p.add_argument("--config", type=Path, help="YAML settings file (else $FLEXLEASE_CONFIG)")
    p.add_argument("--nvml", choices=["real", "simulated"], help="GPU backend (agent.nvml)")
    p.add_argument("--node-config", type=Path, help="simulated node YAML (agent.node_config)")
    p.add_argument("--node-name", help="this node's name (agent.node_name; default $NODE_NAME)")
    p.add_argument("--node-ip", help="this node's IP (agent.node_ip; default $NODE_IP)")
    p.add_argument("--state-dir", type=Path, help="ledger directory (agent.state_dir)")
    p.add_argument("--metrics-host", help="address for /metrics, /healthz, /readyz (agent.metrics_host)")
    p.add_argument("--metrics-port", type=int, help="port for the endpoints above (agent.metrics_port)")
    p.add_argument("--store", choices=["sqlite", "kube", "memory"], help="store kind (store.kind)")
    p.add_argument("--sqlite-path", type=Path, help="SQLite store file (store.sqlite_path)")
    p.add_argument("--kubeconfig", type=Path, help="kubeconfig for --store=kube (store.kubeconfig)")
    p.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="simulated backend only: run simulated time this many times faster than real time "
        "(default: clock_speedup, FLEXLEASE_CLOCK_SPEEDUP)",
    )
    return p.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    """Settings with the command-line options on top. Raises ``pydantic.ValidationError``."""
    agent_over: dict[str, Any] = {
        k: v
        for k, v in {
            "nvml": args.nvml,
            "node_config": args.node_config,
            "node_name": args.node_name,
            "node_ip": args.node_ip,
            "state_dir": args.state_dir,
            "metrics_host": args.metrics_host,
            "metrics_port": args.metrics_port,
        }.items()
        if v is not None
    }
    store_opts = {"kind": args.store, "sqlite_path": args.sqlite_path, "kubeconfig": args.kubeconfig}
    store_over: dict[str, Any] = {k: v for k, v in store_opts.items() if v is not None}
    overrides: dict[str, Any] = {}
    if agent_over:
        overrides["agent"] = agent_over
    if store_over:
        overrides["store"] = store_over
    return config.load(args.config, **overrides)


def backend_factory(settings: Settings, clock: Clock) -> Any:
    """A ``make_backend`` for :func:`nodeagent.agent.build_context`. Raises ``ValueError``
    when ``nvml: simulated`` has no ``node_config``; ``OSError``/``ValidationError`` when that
    file is unreadable or malformed."""
    a = settings.agent
    if a.nvml == "simulated":
        if a.node_config is None:
            raise ValueError("--nvml=simulated needs --node-config (agent.node_config)")
        node = load_node_config(a.node_config)

        def simulated(_metrics: AgentMetrics) -> GpuBackend:
            return SimulatedBackend(node, clock)

        return simulated

    def real(metrics: AgentMetrics) -> GpuBackend:
        return NvmlBackend(on_error=metrics.nvml_error)

    return real


async def amain(settings: Settings, *, time_scale: float | None = None) -> int:
    """Run the agent until SIGTERM/SIGINT. Returns the exit status."""
    if time_scale is None and settings.clock_speedup != 1.0:
        time_scale = settings.clock_speedup
    clock: Clock = SystemClock()
    if time_scale is not None:
        if settings.agent.nvml != "simulated":
            raise ValueError("--time-scale applies only to --nvml=simulated")
        clock = ScaledClock(time_scale)
    make_backend = backend_factory(settings, clock)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    store = await factory.open_store(settings.store)
    try:
        ctx = await agent.build_context(settings, store, make_backend=make_backend, clock=clock)
        await agent.run(ctx, agent.components(ctx), stop=stop)
    finally:
        await store.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Console script ``flexlease-agent``."""
    args = parse_args(argv)
    try:
        settings = settings_from(args)
    except (ValidationError, OSError) as exc:
        print(f"flexlease-agent: bad configuration: {exc}", file=sys.stderr)
        return 2
    flexlease.logging.setup(settings.log_level, settings.log_format)
    try:
        return asyncio.run(amain(settings, time_scale=args.time_scale))
    except (ValueError, OSError) as exc:
        log.critical("flexlease-agent cannot start", extra={"error": str(exc)})
        return 2
    except Exception:
        log.critical("flexlease-agent stopped on a fatal error", exc_info=True)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
