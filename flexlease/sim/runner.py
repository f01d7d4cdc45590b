"""Run the policies: a fresh store, virtual clock and hosted extender per policy.

Each policy gets its own :class:`~flexlease.store.memory.MemoryStore` (with deterministic
uids and ``creationTimestamp`` s from the clock), its own
:class:`~flexlease.clock.ManualClock` starting at :data:`flexlease.sim.driver.EPOCH`, and its
own extender — the real app and lease controller, served on loopback HTTP in this process
by ``extender.simhost`` on that clock (``flexlease`` may not import ``extender``, so the
module is loaded by name, :data:`HOST_MODULE`). With ``Scenario.autopilot`` the right-of-return
policy's extender also runs the real lease autopilot, reading the demand trace through a
:class:`flexlease.sim.demandtrace.TraceSource` on the same clock. The policies share nothing but
the inputs (:class:`flexlease.sim.driver.World`: the same LP arrivals, demand trace and GPU
outages).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import itertools
import json
import logging
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Final, Protocol

import uvloop

import flexlease.logging
from flexlease.clock import ManualClock
from flexlease.config import (
    AutopilotSettings,
    ExtenderSettings,
    LeaseSettings,
    Settings,
    StandbySettings,
    StoreSettings,
)
from flexlease.logging import ctx
from flexlease.sim import demandtrace, driver, failures, traces
from flexlease.sim.extender_client import ExtenderClient
from flexlease.sim.scenario import Policy, Scenario
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore

log = logging.getLogger(__name__)

HOST_MODULE: Final = "extender.simhost"
"""Module with ``hosted(settings, store, clock)``: the extender served in this process."""
STATE_FILE: Final = "state.json"
HISTORY_REVISIONS: Final = 5_000
"""Changes the store keeps for its watches. Every settle lets the watches catch up, so they
lag only by the writes of one uninterrupted burst (the set-up, a tick's arrivals, a tier
refresh: a few hundred at 64 nodes; a watch that fell further behind would list again);
a longer history only grows the heap that every full garbage collection traverses."""


class Hosted(Protocol):
    """What ``extender.simhost.hosted`` yields."""

    url: str

    async def connect(self, protocol: Callable[[], asyncio.Protocol]) -> asyncio.BaseTransport: ...

    async def settle(self) -> int: ...

    def paused(self) -> contextlib.AbstractAsyncContextManager[None]: ...


HostFactory = Callable[..., contextlib.AbstractAsyncContextManager[Hosted]]
"""``hosted(settings, store, clock)``, and ``metrics_source=`` when the autopilot runs."""


def load_host() -> HostFactory:
    """``extender.simhost.hosted``, imported by name. Raises ``ImportError`` when the
    extender package is not installed."""
    factory: HostFactory = importlib.import_module(HOST_MODULE).hosted
    return factory


def sim_settings(scenario: Scenario, policy: Policy = Policy.ROR) -> Settings:
    """The extender's settings in a simulation: in-memory store; the lease controller on or
    off per the scenario, keeping the standby pool at its initial size, resyncing hourly
    (every change is watched; the resync is only a safety net). Plain leasing runs the same
    app with ``extender.right_of_return`` off: tiers and ownership tags are not consulted,
    as in the paper's baseline where GPUs are interchangeable. The lease autopilot (when the
    scenario has one) reconciles once per tick at the latest."""
    return Settings(
        log_level="WARNING",
        store=StoreSettings(kind="memory"),
        extender=ExtenderSettings(right_of_return=policy is not Policy.PLAIN),
        lease=LeaseSettings(
            enabled=scenario.lease_enabled,
            resync_seconds=3600.0,
            standby_pool_size=scenario.standby_pool_size,
            standby_wait_seconds=scenario.standby_wait,
            standby=StandbySettings(
                mode="adaptive" if scenario.standby_mode == "adaptive" else "fixed",
                floor_gpus=scenario.standby_floor,
                window_seconds=scenario.standby_window,
            ),
        ),
        autopilot=AutopilotSettings(resync_seconds=scenario.tick),
    )


def uid_source(policy: Policy) -> Callable[[], str]:
    """Deterministic UUID-shaped uids: ``<policy hash>-…-<counter>``."""
    counter = itertools.count(1)
    tag = sum(policy.value.encode()) & 0xFFFF
    return lambda: f"{tag:08x}-0000-4000-8000-{next(counter):012x}"


async def run_policy(
    scenario: Scenario,
    policy: Policy,
    *,
    world: driver.World,
    out: Path,
    host: HostFactory | None = None,
    keep_state: bool = False,
    check_shared: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Simulate ``policy`` against a fresh hosted extender; returns its report section and
    its wall-clock timing. On a :class:`driver.SimulationError` the section holds ``error``
    and the partial results. ``keep_state``: write every object left in the store to
    ``<out>/<policy>/state.json`` (Pods, GPUNodes, GPULeases, Events). ``check_shared``: the
    store verifies that no watch consumer (the extender's, the simulator's) changes the event
    objects the watches share (``MemoryStore(check_shared=True)``; for tests)."""
    clock = ManualClock(driver.EPOCH)
    store = MemoryStore(
        clock=clock, uids=uid_source(policy), history_revisions=HISTORY_REVISIONS, check_shared=check_shared
    )
    factory = host or load_host()
    extra: dict[str, Any] = {}
    if scenario.autopilot != "off" and policy is Policy.ROR:
        # the autopilot's Prometheus: the demand trace at the simulation's clock
        extra["metrics_source"] = demandtrace.TraceSource(world.tide, now=clock.now, origin=clock.now())
    try:
        async with (
            factory(sim_settings(scenario, policy), store, clock, **extra) as ext,
            ExtenderClient(ext.url, connect=ext.connect) as client,
        ):
            sim = driver.Simulation(
                scenario,
                policy,
                world=world,
                store=store,
                client=client,
                clock=clock,
                host=driver.ExtenderHost(ext.url, ext.settle, ext.paused),
            )
            log.info("simulation starting", extra=ctx(policy=policy.value, extender=ext.url))
            error = None
            try:
                await sim.run()
            except driver.SimulationError as exc:
                error = str(exc)
                log.error("simulation stopped", extra=ctx(policy=policy.value, error=error))
            section = sim.report()
            if error is not None:
                section["error"] = error
            if keep_state:
                section["state_file"] = str(await _dump_state(store, out / policy.value))
            return section, sim.timing()
    finally:
        await store.close()


