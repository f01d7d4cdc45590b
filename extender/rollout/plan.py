"""In-place rollout planning (WeFlex §3.3 "Transforming K8s for In-Situ Restart", §3.2 step e).
Pure: no I/O; the controller (:mod:`extender.rollout.controller`) reads and writes.

A rollout moves a set of pods to target container images one hot restart at a time: for each
pod, the controller writes ``flexlease.io/hot-restart`` (``{"id", "container", "image"}``) and
the pod's node agent prelaunches (pulls the image, fetches the checkpoint), then restarts only
that container in its sandbox — under a kubelet by patching the pod spec's image itself — and
answers in ``flexlease.io/hot-restart-status``. :func:`plan` looks at what the pods show and
says which requests to write now, and the rollout's status:

* a pod is *updated* when every target container runs its target image: its spec says so, or
  the agent reported ``Succeeded`` for this rollout's request of that container;
* a pod is *busy* while it carries a request whose status is not final yet — this rollout's
  (it counts against ``max_unavailable``) or an earlier one's (a superseded rollout: it is
  left to finish before the pod gets the new request, so an edit supersedes cleanly);
* a ``Failed`` status for this rollout's request stops the rollout: no further request is
  written, the status says which pod and why (``phase: Failed``);
* a pod expected but absent (deleted mid-rollout) is skipped and reported.

Pods are taken in the order given (the caller's :class:`RestartOrder`); ``waves`` restart
one group after another, a wave only once every pod of the previous one is updated.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from pydantic import Field, ValidationError

from flexlease.api import keys
from flexlease.api.base import KubeModel

ALL: Final = "all"
_ORDINAL = re.compile(r"-(\d+)$")


class RolloutPhase(enum.StrEnum):
    PROGRESSING = "Progressing"
    COMPLETE = "Complete"
    FAILED = "Failed"
    SKIPPED = "Skipped"
    """A lease's reconfiguration that the age guard declined (``extender.rollout.age``)."""


class RolloutStatus(KubeModel):
    """The ``flexlease.io/rollout-status`` annotation. ``revision``: what is rolled out (a
    digest of the target images, or the lease's reconfiguration id); ``updated``/``total``:
    pods done / pods expected; ``current``: pods restarting now; ``lastError``: why it
    stopped; ``skipped``: expected pods that were absent; ``restartSeconds``: pod →
    ``totalSeconds`` of its hot restart; ``pauseSeconds``: pod → the pause it saw;
    ``superseded``: the revision this one replaced mid-flight; ``pods``: the pods the rollout
    covers (fixed when it starts); ``message``: why a rollout was ``Skipped``."""

    revision: str
    phase: RolloutPhase
    updated: int = 0
    total: int = 0
    current: tuple[str, ...] = ()
    last_error: str | None = None
    skipped: tuple[str, ...] = ()
    restart_seconds: dict[str, float] = Field(default_factory=dict)
    pause_seconds: dict[str, float] = Field(default_factory=dict)
    superseded: str | None = None
    pods: tuple[str, ...] = ()
    started_at: datetime | None = None
    finished_at: datetime | None = None
    message: str | None = None

    def render(self) -> str:
        """The annotation value (compact JSON, sorted keys)."""
        return json.dumps(self.to_json_obj(), separators=(",", ":"), sort_keys=True)


def parse_rollout_status(value: object) -> RolloutStatus | None:
    """The annotation's status, or None when absent or unreadable (then a rollout starts afresh)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return RolloutStatus.model_validate_json(value)
    except ValidationError:
        return None


@dataclass(frozen=True, slots=True)
class RestartRequest:
    """A ``flexlease.io/hot-restart`` request."""

    id: str
    container: str
    image: str

    def render(self) -> str:
        return json.dumps({"container": self.container, "id": self.id, "image": self.image}, sort_keys=True)


@dataclass(frozen=True, slots=True)
class RestartResult:
    """The fields of the agent's ``flexlease.io/hot-restart-status`` a rollout reads: ``phase``
    is ``InProgress``, ``Succeeded`` or ``Failed``; seconds as the agent measured them."""

    id: str
    phase: str
    message: str | None = None
    total_seconds: float | None = None
    pause_seconds: float | None = None

    @property
    def final(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


def parse_request(value: object) -> RestartRequest | None:
    """A request annotation's id/container/image, or None when absent or not such an object
    (the agent refuses a malformed one with a Failed status of its own)."""
    if not isinstance(value, str):
        return None
    try:
        raw = json.loads(value)
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    fields = [raw.get(k) for k in ("id", "container", "image")]
    if not all(isinstance(f, str) and f for f in fields):
        return None
    return RestartRequest(str(fields[0]), str(fields[1]), str(fields[2]))


def _seconds(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def parse_result(value: object) -> RestartResult | None:
    """A status annotation's id/phase/message/seconds, or None when absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        raw = json.loads(value)
    except ValueError:
        return None
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("id"), str)
        or not isinstance(raw.get("phase"), str)
    ):
        return None
    message = raw.get("message")
    return RestartResult(
        id=raw["id"],
        phase=raw["phase"],
        message=message if isinstance(message, str) else None,
        total_seconds=_seconds(raw.get("totalSeconds")),
        pause_seconds=_seconds(raw.get("pauseSeconds")),
    )


