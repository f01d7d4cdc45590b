"""KALE's plan stabilization (Kuaishou, SoCC '24, §4): short changes cause no churn. Pure.

A plan is a GPU count per step. Run-length encoded, each *segment* is a stretch of steps with
one count. A segment that lasts less than ``tau`` and whose larger neighbour exceeds it by at
least ``rho`` GPUs is flattened to that neighbour, until no segment is; so a short dip lends
nothing and a short intermediate step up is reached at once:
``[4, 4, 5, 6, 6, 6]`` at 10-minute steps with ``tau`` = 15 min becomes ``[4, 4, 6, 6, 6, 6]``
(KALE's worked example).

Two choices KALE leaves open, made on the side of the job's demand: the first segment (it
began before the plan) and the last one (it goes on past the horizon) are never flattened,
their length being unknown; and a segment is only ever *raised* — a short spike above both
neighbours stays, since lowering it would plan below the predicted demand.
"""

from __future__ import annotations

from collections.abc import Sequence


def segments(plan: Sequence[int]) -> list[tuple[int, int]]:
    """``plan`` run-length encoded: ``[(count, steps), ...]``."""
    out: list[tuple[int, int]] = []
    for value in plan:
        if out and out[-1][0] == value:
            out[-1] = (value, out[-1][1] + 1)
        else:
            out.append((value, 1))
    return out


def stabilize(plan: Sequence[int], *, step_seconds: float, rho: int, tau_seconds: float) -> list[int]:
    """``plan`` (GPUs per step of ``step_seconds``) stabilized with KALE's ``rho`` (GPUs, >= 1)
    and ``tau_seconds`` (see the module docstring). Same length as ``plan``. Raises
    ``ValueError`` for ``step_seconds`` <= 0, ``rho`` < 1 or negative ``tau_seconds``."""
    if step_seconds <= 0 or rho < 1 or tau_seconds < 0:
        raise ValueError(
            f"need step_seconds > 0, rho >= 1, tau_seconds >= 0; got {step_seconds}, {rho}, {tau_seconds}"
        )
    runs = segments(plan)
    changed = True
    while changed:
        changed = False
        # the lowest short segment first: raising it may merge it with a neighbour
        order = sorted(range(1, len(runs) - 1), key=lambda i: (runs[i][0], i))
        for i in order:
            value, steps = runs[i]
            larger = max(runs[i - 1][0], runs[i + 1][0])
            if steps * step_seconds < tau_seconds and larger - value >= rho:
                runs[i] = (larger, steps)
                runs = segments([v for v, n in runs for _ in range(n)])
                changed = True
                break
    return [v for v, n in runs for _ in range(n)]
