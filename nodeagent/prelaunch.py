"""Standby prelaunch (WeFlex §3.3, "Local Loading Complemented by Standby Prelaunch"): the
prelaunch window W, and a command that prewarms a standby node.

:func:`prelaunch_window` (from :mod:`flexlease.prelaunch`, shared with the extender's lease
autopilot) is formulas 1–3 of the paper, pure::

    T_img  = (1 - η_cache) · S_img / min(B_net, B_reg)                      (1)
    T_ckpt = (1 - η_ckpt)  · S_ckpt / min(B_net, B_stor) + S_ckpt / B_gpu    (2)
    W      = T_gpu_adj + max(T_img, T_ckpt)                                  (3)

The command pulls the image through CRI and fetches the checkpoint into the node's
checkpoint cache at the same time (W takes the max of the two, so they overlap), then
reports when the node was ready and how long it took against W::

    python -m nodeagent.prelaunch --image REF --checkpoint URL --checkpoint-id ID --sha256 HEX \\
        [--cri-endpoint unix:///run/containerd/containerd.sock] [--cache-dir DIR] \\
        [--image-bytes N] [--net-bps B] [--registry-bps B] [--storage-bps B] [--gpu-bps B] \\
        [--gpu-adjust-seconds S]

It prints one JSON object: ``ready`` (bool), ``readyAt`` (RFC 3339), ``elapsedSeconds``,
``window`` (predicted before the work, from the given bandwidths, the sizes and whether the
image/checkpoint were already on the node), ``measuredWindow`` (the same formulas with the
bandwidths measured during this run), the per-part seconds, bytes and cache hits, and
``error`` when something failed (exit status 1). Moving the checkpoint into GPU memory
(``S_ckpt / B_gpu``) is part of the prediction only: loading the model is the training
job's start, not this command's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

import flexlease.logging
from flexlease import errors
from flexlease.config import AgentSettings
from flexlease.prelaunch import GBIT, PrelaunchInputs, PrelaunchWindow, prelaunch_window
from nodeagent.cache.checkpoints import CheckpointCache, CheckpointMetrics, FetchResult
from nodeagent.cache.images import ImageMetrics, ImagePuller, PullResult
from nodeagent.cri.client import DEFAULT_ENDPOINT, GrpcCri, ImageService

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PrelaunchReport:
    """What :func:`prelaunch` did: predicted and measured windows, the two transfers and
    the wall-clock time until the node was ready (seconds)."""

    ready: bool
    ready_at: datetime | None
    elapsed_seconds: float
    window: PrelaunchWindow
    measured_window: PrelaunchWindow | None
    image: PullResult | None
    checkpoint: FetchResult | None
    error: str | None = None

    def to_json_obj(self) -> dict[str, Any]:
        def win(w: PrelaunchWindow | None) -> dict[str, float] | None:
            if w is None:
                return None
            return {
                "imageSeconds": round(w.image_seconds, 4),
                "checkpointSeconds": round(w.checkpoint_seconds, 4),
                "gpuAdjustSeconds": round(w.gpu_adjust_seconds, 4),
                "windowSeconds": round(w.window_seconds, 4),
            }

        out: dict[str, Any] = {
            "ready": self.ready,
            "readyAt": self.ready_at.isoformat() if self.ready_at else None,
            "elapsedSeconds": round(self.elapsed_seconds, 4),
            "window": win(self.window),
            "measuredWindow": win(self.measured_window),
        }
        if self.image is not None:
            out["image"] = {
                "ref": self.image.image,
                "cached": self.image.cached,
                "seconds": round(self.image.seconds, 4),
                "sizeBytes": self.image.size_bytes,
            }
        if self.checkpoint is not None:
            out["checkpoint"] = {
                "id": self.checkpoint.entry.id,
                "result": self.checkpoint.result,
                "seconds": round(self.checkpoint.seconds, 4),
                "sizeBytes": self.checkpoint.entry.size_bytes,
                "path": str(self.checkpoint.entry.path),
            }
        if self.error:
            out["error"] = self.error
        return out


@dataclass(frozen=True, slots=True)
class Bandwidths:
    """Assumed bandwidths for the prediction, bytes per second, and T_gpu_adj in seconds."""

    net_bps: float = 10 * GBIT
    registry_bps: float = 10 * GBIT
    storage_bps: float = 10 * GBIT
    gpu_bps: float = 25e9
    gpu_adjust_seconds: float = 0.0


async def prelaunch(
    cri: ImageService,
    cache: CheckpointCache,
    *,
    image: str,
    checkpoint_url: str,
    checkpoint_id: str,
    sha256: str,
    image_bytes: int | None,
    bandwidths: Bandwidths,
    metrics_registry: CollectorRegistry,
    puller: ImagePuller | None = None,
) -> PrelaunchReport:
    """Prewarm this node: pull ``image`` and fetch the checkpoint concurrently; report
    readiness and the time taken against W. Sizes not given are taken from the node or the
    store (the image size is known before the pull only when it is already present; else
    ``image_bytes`` or, failing that, the size found after the pull is used for W).
    ``puller``: the node's image puller to share (its metrics and in-flight pulls); default a
    new one registering on ``metrics_registry``."""
    if puller is None:
        puller = ImagePuller(cri, ImageMetrics(metrics_registry))
    present = await cri.image_status(image)
    cached_ckpt = cache.get(checkpoint_id)
    ckpt_hit = cached_ckpt is not None and cached_ckpt.sha256 == sha256.removeprefix("sha256:").lower()
    ckpt_size = cached_ckpt.size_bytes if ckpt_hit and cached_ckpt is not None else None
    started = time.monotonic()
    pulled: PullResult | None = None
    fetched: FetchResult | None = None
    error: str | None = None
    try:
        async with asyncio.TaskGroup() as tg:
            pull_task = tg.create_task(puller.ensure(image), name=f"prelaunch:image:{image}")
            fetch_task = tg.create_task(
                cache.fetch(checkpoint_id, checkpoint_url, sha256=sha256),
                name=f"prelaunch:checkpoint:{checkpoint_id}",
            )
        pulled, fetched = pull_task.result(), fetch_task.result()
    except* errors.FlexleaseError as group:
        error = "; ".join(str(e) for e in group.exceptions)
    elapsed = time.monotonic() - started
    s_img = float(
        image_bytes
        if image_bytes is not None
        else (present.size_bytes if present is not None else (pulled.size_bytes if pulled else 0))
    )
    s_ckpt = float(ckpt_size if ckpt_size is not None else (fetched.entry.size_bytes if fetched else 0))
    predicted = prelaunch_window(
        PrelaunchInputs(
            image_bytes=s_img,
            checkpoint_bytes=s_ckpt,
            net_bps=bandwidths.net_bps,
            registry_bps=bandwidths.registry_bps,
            storage_bps=bandwidths.storage_bps,
            gpu_bps=bandwidths.gpu_bps,
            image_hit_ratio=1.0 if present is not None else 0.0,
            checkpoint_hit_ratio=1.0 if ckpt_hit else 0.0,
            gpu_adjust_seconds=bandwidths.gpu_adjust_seconds,
        )
    )
    measured: PrelaunchWindow | None = None
    if pulled is not None and fetched is not None:
        measured = prelaunch_window(
            PrelaunchInputs(
                image_bytes=s_img,
                checkpoint_bytes=s_ckpt,
                net_bps=bandwidths.net_bps,
                registry_bps=puller.registry_rate.value or bandwidths.registry_bps,
                storage_bps=cache.storage_rate.value or bandwidths.storage_bps,
                gpu_bps=bandwidths.gpu_bps,
                image_hit_ratio=1.0 if pulled.cached else 0.0,
                checkpoint_hit_ratio=1.0 if fetched.hit else 0.0,
                gpu_adjust_seconds=bandwidths.gpu_adjust_seconds,
            )
        )
    ready = error is None
    return PrelaunchReport(
        ready=ready,
        ready_at=datetime.now(UTC) if ready else None,
        elapsed_seconds=elapsed,
        window=predicted,
        measured_window=measured,
        image=pulled,
        checkpoint=fetched,
        error=error,
    )


def _parse(argv: list[str] | None) -> argparse.Namespace:
    defaults = AgentSettings()
    b = Bandwidths()
    p = argparse.ArgumentParser(
        prog="python -m nodeagent.prelaunch",
        description="Prewarm a standby node: pull the image, fetch the checkpoint, report readiness vs W.",
    )
    p.add_argument("--image", required=True, help="image reference to pull through CRI")
    p.add_argument(
        "--checkpoint", required=True, help="fsspec URL of the checkpoint (file://, http://, s3://...)"
    )
    p.add_argument("--checkpoint-id", required=True, help="checkpoint id (the pod's flexlease.io/checkpoint)")
    p.add_argument("--sha256", required=True, help="expected sha256 of the checkpoint (hex)")
    p.add_argument("--cri-endpoint", default=DEFAULT_ENDPOINT, help="CRI socket (default: %(default)s)")
    p.add_argument(
        "--cri-timeout", type=float, default=defaults.cri_timeout_seconds, help="seconds per CRI call"
    )
    p.add_argument(
        "--pull-timeout", type=float, default=defaults.image_pull_timeout_seconds, help="seconds for the pull"
    )
    p.add_argument(
        "--cache-dir", type=Path, default=defaults.checkpoint_dir, help="checkpoint cache directory"
    )
    p.add_argument(
        "--cache-bytes", type=int, default=defaults.checkpoint_cache_bytes, help="cache size bound"
    )
    p.add_argument("--image-bytes", type=int, default=None, help="S_img when known in advance (bytes)")
    p.add_argument("--net-bps", type=float, default=b.net_bps, help="B_net, bytes/s (default 10 Gbit/s)")
    p.add_argument("--registry-bps", type=float, default=b.registry_bps, help="B_reg, bytes/s")
    p.add_argument("--storage-bps", type=float, default=b.storage_bps, help="B_stor, bytes/s")
    p.add_argument("--gpu-bps", type=float, default=b.gpu_bps, help="B_gpu, bytes/s (default 25 GB/s)")
    p.add_argument("--gpu-adjust-seconds", type=float, default=0.0, help="T_gpu_adj, seconds")
    p.add_argument("--log-level", default="WARNING")
    return p.parse_args(argv)


async def _main(args: argparse.Namespace) -> PrelaunchReport:
    registry = CollectorRegistry()
    cache = CheckpointCache(
        args.cache_dir, capacity_bytes=args.cache_bytes, metrics=CheckpointMetrics(registry)
    )
    await cache.open()
    async with GrpcCri(
        args.cri_endpoint, timeout_seconds=args.cri_timeout, pull_timeout_seconds=args.pull_timeout
    ) as cri:
        return await prelaunch(
            cri,
            cache,
            image=args.image,
            checkpoint_url=args.checkpoint,
            checkpoint_id=args.checkpoint_id,
            sha256=args.sha256,
            image_bytes=args.image_bytes,
            bandwidths=Bandwidths(
                net_bps=args.net_bps,
                registry_bps=args.registry_bps,
                storage_bps=args.storage_bps,
                gpu_bps=args.gpu_bps,
                gpu_adjust_seconds=args.gpu_adjust_seconds,
            ),
            metrics_registry=registry,
        )


def main(argv: list[str] | None = None) -> int:
    """Entry point. Exit status 0 when the node is ready, 1 when the prelaunch failed, 2 on
    bad arguments or an unreachable runtime."""
    args = _parse(argv)
    flexlease.logging.setup(args.log_level, "text")
    try:
        report = asyncio.run(_main(args))
    except errors.FlexleaseError as exc:
        print(json.dumps({"ready": False, "error": str(exc)}))
        return 2
    print(json.dumps(report.to_json_obj(), indent=2))
    return 0 if report.ready else 1


if __name__ == "__main__":
    sys.exit(main())
