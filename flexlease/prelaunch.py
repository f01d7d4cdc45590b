"""The prelaunch window W of WeFlex §3.3 ("Local Loading Complemented by Standby Prelaunch"),
formulas 1–3, pure::

    T_img  = (1 - η_cache) · S_img / min(B_net, B_reg)                      (1)
    T_ckpt = (1 - η_ckpt)  · S_ckpt / min(B_net, B_stor) + S_ckpt / B_gpu    (2)
    W      = T_gpu_adj + max(T_img, T_ckpt)                                  (3)

Shared by the node agent (:mod:`nodeagent.prelaunch`: the prelaunch command, the hot-restart
and staging windows) and the extender's lease autopilot (:mod:`extender.autopilot.leadtime`:
the lead time of a Reclaim, from the rates the agents publish in ``GPUNode.status.prelaunch``),
which may not import each other. No I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flexlease import errors

GBIT: float = 1e9 / 8
"""One gigabit per second in bytes per second."""


@dataclass(frozen=True, slots=True)
class PrelaunchInputs:
    """Inputs of formulas 1–3. Sizes in bytes (≥ 0), bandwidths in bytes per second (> 0),
    hit ratios 0–1, ``gpu_adjust_seconds`` ≥ 0.

    ``image_bytes`` S_img, ``checkpoint_bytes`` S_ckpt; ``net_bps`` B_net (node network),
    ``registry_bps`` B_reg (image registry), ``storage_bps`` B_stor (checkpoint storage),
    ``gpu_bps`` B_gpu (host→GPU / GPU interconnect); ``image_hit_ratio`` η_cache,
    ``checkpoint_hit_ratio`` η_ckpt; ``gpu_adjust_seconds`` T_gpu_adj (GPU release and
    reclaim).
    """

    image_bytes: float
    checkpoint_bytes: float
    net_bps: float
    registry_bps: float
    storage_bps: float
    gpu_bps: float
    image_hit_ratio: float = 0.0
    checkpoint_hit_ratio: float = 0.0
    gpu_adjust_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class PrelaunchWindow:
    """W and its parts, in seconds."""

    image_seconds: float
    checkpoint_seconds: float
    gpu_adjust_seconds: float
    window_seconds: float


def prelaunch_window(inputs: PrelaunchInputs) -> PrelaunchWindow:
    """The prelaunch window W (WeFlex §3.3, formulas 1–3; see the module docstring).

    In: :class:`PrelaunchInputs` (bytes, bytes/s, ratios 0–1, seconds). Out:
    :class:`PrelaunchWindow` in seconds. Raises :class:`flexlease.errors.RequestError` when a
    size or ``gpu_adjust_seconds`` is negative or not finite, a bandwidth is not a finite
    positive number, or a hit ratio is outside 0–1.
    """
    for name in ("image_bytes", "checkpoint_bytes", "gpu_adjust_seconds"):
        value = getattr(inputs, name)
        if not math.isfinite(value) or value < 0:
            raise errors.RequestError(f"prelaunch window: {name} must be a finite number >= 0, got {value}")
    for name in ("net_bps", "registry_bps", "storage_bps", "gpu_bps"):
        value = getattr(inputs, name)
        if not math.isfinite(value) or value <= 0:
            raise errors.RequestError(
                f"prelaunch window: {name} must be a finite number > 0 bytes/s, got {value}"
            )
    for name in ("image_hit_ratio", "checkpoint_hit_ratio"):
        value = getattr(inputs, name)
        if not 0.0 <= value <= 1.0:
            raise errors.RequestError(f"prelaunch window: {name} must be a ratio in [0, 1], got {value}")
    t_img = (1 - inputs.image_hit_ratio) * inputs.image_bytes / min(inputs.net_bps, inputs.registry_bps)
    t_ckpt = (1 - inputs.checkpoint_hit_ratio) * inputs.checkpoint_bytes / min(
        inputs.net_bps, inputs.storage_bps
    ) + inputs.checkpoint_bytes / inputs.gpu_bps
    return PrelaunchWindow(
        image_seconds=t_img,
        checkpoint_seconds=t_ckpt,
        gpu_adjust_seconds=inputs.gpu_adjust_seconds,
        window_seconds=inputs.gpu_adjust_seconds + max(t_img, t_ckpt),
    )
