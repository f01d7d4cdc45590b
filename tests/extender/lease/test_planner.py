"""The pure Lend / Reclaim / tag-release / standby decisions (extender/lease/planner.py)."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.lease import planner
from extender.lease.ledger import Ledger
from extender.lease.planner import LeasePlan
from extender.lease.view import ClusterView, build_view
from flexlease.api import keys
from flexlease.api.resources import (
    DeviceKey,
    GPULease,
    LeaseDevice,
    LeasePhase,
    Pool,
    parse_gpulease,
    parse_gpunode,
)
from flexlease.api.tiers import Tier
from flexlease.clock import format_time
from tests.extender.lease.builders import A100, H20, T0, gpunode, lease, pod

OWNER = "online/rec"


class World:
    """GPUNodes, pods and one lease as JSON; applies plans the way the controller does."""

    def __init__(
        self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]], lease_obj: dict[str, Any]
    ) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.lease = lease_obj
        self.now = T0
        self.evicted: list[str] = []

    def view(self) -> ClusterView:
        return build_view([parse_gpunode(n) for n in self.nodes.values()], list(self.pods.values()))

    def parsed(self) -> GPULease:
        return parse_gpulease(self.lease)

    def plan(self, ledger: Ledger | None = None) -> LeasePlan:
        return planner.plan_lease(self.parsed(), self.view(), ledger=ledger or Ledger(), now=self.now)

    def apply(self, plan: LeasePlan) -> None:
        if plan.baseline is not None:
            annotations = self.lease["metadata"].setdefault("annotations", {})
            annotations[keys.ANN_LEND_BASELINE] = planner.format_baseline(plan.baseline)
        self.lease["status"] = plan.status.to_json_obj()
        for change in plan.tags:
            node = self.nodes.get(change.key.node)
            if node is None:
                continue
            devices = node["spec"].setdefault("devices", {})
            if change.owner is None:
                devices.pop(str(change.key.index), None)
            else:
                devices[str(change.key.index)] = {"owner": change.owner, "leasedAt": format_time(self.now)}
        for notice in plan.notices:
            annotations = self.pods[notice.pod.name]["metadata"]["annotations"]
            annotations[keys.ANN_PREEMPT_DEADLINE] = format_time(notice.deadline)
        for eviction in plan.evictions:
            self.evicted.append(eviction.pod.name)
            del self.pods[eviction.pod.name]

    def step(self, ledger: Ledger | None = None) -> LeasePlan:
        plan = self.plan(ledger)
        self.apply(plan)
        return plan

    def bind_tagged_free(self) -> None:
        """The owner's reclaim pods bind to whatever is free, healthy and tagged for it."""
        for gpu in self.view().gpus.values():
            if gpu.owner == OWNER and gpu.free and not gpu.failed:
                name = f"rec-{gpu.key.node}-{gpu.key.index}"
                self.pods[name] = pod(
                    name, gpu.key.node, [gpu.key.index], namespace="online", priority="high", owner=OWNER
                )

    def tag(self, node: str, index: int) -> str | None:
        spec = self.nodes[node]["spec"].get("devices", {}).get(str(index)) or {}
        owner = spec.get("owner")
        return str(owner) if owner is not None else None


def keys_of(devices: list[LeaseDevice]) -> list[DeviceKey]:
    return [d.key for d in devices]


# --------------------------------------------------------------------------- Lend


def test_lend_tags_ha_and_ma_and_releases_la_untagged() -> None:
    world = World(
        [gpunode("n1", ["HA", "MA", "LA", "HA", "HA", "HA", "HA", "HA"])],
        [],
        lease("l", "Lend", devices=[("n1", 0), ("n1", 1), ("n1", 2)]),
    )
    plan = world.step()
    assert plan.status.phase is LeasePhase.DONE
    assert {(t.key, t.owner) for t in plan.tags} == {(DeviceKey("n1", 0), OWNER), (DeviceKey("n1", 1), OWNER)}
    assert [(d.key, d.model, d.tier) for d in plan.status.lent] == [
        (DeviceKey("n1", 0), H20, Tier.HA),
        (DeviceKey("n1", 1), H20, Tier.MA),
    ]
    assert world.tag("n1", 2) is None
    assert "1 LA GPUs released untagged" in plan.status.message
    assert [n.reason for n in plan.notes] == ["LendDone"]
    again = world.plan()  # idempotent: nothing more to write
    assert again.status == world.parsed().status and not again.tags and not again.notes


def test_lend_waits_for_the_owners_pods_to_release() -> None:
    owner_pod = pod("rec-0", "n1", [0, 1], namespace="online", priority="high", owner=OWNER)
    world = World([gpunode("n1")], [owner_pod], lease("l", "Lend", devices=[("n1", 0), ("n1", 1), ("n1", 2)]))
    plan = world.step()
    assert plan.status.phase is LeasePhase.IN_PROGRESS
    assert [t.key for t in plan.tags] == [DeviceKey("n1", 2)]
    assert "2 GPUs still held by the owner's pods" in plan.status.message
    assert [n.reason for n in plan.notes] == ["LendStarted"]
    del world.pods["rec-0"]
    plan = world.step()
    assert plan.status.phase is LeasePhase.DONE
    assert sorted(t.key.index for t in plan.tags) == [0, 1]
    assert len(plan.status.lent) == 3


def test_lend_rejects_unknown_and_foreign_tagged_gpus_without_tagging() -> None:
    world = World(
        [gpunode("n1", tags={1: "other/job"})],
        [],
        lease("l", "Lend", devices=[("n1", 0), ("n1", 1), ("n9", 0)]),
    )
    plan = world.step()
    assert plan.status.phase is LeasePhase.FAILED
    assert "n1/1 is already lent by other/job" in plan.status.message
    assert "n9/0 is not a GPU any node agent reports" in plan.status.message
    assert not plan.tags
    assert plan.notes[0].type is planner.EventType.WARNING


