"""The extender hosted inside a simulation: the real app over HTTP, on a virtual clock.

:func:`hosted` serves exactly what ``flexlease-extender`` serves (:func:`extender.main.serve`
with :func:`extender.server.create_app`, the lease controller's cleanup context and, given a
metrics source, the lease autopilot's) over an in-process
:class:`~flexlease.store.memory.MemoryStore`, on ``127.0.0.1`` and a free port, with every
timer on the simulation's :class:`~flexlease.clock.ManualClock`: the lease controller's grace
periods, back-offs and resyncs, the autopilot's resyncs and requeues, and the inventory's
reservation TTL. The
simulator (:mod:`flexlease.sim`, which may not import this package and loads this module by
name) speaks the kube-scheduler wire format to it, over connections that
:meth:`HostedExtender.connect` opens to the same aiohttp server in the same event loop
(:mod:`flexlease.pipe`: the HTTP bytes without the loopback socket), and calls
:meth:`HostedExtender.settle`
before it moves time or asks anything: the store's watches have delivered every change and
the controllers' work queues are empty, so each step starts from one well-defined state and a
run is reproducible.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web
from prometheus_client import CollectorRegistry

from extender import gcpolicy
from extender import main as extender_main
from extender.autopilot import controller as autopilot_controller
from extender.autopilot.prometheus import MetricsSource
from extender.lease import controller as lease_controller
from extender.orchestrator import profile as profiles
from extender.state import Inventory
from flexlease import pipe
from flexlease.clock import ManualClock
from flexlease.config import Settings
from flexlease.errors import FlexleaseError
from flexlease.store.memory import MemoryStore

SETTLE_QUIET_ROUNDS: Final = 2
"""Consecutive event-loop iterations with nothing in flight that count as quiescent."""
MAX_SETTLE_ROUNDS: Final = 100_000
SIM_GEN0_THRESHOLD: Final = 50_000
"""The young-generation threshold in a simulation. The extender's own (2,000) keeps each
collection short, because a real cluster waits for every pause; on the simulation's virtual
clock a pause costs nothing but its CPU, and fewer, larger collections cost less CPU in total
(an 8-day right-of-return run at 64 nodes: 0.50 s of collection instead of 1.23 s, the same
report)."""
SIM_GEN1_THRESHOLD: Final = 10
"""The generation-1 threshold in a simulation: CPython's default, for the same reason."""
AUTOPILOT_BUSY_SLEEP: Final = 0.0005
"""Seconds (real) a settle round waits while the autopilot is busy: its forecast trains in a
worker thread (:func:`asyncio.to_thread`), which spinning on ``sleep(0)`` would only starve."""


class NotQuiescent(FlexleaseError):
    """The extender kept working after :data:`MAX_SETTLE_ROUNDS` loop iterations."""


