"""Run one or both policies: a fresh SQLite store and a fresh extender subprocess per policy.

Each policy gets its own state file ``<out>/<policy>/state.db`` and its own extender (log in
``<out>/<policy>/extender.log``), so the two runs share nothing but the inputs
(:class:`flexlease.sim.driver.World`: the same LP arrivals, tide and GPU outages).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

from flexlease.config import StoreSettings
from flexlease.logging import ctx
from flexlease.sim import driver, extender_proc
from flexlease.sim.extender_client import ExtenderClient
from flexlease.sim.scenario import Policy, Scenario
from flexlease.store import factory

log = logging.getLogger(__name__)

READY_TIMEOUT_SECONDS = 60.0


async def wait_ready(client: ExtenderClient, limit_s: float) -> None:
    """Poll ``/readyz`` until 200. Raises :class:`driver.SimulationError` after ``limit_s`` s."""
    deadline = time.monotonic() + limit_s
    while not await client.ready():
        if time.monotonic() > deadline:
            raise driver.SimulationError(f"extender not ready after {limit_s:g} s")
        await asyncio.sleep(0.05)


async def run_policy(
    scenario: Scenario,
    policy: Policy,
    *,
    world: driver.World,
    out: Path,
    extra_env: Mapping[str, str] | None = None,
    keep_state: bool = False,
) -> dict[str, Any]:
    """Simulate ``policy`` against a fresh extender (``extra_env``: more environment for it);
    returns its report section. On a :class:`driver.SimulationError` the section holds
    ``error`` and the partial results. The SQLite file (hundreds of MiB after 60 days) is
    removed afterwards unless ``keep_state``."""
    work = out / policy.value
    work.mkdir(parents=True, exist_ok=True)
    db = work / "state.db"
    await asyncio.to_thread(_remove_db, db)
    store = await factory.open_store(StoreSettings(kind="sqlite", sqlite_path=db, sqlite_poll_seconds=0.005))
    try:
        async with (
            extender_proc.running_extender(
                db, work / "extender.log", speedup=scenario.speedup, extra_env=extra_env
            ) as ext,
            aiohttp.ClientSession() as session,
        ):
            client = ExtenderClient(session, ext.url)
            await wait_ready(client, READY_TIMEOUT_SECONDS)
            sim = driver.Simulation(scenario, policy, world=world, store=store, client=client)
            log.info("simulation starting", extra=ctx(policy=policy.value, extender=ext.url))
            error = None
            try:
                await sim.run()
            except driver.SimulationError as exc:
                error = str(exc)
                log.error("simulation stopped", extra=ctx(policy=policy.value, error=error))
            section = sim.report()
            section["extender_log"] = str(ext.log_path)
            if error is not None:
                section["error"] = error
            return section
    finally:
        await store.close()
        if not keep_state:
            await asyncio.to_thread(_remove_db, db)


def _remove_db(db: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


async def run_all(
    scenario: Scenario,
    policies: list[Policy],
    out: Path,
    *,
    extra_env: Mapping[str, str] | None = None,
    keep_state: bool = False,
) -> dict[str, Any]:
    """Build the shared inputs and run every policy in turn; returns the full report."""
    started = time.perf_counter()
    world = driver.build_world(scenario)
    sections = {}
    for policy in policies:
        try:
            sections[policy.value] = await run_policy(
                scenario, policy, world=world, out=out, extra_env=extra_env
            )
        except extender_proc.ExtenderStartError as exc:
            sections[policy.value] = {"policy": policy.value, "error": str(exc)}
    return {
        "scenario": scenario_dict(scenario),
        "inputs": {
            "lp_source": world.lp_source,
            "lp_pods": len(world.arrivals),
            "tide": world.tide_source,
            "failure_model": {
                "flaky_fraction": round(world.model.flaky_fraction, 4),
                "good_rate_per_day": round(world.model.good_rate * 86400, 5),
                "flaky_rate_per_day": round(world.model.flaky_rate * 86400, 3),
                "no_outage_14d": round(world.model.no_outage_probability(14), 3),
                "no_outage_30d": round(world.model.no_outage_probability(30), 3),
            },
        },
        "policies": sections,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def scenario_dict(scenario: Scenario) -> dict[str, Any]:
    """The scenario as JSON-ready values."""
    out: dict[str, Any] = {}
    for name in scenario.__dataclass_fields__:
        value = getattr(scenario, name)
        out[name] = str(value) if isinstance(value, Path) else getattr(value, "value", value)
    out["job_gpus"] = scenario.job_gpus
    out["lp_target_load"] = scenario.lp_target_load
    return out