def test_lend_count_records_a_baseline_and_lends_what_the_pods_release() -> None:
    pods = [
        pod("rec-0", "n1", [0, 1], namespace="online", priority="high", owner=OWNER),
        pod("rec-1", "n1", [2, 3], namespace="online", priority="high", owner=OWNER),
    ]
    world = World(
        [gpunode("n1", ["HA", "HA", "LA", "MA", "HA", "HA", "HA", "HA"])], pods, lease("l", "Lend", count=2)
    )
    plan = world.step()
    assert plan.baseline == tuple(DeviceKey("n1", i) for i in range(4))
    assert plan.status.phase is LeasePhase.IN_PROGRESS and not plan.tags
    assert world.plan().baseline is None  # recorded once
    del world.pods["rec-1"]  # the job scales down by one pod of two GPUs
    plan = world.step()
    assert plan.status.phase is LeasePhase.DONE
    assert [t.key for t in plan.tags] == [DeviceKey("n1", 3)]  # index 2 is LA: released untagged
    assert keys_of(plan.status.lent) == [DeviceKey("n1", 3)]


def test_lend_count_larger_than_what_the_owner_holds_fails_with_a_clear_message() -> None:
    world = World([gpunode("n1")], [], lease("l", "Lend", count=2))
    plan = world.step()
    assert plan.status.phase is LeasePhase.FAILED
    assert "fewer than spec.count=2" in plan.status.message


def _job(roles: list[str], framework: str = "pytorch") -> list[dict[str, Any]]:
    """The owner's pods on n1, one per role, two GPUs each."""
    return [
        pod(
            f"rec-{i}",
            "n1",
            [2 * i, 2 * i + 1],
            namespace="online",
            priority="high",
            owner=OWNER,
            labels={keys.LABEL_ROLE: role, keys.LABEL_FRAMEWORK: framework},
        )
        for i, role in enumerate(roles)
    ]


def test_lend_refuses_gpus_of_a_critical_pod_instead_of_waiting_for_it() -> None:
    """Coordinator protection on scale-down (WeFlex §3.4): rank 0 keeps its GPUs."""
    world = World(
        [gpunode("n1")], _job(["master", "worker"]), lease("l", "Lend", devices=[("n1", 1), ("n1", 2)])
    )
    plan = world.step()
    assert plan.status.phase is LeasePhase.FAILED and not plan.tags
    assert (
        "refused: n1/1 (online/rec-0) held by pods whose flexlease.io/role is critical" in plan.status.message
    )
    assert [c.reason for c in plan.status.conditions if c.type == planner.COND_TAGGED] == [
        planner.REASON_CRITICAL
    ]
    assert [(n.reason, n.type) for n in plan.notes] == [("LendFailed", planner.EventType.WARNING)]
    # the worker's GPUs are lent as usual
    ok = World(
        [gpunode("n1")], _job(["master", "worker"]), lease("l", "Lend", devices=[("n1", 2), ("n1", 3)])
    )
    assert ok.step().status.phase is LeasePhase.IN_PROGRESS


def test_lend_count_never_counts_on_critical_pods() -> None:
    world = World([gpunode("n1")], _job(["master", "worker", "worker"]), lease("l", "Lend", count=4))
    plan = world.step()
    assert plan.baseline == tuple(DeviceKey("n1", i) for i in range(2, 6))  # not the master's 0-1
    # the master restarting (its GPUs briefly unheld) does not make them lendable
    del world.pods["rec-0"]
    assert world.step().status.phase is LeasePhase.IN_PROGRESS and not world.plan().tags
    too_many = World([gpunode("n1")], _job(["master", "worker"]), lease("l", "Lend", count=3))
    plan = too_many.step()
    assert plan.status.phase is LeasePhase.FAILED
    assert "would take the job below its critical pods" in plan.status.message
    assert "they hold 2 of its 4 GPUs and are never scaled down; lend at most 2" in plan.status.message
    # more than the job holds at all: the usual message
    plan = World([gpunode("n1")], _job(["master"]), lease("l", "Lend", count=3)).step()
    assert "the owner's pods hold 2 GPUs, fewer than spec.count=3" in plan.status.message


# --------------------------------------------------------------------------- Reclaim


def lent_world(
    *,
    extra_nodes: list[dict[str, Any]] | None = None,
    pods: list[dict[str, Any]] | None = None,
    count: int = 4,
) -> World:
    nodes = [gpunode("n1", tags={0: OWNER, 1: OWNER, 2: OWNER, 3: OWNER}), *(extra_nodes or [])]
    return World(nodes, pods or [], lease("r", "Reclaim", count=count))


