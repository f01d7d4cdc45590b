"""What to do about a hot-restart request: a pure function of the request, the previous
status and what the runtime shows. No I/O.

:func:`decide` returns one of

* :class:`Skip` — the request id already has a final status (a repeated request is a no-op);
* :class:`Fail` — it cannot be done (no ready sandbox, no such container, the replacement
  died) or is refused (``direct`` on a kubelet's sandbox, ``kubelet`` on flexlease's, a
  same-image restart of an ``OnFailure``/``Never`` pod); the message says why;
* :class:`Adopt` — a previous run of this request (an agent restart, a lost status write)
  already produced the running replacement: record success without touching anything;
* :class:`Restart` — the plan: sandbox, the container to replace, the next attempt number,
  and, when resuming, a replacement that was created but not started yet; for ``kubelet``,
  the image to write into the pod spec (:mod:`nodeagent.hotrestart.kubelet`);
* :class:`RollBack` — a previous run of this request left a replacement that failed (found
  on resuming after an agent restart), or was undoing one when it stopped: put the previous
  image back (unless rollback is off: then :class:`Fail`).

:func:`replacement_config` derives the replacement's ``ContainerConfig`` from the old one
(same mounts, devices, env, namespaces, labels; new image, attempt + 1, log path
``<name>/<attempt>.log`` as kubelet names it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flexlease.cri import api_pb2
from nodeagent.cri.client import (
    ANN_CONTAINER_RESTART_COUNT,
    ContainerInfo,
    ContainerState,
    ImageInfo,
    SandboxInfo,
    SandboxState,
)
from nodeagent.hotrestart.kubelet import (
    RESTART_ALWAYS,
    alternate_reference,
    kubelet_managed,
    runs_image,
)
from nodeagent.hotrestart.model import HotRestartRequest, HotRestartStatus, Strategy

# kubelet's container annotation carrying the restart count (pkg/kubelet/kuberuntime/labels.go).
ANN_RESTART_COUNT = ANN_CONTAINER_RESTART_COUNT
_KUBELET_LOG = re.compile(r"^(?P<dir>.*/)?(?P<attempt>\d+)\.log$")


@dataclass(frozen=True, slots=True)
class RuntimeView:
    """What the runtime shows for the pod: its ready sandbox (None when there is none), every
    container with the requested name in it, any state, and ``image``: CRI ``ImageStatus`` of
    the requested image (None when it is not on the node yet)."""

    sandbox: SandboxInfo | None
    containers: tuple[ContainerInfo, ...]
    image: ImageInfo | None = None


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What the pod object says: ``restart_policy`` and the image its spec names for the
    requested container (``spec_image``, None when the spec has no such container)."""

    restart_policy: str = RESTART_ALWAYS
    spec_image: str | None = None


@dataclass(frozen=True, slots=True)
class Skip:
    reason: str


@dataclass(frozen=True, slots=True)
class Fail:
    """It cannot be done. ``refused``: refused before anything was touched because of what
    the pod is (kubelet's or not, its restartPolicy); worth an Event."""

    message: str
    refused: bool = False


@dataclass(frozen=True, slots=True)
class Adopt:
    """The replacement already runs (``container``); ``previous`` is the InProgress status."""

    container: ContainerInfo
    previous: HotRestartStatus


@dataclass(frozen=True, slots=True)
class Restart:
    """Replace ``old`` (running, or the latest exited instance) in ``sandbox_id`` by a
    container of ``image`` with ``attempt``. ``replacement``: an already created (not
    started) replacement to resume with instead of creating one (direct). ``spec_image``
    (kubelet): the image to write into the pod spec — ``image`` itself, or the other
    spelling of the running image when it stays the same (``same_image``)."""

    sandbox_id: str
    old: ContainerInfo
    attempt: int
    image: str
    strategy: Strategy
    replacement: ContainerInfo | None = None
    spec_image: str | None = None
    same_image: bool = False