@dataclass(frozen=True, slots=True)
class PodState:
    """What a rollout reads of one pod: spec container images (name → image), its request
    and the agent's status, labels, and ``resource_version`` for the write's precondition."""

    namespace: str
    name: str
    uid: str | None
    resource_version: str | None
    images: Mapping[str, str]
    labels: Mapping[str, str] = field(default_factory=dict)
    request: RestartRequest | None = None
    result: RestartResult | None = None

    @property
    def ordinal(self) -> int:
        """The StatefulSet ordinal (the trailing ``-<n>`` of the name), or -1."""
        found = _ORDINAL.search(self.name)
        return int(found.group(1)) if found else -1


def read_pod(obj: Mapping[str, Any]) -> PodState:
    """A :class:`PodState` from a Pod JSON object (missing fields read as empty)."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    spec = obj.get("spec") or {}
    images: dict[str, str] = {}
    for container in spec.get("containers") or []:
        if isinstance(container, dict) and isinstance(container.get("name"), str):
            images[container["name"]] = str(container.get("image") or "")
    labels = meta.get("labels") or {}
    return PodState(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=meta.get("uid"),
        resource_version=meta.get("resourceVersion"),
        images=images,
        labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
        request=parse_request(annotations.get(keys.ANN_HOT_RESTART)),
        result=parse_result(annotations.get(keys.ANN_HOT_RESTART_STATUS)),
    )


def template_images(template: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """(container, image) of a pod template's ``spec.containers``, in order."""
    spec = template.get("spec") or {}
    out: list[tuple[str, str]] = []
    for container in spec.get("containers") or []:
        if isinstance(container, dict) and isinstance(container.get("name"), str):
            out.append((container["name"], str(container.get("image") or "")))
    return tuple(out)