def test_reclaim_gives_lp_pods_a_grace_period_then_evicts_them() -> None:
    world = lent_world(pods=[pod("lp-a", "n1", [0, 1]), pod("lp-b", "n1", [2])])
    plan = world.step()
    assert plan.status.phase is LeasePhase.IN_PROGRESS
    assert {n.pod.name: n.devices for n in plan.notices} == {
        "lp-a": (DeviceKey("n1", 0), DeviceKey("n1", 1)),
        "lp-b": (DeviceKey("n1", 2),),
    }
    assert all(n.deadline == T0 + timedelta(seconds=45) for n in plan.notices)
    assert plan.requeue_after == 45.0
    assert plan.status.preempted_pods == ["lp/lp-a", "lp/lp-b"]
    freed = next(c for c in plan.status.conditions if c.type == planner.COND_FREED)
    assert (freed.status, freed.reason) == ("False", planner.REASON_GRACE)

    world.now += timedelta(seconds=30)
    plan = world.step()
    assert not plan.notices and not plan.evictions and plan.requeue_after == 15.0

    world.now += timedelta(seconds=15)
    plan = world.step()
    assert sorted(e.pod.name for e in plan.evictions) == ["lp-a", "lp-b"]

    plan = world.step()  # evicted: every GPU is free, tagged, waiting for the owner
    assert not plan.evictions and plan.status.phase is LeasePhase.IN_PROGRESS
    freed = next(c for c in plan.status.conditions if c.type == planner.COND_FREED)
    assert (freed.status, freed.reason) == ("True", planner.REASON_FREED)
    assert all(world.tag("n1", i) == OWNER for i in range(4))

    world.pods["rec-0"] = pod("rec-0", "n1", [0, 1, 2, 3], namespace="online", priority="high", owner=OWNER)
    plan = world.step()
    assert plan.status.phase is LeasePhase.DONE
    assert keys_of(plan.status.reclaimed) == [DeviceKey("n1", i) for i in range(4)]
    assert all(world.tag("n1", i) is None for i in range(4))  # tags released once the owner holds them
    assert [n.reason for n in plan.notes] == ["ReclaimDone"]


def test_reclaim_supplements_a_failed_gpu_from_standby_by_type_and_tier() -> None:
    standby = [
        gpunode("s-a100", "HA", model=A100, pool="standby"),
        gpunode("s-h20", ["LA", "MA", "HA", "HA", "HA", "HA", "HA", "HA"], pool="standby"),
    ]
    nodes = [
        gpunode(
            "n1",
            ["HA", "MA", "HA", "HA", "HA", "HA", "HA", "HA"],
            tags={0: OWNER, 1: OWNER},
            health={1: "Unhealthy"},
        ),
        *standby,
    ]
    world = World(nodes, [], lease("r", "Reclaim", count=2))
    plan = world.step()
    [sup] = plan.status.supplemented_from_standby
    assert sup.original.key == DeviceKey("n1", 1)
    assert sup.replacement.key == DeviceKey("s-h20", 1)  # same model, lowest tier >= MA
    assert (sup.replacement.model, sup.replacement.tier) == (H20, Tier.MA)
    assert world.tag("s-h20", 1) == OWNER and world.tag("n1", 1) is None
    assert [n.reason for n in plan.notes] == ["Supplemented", "ReclaimStarted"]
    world.pods["rec"] = pod("rec", "n1", [0], namespace="online", priority="high", owner=OWNER)
    world.pods["rec-s"] = pod("rec-s", "s-h20", [1], namespace="online", priority="high", owner=OWNER)
    plan = world.step()
    assert plan.status.phase is LeasePhase.DONE
    assert keys_of(plan.status.reclaimed) == [DeviceKey("n1", 0)]


def test_reclaim_uses_the_lend_time_tier_for_a_gpu_downgraded_after_failing() -> None:
    nodes = [
        gpunode("n1", ["LA"] * 8, tags={0: OWNER}, health={0: "Unhealthy"}),
        gpunode("s1", ["MA", "HA", "HA", "HA", "HA", "HA", "HA", "HA"], pool="standby"),
    ]
    world = World(nodes, [], lease("r", "Reclaim", count=1))
    ledger = Ledger(records={DeviceKey("n1", 0): LeaseDevice(node="n1", index=0, model=H20, tier=Tier.HA)})
    plan = world.step(ledger)
    [sup] = plan.status.supplemented_from_standby
    assert sup.replacement.key == DeviceKey("s1", 1) and sup.replacement.tier is Tier.HA


def test_reclaim_supplements_gpus_of_a_vanished_node_from_the_ledger() -> None:
    world = World([gpunode("s1", pool="standby")], [], lease("r", "Reclaim", count=8))
    ledger = Ledger(
        records={
            DeviceKey("gone", i): LeaseDevice(node="gone", index=i, model=H20, tier=Tier.HA) for i in (0, 1)
        }
    )
    plan = world.step(ledger)
    assert keys_of(plan.status.lent) == [DeviceKey("gone", 0), DeviceKey("gone", 1)]
    assert [s.replacement.key for s in plan.status.supplemented_from_standby] == [
        DeviceKey("s1", 0),
        DeviceKey("s1", 1),
    ]
    assert "Supplemented" in [n.reason for n in plan.notes]


def test_reclaim_replaces_a_gpu_held_by_another_owners_hp_pod() -> None:
    hp = pod("other", "n1", [0], namespace="team", priority="high", owner="team/train")
    world = lent_world(extra_nodes=[gpunode("s1", pool="standby")], pods=[hp], count=1)
    world.nodes["n1"]["spec"]["devices"] = {"0": {"owner": OWNER}}
    plan = world.step()
    assert not plan.notices and not plan.evictions  # HP pods are never preempted
    assert [s.replacement.key for s in plan.status.supplemented_from_standby] == [DeviceKey("s1", 0)]


def test_reclaim_without_a_matching_standby_gpu_waits_and_warns_once() -> None:
    nodes = [gpunode("n1", tags={0: OWNER}, health={0: "Unhealthy"}), gpunode("s1", "MA", pool="standby")]
    world = World(nodes, [], lease("r", "Reclaim", count=1))
    plan = world.step()
    assert plan.status.phase is LeasePhase.IN_PROGRESS and not plan.status.supplemented_from_standby
    freed = next(c for c in plan.status.conditions if c.type == planner.COND_FREED)
    assert freed.reason == planner.REASON_SHORTFALL
    assert planner.REASON_SHORTFALL in [n.reason for n in plan.notes]
    again = world.step()
    assert planner.REASON_SHORTFALL not in [n.reason for n in again.notes]
    assert again.status == world.parsed().status


