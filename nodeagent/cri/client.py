"""A narrow CRI client: the RuntimeService/ImageService calls the agent makes, over gRPC.

The agent codes against two Protocols, :class:`RuntimeService` and :class:`ImageService`,
which carry only our calls (openkruise's ``criruntime`` pattern). :class:`GrpcCri` implements
both over ``grpc.aio`` against containerd's CRI plugin (``runtime.v1``, wire format from
``api.proto``); :mod:`nodeagent.cri.fake` implements them in memory for unit tests.

Results are frozen values (:class:`SandboxInfo`, :class:`ContainerInfo`, :class:`ImageInfo`);
configurations are the CRI's own messages (``api_pb2.PodSandboxConfig``,
``api_pb2.ContainerConfig``). Every call carries a deadline. Errors are only
:class:`flexlease.errors.CriError` and its subclasses, with the gRPC error chained:
:class:`~flexlease.errors.CriUnavailable` (containerd absent, restarting, or past the
deadline; transient), :class:`~flexlease.errors.CriNotFound` (no such object), otherwise
:class:`~flexlease.errors.CriError` (the runtime refused).
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Protocol, TypeVar, runtime_checkable

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from flexlease import errors
from flexlease.cri import api_pb2

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT: Final = "unix:///run/containerd/containerd.sock"
CRI_API_VERSION: Final = "v1"
_MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024

# Labels kubelet puts on sandboxes and containers (pkg/kubelet/types/labels.go).
LABEL_POD_NAME: Final = "io.kubernetes.pod.name"
LABEL_POD_NAMESPACE: Final = "io.kubernetes.pod.namespace"
LABEL_POD_UID: Final = "io.kubernetes.pod.uid"
LABEL_CONTAINER_NAME: Final = "io.kubernetes.container.name"
# Annotations kubelet puts on every container it creates (pkg/kubelet/kuberuntime/labels.go):
# the container spec's hash (hex of HashContainer) and the restart count (= metadata.attempt).
ANN_CONTAINER_HASH: Final = "io.kubernetes.container.hash"
ANN_CONTAINER_RESTART_COUNT: Final = "io.kubernetes.container.restartCount"
ANN_POD_TERMINATION_GRACE_PERIOD: Final = "io.kubernetes.pod.terminationGracePeriod"


class SandboxState(enum.StrEnum):
    READY = "SANDBOX_READY"
    NOTREADY = "SANDBOX_NOTREADY"


class ContainerState(enum.StrEnum):
    CREATED = "CONTAINER_CREATED"
    RUNNING = "CONTAINER_RUNNING"
    EXITED = "CONTAINER_EXITED"
    UNKNOWN = "CONTAINER_UNKNOWN"


@dataclass(frozen=True, slots=True)
class RuntimeVersion:
    """``VersionResponse``: e.g. ``containerd``, ``1.6.20``, API ``v1``."""

    runtime_name: str
    runtime_version: str
    runtime_api_version: str


@dataclass(frozen=True, slots=True)
class SandboxInfo:
    """One pod sandbox. ``ip`` is the primary pod IP from PodSandboxStatus (None from
    ListPodSandbox, which does not report it, or for host-network sandboxes).
    ``created_at_ns``: nanoseconds since the epoch."""

    id: str
    name: str
    namespace: str
    uid: str
    attempt: int
    state: SandboxState
    created_at_ns: int
    ip: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    """One container. ``image`` is the image as requested (``ImageSpec.image``), ``image_ref``
    the resolved reference (digest or image id). Times in nanoseconds since the epoch, 0 when
    not reached. ``exit_code``/``reason``/``message`` are set once the container exited
    (ContainerStatus only; ListContainers leaves them empty)."""

    id: str
    sandbox_id: str
    name: str
    attempt: int
    image: str
    image_ref: str
    state: ContainerState
    created_at_ns: int = 0
    started_at_ns: int = 0
    finished_at_ns: int = 0
    exit_code: int = 0
    reason: str = ""
    message: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """One image on the node. ``size_bytes``: the runtime's image size (for containerd, the
    sum of its content blobs, i.e. roughly the bytes a cold pull transfers)."""

    id: str
    repo_tags: tuple[str, ...]
    repo_digests: tuple[str, ...]
    size_bytes: int


@dataclass(frozen=True, slots=True)
class ExecResult:
    """``ExecSyncResponse``: captured output (bytes) and the exit code."""

    stdout: bytes
    stderr: bytes
    exit_code: int


@runtime_checkable
class RuntimeService(Protocol):
    """The CRI RuntimeService calls flexlease makes. Raise only ``CriError`` subclasses."""

    async def version(self) -> RuntimeVersion: ...

    async def run_pod_sandbox(self, config: api_pb2.PodSandboxConfig, *, runtime_handler: str = "") -> str:
        """Create and start a sandbox; returns its id."""
        ...

    async def stop_pod_sandbox(self, sandbox_id: str) -> None: ...

    async def remove_pod_sandbox(self, sandbox_id: str) -> None: ...

    async def pod_sandbox_status(self, sandbox_id: str) -> SandboxInfo:
        """Raises ``CriNotFound`` when the sandbox does not exist."""
        ...

    async def pod_sandbox_config(self, sandbox_id: str) -> api_pb2.PodSandboxConfig:
        """The config the sandbox was created with (from the verbose status)."""
        ...

    async def list_pod_sandboxes(
        self, *, labels: Mapping[str, str] | None = None, state: SandboxState | None = None
    ) -> list[SandboxInfo]: ...

    async def create_container(
        self,
        sandbox_id: str,
        config: api_pb2.ContainerConfig,
        sandbox_config: api_pb2.PodSandboxConfig,
    ) -> str:
        """Create (not start) a container in the sandbox; returns its id."""
        ...

    async def start_container(self, container_id: str) -> None: ...

    async def stop_container(self, container_id: str, *, timeout_seconds: int) -> None:
        """SIGTERM, then SIGKILL after ``timeout_seconds``. Idempotent."""
        ...

    async def remove_container(self, container_id: str) -> None: ...

    async def list_containers(
        self,
        *,
        sandbox_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        state: ContainerState | None = None,
    ) -> list[ContainerInfo]: ...

    async def container_status(self, container_id: str) -> ContainerInfo:
        """Raises ``CriNotFound`` when the container does not exist."""
        ...

    async def container_config(self, container_id: str) -> api_pb2.ContainerConfig:
        """The config the container was created with (from the verbose status)."""
        ...

    async def exec_sync(
        self, container_id: str, cmd: Sequence[str], *, timeout_seconds: int
    ) -> ExecResult: ...


@runtime_checkable
class ImageService(Protocol):
    """The CRI ImageService calls flexlease makes. Raise only ``CriError`` subclasses."""

    async def pull_image(self, image: str, *, sandbox_config: api_pb2.PodSandboxConfig | None = None) -> str:
        """Pull ``image``; returns the image reference (id). Deadline: the pull timeout."""
        ...

    async def image_status(self, image: str) -> ImageInfo | None:
        """The image, or None when it is not on the node."""
        ...

    async def list_images(self) -> list[ImageInfo]: ...

    async def remove_image(self, image: str) -> None: ...


def sandbox_info(
    status: api_pb2.PodSandboxStatus | api_pb2.PodSandbox, *, ip: str | None = None
) -> SandboxInfo:
    """Convert a ``PodSandboxStatus`` or ``PodSandbox`` message into :class:`SandboxInfo`."""
    return SandboxInfo(
        id=status.id,
        name=status.metadata.name,
        namespace=status.metadata.namespace,
        uid=status.metadata.uid,
        attempt=status.metadata.attempt,
        state=SandboxState(api_pb2.PodSandboxState.Name(status.state)),
        created_at_ns=status.created_at,
        ip=ip,
        labels=dict(status.labels),
        annotations=dict(status.annotations),
    )


def container_info(c: api_pb2.ContainerStatus | api_pb2.Container, *, sandbox_id: str = "") -> ContainerInfo:
    """Convert a ``ContainerStatus`` or ``Container`` message into :class:`ContainerInfo`."""
    state = ContainerState(api_pb2.ContainerState.Name(c.state))
    if isinstance(c, api_pb2.Container):
        return ContainerInfo(
            id=c.id,
            sandbox_id=c.pod_sandbox_id,
            name=c.metadata.name,
            attempt=c.metadata.attempt,
            image=c.image.image,
            image_ref=c.image_ref,
            state=state,
            created_at_ns=c.created_at,
            labels=dict(c.labels),
            annotations=dict(c.annotations),
        )
    return ContainerInfo(
        id=c.id,
        sandbox_id=sandbox_id,
        name=c.metadata.name,
        attempt=c.metadata.attempt,
        image=c.image.image,
        image_ref=c.image_ref,
        state=state,
        created_at_ns=c.created_at,
        started_at_ns=c.started_at,
        finished_at_ns=c.finished_at,
        exit_code=c.exit_code,
        reason=c.reason,
        message=c.message,
        labels=dict(c.labels),
        annotations=dict(c.annotations),
    )


def image_info(image: api_pb2.Image) -> ImageInfo:
    return ImageInfo(
        id=image.id,
        repo_tags=tuple(image.repo_tags),
        repo_digests=tuple(image.repo_digests),
        size_bytes=image.size,
    )


_M = TypeVar("_M", bound=Message)


def config_from_verbose_info(info: Mapping[str, str], message: _M, *, what: str) -> _M:
    """Decode the creation config from a verbose status ``info`` map into ``message``.

    containerd puts a JSON document under ``info["info"]`` whose ``config`` is the CRI config
    the object was created with (Go JSON of the CRI types: snake_case keys, enums as
    numbers). Fields this proto subset does not declare are dropped. Raises ``CriError``
    when the runtime did not report it.
    """
    raw = info.get("info")
    if not raw:
        raise errors.CriError(f"{what}: the runtime reported no verbose info (need containerd's CRI plugin)")
    try:
        doc = json.loads(raw)
        config = doc.get("config") if isinstance(doc, dict) else None
        if not isinstance(config, dict):
            raise errors.CriError(f"{what}: verbose info carries no 'config'")
        return json_format.ParseDict(config, message, ignore_unknown_fields=True)
    except (ValueError, json_format.ParseError) as exc:
        raise errors.CriError(f"{what}: cannot decode the verbose config: {exc}") from exc


_SANDBOX_STATES: Final[Mapping[SandboxState, api_pb2.PodSandboxState]] = {
    SandboxState.READY: api_pb2.SANDBOX_READY,
    SandboxState.NOTREADY: api_pb2.SANDBOX_NOTREADY,
}
_CONTAINER_STATES: Final[Mapping[ContainerState, api_pb2.ContainerState]] = {
    ContainerState.CREATED: api_pb2.CONTAINER_CREATED,
    ContainerState.RUNNING: api_pb2.CONTAINER_RUNNING,
    ContainerState.EXITED: api_pb2.CONTAINER_EXITED,
    ContainerState.UNKNOWN: api_pb2.CONTAINER_UNKNOWN,
}


def _method(service: str, name: str) -> str:
    descriptor = api_pb2.DESCRIPTOR.services_by_name[service].methods_by_name[name]
    return f"/{descriptor.containing_service.full_name}/{descriptor.name}"


class GrpcCri:
    """CRI over gRPC (``grpc.aio``) to a runtime socket, default containerd's.

    ``endpoint``: ``unix:///path/to.sock`` (or any gRPC target). ``timeout_seconds``: deadline
    of every call but PullImage, which gets ``pull_timeout_seconds``; StopContainer gets its
    grace period on top. Use ``async with GrpcCri(...) as cri`` or ``await connect()`` /
    ``await close()``. :meth:`connect` probes Version and raises ``CriUnavailable`` when
    nothing answers on the socket, ``CriError`` when the runtime does not speak CRI v1.
    """

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        timeout_seconds: float = 10.0,
        pull_timeout_seconds: float = 600.0,
    ) -> None:
        if timeout_seconds <= 0 or pull_timeout_seconds <= 0:
            raise errors.RequestError("CRI timeouts must be positive seconds")
        self.endpoint = endpoint
        self.timeout_seconds = timeout_seconds
        self.pull_timeout_seconds = pull_timeout_seconds
        self._channel: Any = None
        self._calls: dict[str, Any] = {}
        self.runtime: RuntimeVersion | None = None

    async def __aenter__(self) -> GrpcCri:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def open(self) -> None:
        """Create the channel without probing (calls fail with ``CriUnavailable`` until the
        runtime answers; gRPC reconnects by itself). Needs a running event loop."""
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(
                self.endpoint,
                options=[
                    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
                    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
                ],
            )
            self._calls = {}

    async def connect(self) -> RuntimeVersion:
        """Open the channel and probe Version. Returns the runtime's version; on failure the
        channel is closed again."""
        self.open()
        try:
            version = await self.version()
        except errors.CriError:
            await self.close()
            raise
        try:
            self._check(version)
        except errors.CriError:
            await self.close()
            raise
        log.debug(
            "connected to CRI runtime",
            extra={
                "endpoint": self.endpoint,
                "runtime": version.runtime_name,
                "version": version.runtime_version,
            },
        )
        return version

    async def probe(self) -> RuntimeVersion:
        """Version on the open channel (no close on failure): ``CriUnavailable`` while the
        runtime is away, ``CriError`` when it does not speak CRI v1."""
        version = await self.version()
        self._check(version)
        return version

    def _check(self, version: RuntimeVersion) -> None:
        if version.runtime_api_version != CRI_API_VERSION:
            raise errors.CriError(
                f"{self.endpoint}: runtime {version.runtime_name} {version.runtime_version} speaks CRI "
                f"{version.runtime_api_version!r}, need {CRI_API_VERSION!r}"
            )
        self.runtime = version

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        self._calls = {}
        if channel is not None:
            await channel.close()

    async def _unary(
        self,
        service: str,
        name: str,
        request: Message,
        response_type: type[_M],
        *,
        deadline_seconds: float | None = None,
        what: str = "",
    ) -> _M:
        if self._channel is None:
            raise errors.CriUnavailable(
                f"CRI {name}: not connected to {self.endpoint} (call connect() first)"
            )
        call = self._calls.get(name)
        if call is None:
            call = self._channel.unary_unary(
                _method(service, name),
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=response_type.FromString,
            )
            self._calls[name] = call
        deadline = self.timeout_seconds if deadline_seconds is None else deadline_seconds
        try:
            response: _M = await call(request, timeout=deadline)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc, f"CRI {name}{' ' + what if what else ''}", deadline) from exc
        return response

    def _error(self, exc: Any, what: str, deadline: float) -> errors.CriError:
        code = exc.code()
        details = exc.details() or ""
        if code == grpc.StatusCode.UNAVAILABLE:
            return errors.CriUnavailable(f"{what}: no CRI runtime answering at {self.endpoint}: {details}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return errors.CriUnavailable(f"{what}: no answer from {self.endpoint} within {deadline:g} s")
        if code == grpc.StatusCode.NOT_FOUND:
            return errors.CriNotFound(f"{what}: not found: {details}")
        return errors.CriError(f"{what}: {code.name}: {details}")

    # RuntimeService

    async def version(self) -> RuntimeVersion:
        r = await self._unary(
            "RuntimeService", "Version", api_pb2.VersionRequest(version="0.1.0"), api_pb2.VersionResponse
        )
        return RuntimeVersion(r.runtime_name, r.runtime_version, r.runtime_api_version)

    async def run_pod_sandbox(self, config: api_pb2.PodSandboxConfig, *, runtime_handler: str = "") -> str:
        r = await self._unary(
            "RuntimeService",
            "RunPodSandbox",
            api_pb2.RunPodSandboxRequest(config=config, runtime_handler=runtime_handler),
            api_pb2.RunPodSandboxResponse,
            what=f"{config.metadata.namespace}/{config.metadata.name}",
        )
        return r.pod_sandbox_id

    async def stop_pod_sandbox(self, sandbox_id: str) -> None:
        await self._unary(
            "RuntimeService",
            "StopPodSandbox",
            api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox_id),
            api_pb2.StopPodSandboxResponse,
            what=sandbox_id,
        )

    async def remove_pod_sandbox(self, sandbox_id: str) -> None:
        await self._unary(
            "RuntimeService",
            "RemovePodSandbox",
            api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id),
            api_pb2.RemovePodSandboxResponse,
            what=sandbox_id,
        )

    async def _sandbox_status(self, sandbox_id: str, *, verbose: bool) -> api_pb2.PodSandboxStatusResponse:
        return await self._unary(
            "RuntimeService",
            "PodSandboxStatus",
            api_pb2.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=verbose),
            api_pb2.PodSandboxStatusResponse,
            what=sandbox_id,
        )

    async def pod_sandbox_status(self, sandbox_id: str) -> SandboxInfo:
        r = await self._sandbox_status(sandbox_id, verbose=False)
        return sandbox_info(r.status, ip=r.status.network.ip or None)

    async def pod_sandbox_config(self, sandbox_id: str) -> api_pb2.PodSandboxConfig:
        r = await self._sandbox_status(sandbox_id, verbose=True)
        return config_from_verbose_info(r.info, api_pb2.PodSandboxConfig(), what=f"sandbox {sandbox_id}")

    async def list_pod_sandboxes(
        self, *, labels: Mapping[str, str] | None = None, state: SandboxState | None = None
    ) -> list[SandboxInfo]:
        f = api_pb2.PodSandboxFilter(label_selector=dict(labels or {}))
        if state is not None:
            f.state.state = _SANDBOX_STATES[state]
        r = await self._unary(
            "RuntimeService",
            "ListPodSandbox",
            api_pb2.ListPodSandboxRequest(filter=f),
            api_pb2.ListPodSandboxResponse,
        )
        return [sandbox_info(item) for item in r.items]

    async def create_container(
        self,
        sandbox_id: str,
        config: api_pb2.ContainerConfig,
        sandbox_config: api_pb2.PodSandboxConfig,
    ) -> str:
        r = await self._unary(
            "RuntimeService",
            "CreateContainer",
            api_pb2.CreateContainerRequest(
                pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox_config
            ),
            api_pb2.CreateContainerResponse,
            what=f"{config.metadata.name} (attempt {config.metadata.attempt}) in {sandbox_id}",
        )
        return r.container_id

    async def start_container(self, container_id: str) -> None:
        await self._unary(
            "RuntimeService",
            "StartContainer",
            api_pb2.StartContainerRequest(container_id=container_id),
            api_pb2.StartContainerResponse,
            what=container_id,
        )

    async def stop_container(self, container_id: str, *, timeout_seconds: int) -> None:
        if timeout_seconds < 0:
            raise errors.RequestError("stop_container: timeout_seconds must be >= 0")
        await self._unary(
            "RuntimeService",
            "StopContainer",
            api_pb2.StopContainerRequest(container_id=container_id, timeout=timeout_seconds),
            api_pb2.StopContainerResponse,
            deadline_seconds=self.timeout_seconds + timeout_seconds,
            what=container_id,
        )

    async def remove_container(self, container_id: str) -> None:
        await self._unary(
            "RuntimeService",
            "RemoveContainer",
            api_pb2.RemoveContainerRequest(container_id=container_id),
            api_pb2.RemoveContainerResponse,
            what=container_id,
        )

    async def list_containers(
        self,
        *,
        sandbox_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        state: ContainerState | None = None,
    ) -> list[ContainerInfo]:
        f = api_pb2.ContainerFilter(pod_sandbox_id=sandbox_id or "", label_selector=dict(labels or {}))
        if state is not None:
            f.state.state = _CONTAINER_STATES[state]
        r = await self._unary(
            "RuntimeService",
            "ListContainers",
            api_pb2.ListContainersRequest(filter=f),
            api_pb2.ListContainersResponse,
        )
        return [container_info(c) for c in r.containers]

    async def _container_status(self, container_id: str, *, verbose: bool) -> api_pb2.ContainerStatusResponse:
        return await self._unary(
            "RuntimeService",
            "ContainerStatus",
            api_pb2.ContainerStatusRequest(container_id=container_id, verbose=verbose),
            api_pb2.ContainerStatusResponse,
            what=container_id,
        )

    async def container_status(self, container_id: str) -> ContainerInfo:
        # The sandbox id is not part of ContainerStatus; containerd reports it in the
        # verbose info, ListContainers reports it too: take it from there.
        r = await self._container_status(container_id, verbose=True)
        sandbox_id = ""
        raw = r.info.get("info")
        if raw:
            try:
                doc = json.loads(raw)
                sandbox_id = str(doc.get("sandboxID", "")) if isinstance(doc, dict) else ""
            except ValueError:
                sandbox_id = ""
        return container_info(r.status, sandbox_id=sandbox_id)

    async def container_config(self, container_id: str) -> api_pb2.ContainerConfig:
        r = await self._container_status(container_id, verbose=True)
        return config_from_verbose_info(r.info, api_pb2.ContainerConfig(), what=f"container {container_id}")

    async def exec_sync(self, container_id: str, cmd: Sequence[str], *, timeout_seconds: int) -> ExecResult:
        if timeout_seconds <= 0:
            raise errors.RequestError("exec_sync: timeout_seconds must be > 0")
        r = await self._unary(
            "RuntimeService",
            "ExecSync",
            api_pb2.ExecSyncRequest(container_id=container_id, cmd=list(cmd), timeout=timeout_seconds),
            api_pb2.ExecSyncResponse,
            deadline_seconds=self.timeout_seconds + timeout_seconds,
            what=f"{container_id} {list(cmd)!r}",
        )
        return ExecResult(r.stdout, r.stderr, r.exit_code)

    # ImageService

    async def pull_image(self, image: str, *, sandbox_config: api_pb2.PodSandboxConfig | None = None) -> str:
        request = api_pb2.PullImageRequest(image=api_pb2.ImageSpec(image=image))
        if sandbox_config is not None:
            request.sandbox_config.CopyFrom(sandbox_config)
        r = await self._unary(
            "ImageService",
            "PullImage",
            request,
            api_pb2.PullImageResponse,
            deadline_seconds=self.pull_timeout_seconds,
            what=image,
        )
        return r.image_ref

    async def image_status(self, image: str) -> ImageInfo | None:
        r = await self._unary(
            "ImageService",
            "ImageStatus",
            api_pb2.ImageStatusRequest(image=api_pb2.ImageSpec(image=image)),
            api_pb2.ImageStatusResponse,
            what=image,
        )
        return image_info(r.image) if r.HasField("image") else None

    async def list_images(self) -> list[ImageInfo]:
        r = await self._unary(
            "ImageService", "ListImages", api_pb2.ListImagesRequest(), api_pb2.ListImagesResponse
        )
        return [image_info(i) for i in r.images]

    async def remove_image(self, image: str) -> None:
        await self._unary(
            "ImageService",
            "RemoveImage",
            api_pb2.RemoveImageRequest(image=api_pb2.ImageSpec(image=image)),
            api_pb2.RemoveImageResponse,
            what=image,
        )
