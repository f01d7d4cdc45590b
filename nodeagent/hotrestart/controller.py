"""The hot-restart controller: watches this node's pods and reconciles their
``flexlease.io/hot-restart`` requests (WeFlex §3.3, "Transforming K8s for In-Situ Restart").

Level-triggered (OpenKruise's ``containerrecreate`` daemon controller): an informer over the
pods with ``spec.nodeName`` = this node only enqueues keys; :meth:`HotRestartController.reconcile`
re-reads the pod from the store, reads the pod's sandbox and containers from CRI, asks
:func:`~nodeagent.hotrestart.decide.decide`, and writes the outcome to
``flexlease.io/hot-restart-status`` with a JSON merge patch of the pod's annotations.

Write order makes every step resumable: ``InProgress`` (with the container being replaced)
is written before anything is touched; the final status after. When containerd is
unavailable (``CriUnavailable``) or a store write fails, the key is retried with back-off;
the next reconcile resumes from what CRI shows, and a final status whose write failed is
kept in memory and written again without redoing the work.

For the ``kubelet`` strategy the controller also writes the pod spec's container image (a
JSON merge patch of ``spec.containers`` with the pod's ``resourceVersion`` as precondition:
the agent's RBAC needs ``patch`` on pods, which it has for the status annotation), and reads
kubelet's container status from its own pod watch (no API call) while it waits. Refusals
(``direct`` on a kubelet's sandbox, a same-image restart of an ``OnFailure``/``Never`` pod, …)
and failures are also recorded as Warning Events on the pod (``HotRestartRefused``,
``HotRestartFailed``).

**Undo.** A kubelet restart that fails after the spec was patched is reported ``Failed`` at
once, with ``rollback: {phase: InProgress, image: <previousSpecImage>}``; then the previous
image is written back and kubelet's restart of it confirmed, and the status written again
with the rollback's result (``rollback=False``: reported only). A rollback under way when the
agent stopped is resumed by the next reconcile; so is a replacement found failed on resuming.
The direct strategy rolls back inside the restarter.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram

from flexlease import errors
from flexlease.api import keys
from flexlease.logging import ctx
from flexlease.store.base import EventType, JsonObj, Kind, Selector, Store, WatchEvent
from flexlease.store.informer import Backoff, Informer, ObjectKey, object_key
from flexlease.store.kube_util import EventRecorder
from nodeagent.cri.client import (
    LABEL_POD_UID,
    ContainerInfo,
    ContainerState,
    ImageInfo,
    ImageService,
    RuntimeService,
    SandboxState,
)
from nodeagent.hotrestart.decide import (
    Adopt,
    Fail,
    PodFacts,
    Restart,
    RollBack,
    RuntimeView,
    Skip,
    decide,
)
from nodeagent.hotrestart.kubelet import container_status, image_patch, restart_policy, spec_image
from nodeagent.hotrestart.model import (
    HotRestartRequest,
    HotRestartStatus,
    Phase,
    RollbackStatus,
    Strategy,
    parse_request,
    parse_status,
)
from nodeagent.hotrestart.queue import WorkQueue
from nodeagent.hotrestart.restarter import HotRestarter, Outcome, Progress, Rollback

log = logging.getLogger(__name__)

_STATUS_WRITE_ATTEMPTS = 3

HOT_RESTARTS: Final = "flexlease_hot_restarts"
HOT_RESTART_SECONDS: Final = "flexlease_hot_restart_seconds"


class HotRestartMetrics:
    """Hot-restart outcomes and durations (prefix ``flexlease_``, injected registry):
    ``flexlease_hot_restarts_total{outcome=succeeded|failed}`` and
    ``flexlease_hot_restart_seconds{step=pull|stop|start|total}``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.restarts = Counter(HOT_RESTARTS, "Hot restarts by outcome.", ["outcome"], registry=registry)
        for outcome in ("succeeded", "failed"):
            self.restarts.labels(outcome=outcome)
        self.seconds = Histogram(
            HOT_RESTART_SECONDS,
            "Hot restart durations by step (pull, stop, start) and in total, seconds.",
            ["step"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=registry,
        )
        for step in ("pull", "stop", "start", "total"):
            self.seconds.labels(step=step)

    def observe(self, outcome: Outcome) -> None:
        self.restarts.labels(outcome="succeeded" if outcome.succeeded else "failed").inc()
        t = outcome.timings
        for step, value in (
            ("pull", t.pull),
            ("stop", t.stop),
            ("start", t.start),
            ("total", outcome.total_seconds),
        ):
            self.seconds.labels(step=step).observe(value)


RETRY_BACKOFF = Backoff(initial=0.5, maximum=30.0)


class RestartStaging(Protocol):
    """Streaming-data staging around a hot restart (:mod:`nodeagent.staging`): ``begin``
    starts staging the pod's live input before the restart and returns what to call once the
    restart is over (``None``: the pod is not staged). It never raises."""

    async def begin(self, pod: JsonObj, *, image: str) -> Callable[[], None] | None: ...


def _annotations(pod: JsonObj) -> dict[str, str]:
    return dict((pod.get("metadata") or {}).get("annotations") or {})


def _running(containers: tuple[ContainerInfo, ...]) -> list[ContainerInfo]:
    """The running ones, oldest attempt first."""
    return sorted((c for c in containers if c.state is ContainerState.RUNNING), key=lambda c: c.attempt)


def _rollback_status(back: Rollback | None) -> RollbackStatus | None:
    """The status of a rollback the restarter did itself (direct strategy)."""
    if back is None:
        return None
    ran = back.container
    return RollbackStatus(
        phase=Phase.SUCCEEDED if back.succeeded else Phase.FAILED,
        image=back.image,
        container_id=ran.id if ran is not None else None,
        attempt=ran.attempt if ran is not None else None,
        seconds=round(back.seconds, 4),
        message=back.message or None,
    )


def pending_request(pod: JsonObj) -> bool:
    """Whether the pod carries a hot-restart request without a final status for its id
    (cheap pre-check on watch events; reconcile decides for real)."""
    ann = _annotations(pod)
    raw = ann.get(keys.ANN_HOT_RESTART)
    if not raw:
        return False
    try:
        request = parse_request(raw)
    except errors.PodSpecError:
        status = parse_status(ann.get(keys.ANN_HOT_RESTART_STATUS))
        return status is None or status.id != ""
    status = parse_status(ann.get(keys.ANN_HOT_RESTART_STATUS))
    return status is None or status.id != request.id or not status.phase.final or status.rolling_back


class HotRestartController:
    """Reconciles hot-restart requests of the pods bound to ``node``.

    ``workers``: reconciles running at once (different pods). ``backoff``: retry delays for
    keys whose reconcile hit an unavailable runtime or a failed store write.
    ``default_strategy``: for requests that name none; None picks by the sandbox's owner
    (kubelet's → ``kubelet``, ``flexlease.io/no-kubelet`` → ``direct``). ``images``: the CRI
    ImageService (default ``runtime``). ``events``: where refusals and failures are recorded.
    ``rollback``: whether a kubelet restart that failed after the spec patch is undone (the
    previous image written back), and a failed replacement found on resuming too.
    """

    def __init__(
        self,
        store: Store,
        runtime: RuntimeService,
        restarter: HotRestarter,
        *,
        node: str,
        default_strategy: Strategy | None,
        workers: int = 4,
        images: ImageService | None = None,
        events: EventRecorder | None = None,
        backoff: Backoff = RETRY_BACKOFF,
        metrics: HotRestartMetrics | None = None,
        staging: RestartStaging | None = None,
        rollback: bool = True,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if not node:
            raise errors.RequestError("the hot-restart controller needs the node name")
        self._store = store
        self._runtime = runtime
        self._restarter = restarter
        if images is None and not isinstance(runtime, ImageService):
            raise errors.RequestError("the hot-restart controller needs a CRI ImageService")
        self._images: ImageService = images if images is not None else runtime  # type: ignore[assignment]
        self._events = events
        self.node = node
        self._strategy = default_strategy
        self._workers = workers
        self._backoff = backoff
        self._now = now
        self._metrics = metrics
        self._staging = staging
        self._rollback = rollback
        self._queue: WorkQueue[ObjectKey] = WorkQueue()
        self._failures: dict[ObjectKey, int] = {}
        self._unwritten: dict[ObjectKey, HotRestartStatus] = {}
        self._informer = Informer(
            store,
            Kind.POD,
            handler=self._on_event,
            selector=Selector(fields={"spec.nodeName": node}),
            name=f"hotrestart-pods:{node}",
        )

    @property
    def listed(self) -> asyncio.Event:
        """Set once this node's pods have been listed."""
        return self._informer.listed

    def ready(self) -> bool:
        """Ready once this node's pods have been listed."""
        return self._informer.listed.is_set()

    async def run(self) -> None:
        """Watch and reconcile until cancelled."""
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._informer.run(), name=self._informer.name)
                for i in range(self._workers):
                    tg.create_task(self._work(), name=f"hotrestart-worker-{i}")
        finally:
            self._queue.close()

    async def _on_event(self, event: WatchEvent) -> None:
        key = object_key(event.object)
        if event.type is EventType.DELETED:
            self._failures.pop(key, None)
            self._unwritten.pop(key, None)
            return
        if pending_request(event.object):
            self._queue.add(key)

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            try:
                await self.reconcile(*key)
            except (errors.CriUnavailable, errors.StoreError) as exc:
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                delay = self._backoff.delay(failures)
                log.warning(
                    "hot restart reconcile failed; retrying",
                    extra=ctx(pod="/".join(key), node=self.node, error=str(exc), retry_in=round(delay, 2)),
                )
                self._queue.add_after(key, delay)
            else:
                self._failures.pop(key, None)
            finally:
                self._queue.done(key)

    async def reconcile(self, namespace: str, name: str) -> None:
        """Bring one pod's hot-restart status up to date with its request (idempotent).
        Raises ``CriUnavailable`` or ``StoreError`` when it should be retried."""
        key = (namespace, name)
        pod_name = f"{namespace}/{name}"
        try:
            pod = await self._store.get(Kind.POD, name, namespace=namespace)
        except errors.NotFound:
            self._unwritten.pop(key, None)
            return
        if (pod.get("spec") or {}).get("nodeName") != self.node:
            return
        ann = _annotations(pod)
        raw = ann.get(keys.ANN_HOT_RESTART)
        if not raw:
            return
        status = parse_status(ann.get(keys.ANN_HOT_RESTART_STATUS))
        try:
            request = parse_request(raw)
        except errors.PodSpecError as exc:
            if status is None or status.id != "" or status.message != str(exc):
                bad = HotRestartStatus(
                    id="",
                    phase=Phase.FAILED,
                    strategy=self._strategy or Strategy.KUBELET,
                    container="",
                    image="",
                    node=self.node,
                    message=str(exc),
                    finished_at=self._now(),
                )
                await self._write(namespace, name, bad)
                log.warning("malformed hot-restart request", extra=ctx(pod=pod_name, error=str(exc)))
            return

        unwritten = self._unwritten.get(key)
        if unwritten is not None and unwritten.id == request.id:
            await self._write(namespace, name, unwritten)
            self._unwritten.pop(key, None)
            return
        ours = status if status is not None and status.id == request.id else None
        if ours is not None and ours.phase.final and not ours.rolling_back:
            return

        uid = str((pod.get("metadata") or {}).get("uid") or "")
        view = await self._view(uid, request.container, request.image)
        facts = PodFacts(restart_policy(pod), spec_image(pod, request.container))
        decision = decide(
            request, status, view, default_strategy=self._strategy, pod=facts, rollback=self._rollback
        )
        base = self._base_status(request, status, view)
        if isinstance(decision, Skip):
            return
        if isinstance(decision, Fail) and ours is not None and ours.rolling_back:
            assert ours.rollback is not None
            rollback = ours.rollback.model_copy(update={"phase": Phase.FAILED, "message": decision.message})
            await self._write_final(
                key, ours.model_copy(update={"rollback": rollback, "finished_at": self._now()})
            )
            log.warning("hot restart rollback failed", extra=ctx(pod=pod_name, reason=decision.message))
            return
        if isinstance(decision, RollBack):
            assert ours is not None  # a rollback is only decided for this request's status
            await self._resume_rollback(key, decision, ours, pod, request, pod_name=pod_name)
            return
        if isinstance(decision, Fail):
            log.warning(
                "hot restart refused" if decision.refused else "hot restart failed",
                extra=ctx(pod=pod_name, reason=decision.message),
            )
            running = _running(view.containers)
            failed = base.model_copy(
                update={
                    "phase": Phase.FAILED,
                    "message": decision.message,
                    "container_id": running[-1].id if running else None,
                    "finished_at": self._now(),
                }
            )
            await self._write(namespace, name, failed)
            await self._event(pod, "HotRestartRefused" if decision.refused else "HotRestartFailed", failed)
            return
        if isinstance(decision, Adopt):
            adopted = await self._adopted(decision, base)
            await self._write(namespace, name, adopted)
            log.info("hot restart adopted", extra=ctx(pod=pod_name, container_id=decision.container.id))
            return
        await self._restart(key, decision, base, pod, request, pod_name=pod_name)

    async def _restart(
        self,
        key: ObjectKey,
        plan: Restart,
        base: HotRestartStatus,
        pod: JsonObj,
        request: HotRestartRequest,
        *,
        pod_name: str,
    ) -> None:
        container, checkpoint = request.container, request.checkpoint
        previous_spec = base.previous_spec_image
        if previous_spec is None and plan.strategy is Strategy.KUBELET:
            previous_spec = spec_image(pod, container)
        in_progress = base.model_copy(
            update={
                "phase": Phase.IN_PROGRESS,
                "strategy": plan.strategy,
                "spec_image": plan.spec_image,
                "previous_spec_image": previous_spec,
                "previous_container_id": base.previous_container_id or plan.old.id,
                "previous_attempt": base.previous_attempt
                if base.previous_attempt is not None
                else plan.old.attempt,
                "attempt": plan.attempt,
                "started_at": base.started_at or self._now(),
                "message": None,
            }
        )
        await self._write(*key, in_progress)  # nothing is touched unless this write succeeded

        restarted = await self._staging.begin(pod, image=plan.image) if self._staging is not None else None

        async def patch_spec(image: str) -> None:
            await self._patch_image(*key, container, image)

        async def progress(done: Progress) -> None:
            nonlocal in_progress
            in_progress = in_progress.model_copy(
                update={
                    "pull_seconds": done.pull_seconds,
                    "image_cached": done.image_cached,
                    "image_id": done.image_id or None,
                    "prelaunch": done.prelaunch,
                }
            )
            await self._write(*key, in_progress)  # recorded for a resumed restart

        def kubelet_view() -> Mapping[str, Any] | None:
            return container_status(self._informer.get(key[1], namespace=key[0]), container)

        outcome = await self._restarter.execute(
            plan,
            pod=pod_name,
            patch_spec=patch_spec,
            checkpoint=checkpoint,
            progress=progress,
            container_status=kubelet_view,
        )
        if restarted is not None:
            restarted()
        if self._metrics is not None:
            self._metrics.observe(outcome)
        final = await self._confirm(self._final(in_progress, outcome), plan)
        if outcome.spec_patched and self._rollback and final.previous_spec_image:
            final = final.model_copy(
                update={"rollback": RollbackStatus(phase=Phase.IN_PROGRESS, image=final.previous_spec_image)}
            )
            await self._write_final(key, final)  # the failure, reported at once
            await self._event(pod, "HotRestartFailed", final)
            final = await self._roll_back_kubelet(
                key, final, sandbox_id=plan.sandbox_id, old_exit_ns=outcome.old_exit_ns, pod_name=pod_name
            )
            await self._write_final(key, final)
            return
        await self._write_final(key, final)
        if final.phase is Phase.FAILED:
            await self._event(pod, "HotRestartFailed", final)

    async def _write_final(self, key: ObjectKey, final: HotRestartStatus) -> None:
        """Write a final status; kept in memory until written (a failed write is retried by
        the next reconcile without redoing the work). Raises ``StoreError``."""
        self._unwritten[key] = final
        await self._write(*key, final)
        self._unwritten.pop(key, None)

    async def _roll_back_kubelet(
        self, key: ObjectKey, failed: HotRestartStatus, *, sandbox_id: str, old_exit_ns: int, pod_name: str
    ) -> HotRestartStatus:
        """Put ``failed.rollback.image`` back into the pod spec and confirm kubelet runs it;
        ``failed`` with the rollback's result."""
        assert failed.rollback is not None

        async def patch_spec(image: str) -> None:
            await self._patch_image(*key, failed.container, image)

        back = await self._restarter.roll_back_kubelet(
            sandbox_id,
            failed.container,
            image=failed.rollback.image,
            previous_attempt=failed.previous_attempt or 0,
            patch_spec=patch_spec,
            pod=pod_name,
        )
        return await self._rolled_back(failed, back, old_exit_ns=old_exit_ns, pod_name=pod_name)

    async def _rolled_back(
        self, failed: HotRestartStatus, back: Rollback, *, old_exit_ns: int, pod_name: str
    ) -> HotRestartStatus:
        """``failed`` with the rollback's result: ``rollback`` ended, and ``containerId``,
        ``attempt`` and ``pauseSeconds`` (old exit → the rolled-back container's start) of
        the container now running."""
        ran = back.container
        if not back.succeeded:
            log.error(
                "hot restart rollback failed; the pod is left as it is",
                extra=ctx(
                    pod=pod_name,
                    node=self.node,
                    container=failed.container,
                    request=failed.id,
                    image=back.image,
                    error=back.message,
                ),
            )
        update: dict[str, Any] = {"rollback": _rollback_status(back), "finished_at": self._now()}
        if ran is not None:
            if ran.id == failed.previous_container_id:
                pause: float | None = 0.0  # kubelet never stopped it: the job never paused
            else:
                try:
                    pause = await self._restarter.pause(
                        failed.previous_container_id or "", ran, old_exit_ns=old_exit_ns
                    )
                except errors.CriError:
                    pause = None
            update.update(
                container_id=ran.id,
                attempt=ran.attempt,
                pause_seconds=round(pause, 4) if pause is not None else failed.pause_seconds,
            )
        return failed.model_copy(update=update)

    async def _resume_rollback(
        self,
        key: ObjectKey,
        decision: RollBack,
        ours: HotRestartStatus,
        pod: JsonObj,
        request: HotRestartRequest,
        *,
        pod_name: str,
    ) -> None:
        """A failed replacement found on resuming (report it, then undo it), or a rollback
        that was under way when the agent stopped (finish it)."""
        failed = ours
        if not ours.rolling_back:
            failed = ours.model_copy(
                update={
                    "phase": Phase.FAILED,
                    "message": decision.reason,
                    "attempt": decision.attempt - 1,
                    "container_id": None,
                    "rollback": RollbackStatus(phase=Phase.IN_PROGRESS, image=decision.image),
                    "finished_at": self._now(),
                }
            )
            await self._write_final(key, failed)
            await self._event(pod, "HotRestartFailed", failed)
        log.info(
            "resuming a hot restart's rollback",
            extra=ctx(pod=pod_name, container=request.container, image=decision.image),
        )
        if decision.strategy is Strategy.KUBELET:
            final = await self._roll_back_kubelet(
                key, failed, sandbox_id=decision.sandbox_id, old_exit_ns=0, pod_name=pod_name
            )
        else:
            back = await self._restarter.roll_back_direct(
                decision.sandbox_id, decision.old, attempt=decision.attempt, pod=pod_name
            )
            final = await self._rolled_back(failed, back, old_exit_ns=0, pod_name=pod_name)
        await self._write_final(key, final)

    async def _adopted(self, decision: Adopt, base: HotRestartStatus) -> HotRestartStatus:
        """The final status of a restart whose replacement already ran when this reconcile
        began (the agent stopped mid-way): every field a normal one has, the timings the
        interrupted run could not measure derived from CRI timestamps and the recorded
        ``startedAt`` and ``pullSeconds``."""
        ours, new = decision.previous, decision.container
        now = self._now()
        started = ours.started_at
        pulled_at = started.timestamp() + (ours.pull_seconds or 0.0) if started is not None else None
        try:
            timings, pause = await self._restarter.resumed(
                ours.strategy, ours.previous_container_id or "", new, pulled_at=pulled_at
            )
        except errors.CriError:
            timings, pause = None, None
        return base.model_copy(
            update={
                "phase": Phase.SUCCEEDED,
                "container_id": new.id,
                "attempt": new.attempt,
                "image_id": ours.image_id or base.image_id,
                "image_cached": ours.image_cached,
                "prelaunch": ours.prelaunch,
                "pull_seconds": ours.pull_seconds if ours.pull_seconds is not None else 0.0,
                "stop_seconds": round(timings.stop, 4) if timings is not None else None,
                "start_seconds": round(timings.start, 4) if timings is not None else None,
                "pause_seconds": round(pause, 4) if pause is not None else None,
                "total_seconds": round((now - started).total_seconds(), 4) if started is not None else None,
                "message": "the replacement was already running (resumed after an interruption)",
                "finished_at": now,
            }
        )

    async def _confirm(self, final: HotRestartStatus, plan: Restart) -> HotRestartStatus:
        """Name the container that actually runs: the newest running one of that name in the
        sandbox; two or more running (a replacement raced by someone else's) fail the status."""
        try:
            found = await self._runtime.list_containers(sandbox_id=plan.sandbox_id)
        except errors.CriError:
            return final
        mine = tuple(c for c in found if c.name == plan.old.name)
        running = _running(mine)
        if not running:
            if final.phase is not Phase.FAILED:
                return final
            tried = max((c.attempt for c in mine), default=final.attempt)  # every failed try counted
            return final.model_copy(update={"container_id": None, "attempt": tried})
        newest = running[-1]
        if len(running) > 1:
            ids = ", ".join(f"{c.id} (attempt {c.attempt})" for c in running)
            return final.model_copy(
                update={
                    "phase": Phase.FAILED,
                    "container_id": newest.id,
                    "message": f"{len(running)} containers named {plan.old.name!r} run in sandbox "
                    f"{plan.sandbox_id}: {ids}",
                }
            )
        return final.model_copy(update={"container_id": newest.id, "attempt": newest.attempt})

    async def _patch_image(self, namespace: str, name: str, container: str, image: str) -> None:
        """Set ``container``'s image in the pod spec (no-op when it is already ``image``), with
        the pod's resourceVersion as precondition; re-read and retry on ``Conflict``. Raises
        ``StoreError`` (``PodSpecError`` when the spec has no such container)."""
        for attempt in range(1, _STATUS_WRITE_ATTEMPTS + 1):
            pod = await self._store.get(Kind.POD, name, namespace=namespace)
            if spec_image(pod, container) == image:
                return
            try:
                patch = image_patch(pod, container, image)
            except KeyError:
                raise errors.PodSpecError(f"the pod spec has no container {container!r}") from None
            rv = str((pod.get("metadata") or {}).get("resourceVersion") or "") or None
            try:
                await self._store.patch(Kind.POD, name, patch, namespace=namespace, resource_version=rv)
                return
            except errors.Conflict:
                if attempt == _STATUS_WRITE_ATTEMPTS:
                    raise

    async def _event(self, pod: JsonObj, reason: str, status: HotRestartStatus) -> None:
        if self._events is None:
            return
        await self._events.record(
            pod,
            type="Warning",
            reason=reason,
            message=f"hot restart {status.id!r} of {status.container!r}: {status.message}",
            action="HotRestart",
        )

    def _final(self, in_progress: HotRestartStatus, outcome: Outcome) -> HotRestartStatus:
        return in_progress.model_copy(
            update={
                "phase": Phase.SUCCEEDED if outcome.succeeded else Phase.FAILED,
                "container_id": outcome.container_id,
                "attempt": outcome.attempt if outcome.attempt is not None else in_progress.attempt,
                "image_cached": outcome.image_cached,
                "pull_seconds": round(outcome.timings.pull, 4),
                "stop_seconds": round(outcome.timings.stop, 4),
                "start_seconds": round(outcome.timings.start, 4),
                "pause_seconds": round(outcome.pause_seconds, 4)
                if outcome.pause_seconds is not None
                else None,
                "image_id": outcome.image_id or in_progress.image_id,
                "prelaunch": outcome.prelaunch or in_progress.prelaunch,
                "total_seconds": round(outcome.total_seconds, 4),
                "message": outcome.message or None,
                "rollback": _rollback_status(outcome.rollback),
                "finished_at": self._now(),
            }
        )

    def _base_status(
        self, request: HotRestartRequest, status: HotRestartStatus | None, view: RuntimeView
    ) -> HotRestartStatus:
        ours = status if status is not None and status.id == request.id else None
        sandbox = view.sandbox
        return HotRestartStatus(
            id=request.id,
            phase=Phase.IN_PROGRESS,
            strategy=request.strategy
            or (ours.strategy if ours is not None else None)
            or self._strategy
            or Strategy.KUBELET,
            container=request.container,
            image=request.image,
            node=self.node,
            sandbox_id=sandbox.id if sandbox is not None else None,
            pod_ip=sandbox.ip if sandbox is not None else None,
            previous_container_id=ours.previous_container_id if ours is not None else None,
            previous_attempt=ours.previous_attempt if ours is not None else None,
            spec_image=ours.spec_image if ours is not None else None,
            previous_spec_image=ours.previous_spec_image if ours is not None else None,
            image_id=(ours.image_id if ours is not None else None) or (view.image.id if view.image else None),
            started_at=ours.started_at if ours is not None else None,
        )

    async def _view(self, pod_uid: str, container: str, image: str) -> RuntimeView:
        resolved = await self._image(image)
        sandboxes = await self._runtime.list_pod_sandboxes(
            labels={LABEL_POD_UID: pod_uid}, state=SandboxState.READY
        )
        if not sandboxes:
            return RuntimeView(None, (), resolved)
        newest = max(sandboxes, key=lambda s: s.created_at_ns)
        sandbox = await self._runtime.pod_sandbox_status(newest.id)
        listed = [
            c for c in await self._runtime.list_containers(sandbox_id=sandbox.id) if c.name == container
        ]
        detailed = []
        for listed_container in listed:
            c = listed_container
            if c.state is ContainerState.EXITED:  # ListContainers omits the exit details
                try:
                    c = await self._runtime.container_status(c.id)
                except errors.CriNotFound:
                    continue
            detailed.append(c)
        return RuntimeView(sandbox, tuple(detailed), resolved)

    async def _image(self, image: str) -> ImageInfo | None:
        """CRI ImageStatus of ``image``; None when absent or the reference is refused."""
        try:
            return await self._images.image_status(image)
        except errors.CriUnavailable:
            raise
        except errors.CriError:
            return None

    async def _write(self, namespace: str, name: str, status: HotRestartStatus) -> None:
        """Merge-patch the status annotation, retrying store failures a few times. Raises
        ``StoreError`` when it still fails (``NotFound``: the pod is gone)."""
        patch = {"metadata": {"annotations": {keys.ANN_HOT_RESTART_STATUS: status.render()}}}
        for attempt in range(1, _STATUS_WRITE_ATTEMPTS + 1):
            try:
                await self._store.patch(Kind.POD, name, patch, namespace=namespace)
                return
            except errors.NotFound:
                raise
            except errors.StoreError:
                if attempt == _STATUS_WRITE_ATTEMPTS:
                    raise
                await asyncio.sleep(self._backoff.delay(attempt))
