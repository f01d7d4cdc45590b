"""Inventory snapshots kept incrementally (extender.state): a view rebuilt for the same
GPUNode keeps its unchanged devices, a change that cancels out keeps the whole view, and
in every case the views equal views built from scratch and ``changed_since`` names every
node whose view changed."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from extender.scheduling import NodeView
from extender.state import Inventory
from flexlease.errors import Conflict
from flexlease.store.base import EventType, WatchEvent
from tests.extender import payloads
from tests.extender.test_state import Clock, bound_pod

NODES = ("n1", "n2", "n3")
UIDS = tuple(f"u{i}" for i in range(6))


def _fresh_view(inv: Inventory, name: str) -> NodeView | None:
    """The view of ``name`` built from scratch (nothing reused)."""
    n = inv._nodes.get(name)
    if n is None:
        return None
    inv._built_from.pop(name, None)
    try:
        return inv._build_view(n, None)
    finally:
        current = inv._views.get(name)
        if current is not None:
            inv._built_from[name] = n


def _same(a: NodeView | None, b: NodeView | None) -> bool:
    if a is None or b is None:
        return a is b
    return (
        a.name == b.name
        and a.pool == b.pool
        and a.devices == b.devices
        and dict(a.holders) == dict(b.holders)
        and a.images == b.images
        and a.checkpoints == b.checkpoints
        and a.groups == b.groups
        and a.signature == b.signature
    )


def _pod(uid: str, node: str, indices: tuple[int, ...], *, bound: bool, low: bool) -> dict[str, Any]:
    if bound:
        return bound_pod(uid, node, *indices, uid=uid, priority="low" if low else "high")
    return payloads.pod(
        uid,
        uid=uid,
        gpus=len(indices),
        priority="low" if low else "high",
        annotations=payloads.assigned(node, *indices),
    )


_indices = st.lists(st.integers(0, 3), min_size=1, max_size=2, unique=True).map(lambda xs: tuple(sorted(xs)))
_ops = st.one_of(
    st.tuples(
        st.just("pod"), st.sampled_from(UIDS), st.sampled_from(NODES), _indices, st.booleans(), st.booleans()
    ),
    st.tuples(st.just("delete"), st.sampled_from(UIDS)),
    st.tuples(
        st.just("node"),
        st.sampled_from(NODES),
        st.sampled_from(("HA", "MA", "LA")),
        st.sampled_from((None, "online/job", "other/job")),
        st.booleans(),
    ),
    st.tuples(st.just("assume"), st.sampled_from(UIDS), st.sampled_from(NODES), _indices, st.booleans()),
    st.tuples(st.just("forget"), st.sampled_from(UIDS)),
    st.tuples(st.just("tick"), st.floats(0, 40)),
    st.tuples(
        st.just("snapshot"),
    ),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_ops, max_size=40))
def test_incremental_views_equal_views_built_from_scratch(ops: list[tuple[Any, ...]]) -> None:
    clock = Clock()
    inv = Inventory(reservation_ttl_seconds=30.0, clock=clock)
    inv.replace_nodes([payloads.gpunode(n, gpus=4) for n in NODES])
    inv.replace_pods([])
    prev = inv.snapshot()
    seen_pods: dict[str, dict[str, Any]] = {}
    for op in ops:
        kind = op[0]
        if kind == "pod":
            _, uid, node, indices, bound, low = op
            obj = _pod(uid, node, indices, bound=bound, low=low)
            seen_pods[uid] = obj
            inv.apply_pod_event(WatchEvent(EventType.MODIFIED, obj))
        elif kind == "delete":
            gone: dict[str, Any] | None = seen_pods.pop(str(op[1]), None)
            if gone is not None:
                inv.apply_pod_event(WatchEvent(EventType.DELETED, gone))
        elif kind == "node":
            _, node, tier, tagged, sick = op
            inv.apply_node_event(
                WatchEvent(
                    EventType.MODIFIED,
                    payloads.gpunode(
                        node,
                        gpus=4,
                        tiers=tier,
                        owners={0: tagged, 1: "online/job"} if tagged else None,
                        unhealthy={1} if sick else frozenset(),
                    ),
                )
            )
        elif kind == "assume":
            _, uid, node, indices, low = op
            # assume answers from the node's current view when no change is pending: the same
            # answer as from the claims and reservations themselves (the reference here)
            inv._expire()  # what assume does first (may leave changes pending)
            taken = inv._taken(node)
            refused = uid in inv._reservations or any(i in taken and taken[i] != uid for i in indices)
            try:
                inv.assume(uid=uid, key=f"ml/{uid}", node=node, indices=indices, low=low)
            except Conflict:
                assert refused
            else:
                assert not refused
        elif kind == "forget":
            inv.forget(op[1])
        elif kind == "tick":
            clock.now += op[1]
        snap = inv.snapshot()
        changed = inv.changed_since(prev.version)
        assert changed is not None
        for name in NODES:
            assert _same(snap.get(name), _fresh_view(inv, name)), name
            if snap.get(name) is not prev.get(name):
                assert name in changed, name
        owners = {o for v in snap.nodes.values() for o in v.owners}
        assert dict(snap.tagged) == {o: {n for n, v in snap.nodes.items() if o in v.owners} for o in owners}
        if snap.version == prev.version:
            assert snap is prev
        prev = snap


def test_confirming_a_reservation_with_an_equal_claim_keeps_the_snapshot() -> None:
    """assume → the watch delivers the pod's claim (same devices, not yet bound): nothing a
    filter reads has changed, so the snapshot (and its version) stays."""
    inv = Inventory(reservation_ttl_seconds=30.0, clock=Clock())
    inv.replace_nodes([payloads.gpunode("n1", gpus=4)])
    inv.replace_pods([])
    inv.assume(uid="u-a", key="ml/a", node="n1", indices=(0, 1), low=True)
    reserved = inv.snapshot()
    claim = _pod("u-a", "n1", (0, 1), bound=False, low=True)
    claim["metadata"]["name"] = "a"
    inv.apply_pod_event(WatchEvent(EventType.MODIFIED, claim))
    assert inv.reservation("u-a") is None and inv.stats.confirmed == 1
    assert inv.snapshot() is reserved
    # the Binding makes the pod a possible victim: the view changes, its devices are kept
    inv.apply_pod_event(WatchEvent(EventType.MODIFIED, bound_pod("a", "n1", 0, 1, uid="u-a", priority="low")))
    bound = inv.snapshot()
    assert bound.version > reserved.version and inv.changed_since(reserved.version) == {"n1"}
    old, new = reserved.get("n1"), bound.get("n1")
    assert old is not None and new is not None and old is not new
    assert all(a is b for a, b in zip(old.devices, new.devices, strict=True))
    assert not old.holders["u-a"].low or old.holders["u-a"].reserved
    assert new.holders["u-a"].low and not new.holders["u-a"].reserved
