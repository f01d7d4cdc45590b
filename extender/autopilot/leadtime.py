"""The lead time of a Reclaim: how long before a predicted rise the autopilot writes it. Pure.

``leadTime: auto`` is what the GPUs need to be running again at the predicted peak:
the reclaim grace period (the low-priority pods on the lent GPUs get their notice and are
evicted after ``gracePeriodSeconds``) plus the prelaunch window W of WeFlex §3.3 (formulas
1–3, :func:`flexlease.prelaunch.prelaunch_window`: the job's image pulled and its checkpoint
loaded on the node, T_gpu_adj), plus the autopilot's resync period (a decision is taken at a
reconcile, at most that late). W is computed per node from what its agent publishes in
``GPUNode.status.prelaunch`` — the registry and storage throughputs it measured, its assumed
network and GPU bandwidths and T_gpu_adj, the sizes of its images — with the job's own sizes:
S_img of the job's image (from any node that has it) and S_ckpt of its checkpoint (from any
node's ``status.cache.checkpoints``). η_cache is 1 on a node that has the image, else 0; η_ckpt
likewise (a miss is assumed wherever the file is not: the lead time errs on the long side).
The nodes are those holding the job's lent GPUs (where its pods will start again), or every
node that publishes prelaunch inputs when none are lent; the slowest node's W counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from flexlease.api.resources import GPUNode
from flexlease.prelaunch import PrelaunchInputs, prelaunch_window


@dataclass(frozen=True, slots=True)
class JobArtifacts:
    """What the job's pods start from: its image reference and checkpoint id (either None when
    its pods name none)."""

    image: str | None
    checkpoint: str | None


@dataclass(frozen=True, slots=True)
class LeadTime:
    """``seconds`` = ``grace_seconds`` + ``window_seconds`` (W of ``node``, the slowest) +
    ``resync_seconds``; ``source``: how it was found, for the policy's status."""

    seconds: float
    window_seconds: float
    grace_seconds: float
    resync_seconds: float
    node: str | None
    source: str


def fixed(seconds: float) -> LeadTime:
    """``leadTime: <seconds>``: the operator's number, as it is."""
    return LeadTime(seconds, 0.0, 0.0, 0.0, None, "spec.leadTime")


def _sizes(nodes: Iterable[GPUNode], job: JobArtifacts) -> tuple[float | None, float | None]:
    image: float | None = None
    checkpoint: float | None = None
    for node in nodes:
        pre = node.status.prelaunch
        if job.image is not None and pre is not None and job.image in pre.image_bytes:
            image = max(image or 0.0, float(pre.image_bytes[job.image]))
        for entry in node.status.cache.checkpoints:
            if entry.id == job.checkpoint:
                checkpoint = max(checkpoint or 0.0, float(entry.size_bytes))
    return image, checkpoint


def auto(
    nodes: Mapping[str, GPUNode],
    job: JobArtifacts,
    *,
    lent_on: Iterable[str],
    grace_seconds: float,
    resync_seconds: float,
) -> LeadTime:
    """``leadTime: auto`` (see the module docstring) over ``nodes`` (GPUNodes by name) for the
    job's ``job`` artifacts; ``lent_on``: the nodes holding its lent GPUs. With no node
    publishing prelaunch inputs, W counts 0 and ``source`` says so. Never raises: the agents'
    values were validated by :class:`~flexlease.api.resources.PrelaunchStatus`."""
    image_bytes, checkpoint_bytes = _sizes(nodes.values(), job)
    lent = [n for n in dict.fromkeys(lent_on) if n in nodes and nodes[n].status.prelaunch is not None]
    candidates = lent or [n for n, node in sorted(nodes.items()) if node.status.prelaunch is not None]
    slowest: tuple[float, str] | None = None
    for name in candidates:
        gpunode = nodes[name]
        pre = gpunode.status.prelaunch
        assert pre is not None
        has_image = job.image is not None and job.image in pre.image_bytes
        has_ckpt = any(c.id == job.checkpoint for c in gpunode.status.cache.checkpoints)
        window = prelaunch_window(
            PrelaunchInputs(
                image_bytes=image_bytes or 0.0,
                checkpoint_bytes=checkpoint_bytes or 0.0,
                net_bps=pre.net_bytes_per_second,
                registry_bps=pre.registry_bytes_per_second,
                storage_bps=pre.storage_bytes_per_second,
                gpu_bps=pre.gpu_bytes_per_second,
                image_hit_ratio=1.0 if has_image else 0.0,
                checkpoint_hit_ratio=1.0 if has_ckpt else 0.0,
                gpu_adjust_seconds=pre.gpu_adjust_seconds,
            )
        ).window_seconds
        if slowest is None or window > slowest[0]:
            slowest = (window, name)
    unknown = [
        what
        for what, ref, size in (
            ("image", job.image, image_bytes),
            ("checkpoint", job.checkpoint, checkpoint_bytes),
        )
        if ref is not None and size is None
    ]
    notes = [f"{what} size unknown (counted 0)" for what in unknown]
    if slowest is None:
        return LeadTime(
            grace_seconds + resync_seconds,
            0.0,
            grace_seconds,
            resync_seconds,
            None,
            "auto: no node publishes prelaunch inputs; W counted 0",
        )
    window, node = slowest
    where = "lent GPUs' nodes" if lent else "all nodes"
    source = (
        f"auto: W={window:.1f}s on {node} (slowest of the {where}) "
        f"+ grace {grace_seconds:g}s + resync {resync_seconds:g}s"
    )
    if notes:
        source += "; " + "; ".join(notes)
    return LeadTime(
        window + grace_seconds + resync_seconds, window, grace_seconds, resync_seconds, node, source
    )