@dataclass(slots=True)
class HostedExtender:
    """A running hosted extender: its ``url`` (``http://127.0.0.1:<port>``) and how to wait
    until it is quiescent."""

    url: str
    _store: MemoryStore
    _controller: Callable[[], lease_controller.LeaseController | None]
    _server: web.Server
    _autopilot: Callable[[], autopilot_controller.AutopilotController | None] = lambda: None
    stopped: bool = False
    """Set once :func:`hosted` is leaving: new connections are refused."""

    async def connect(self, protocol: Callable[[], asyncio.Protocol]) -> asyncio.BaseTransport:
        """A connection from ``protocol()`` to the extender's HTTP server through an
        in-process pipe (:func:`flexlease.pipe.connect`); returns the client's end, the
        protocol made. The server handles it as one accepted on its listener. Raises
        ``ConnectionRefusedError`` once the hosted extender is stopping, as its closed
        listener would."""
        if self.stopped:
            raise ConnectionRefusedError("the hosted extender has stopped")
        end, _, _ = pipe.connect(asyncio.get_running_loop(), protocol, self._server)
        return end

    @property
    def quiet(self) -> bool:
        """True when no store change is undelivered and the controller has nothing to do (or,
        paused, nothing under way)."""
        controller = self._controller()
        autopilot = self._autopilot()
        return (
            self._store.idle
            and (controller is None or controller.settled)
            and (autopilot is None or autopilot.idle)
        )

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Hold the lease controller for the body (a scheduling round): it takes no key until
        the body ends, so its reconciles fall between rounds at well-defined points. The
        extender's watches and HTTP verbs keep running. Nested uses hold it until the
        outermost body ends."""
        controller = self._controller()
        if controller is None or controller.paused:  # nested: the outer body resumes it
            yield
            return
        controller.pause()
        try:
            yield
        finally:
            controller.resume()

    async def settle(self) -> int:
        """Yield to the event loop until :attr:`quiet` holds for :data:`SETTLE_QUIET_ROUNDS`
        iterations in a row; returns the iterations it took. Raises :class:`NotQuiescent`
        after :data:`MAX_SETTLE_ROUNDS`. Time does not move meanwhile."""
        quiet = 0
        for rounds in range(1, MAX_SETTLE_ROUNDS + 1):
            autopilot = self._autopilot()
            # a forecast trains in a worker thread: give it real time instead of spinning
            await asyncio.sleep(AUTOPILOT_BUSY_SLEEP if autopilot is not None and not autopilot.idle else 0)
            quiet = quiet + 1 if self.quiet else 0
            if quiet >= SETTLE_QUIET_ROUNDS:
                return rounds
        raise NotQuiescent(f"the extender was still busy after {MAX_SETTLE_ROUNDS} loop iterations")


@contextlib.asynccontextmanager
async def hosted(
    settings: Settings, store: MemoryStore, clock: ManualClock, *, metrics_source: MetricsSource | None = None
) -> AsyncIterator[HostedExtender]:
    """Serve the extender (``settings``; it listens on 127.0.0.1, a free port, plain HTTP
    — loopback inside one process — without the probe listener, and leader election is off)
    over ``store`` on ``clock``, yield it once it listens and its watches have listed, stop
    it on exit. The store is not closed. With ``metrics_source`` the lease autopilot
    (:class:`extender.autopilot.controller.AutopilotController`, the real one, wired as
    ``flexlease-extender`` wires it) runs too, reading its prometheus and forecast demand
    from that source (the simulation's demand trace) and its time from ``clock``; without,
    it does not run. Raises :class:`NotQuiescent` when it does not become ready and quiet."""
    settings = settings.model_copy(
        update={
            "extender": settings.extender.model_copy(
                update={"host": "127.0.0.1", "port": 0, "insecure_http": True, "metrics_port": None}
            ),
            "lease": settings.lease.model_copy(update={"leader_election": False}),
        }
    )
    registry = CollectorRegistry()
    inventory = Inventory(
        gpu_resource=settings.extender.gpu_resource,
        reservation_ttl_seconds=settings.extender.reservation_ttl_seconds,
        clock=clock.now,
        right_of_return=settings.extender.right_of_return,
        critical_roles=profiles.critical_for(settings.orchestrator.profile_dirs),
    )
    holder: dict[str, lease_controller.LeaseController] = {}
    pilots: dict[str, autopilot_controller.AutopilotController] = {}

    async def keep_controller(app: web.Application) -> AsyncIterator[None]:
        controller = app.get(lease_controller.LEASE_CONTROLLER)
        if controller is not None:
            holder["controller"] = controller
        pilot = app.get(autopilot_controller.AUTOPILOT)
        if pilot is not None:
            pilots["autopilot"] = pilot
        yield

    contexts = [
        lease_controller.cleanup_ctx(settings, store, registry=registry, clock=clock, instance="simulator"),
    ]
    if metrics_source is not None:
        contexts.append(
            autopilot_controller.cleanup_ctx(
                settings,
                store,
                registry=registry,
                clock=clock,
                instance="simulator",
                metrics_source=metrics_source,
            )
        )
    contexts.append(keep_controller)
    listening: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
    servers: list[web.Server] = []
    stop = asyncio.Event()
    serving = asyncio.create_task(
        extender_main.serve(
            settings,
            store,
            stop=stop,
            registry=registry,
            extra_contexts=contexts,
            on_listening=listening.set_result,
            on_server=servers.append,
            inventory=inventory,
        ),
        name="simulated-extender",
    )
    host: HostedExtender | None = None
    try:
        waiting: set[asyncio.Future[Any]] = {listening, serving}
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if serving in done:
            serving.result()  # raises what stopped it
            raise NotQuiescent("the extender stopped before it listened")
        host = HostedExtender(
            listening.result()[0],
            store,
            lambda: holder.get("controller"),
            servers[0],
            _autopilot=lambda: pilots.get("autopilot"),
        )
        for _ in range(MAX_SETTLE_ROUNDS):
            controller = holder.get("controller")
            pilot = pilots.get("autopilot")
            if (
                inventory.ready
                and (controller is None or controller.ready)
                and (pilot is None or pilot.ready)
            ):
                break
            await asyncio.sleep(0)
        else:
            raise NotQuiescent("the extender did not list its watches")
        await host.settle()
        with collector_policy():
            yield host
    finally:
        if host is not None:
            host.stopped = True
        stop.set()
        await serving


@contextlib.contextmanager
def collector_policy() -> Iterator[None]:
    """The extender's garbage-collector policy (:func:`extender.gcpolicy.freeze`: collect,
    freeze what is alive, raise the young threshold, here to :data:`SIM_GEN0_THRESHOLD`) for
    the body, applied once the hosted extender has listed: the simulation's inputs and the
    listed state stay out of every later collection. On exit the frozen objects go back to
    the collector (a later run's collections free what this one left in reference cycles)
    and the thresholds are restored. Process-wide, like the policy itself. Survivors of later
    collections are not frozen (:func:`extender.gcpolicy.freeze_survivors` is for the
    extender's pauses; the simulator's own objects may form cycles that must be collected)."""
    thresholds = gc.get_threshold()
    gcpolicy.freeze(gen0_threshold=SIM_GEN0_THRESHOLD, gen1_threshold=SIM_GEN1_THRESHOLD, survivors=False)
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
