"""An in-memory CRI runtime for unit tests of the logic above the client (image puller,
hot-restart decisions wiring, cache status): implements
:class:`~nodeagent.cri.client.RuntimeService` and :class:`~nodeagent.cri.client.ImageService`
with containerd's observable behaviour for the calls flexlease makes (ids, states, NOT_FOUND,
idempotent stop/remove, attempt bookkeeping). No I/O; real runtime behaviour is covered by
the tests on the containerd testbed.

Scripting: ``registry`` holds the images a pull can fetch (name → size in bytes);
``pull_gate`` (an ``asyncio.Event``) holds pulls until set; ``fail`` maps a method name to
the ``CriError`` its next call raises.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from flexlease import errors
from nodeagent.cri import api_pb2
from nodeagent.cri.client import (
    ContainerInfo,
    ContainerState,
    ExecResult,
    ImageInfo,
    RuntimeVersion,
    SandboxInfo,
    SandboxState,
)


class FakeCri:
    """In-memory RuntimeService + ImageService."""

    def __init__(self, *, registry: Mapping[str, int] | None = None) -> None:
        self.registry: dict[str, int] = dict(registry or {})
        self.images: dict[str, ImageInfo] = {}
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
        digest = hashlib.sha256(name.encode()).hexdigest()
        info = ImageInfo(id=f"sha256:{digest}", repo_tags=(name,), repo_digests=(), size_bytes=size_bytes)
        self.images[name] = info
        return info

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
                self.containers[cid] = replace(c, state=ContainerState.EXITED, finished_at_ns=time.time_ns())
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
        if config.image.image not in self.images:
            raise errors.CriError(f"image {config.image.image!r} not present on the node")
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
            image_ref=self.images[config.image.image].id,
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
        self.containers[container_id] = replace(c, state=ContainerState.RUNNING, started_at_ns=time.time_ns())

    async def stop_container(self, container_id: str, *, timeout_seconds: int) -> None:
        self._check("stop_container")
        c = self._container(container_id)
        if c.state is ContainerState.RUNNING:
            self.containers[container_id] = replace(
                c, state=ContainerState.EXITED, finished_at_ns=time.time_ns()
            )

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
            c
            for c in self.containers.values()
            if (sandbox_id is None or c.sandbox_id == sandbox_id)
            and all(c.labels.get(k) == v for k, v in (labels or {}).items())
            and (state is None or c.state is state)
        ]

    async def container_status(self, container_id: str) -> ContainerInfo:
        self._check("container_status")
        return self._container(container_id)

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
        if image not in self.registry:
            raise errors.CriNotFound(f"failed to resolve reference {image!r}: not found")
        return self.add_image(image, self.registry[image]).id

    async def image_status(self, image: str) -> ImageInfo | None:
        self._check("image_status")
        return self.images.get(image)

    async def list_images(self) -> list[ImageInfo]:
        self._check("list_images")
        return list(self.images.values())

    async def remove_image(self, image: str) -> None:
        self._check("remove_image")
        self.images.pop(image, None)
