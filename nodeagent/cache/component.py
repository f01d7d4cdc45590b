"""Agent component ``cache``: the node's CRI connection, image puller and checkpoint cache,
``GPUNode.status.cache`` (``images``, ``checkpoints``) for cache-aware placement, and
``GPUNode.status.prelaunch`` (the node's measured registry and storage throughputs, its assumed
bandwidths and its images' sizes) for the lease autopilot's lead time (prelaunch window W).

:class:`NodeRuntime` is shared by this component and ``hotrestart``
(:mod:`nodeagent.hotrestart.component`): one CRI channel, one :class:`ImagePuller`, one
:class:`CheckpointCache`, so hit ratios and throughputs describe the whole node. The CRI
channel is opened at once and probed until containerd answers (gRPC reconnects by itself);
``flexlease_cri_up`` says whether the last probe succeeded. The component is ready once the
checkpoint cache is open, whether or not containerd is up yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any, Final

from prometheus_client import CollectorRegistry, Gauge

from flexlease import errors
from flexlease.config import AgentSettings
from flexlease.logging import ctx
from flexlease.store.base import Kind, Store
from nodeagent.cache.checkpoints import CheckpointCache, CheckpointMetrics
from nodeagent.cache.images import ImageMetrics, ImagePuller
from nodeagent.cri.client import GrpcCri
from nodeagent.prelaunch import Bandwidths

if TYPE_CHECKING:
    from nodeagent.context import AgentContext

log = logging.getLogger(__name__)

CRI_UP: Final = "flexlease_cri_up"
PROBE_SECONDS: Final = 5.0


class NodeRuntime:
    """The node's CRI client, image puller and checkpoint cache, built from the agent
    settings (``cri_endpoint``, ``cri_timeout_seconds``, ``image_pull_timeout_seconds``,
    ``checkpoint_dir``, ``checkpoint_cache_bytes``) with metrics on ``registry``."""

    def __init__(self, settings: AgentSettings, registry: CollectorRegistry) -> None:
        self.cri = GrpcCri(
            settings.cri_endpoint,
            timeout_seconds=settings.cri_timeout_seconds,
            pull_timeout_seconds=settings.image_pull_timeout_seconds,
        )
        self.images = ImagePuller(self.cri, ImageMetrics(registry))
        self.checkpoints = CheckpointCache(
            settings.checkpoint_dir,
            capacity_bytes=settings.checkpoint_cache_bytes,
            metrics=CheckpointMetrics(registry),
        )
        self.cri_up = Gauge(
            CRI_UP, "1 when the CRI runtime answered the last Version probe.", registry=registry
        )
        self.cri_up.set(0)
        self.connected = asyncio.Event()

    async def keep_probing(self, *, interval_seconds: float = PROBE_SECONDS) -> None:
        """Open the channel and probe Version every ``interval_seconds`` until cancelled;
        sets :attr:`connected` at the first answer, logs when the runtime comes and goes."""
        self.cri.open()
        up: bool | None = None
        while True:
            try:
                version = await self.cri.probe()
            except errors.CriError as exc:
                if up is not False:
                    log.warning(
                        "CRI runtime not available", extra=ctx(endpoint=self.cri.endpoint, error=str(exc))
                    )
                up = False
                self.cri_up.set(0)
            else:
                if up is not True:
                    log.info(
                        "CRI runtime available",
                        extra=ctx(
                            endpoint=self.cri.endpoint,
                            runtime=version.runtime_name,
                            version=version.runtime_version,
                        ),
                    )
                up = True
                self.cri_up.set(1)
                self.connected.set()
            await asyncio.sleep(interval_seconds)


def cache_status(images: list[str], checkpoints: list[dict[str, Any]]) -> dict[str, Any]:
    """``GPUNode.status.cache``: ``{"images": [...], "checkpoints": [{id, sizeBytes, sha256}]}``."""
    return {"images": images, "checkpoints": checkpoints}


def prelaunch_status(
    image_bytes: dict[str, int],
    *,
    registry_bps: float | None,
    storage_bps: float | None,
    assumed: Bandwidths,
) -> dict[str, Any]:
    """``GPUNode.status.prelaunch`` (:class:`flexlease.api.resources.PrelaunchStatus`): the
    measured registry (``registry_bps``) and storage (``storage_bps``) throughputs in bytes per
    second where there are some (else the ``assumed`` ones), the assumed network and GPU
    bandwidths and T_gpu_adj, and the images' sizes in bytes."""
    measured = [name for name, value in (("registry", registry_bps), ("storage", storage_bps)) if value]
    return {
        "netBytesPerSecond": assumed.net_bps,
        "registryBytesPerSecond": registry_bps or assumed.registry_bps,
        "storageBytesPerSecond": storage_bps or assumed.storage_bps,
        "gpuBytesPerSecond": assumed.gpu_bps,
        "gpuAdjustSeconds": assumed.gpu_adjust_seconds,
        "measured": measured,
        "imageBytes": image_bytes,
    }


class CacheComponent:
    """Agent component ``cache``: opens the checkpoint cache, keeps the CRI probe running and
    publishes ``GPUNode.status.cache`` every ``interval_seconds`` when it changed."""

    name = "cache"

    def __init__(self, runtime: NodeRuntime, *, interval_seconds: float = 30.0) -> None:
        self.runtime = runtime
        self._interval = interval_seconds
        self._open = False
        self._published: dict[str, Any] | None = None

    def ready(self) -> bool:
        return self._open

    async def run(self, ctx: AgentContext) -> None:
        await self.runtime.checkpoints.open()
        self._open = True
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.runtime.keep_probing(), name="cache:cri-probe")
                tg.create_task(self._publish_loop(ctx.store, ctx.node), name="cache:status")
        finally:
            await self.runtime.cri.close()

    async def _publish_loop(self, store: Store, node: str) -> None:
        while True:
            try:
                await self.publish(store, node)
            except (errors.CriError, errors.StoreError) as exc:
                log.warning("GPUNode cache status not published", extra=ctx(node=node, error=str(exc)))
            if self.runtime.connected.is_set():
                await asyncio.sleep(self._interval)
            else:  # publish the images as soon as containerd answers, not an interval later
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.runtime.connected.wait(), self._interval)

    async def publish(self, store: Store, node: str) -> bool:
        """Patch ``status.cache`` and ``status.prelaunch`` of the node's GPUNode when they
        changed; returns whether it wrote. Skips (False) while the GPUNode does not exist yet
        (the status component creates it). Raises ``CriError``/``StoreError``."""
        sizes = await self.runtime.images.sizes() if self.runtime.connected.is_set() else {}
        desired = {
            "cache": cache_status(sorted(sizes), self.runtime.checkpoints.inventory()),
            "prelaunch": prelaunch_status(
                sizes,
                registry_bps=self.runtime.images.registry_rate.value,
                storage_bps=self.runtime.checkpoints.storage_rate.value,
                assumed=Bandwidths(),
            ),
        }
        if desired == self._published:
            return False
        try:
            await store.patch(Kind.GPUNODE, node, {"status": desired}, subresource="status")
        except errors.NotFound:
            return False
        self._published = desired
        return True