def test_reclaim_reports_a_pdb_blocked_eviction_in_its_condition() -> None:
    world = lent_world(pods=[pod("lp-a", "n1", [0], deadline=format_time(T0))], count=1)
    world.nodes["n1"]["spec"]["devices"] = {"0": {"owner": OWNER}}
    blocked = {"lp/lp-a": "Cannot evict pod lp/lp-a as it would violate the pod's disruption budget pdb."}
    plan = planner.plan_reclaim(world.parsed(), world.view(), ledger=Ledger(), now=world.now, blocked=blocked)
    assert [e.pod.name for e in plan.evictions] == ["lp-a"]  # tried again, never dropped
    freed = next(c for c in plan.status.conditions if c.type == planner.COND_FREED)
    assert freed.reason == planner.REASON_EVICTION_BLOCKED and "disruption budget" in freed.message
    assert "1 evictions refused by a PodDisruptionBudget" in plan.status.message


def test_reclaim_of_devices_not_lent_by_the_owner_fails() -> None:
    world = World([gpunode("n1", tags={0: OWNER})], [], lease("r", "Reclaim", devices=[("n1", 0), ("n1", 5)]))
    plan = world.step()
    assert plan.status.phase is LeasePhase.FAILED and "n1/5 is not lent by online/rec" in plan.status.message


def test_reclaim_with_nothing_lent_is_done_at_once() -> None:
    plan = World([gpunode("n1")], [], lease("r", "Reclaim", count=3)).step()
    assert plan.status.phase is LeasePhase.DONE


def test_reclaim_count_takes_the_cheapest_gpus_first() -> None:
    nodes = [gpunode("n1", tags={0: OWNER, 1: OWNER, 2: OWNER}, health={0: "Unhealthy"})]
    world = World(nodes, [pod("lp", "n1", [1])], lease("r", "Reclaim", count=1))
    assert keys_of(world.step().status.lent) == [DeviceKey("n1", 2)]


# --------------------------------------------------------------------------- cluster-wide


def test_tag_release_clears_tags_the_owners_pods_hold() -> None:
    nodes = [gpunode("n1", tags={0: OWNER, 1: OWNER, 2: "x/y"})]
    pods = [pod("rec", "n1", [0], namespace="online", priority="high", owner=OWNER), pod("lp", "n1", [1, 2])]
    view = build_view([parse_gpunode(n) for n in nodes], pods)
    assert planner.plan_tag_release(view) == (planner.TagChange(DeviceKey("n1", 0), None, leased_at=None),)


def test_standby_grows_by_whole_free_nodes_preferring_reliable_ones() -> None:
    nodes = [
        gpunode("a", "LA"),
        gpunode("b", "HA"),
        gpunode("c", "HA", tags={0: OWNER}),  # lent GPUs stay put
        gpunode("d", "HA"),
        gpunode("s", "HA", pool="standby", count=4),
    ]
    pods = [pod("lp", "d", [3])]
    view = build_view([parse_gpunode(n) for n in nodes], pods)
    assert planner.plan_standby(view, size=12) == (planner.PoolChange("b", Pool.STANDBY, gpus=8),)
    assert planner.plan_standby(view, size=4) == ()
    assert planner.plan_standby(view, size=0) == ()
    assert planner.plan_standby(view, size=20) == (
        planner.PoolChange("b", Pool.STANDBY, gpus=8),
        planner.PoolChange("a", Pool.STANDBY, gpus=8),
    )


def test_standby_shrinks_by_whole_free_nodes_while_it_stays_at_size() -> None:
    nodes = [
        gpunode("s1", "HA", pool="standby"),
        gpunode("s2", "MA", pool="standby"),
        gpunode("s3", "HA", pool="standby", count=4),
    ]
    view = build_view([parse_gpunode(n) for n in nodes], [])
    assert planner.plan_standby(view, size=12) == (planner.PoolChange("s2", Pool.GENERAL, gpus=8),)


def test_standby_prefers_the_model_the_pool_lacks() -> None:
    nodes = [gpunode("h", "HA"), gpunode("x", "MA", model=A100), gpunode("s", "HA", pool="standby")]
    view = build_view([parse_gpunode(n) for n in nodes], [])
    assert planner.plan_standby(view, size=9) == (planner.PoolChange("x", Pool.STANDBY, gpus=8),)


# --------------------------------------------------------------------------- property


STATES = ("free", "lp", "failed", "vanished", "hp", "owner")


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[str], list[str], list[str]]:
    n = draw(st.integers(min_value=1, max_value=10))
    states = draw(st.lists(st.sampled_from(STATES), min_size=n, max_size=n))
    tiers = draw(st.lists(st.sampled_from(["HA", "MA"]), min_size=n, max_size=n))
    models = draw(st.lists(st.sampled_from([H20, A100]), min_size=n, max_size=n))
    return states, tiers, models