@dataclass(frozen=True, slots=True)
class RollBack:
    """Undo this request's failed restart in ``sandbox_id``: put ``image`` back — ``kubelet``:
    into the pod spec (the status's ``previousSpecImage``); ``direct``: start ``old``'s config
    (the container replaced, attempt ``previous_attempt``) as attempt ``attempt``.
    ``reason``: why the restart failed; empty when the status already says (a rollback that
    was under way is resumed)."""

    sandbox_id: str
    strategy: Strategy
    previous_attempt: int
    image: str
    reason: str
    attempt: int
    old: ContainerInfo | None = None


Decision = Skip | Fail | Adopt | Restart | RollBack


def decide(
    request: HotRestartRequest,
    status: HotRestartStatus | None,
    view: RuntimeView,
    *,
    default_strategy: Strategy | None,
    pod: PodFacts | None = None,
    rollback: bool = True,
) -> Decision:
    """Decide what to do (see the module docstring). ``status``: the pod's current
    hot-restart status (any id), None when absent. ``default_strategy``: used when neither
    the request nor an earlier status of it names one; None picks by the sandbox's owner
    (kubelet's → ``kubelet``, flexlease's → ``direct``). ``direct`` on a kubelet's sandbox and
    ``kubelet`` on flexlease's are refused. ``rollback``: whether a failed replacement found
    on resuming is undone (:class:`RollBack`) or only reported (:class:`Fail`)."""
    facts = pod or PodFacts()
    ours = status if status is not None and status.id == request.id else None
    if ours is not None and ours.phase.final and not ours.rolling_back:
        return Skip(f"request {request.id!r} already {ours.phase.value}")
    sandbox = view.sandbox
    if sandbox is None or sandbox.state is not SandboxState.READY:
        return Fail("the pod has no ready sandbox on this node")
    containers = sorted(view.containers, key=lambda c: c.attempt)
    if not containers:
        return Fail(f"container {request.container!r} not found in sandbox {sandbox.id}")
    latest = containers[-1]
    managed = kubelet_managed(sandbox, containers)
    strategy = (
        request.strategy
        or (ours.strategy if ours is not None else None)
        or default_strategy
        or (Strategy.KUBELET if managed else Strategy.DIRECT)
    )
    if strategy is Strategy.DIRECT and managed:
        return Fail(
            f"sandbox {sandbox.id} is managed by kubelet (its containers carry kubelet's annotations or "
            "it lacks flexlease.io/no-kubelet=true): the direct strategy would race kubelet's own "
            "restart; use the kubelet strategy",
            refused=True,
        )
    if strategy is Strategy.KUBELET and not managed:
        return Fail(
            f"sandbox {sandbox.id} was run by flexlease (flexlease.io/no-kubelet=true): no kubelet will "
            "restart its container; use the direct strategy",
            refused=True,
        )

    previous = (
        next((c for c in containers if c.attempt == ours.previous_attempt), None)
        if ours is not None and ours.previous_attempt is not None
        else None
    )
    if ours is not None and ours.rolling_back:
        assert ours.rollback is not None  # rolling_back says so
        return RollBack(
            sandbox.id,
            strategy,
            ours.previous_attempt or 0,
            ours.rollback.image,
            "",
            latest.attempt + 1,
            previous,
        )
    if ours is not None and ours.previous_attempt is not None and latest.attempt > ours.previous_attempt:
        # A previous run of this request got as far as creating the replacement.
        if strategy is Strategy.KUBELET:
            if view.image is None or not runs_image(latest, view.image):
                wanted = f"{request.image} ({view.image.id})" if view.image else request.image
                return Fail(
                    f"container {request.container!r} attempt {latest.attempt} ({latest.id}) runs "
                    f"{latest.image_ref or latest.image}, not the requested {wanted}"
                )
        elif latest.image != request.image and not (view.image and runs_image(latest, view.image)):
            return Fail(
                f"container {request.container!r} attempt {latest.attempt} ({latest.id}) runs "
                f"{latest.image}, not the requested {request.image}"
            )
        if latest.state is ContainerState.RUNNING:
            return Adopt(latest, ours)
        if latest.state is ContainerState.EXITED:
            detail = latest.reason or "exited"
            reason = (
                f"replacement container {latest.id} (attempt {latest.attempt}) exited ({detail}, exit code "
                f"{latest.exit_code}){_msg(latest)}"
            )
            back = _rollback_image(strategy, ours, previous)
            if not rollback or back is None:
                return Fail(reason)
            return RollBack(
                sandbox.id, strategy, ours.previous_attempt, back, reason, latest.attempt + 1, previous
            )
        previous = next((c for c in containers if c.attempt == ours.previous_attempt), containers[0])
        return Restart(
            sandbox.id,
            previous,
            latest.attempt,
            request.image,
            strategy,
            replacement=latest if strategy is Strategy.DIRECT else None,
            spec_image=ours.spec_image if strategy is Strategy.KUBELET else None,
        )

    running = [c for c in containers if c.state is ContainerState.RUNNING]
    old = running[-1] if running else latest
    if strategy is Strategy.DIRECT:
        return Restart(sandbox.id, old, latest.attempt + 1, request.image, strategy)
    return _kubelet_plan(
        request, ours, view, facts, sandbox_id=sandbox.id, old=old, attempt=latest.attempt + 1
    )


