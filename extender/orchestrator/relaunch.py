"""Orchestrator runs on lease completion (WeFlex §3.2 step e, §3.4): when a GPULease (Lend or
Reclaim) of a job whose pods name a framework profile reaches ``Done``, and the rollout
controller's in-place restarts for it have finished, the extender's leader runs the profile's
commands in the job's pods — in DAG order, each when its preconditions hold in the readiness
snapshot — through the configured executor (``orchestrator.executor``: Kubernetes
``pods/exec`` or CRI ``ExecSync``).

Layout as the lease and rollout controllers': two :class:`~extender.lease.mirror.Mirror` s
(GPULeases, Pods) only enqueue keys; a worker decides per lease with
:func:`extender.orchestrator.runstatus.decide` and starts each run as a named task
(``orchestrate/<ns>/<lease>``), at most one per lease. A run:

1. writes ``flexlease.io/orchestration-status`` ``phase: Running`` on the lease (an Event
   ``OrchestrationStarted``, or ``OrchestrationResumed`` when a previous leader left it
   Running);
2. keeps the job's readiness snapshot (:class:`~extender.orchestrator.watch.ReadinessWatch`)
   and executes the DAG (:class:`~extender.orchestrator.runner.Runner`); each step that
   succeeds is written to the annotation's ``done`` as it happens, so a run cut short by a
   restart or a leadership change resumes without repeating them;
3. ends ``Succeeded`` or ``Failed`` (per-command state, attempts and reasons), with an Event
   (``OrchestrationSucceeded``, Warning ``OrchestrationFailed``) and the metrics of
   :class:`OrchestrationMetrics`. A final phase for the lease's uid and generation is never
   run again. Runs the decision refuses (several or unknown frameworks, failed in-place
   restarts) are recorded ``Refused`` with a Warning Event ``OrchestrationRefused``.

The annotation is written with a merge patch of that one key and no resourceVersion: the
leader is its only writer, and the lease and rollout controllers write other fields.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Final, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from extender import tasks
from extender.lease.events import ObjectRef, event_object
from extender.lease.mirror import Mirror
from extender.lease.planner import EventType
from extender.lease.workqueue import WorkQueue, warn_and_retry
from extender.orchestrator import dag as dagmod
from extender.orchestrator import profile as profiles
from extender.orchestrator import runstatus
from extender.orchestrator.executors import CriExecutor, Executor, KubeExecutor
from extender.orchestrator.runner import RetryPolicy, Runner, RunResult
from extender.orchestrator.runstatus import Action, Decision, OrchestrationStatus, RunPhase
from extender.orchestrator.watch import ReadinessWatch
from flexlease.api import keys
from flexlease.clock import Clock, SystemClock
from flexlease.config import Settings
from flexlease.errors import NotFound, StoreError
from flexlease.logging import ctx
from flexlease.store import kube_auth
from flexlease.store.base import EventType as WatchType
from flexlease.store.base import JsonObj, Kind, Store
from flexlease.store.informer import Backoff
from flexlease.store.leader import LeaderElector, run_leader_only

log = logging.getLogger(__name__)

LEASE_PREFIX: Final = "lease/"
COMPONENT: Final = "flexlease-orchestrator"
WRITE_ATTEMPTS: Final = 5
"""Tries per status write (0.2 s doubling between) before a run gives up on recording it."""


class OrchestrationMetrics:
    """``flexlease_orchestration_runs_total{outcome=succeeded|failed|refused}``,
    ``flexlease_orchestration_runs_in_progress``, ``flexlease_orchestration_run_seconds``
    (histogram, start to end of one leader's run), ``flexlease_orchestration_commands_total{state}``
    (final command states)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.runs = Counter(
            "flexlease_orchestration_runs",
            "Orchestrator runs finished, by outcome.",
            ["outcome"],
            registry=registry,
        )
        self.in_progress = Gauge(
            "flexlease_orchestration_runs_in_progress", "Orchestrator runs executing now.", registry=registry
        )
        self.seconds = Histogram(
            "flexlease_orchestration_run_seconds",
            "Duration of orchestrator runs after a lend or reclaim.",
            buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
            registry=registry,
        )
        self.commands = Counter(
            "flexlease_orchestration_commands",
            "Commands finished, by final state.",
            ["state"],
            registry=registry,
        )
        for outcome in ("succeeded", "failed", "refused"):
            self.runs.labels(outcome=outcome)
        for state in ("Succeeded", "Failed", "TimedOut", "Skipped"):
            self.commands.labels(state=state)


class ClosableExecutor(Executor, Protocol):
    """An executor the controller owns and closes."""

    async def close(self) -> None: ...


class RelaunchController:
    """Starts and records orchestrator runs on lease completion (see the module docstring).

    ``executor``: how commands run (the caller keeps ownership); ``profiles``: the registry
    by name (default: the shipped profiles plus ``settings.orchestrator.profile_dirs``)."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        *,
        executor: Executor,
        registry: CollectorRegistry,
        clock: Clock | None = None,
        instance: str | None = None,
        profiles_by_name: Mapping[str, profiles.Profile] | None = None,
    ) -> None:
        self._settings = settings
        self._store = store
        self._executor = executor
        self._clock: Clock = clock or SystemClock()
        self._instance = instance or socket.gethostname()
        self._profiles = dict(
            profiles_by_name
            if profiles_by_name is not None
            else profiles.registry(settings.orchestrator.profile_dirs)
        )
        self._policy = RetryPolicy(
            max_attempts=settings.orchestrator.max_attempts,
            ready_timeout_seconds=settings.orchestrator.ready_timeout_seconds,
        )
        self.metrics = OrchestrationMetrics(registry)
        lease = settings.lease
        self._queue = WorkQueue(
            self._clock, base_delay=lease.retry_base_seconds, max_delay=lease.retry_max_seconds
        )
        self._leases = Mirror(store, Kind.GPULEASE, on_change=self._lease_changed)
        self._pods = Mirror(store, Kind.POD, on_change=self._pod_changed)
        self._running: dict[str, asyncio.Task[None]] = {}
        self._group: asyncio.TaskGroup | None = None

    @property
    def ready(self) -> bool:
        """True once GPULeases and Pods have been listed."""
        return self._leases.listed.is_set() and self._pods.listed.is_set()

    @property
    def running(self) -> frozenset[str]:
        """Keys (``lease/<ns>/<name>``) of the runs executing now."""
        return frozenset(self._running)

    async def run(self) -> None:
        """Watch, decide and run until cancelled (runs in flight are cancelled with it; the
        next leader resumes them from the annotation)."""
        log.info("orchestration controller starting", extra=ctx(profiles=",".join(sorted(self._profiles))))
        async with asyncio.TaskGroup() as group:
            self._group = group
            for mirror in (self._leases, self._pods):
                group.create_task(mirror.run(), name=f"orchestrate-mirror-{mirror.kind.value}")
            group.create_task(self._resync(), name="orchestrate-resync")
            group.create_task(self._work(), name="orchestrate-worker")

    async def _resync(self) -> None:
        tick = asyncio.Event()
        while True:
            for obj in self._leases.values():
                self._lease_changed(WatchType.MODIFIED, obj)
            tick.clear()
            await self._clock.wait(tick, self._settings.lease.resync_seconds)

    async def _work(self) -> None:
        on_error = warn_and_retry("orchestration reconcile", quiet=StoreError, logger=log)
        while True:
            await self._queue.process_next(self.reconcile, on_error=on_error)

    def _lease_changed(self, type: WatchType, obj: JsonObj) -> None:
        status = obj.get("status")
        if type is WatchType.DELETED or not isinstance(status, dict):
            return
        if status.get("phase") == "Done":
            meta = obj.get("metadata") or {}
            self._queue.add(f"{LEASE_PREFIX}{meta.get('namespace')}/{meta.get('name')}")

    def _pod_changed(self, type: WatchType, obj: JsonObj) -> None:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if isinstance(labels, dict) and keys.LABEL_FRAMEWORK in labels:
            namespace = (obj.get("metadata") or {}).get("namespace")
            for lease in self._leases.values():
                if (lease.get("metadata") or {}).get("namespace") == namespace:
                    self._lease_changed(WatchType.MODIFIED, lease)

    # ------------------------------------------------------------------ reconcile

    async def reconcile(self, key: str) -> None:
        """Decide about one lease (``lease/<ns>/<name>``) and start its run when due. Raises
        ``ValueError`` on an unknown key, ``StoreError`` for the caller's back-off."""
        if not key.startswith(LEASE_PREFIX) or key.count("/") != 2:
            raise ValueError(f"unknown work-queue key {key!r}")
        if key in self._running:
            return
        namespace, name = key[len(LEASE_PREFIX) :].split("/")
        try:
            obj = await self._store.get(Kind.GPULEASE, name, namespace=namespace)
        except NotFound:
            return
        self._leases.put(obj)
        decision = runstatus.decide(obj, self._pods.values(), self._profiles, now=self._clock.now_utc())
        ref = ObjectRef.lease(namespace, name, (obj.get("metadata") or {}).get("uid"))
        if decision.action is Action.REFUSE:
            assert decision.status is not None
            await self._write(ref, decision.status)
            self.metrics.runs.labels(outcome="refused").inc()
            log.warning("orchestration refused", extra=ctx(lease=key, reason=decision.reason))
            await self._emit(ref, "OrchestrationRefused", decision.reason, warning=True)
        elif decision.action is Action.RUN:
            if self._group is None:
                raise RuntimeError("the controller is not running")
            self._running[key] = self._group.create_task(
                self._orchestrate(key, ref, decision), name=f"orchestrate/{namespace}/{name}"
            )
        elif decision.action is Action.WAIT:
            log.debug("orchestration waits", extra=ctx(lease=key, reason=decision.reason))

    # ------------------------------------------------------------------ a run

    async def _orchestrate(self, key: str, ref: ObjectRef, decision: Decision) -> None:
        assert decision.status is not None and decision.profile is not None and decision.job is not None
        status = decision.status
        done: set[tuple[str, str]] = set(status.done)
        started = self._clock.now()
        self.metrics.in_progress.inc()
        try:
            await self._write(ref, status)
            verb = "resumed" if decision.resumed else "started"
            message = (
                f"{decision.profile.name} profile {verb} for {decision.job.namespace}/{decision.job.owner} "
                f"(pods per role: {_per_role(status.replicas)})"
            )
            log.info(
                "orchestration " + verb,
                extra=ctx(lease=key, profile=decision.profile.name, starts=status.starts),
            )
            await self._emit(
                ref, "OrchestrationResumed" if decision.resumed else "OrchestrationStarted", message
            )

            # its own task: the readiness watch and the progress writer are cancelled when it
            # ends, and coverage.py 7 on CPython 3.11 stops tracing a coroutine that awaited a
            # cancelled task that way, so the recording below stays measured in this one
            result = await asyncio.create_task(
                self._execute(key, ref, decision, status, done), name=f"{key}/dag"
            )
            final = status.finished(result, now=self._clock.now_utc())
            await self._write(ref, final)
            outcome = "succeeded" if final.phase is RunPhase.SUCCEEDED else "failed"
            self.metrics.runs.labels(outcome=outcome).inc()
            self.metrics.seconds.observe(max(0.0, self._clock.now() - started))
            for command in final.commands.values():
                self.metrics.commands.labels(state=command.state).inc()
            log.log(
                logging.INFO if outcome == "succeeded" else logging.WARNING,
                "orchestration " + outcome,
                extra=ctx(lease=key, profile=decision.profile.name, detail=final.message),
            )
            await self._emit(
                ref,
                "OrchestrationSucceeded" if outcome == "succeeded" else "OrchestrationFailed",
                f"{decision.profile.name}: {final.message}",
                warning=outcome == "failed",
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a store that keeps failing: the next reconcile resumes the run
            log.warning("orchestration run stopped; will resume", extra=ctx(lease=key, error=str(exc)))
            self._queue.add_after(key, self._settings.lease.retry_max_seconds)
        finally:
            self.metrics.in_progress.dec()
            self._running.pop(key, None)

    async def _execute(
        self,
        key: str,
        ref: ObjectRef,
        decision: Decision,
        status: OrchestrationStatus,
        done: set[tuple[str, str]],
    ) -> RunResult:
        """Run the DAG with the job's readiness snapshot, writing each succeeded step into
        ``done`` and the annotation as it happens."""
        assert decision.profile is not None and decision.job is not None
        dirty = asyncio.Event()

        def on_done(command: str, uid: str) -> None:
            done.add((command, uid))
            dirty.set()

        async def record_progress() -> None:
            while True:
                await dirty.wait()
                dirty.clear()
                await self._write(ref, status.model_copy(update={"done": tuple(sorted(done))}))

        watch = ReadinessWatch(
            self._store,
            namespace=decision.job.namespace,
            owner=decision.job.owner,
            roles=decision.profile.roles,
        )
        runner = Runner(
            dagmod.build(decision.profile),
            executor=self._executor,
            snapshots=watch,
            clock=self._clock,
            policy=self._policy,
            on_done=on_done,
        )
        async with watch.running(), tasks.running(record_progress(), name=f"{key}/progress"):
            return await runner.run(decision.job, done=frozenset(done))

    # ------------------------------------------------------------------ writes

    async def _write(self, ref: ObjectRef, status: OrchestrationStatus) -> None:
        """Merge-patch the annotation; retried on store errors (0.2 s doubling), then raised."""
        patch = {"metadata": {"annotations": {keys.ANN_ORCHESTRATION_STATUS: status.render()}}}
        backoff = Backoff(initial=0.2, maximum=5.0, factor=2.0, jitter=0.0)
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                new = await self._store.patch(Kind.GPULEASE, ref.name, patch, namespace=ref.namespace)
            except NotFound:
                return  # the lease is gone: nothing to record on
            except StoreError:
                if attempt == WRITE_ATTEMPTS:
                    raise
                await self._clock.wait(asyncio.Event(), backoff.delay(attempt))
            else:
                self._leases.put(new)
                return

    async def _emit(self, ref: ObjectRef, reason: str, message: str, *, warning: bool = False) -> None:
        """Create an Event; a failure is logged (Events are best effort), never raised."""
        event = event_object(
            ref,
            reason,
            message=message,
            type=EventType.WARNING if warning else EventType.NORMAL,
            now=self._clock.now_utc(),
            instance=self._instance,
        )
        event["source"] = {"component": COMPONENT}
        event["reportingComponent"] = COMPONENT
        try:
            await self._store.create(Kind.EVENT, event)
        except Exception as exc:
            log.warning("event not recorded", extra=ctx(reason=reason, object=ref.name, error=str(exc)))


def _per_role(replicas: Mapping[str, int]) -> str:
    return ", ".join(f"{role}={n}" for role, n in sorted(replicas.items())) or "none"


# --------------------------------------------------------------------------- wiring


async def open_executor(settings: Settings) -> ClosableExecutor | None:
    """The executor ``settings.orchestrator.executor`` names, or None for ``none``. Raises
    ``StoreError`` when the Kubernetes configuration cannot be loaded."""
    kind = settings.orchestrator.executor
    if kind == "cri":
        return CriExecutor(settings.orchestrator.cri_endpoint)
    if kind == "kubernetes":
        configuration = await kube_auth.load_configuration(settings.store.kubeconfig)
        return KubeExecutor(configuration)
    return None


async def serve(
    controller: RelaunchController,
    settings: Settings,
    *,
    store: Store,
    instance: str,
    elector: LeaderElector | None = None,
) -> None:
    """Run ``controller`` until cancelled; with ``settings.lease.leader_election`` only while
    this replica leads (sharing ``elector`` when given, else running its own)."""
    await run_leader_only(
        controller.run,
        settings.lease,
        store=store,
        instance=instance,
        name="orchestrate-controller",
        elector=elector,
    )


RELAUNCH_CONTROLLER: Final = web.AppKey("relaunch_controller", RelaunchController)
"""Where :func:`cleanup_ctx` puts the controller."""


def cleanup_ctx(
    settings: Settings,
    store: Store,
    *,
    registry: CollectorRegistry,
    clock: Clock | None = None,
    instance: str | None = None,
    elector: LeaderElector | None = None,
    executor: Executor | None = None,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """An aiohttp cleanup context running the controller (see :func:`serve`) as the task
    ``orchestrate-controller``; nothing when ``settings.lease.enabled`` is false or no executor
    is configured (``orchestrator.executor: none``). ``executor``: use this one (tests)
    instead of opening the configured one."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        if not settings.lease.enabled:
            yield
            return
        async with contextlib.AsyncExitStack() as stack:
            chosen = executor
            if chosen is None:
                opened = await open_executor(settings)
                if opened is not None:
                    stack.push_async_callback(opened.close)
                chosen = opened
            if chosen is None:
                yield
                return
            name = instance or socket.gethostname()
            controller = RelaunchController(
                settings, store, executor=chosen, registry=registry, clock=clock, instance=name
            )
            app[RELAUNCH_CONTROLLER] = controller
            work = serve(controller, settings, store=store, instance=name, elector=elector)
            async with tasks.running(work, name="orchestrate-controller"):
                yield

    return context
