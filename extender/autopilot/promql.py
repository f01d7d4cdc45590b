"""The ``prometheus`` demand source's arithmetic: a PromQL answer to GPUs, jumps and KALE's
reactive threshold fallback. Pure; the query itself is :mod:`extender.autopilot.metrics_source`.

* A reading of ``value`` (the job's input rate, lag …) needs ``ceil(value / perGPU)`` GPUs.
* A reading more than ``jumpRatio`` times above or below the previous good one is a *jump*:
  it is not trusted until the next reading confirms it (within ``jumpRatio`` of it); meanwhile
  the reactive fallback decides, as it does while the query fails.
* The reactive fallback (KALE's threshold rule, as an HPA would): one step of ``stepGPUs`` up
  from the job's current allocation while its signal is above ``scaleUpAbove``, one step down
  while below ``scaleDownBelow``, else hold. Without a fallback, or when its signal is not
  readable either, the demand is unknown and the autopilot holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flexlease.api.policy import ReactiveFallback

RELATIVE_TOLERANCE = 1e-9
"""``ceil`` forgives this much of floating-point error (1.1 / 0.1 = 11.000000000000002 is 11 GPUs)."""


def gpus_for(value: float, per_gpu: float) -> int:
    """``ceil(value / per_gpu)`` GPUs, 0 for a value <= 0. Raises ``ValueError`` for a value
    that is not finite or ``per_gpu`` <= 0."""
    if not math.isfinite(value):
        raise ValueError(f"demand value {value!r} is not a finite number")
    if per_gpu <= 0:
        raise ValueError(f"perGPU must be > 0, got {per_gpu!r}")
    ratio = value / per_gpu
    if ratio <= 0:
        return 0
    return math.ceil(ratio - RELATIVE_TOLERANCE * max(1.0, ratio))


def is_jump(value: float, previous: float | None, *, ratio: float) -> bool:
    """Whether ``value`` is more than ``ratio`` times above or below ``previous`` (the last
    trusted reading; None: nothing to compare, no jump). Zero against a positive value is a jump
    when ``previous`` is at least 1 (a rate that drops from 0.2 to 0 is not news)."""
    if previous is None:
        return False
    low, high = sorted((abs(value), abs(previous)))
    if low == 0:
        return high >= 1.0
    return high / low > ratio


@dataclass(frozen=True, slots=True)
class Reactive:
    """The fallback's answer: ``gpus`` (None: hold, demand unknown) and why."""

    gpus: int | None
    message: str


def reactive(signal: float | None, rule: ReactiveFallback | None, *, allocated: int) -> Reactive:
    """KALE's reactive threshold rule on ``signal`` (None: unreadable) from the ``allocated``
    GPUs (see the module docstring)."""
    if rule is None:
        return Reactive(None, "no reactive fallback configured: holding")
    if signal is None or not math.isfinite(signal):
        return Reactive(None, "fallback signal unreadable too: holding")
    if signal > rule.scale_up_above:
        return Reactive(
            allocated + rule.step_gpus, f"fallback signal {signal:g} > {rule.scale_up_above:g}: step up"
        )
    if rule.scale_down_below is not None and signal < rule.scale_down_below:
        return Reactive(
            max(0, allocated - rule.step_gpus),
            f"fallback signal {signal:g} < {rule.scale_down_below:g}: step down",
        )
    return Reactive(allocated, f"fallback signal {signal:g} within thresholds: hold")
