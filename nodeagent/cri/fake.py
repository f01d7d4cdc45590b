"""An in-memory CRI runtime for unit tests of the logic above the client (image puller,
hot-restart decisions wiring, cache status): implements
:class:`~nodeagent.cri.client.RuntimeService` and :class:`~nodeagent.cri.client.ImageService`
with containerd's observable behaviour for the calls flexlease makes. No I/O; real runtime
behaviour is covered by the tests on the containerd testbed.

containerd behaviours reproduced, with their source (``containerd/containerd``, CRI plugin,
``internal/cri/server`` and ``internal/cri/server/images``; reference parsing from
``distribution/reference``'s ``ParseDockerRef``):

* image references are normalised: ``busybox`` → ``docker.io/library/busybox:latest``,
  ``reg.example:5000/x`` → ``reg.example:5000/x:latest``; ImageStatus, PullImage,
  RemoveImage and CreateContainer find an image by any of its names, by its id
  (``sha256:…``) and by a repo digest (``repo@sha256:…``); ImageStatus of an unknown
  image answers no image (None), not an error;
* PullImage returns the image id (the config digest); images carry ``repo_tags`` and
  ``repo_digests`` (``<repo>@sha256:<manifest digest>``);
* ListContainers reports ``image`` as given in the ContainerConfig and ``image_ref`` = the
  image id, with no exit code (``container_list.go``); ContainerStatus reports ``image`` =
  the image's first repo tag and ``image_ref`` = its first repo digest, plus exit code,
  reason and finish time (``container_status.go``);
* StopContainer sends SIGTERM, waits up to ``timeout`` seconds, then SIGKILL; a timeout of
  0 kills at once (``container_stop.go``). A process ended by a signal exits 128 + signal:
  143 after SIGTERM, 137 after SIGKILL, with reason ``Error`` (any non-zero exit; 0 gives
  ``Completed``). StopPodSandbox kills its containers at once (137). Stop and remove are
  idempotent; NOT_FOUND for unknown ids; one (name, attempt) per sandbox;
* StartContainer of a container whose process cannot be started (an image whose entrypoint
  does not exist) fails, and the container is left exited with exit code 128, reason
  ``StartError`` and the runtime's message (``container_start.go``; seen on containerd
  1.6.20).

Scripting: ``registry`` holds the images a pull can fetch (reference → size in bytes);
``pull_gate`` (an ``asyncio.Event``) holds pulls until set; ``fail`` maps a method name to
the ``CriError`` its next call raises; ``ignores_sigterm`` names containers whose process
ignores SIGTERM (so StopContainer waits out its timeout, through ``sleep``, and kills);
``sigterm_exit`` gives the exit code of a container that traps SIGTERM and exits by itself;
``stops`` records each StopContainer as ``(container id, timeout seconds)``; ``unstartable``
names images (any reference the image is known by) whose containers fail to start.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Final

from flexlease import errors
from flexlease.cri import api_pb2
from nodeagent.cri.client import (
    ContainerInfo,
    ContainerState,
    ExecResult,
    ImageInfo,
    RuntimeVersion,
    SandboxInfo,
    SandboxState,
)

EXIT_SIGTERM: Final = 128 + 15
"""Exit code of a process ended by SIGTERM."""
EXIT_SIGKILL: Final = 128 + 9
"""Exit code of a process ended by SIGKILL."""

_DEFAULT_DOMAIN: Final = "docker.io"
_OFFICIAL_REPO_PREFIX: Final = "library/"
_DIGEST_RE: Final = re.compile(r"^sha256:[0-9a-f]{64}$")


def normalize_reference(ref: str) -> str:
    """A reference as containerd stores it (``ParseDockerRef``): the domain defaults to
    ``docker.io`` (the first component is a domain when it holds ``.`` or ``:`` or is
    ``localhost``), Docker Hub names of one component get ``library/``, and a reference with
    neither tag nor digest gets ``:latest``. Raises ``CriError`` on an empty or upper-case
    repository (which the parser refuses)."""
    if not ref or ref != ref.strip():
        raise errors.CriError(f"invalid reference format: {ref!r}")
    name, _, digest = ref.partition("@")
    tag = ""
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name.rsplit(":", 1)
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        domain, path = first, rest
    else:
        domain, path = _DEFAULT_DOMAIN, name
    if domain == _DEFAULT_DOMAIN and "/" not in path:
        path = _OFFICIAL_REPO_PREFIX + path
    if not path or path != path.lower():
        raise errors.CriError(f"invalid reference format: repository name must be lowercase: {ref!r}")
    out = f"{domain}/{path}"
    if digest:  # tagged and digested: ParseDockerRef drops the tag
        return f"{out}@{digest}"
    return f"{out}:{tag or 'latest'}"


def _repository(normalized: str) -> str:
    """``docker.io/library/x:tag`` → ``docker.io/library/x``."""
    name = normalized.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name.rsplit(":", 1)[0] if ":" in last else name


class FakeCri:
    """In-memory RuntimeService + ImageService."""

    def __init__(
        self,
        *,
        registry: Mapping[str, int] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.registry: dict[str, int] = {normalize_reference(k): v for k, v in (registry or {}).items()}
        self.images: dict[str, ImageInfo] = {}
        """Image id → image."""
        self.ignores_sigterm: set[str] = set()
        self.sigterm_exit: dict[str, int] = {}
        """Container name → the exit code its process exits with when it traps SIGTERM
        (default: it dies of the signal, 143)."""
        self.stops: list[tuple[str, int]] = []
        self.unstartable: set[str] = set()
        """Images whose entrypoint does not exist: StartContainer fails with StartError."""
        self._sleep = sleep
        self.sandboxes: dict[str, SandboxInfo] = {}
        self.sandbox_configs: dict[str, api_pb2.PodSandboxConfig] = {}
        self.containers: dict[str, ContainerInfo] = {}
        self.container_configs: dict[str, api_pb2.ContainerConfig] = {}
        self.pull_gate: asyncio.Event | None = None
        self.pulls: list[str] = []
        self.fail: dict[str, errors.CriError] = {}
        self._ids = itertools.count(1)
        self._ips = itertools.count(2)

    def _check(self, method: str) -> None:
        exc = self.fail.pop(method, None)
        if exc is not None:
            raise exc

    def _id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):08x}"

    def add_image(self, name: str, size_bytes: int) -> ImageInfo:
        """Put image ``name`` on the node (as a pull or an import would). Its id (config
        digest) and manifest digest derive from the normalised name, so one name is one
        image with one tag and one repo digest."""
        ref = normalize_reference(name)
        config_digest = hashlib.sha256(b"config:" + ref.encode()).hexdigest()
        manifest_digest = hashlib.sha256(b"manifest:" + ref.encode()).hexdigest()
        info = ImageInfo(
            id=f"sha256:{config_digest}",
            repo_tags=(ref,),
            repo_digests=(f"{_repository(ref)}@sha256:{manifest_digest}",),
            size_bytes=size_bytes,
        )
        self.images[info.id] = info
        return info

    def _resolve(self, ref: str) -> ImageInfo | None:
        """The image ``ref`` names: an id (``sha256:…`` or its 64 hex digits), a tag, or a
        repo digest, after normalisation (containerd's ``LocalResolve``)."""
        candidate = ref if ref.startswith("sha256:") else f"sha256:{ref}"
        if _DIGEST_RE.match(candidate) and candidate in self.images:
            return self.images[candidate]
        try:
            normalized = normalize_reference(ref)
        except errors.CriError:
            return None
        for info in self.images.values():
            if normalized in info.repo_tags or normalized in info.repo_digests:
                return info
        return None

    # RuntimeService

    async def version(self) -> RuntimeVersion:
        self._check("version")
        return RuntimeVersion("fake", "0", "v1")

    async def run_pod_sandbox(self, config: api_pb2.PodSandboxConfig, *, runtime_handler: str = "") -> str:
        self._check("run_pod_sandbox")
        sid = self._id("sb")
        m = config.metadata
        self.sandboxes[sid] = SandboxInfo(
            id=sid,
            name=m.name,
            namespace=m.namespace,
            uid=m.uid,
            attempt=m.attempt,
            state=SandboxState.READY,
            created_at_ns=time.time_ns(),
            ip=f"10.0.0.{next(self._ips)}",
            labels=dict(config.labels),
            annotations=dict(config.annotations),
        )
        self.sandbox_configs[sid] = config
        return sid

    async def stop_pod_sandbox(self, sandbox_id: str) -> None:
        self._check("stop_pod_sandbox")
        for cid, c in self.containers.items():
            if c.sandbox_id == sandbox_id and c.state is ContainerState.RUNNING:
                self.containers[cid] = _exited(c, EXIT_SIGKILL)
        if sandbox_id in self.sandboxes:
            self.sandboxes[sandbox_id] = replace(self.sandboxes[sandbox_id], state=SandboxState.NOTREADY)

    async def remove_pod_sandbox(self, sandbox_id: str) -> None:
        self._check("remove_pod_sandbox")
        self.sandboxes.pop(sandbox_id, None)
        self.sandbox_configs.pop(sandbox_id, None)
        for cid in [cid for cid, c in self.containers.items() if c.sandbox_id == sandbox_id]:
            del self.containers[cid]
            self.container_configs.pop(cid, None)

    async def pod_sandbox_status(self, sandbox_id: str) -> SandboxInfo:
        self._check("pod_sandbox_status")
        try:
            return self.sandboxes[sandbox_id]
        except KeyError:
            raise errors.CriNotFound(f"sandbox {sandbox_id} not found") from None

    async def pod_sandbox_config(self, sandbox_id: str) -> api_pb2.PodSandboxConfig:
        self._check("pod_sandbox_config")
        try:
            return self.sandbox_configs[sandbox_id]
        except KeyError:
            raise errors.CriNotFound(f"sandbox {sandbox_id} not found") from None

    async def list_pod_sandboxes(
        self, *, labels: Mapping[str, str] | None = None, state: SandboxState | None = None
    ) -> list[SandboxInfo]:
        self._check("list_pod_sandboxes")
        return [
            replace(s, ip=None)
            for s in self.sandboxes.values()
            if all(s.labels.get(k) == v for k, v in (labels or {}).items())
            and (state is None or s.state is state)
        ]

    async def create_container(
        self, sandbox_id: str, config: api_pb2.ContainerConfig, sandbox_config: api_pb2.PodSandboxConfig
    ) -> str:
        self._check("create_container")
        if sandbox_id not in self.sandboxes:
            raise errors.CriNotFound(f"sandbox {sandbox_id} not found")
        image = self._resolve(config.image.image)
        if image is None:
            raise errors.CriNotFound(
                f"failed to get image {config.image.image!r}: image {config.image.image!r}: not found"
            )
        name, attempt = config.metadata.name, config.metadata.attempt
        if any(
            c.sandbox_id == sandbox_id and c.name == name and c.attempt == attempt
            for c in self.containers.values()
        ):
            raise errors.CriError(f"container name {name!r} attempt {attempt} is reserved")
        cid = self._id("c")
        self.containers[cid] = ContainerInfo(
            id=cid,
            sandbox_id=sandbox_id,
            name=name,
            attempt=attempt,
            image=config.image.image,
            image_ref=image.id,
            state=ContainerState.CREATED,
            created_at_ns=time.time_ns(),
            labels=dict(config.labels),
            annotations=dict(config.annotations),
        )
        self.container_configs[cid] = config
        return cid

    def _container(self, container_id: str) -> ContainerInfo:
        try:
            return self.containers[container_id]
        except KeyError:
            raise errors.CriNotFound(f"container {container_id} not found") from None

    async def start_container(self, container_id: str) -> None:
        self._check("start_container")
        c = self._container(container_id)
        if c.state is not ContainerState.CREATED:
            raise errors.CriError(f"container {container_id} is in state {c.state.value}, not CREATED")
        broken = {info.id for ref in self.unstartable if (info := self._resolve(ref)) is not None}
        if c.image_ref in broken:
            message = (
                "failed to create containerd task: failed to create shim task: OCI runtime create failed: "
                'runc create failed: unable to start container process: exec: "/bin/no-such-entrypoint": '
                "stat /bin/no-such-entrypoint: no such file or directory: unknown"
            )
            self.containers[container_id] = replace(
                c,
                state=ContainerState.EXITED,
                finished_at_ns=time.time_ns(),
                exit_code=128,
                reason="StartError",
                message=message,
            )
            raise errors.CriError(f"CRI StartContainer {container_id}: UNKNOWN: {message}")
        self.containers[container_id] = replace(c, state=ContainerState.RUNNING, started_at_ns=time.time_ns())

    async def stop_container(self, container_id: str, *, timeout_seconds: int) -> None:
        """SIGTERM, then SIGKILL after ``timeout_seconds`` (at once when ≤ 0): exit 143 when
        the process ends on SIGTERM, 137 when killed. Idempotent on a stopped container."""
        self._check("stop_container")
        c = self._container(container_id)
        self.stops.append((container_id, timeout_seconds))
        if c.state is not ContainerState.RUNNING:
            return
        if timeout_seconds > 0 and c.name not in self.ignores_sigterm:
            code = self.sigterm_exit.get(c.name, EXIT_SIGTERM)
        else:
            if timeout_seconds > 0:
                await self._sleep(timeout_seconds)
            code = EXIT_SIGKILL
        current = self.containers.get(container_id)
        if current is not None and current.state is ContainerState.RUNNING:
            self.containers[container_id] = _exited(current, code)

    async def remove_container(self, container_id: str) -> None:
        self._check("remove_container")
        self.containers.pop(container_id, None)
        self.container_configs.pop(container_id, None)

    async def list_containers(
        self,
        *,
        sandbox_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        state: ContainerState | None = None,
    ) -> list[ContainerInfo]:
        self._check("list_containers")
        return [
            replace(c, started_at_ns=0, finished_at_ns=0, exit_code=0, reason="", message="")
            for c in self.containers.values()
            if (sandbox_id is None or c.sandbox_id == sandbox_id)
            and all(c.labels.get(k) == v for k, v in (labels or {}).items())
            and (state is None or c.state is state)
        ]

    async def container_status(self, container_id: str) -> ContainerInfo:
        """The container with ``image`` = its image's first repo tag and ``image_ref`` = its
        first repo digest (the id when the image has none or is gone)."""
        self._check("container_status")
        c = self._container(container_id)
        info = self.images.get(c.image_ref)
        if info is None:
            return c
        return replace(
            c,
            image=info.repo_tags[0] if info.repo_tags else c.image,
            image_ref=info.repo_digests[0] if info.repo_digests else info.id,
        )

    async def container_config(self, container_id: str) -> api_pb2.ContainerConfig:
        self._check("container_config")
        self._container(container_id)
        return self.container_configs[container_id]

    async def exec_sync(self, container_id: str, cmd: Sequence[str], *, timeout_seconds: int) -> ExecResult:
        self._check("exec_sync")
        if self._container(container_id).state is not ContainerState.RUNNING:
            raise errors.CriError(f"container {container_id} is not running")
        return ExecResult(b"", b"", 0)

    # ImageService

    async def pull_image(self, image: str, *, sandbox_config: api_pb2.PodSandboxConfig | None = None) -> str:
        self._check("pull_image")
        self.pulls.append(image)
        if self.pull_gate is not None:
            await self.pull_gate.wait()
        ref = normalize_reference(image)
        if ref not in self.registry:
            raise errors.CriNotFound(f"failed to resolve reference {ref!r}: {ref}: not found")
        return self.add_image(ref, self.registry[ref]).id

    async def image_status(self, image: str) -> ImageInfo | None:
        self._check("image_status")
        return self._resolve(image)

    async def list_images(self) -> list[ImageInfo]:
        self._check("list_images")
        return list(self.images.values())

    async def remove_image(self, image: str) -> None:
        self._check("remove_image")
        info = self._resolve(image)
        if info is not None:
            del self.images[info.id]


def _exited(c: ContainerInfo, exit_code: int) -> ContainerInfo:
    """``c`` after its process ended with ``exit_code`` (reason ``Completed`` for 0, else
    ``Error``, as containerd's ContainerStatus reports)."""
    return replace(
        c,
        state=ContainerState.EXITED,
        finished_at_ns=time.time_ns(),
        exit_code=exit_code,
        reason="Completed" if exit_code == 0 else "Error",
    )
