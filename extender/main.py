"""``flexlease-extender``: the extender process's entry point (composition root).

Role: load :class:`flexlease.config.Settings` (``--config FILE`` or ``$FLEXLEASE_CONFIG``,
environment ``FLEXLEASE_*``), set up logging, open the store
(:func:`flexlease.store.factory.open_store`), build the app (:func:`extender.server.create_app`)
and serve it on uvloop's event loop over HTTPS (``extender.tls_cert_file``/``tls_key_file``,
kube-scheduler's ``enableHTTPS``), with mutual TLS when ``extender.tls_client_ca_file`` is set
(:mod:`extender.tls`), or over plain HTTP only with ``extender.insecure_http``; with
``extender.metrics_port``, also a read-only plain-HTTP listener for metrics and probes
(:mod:`extender.probes`); until SIGTERM or SIGINT; then stop accepting, let
running requests finish within ``extender.shutdown_timeout_seconds``, run the cleanup
contexts (watch loops, the lease controller of :mod:`extender.lease.controller`, the
in-place rollout controller of :mod:`extender.rollout.controller` and the lease autopilot of
:mod:`extender.autopilot.controller`, all leader-only and on a clock accelerated by
``clock_speedup``; :mod:`extender.gcpolicy`, which freezes the
listed inventory out of the garbage collector's way) and close the store.

Neighbours: builds :mod:`extender.server`; nothing imports this module.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import ssl
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import uvloop
from aiohttp import web
from aiohttp.log import access_logger
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from pydantic import ValidationError

import flexlease.logging
from extender import gcpolicy, tasks, tls
from extender.autopilot import controller as autopilot
from extender.lease import controller as lease_controller
from extender.orchestrator import relaunch
from extender.probes import create_probe_app
from extender.rollout import controller as rollout_controller
from extender.server import CleanupContext, LeaderCheck, create_app
from extender.state import Inventory
from flexlease import config
from flexlease.clock import ScaledClock, SystemClock
from flexlease.config import Settings
from flexlease.errors import FlexleaseError
from flexlease.logging import ctx
from flexlease.store import factory
from flexlease.store.base import Store
from flexlease.store.kube_filter import ManagedPods
from flexlease.store.leader import ElectionConfig, LeaderElector

log = logging.getLogger(__name__)


def scaled_clock(settings: Settings) -> ScaledClock:
    """The accelerated clock of ``clock_speedup``: from the process's start, or pinned to
    ``clock_origin`` (it then reads ``origin + (time.time() - origin) * speedup``)."""
    speedup, origin = settings.clock_speedup, settings.clock_origin
    if origin is None:
        return ScaledClock(speedup)
    return ScaledClock(speedup, start=origin + (time.time() - origin) * speedup)


def process_registry() -> CollectorRegistry:
    """The process's one metrics registry, with process, platform and GC collectors."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def election_ctx(elector: LeaderElector) -> CleanupContext:
    """Runs ``elector`` as the task ``leader-election`` for the app's lifetime; on shutdown it
    is cancelled, which releases the Lease when leading (the next replica takes over in ~2 s)."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        async with tasks.running(elector.run(), name="leader-election"):
            yield

    return context


def leader_check(elector: LeaderElector) -> LeaderCheck:
    """``/bind``'s view of leadership: (this replica leads, the holder's identity)."""
    return lambda: (elector.is_leader, elector.holder)


async def serve(
    settings: Settings,
    store: Store,
    *,
    stop: asyncio.Event,
    registry: CollectorRegistry | None = None,
    extra_contexts: Sequence[CleanupContext] = (),
    on_listening: Callable[[list[str]], None] | None = None,
    on_server: Callable[[web.Server], None] | None = None,
    leader: LeaderCheck | None = None,
    inventory: Inventory | None = None,
) -> None:
    """Serve the extender over ``store`` until ``stop`` is set.

    ``on_listening`` receives the listening URLs (``http(s)://host:port``; port 0 in the
    settings picks a free one) once the socket is bound; with ``extender.metrics_port``, the
    probe listener's URL comes last. ``on_server`` receives, just before, the app's
    ``aiohttp.web.Server``: the protocol factory behind the listener, for a caller in the same
    process that connects without a socket (:mod:`flexlease.pipe`; the simulator). ``inventory``:
    see :func:`extender.server.create_app`.
    Does not close ``store``. Raises :class:`extender.tls.InsecureListener` without a
    certificate unless ``extender.insecure_http``, ``OSError``/``ssl.SSLError`` when the PEM
    files do not load.
    """
    ext = settings.extender
    digests = tls.file_digests(ext)  # before the load: a change in between is seen later
    ssl_context = tls.server_context(ext)  # before anything starts: refuse early
    reloader = tls.CertificateReloader(ssl_context, ext, loaded=digests) if ssl_context is not None else None
    app = create_app(
        settings, store, registry=registry, extra_contexts=extra_contexts, leader=leader, inventory=inventory
    )
    runner = web.AppRunner(
        app,
        handle_signals=False,
        shutdown_timeout=ext.shutdown_timeout_seconds,
        access_log=access_logger if ext.access_log else None,
    )
    probe_runner: web.AppRunner | None = None
    await runner.setup()
    try:
        site = web.TCPSite(runner, ext.host, ext.port, ssl_context=ssl_context)
        await site.start()
        scheme = "https" if ssl_context is not None else "http"
        urls = [f"{scheme}://{addr[0]}:{addr[1]}" for addr in runner.addresses]
        if ext.metrics_port is not None:
            probe_runner = web.AppRunner(create_probe_app(app), handle_signals=False, access_log=None)
            await probe_runner.setup()
            await web.TCPSite(probe_runner, ext.host, ext.metrics_port).start()
            urls += [f"http://{addr[0]}:{addr[1]}" for addr in probe_runner.addresses]
        log.info("extender listening", extra=ctx(urls=urls, mutual_tls=ext.tls_client_ca_file is not None))
        if on_server is not None and runner.server is not None:  # set up above
            on_server(runner.server)
        if on_listening is not None:
            on_listening(urls)
        if reloader is None:
            await stop.wait()
        else:  # renewed certificates reach new connections without a restart
            async with tasks.running(reloader.run(ext.tls_reload_seconds), name="tls-reloader"):
                await stop.wait()
        log.info("extender stopping")
    finally:
        if probe_runner is not None:
            await probe_runner.cleanup()
        await runner.cleanup()


async def run(settings: Settings) -> None:
    """Open the store, serve until SIGTERM/SIGINT, close the store."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # On a real cluster, watch only the pods flexlease must see (GPU requests, flexlease keys).
    pods = ManagedPods(resource=settings.extender.gpu_resource)
    store = await factory.open_store(settings.store, pod_filter=pods)
    registry = process_registry()
    clock = SystemClock() if settings.clock_speedup == 1.0 else scaled_clock(settings)
    elector: LeaderElector | None = None
    contexts: list[CleanupContext] = []
    if settings.lease.leader_election:
        identity = settings.lease.identity or socket.gethostname()
        elector = LeaderElector(store, ElectionConfig.from_settings(settings.lease, identity=identity))
        contexts.append(election_ctx(elector))
    contexts.append(
        lease_controller.cleanup_ctx(settings, store, registry=registry, clock=clock, elector=elector)
    )
    contexts.append(
        rollout_controller.cleanup_ctx(settings, store, registry=registry, clock=clock, elector=elector)
    )
    contexts.append(relaunch.cleanup_ctx(settings, store, registry=registry, clock=clock, elector=elector))
    contexts.append(autopilot.cleanup_ctx(settings, store, registry=registry, clock=clock, elector=elector))
    # the listed inventory, and what survives later, out of the collector's way
    contexts.append(gcpolicy.cleanup_ctx(survivors=settings.extender.gc_freeze_survivors))
    try:
        await serve(
            settings,
            store,
            stop=stop,
            registry=registry,
            extra_contexts=contexts,
            leader=leader_check(elector) if elector is not None else None,
        )
    finally:
        await store.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``flexlease-extender [--config FILE]``. Returns the exit status:
    0 after a clean shutdown, 2 on bad configuration, 1 when the store or TLS fails."""
    parser = argparse.ArgumentParser(prog="flexlease-extender", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="YAML settings file (else $FLEXLEASE_CONFIG)")
    args = parser.parse_args(argv)
    try:
        settings = config.load(args.config)
    except (ValidationError, OSError, ValueError) as exc:
        print(f"flexlease-extender: bad configuration: {exc}", file=sys.stderr)
        return 2
    flexlease.logging.setup(settings.log_level, settings.log_format)
    try:
        uvloop.run(run(settings))  # libuv's event loop: less per-request overhead (issue #11)
    except (FlexleaseError, OSError, ssl.SSLError) as exc:
        log.critical("extender failed: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
