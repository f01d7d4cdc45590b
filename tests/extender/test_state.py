"""Inventory (extender.state): derived from GPUNode and Pod events; snapshots; assume/confirm/forget."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from extender.state import Inventory
from flexlease.api import keys
from flexlease.api.tiers import Tier
from flexlease.errors import Conflict
from flexlease.store.base import EventType, WatchEvent
from tests.extender import payloads


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def bound_pod(name: str, node: str, *indices: int, **kw: object) -> dict[str, object]:
    return payloads.pod(
        name,
        node_name=node,
        phase="Running",
        annotations=payloads.assigned(node, *indices),
        gpus=len(indices),
        **kw,  # type: ignore[arg-type]
    )


def inventory(clock: Clock | None = None) -> Inventory:
    inv = Inventory(reservation_ttl_seconds=30.0, clock=clock or Clock())
    inv.replace_nodes([payloads.gpunode("n1"), payloads.gpunode("n2", gpus=4)])
    inv.replace_pods([])
    return inv


def holders_of(inv: Inventory, node: str) -> dict[int, str | None]:
    view = inv.snapshot().get(node)
    assert view is not None
    return {d.index: d.holder for d in view.devices}


def test_ready_only_after_both_lists() -> None:
    inv = Inventory()
    assert not inv.ready
    inv.replace_nodes([])
    assert not inv.ready and inv.listed == (True, False)
    inv.replace_pods([])
    assert inv.ready


def test_devices_tiers_tags_health_pool_cache_come_from_gpunode() -> None:
    inv = Inventory()
    inv.replace_nodes(
        [
            payloads.gpunode(
                "n1",
                gpus=3,
                tiers=["HA", "MA", "LA"],
                owners={0: "ml/online"},
                overrides={2: "MA"},
                unhealthy={1},
                pool="standby",
                images=["img:1"],
                checkpoints=["ckpt-1"],
            )
        ]
    )
    view = inv.snapshot().get("n1")
    assert view is not None and view.standby
    assert [d.tier for d in view.devices] == [Tier.HA, Tier.MA, Tier.MA]
    assert [d.owner for d in view.devices] == ["ml/online", None, None]
    assert [d.healthy for d in view.devices] == [True, False, True]
    assert view.images == {"img:1"} and view.checkpoints == {"ckpt-1"}


def test_assignments_of_non_terminated_pods_take_devices() -> None:
    inv = inventory()
    inv.apply_pod_event(WatchEvent(EventType.ADDED, bound_pod("a", "n1", 0, 1, uid="u-a")))
    inv.apply_pod_event(WatchEvent(EventType.ADDED, bound_pod("b", "n1", 2, uid="u-b")))
    assert holders_of(inv, "n1") == {0: "u-a", 1: "u-a", 2: "u-b"} | {i: None for i in range(3, 8)}
    done = bound_pod("b", "n1", 2, uid="u-b")
    done["status"] = {"phase": "Succeeded"}
    inv.apply_pod_event(WatchEvent(EventType.MODIFIED, done))
    assert holders_of(inv, "n1")[2] is None
    inv.apply_pod_event(WatchEvent(EventType.DELETED, bound_pod("a", "n1", 0, 1, uid="u-a")))
    assert set(holders_of(inv, "n1").values()) == {None}


def test_relist_replaces_everything() -> None:
    inv = inventory()
    inv.apply_pod_event(WatchEvent(EventType.ADDED, bound_pod("a", "n1", 0, uid="u-a")))
    inv.replace_pods([bound_pod("c", "n2", 3, uid="u-c")])
    inv.replace_nodes([payloads.gpunode("n2", gpus=4)])
    snap = inv.snapshot()
    assert set(snap.nodes) == {"n2"}
    assert holders_of(inv, "n2")[3] == "u-c"


def test_snapshot_is_versioned_and_copies_only_changed_nodes() -> None:
    inv = inventory()
    s1 = inv.snapshot()
    assert inv.snapshot() is s1
    inv.apply_pod_event(WatchEvent(EventType.ADDED, bound_pod("a", "n1", 0, uid="u-a")))
    s2 = inv.snapshot()
    assert s2.version > s1.version
    assert s2.get("n2") is s1.get("n2")
    assert s2.get("n1") is not s1.get("n1")
    old = s1.get("n1")
    assert old is not None and old.devices[0].holder is None  # s1 did not change
    # an identical GPUNode update changes nothing
    inv.apply_node_event(WatchEvent(EventType.MODIFIED, payloads.gpunode("n2", gpus=4)))
    assert inv.snapshot() is s2


def test_assume_confirm() -> None:
    inv = inventory()
    inv.assume(uid="u-a", key="ml/a", node="n1", indices=(0, 1))
    assert holders_of(inv, "n1")[0] == "u-a"
    view = inv.snapshot().get("n1")
    assert view is not None and view.holders["u-a"].reserved
    with pytest.raises(Conflict):
        inv.assume(uid="u-b", key="ml/b", node="n1", indices=(1, 2))
    annotated = payloads.pod("a", uid="u-a", annotations=payloads.assigned("n1", 0, 1), gpus=2)
    inv.apply_pod_event(WatchEvent(EventType.MODIFIED, annotated))
    assert inv.reservation("u-a") is None
    assert inv.stats.confirmed == 1
    assert holders_of(inv, "n1")[0] == "u-a"
    view = inv.snapshot().get("n1")
    assert view is not None and view.holders["u-a"].reserved, "annotated but unbound: a bind in flight"
    bound = payloads.pod("a", uid="u-a", annotations=payloads.assigned("n1", 0, 1), gpus=2, node_name="n1")
    inv.apply_pod_event(WatchEvent(EventType.MODIFIED, bound))
    view = inv.snapshot().get("n1")
    assert view is not None and not view.holders["u-a"].reserved


def test_forget_frees_the_devices() -> None:
    inv = inventory()
    inv.assume(uid="u-a", key="ml/a", node="n1", indices=(5,))
    assert inv.forget("u-a")
    assert not inv.forget("u-a")
    assert holders_of(inv, "n1")[5] is None


def test_unconfirmed_reservation_expires(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    inv = inventory(clock)
    inv.assume(uid="u-a", key="ml/a", node="n1", indices=(0,))
    clock.now += 29
    assert holders_of(inv, "n1")[0] == "u-a"
    clock.now += 2
    with caplog.at_level(logging.WARNING):
        assert holders_of(inv, "n1")[0] is None
    assert inv.stats.expired == 1
    assert "expired" in caplog.text


def test_renew_counts_the_ttl_from_the_last_write_of_a_bind() -> None:
    """Slow annotation and Binding writes must not let a reservation lapse before the watch
    can confirm it (a lapse would offer the GPU to another pod)."""
    clock = Clock()
    inv = inventory(clock)
    inv.assume(uid="u-a", key="ml/a", node="n1", indices=(0,))
    clock.now += 25  # the patch took 25 s
    assert inv.renew("u-a")
    clock.now += 25  # and the Binding another 25 s: 50 s after the choice, 25 s after the last write
    assert holders_of(inv, "n1")[0] == "u-a"
    clock.now += 6
    assert holders_of(inv, "n1")[0] is None
    assert not inv.renew("u-a")


def test_assume_rejects_unknown_devices_and_nodes() -> None:
    inv = inventory()
    with pytest.raises(Conflict):
        inv.assume(uid="u", key="ml/u", node="n9", indices=(0,))
    with pytest.raises(Conflict):
        inv.assume(uid="u", key="ml/u", node="n2", indices=(4,))


def test_malformed_objects_are_logged_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    inv = inventory()
    bad_pod = payloads.pod("bad", annotations={keys.ANN_ASSIGNED_GPUS: "n1:x"})
    bad_node = payloads.gpunode("n3")
    bad_node["status"]["devices"]["0"]["health"] = "Sparkly"
    with caplog.at_level(logging.WARNING):
        inv.apply_pod_event(WatchEvent(EventType.ADDED, bad_pod))
        inv.apply_node_event(WatchEvent(EventType.ADDED, bad_node))
    assert inv.stats.bad_objects == 2
    assert inv.snapshot().get("n3") is None
    assert caplog.text.count("ignoring") == 2


def test_a_bound_pod_with_a_malformed_label_keeps_its_gpus_across_relists() -> None:
    """A typo in a label (``priority=High``) must never free GPUs in use: the pod stays a
    holder, conservatively high priority (never a preemption victim)."""
    inv = inventory()
    typo = bound_pod("typo", "n1", 0, 1, uid="u-typo", priority="High")
    inv.replace_pods([typo])
    assert holders_of(inv, "n1")[0] == "u-typo" and holders_of(inv, "n1")[1] == "u-typo"
    view = inv.snapshot().get("n1")
    assert view is not None and not view.holders["u-typo"].low
    inv.replace_pods([typo])  # a re-list after 410 Gone
    assert holders_of(inv, "n1")[0] == "u-typo"
    assert inv.stats.bad_objects == 2
    inv.apply_pod_event(WatchEvent(EventType.DELETED, typo))
    assert holders_of(inv, "n1")[0] is None


def test_device_counts_for_gauges() -> None:
    inv = Inventory()
    inv.replace_nodes(
        [
            payloads.gpunode("n1", gpus=4, tiers=["HA", "HA", "MA", "LA"], owners={1: "ml/o"}, unhealthy={3}),
            payloads.gpunode("s1", gpus=2, tiers="HA", pool="standby"),
        ]
    )
    inv.replace_pods([bound_pod("a", "n1", 0, uid="u-a"), bound_pod("b", "s1", 1, uid="u-b")])
    counts = {(c.pool, c.state, c.tier, c.model): c.count for c in inv.device_counts()}
    assert counts == {
        ("general", "used", "HA", payloads.H20): 1,
        ("general", "free", "HA", payloads.H20): 1,
        ("general", "lent", "HA", payloads.H20): 1,
        ("general", "free", "MA", payloads.H20): 1,
        ("general", "unhealthy", "LA", payloads.H20): 1,
        ("standby", "free", "HA", payloads.H20): 1,
        ("standby", "used", "HA", payloads.H20): 1,
    }


# --------------------------------------------------------------------------- claims: one written rule


def claim(name: str, node: str, *indices: int, uid: str, bound: bool, created: str) -> WatchEvent:
    """A pod carrying ``assigned-gpus`` for ``indices`` on ``node``, bound there or not."""
    pod = payloads.pod(
        name,
        uid=uid,
        node_name=node if bound else None,
        phase="Running" if bound else "Pending",
        annotations=payloads.assigned(node, *indices),
        gpus=len(indices),
    )
    pod["metadata"]["creationTimestamp"] = created
    return WatchEvent(EventType.ADDED, pod)


def test_a_bound_pod_keeps_a_gpu_an_unbound_copy_claims(caplog: pytest.LogCaptureFixture) -> None:
    """Finding 3 on re-list: a copied YAML (unbound, same annotation) loses its whole claim."""
    inv = inventory()
    inv.apply_pod_event(claim("run", "n1", 0, 1, uid="u-run", bound=True, created="2026-11-21T10:00:00Z"))
    with caplog.at_level(logging.WARNING, logger="extender.state"):
        inv.apply_pod_event(
            claim("copy", "n1", 1, 2, uid="u-copy", bound=False, created="2026-11-21T09:00:00Z")
        )
    assert holders_of(inv, "n1") == {0: "u-run", 1: "u-run", **dict.fromkeys(range(2, 8))}
    assert inv.stats.claim_conflicts == 1
    (record,) = [r for r in caplog.records if "two pods claim the same GPU" in r.getMessage()]
    assert "ml/run keeps it (bound), ml/copy loses its claim" in record.getMessage()
    assert record.__dict__["pod"] == "ml/copy" and record.__dict__["other"] == "ml/run"
    assert record.__dict__["gpu"] == "1"


def test_between_bound_pods_the_one_created_first_keeps_the_gpu() -> None:
    inv = inventory()
    inv.apply_pod_event(claim("late", "n1", 0, 1, uid="u-late", bound=True, created="2026-11-21T11:00:00Z"))
    inv.apply_pod_event(claim("early", "n1", 0, 2, uid="u-early", bound=True, created="2026-11-21T10:00:00Z"))
    held = holders_of(inv, "n1")
    assert held[0] == "u-early" and held[2] == "u-early"
    assert held[1] == "u-late", "the later pod runs: it keeps its other GPU"
    # the same answer whatever the order the events came in (a re-list)
    again = inventory()
    again.replace_pods(
        [
            claim("early", "n1", 0, 2, uid="u-early", bound=True, created="2026-11-21T10:00:00Z").object,
            claim("late", "n1", 0, 1, uid="u-late", bound=True, created="2026-11-21T11:00:00Z").object,
        ]
    )
    assert holders_of(again, "n1") == held


def test_claims_of_pods_unbound_past_the_ttl_are_released(caplog: pytest.LogCaptureFixture) -> None:
    """Finding 4: a bind interrupted between the annotation and the Binding leaked its GPUs."""
    clock = Clock()
    inv = inventory(clock)
    inv.apply_pod_event(claim("stuck", "n2", 0, 1, uid="u-stuck", bound=False, created="t"))
    assert holders_of(inv, "n2")[0] == "u-stuck"
    view = inv.snapshot().get("n2")
    assert view is not None and view.holders["u-stuck"].reserved, "an unbound claim is never a victim"
    assert inv.claimed_nodes("u-stuck") == {"n2"}
    clock.now += 29
    assert holders_of(inv, "n2")[0] == "u-stuck"
    clock.now += 2
    with caplog.at_level(logging.WARNING, logger="extender.state"):
        assert holders_of(inv, "n2") == dict.fromkeys(range(4))
    assert inv.stats.claims_released == 1
    assert "stayed unbound past the reservation TTL" in caplog.text
    assert inv.claimed_nodes("u-stuck") == set()
    # bound later (someone else's Binding): the claim counts again
    inv.apply_pod_event(claim("stuck", "n2", 0, 1, uid="u-stuck", bound=True, created="t"))
    assert holders_of(inv, "n2")[0] == "u-stuck"


def test_our_own_bind_in_flight_is_not_released_while_its_reservation_lives() -> None:
    clock = Clock()
    inv = inventory(clock)
    inv.assume(uid="u-a", key="ml/a", node="n2", indices=(0,))
    inv.apply_pod_event(claim("a", "n2", 0, uid="u-a", bound=False, created="t"))  # confirms
    assert inv.reservation("u-a") is None
    clock.now += 29
    assert holders_of(inv, "n2")[0] == "u-a"
    inv.apply_pod_event(claim("a", "n2", 0, uid="u-a", bound=True, created="t"))
    clock.now += 100
    assert holders_of(inv, "n2")[0] == "u-a"
    assert inv.stats.claims_released == 0


def without_managed_fields(pod: dict[str, Any]) -> dict[str, Any]:
    return {**pod, "metadata": {k: v for k, v in pod["metadata"].items() if k != "managedFields"}}


def test_the_pod_watchs_copy_of_each_unbound_pod() -> None:
    """:meth:`Inventory.unbound_pod`: the object last delivered for a live pod not bound to a
    node, without its managedFields — after a list and an update; gone once bound,
    terminated, deleted, malformed, or missing from the next list."""
    inv = inventory()
    a, b = payloads.pod("a", uid="uid-a"), payloads.pod("b", uid="uid-b")
    assert "managedFields" in a["metadata"]
    inv.replace_pods([a, b])
    assert inv.unbound_pod("uid-a") == without_managed_fields(a)
    assert inv.unbound_pod("uid-b") == without_managed_fields(b)
    assert "managedFields" in a["metadata"]  # the watch's object is left as it is
    a2 = {**a, "metadata": {**a["metadata"], "resourceVersion": "99"}}
    inv.apply_pod_event(WatchEvent(EventType.MODIFIED, a2))
    assert inv.unbound_pod("uid-a") == without_managed_fields(a2)
    inv.apply_pod_event(WatchEvent(EventType.MODIFIED, {**a2, "spec": {**a2["spec"], "nodeName": "n1"}}))
    assert inv.unbound_pod("uid-a") is None
    inv.apply_pod_event(WatchEvent(EventType.MODIFIED, {**b, "status": {"phase": "Failed"}}))
    assert inv.unbound_pod("uid-b") is None
    c = payloads.pod("c", uid="uid-c")
    inv.apply_pod_event(WatchEvent(EventType.ADDED, c))
    assert inv.unbound_pod("uid-c") is not None
    inv.apply_pod_event(WatchEvent(EventType.DELETED, c))
    assert inv.unbound_pod("uid-c") is None
    d = payloads.pod("d", uid="uid-d")
    inv.apply_pod_event(WatchEvent(EventType.ADDED, d))
    malformed = payloads.pod("d", uid="uid-d", priority="High")  # a flexlease label gone bad
    inv.apply_pod_event(WatchEvent(EventType.MODIFIED, malformed))
    assert inv.unbound_pod("uid-d") is None
    e, f = payloads.pod("e", uid="uid-e"), payloads.pod("f", uid="uid-f")
    inv.replace_pods([e, f])
    inv.replace_pods([f])  # e is gone from the next list
    assert inv.unbound_pod("uid-e") is None and inv.unbound_pod("uid-f") is not None


def test_no_copy_of_a_pod_a_binding_would_refuse() -> None:
    """A pod being deleted or still scheduling-gated: the API server refuses its Binding, so
    the binder reads it rather than spend a Binding on the watch's copy."""
    inv = inventory()
    deleting = payloads.pod("a", uid="uid-a")
    deleting["metadata"]["deletionTimestamp"] = "2026-11-27T10:00:00Z"
    gated = payloads.pod("b", uid="uid-b")
    gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    inv.replace_pods([deleting, gated])
    assert inv.unbound_pod("uid-a") is None and inv.unbound_pod("uid-b") is None
    ungated = {**gated, "spec": {**gated["spec"], "schedulingGates": []}}
    inv.apply_pod_event(WatchEvent(EventType.MODIFIED, ungated))
    assert inv.unbound_pod("uid-b") == without_managed_fields(ungated)


