"""Image pre-pull through the CRI ImageService, and the node's image inventory.

:meth:`ImagePuller.ensure` makes an image present on the node: an image already there is a
cache hit (no pull, as kubelet's ``IfNotPresent``); otherwise it is pulled with CRI PullImage
while progress is logged every ``progress_interval_seconds`` (CRI reports no byte progress,
so progress is the elapsed time and the in-flight gauge), then the pulled size and duration
are recorded. Concurrent requests for one image share one pull.

Metrics (prefix ``flexlease_``, injected registry): pulls by outcome, pull duration, bytes
pulled, pulls in progress, the image cache hit ratio (``η_cache`` of formula 1) and the
measured registry throughput (``B_reg``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from flexlease import tasks
from flexlease.cri import api_pb2
from flexlease.logging import ctx
from nodeagent.cache.rate import EwmaRate
from nodeagent.cache.singleflight import SingleFlight
from nodeagent.cri.client import ImageService

log = logging.getLogger(__name__)

IMAGE_PULLS: Final = "flexlease_image_pulls"
IMAGE_PULL_SECONDS: Final = "flexlease_image_pull_seconds"
IMAGE_PULL_BYTES: Final = "flexlease_image_pull_bytes"
IMAGE_PULLS_IN_PROGRESS: Final = "flexlease_image_pulls_in_progress"
IMAGE_CACHE_HIT_RATIO: Final = "flexlease_image_cache_hit_ratio"
IMAGE_PULL_BYTES_PER_SECOND: Final = "flexlease_image_pull_bytes_per_second"

OUTCOME_CACHED: Final = "cached"
OUTCOME_PULLED: Final = "pulled"
OUTCOME_FAILED: Final = "failed"


class ImageMetrics:
    """The image cache's Prometheus metrics, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.pulls = Counter(
            IMAGE_PULLS,
            "Image pre-pull requests by outcome (cached: already on the node; pulled; failed).",
            ["outcome"],
            registry=registry,
        )
        for outcome in (OUTCOME_CACHED, OUTCOME_PULLED, OUTCOME_FAILED):
            self.pulls.labels(outcome=outcome)
        self.pull_seconds = Histogram(
            IMAGE_PULL_SECONDS,
            "Duration of CRI PullImage calls that pulled an image, seconds.",
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=registry,
        )
        self.pull_bytes = Counter(IMAGE_PULL_BYTES, "Bytes of images pulled (image size).", registry=registry)
        self.in_progress = Gauge(IMAGE_PULLS_IN_PROGRESS, "Image pulls running now.", registry=registry)
        self.hit_ratio = Gauge(
            IMAGE_CACHE_HIT_RATIO,
            "Share of image requests served by images already on the node, ratio 0-1 (eta_cache).",
            registry=registry,
        )
        self.bytes_per_second = Gauge(
            IMAGE_PULL_BYTES_PER_SECOND,
            "Measured registry pull throughput (EWMA), bytes per second (B_reg).",
            registry=registry,
        )


@dataclass(frozen=True, slots=True)
class PullResult:
    """Outcome of :meth:`ImagePuller.ensure`. ``cached``: the image was already present and
    nothing was pulled. ``seconds``: time spent in PullImage (0 when cached). ``size_bytes``:
    the image size the runtime reports. ``shared``: this request waited on another's pull."""

    image: str
    image_ref: str
    cached: bool
    seconds: float
    size_bytes: int
    shared: bool = False


class ImagePuller:
    """Pre-pulls images through CRI and keeps the node's image cache statistics.

    ``images``: the CRI ImageService. ``progress_interval_seconds``: how often a running pull
    is logged. ``clock``: monotonic seconds (tests inject one).
    """

    def __init__(
        self,
        images: ImageService,
        metrics: ImageMetrics,
        *,
        progress_interval_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._images = images
        self._metrics = metrics
        self._interval = progress_interval_seconds
        self._clock = clock
        self._flight: SingleFlight[str, PullResult] = SingleFlight()
        self._hits = 0
        self._requests = 0
        self.registry_rate = EwmaRate()

    @property
    def images(self) -> ImageService:
        """The CRI ImageService this puller pulls through."""
        return self._images

    @property
    def hit_ratio(self) -> float | None:
        """``η_cache``: hits / requests since start, ratio 0–1; None before any request."""
        return self._hits / self._requests if self._requests else None

    def _count(self, *, hit: bool) -> None:
        self._requests += 1
        self._hits += int(hit)
        self._metrics.hit_ratio.set(self._hits / self._requests)

    async def ensure(
        self, image: str, *, sandbox_config: api_pb2.PodSandboxConfig | None = None, pod: str | None = None
    ) -> PullResult:
        """Make ``image`` present on the node. Raises ``CriError`` when the pull fails
        (``CriNotFound`` when the registry has no such image)."""
        present = await self._images.image_status(image)
        if present is not None:
            self._count(hit=True)
            self._metrics.pulls.labels(outcome=OUTCOME_CACHED).inc()
            log.debug("image already present", extra=ctx(image=image, pod=pod))
            return PullResult(image, present.id, cached=True, seconds=0.0, size_bytes=present.size_bytes)
        self._count(hit=False)
        result, shared = await self._flight.do(image, lambda: self._pull(image, sandbox_config, pod))
        if shared:
            return PullResult(
                result.image, result.image_ref, False, result.seconds, result.size_bytes, shared=True
            )
        return result

    async def _pull(
        self, image: str, sandbox_config: api_pb2.PodSandboxConfig | None, pod: str | None
    ) -> PullResult:
        log.info("pulling image", extra=ctx(image=image, pod=pod))
        self._metrics.in_progress.inc()
        started = self._clock()
        task = asyncio.create_task(
            self._images.pull_image(image, sandbox_config=sandbox_config), name=f"pull:{image}"
        )
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self._interval)
                if done:
                    break
                log.info(
                    "still pulling image",
                    extra=ctx(image=image, pod=pod, elapsed_seconds=round(self._clock() - started, 1)),
                )
            image_ref = task.result()
        except BaseException:
            self._metrics.pulls.labels(outcome=OUTCOME_FAILED).inc()
            raise
        finally:
            self._metrics.in_progress.dec()
            if not task.done():
                with contextlib.suppress(Exception):  # the pull is given up: what it ended with is moot
                    await tasks.stop(task)
        seconds = self._clock() - started
        status = await self._images.image_status(image)
        size = status.size_bytes if status is not None else 0
        self._metrics.pulls.labels(outcome=OUTCOME_PULLED).inc()
        self._metrics.pull_seconds.observe(seconds)
        self._metrics.pull_bytes.inc(size)
        rate = self.registry_rate.observe(size, seconds)
        if rate is not None:
            self._metrics.bytes_per_second.set(rate)
        log.info(
            "pulled image",
            extra=ctx(image=image, pod=pod, seconds=round(seconds, 3), size_bytes=size, image_ref=image_ref),
        )
        return PullResult(image, image_ref, cached=False, seconds=seconds, size_bytes=size)

    async def inventory(self) -> list[str]:
        """The node's images for ``GPUNode.status.cache.images``: every repo tag, sorted
        (images known only by digest are listed by their first repo digest)."""
        return sorted(await self.sizes())

    async def sizes(self) -> dict[str, int]:
        """The node's images by the names :meth:`inventory` lists, each with the runtime's
        size in bytes (``GPUNode.status.prelaunch.imageBytes``: S_img of formula 1)."""
        out: dict[str, int] = {}
        for image in await self._images.list_images():
            names = image.repo_tags or image.repo_digests[:1]
            for name in names:
                out[name] = image.size_bytes
        return out
