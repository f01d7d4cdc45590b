"""Carry out a hot-restart plan on the CRI runtime (the I/O half; the decision is
:mod:`nodeagent.hotrestart.decide`).

Both strategies start with the prelaunch (WeFlex §3.3), the old container still running: the
image is pulled through CRI and, when the request names a checkpoint, it is fetched into the
node's checkpoint cache at the same time (:func:`nodeagent.prelaunch.prelaunch`), with W
predicted and measured in the outcome. Nothing is touched unless the node is then ready.

Order, ``direct`` strategy (WeFlex §3.3, in-situ restart): pre-pull the image (old container
still running) → create the replacement in the same sandbox with attempt + 1 (still
running) → stop the old container (SIGTERM, grace period) → start the replacement → remove
the old container. The sandbox — pod UID, network namespace and IP, IPC, volumes, cgroup
parent — is never touched. A failure before the stop leaves the old container running; a
failed start (containerd's ``StartError``) rolls back by starting the old config again as
another attempt (:meth:`HotRestarter.roll_back_direct`; off with ``rollback=False``).

``kubelet`` strategy (a sandbox kubelet manages): pre-pull (old container still running) →
resolve the image through CRI ``ImageStatus`` → write the plan's ``spec_image`` into the pod
spec (the caller's ``patch_spec``) → wait for kubelet's in-place restart: a higher attempt of
the same container name, running, whose image ID or repo digest is the requested image's.
The agent stops nothing: kubelet kills the old container with the pod's grace period, as
for any spec change. ``pause`` is measured from CRI timestamps (the old container's
``finished_at`` to the replacement's ``started_at``). The wait ends early, as soon as the
replacement is seen to fail: a higher attempt that exited (``StartError``, exit code 128, a
crash), or, once the old container stopped, a waiting reason kubelet gives in the pod's
container status (``CrashLoopBackOff``, ``ErrImagePull``, ``ImagePullBackOff``,
``CreateContainerError``, ``CreateContainerConfigError``, ``RunContainerError``, …; the
caller's ``container_status``); otherwise after ``kubelet_wait_seconds``. The outcome then
says ``spec_patched``: the caller reports the failure and undoes it with
:meth:`HotRestarter.roll_back_kubelet` (the previous image written back, and kubelet's
restart of it confirmed the same way).

:class:`flexlease.errors.CriUnavailable` (containerd restarting or unreachable) propagates:
the caller retries later and :func:`~nodeagent.hotrestart.decide.decide` resumes from what
the runtime shows. Every other failure becomes a failed :class:`Outcome` with the reason.
``progress`` is told the prelaunch's result (pull time, image ID) before anything is touched,
so that the caller can record it for a resumed restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client import CollectorRegistry

from flexlease import errors
from flexlease.cri import api_pb2
from flexlease.logging import ctx
from nodeagent.cache.checkpoints import CheckpointCache
from nodeagent.cache.images import ImagePuller, PullResult
from nodeagent.cri.client import ContainerInfo, ContainerState, ImageInfo, RuntimeService
from nodeagent.hotrestart.decide import Restart, replacement_config
from nodeagent.hotrestart.kubelet import runs_image, waiting_failure
from nodeagent.hotrestart.model import CheckpointRef, PrelaunchStatus, Strategy
from nodeagent.prelaunch import Bandwidths, PrelaunchReport, prelaunch

log = logging.getLogger(__name__)

SpecPatcher = Callable[[str], Awaitable[None]]
"""Writes an image into the pod spec's container (kubelet strategy). Raises ``StoreError``."""

StatusReader = Callable[[], Mapping[str, Any] | None]
"""The pod's ``status.containerStatuses`` entry of the container, as last seen (kubelet
strategy; from the agent's pod watch, no API call)."""


@dataclass(frozen=True, slots=True)
class Progress:
    """The prelaunch's result, before anything is touched: seconds pulling, whether the image
    was already on the node, its image ID."""

    pull_seconds: float
    image_cached: bool
    image_id: str
    prelaunch: PrelaunchStatus | None = None


ProgressSink = Callable[[Progress], Awaitable[None]]
"""Told the :class:`Progress` once (raises ``StoreError`` when it cannot be recorded: the
restart then touches nothing and is retried)."""