def test_the_parse_of_a_pending_pod_at_its_version() -> None:
    """:meth:`Inventory.pending_request`: the watch's parse for a copy at the same uid and
    resourceVersion, whatever that copy says; None at another version or once bound."""
    inv = inventory()
    a = payloads.pod("a", uid="uid-a", gpus=4)
    a["metadata"]["resourceVersion"] = "7"
    inv.replace_pods([a])
    claimed = payloads.pod("a", uid="uid-a", gpus=1)  # the same version, other contents
    claimed["metadata"]["resourceVersion"] = "7"
    req = inv.pending_request(claimed)
    assert req is not None and req.count == 4 and req.uid == "uid-a"
    newer = {**claimed, "metadata": {**claimed["metadata"], "resourceVersion": "8"}}
    assert inv.pending_request(newer) is None
    assert inv.pending_request(payloads.pod("b", uid="uid-b")) is None
    assert inv.pending_request({"metadata": "not an object"}) is None
    unversioned = {
        **claimed,
        "metadata": {k: v for k, v in claimed["metadata"].items() if k != "resourceVersion"},
    }
    assert inv.pending_request(unversioned) is None
    inv.apply_pod_event(WatchEvent(EventType.MODIFIED, {**a, "spec": {**a["spec"], "nodeName": "n1"}}))
    assert inv.pending_request(claimed) is None