async def _dump_state(store: MemoryStore, work: Path) -> Path:
    state = {kind.value: (await store.list(kind)).items for kind in Kind}
    return await asyncio.to_thread(_write_state, work, json.dumps(state, indent=1, sort_keys=True) + "\n")


def _write_state(work: Path, text: str) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    path = work / STATE_FILE
    path.write_text(text)
    return path


async def run_all(
    scenario: Scenario,
    policies: list[Policy],
    out: Path,
    *,
    host: HostFactory | None = None,
    keep_state: bool = False,
    jobs: int = 1,
    log_level: str | None = None,
    check_shared: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Build the shared inputs and run every policy; returns the full report (the same for
    the same scenario, byte for byte once written, however it ran) and the wall-clock timings.

    ``jobs``: policies run at once, each in its own process (:func:`run_policy_process`,
    started with ``spawn``; ``log_level`` configures its logging); 1 (the default, and always
    with ``host``) runs them in turn in this process. The policies share nothing but the
    inputs, which each process builds again from the scenario (:func:`driver.build_world` is
    a pure function of it), so the report does not depend on ``jobs``. ``check_shared``: see
    :func:`run_policy` (in this process only)."""
    started = time.perf_counter()
    world = driver.build_world(scenario)
    sections: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    workers = min(jobs, len(policies))
    if workers > 1 and host is None:
        loop = asyncio.get_running_loop()
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            results = await asyncio.gather(
                *(
                    loop.run_in_executor(
                        pool,
                        functools.partial(
                            run_policy_process,
                            niceness=NICENESS.get(policy, 0) if workers > (os.cpu_count() or 1) else 0,
                        ),
                        scenario,
                        policy,
                        out,
                        keep_state,
                        log_level,
                    )
                    for policy in policies
                )
            )
        for policy, (section, timing) in zip(policies, results, strict=True):
            sections[policy.value], timings[policy.value] = section, timing
    else:
        for policy in policies:
            sections[policy.value], timings[policy.value] = await run_policy(
                scenario,
                policy,
                world=world,
                out=out,
                host=host,
                keep_state=keep_state,
                check_shared=check_shared,
            )
    report = {
        "scenario": scenario_dict(scenario),
        "inputs": {
            "lp_source": world.lp_source,
            "lp_pods": len(world.arrivals),
            "lp_daily_phase": world.lp_phase,
            "tide": world.tide_source,
            "failure_model": failure_figures(world, scenario),
        },
        "policies": sections,
    }
    timings["wall_s"] = round(time.perf_counter() - started, 1)
    return report, timings


NICENESS: Final = {Policy.ROR: 0, Policy.PLAIN: 0, Policy.STATIC: 1}
"""How much each policy's worker yields (``os.nice`` increment) when there are more workers
than CPUs: right-of-return does the most work per simulated day (the lease controller's
reclaims), no scaling the least (64 nodes × 60 days, Philly, seed 2: 224, 194 and 187 s of CPU,
``timing.json``'s ``cpu_s``), so under the kernel's fair share the cheapest one yields and the
policies end closer together instead of right-of-return running alone at the end. Ordering
only: the report is the same."""

_WORLDS: dict[Scenario, driver.World] = {}
"""A worker process's inputs, built once per scenario (a worker may run several policies)."""


def run_policy_process(
    scenario: Scenario,
    policy: Policy,
    out: Path,
    keep_state: bool,
    log_level: str | None,
    *,
    niceness: int = 0,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`run_policy` in a worker process of :func:`run_all`, on uvloop's event loop (as
    the extender serves), with the inputs built here; returns what it returns. ``log_level``:
    set up this process's logging as ``python -m flexlease.sim`` does (None: leave it).
    ``niceness``: lower this process's CPU priority by that much first (:data:`NICENESS`)."""
    if niceness > 0:
        os.nice(niceness)
    if log_level is not None:
        quiet_logging(log_level)
    world = _WORLDS.get(scenario)
    if world is None:
        world = _WORLDS[scenario] = driver.build_world(scenario)
    return uvloop.run(run_policy(scenario, policy, world=world, out=out, keep_state=keep_state))


def quiet_logging(level: str) -> None:
    """Logging of a simulation run: text lines at ``level`` on stderr; the hosted extender's
    per-call lines (access log, binds, lease steps) only from WARNING up (they are noise at
    the simulator's scale; the report counts what matters)."""
    flexlease.logging.setup(level, "text")
    for name in ("aiohttp.access", "extender"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))


def failure_figures(world: driver.World, scenario: Scenario) -> dict[str, Any]:
    """The failure model's parameters and calibration targets (Fig. 5: the share of GPUs
    without an outage over 14 and 30 days), kept apart from what this run's outage
    histories measure: the share of general-pool GPUs with no outage in the 14 and 30 days
    that end at the horizon (the histories start ``tier_window`` + 1 day before t = 0; None
    when a window reaches further back)."""
    model = world.model
    general = {n for n in driver.general_nodes(scenario)}
    histories = [h for k, h in world.outages.items() if k.node in general]
    first = -scenario.tier_window - traces.DAY

    def measured(days: float) -> float | None:
        start = scenario.horizon - days * traces.DAY
        if start < first or not histories:
            return None
        clean = sum(1 for h in histories if failures.downtime(h, start, scenario.horizon) == 0)
        return round(clean / len(histories), 4)

    return {
        "calibration": {
            "flaky_fraction": round(model.flaky_fraction, 4),
            "good_rate_per_day": round(model.good_rate * 86400, 5),
            "flaky_rate_per_day": round(model.flaky_rate * 86400, 3),
            "target_no_outage_14d": round(model.no_outage_probability(14), 3),
            "target_no_outage_30d": round(model.no_outage_probability(30), 3),
        },
        "measured": {
            "gpus": len(histories),
            "window_end_day": round(scenario.horizon / traces.DAY, 4),
            "no_outage_14d": measured(14),
            "no_outage_30d": measured(30),
        },
    }


def scenario_dict(scenario: Scenario) -> dict[str, Any]:
    """The scenario as JSON-ready values (the data directory as its name only, so that the
    report does not depend on where the checkout lives)."""
    out: dict[str, Any] = {}
    for name in scenario.__dataclass_fields__:
        value = getattr(scenario, name)
        out[name] = value.name if isinstance(value, Path) else getattr(value, "value", value)
    out["job_gpus"] = scenario.job_gpus
    out["lp_target_load"] = scenario.lp_target_load
    return out
