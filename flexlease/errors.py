"""flexlease's error hierarchy (house rule 4). Always chain the cause (``raise ... from exc``).

    FlexleaseError
    ├── StoreError            a store (Kubernetes API, SQLite, memory) failed
    │   ├── Conflict          409: resourceVersion precondition failed / already exists / already bound
    │   ├── NotFound          404
    │   ├── Gone              410: watch resourceVersion too old; re-list
    │   └── TooManyRequests   429: e.g. an eviction refused by a PodDisruptionBudget; retry later
    ├── BackendError          a node backend failed
    │   ├── NvmlError
    │   └── CriError
    │       ├── CriUnavailable   containerd unreachable or restarting (transient)
    │       └── CriNotFound      the sandbox/container/image does not exist
    └── RequestError          bad input from a caller (HTTP 400)
        └── PodSpecError      a pod's flexlease labels/annotations/GPU quantities are malformed

Placement failure is a verdict, never an exception.
"""

from __future__ import annotations


class FlexleaseError(Exception):
    """Root of every error flexlease raises on purpose."""


class StoreError(FlexleaseError):
    """A store operation failed. ``status`` is the HTTP-equivalent status code when known."""

    status: int | None = None

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class Conflict(StoreError):
    """409: optimistic-concurrency precondition failed, object exists, or pod already bound."""

    status = 409


class NotFound(StoreError):
    """404: the object does not exist."""

    status = 404


class Gone(StoreError):
    """410: the requested resourceVersion is too old to watch from; list again."""

    status = 410


class TooManyRequests(StoreError):
    """429: refused for now (an eviction blocked by a PodDisruptionBudget); retry later.

    ``retry_after`` is the server's hint in seconds, when given.
    """

    status = 429

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BackendError(FlexleaseError):
    """A node-side backend (NVML, CRI) failed."""


class NvmlError(BackendError):
    """NVML failed (init, query or event wait)."""


class CriError(BackendError):
    """A CRI RuntimeService/ImageService call failed or containerd is unreachable."""


class CriUnavailable(CriError):
    """containerd is unreachable, restarting or did not answer in time (gRPC UNAVAILABLE,
    DEADLINE_EXCEEDED): transient, retry later."""


class CriNotFound(CriError):
    """The runtime has no such sandbox, container or image (gRPC NOT_FOUND)."""


class BrokerError(BackendError):
    """The message broker (NATS JetStream) failed or is unreachable."""


class StreamNotFound(BrokerError):
    """The broker has no such stream (a job's ``flexlease.io/stream`` names one that does not
    exist)."""


class OffsetConflict(BrokerError):
    """A committed offset changed under the committer (another trainer instance committed):
    the caller is no longer the job's only reader."""


class MetricsError(BackendError):
    """A metrics query failed: the server is unreachable or answered an error, or the answer is
    not one finite sample (the lease autopilot's demand sources)."""


class RequestError(FlexleaseError):
    """A caller sent something malformed; maps to HTTP 400 with this message."""


class PodSpecError(RequestError):
    """A pod carries a malformed flexlease label/annotation or GPU quantity."""


class ProfileError(RequestError):
    """A framework dependency profile (YAML) is malformed: schema, unknown role or command, or a
    dependency cycle. ``source`` is the file (or ``<string>``), ``line``/``column`` are 1-based
    (0 when unknown), ``path`` is the offending field (``commands[1].preconditions[0].ready``)."""

    def __init__(self, message: str, *, source: str, line: int = 0, column: int = 0, path: str = "") -> None:
        where = f"{source}:{line}:{column}" if line else source
        super().__init__(f"{where}: {path + ': ' if path else ''}{message}")
        self.source = source
        self.line = line
        self.column = column
        self.path = path
        self.reason = message


class ExecError(BackendError):
    """A command could not be run in a container (exec transport failed, container gone, timed
    out). A command that ran and exited non-zero is not an error: it is an exit code."""