def lent_states(
    states: list[str], tiers: list[str], models: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[DeviceKey, LeaseDevice]]:
    """One node ``n<i>`` per lent GPU ``n<i>/0``, tagged for the owner, in ``states[i]``
    (free, failed, vanished, or held by an LP, another owner's HP, or the owner's pod): the
    GPUNodes, the pods, and the lend-time records."""
    nodes: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    records: dict[DeviceKey, LeaseDevice] = {}
    for i, (state, tier, model) in enumerate(zip(states, tiers, models, strict=True)):
        name = f"n{i}"
        records[DeviceKey(name, 0)] = LeaseDevice(node=name, index=0, model=model, tier=Tier(tier))
        if state == "vanished":
            continue
        health = {0: "Unhealthy"} if state == "failed" else {}
        now_tier = "LA" if state == "failed" else tier  # the agent downgrades at once
        nodes.append(gpunode(name, [now_tier], count=1, model=model, tags={0: OWNER}, health=health))
        if state == "lp":
            pods.append(pod(f"lp{i}", name, [0]))
        elif state == "hp":
            pods.append(pod(f"hp{i}", name, [0], namespace="team", priority="high", owner="team/x"))
        elif state == "owner":
            pods.append(pod(f"own{i}", name, [0], namespace="online", priority="high", owner=OWNER))
    return nodes, pods, records


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.booleans())
def test_every_lent_gpu_ends_reclaimed_or_supplemented_by_type_and_tier(
    scenario: tuple[list[str], list[str], list[str]], with_pdb_delay: bool
) -> None:
    states, tiers, models = scenario
    nodes, pods, records = lent_states(states, tiers, models)
    # a standby pool big enough for every GPU: per model, one node of each tier
    for model in (H20, A100):
        for tier in ("MA", "HA"):
            nodes.append(
                gpunode(f"s-{model[-4:]}-{tier}", tier, count=len(states), model=model, pool="standby")
            )
    world = World(nodes, pods, lease("r", "Reclaim", count=len(states)))
    ledger = Ledger(records=records)
    refusals = 2 if with_pdb_delay else 0

    for _ in range(40):
        plan = world.plan(ledger)
        evictions = plan.evictions
        if evictions and refusals:
            refusals -= 1
            plan = LeasePlan(status=plan.status, tags=plan.tags, notices=plan.notices, notes=plan.notes)
        world.apply(plan)
        if plan.status.phase is not LeasePhase.IN_PROGRESS:
            break
        world.bind_tagged_free()
        world.now += timedelta(seconds=50)

    status = world.parsed().status
    assert status.phase is LeasePhase.DONE
    reclaimed = set(keys_of(status.reclaimed))
    supplemented = {s.original.key: s.replacement for s in status.supplemented_from_standby}
    assert reclaimed.isdisjoint(supplemented)
    assert reclaimed | set(supplemented) == set(records)
    assert len({r.key for r in supplemented.values()}) == len(supplemented)  # one-for-one
    for original, replacement in supplemented.items():
        assert world.view().pools[replacement.node] is Pool.STANDBY
        assert replacement.model == records[original].model
        assert replacement.tier is not None and replacement.tier >= (records[original].tier or Tier.LA)
    for key, state in zip(sorted(records), [states[int(k.node[1:])] for k in sorted(records)], strict=True):
        assert (key in reclaimed) == (state in ("free", "lp", "owner"))
    assert sorted(world.evicted) == sorted(f"lp{i}" for i, s in enumerate(states) if s == "lp")
    final = copy.deepcopy(world.lease)
    assert world.plan(ledger).status.to_json_obj() == parse_gpulease(final).status.to_json_obj()


def test_a_notice_left_from_an_earlier_reclaim_gets_a_fresh_grace_period() -> None:
    old = format_time(T0 - timedelta(hours=3))
    world = lent_world(pods=[pod("lp-a", "n1", [0], deadline=old)], count=1)
    world.nodes["n1"]["spec"]["devices"] = {"0": {"owner": OWNER}}
    plan = world.step()
    assert not plan.evictions
    assert [(n.pod.name, n.deadline) for n in plan.notices] == [("lp-a", T0 + timedelta(seconds=45))]


def test_a_notice_this_lease_wrote_is_honoured_after_a_restart() -> None:
    world = lent_world(pods=[pod("lp-a", "n1", [0])], count=4)
    world.nodes["n1"]["spec"]["devices"] = {"0": {"owner": OWNER}}
    world.step()  # notice written, pod recorded in preemptedPods
    world.now += timedelta(hours=3)  # the controller was down for long
    plan = world.step()
    assert [e.pod.name for e in plan.evictions] == ["lp-a"] and not plan.notices


def test_accepted_condition_marks_when_work_began() -> None:
    world = lent_world(pods=[pod("lp-a", "n1", [0])], count=4)
    world.step()
    world.now += timedelta(seconds=60)
    status = world.step().status
    accepted = next(c for c in status.conditions if c.type == planner.COND_ACCEPTED)
    assert (accepted.status, accepted.last_transition_time) == ("True", T0)


def test_reclaim_replaces_a_gpu_downgraded_below_its_lend_time_tier() -> None:
    """Right-of-return is in kind: gpu n1/1 was lent as HA, failed and recovered, and is MA now;
    an HA standby GPU takes its place and n1/1 goes back to the platform untagged."""
    nodes = [
        gpunode("n1", ["HA", "MA", "HA", "HA", "HA", "HA", "HA", "HA"], tags={0: OWNER, 1: OWNER}),
        gpunode("s1", "HA", pool="standby"),
    ]
    world = World(nodes, [pod("lp-a", "n1", [1])], lease("r", "Reclaim", count=2))
    lent = {DeviceKey("n1", i): LeaseDevice(node="n1", index=i, model=H20, tier=Tier.HA) for i in (0, 1)}
    plan = world.plan(Ledger(records=lent))
    world.apply(plan)
    [sup] = plan.status.supplemented_from_standby
    assert (sup.original.key, sup.replacement.key, sup.replacement.tier) == (
        DeviceKey("n1", 1),
        DeviceKey("s1", 0),
        Tier.HA,
    )
    assert world.tag("n1", 1) is None and world.tag("s1", 0) == OWNER
    assert not plan.notices  # the LP pod on the downgraded GPU is left alone
    assert any("downgraded to MA" in n.message for n in plan.notes)


