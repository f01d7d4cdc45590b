"""From demand to a decision: the plan (clamped, stabilized), its target now, and whether to
write a ``Lend`` or ``Reclaim`` lease or hold. Pure; no I/O.

* The **plan** is the demand per step (``stepSeconds``) over :data:`HORIZON_SECONDS` from the
  step holding *now*, clamped to ``[minGPUs, maxGPUs]`` and stabilized
  (:func:`extender.autopilot.stabilize.stabilize`).
* Its **target** is the most it needs from now to now + lead time: a rise is met a lead time
  early (the Reclaim's GPUs are running at the predicted peak), a fall is lent when it comes.
* The **decision** compares the target with what the job's pods hold (*allocated*):

  - a lease of the owner is in flight (not Done or Failed, whoever wrote it) → hold: never two;
  - target < allocated → ``Lend`` allocated − target GPUs, at most what its non-critical pods
    hold (the GPUs of critical-role pods — coordinator, Ray head, rank 0 — are never lent, as
    the lease controller's Lend also refuses);
  - target > allocated → ``Reclaim`` target − allocated GPUs, at most what is out on loan;
  - else hold.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from extender.autopilot.stabilize import segments, stabilize
from flexlease.api.policy import DecisionAction, GPULeasePolicySpec

HORIZON_SECONDS = 86_400.0
"""How far the plan looks ahead (the status shows it; the target needs now + lead time)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """``gpus[i]`` from ``start + i·step_seconds`` (epoch seconds)."""

    start: float
    step_seconds: float
    gpus: tuple[int, ...]

    def target(self, now: float, lead_seconds: float) -> int:
        """The most the plan needs in ``[now, now + lead_seconds]``."""
        first = max(0, int((now - self.start) // self.step_seconds))
        last = max(first, int((now + max(0.0, lead_seconds) - self.start) // self.step_seconds))
        window = self.gpus[first : last + 1] or self.gpus[-1:]
        return max(window)

    def changes(self) -> list[tuple[float, int]]:
        """Change points ``(start, gpus)``: the first step and every step that differs."""
        out: list[tuple[float, int]] = []
        at = self.start
        for value, steps in segments(self.gpus):
            out.append((at, value))
            at += steps * self.step_seconds
        return out

    def next_change(self, now: float, lead_seconds: float) -> float | None:
        """Seconds from ``now`` until :meth:`target` next changes, or None within the horizon:
        a change point ``c`` moves the target when ``now + lead`` reaches it (a rise) or when
        ``now`` does (a fall)."""
        soonest: float | None = None
        for at, _ in self.changes()[1:]:
            for due in (at - lead_seconds, at):
                if due > now and (soonest is None or due < soonest):
                    soonest = due
        return None if soonest is None else soonest - now


def plan_steps(step_seconds: float) -> int:
    """Steps in :data:`HORIZON_SECONDS` at ``step_seconds``."""
    return max(1, math.ceil(HORIZON_SECONDS / step_seconds))


def plan_start(now: float, step_seconds: float) -> float:
    """The start of the step holding ``now`` (steps are aligned to the epoch)."""
    return math.floor(now / step_seconds) * step_seconds


def build_plan(raw: Sequence[int], *, start: float, spec: GPULeasePolicySpec) -> Plan:
    """``raw`` demand per step clamped to ``[minGPUs, maxGPUs]`` and stabilized with the
    policy's ``rho`` and ``tauSeconds``."""
    clamped = [min(spec.max_gpus, max(spec.min_gpus, g)) for g in raw]
    stable = stabilize(
        clamped,
        step_seconds=spec.step_seconds,
        rho=spec.stabilization.rho,
        tau_seconds=spec.stabilization.tau_seconds,
    )
    return Plan(start=start, step_seconds=float(spec.step_seconds), gpus=tuple(stable))


@dataclass(frozen=True, slots=True)
class Allocation:
    """What the job has: GPUs its pods hold (``allocated``), of those the ones of non-critical
    pods (``lendable``), and its GPUs out on loan (tagged for it, held by none of its pods)."""

    allocated: int
    lendable: int
    outstanding: int


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do: ``action`` with ``count`` GPUs (0 for Hold) and why."""

    action: DecisionAction
    count: int
    reason: str


def decide(target: int | None, have: Allocation, *, in_flight: Sequence[str]) -> Verdict:
    """The decision (see the module docstring). ``target`` None: the demand is unknown → hold.
    ``in_flight``: names of the owner's leases not Done or Failed."""
    if target is None:
        return Verdict(DecisionAction.HOLD, 0, "demand unknown: holding the allocation")
    if in_flight:
        return Verdict(
            DecisionAction.HOLD, 0, f"GPULease {', '.join(sorted(in_flight))} in flight: one at a time"
        )
    if target < have.allocated:
        want = have.allocated - target
        count = min(want, have.lendable)
        if count <= 0:
            return Verdict(
                DecisionAction.HOLD,
                0,
                f"target {target} < allocated {have.allocated}, but only critical-role pods hold GPUs",
            )
        capped = (
            "" if count == want else f" (capped: critical-role pods hold {have.allocated - have.lendable})"
        )
        return Verdict(
            DecisionAction.LEND, count, f"target {target} < allocated {have.allocated}: lend {count}{capped}"
        )
    if target > have.allocated:
        want = target - have.allocated
        count = min(want, have.outstanding)
        if count <= 0:
            return Verdict(
                DecisionAction.HOLD,
                0,
                f"target {target} > allocated {have.allocated}, but nothing is lent to reclaim",
            )
        capped = "" if count == want else f" (all {have.outstanding} lent)"
        return Verdict(
            DecisionAction.RECLAIM,
            count,
            f"target {target} > allocated {have.allocated}: reclaim {count}{capped}",
        )
    return Verdict(DecisionAction.HOLD, 0, f"at target ({target} GPUs)")