@dataclass(frozen=True, slots=True)
class Rollback:
    """Result of a rollback: ``succeeded`` when ``container`` (running, the previous image) was
    seen; ``image`` what was put back; ``seconds`` spent; ``message`` why it failed."""

    succeeded: bool
    image: str
    container: ContainerInfo | None = None
    seconds: float = 0.0
    message: str = ""


@dataclass(frozen=True, slots=True)
class Timings:
    """Seconds spent pulling the image, stopping the old container, and creating+starting
    the replacement (kubelet strategy: ``stop`` is 0, the agent stops nothing; ``start`` is
    from the spec patch to kubelet's replacement running)."""

    pull: float = 0.0
    stop: float = 0.0
    start: float = 0.0


@dataclass(frozen=True, slots=True)
class Outcome:
    """Result of :meth:`HotRestarter.execute`."""

    succeeded: bool
    message: str = ""
    container_id: str | None = None
    attempt: int | None = None
    image_cached: bool | None = None
    timings: Timings = field(default_factory=Timings)
    total_seconds: float = 0.0
    pause_seconds: float | None = None
    image_id: str | None = None
    prelaunch: PrelaunchStatus | None = None
    spec_patched: bool = False
    """Failed after the pod spec's image was changed (kubelet): the caller undoes it."""
    rollback: Rollback | None = None
    """Direct: the rollback this restart did itself."""
    old_exit_ns: int = 0
    """When the old container exited (CRI ``finished_at``, ns), 0 when not seen: the start of
    the pause a rollback ends."""


