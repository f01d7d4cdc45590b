"""The adaptive standby pool's arithmetic: shortfalls by device identity, the quantile, the
targets with their hysteresis, and the pool moves (:mod:`extender.lease.standby`)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from extender.lease import standby
from extender.lease.planner import PoolChange
from extender.lease.view import build_view
from flexlease.api.resources import GPULease, Pool, parse_gpulease, parse_gpunode
from tests.extender.lease.builders import A100, H20, T0, gpunode, lease

DAY = 86400.0


def _dev(node: str, index: int, model: str = H20) -> dict[str, Any]:
    return {"node": node, "index": index, "model": model, "tier": "HA"}


def done_reclaim(
    name: str,
    at: datetime,
    lent: list[tuple[str, int, str]],
    *,
    supplemented: list[tuple[str, int]] = (),  # type: ignore[assignment]
    unrecoverable: list[tuple[str, int]] = (),  # type: ignore[assignment]
    phase: str = "Done",
    returned: str = "True",
) -> GPULease:
    models = {(n, i): m for n, i, m in lent}
    obj = lease(name, "Reclaim", count=max(1, len(lent)))
    obj["status"] = {
        "phase": phase,
        "lent": [_dev(n, i, m) for n, i, m in lent],
        "supplementedFromStandby": [
            {"original": _dev(n, i, models[(n, i)]), "replacement": _dev("sb", k, models[(n, i)])}
            for k, (n, i) in enumerate(supplemented)
        ],
        "unrecoverable": [
            {"node": n, "index": i, "model": models[(n, i)], "reason": "NoStandbyOfModel"}
            for n, i in unrecoverable
        ],
        "conditions": [
            {
                "type": "Returned",
                "status": returned,
                "reason": "Returned",
                "lastTransitionTime": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        ],
    }
    return parse_gpulease(obj)


def test_shortfall_counts_devices_not_entries_and_keeps_zero_samples() -> None:
    lent = [("n1", 0, H20), ("n1", 1, H20), ("n2", 0, A100), ("n2", 1, A100)]
    # n1:0 supplemented, then its replacement failed too and it is listed unrecoverable as well
    bad = done_reclaim("r1", T0, lent, supplemented=[("n1", 0)], unrecoverable=[("n1", 0), ("n2", 1)])
    good = done_reclaim("r2", T0 + timedelta(hours=1), [("n1", 2, H20)])
    history = standby.shortfalls([good, bad])
    assert [(s.lease, s.model, s.gpus) for s in history] == [
        ("online/r1", A100, 1),
        ("online/r1", H20, 1),
        ("online/r2", H20, 0),
    ]


def test_only_done_reclaims_with_their_end_time_count() -> None:
    lent = [("n1", 0, H20)]
    lend = parse_gpulease({**lease("l", "Lend", count=1), "status": {"phase": "Done"}})
    running = done_reclaim("r1", T0, lent, supplemented=[("n1", 0)], phase="InProgress")
    waiting = done_reclaim("r2", T0, lent, supplemented=[("n1", 0)], returned="False")
    cancelled = done_reclaim("r3", T0, lent, supplemented=[("n1", 0)], phase="Cancelled")
    assert standby.shortfalls([lend, running, waiting, cancelled]) == []
    assert standby.done_at(done_reclaim("r4", T0, lent)) == T0


@pytest.mark.parametrize(
    ("samples", "q", "expected"),
    [
        ([], 0.99, 0),
        ([0] * 99 + [5], 0.99, 0),  # F(0) = 0.99 covers the quantile
        ([0] * 98 + [5, 5], 0.99, 5),
        ([0, 0, 0, 3], 0.99, 3),  # fewer than 100 samples: the largest
        ([0, 1, 2, 3], 0.5, 1),
        ([2, 7], 1.0, 7),
    ],
)
def test_quantile_is_the_inverted_cdf(samples: list[int], q: float, expected: int) -> None:
    assert standby.quantile(samples, q) == expected


@pytest.mark.parametrize("q", [0.0, -0.1, 1.01])
def test_quantile_outside_zero_one_is_refused(q: float) -> None:
    with pytest.raises(ValueError, match="quantile"):
        standby.quantile([1], q)


def _history(*points: tuple[float, int], model: str = H20) -> list[standby.Shortfall]:
    return [
        standby.Shortfall(f"online/r{k}", model, n, T0 + timedelta(days=d)) for k, (d, n) in enumerate(points)
    ]


def test_target_is_the_windows_quantile_plus_the_floor() -> None:
    history = _history((0, 6), (10, 2), (11, 0), (12, 3))
    now = T0 + timedelta(days=13)
    got = standby.targets(
        history, models=[H20, A100], now=now, q=0.99, window_seconds=7 * DAY, hold_seconds=0,
        floor=1, floors={A100: 2},
    )  # fmt: skip
    assert (got[H20].grow, got[H20].keep, got[H20].quantile_gpus, got[H20].samples) == (4, 4, 3, 3)
    assert (got[A100].grow, got[A100].keep, got[A100].samples) == (2, 2, 0)
    assert "p99 of 3 Reclaim shortfall(s) in 7d = 3 GPU(s)" in got[H20].reason
    assert "+ floor 1 = 4" in got[H20].reason


def test_a_large_shortfall_leaving_the_window_is_kept_for_the_hold_time() -> None:
    history = _history((0, 6), (5, 2))
    kwargs: dict[str, Any] = {"models": [H20], "q": 0.99, "window_seconds": 7 * DAY, "floor": 0, "floors": {}}
    inside = standby.targets(history, now=T0 + timedelta(days=6), hold_seconds=2 * DAY, **kwargs)[H20]
    held = standby.targets(history, now=T0 + timedelta(days=8), hold_seconds=2 * DAY, **kwargs)[H20]
    gone = standby.targets(history, now=T0 + timedelta(days=9.5), hold_seconds=2 * DAY, **kwargs)[H20]
    assert (inside.grow, inside.keep) == (6, 6)
    assert (held.grow, held.keep) == (2, 6)
    assert "kept at 6" in held.reason
    assert (gone.grow, gone.keep) == (2, 2)


def _target(model: str, grow: int, keep: int | None = None) -> standby.Target:
    return standby.Target(model, grow, grow if keep is None else keep, grow, 0, 1, "test")


def test_pool_grows_by_whole_free_nodes_of_the_model_short_of_its_target() -> None:
    nodes = [
        gpunode("h-ma", "MA"),
        gpunode("h-ha", "HA"),
        gpunode("h-busy", "HA", tags={0: "online/rec"}),
        gpunode("a", "HA", model=A100),
        gpunode("a-sb", "HA", model=A100, pool="standby", count=4),
    ]
    view = build_view([parse_gpunode(n) for n in nodes], [])
    goal = {H20: _target(H20, 3), A100: _target(A100, 4)}
    assert standby.plan_pools(view, goal) == (PoolChange("h-ha", Pool.STANDBY, gpus=8),)
    assert standby.plan_pools(view, {H20: _target(H20, 9)}) == (
        PoolChange("h-ha", Pool.STANDBY, gpus=8),
        PoolChange("h-ma", Pool.STANDBY, gpus=8),
    )
    assert standby.spare_by_model(view) == {A100: 4}
    assert standby.cluster_models(view) == {H20, A100}


def test_pool_shrinks_only_while_it_stays_at_the_keep_size() -> None:
    nodes = [gpunode("s1", "HA", pool="standby"), gpunode("s2", "MA", pool="standby")]
    view = build_view([parse_gpunode(n) for n in nodes], [])
    assert standby.plan_pools(view, {H20: _target(H20, 4, keep=10)}) == ()
    assert standby.plan_pools(view, {H20: _target(H20, 4, keep=8)}) == (
        PoolChange("s2", Pool.GENERAL, gpus=8),
    )
    assert standby.plan_pools(view, {H20: _target(H20, 0)}) == (
        PoolChange("s2", Pool.GENERAL, gpus=8),
        PoolChange("s1", Pool.GENERAL, gpus=8),
    )
    assert standby.plan_pools(view, {}) == ()


def test_applied_moves_reach_a_fixed_point() -> None:
    """No flapping: once the moves are applied, the same targets ask for none."""
    nodes = [gpunode(f"g{i}", "HA", count=4) for i in range(4)] + [
        gpunode("s", "HA", pool="standby", count=4)
    ]
    goal = {H20: _target(H20, 6, keep=9)}
    for _ in range(3):
        view = build_view([parse_gpunode(n) for n in nodes], [])
        changes = standby.plan_pools(view, goal)
        for change in changes:
            next(n for n in nodes if n["metadata"]["name"] == change.node)["spec"]["pool"] = change.pool.value
    view = build_view([parse_gpunode(n) for n in nodes], [])
    assert standby.spare_by_model(view) == {H20: 8}
    assert standby.plan_pools(view, goal) == ()
