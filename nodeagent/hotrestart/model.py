"""The hot-restart annotations (DESIGN §2, §4): the request and its status, as frozen models.

``flexlease.io/hot-restart`` (written by an operator or controller) is JSON::

    {"id": "r-42", "container": "trainer", "image": "registry/trainer:v2"}

with an optional ``"strategy": "direct" | "kubelet"`` overriding the agent's
``hot_restart_strategy``, and an optional ``"checkpoint": {"id", "url", "sha256"}`` to fetch
into the node's checkpoint cache while the image is pulled (the prelaunch: WeFlex §3.3).
``id`` names the request: a request whose id already has a final status is a no-op, so
re-applying the same annotation restarts nothing.

``flexlease.io/hot-restart-status`` (written only by the pod's node agent) is JSON with
camelCase keys: ``id``, ``phase`` (``InProgress`` while running; ``Succeeded`` or ``Failed``
at the end), ``strategy``, ``container``, ``image``, ``node``, ``sandboxId``, ``podIP``,
``containerId`` (the container that runs when the status is written: the replacement, or
after a rollback the container running the previous image; absent when none runs),
``previousContainerId``, ``previousAttempt``, ``attempt`` (of ``containerId``; with nothing
running, the newest attempt the replacement got), ``imageCached``, ``imageId`` (the
requested image's ID, from CRI ``ImageStatus``/``PullImage``: what the replacement was
confirmed to run), ``specImage`` and ``previousSpecImage`` (kubelet: the image written into
the pod spec, and the one it replaced), ``pullSeconds``, ``stopSeconds``, ``startSeconds``,
``pauseSeconds`` (no container of that name running: from the old one's exit to the start
of the replacement — or of the rolled-back container — CRI timestamps where the runtime kept
them), ``totalSeconds``, ``message`` (why it failed, or notes), ``startedAt``, ``finishedAt``
(RFC 3339 UTC), ``rollback`` when a failed restart was undone (:class:`RollbackStatus`), and
``prelaunch`` when a checkpoint was requested (``ready``, ``readyAt``, ``elapsedSeconds``,
``windowSeconds`` = W predicted before the work, ``measuredWindowSeconds`` = W from the
bandwidths measured, ``imageCached``, ``checkpointResult``: ``hit``/``miss``/``shared``).

``pullSeconds``, ``imageCached``, ``imageId`` and ``previousSpecImage`` are recorded in the
``InProgress`` status before anything is touched, so that a restart resumed after the agent
was stopped mid-way ends with every field a normal one has (the later timings then come from
CRI timestamps). A failure detected after the old container was stopped is reported
``Failed`` at once, with ``rollback.phase: InProgress``; the same status is written again
when the rollback ended. Pure: parsing and rendering only.
"""

from __future__ import annotations

import enum
import json
import re
from datetime import datetime

from pydantic import Field, ValidationError, field_validator

from flexlease.api import keys
from flexlease.api.base import KubeModel
from flexlease.errors import PodSpecError

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class Strategy(enum.StrEnum):
    """``direct``: the agent creates and starts the replacement itself through CRI — only in
    sandboxes no kubelet manages (``flexlease.io/no-kubelet``: the demo, tests, benches).
    ``kubelet``: the agent pre-pulls the image, patches the pod spec's container image (the
    other spelling of the same image when it stays the same) and waits for kubelet's own
    in-place restart, confirmed by image ID; it never stops a kubelet's container."""

    DIRECT = "direct"
    KUBELET = "kubelet"


class Phase(enum.StrEnum):
    IN_PROGRESS = "InProgress"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def final(self) -> bool:
        return self is not Phase.IN_PROGRESS


_SHA256 = re.compile(r"^(sha256:)?[0-9a-fA-F]{64}$")


class CheckpointRef(KubeModel):
    """The checkpoint a restarted container will load: cache ``id``, fsspec ``url``, expected
    ``sha256`` (hex, optionally ``sha256:``-prefixed)."""

    id: str = Field(min_length=1, max_length=253)
    url: str = Field(min_length=1, max_length=2048)
    sha256: str

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        if not _SHA256.match(value):
            raise ValueError("must be 64 hex digits, optionally prefixed with 'sha256:'")
        return value


class HotRestartRequest(KubeModel):
    """A parsed ``flexlease.io/hot-restart`` annotation."""

    id: str = Field(min_length=1, max_length=253)
    container: str = Field(min_length=1, max_length=63)
    image: str = Field(min_length=1, max_length=1024)
    strategy: Strategy | None = None
    checkpoint: CheckpointRef | None = None

    @field_validator("container")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if not _DNS_LABEL.match(value):
            raise ValueError("must be a container name (RFC 1123 label)")
        return value

    @field_validator("image")
    @classmethod
    def _no_space(cls, value: str) -> str:
        if any(c.isspace() for c in value):
            raise ValueError("must not contain whitespace")
        return value


class PrelaunchStatus(KubeModel):
    """The prelaunch before a restart (seconds): ready or not, W predicted and measured."""

    ready: bool
    ready_at: datetime | None = None
    elapsed_seconds: float
    window_seconds: float
    measured_window_seconds: float | None = None
    image_cached: bool | None = None
    checkpoint_result: str | None = None
    error: str | None = None


class RollbackStatus(KubeModel):
    """Undoing a failed restart (seconds): ``phase`` ``InProgress`` → ``Succeeded`` /
    ``Failed``; ``image``: what was put back (kubelet: the pod spec's previous image; direct:
    the old container's image); ``containerId`` / ``attempt``: the container running it;
    ``seconds``: from the failure to that container running; ``message``: why it failed."""

    phase: Phase
    image: str
    container_id: str | None = None
    attempt: int | None = None
    seconds: float | None = None
    message: str | None = None


class HotRestartStatus(KubeModel):
    """A ``flexlease.io/hot-restart-status`` annotation. Durations in seconds."""

    id: str
    phase: Phase
    strategy: Strategy
    container: str
    image: str
    node: str | None = None
    sandbox_id: str | None = None
    pod_ip: str | None = Field(default=None, alias="podIP")
    container_id: str | None = None
    previous_container_id: str | None = None
    previous_attempt: int | None = None
    attempt: int | None = None
    image_cached: bool | None = None
    image_id: str | None = None
    spec_image: str | None = None
    previous_spec_image: str | None = None
    pull_seconds: float | None = None
    stop_seconds: float | None = None
    start_seconds: float | None = None
    pause_seconds: float | None = None
    total_seconds: float | None = None
    message: str | None = None
    rollback: RollbackStatus | None = None
    prelaunch: PrelaunchStatus | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def rolling_back(self) -> bool:
        """A rollback was started and has not ended (resumed after an agent restart)."""
        return self.rollback is not None and not self.rollback.phase.final

    def render(self) -> str:
        """The annotation value (compact JSON, camelCase, ``None`` fields omitted)."""
        return json.dumps(self.to_json_obj(), separators=(",", ":"), sort_keys=True)


def parse_request(value: str) -> HotRestartRequest:
    """Parse the request annotation. Raises :class:`PodSpecError` when it is not a JSON
    object with string ``id``, ``container`` (a container name) and ``image``."""
    try:
        return HotRestartRequest.model_validate_json(value)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors()
        )
        raise PodSpecError(f"annotation {keys.ANN_HOT_RESTART}: {problems}") from exc


def parse_status(value: str | None) -> HotRestartStatus | None:
    """Parse the status annotation; None when absent or unreadable (a status this agent
    cannot read is treated as no status, so the request is acted on again)."""
    if not value:
        return None
    try:
        return HotRestartStatus.model_validate_json(value)
    except ValidationError:
        return None
