"""The adaptive standby pool's arithmetic (``lease.standby.mode: adaptive``; issue #40, WeFlex
§6: size the pool from "statistics on unreclaimed devices observed during each scale-up
event"). Pure: no I/O, time passed in.

A Reclaim's *shortfall* for a GPU model is the number of its lent GPUs of that model that did
not come back themselves: the originals of ``status.supplementedFromStandby`` (failed, vanished,
fell below their lend-time tier, held by a pod that is never evicted) and
``status.unrecoverable``, counted by device identity (``DeviceKey``), never from counts. Every
Done Reclaim gives one sample per model among its targets (``status.lent``), zero included: a
quantile of only the bad Reclaims would overstate the need.

The samples come from the GPULease objects themselves (their status is written only by the lease
controller), so the history survives an extender restart without a record of its own: a
restarted controller lists the leases and has it again. Deleting old Done Reclaims forgets
their shortfalls (the target falls back towards the floor).

The target per model = ``quantile`` of the samples within ``window_seconds`` (inverted-CDF rule,
i.e. the smallest sample ``x`` with ``F(x) >= quantile``: with fewer than ``1/(1-quantile)``
samples, the largest) + the floor. Hysteresis: :func:`targets` gives each model two sizes, the
one to *grow* to (samples of the window) and the one to *keep* (samples of the window plus
``hold_seconds``, never smaller); :func:`plan_pools` grows a model's pool while it is below the
first and moves a node back only while the pool stays at or above the second without it.
Whole free, untagged nodes move between pools, as :func:`extender.lease.planner.plan_standby`
does for the fixed size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np

from extender.lease.planner import COND_RETURNED, PoolChange, free_node, node_model, spare_gpus
from extender.lease.view import ClusterView, Gpu
from flexlease.api.resources import DeviceKey, GPULease, LeaseAction, LeasePhase, Pool
from flexlease.api.tiers import Tier


@dataclass(frozen=True, slots=True)
class Shortfall:
    """One Done Reclaim's shortfall for one GPU model: ``gpus`` of its targets of ``model``
    not back themselves; ``at``: when it reached Done; ``lease``: ``<namespace>/<name>``."""

    lease: str
    model: str
    gpus: int
    at: datetime


@dataclass(frozen=True, slots=True)
class Target:
    """The standby size of one GPU model: ``grow`` (the pool grows while below it), ``keep``
    (a node leaves the pool only if the pool stays at or above it; ``keep >= grow``),
    ``quantile_gpus`` (the quantile of the window's shortfalls), ``floor``, ``samples`` (Done
    Reclaims in the window) and ``reason`` (the why, in words, for Events and logs)."""

    model: str
    grow: int
    keep: int
    quantile_gpus: int
    floor: int
    samples: int
    reason: str


def done_at(lease: GPULease) -> datetime | None:
    """When the Reclaim ``lease`` reached its end state: its ``Returned`` condition's
    lastTransitionTime when True; None when it is not a Done Reclaim or that time is missing."""
    if lease.spec.action is not LeaseAction.RECLAIM or lease.status.phase is not LeasePhase.DONE:
        return None
    for cond in lease.status.conditions:
        if cond.type == COND_RETURNED and cond.status == "True":
            return cond.last_transition_time
    return None


def shortfalls(leases: Iterable[GPULease]) -> list[Shortfall]:
    """Every Done Reclaim's shortfall per model of its targets (see the module docstring),
    sorted by time then lease then model. A GPU's model is its lend-time record (in
    ``status.lent``, else on the supplement or unrecoverable entry); a GPU whose model is
    unknown counts under ``""``."""
    out: list[Shortfall] = []
    for lease in leases:
        at = done_at(lease)
        if at is None:
            continue
        status = lease.status
        models: dict[DeviceKey, str] = {d.key: d.model or "" for d in status.lent}
        short: set[DeviceKey] = set()
        for s in status.supplemented_from_standby:
            short.add(s.original.key)
            models.setdefault(s.original.key, s.original.model or "")
        for u in status.unrecoverable:
            short.add(u.key)
            models.setdefault(u.key, u.model or "")
        per_model = {model: 0 for model in models.values()}
        for key in short:
            per_model[models[key]] += 1
        name = f"{lease.metadata.namespace or ''}/{lease.metadata.name}"
        out.extend(Shortfall(name, model, n, at) for model, n in per_model.items())
    out.sort(key=lambda s: (s.at, s.lease, s.model))
    return out


def quantile(samples: Sequence[int], q: float) -> int:
    """The ``q`` quantile (0 < q <= 1) of ``samples`` by the inverted-CDF rule (Hyndman & Fan
    definition 1, ``numpy.quantile(method="inverted_cdf")``): the smallest sample ``x`` with
    at least ``q`` of the samples ``<= x``. 0 for no samples. Raises ``ValueError`` for q
    outside (0, 1]."""
    if not 0 < q <= 1:
        raise ValueError(f"quantile must be in (0, 1], got {q}")
    if not samples:
        return 0
    return math.ceil(float(np.quantile(np.asarray(samples, dtype=float), q, method="inverted_cdf")))


def targets(
    history: Sequence[Shortfall],
    *,
    models: Iterable[str],
    now: datetime,
    q: float,
    window_seconds: float,
    hold_seconds: float,
    floor: int,
    floors: Mapping[str, int],
) -> dict[str, Target]:
    """The :class:`Target` of every model in ``models`` (the cluster's) and every model with a
    sample, from the shortfalls ``history`` at ``now``: quantile ``q`` over the samples of the
    last ``window_seconds`` (grow) and of the last ``window_seconds + hold_seconds`` (keep),
    plus the floor (``floors[model]``, else ``floor``). Samples from the future (a clock behind
    the API server's) count as now."""
    grow_from = now - timedelta(seconds=window_seconds)
    keep_from = grow_from - timedelta(seconds=hold_seconds)
    names = set(models) | {s.model for s in history}
    out: dict[str, Target] = {}
    for model in sorted(names):
        mine = [s for s in history if s.model == model]
        window = [s.gpus for s in mine if s.at >= grow_from]
        held = [s.gpus for s in mine if s.at >= keep_from]
        base = floors.get(model, floor)
        grow_q = quantile(window, q)
        keep_q = max(grow_q, quantile(held, q))
        days = window_seconds / 86400
        reason = (
            f"{model or 'unknown model'}: p{q * 100:g} of {len(window)} Reclaim shortfall(s) in "
            f"{days:g}d = {grow_q} GPU(s) (largest {max(window, default=0)}) + floor {base} = "
            f"{grow_q + base}"
        )
        if keep_q > grow_q:
            reason += (
                f"; kept at {keep_q + base} for {hold_seconds:g}s after a larger shortfall left the window"
            )
        out[model] = Target(
            model=model,
            grow=grow_q + base,
            keep=keep_q + base,
            quantile_gpus=grow_q,
            floor=base,
            samples=len(window),
            reason=reason,
        )
    return out


def _healthy(gpus: Sequence[Gpu]) -> list[Gpu]:
    return [g for g in gpus if not g.failed and g.tier is not None]


def _tiers(gpus: Sequence[Gpu]) -> tuple[int, int]:
    return (sum(1 for g in gpus if g.tier is Tier.HA), sum(1 for g in gpus if g.tier is Tier.MA))


def spare_by_model(view: ClusterView) -> dict[str, int]:
    """Spare standby GPUs (:func:`~extender.lease.planner.spare_gpus`) per model."""
    out: dict[str, int] = {}
    for g in spare_gpus(view):
        out[g.model or ""] = out.get(g.model or "", 0) + 1
    return out


def cluster_models(view: ClusterView) -> set[str]:
    """The GPU models of the cluster's nodes (a node's model: its most common device model)."""
    return {node_model(view.node_gpus(name)) for name in view.pools} - {""}


def plan_pools(view: ClusterView, goal: Mapping[str, Target]) -> tuple[PoolChange, ...]:
    """Pool moves that bring each model's spare standby GPUs to its :class:`Target`: while below
    ``grow``, move whole free general nodes of that model to standby (most HA, then MA GPUs
    first, then by name); while a whole free standby node of that model can leave with the
    pool still at or above ``keep``, move it back (lowest tiers first). Models are taken in
    name order; a model without a target is left alone."""
    spare = spare_by_model(view)
    nodes = {name: view.node_gpus(name) for name in sorted(view.pools)}
    changes: list[PoolChange] = []
    for model, target in sorted(goal.items()):
        have = spare.get(model, 0)
        mine = {n: g for n, g in nodes.items() if node_model(g) == model and free_node(g)}
        if have < target.grow:
            candidates = sorted(
                (n for n in mine if view.pools[n] is Pool.GENERAL),
                key=lambda n: (-_tiers(_healthy(mine[n]))[0], -_tiers(_healthy(mine[n]))[1], n),
            )
            for name in candidates:
                if have >= target.grow:
                    break
                gained = len(_healthy(mine[name]))
                if gained == 0:
                    continue
                changes.append(PoolChange(name, Pool.STANDBY, gpus=gained))
                have += gained
        else:
            candidates = sorted(
                (n for n in mine if view.pools[n] is Pool.STANDBY),
                key=lambda n: (_tiers(_healthy(mine[n])), n),
            )
            for name in candidates:
                count = len(_healthy(mine[name]))
                if have - count >= target.keep:
                    changes.append(PoolChange(name, Pool.GENERAL, gpus=count))
                    have -= count
    return tuple(changes)
