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
failed start rolls back by starting the old config again as another attempt.

``kubelet`` strategy (a sandbox kubelet manages): pre-pull (old container still running) →
resolve the image through CRI ``ImageStatus`` → write the plan's ``spec_image`` into the pod
spec (the caller's ``patch_spec``) → wait for kubelet's in-place restart: a higher attempt of
the same container name, running, whose image ID or repo digest is the requested image's.
The agent stops nothing: kubelet kills the old container with the pod's grace period, as
for any spec change. ``pause`` is measured from CRI timestamps (the old container's
``finished_at`` to the replacement's ``started_at``).

:class:`flexlease.errors.CriUnavailable` (containerd restarting or unreachable) propagates:
the caller retries later and :func:`~nodeagent.hotrestart.decide.decide` resumes from what
the runtime shows. Every other failure becomes a failed :class:`Outcome` with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from flexlease import errors
from flexlease.cri import api_pb2
from flexlease.logging import ctx
from nodeagent.cache.checkpoints import CheckpointCache
from nodeagent.cache.images import ImagePuller, PullResult
from nodeagent.cri.client import ContainerInfo, ContainerState, RuntimeService
from nodeagent.hotrestart.decide import Restart, replacement_config
from nodeagent.hotrestart.kubelet import runs_image
from nodeagent.hotrestart.model import CheckpointRef, PrelaunchStatus, Strategy
from nodeagent.prelaunch import Bandwidths, PrelaunchReport, prelaunch

log = logging.getLogger(__name__)

SpecPatcher = Callable[[str], Awaitable[None]]
"""Writes an image into the pod spec's container (kubelet strategy). Raises ``StoreError``."""


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


class HotRestarter:
    """Executes :class:`~nodeagent.hotrestart.decide.Restart` plans.

    ``stop_timeout_seconds``: grace period of StopContainer. ``kubelet_wait_seconds``: how
    long the kubelet strategy waits for the replacement; ``poll_seconds``: how often it looks.
    Image IDs are resolved through the puller's CRI ImageService (:attr:`ImagePuller.images`).
    ``checkpoints``: the node's checkpoint cache, for requests naming a checkpoint;
    ``bandwidths``: the assumed bandwidths W is predicted with.
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
        self._clock = clock

    async def execute(
        self,
        plan: Restart,
        *,
        pod: str,
        patch_spec: SpecPatcher | None = None,
        checkpoint: CheckpointRef | None = None,
    ) -> Outcome:
        """Run ``plan`` for ``pod`` (``ns/name``, for logs); ``patch_spec`` writes the pod
        spec's image (needed by the kubelet strategy). Raises ``CriUnavailable``, and
        ``StoreError`` from ``patch_spec`` (retry: the plan resumes from what CRI shows).
        ``checkpoint``: fetched into the checkpoint cache alongside the pull."""
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
        if plan.strategy is Strategy.KUBELET:
            outcome = await self._kubelet(plan, pull, patch_spec, pod=pod)
        else:
            outcome = await self._direct(plan, pull, pod=pod)
        outcome = Outcome(
            outcome.succeeded,
            outcome.message,
            outcome.container_id,
            outcome.attempt,
            pulled.cached,
            outcome.timings,
            self._clock() - started,
            outcome.pause_seconds,
            outcome.image_id,
            report,
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
            rollback = await self._rollback(plan, old_config, new_id, sandbox_config, pod=pod)
            return Outcome(False, f"the replacement did not start: {exc}; {rollback}", timings=timings)
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

    async def _rollback(
        self,
        plan: Restart,
        old_config: api_pb2.ContainerConfig | None,
        failed_id: str,
        sandbox_config: api_pb2.PodSandboxConfig,
        *,
        pod: str,
    ) -> str:
        """Start the old container's config again as the next attempt; returns a note."""
        await self._remove_quietly(failed_id, pod=pod)
        try:
            if old_config is None:
                old_config = await self._runtime.container_config(plan.old.id)
            config = replacement_config(old_config, image=old_config.image.image, attempt=plan.attempt + 1)
            rollback_id = await self._runtime.create_container(plan.sandbox_id, config, sandbox_config)
            await self._runtime.start_container(rollback_id)
        except errors.CriError as exc:
            return f"rollback to {plan.old.image} failed too: {exc}"
        return f"rolled back to {plan.old.image} as container {rollback_id}"

    async def _remove_quietly(self, container_id: str, *, pod: str) -> None:
        try:
            await self._runtime.remove_container(container_id)
        except errors.CriError as exc:
            log.debug(
                "could not remove container", extra=ctx(pod=pod, container_id=container_id, error=str(exc))
            )

    async def _kubelet(
        self, plan: Restart, pull: Timings, patch_spec: SpecPatcher | None, *, pod: str
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
        t0 = self._clock()
        try:
            await patch_spec(plan.spec_image)
        except errors.RequestError as exc:
            return Outcome(False, f"cannot patch the pod spec (nothing restarted): {exc}", timings=pull)
        log.info(
            "pod spec image patched; waiting for kubelet",
            extra=ctx(pod=pod, container=plan.old.name, spec_image=plan.spec_image, image_id=image.id),
        )
        deadline = t0 + self._kubelet_wait
        while True:
            replacement = await self._replacement(plan)
            if replacement is not None:
                timings = Timings(pull.pull, 0.0, self._clock() - t0)
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
            if self._clock() >= deadline:
                return Outcome(
                    False,
                    f"kubelet did not restart {plan.old.name!r} within {self._kubelet_wait:g} s of the pod "
                    f"spec's image being set to {plan.spec_image}",
                    timings=Timings(pull.pull, 0.0, self._clock() - t0),
                    image_id=image.id,
                )
            await asyncio.sleep(self._poll)

    async def _pause(self, old_id: str, new: ContainerInfo, *, fallback: float) -> float:
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

    async def _replacement(self, plan: Restart) -> ContainerInfo | None:
        found = await self._runtime.list_containers(sandbox_id=plan.sandbox_id)
        newer = [
            c
            for c in found
            if c.name == plan.old.name and c.attempt > plan.old.attempt and c.state is ContainerState.RUNNING
        ]
        return max(newer, key=lambda c: c.attempt) if newer else None
