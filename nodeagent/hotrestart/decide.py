"""What to do about a hot-restart request: a pure function of the request, the previous
status and what the runtime shows. No I/O.

:func:`decide` returns one of

* :class:`Skip` — the request id already has a final status (a repeated request is a no-op);
* :class:`Fail` — it cannot be done (no ready sandbox, no such container, the replacement
  died); the message says why;
* :class:`Adopt` — a previous run of this request (an agent restart, a lost status write)
  already produced the running replacement: record success without touching anything;
* :class:`Restart` — the plan: sandbox, the container to replace, the next attempt number,
  and, when resuming, a replacement that was created but not started yet.

:func:`replacement_config` derives the replacement's ``ContainerConfig`` from the old one
(same mounts, devices, env, namespaces, labels; new image, attempt + 1, log path
``<name>/<attempt>.log`` as kubelet names it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flexlease.cri import api_pb2
from nodeagent.cri.client import ContainerInfo, ContainerState, SandboxInfo, SandboxState
from nodeagent.hotrestart.model import HotRestartRequest, HotRestartStatus, Strategy

# kubelet's container annotation carrying the restart count (pkg/kubelet/kuberuntime/labels.go).
ANN_RESTART_COUNT = "io.kubernetes.container.restartCount"
_KUBELET_LOG = re.compile(r"^(?P<dir>.*/)?(?P<attempt>\d+)\.log$")


@dataclass(frozen=True, slots=True)
class RuntimeView:
    """What the runtime shows for the pod: its ready sandbox (None when there is none) and
    every container with the requested name in it, any state."""

    sandbox: SandboxInfo | None
    containers: tuple[ContainerInfo, ...]


@dataclass(frozen=True, slots=True)
class Skip:
    reason: str


@dataclass(frozen=True, slots=True)
class Fail:
    message: str


@dataclass(frozen=True, slots=True)
class Adopt:
    """The replacement already runs (``container``); ``previous`` is the InProgress status."""

    container: ContainerInfo
    previous: HotRestartStatus


@dataclass(frozen=True, slots=True)
class Restart:
    """Replace ``old`` (running, or the latest exited instance) in ``sandbox_id`` by a
    container of ``image`` with ``attempt``. ``replacement``: an already created (not
    started) replacement to resume with instead of creating one."""

    sandbox_id: str
    old: ContainerInfo
    attempt: int
    image: str
    strategy: Strategy
    replacement: ContainerInfo | None = None


Decision = Skip | Fail | Adopt | Restart


def decide(
    request: HotRestartRequest,
    status: HotRestartStatus | None,
    view: RuntimeView,
    *,
    default_strategy: Strategy,
) -> Decision:
    """Decide what to do (see the module docstring). ``status``: the pod's current
    hot-restart status (any id), None when absent."""
    ours = status if status is not None and status.id == request.id else None
    if ours is not None and ours.phase.final:
        return Skip(f"request {request.id!r} already {ours.phase.value}")
    strategy = request.strategy or (ours.strategy if ours is not None else default_strategy)
    sandbox = view.sandbox
    if sandbox is None or sandbox.state is not SandboxState.READY:
        return Fail("the pod has no ready sandbox on this node")
    containers = sorted(view.containers, key=lambda c: c.attempt)
    if not containers:
        return Fail(f"container {request.container!r} not found in sandbox {sandbox.id}")
    latest = containers[-1]

    if ours is not None and ours.previous_attempt is not None and latest.attempt > ours.previous_attempt:
        # A previous run of this request got as far as creating the replacement.
        if latest.image != request.image:
            hint = "; patch the pod spec's image too" if strategy is Strategy.KUBELET else ""
            return Fail(
                f"container {request.container!r} attempt {latest.attempt} runs {latest.image}, "
                f"not the requested {request.image}{hint}"
            )
        if latest.state is ContainerState.RUNNING:
            return Adopt(latest, ours)
        if latest.state is ContainerState.EXITED:
            detail = latest.reason or "exited"
            return Fail(
                f"replacement container {latest.id} exited ({detail}, exit code {latest.exit_code})"
                f"{_msg(latest)}"
            )
        previous = next((c for c in containers if c.attempt == ours.previous_attempt), containers[0])
        return Restart(
            sandbox.id,
            previous,
            latest.attempt,
            request.image,
            strategy,
            replacement=latest if strategy is Strategy.DIRECT else None,
        )

    running = [c for c in containers if c.state is ContainerState.RUNNING]
    old = running[-1] if running else latest
    return Restart(sandbox.id, old, latest.attempt + 1, request.image, strategy)


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