def test_a_terminating_lp_pod_is_not_noticed_or_evicted_again() -> None:
    world = lent_world(pods=[pod("lp-a", "n1", [0])], count=4)
    world.pods["lp-a"]["metadata"]["deletionTimestamp"] = "2026-03-01T00:00:00Z"
    plan = world.step()
    assert not plan.notices and not plan.evictions
    assert plan.status.preempted_pods == ["lp/lp-a"]
    world.now += timedelta(seconds=120)
    plan = world.step()
    assert not plan.notices and not plan.evictions  # still holding until it is gone


def test_reclaim_never_notices_or_evicts_a_critical_pod_and_supplements_instead() -> None:
    """Coordinator protection (WeFlex §3.4): an LP job's Ray head keeps its lent GPU."""
    head = pod("ray-head", "n1", [0], labels={keys.LABEL_ROLE: "head", keys.LABEL_FRAMEWORK: "ray"})
    worker = pod("ray-w", "n1", [1], labels={keys.LABEL_ROLE: "worker", keys.LABEL_FRAMEWORK: "ray"})
    world = lent_world(extra_nodes=[gpunode("s1", pool="standby")], pods=[head, worker], count=2)
    world.nodes["n1"]["spec"]["devices"] = {"0": {"owner": OWNER}, "1": {"owner": OWNER}}
    plan = world.step()
    assert [n.pod.name for n in plan.notices] == ["ray-w"]  # the worker gets its notice
    assert [s.replacement.key for s in plan.status.supplemented_from_standby] == [DeviceKey("s1", 0)]
    assert any("held by a critical pod" in n.message for n in plan.notes)
    world.now += timedelta(seconds=60)
    plan = world.step()
    assert world.evicted == ["ray-w"]  # past the grace period: the worker only


def test_count_reclaim_prefers_gpus_not_held_by_critical_pods() -> None:
    coordinator = pod("mpi-coord", "n1", [0], labels={keys.LABEL_ROLE: "coordinator"})
    worker = pod("mpi-w", "n1", [1], labels={keys.LABEL_ROLE: "worker"})
    world = lent_world(pods=[coordinator, worker], count=1)
    world.nodes["n1"]["spec"]["devices"] = {"0": {"owner": OWNER}, "1": {"owner": OWNER}}
    plan = world.step()
    assert keys_of(plan.status.lent) == [DeviceKey("n1", 1)]
    assert [n.pod.name for n in plan.notices] == ["mpi-w"]


# --------------------------------------------------------------------------- the end state, overlap, in kind (#38)


def _condition(plan: LeasePlan, type: str) -> tuple[str, str, str]:
    c = next(c for c in plan.status.conditions if c.type == type)
    return c.status, c.reason, c.message


def test_a_reclaim_waiting_for_the_owners_pods_stays_in_progress_and_says_so() -> None:
    world = lent_world(count=4)
    plan = world.step()
    assert plan.status.phase is LeasePhase.IN_PROGRESS  # all four free: not Done in 0 s
    status, reason, message = _condition(plan, planner.COND_RETURNED)
    assert (status, reason) == ("False", planner.REASON_WAITING_FOR_OWNER)
    assert "n1/0, n1/1, n1/2, n1/3" in message
    world.pods["own"] = pod("own", "n1", [0, 1, 2, 3], namespace="online", priority="high", owner=OWNER)
    done = world.step()
    assert done.status.phase is LeasePhase.DONE
    assert _condition(done, planner.COND_RETURNED)[:2] == ("True", planner.REASON_RETURNED)


def test_a_gpu_without_a_standby_replacement_is_unrecoverable_once_the_wait_is_over() -> None:
    """No standby GPU of the model at all (NoStandbyOfModel) and one of the model but in use
    (StandbyExhausted): the Reclaim waits ``standby_wait`` s, then lists both with their reason,
    releases their tags, tells it in a Warning Event, and is Done with the rest back."""
    nodes = [
        gpunode("n1", tags={0: OWNER, 1: OWNER}, health={0: "Unhealthy"}),
        gpunode("n2", model=A100, tags={0: OWNER}, health={0: "Unhealthy"}),
        gpunode("s1", "HA", count=1, pool="standby"),
    ]
    busy = pod("other-rec", "s1", [0], namespace="team", priority="high", owner="team/x")
    owner = pod("own", "n1", [1], namespace="online", priority="high", owner=OWNER)
    world = World(nodes, [busy, owner], lease("r", "Reclaim", count=3))

    def plan_at(seconds: float) -> LeasePlan:
        world.now = T0 + timedelta(seconds=seconds)
        plan = planner.plan_lease(
            world.parsed(), world.view(), ledger=Ledger(), now=world.now, standby_wait=600
        )
        world.apply(plan)
        return plan

    first = plan_at(0)
    assert first.status.phase is LeasePhase.IN_PROGRESS and not first.status.unrecoverable
    assert _condition(first, planner.COND_RETURNED)[1] == planner.REASON_SHORTFALL
    assert first.requeue_after == 600
    assert plan_at(599).status.phase is LeasePhase.IN_PROGRESS
    last = plan_at(600)
    assert last.status.phase is LeasePhase.DONE
    gone = {u.key: u.reason for u in last.status.unrecoverable}
    assert gone == {
        DeviceKey("n1", 0): planner.UNRECOVERABLE_EXHAUSTED,
        DeviceKey("n2", 0): planner.UNRECOVERABLE_NO_STANDBY,
    }
    assert keys_of(last.status.reclaimed) == [DeviceKey("n1", 1)]
    assert _condition(last, planner.COND_RETURNED)[:2] == ("True", planner.REASON_PARTLY_UNRECOVERABLE)
    assert world.tag("n1", 0) is None and world.tag("n2", 0) is None
    [note] = [n for n in last.notes if n.reason == "Unrecoverable"]
    assert note.type is planner.EventType.WARNING and "n2/0: NoStandbyOfModel" in note.message
    assert "1 unrecoverable" not in last.status.message and "2 unrecoverable" in last.status.message