def revision_of(images: Sequence[tuple[str, str]]) -> str:
    """A short digest naming a set of target images (the request ids derive from it)."""
    text = json.dumps(sorted(images), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def request_id(revision: str, container: str) -> str:
    """The hot-restart id of one rollout's request for one container."""
    return f"ro-{revision}-{container}"


def parse_max_unavailable(value: object, pods: int) -> int:
    """``flexlease.io/max-unavailable``: a positive integer, or ``all`` (every pod at once).
    Missing → 1. Raises ``ValueError`` on anything else."""
    if value is None:
        return 1
    if value == ALL:
        return max(1, pods)
    if isinstance(value, str) and value.isdigit() and int(value) > 0:
        return int(value)
    raise ValueError(f"{keys.ANN_MAX_UNAVAILABLE}: want a positive integer or 'all', got {value!r}")


@dataclass(frozen=True, slots=True)
class Note:
    """An Event to record: on the workload (``pod`` None) or on that pod."""

    reason: str
    message: str
    warning: bool = False
    pod: str | None = None


@dataclass(frozen=True, slots=True)
class Write:
    """A request to write on a pod (with its resourceVersion as precondition)."""

    pod: PodState
    request: RestartRequest


@dataclass(frozen=True, slots=True)
class Plan:
    status: RolloutStatus
    writes: tuple[Write, ...]
    notes: tuple[Note, ...]
    finished: tuple[tuple[str, RestartResult], ...]
    """(pod, result) of this rollout's restarts that have a final status (for metrics)."""


def plan(
    *,
    revision: str,
    targets: Mapping[str, Mapping[str, str]],
    waves: Sequence[Sequence[str]],
    pods: Mapping[str, PodState],
    previous: RolloutStatus | None,
    max_unavailable: int,
    now: datetime,
    id_prefix: str | None = None,
) -> Plan:
    """Plan one step of the rollout ``revision``.

    ``targets``: pod name → container → target image (for every expected pod); ``waves``:
    the expected pod names in restart order, grouped (a wave starts once every pod of the
    earlier waves is updated; within a wave, in order, at most ``max_unavailable`` busy);
    ``pods``: the pods present, by name; ``previous``: the status written last time;
    ``id_prefix``: request ids are ``<id_prefix>-<container>`` (default
    :func:`request_id` of ``revision``). Returns the new status, the requests to write and
    the Events to record.
    """
    expected = [name for wave in waves for name in wave]
    same = previous is not None and previous.revision == revision
    notes: list[Note] = []
    superseded = previous.superseded if same and previous is not None else None
    if previous is not None and not same and previous.phase is RolloutPhase.PROGRESSING:
        superseded = previous.revision
        notes.append(
            Note("RolloutSuperseded", f"rollout {previous.revision} superseded by {revision} mid-flight")
        )

    def rid(container: str) -> str:
        return f"{id_prefix}-{container}" if id_prefix is not None else request_id(revision, container)

    updated: set[str] = set()
    current: list[str] = []
    busy: set[str] = set()
    pending: dict[str, tuple[str, str]] = {}
    failures: list[tuple[str, str]] = []
    finished: list[tuple[str, RestartResult]] = []
    restart_seconds = dict(previous.restart_seconds) if same and previous is not None else {}
    pause_seconds = dict(previous.pause_seconds) if same and previous is not None else {}
    for name in expected:
        pod = pods.get(name)
        if pod is None:
            continue
        result = pod.result
        ours = {rid(c) for c in targets[name]}
        if result is not None and result.id in ours and result.final:
            finished.append((name, result))
            if result.phase == "Succeeded":
                if result.total_seconds is not None:
                    restart_seconds[name] = result.total_seconds
                if result.pause_seconds is not None:
                    pause_seconds[name] = result.pause_seconds
        request = pod.request
        if request is not None and (result is None or result.id != request.id or not result.final):
            # a restart in flight (ours or a superseded rollout's): never written over, and the
            # pod counts as unavailable even once the agent has patched its spec image
            busy.add(name)
            if request.id in ours:
                current.append(name)
            continue
        if result is not None and result.id in ours and result.phase == "Failed":
            failures.append((name, result.message or "hot restart failed"))
            continue
        todo: tuple[str, str] | None = None
        missing = next((c for c in targets[name] if c not in pod.images), None)
        if missing is not None:
            failures.append((name, f"container {missing!r} is not in the pod; adding one needs recreation"))
            continue
        for container, image in targets[name].items():
            done = result is not None and result.id == rid(container) and result.phase == "Succeeded"
            if id_prefix is None and pod.images[container] == image:
                done = True
            if not done:
                todo = (container, image)
                break
        if todo is None:
            updated.add(name)
        else:
            pending[name] = todo

    skipped = tuple(name for name in expected if name not in pods)
    before = set(previous.skipped) if same and previous is not None else set()
    for name in skipped:
        if name not in before:
            notes.append(
                Note("PodSkipped", f"pod {name} is gone; skipped by rollout {revision}", warning=True)
            )

    writes: list[Write] = []
    last_error = previous.last_error if same and previous is not None else None
    failed_before = same and previous is not None and previous.phase is RolloutPhase.FAILED
    if failures or failed_before:
        phase = RolloutPhase.FAILED
        if failures:
            last_error = f"pod {failures[0][0]}: {failures[0][1]}"
        if not failed_before:
            notes.append(Note("RolloutFailed", f"rollout {revision} stopped: {last_error}", warning=True))
            for name, message in failures:
                notes.append(Note("HotRestartFailed", message, warning=True, pod=name))
    else:
        slots = max_unavailable - len(busy)
        for wave in waves:
            for name in wave:
                if slots <= 0:
                    break
                if name in pending:
                    container, image = pending[name]
                    writes.append(Write(pods[name], RestartRequest(rid(container), container, image)))
                    current.append(name)
                    slots -= 1
            if any(name not in updated and name in pods for name in wave):
                break  # the next wave waits for this one
        done = not writes and not busy
        phase = RolloutPhase.COMPLETE if done else RolloutPhase.PROGRESSING
        if writes and not (same and previous is not None and previous.phase is RolloutPhase.PROGRESSING):
            notes.append(
                Note("RolloutStarted", f"in-place rollout {revision} of {len(expected)} pods started")
            )
        if done and same and previous is not None and previous.phase is RolloutPhase.PROGRESSING:
            notes.append(
                Note("RolloutComplete", f"rollout {revision}: {len(updated)}/{len(expected)} pods updated")
            )
    for write in writes:
        notes.append(
            Note(
                "HotRestartRequested",
                f"restart of container {write.request.container} with {write.request.image} requested",
                pod=write.pod.name,
            )
        )
    started = previous.started_at if same and previous is not None else None
    finished_at = previous.finished_at if same and previous is not None else None
    if phase is RolloutPhase.PROGRESSING:
        finished_at = None
    elif finished_at is None:
        finished_at = now
    status = RolloutStatus(
        revision=revision,
        phase=phase,
        updated=len(updated),
        total=len(expected),
        current=tuple(sorted(set(current))),
        last_error=last_error,
        skipped=skipped,
        restart_seconds=restart_seconds,
        pause_seconds=pause_seconds,
        superseded=superseded,
        pods=tuple(expected),
        started_at=started or now,
        finished_at=finished_at,
    )
    return Plan(status=status, writes=tuple(writes), notes=tuple(notes), finished=tuple(finished))