def _kubelet_plan(
    request: HotRestartRequest,
    ours: HotRestartStatus | None,
    view: RuntimeView,
    facts: PodFacts,
    *,
    sandbox_id: str,
    old: ContainerInfo,
    attempt: int,
) -> Decision:
    if facts.spec_image is None:
        return Fail(f"the pod spec has no container {request.container!r}", refused=True)
    same = view.image is not None and runs_image(old, view.image)
    if ours is not None and ours.spec_image:
        return Restart(sandbox_id, old, attempt, request.image, Strategy.KUBELET, None, ours.spec_image, same)
    if not same:
        return Restart(sandbox_id, old, attempt, request.image, Strategy.KUBELET, None, request.image, False)
    if facts.restart_policy != RESTART_ALWAYS:
        return Fail(
            f"restartPolicy {facts.restart_policy}: a restart of {request.container!r} with the image it "
            f"already runs ({request.image}) is refused, as it could end the pod; request a different image",
            refused=True,
        )
    assert view.image is not None
    other = alternate_reference(facts.spec_image, view.image)
    if other is None:
        return Fail(
            f"{request.container!r} already runs {request.image} and the node knows no digest form of "
            f"{facts.spec_image} (an image loaded rather than pulled has none): kubelet restarts an "
            "unchanged spec only after crash-loop back-off",
            refused=True,
        )
    return Restart(sandbox_id, old, attempt, request.image, Strategy.KUBELET, None, other, True)


def _rollback_image(strategy: Strategy, ours: HotRestartStatus, previous: ContainerInfo | None) -> str | None:
    """What a rollback puts back: the pod spec's previous image (kubelet) or the replaced
    container's image (direct); None when it is not known (a status of an older agent, the
    replaced container removed)."""
    if strategy is Strategy.KUBELET:
        return ours.previous_spec_image
    return previous.image if previous is not None else None


def _msg(c: ContainerInfo) -> str:
    return f": {c.message}" if c.message else ""


def replacement_config(old: api_pb2.ContainerConfig, *, image: str, attempt: int) -> api_pb2.ContainerConfig:
    """The replacement's config: a copy of ``old`` with ``image``, ``metadata.attempt`` =
    ``attempt``, kubelet's restart-count annotation updated when present, and a log path
    ``…/<attempt>.log`` when the old one followed kubelet's ``<name>/<attempt>.log``."""
    new = api_pb2.ContainerConfig()
    new.CopyFrom(old)
    new.image.CopyFrom(api_pb2.ImageSpec(image=image, annotations=dict(old.image.annotations)))
    new.metadata.attempt = attempt
    if ANN_RESTART_COUNT in new.annotations:
        new.annotations[ANN_RESTART_COUNT] = str(attempt)
    match = _KUBELET_LOG.match(old.log_path)
    if match:
        new.log_path = f"{match.group('dir') or ''}{attempt}.log"
    elif old.log_path:
        new.log_path = f"{old.log_path}.{attempt}"
    return new