def test_a_lent_gpu_whose_record_lacks_its_model_is_unrecoverable_at_once() -> None:
    world = World(
        [gpunode("n1", tags={0: OWNER}, health={0: "Unhealthy"})], [], lease("r", "Reclaim", count=1)
    )
    ledger = Ledger(records={DeviceKey("n1", 0): LeaseDevice(node="n1", index=0)})
    world.nodes["n1"]["status"]["devices"].pop("0")  # vanished: nothing tells its model
    plan = world.step(ledger)
    assert plan.status.phase is LeasePhase.DONE
    [entry] = plan.status.unrecoverable
    assert entry.reason == planner.UNRECOVERABLE_INCOMPLETE and "model or tier is unknown" in entry.message


def test_lending_a_standby_supplement_returns_it_to_the_pool_in_kind() -> None:
    """The owner's pods held s1/0 (a standby supplement) and n1/0, and released both: n1/0 is
    tagged as usual, s1/0 goes back to the standby pool untagged, recorded ``inKind``."""
    nodes = [gpunode("n1"), gpunode("s1", pool="standby", tags={0: OWNER})]
    world = World(nodes, [], lease("l", "Lend", devices=[("n1", 0), ("s1", 0)]))
    plan = world.step()
    assert plan.status.phase is LeasePhase.DONE
    assert [(d.key, d.in_kind) for d in plan.status.lent] == [
        (DeviceKey("n1", 0), None),
        (DeviceKey("s1", 0), True),
    ]
    assert world.tag("n1", 0) == OWNER and world.tag("s1", 0) is None
    assert "1 standby GPUs back to the standby pool, lent in kind" in plan.status.message
    assert world.step().tags == ()  # idempotent: the in-kind GPU stays untagged
    assert DeviceKey("s1", 0) in {g.key for g in planner.spare_gpus(world.view())}  # a spare again


def test_a_gpu_lent_in_kind_comes_back_itself_when_free_else_as_another_standby_gpu() -> None:
    record = LeaseDevice(node="s1", index=0, model=H20, tier=Tier.HA, in_kind=True)
    ledger = Ledger(records={record.key: record})
    free = World([gpunode("s1", pool="standby")], [], lease("r", "Reclaim", count=8))
    plan = free.step(ledger)
    assert keys_of(plan.status.lent) == [DeviceKey("s1", 0)] and not plan.status.supplemented_from_standby
    assert free.tag("s1", 0) == OWNER  # reserved for the owner's reclaim pods
    taken = World(
        [gpunode("s1", pool="standby")],
        [pod("x", "s1", [0], namespace="team", priority="high", owner="team/x")],
        lease("r", "Reclaim", count=8),
    )
    plan = taken.step(ledger)
    [sup] = plan.status.supplemented_from_standby
    assert sup.original.key == DeviceKey("s1", 0) and sup.replacement.key == DeviceKey("s1", 1)
    # the owner's pods took it back before the Reclaim: not out any more
    back = World(
        [gpunode("s1", pool="standby")],
        [pod("own", "s1", [0], namespace="online", priority="high", owner=OWNER)],
        lease("r", "Reclaim", count=8),
    )
    assert back.step(ledger).status.lent == []


def test_a_lend_superseded_by_a_newer_reclaim_is_finished_or_cancelled() -> None:
    owner_pod = pod("own", "n1", [1], namespace="online", priority="high", owner=OWNER)
    world = World([gpunode("n1")], [owner_pod], lease("l", "Lend", devices=[("n1", 0), ("n1", 1)]))
    plan = planner.plan_lease(world.parsed(), world.view(), ledger=Ledger(superseded_by="r"), now=T0)
    world.apply(plan)
    assert plan.status.phase is LeasePhase.CANCELLED and plan.status.superseded_by == "r"
    assert keys_of(plan.status.lent) == [DeviceKey("n1", 0)] and world.tag("n1", 0) == OWNER
    assert _condition(plan, planner.COND_SUPERSEDED)[:2] == ("True", planner.REASON_CANCELLED)
    assert "1 GPUs its owner's pods did not release were not lent" in plan.status.message
    assert [n.reason for n in plan.notes] == ["LendCancelled"]

    whole = World([gpunode("n1")], [], lease("l", "Lend", devices=[("n1", 0)]))
    plan = planner.plan_lease(whole.parsed(), whole.view(), ledger=Ledger(superseded_by="r"), now=T0)
    assert plan.status.phase is LeasePhase.DONE and plan.status.superseded_by == "r"
    assert _condition(plan, planner.COND_SUPERSEDED)[1] == planner.REASON_FINISHED
    count = World([gpunode("n1")], [], lease("l", "Lend", count=2))
    plan = planner.plan_lease(count.parsed(), count.view(), ledger=Ledger(superseded_by="r"), now=T0)
    assert plan.status.phase is LeasePhase.CANCELLED and plan.status.lent == [] and plan.baseline is None


def test_a_pending_reclaim_waits_for_an_older_lend_and_a_superseded_one_takes_nothing() -> None:
    world = lent_world(count=4)
    plan = planner.plan_lease(world.parsed(), world.view(), ledger=Ledger(waits_for=("l",)), now=T0)
    assert plan.status.phase is LeasePhase.PENDING and plan.status.lent == [] and not plan.tags
    assert _condition(plan, planner.COND_ACCEPTED)[:2] == ("False", planner.REASON_WAITING_FOR_LEND)
    plan = planner.plan_lease(world.parsed(), world.view(), ledger=Ledger(superseded_by="l2"), now=T0)
    assert plan.status.phase is LeasePhase.CANCELLED and plan.status.lent == []


