"""Algorithm 1 (extender.scheduling): examples and hypothesis properties of its invariants."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from types import MappingProxyType

from hypothesis import given, settings
from hypothesis import strategies as st

from extender import scheduling
from extender.scheduling import Code, DeviceView, FitKey, Holder, NodeView
from flexlease.api.pod import GpuRequest, Priority
from flexlease.api.resources import Pool
from flexlease.api.tiers import Tier

H20 = "NVIDIA H20"
A100 = "NVIDIA A100"


def request(
    count: int = 1,
    *,
    priority: Priority = Priority.LOW,
    owner: str | None = "ml/online",
    tier: Tier = Tier.LA,
    gpu_type: str | None = None,
    reclaim: bool = False,
    checkpoint: str | None = None,
    images: tuple[str, ...] = (),
    priority_value: int = 0,
    preempts: bool = True,
) -> GpuRequest:
    return GpuRequest(
        namespace="ml",
        name="p",
        uid="uid-p",
        count=count,
        priority=priority,
        owner=owner,
        required_tier=tier,
        gpu_type=gpu_type,
        reclaim=reclaim,
        checkpoint=checkpoint,
        images=images,
        node_name=None,
        assignment=None,
        terminated=False,
        priority_value=priority_value,
        preempts=preempts,
    )


def hp(count: int = 1, **kw: object) -> GpuRequest:
    return request(count, priority=Priority.HIGH, **kw)  # type: ignore[arg-type]


def node(
    name: str = "n1",
    *,
    gpus: int = 8,
    model: str = H20,
    tiers: Sequence[Tier | None] | Tier = Tier.HA,
    owners: dict[int, str] | None = None,
    unhealthy: set[int] | None = None,
    held: dict[int, str] | None = None,
    holders: dict[str, Holder] | None = None,
    pool: Pool = Pool.GENERAL,
    images: frozenset[str] = frozenset(),
    checkpoints: frozenset[str] = frozenset(),
) -> NodeView:
    tier_list = [tiers] * gpus if isinstance(tiers, Tier) else list(tiers)
    owners = owners or {}
    unhealthy = unhealthy or set()
    held = held or {}
    devices = tuple(
        DeviceView(
            index=i,
            uuid=f"GPU-{name}-{i}",
            model=model,
            tier=tier_list[i],
            healthy=i not in unhealthy,
            owner=owners.get(i),
            holder=held.get(i),
        )
        for i in range(gpus)
    )
    hs = dict(holders or {})
    for i, uid in held.items():
        if uid not in hs:
            hs[uid] = Holder(uid=uid, key=f"ml/{uid}", indices=(i,), low=True)
    return NodeView(
        name=name,
        pool=pool,
        generation=1,
        devices=devices,
        images=images,
        checkpoints=checkpoints,
        holders=MappingProxyType(hs),
    )


# --------------------------------------------------------------------------- examples: filter


def test_free_node_passes_and_devices_are_lowest_indices() -> None:
    n = node()
    assert scheduling.check_node(request(2), n) == scheduling.PASS
    assert scheduling.choose_devices(request(2), n) == (0, 1)


def test_pod_asking_more_gpus_than_the_node_has_is_unresolvable_with_a_clear_reason() -> None:
    v = scheduling.check_node(request(16), node())
    assert v.code is Code.UNRESOLVABLE
    assert v.cause is scheduling.Cause.TOO_FEW_GPUS
    assert v.reason == "node(s) had fewer than 16 GPUs in total"


def test_wrong_gpu_type_is_unresolvable() -> None:
    v = scheduling.check_node(request(1, gpu_type=A100), node())
    assert v.code is Code.UNRESOLVABLE
    assert v.reason == "node(s) had no GPU of type NVIDIA A100"


def test_tier_below_requirement_is_not_usable() -> None:
    n = node(tiers=[Tier.HA, Tier.MA, Tier.MA, Tier.LA, Tier.LA, Tier.LA, Tier.LA, None])
    assert scheduling.check_node(request(1, tier=Tier.HA), n).ok
    v = scheduling.check_node(request(2, tier=Tier.HA), n)
    assert v.code is Code.UNRESOLVABLE
    assert v.reason == (
        "node(s) had fewer than 2 healthy GPUs at tier HA or above open to this pod (others below tier HA)"
    )
    assert scheduling.choose_devices(request(3, tier=Tier.MA), n) == (0, 1, 2)
    # the lowest adequate tier goes first, so HA stays for pods that need it
    assert scheduling.choose_devices(request(1, tier=Tier.MA), n) == (1,)


def test_unhealthy_devices_are_never_usable() -> None:
    n = node(gpus=2, unhealthy={0})
    assert scheduling.choose_devices(request(1), n) == (1,)
    v = scheduling.check_node(request(2), n)
    assert v.code is Code.UNRESOLVABLE and v.reason.endswith("(others unhealthy)")


def test_hp_pod_uses_only_untagged_or_its_own_tagged_gpus() -> None:
    n = node(gpus=4, owners={0: "ml/other", 1: "ml/other", 2: "ml/online"})
    pod = hp(2, owner="ml/online")
    assert scheduling.choose_devices(pod, n) == (2, 3)
    v = scheduling.check_node(hp(3, owner="ml/online"), n)
    assert v.code is Code.UNRESOLVABLE and "tagged for another owner" in v.reason


def test_hp_pod_without_owner_uses_only_untagged() -> None:
    n = node(gpus=4, owners={0: "ml/a", 1: "ml/b"})
    assert scheduling.choose_devices(hp(2, owner=None), n) == (2, 3)
    assert not scheduling.check_node(hp(3, owner=None), n).ok


def test_lp_pod_may_use_tagged_gpus_but_prefers_untagged() -> None:
    n = node(gpus=4, owners={0: "ml/a", 1: "ml/a"})
    assert scheduling.choose_devices(request(2), n) == (2, 3)
    assert scheduling.choose_devices(request(4), n) == (0, 1, 2, 3)


def test_hp_reclaim_pod_takes_its_own_tagged_gpus_first() -> None:
    n = node(gpus=4, owners={2: "ml/online", 3: "ml/online"})
    assert scheduling.choose_devices(hp(2, owner="ml/online", reclaim=True), n) == (2, 3)


def test_held_by_low_priority_pods_is_unschedulable_preemption_may_help() -> None:
    n = node(gpus=2, held={0: "lp-1", 1: "lp-2"})
    v = scheduling.check_node(hp(2, priority_value=1000), n)
    assert v.code is Code.UNSCHEDULABLE
    assert v.reason == "node(s) had fewer than 2 free GPUs; preemptable lower-priority pods hold the rest"


def test_preemption_helps_only_a_pod_that_may_preempt_the_holders() -> None:
    """kube-scheduler evicts only pods of lower spec.priority, and never for a pod with
    preemptionPolicy Never: otherwise "preemption may help" would send it on a futile pass."""
    n = node(gpus=2, held={0: "lp-1", 1: "lp-2"})  # held by LP pods of priority 0
    for pod in (hp(1), request(1), hp(1, priority_value=1000, preempts=False)):
        v = scheduling.check_node(pod, n)
        assert v.code is Code.UNRESOLVABLE and v.cause is scheduling.Cause.HELD, pod
        assert v.reason == "node(s) had no free GPU; pods this pod cannot preempt hold the rest"
    assert scheduling.check_node(request(1, priority_value=1), n).code is Code.UNSCHEDULABLE


def test_held_by_high_priority_pods_is_unresolvable() -> None:
    holders = {"hp-1": Holder(uid="hp-1", key="ml/hp-1", indices=(0, 1), low=False)}
    n = node(gpus=2, held={0: "hp-1", 1: "hp-1"}, holders=holders)
    v = scheduling.check_node(request(1), n)
    assert v.code is Code.UNRESOLVABLE and v.cause is scheduling.Cause.HELD


def test_no_gpunode_and_empty_node() -> None:
    verdicts = scheduling.filter_nodes(request(1), [None, node(gpus=0)])
    assert [v.cause for v in verdicts] == [scheduling.Cause.NO_GPUNODE, scheduling.Cause.NO_GPUS]


# --------------------------------------------------------------------------- examples: standby


def test_standby_node_is_refused_to_non_reclaim_pods() -> None:
    verdicts = scheduling.filter_nodes(hp(1), [node("s", pool=Pool.STANDBY)])
    assert verdicts[0] == scheduling.STANDBY_NOT_RECLAIM


def test_standby_only_when_general_candidates_fall_short() -> None:
    general_full = node("g", gpus=2, held={0: "x", 1: "y"})
    standby = node("s", pool=Pool.STANDBY)
    pod = hp(2, owner="ml/online", reclaim=True)
    assert [v.ok for v in scheduling.filter_nodes(pod, [general_full, standby])] == [False, True]
    general_free = node("g2", gpus=2)
    verdicts = scheduling.filter_nodes(pod, [general_full, standby, general_free])
    assert [v.ok for v in verdicts] == [False, False, True]
    assert verdicts[1] == scheduling.STANDBY_NOT_NEEDED
    assert scheduling.standby_allowed(pod, [general_full])
    assert not scheduling.standby_allowed(pod, [general_free])


def test_standby_gpu_tagged_as_the_owners_supplement_is_usable_even_when_general_nodes_fit() -> None:
    """The lease controller tags a standby GPU for the owner when a lent GPU failed: that is
    FETCHSTANDBY's answer already, so the owner's reclaim pod may take it (and prefers it)."""
    general_free = node("g", gpus=4)
    supplement = node("s", pool=Pool.STANDBY, owners={0: "ml/online"})
    pod = hp(1, owner="ml/online", reclaim=True)
    verdicts = scheduling.filter_nodes(pod, [general_free, supplement])
    assert [v.ok for v in verdicts] == [True, True]
    assert scheduling.score_node(pod, supplement) > scheduling.score_node(pod, general_free)
    assert scheduling.choose_devices(pod, supplement) == (0,)
    other = hp(1, owner="ml/other", reclaim=True)  # another owner's supplement stays closed
    assert scheduling.filter_nodes(other, [general_free, supplement])[1] == scheduling.STANDBY_NOT_NEEDED
    lp = request(1, reclaim=True)
    assert not scheduling.filter_nodes(lp, [general_free, supplement])[1].ok


def test_standby_supplement_keeps_type_and_tier() -> None:
    standby = node("s", pool=Pool.STANDBY, model=A100, tiers=Tier.MA)
    pod = hp(1, owner="ml/online", reclaim=True, gpu_type=H20, tier=Tier.HA)
    v = scheduling.filter_nodes(pod, [standby])[0]
    assert v.code is Code.UNRESOLVABLE


# --------------------------------------------------------------------------- examples: scores


def test_scores_prefer_own_tags_then_cache_then_packing() -> None:
    pod = hp(2, owner="ml/online", reclaim=True, checkpoint="ckpt-7", images=("img:1",))
    own = node("own", owners={0: "ml/online", 1: "ml/online"})
    cached = node("cached", checkpoints=frozenset({"ckpt-7"}))
    image = node("image", images=frozenset({"img:1"}))
    packed = node("packed", held={i: f"x{i}" for i in range(6)})
    empty = node("empty")
    scores = {n.name: scheduling.score_node(pod, n) for n in (own, cached, image, packed, empty)}
    assert scores["own"] > scores["cached"] > scores["image"] > scores["packed"] >= scores["empty"]
    assert all(0 <= s <= 10 for s in scores.values())


def test_packing_keeps_whole_free_nodes() -> None:
    pod = request(1)
    partly = node("partly", held={i: f"x{i}" for i in range(7)})
    whole = node("whole")
    assert scheduling.score_node(pod, partly) > scheduling.score_node(pod, whole)


def test_lp_prefers_nodes_where_untagged_gpus_fit() -> None:
    pod = request(2)
    tagged = node("tagged", gpus=2, owners={0: "ml/a", 1: "ml/a"})
    untagged = node("untagged", gpus=2)
    assert scheduling.score_node(pod, untagged) > scheduling.score_node(pod, tagged)


def test_score_of_a_node_that_does_not_fit_is_zero() -> None:
    assert scheduling.score_node(request(9), node()) == 0


# --------------------------------------------------------------------------- examples: preempt


def test_victims_are_only_lp_pods_holding_usable_gpus() -> None:
    holders = {
        "lp-a": Holder(uid="lp-a", key="ml/lp-a", indices=(0,), low=True),
        "lp-b": Holder(uid="lp-b", key="ml/lp-b", indices=(1,), low=True),
        "hp-c": Holder(uid="hp-c", key="ml/hp-c", indices=(2,), low=False),
        "lp-d": Holder(uid="lp-d", key="ml/lp-d", indices=(3,), low=True),
    }
    n = node(
        gpus=4,
        tiers=[Tier.HA, Tier.HA, Tier.HA, Tier.LA],
        held={0: "lp-a", 1: "lp-b", 2: "hp-c", 3: "lp-d"},
        holders=holders,
    )
    pod = hp(2, tier=Tier.HA)
    v = scheduling.select_victims(pod, n, proposed=["lp-a", "lp-b", "hp-c", "lp-d", "cpu-only"])
    assert v is not None
    assert set(v.uids) == {"lp-a", "lp-b", "cpu-only"}
    assert scheduling.select_victims(hp(3, tier=Tier.HA), n, proposed=["lp-a", "lp-b", "hp-c"]) is None


def test_victims_are_minimal_and_may_be_added_below_the_preemptor_priority() -> None:
    holders = {
        "big": Holder(uid="big", key="ml/big", indices=(0, 1), low=True, priority_value=0),
        "small": Holder(uid="small", key="ml/small", indices=(2,), low=True, priority_value=0),
    }
    n = node(gpus=3, held={0: "big", 1: "big", 2: "small"}, holders=holders)
    v = scheduling.select_victims(hp(2), n, proposed=[], preemptor_priority=1000)
    assert v is not None and v.uids == ("big",)
    assert scheduling.select_victims(hp(2), n, proposed=[], preemptor_priority=0) is None


def test_no_victims_when_gpus_already_fit() -> None:
    v = scheduling.select_victims(request(1), node(), proposed=["cpu-hog"])
    assert v is not None and v.uids == ("cpu-hog",)


# --------------------------------------------------------------------------- properties

OWNERS = [None, "ml/a", "ml/b"]
MODELS = [H20, A100]
TIERS = [None, Tier.LA, Tier.MA, Tier.HA]


@st.composite
def node_views(draw: st.DrawFn, name: str = "n") -> NodeView:
    gpus = draw(st.integers(0, 8))
    devices = []
    holders: dict[str, Holder] = {}
    for i in range(gpus):
        holder = draw(st.sampled_from([None, None, "p1", "p2", "p3", "r1"]))
        devices.append(
            DeviceView(
                index=i,
                uuid=f"GPU-{name}-{i}",
                model=draw(st.sampled_from(MODELS)),
                tier=draw(st.sampled_from(TIERS)),
                healthy=draw(st.booleans()),
                owner=draw(st.sampled_from(OWNERS)),
                holder=holder,
            )
        )
        if holder is not None:
            old = holders.get(holder)
            idx = (*old.indices, i) if old else (i,)
            holders[holder] = Holder(
                uid=holder,
                key=f"ml/{holder}",
                indices=idx,
                low=holder in ("p1", "p2"),
                priority_value=0,
                reserved=holder == "r1",
            )
    pool = draw(st.sampled_from([Pool.GENERAL, Pool.GENERAL, Pool.STANDBY]))
    return NodeView(
        name=name, pool=pool, generation=1, devices=tuple(devices), holders=MappingProxyType(holders)
    )


requests = st.builds(
    request,
    st.integers(1, 9),
    priority=st.sampled_from(list(Priority)),
    owner=st.sampled_from(OWNERS),
    tier=st.sampled_from(list(Tier)),
    gpu_type=st.sampled_from([None, *MODELS]),
    reclaim=st.booleans(),
)


def assert_device_ok(req: GpuRequest, n: NodeView, index: int) -> None:
    dev = next(d for d in n.devices if d.index == index)
    assert dev.healthy, "never an unhealthy device"
    assert dev.holder is None, "never a taken device"
    assert dev.tier is not None and dev.tier >= req.required_tier, "never below the required tier"
    assert req.gpu_type is None or dev.model == req.gpu_type
    if req.priority is Priority.HIGH and dev.owner is not None:
        assert dev.owner == req.owner, "never another owner's tagged device for an HP pod"


@settings(max_examples=300, deadline=None)
@given(req=requests, n=node_views())
def test_chosen_devices_respect_every_rule(req: GpuRequest, n: NodeView) -> None:
    chosen = scheduling.choose_devices(req, n)
    verdict = scheduling.check_node(req, n)
    assert (chosen is not None) == verdict.ok
    if chosen is not None:
        assert len(chosen) == req.count == len(set(chosen))
        for i in chosen:
            assert_device_ok(req, n, i)
        assert 0 <= scheduling.score_node(req, n) <= scheduling.MAX_SCORE
    else:
        assert verdict.reason
        assert scheduling.score_node(req, n) == 0


@settings(max_examples=300, deadline=None)
@given(req=requests, nodes=st.lists(node_views(), min_size=1, max_size=5))
def test_standby_only_for_reclaim_shortfall(req: GpuRequest, nodes: list[NodeView]) -> None:
    verdicts = scheduling.filter_nodes(req, nodes)
    general_ok = any(v.ok for n, v in zip(nodes, verdicts, strict=True) if not n.standby)
    for n, v in zip(nodes, verdicts, strict=True):
        if n.standby and v.ok:
            assert req.reclaim, "standby only for reclaim pods"
            supplemented = req.priority is Priority.HIGH and req.owner is not None and req.owner in n.owners
            assert not general_ok or supplemented, (
                "standby only when the general candidates fall short, or for the owner's supplement"
            )
        if not n.standby:
            assert v == scheduling.check_node(req, n)


@settings(max_examples=300, deadline=None)
@given(req=requests, n=node_views(), proposed=st.lists(st.sampled_from(["p1", "p2", "p3", "r1", "cpu"])))
def test_victims_are_lp_and_make_the_pod_fit(req: GpuRequest, n: NodeView, proposed: list[str]) -> None:
    victims = scheduling.select_victims(req, n, proposed=proposed)
    if victims is None:
        return
    freed = set()
    for uid in victims.uids:
        holder = n.holders.get(uid)
        if holder is None:
            assert uid in proposed  # a pod without GPUs here: the scheduler's own choice
            continue
        assert holder.low and not holder.reserved, "only LP pods, never a bind in flight"
        assert any(
            scheduling.device_usable(FitKey.of(req), d, ignore_holder=True)
            for d in n.devices
            if d.index in holder.indices
        ), "only pods whose eviction frees GPUs this pod could use"
        freed.add(uid)
    after = replace(
        n,
        devices=tuple(replace(d, holder=None) if d.holder in freed else d for d in n.devices),
        memo={},
    )
    assert scheduling.choose_devices(req, after) is not None


# --------------------------------------------------------------------------- scores: no rounding erases a preference


def test_lp_prefers_untagged_gpus_even_when_few_are_free() -> None:
    """Finding 5: two otherwise equal nodes with 2 free GPUs each used to score 1 and 1."""
    pod = request(2)
    tagged = node("tagged", held={i: f"x{i}" for i in range(6)}, owners={6: "ml/a", 7: "ml/a"})
    untagged = node("untagged", held={i: f"x{i}" for i in range(6)})
    assert scheduling.score_node(pod, untagged) > scheduling.score_node(pod, tagged)


def test_banded_score_bands() -> None:
    assert [scheduling.banded_score([(r, 9)], 0.0) for r in range(9)] == list(range(1, 10))
    assert scheduling.banded_score([(8, 9)], 1.0) == 10
    assert scheduling.banded_score([], 0.0) == 1 and scheduling.banded_score([], 1.0) == 10
    assert scheduling.banded_score([(2, 3), (1, 2)], 1.0) == 10


def oracle(req: GpuRequest, n: NodeView) -> tuple[tuple[int, ...], float]:
    """The preference order of DESIGN §3 computed from the devices directly: the discrete
    levels (own tagged GPUs for an HP reclaim pod › cache › untagged for LP) and packing."""
    key = FitKey.of(req)
    usable_free = [d for d in n.devices if scheduling.device_usable(key, d)]
    levels: list[int] = []
    if req.reclaim and req.priority is Priority.HIGH and req.owner is not None:
        own = min(sum(d.owner == req.owner for d in usable_free), req.count)
        levels.append(0 if own == 0 else 2 if own == req.count else 1)
    cached = 2 if req.checkpoint in n.checkpoints else 1 if set(req.images) & n.images else 0
    levels.append(cached)
    if req.priority is Priority.LOW:
        levels.append(int(sum(d.owner is None for d in usable_free) >= req.count))
    left = sum(d.healthy and d.holder is None for d in n.devices) - req.count
    return tuple(levels), 1 - left / len(n.devices)


@st.composite
def scored_nodes(draw: st.DrawFn, name: str) -> NodeView:
    gpus = draw(st.integers(2, 8))
    devices = tuple(
        DeviceView(
            index=i,
            uuid=f"GPU-{name}-{i}",
            model=H20,
            tier=draw(st.sampled_from([Tier.MA, Tier.HA])),
            healthy=i % 3 != 0 or draw(st.booleans()),
            owner=draw(st.sampled_from(OWNERS)),
            holder=draw(st.sampled_from([None, None, "lp"])),
        )
        for i in range(gpus)
    )
    held = tuple(d.index for d in devices if d.holder)
    holders = {"lp": Holder(uid="lp", key="ml/lp", indices=held, low=True)} if held else {}
    return NodeView(
        name=name,
        pool=Pool.GENERAL,
        generation=1,
        devices=devices,
        images=draw(st.sampled_from([frozenset(), frozenset({"img:1"})])),
        checkpoints=draw(st.sampled_from([frozenset(), frozenset({"ckpt-7"})])),
        holders=MappingProxyType(holders),
    )


scored_requests = st.builds(
    request,
    st.integers(1, 3),
    priority=st.sampled_from(list(Priority)),
    owner=st.sampled_from(OWNERS),
    tier=st.sampled_from([Tier.LA, Tier.MA]),
    reclaim=st.booleans(),
    checkpoint=st.sampled_from([None, "ckpt-7"]),
    images=st.sampled_from([(), ("img:1",)]),
)


@settings(max_examples=600, deadline=None)
@given(req=scored_requests, a=scored_nodes("a"), b=scored_nodes("b"))
def test_scores_never_erase_or_invert_a_preference(req: GpuRequest, a: NodeView, b: NodeView) -> None:
    """Finding 5: on any two nodes that fit, a node better at a discrete level (own tags ›
    cache › untagged for LP) scores strictly higher; better packing alone never scores lower."""
    if not (scheduling.check_node(req, a).ok and scheduling.check_node(req, b).ok):
        return
    (la, pa), (lb, pb) = oracle(req, a), oracle(req, b)
    sa, sb = scheduling.score_node(req, a), scheduling.score_node(req, b)
    assert 1 <= sa <= scheduling.MAX_SCORE and 1 <= sb <= scheduling.MAX_SCORE
    if la != lb:
        assert (sa > sb) == (la > lb), (la, lb, sa, sb)
    elif pa > pb:
        assert sa >= sb
    elif pa == pb:
        assert sa == sb


# --------------------------------------------------------------------------- claims


def test_release_own_frees_the_pods_own_devices_only() -> None:
    n = node(gpus=4, held={0: "me", 1: "me", 2: "other", 3: "other"})
    mine = scheduling.release_own(n, "me")
    assert [d.holder for d in mine.devices] == [None, None, "other", "other"]
    assert "me" not in mine.holders and "other" in mine.holders
    assert scheduling.release_own(n, "nobody") is n
    assert scheduling.choose_devices(request(2), mine) == (0, 1)
    assert not scheduling.check_node(request(2), n).ok, "its own claim stood in its way"


def test_claim_problem_checks_every_device_against_the_inventory() -> None:
    """Finding 3: an annotation names devices; each is checked, nothing is taken on trust."""
    n = node(
        gpus=8,
        tiers=[Tier.HA, Tier.HA, Tier.HA, Tier.LA, Tier.HA, Tier.HA, Tier.HA, Tier.HA],
        owners={4: "ml/other"},
        unhealthy={2},
        held={1: "other-pod"},
    )
    pod = hp(2, owner="ml/online", tier=Tier.HA)
    assert scheduling.claim_problem(pod, n, (0, 5)) is None
    assert scheduling.claim_problem(pod, n, (0, 1)) == "GPU 1 is held by pod ml/other-pod"
    assert scheduling.claim_problem(pod, n, (0, 2)) == "GPU 2 is unhealthy"
    assert scheduling.claim_problem(pod, n, (0, 3)) == "GPU 3 is at tier LA, the pod needs HA or above"
    assert scheduling.claim_problem(pod, n, (0, 4)) == "GPU 4 is tagged for ml/other"
    assert scheduling.claim_problem(pod, n, (0, 9)) == "n1 has no GPU 9"
    assert scheduling.claim_problem(pod, n, (0,)) == "it names 1 GPU, the pod needs 2"
    typed = hp(2, owner="ml/online", gpu_type=A100)
    assert scheduling.claim_problem(typed, n, (0, 5)) == "GPU 0 is a NVIDIA H20, the pod needs a NVIDIA A100"