class HotRestarter:
    """Executes :class:`~nodeagent.hotrestart.decide.Restart` plans.

    ``stop_timeout_seconds``: grace period of StopContainer. ``kubelet_wait_seconds``: how
    long the kubelet strategy waits for kubelet's replacement (or, rolling back, for the
    previous image) to run when no failure shows sooner; ``poll_seconds``: how often it
    looks. ``rollback``: whether the direct strategy starts the old container's config again
    when the replacement does not start. Image IDs are resolved through the puller's CRI
    ImageService (:attr:`ImagePuller.images`). ``checkpoints``: the node's checkpoint cache,
    for requests naming a checkpoint; ``bandwidths``: the assumed bandwidths W is predicted
    with.
    """

    def __init__(
        self,
        runtime: RuntimeService,
        puller: ImagePuller,
        *,
        checkpoints: CheckpointCache | None = None,
        bandwidths: Bandwidths | None = None,
        stop_timeout_seconds: int = 30,
        kubelet_wait_seconds: float = 120.0,
        poll_seconds: float = 0.2,
        rollback: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._runtime = runtime
        self._puller = puller
        self._images = puller.images
        self._checkpoints = checkpoints
        self._bandwidths = bandwidths or Bandwidths()
        self._stop_timeout = stop_timeout_seconds
        self._kubelet_wait = kubelet_wait_seconds
        self._poll = poll_seconds
        self._rollback_on = rollback
        self._clock = clock

    async def execute(
        self,
        plan: Restart,
        *,
        pod: str,
        patch_spec: SpecPatcher | None = None,
        checkpoint: CheckpointRef | None = None,
        progress: ProgressSink | None = None,
        container_status: StatusReader | None = None,
    ) -> Outcome:
        """Run ``plan`` for ``pod`` (``ns/name``, for logs); ``patch_spec`` writes the pod
        spec's image and ``container_status`` reads kubelet's view of the container (kubelet
        strategy). Raises ``CriUnavailable``, and ``StoreError`` from ``patch_spec`` or
        ``progress`` (retry: the plan resumes from what CRI shows). ``checkpoint``: fetched
        into the checkpoint cache alongside the pull. ``progress``: told the pull's result
        before anything is touched."""
        started = self._clock()
        log.info(
            "hot restart",
            extra=ctx(
                pod=pod,
                container=plan.old.name,
                image=plan.image,
                strategy=plan.strategy.value,
                attempt=plan.attempt,
                resume=plan.replacement is not None,
            ),
        )
        t0 = self._clock()
        report: PrelaunchStatus | None = None
        if checkpoint is None:
            try:
                pulled = await self._puller.ensure(plan.image, pod=pod)
            except errors.CriUnavailable:
                raise
            except errors.CriError as exc:
                return Outcome(
                    False, f"image pull failed (old container left running): {exc}", total_seconds=0.0
                )
        else:
            ready, report = await self._prelaunch(plan.image, checkpoint)
            if ready is None:
                return Outcome(
                    False,
                    f"prelaunch failed (old container left running): {report.error}",
                    total_seconds=self._clock() - started,
                    prelaunch=report,
                )
            pulled = ready
        pull = Timings(pull=self._clock() - t0)
        if progress is not None:
            await progress(Progress(round(pull.pull, 4), pulled.cached, pulled.image_ref, report))
        if plan.strategy is Strategy.KUBELET:
            outcome = await self._kubelet(plan, pull, patch_spec, container_status, pod=pod)
        else:
            outcome = await self._direct(plan, pull, pod=pod)
        outcome = replace(
            outcome,
            image_cached=pulled.cached,
            total_seconds=self._clock() - started,
            image_id=outcome.image_id or pulled.image_ref or None,
            prelaunch=report,
        )
        log.info(
            "hot restart succeeded" if outcome.succeeded else "hot restart failed",
            extra=ctx(
                pod=pod,
                container=plan.old.name,
                container_id=outcome.container_id,
                message=outcome.message or None,
                pull_seconds=round(outcome.timings.pull, 3),
                stop_seconds=round(outcome.timings.stop, 3),
                start_seconds=round(outcome.timings.start, 3),
                pause_seconds=round(outcome.pause_seconds, 3) if outcome.pause_seconds is not None else None,
            ),
        )
        return outcome

    async def _prelaunch(
        self, image: str, checkpoint: CheckpointRef
    ) -> tuple[PullResult | None, PrelaunchStatus]:
        """Pull ``image`` and fetch ``checkpoint`` at once; the pull's result (None when the
        node is not ready) and the report. Raises ``CriUnavailable`` when the runtime is away."""
        if self._checkpoints is None:
            return None, PrelaunchStatus(
                ready=False,
                elapsed_seconds=0.0,
                window_seconds=0.0,
                error="a checkpoint was requested but this agent has no checkpoint cache",
            )
        done: PrelaunchReport = await prelaunch(
            self._images,
            self._checkpoints,
            image=image,
            checkpoint_url=checkpoint.url,
            checkpoint_id=checkpoint.id,
            sha256=checkpoint.sha256,
            image_bytes=None,
            bandwidths=self._bandwidths,
            metrics_registry=CollectorRegistry(),
            puller=self._puller,
        )
        if not done.ready:
            await self._images.image_status(image)  # CriUnavailable: retry rather than fail
        status = PrelaunchStatus(
            ready=done.ready,
            ready_at=done.ready_at,
            elapsed_seconds=round(done.elapsed_seconds, 4),
            window_seconds=round(done.window.window_seconds, 4),
            measured_window_seconds=round(done.measured_window.window_seconds, 4)
            if done.measured_window is not None
            else None,
            image_cached=done.image.cached if done.image is not None else None,
            checkpoint_result=done.checkpoint.result if done.checkpoint is not None else None,
            error=done.error,
        )
        return (done.image if done.ready else None), status

    async def _stop(self, container_id: str) -> float:
        t0 = self._clock()
        await self._runtime.stop_container(container_id, timeout_seconds=self._stop_timeout)
        return self._clock() - t0

    async def _direct(self, plan: Restart, pull: Timings, *, pod: str) -> Outcome:
        old_config: api_pb2.ContainerConfig | None = None
        try:
            sandbox_config = await self._runtime.pod_sandbox_config(plan.sandbox_id)
            if plan.replacement is not None:
                new_id = plan.replacement.id
            else:
                old_config = await self._runtime.container_config(plan.old.id)
                config = replacement_config(old_config, image=plan.image, attempt=plan.attempt)
                t0 = self._clock()
                new_id = await self._runtime.create_container(plan.sandbox_id, config, sandbox_config)
                create_seconds = self._clock() - t0
        except errors.CriUnavailable:
            raise
        except errors.CriError as exc:
            return Outcome(
                False, f"cannot create the replacement (old container left running): {exc}", timings=pull
            )
        if plan.replacement is not None:
            create_seconds = 0.0

        try:
            stop_seconds = await self._stop(plan.old.id)
        except errors.CriUnavailable:
            raise
        except errors.CriNotFound:
            stop_seconds = 0.0  # gone already: nothing to stop
        except errors.CriError as exc:
            await self._remove_quietly(new_id, pod=pod)
            return Outcome(False, f"cannot stop the old container: {exc}", timings=pull)

        t0 = self._clock()
        try:
            await self._runtime.start_container(new_id)
        except errors.CriUnavailable:
            raise
        except errors.CriError as exc:
            timings = Timings(pull.pull, stop_seconds, create_seconds + self._clock() - t0)
            message = f"the replacement did not start: {exc}"
            if not self._rollback_on:
                return Outcome(False, f"{message}; not rolled back (rollback is off)", timings=timings)
            await self._remove_quietly(new_id, pod=pod)
            back = await self.roll_back_direct(
                plan.sandbox_id, plan.old, attempt=plan.attempt + 1, old_config=old_config, pod=pod
            )
            note = (
                f"rolled back to {back.image} as container {back.container.id}"
                if back.succeeded and back.container is not None
                else f"rollback to {back.image} failed too: {back.message}"
            )
            return Outcome(
                False,
                f"{message}; {note}",
                container_id=back.container.id if back.container is not None else None,
                attempt=back.container.attempt if back.container is not None else plan.attempt,
                timings=timings,
                pause_seconds=await self._pause(plan.old.id, back.container, fallback=None)
                if back.container is not None
                else None,
                rollback=back,
            )
        started_seconds = self._clock() - t0
        timings = Timings(pull.pull, stop_seconds, create_seconds + started_seconds)
        await self._remove_quietly(plan.old.id, pod=pod)
        return Outcome(
            True,
            container_id=new_id,
            attempt=plan.attempt,
            timings=timings,
            pause_seconds=stop_seconds + started_seconds,
        )

    async def roll_back_direct(
        self,
        sandbox_id: str,
        old: ContainerInfo | None,
        *,
        attempt: int,
        pod: str,
        old_config: api_pb2.ContainerConfig | None = None,
    ) -> Rollback:
        """Start ``old``'s config (``old_config`` when the caller has it) again in
        ``sandbox_id`` as ``attempt``: the undo of a direct restart whose replacement failed.
        Raises ``CriUnavailable`` (retry); other runtime errors make a failed result."""
        t0 = self._clock()
        image = old.image if old is not None else "the previous image"
        try:
            if old_config is None:
                if old is None:
                    return Rollback(False, image, message="the replaced container is gone")
                old_config = await self._runtime.container_config(old.id)
            image = old_config.image.image
            sandbox_config = await self._runtime.pod_sandbox_config(sandbox_id)
            config = replacement_config(old_config, image=image, attempt=attempt)
            rollback_id = await self._runtime.create_container(sandbox_id, config, sandbox_config)
            await self._runtime.start_container(rollback_id)
            started = await self._runtime.container_status(rollback_id)
        except errors.CriUnavailable:
            raise
        except errors.CriError as exc:
            return Rollback(False, image, seconds=self._clock() - t0, message=str(exc))
        log.info("hot restart rolled back", extra=ctx(pod=pod, container_id=rollback_id, image=image))
        return Rollback(True, image, started, self._clock() - t0)

    async def roll_back_kubelet(
        self,
        sandbox_id: str,
        container: str,
        *,
        image: str,
        previous_attempt: int,
        patch_spec: SpecPatcher,
        pod: str,
    ) -> Rollback:
        """Write ``image`` (the spec's image before the restart) back into the pod spec and
        wait, up to ``kubelet_wait_seconds``, for kubelet to run it: a running ``container``
        of at least ``previous_attempt`` whose image ID or repo digest is ``image``'s. Raises
        ``CriUnavailable`` and ``StoreError`` (retry)."""
        t0 = self._clock()
        try:
            info = await self._images.image_status(image)
        except errors.CriUnavailable:
            raise
        except errors.CriError:
            info = None
        await patch_spec(image)
        log.info(
            "pod spec image put back; waiting for kubelet",
            extra=ctx(pod=pod, container=container, image=image),
        )
        deadline = t0 + self._kubelet_wait
        while True:
            found = await self._runtime.list_containers(sandbox_id=sandbox_id)
            running = [
                c
                for c in found
                if c.name == container
                and c.attempt >= previous_attempt
                and c.state is ContainerState.RUNNING
                and (info is None or runs_image(c, info))
            ]
            if running:
                newest = max(running, key=lambda c: c.attempt)
                log.info("hot restart rolled back", extra=ctx(pod=pod, container_id=newest.id, image=image))
                return Rollback(True, image, newest, self._clock() - t0)
            if self._clock() >= deadline:
                return Rollback(
                    False,
                    image,
                    seconds=self._clock() - t0,
                    message=f"kubelet did not run {container!r} with {image} within {self._kubelet_wait:g} s",
                )
            await asyncio.sleep(self._poll)

    async def _remove_quietly(self, container_id: str, *, pod: str) -> None:
        try:
            await self._runtime.remove_container(container_id)
        except errors.CriError as exc:
            log.debug(
                "could not remove container", extra=ctx(pod=pod, container_id=container_id, error=str(exc))
            )

    async def _kubelet(
        self,
        plan: Restart,
        pull: Timings,
        patch_spec: SpecPatcher | None,
        container_status: StatusReader | None,
        *,
        pod: str,
    ) -> Outcome:
        if patch_spec is None or plan.spec_image is None:
            return Outcome(False, "the kubelet strategy needs the pod spec's image to patch", timings=pull)
        try:
            image = await self._images.image_status(plan.image)
        except errors.CriUnavailable:
            raise
        except errors.CriError as exc:
            return Outcome(
                False, f"cannot resolve {plan.image} (old container left running): {exc}", timings=pull
            )
        if image is None:
            return Outcome(False, f"{plan.image} is not on the node after the pull", timings=pull)
        baseline = container_status() if container_status is not None else None
        t0 = self._clock()
        try:
            await patch_spec(plan.spec_image)
        except errors.RequestError as exc:
            return Outcome(False, f"cannot patch the pod spec (nothing restarted): {exc}", timings=pull)
        log.info(
            "pod spec image patched; waiting for kubelet",
            extra=ctx(pod=pod, container=plan.old.name, spec_image=plan.spec_image, image_id=image.id),
        )
        watch = _KubeletWatch(self._runtime, plan, image, container_status, baseline)
        deadline = t0 + self._kubelet_wait
        while True:
            replacement = await watch.look()
            timings = Timings(pull.pull, 0.0, self._clock() - t0)
            if replacement is not None:
                if not runs_image(replacement, image):
                    return Outcome(
                        False,
                        f"kubelet started container {replacement.id} (attempt {replacement.attempt}) running "
                        f"{replacement.image_ref or replacement.image}, not the requested {plan.image} "
                        f"({image.id})",
                        container_id=replacement.id,
                        attempt=replacement.attempt,
                        timings=timings,
                        image_id=image.id,
                    )
                return Outcome(
                    True,
                    container_id=replacement.id,
                    attempt=replacement.attempt,
                    timings=timings,
                    pause_seconds=await self._pause(plan.old.id, replacement, fallback=timings.start),
                    image_id=image.id,
                )
            failure = watch.failure
            if failure is None and self._clock() >= deadline:
                failure = (
                    f"kubelet did not restart {plan.old.name!r} within {self._kubelet_wait:g} s of the pod "
                    f"spec's image being set to {plan.spec_image}"
                )
            if failure is not None:
                log.warning(
                    "kubelet's replacement failed",
                    extra=ctx(pod=pod, container=plan.old.name, reason=failure, attempt=watch.attempt),
                )
                return Outcome(
                    False,
                    failure,
                    attempt=watch.attempt or plan.attempt,
                    timings=timings,
                    image_id=image.id,
                    spec_patched=True,
                    old_exit_ns=watch.old_exit_ns,
                )
            await asyncio.sleep(self._poll)

    async def resumed(
        self, strategy: Strategy, old_id: str, new: ContainerInfo, *, pulled_at: float | None
    ) -> tuple[Timings, float | None]:
        """The stop/start timings and the pause of a restart whose replacement ``new`` already
        ran when the agent came back (it could not time them), from CRI timestamps and
        ``pulled_at`` (epoch seconds the pull ended, from the recorded status). kubelet: stop
        0, start = pull end → ``new`` started. direct: stop = pull end → old exited (the
        replacement's creation included), start = the pause. Unknown parts are 0. Raises
        ``CriUnavailable``."""
        started_ns = new.started_at_ns or (await self._runtime.container_status(new.id)).started_at_ns
        try:
            old_exit_ns = (await self._runtime.container_status(old_id)).finished_at_ns if old_id else 0
        except errors.CriNotFound:
            old_exit_ns = 0
        pause = max(0.0, (started_ns - old_exit_ns) / 1e9) if started_ns > 0 and old_exit_ns > 0 else None
        base = pulled_at if pulled_at is not None else 0.0
        if strategy is Strategy.KUBELET:
            start = max(0.0, started_ns / 1e9 - base) if started_ns > 0 and pulled_at is not None else 0.0
            return Timings(0.0, 0.0, start), pause
        stop = max(0.0, old_exit_ns / 1e9 - base) if old_exit_ns > 0 and pulled_at is not None else 0.0
        return Timings(0.0, stop, pause or 0.0), pause

    async def pause(self, old_id: str, new: ContainerInfo, *, old_exit_ns: int = 0) -> float | None:
        """Seconds from the old container's exit (``old_exit_ns`` when known, else its CRI
        status) to ``new``'s start (CRI timestamps); None when the runtime no longer reports
        either. Raises ``CriUnavailable``."""
        if old_exit_ns > 0:
            started = new.started_at_ns or (await self._runtime.container_status(new.id)).started_at_ns
            return max(0.0, (started - old_exit_ns) / 1e9) if started > 0 else None
        return await self._pause(old_id, new, fallback=None)

    async def _pause(self, old_id: str, new: ContainerInfo, *, fallback: float | None) -> float | None:
        """Seconds from the old container's exit to the replacement's start (CRI timestamps);
        ``fallback`` when the runtime no longer reports either."""
        try:
            old = await self._runtime.container_status(old_id)
            started = new.started_at_ns or (await self._runtime.container_status(new.id)).started_at_ns
        except errors.CriNotFound:
            return fallback
        if old.finished_at_ns <= 0 or started <= 0:
            return fallback
        return max(0.0, (started - old.finished_at_ns) / 1e9)


class _KubeletWatch:
    """One look per poll at kubelet's work after the spec patch: the running replacement, or
    why there will be none (see the module docstring). ``attempt``: the newest attempt of the
    container seen; ``old_exit_ns``: when the old container exited (0 until seen)."""

    def __init__(
        self,
        runtime: RuntimeService,
        plan: Restart,
        image: ImageInfo,
        container_status: StatusReader | None,
        baseline: Mapping[str, Any] | None,
    ) -> None:
        self._runtime = runtime
        self._plan = plan
        self._image = image
        self._status = container_status
        self._baseline = baseline
        self.failure: str | None = None
        self.attempt: int | None = None
        self.old_exit_ns = 0

    async def look(self) -> ContainerInfo | None:
        """The newest running replacement (a higher attempt), or None — then :attr:`failure`
        says whether one failed. Raises ``CriUnavailable``."""
        plan = self._plan
        found = [
            c
            for c in await self._runtime.list_containers(sandbox_id=plan.sandbox_id)
            if c.name == plan.old.name
        ]
        newer = [c for c in found if c.attempt > plan.old.attempt]
        if newer:
            self.attempt = max(c.attempt for c in newer)
        running = [c for c in newer if c.state is ContainerState.RUNNING]
        if running:
            return max(running, key=lambda c: c.attempt)
        old = next((c for c in found if c.id == plan.old.id), None)
        if self.old_exit_ns == 0 and (old is None or old.state is ContainerState.EXITED):
            try:
                self.old_exit_ns = (await self._runtime.container_status(plan.old.id)).finished_at_ns
            except errors.CriNotFound:
                self.old_exit_ns = 0
        exited = [c for c in newer if c.state is ContainerState.EXITED]
        if exited:
            failed = await self._runtime.container_status(max(exited, key=lambda c: c.attempt).id)
            detail = f": {failed.message}" if failed.message else ""
            self.failure = (
                f"kubelet's replacement container {failed.id} (attempt {failed.attempt}) failed: "
                f"{failed.reason or 'exited'} (exit code {failed.exit_code}){detail}"
            )
        elif (old is None or old.state is not ContainerState.RUNNING) and self._status is not None:
            waiting = waiting_failure(self._status(), baseline=self._baseline)
            if waiting is not None:
                self.failure = f"kubelet cannot run the replacement of {plan.old.name!r}: {waiting}"
        return None