def test_a_reclaim_superseded_by_a_newer_lend_hands_back_what_is_not_back() -> None:
    """n1/0 back with the owner, n1/1 in an LP pod's grace period, n1/2 failed and replaced by
    standby s1/0 the owner's pods do not hold yet, n1/3 unrecoverable: the owner lends again;
    the Reclaim is Cancelled, n1/1 stays lent as itself (tagged) and n1/2 as s1/0, which goes
    back to the standby pool untagged, in kind. No new notice, eviction or replacement."""
    nodes = [
        gpunode("n1", tags={1: OWNER, 3: OWNER}, health={2: "Unhealthy", 3: "Unhealthy"}),
        gpunode("s1", pool="standby", tags={0: OWNER}),
    ]
    pods = [
        pod("own", "n1", [0], namespace="online", priority="high", owner=OWNER),
        pod("lp-a", "n1", [1], deadline=format_time(T0 + timedelta(seconds=30))),
    ]
    record = {"model": H20, "tier": "HA"}
    reclaim = lease("r", "Reclaim", count=4)
    reclaim["status"] = {
        "phase": "InProgress",
        "lent": [{"node": "n1", "index": i, **record} for i in range(4)],
        "reclaimed": [{"node": "n1", "index": 0, **record}],
        "supplementedFromStandby": [
            {"original": {"node": "n1", "index": 2}, "replacement": {"node": "s1", "index": 0, **record}}
        ],
        "unrecoverable": [{"node": "n1", "index": 3, "reason": "NoStandbyOfModel"}],
        "preemptedPods": ["lp/lp-a"],
    }
    world = World(nodes, pods, reclaim)
    plan = planner.plan_lease(world.parsed(), world.view(), ledger=Ledger(superseded_by="l2"), now=T0)
    world.apply(plan)
    assert plan.status.phase is LeasePhase.CANCELLED and plan.status.superseded_by == "l2"
    assert [(d.key, d.in_kind) for d in plan.status.still_lent] == [
        (DeviceKey("n1", 1), None),
        (DeviceKey("s1", 0), True),
    ]
    assert not plan.notices and not plan.evictions
    assert world.tag("n1", 1) == OWNER and world.tag("s1", 0) is None
    assert [n.reason for n in plan.notes] == ["ReclaimCancelled"]
    assert "2 GPUs not back stay lent: n1/1, s1/0" in plan.status.message


def test_a_superseded_reclaim_whose_gpus_are_all_back_is_done() -> None:
    world = lent_world(
        pods=[pod("own", "n1", [0, 1, 2, 3], namespace="online", priority="high", owner=OWNER)]
    )
    world.step()  # accepted (and Done: all held)
    world.lease["status"]["phase"] = "InProgress"
    world.lease["status"]["reclaimed"] = []
    plan = planner.plan_lease(world.parsed(), world.view(), ledger=Ledger(superseded_by="l2"), now=T0)
    assert plan.status.phase is LeasePhase.DONE and plan.status.still_lent == []
    assert len(plan.status.reclaimed) == 4


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.lists(st.sampled_from([H20, A100]), max_size=2, unique=True))
def test_every_lent_gpu_ends_back_replaced_or_unrecoverable_with_whatever_standby_pool(
    scenario: tuple[list[str], list[str], list[str]], pool_models: list[str]
) -> None:
    """Any lent GPUs in any state, a standby pool holding some of their models or none: the
    Reclaim ends Done, each GPU exactly once back (reclaimed), replaced by a standby GPU of
    its model and tier >= (one-for-one) or unrecoverable, and NoStandbyOfModel exactly for
    the GPUs needing a replacement whose model the pool lacks."""
    states, tiers, models = scenario
    nodes, pods, records = lent_states(states, tiers, models)
    for model in pool_models:
        nodes.append(gpunode(f"s-{model[-4:]}", "HA", count=len(states), model=model, pool="standby"))
    world = World(nodes, pods, lease("r", "Reclaim", count=len(states)))
    ledger = Ledger(records=records)
    for _ in range(40):
        plan = planner.plan_lease(
            world.parsed(), world.view(), ledger=ledger, now=world.now, standby_wait=600
        )
        world.apply(plan)
        if plan.status.phase is not LeasePhase.IN_PROGRESS:
            break
        world.bind_tagged_free()
        world.now += timedelta(seconds=100)
    status = world.parsed().status
    assert status.phase is LeasePhase.DONE
    reclaimed = set(keys_of(status.reclaimed))
    replaced = {s.original.key: s.replacement for s in status.supplemented_from_standby if s.returned}
    gone = {u.key: u.reason for u in status.unrecoverable}
    assert len(reclaimed) + len(replaced) + len(gone) == len(records)
    assert reclaimed | set(replaced) | set(gone) == set(records)
    assert len({r.key for r in replaced.values()}) == len(replaced)
    for original, replacement in replaced.items():
        assert replacement.model == records[original].model
        assert replacement.tier is not None and replacement.tier >= (records[original].tier or Tier.LA)
    for key, reason in gone.items():
        assert reason == planner.UNRECOVERABLE_NO_STANDBY
        assert records[key].model not in pool_models
    for key, record in records.items():
        state = states[int(key.node[1:])]
        if state not in ("free", "lp", "owner") and record.model in pool_models:
            assert key in replaced  # the pool had the model: never unrecoverable
