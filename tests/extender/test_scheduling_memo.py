"""Algorithm 1's cross-node memo (extender.scheduling): the memoised answers equal the ones
computed device by device, whatever other nodes and requests warmed the memo first."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender import scheduling
from extender.scheduling import DeviceView, Holder, NodeView, RequestKeys
from flexlease.api.pod import GpuRequest, Priority
from flexlease.api.resources import Pool
from flexlease.api.tiers import Tier
from tests.extender.test_scheduling import A100, H20, hp, node, request

OWNERS = [None, "ml/a", "ml/b"]


@st.composite
def alike_nodes(draw: st.DrawFn) -> list[NodeView]:
    """Nodes drawn from few shapes, under different names, device uuids and holder uids, so
    that many share a signature (and some differ only in what the memo must not ignore)."""
    shapes = draw(st.lists(_shape(), min_size=1, max_size=4))
    out = []
    for i in range(draw(st.integers(1, 12))):
        shape = shapes[draw(st.integers(0, len(shapes) - 1))]
        out.append(_build(f"n{i}", shape))
    return out


Shape = tuple[Pool, tuple[tuple[str, Tier | None, bool, str | None, str | None], ...]]
"""(pool, per device: model, tier, healthy, owner tag, holder kind: None, low (urgent: spec.priority
500; critical: a critical role), high, reserved)."""


@st.composite
def _shape(draw: st.DrawFn) -> Shape:
    devices = tuple(
        (
            draw(st.sampled_from([H20, A100])),
            draw(st.sampled_from([None, Tier.LA, Tier.MA, Tier.HA])),
            draw(st.booleans()),
            draw(st.sampled_from(OWNERS)),
            draw(st.sampled_from([None, None, "low", "high", "reserved", "low-urgent", "low-critical"])),
        )
        for _ in range(draw(st.integers(0, 8)))
    )
    return draw(st.sampled_from([Pool.GENERAL, Pool.GENERAL, Pool.STANDBY])), devices


def _build(name: str, shape: Shape) -> NodeView:
    pool, spec = shape
    devices = []
    holders: dict[str, Holder] = {}
    for i, (model, tier, healthy, owner, holder) in enumerate(spec):
        uid = f"{name}-pod-{i}" if holder is not None else None
        devices.append(
            DeviceView(
                index=i,
                uuid=f"GPU-{name}-{i}",
                model=model,
                tier=tier,
                healthy=healthy,
                owner=owner,
                holder=uid,
            )
        )
        if uid is not None:
            holders[uid] = Holder(
                uid=uid,
                key=f"ml/{uid}",
                indices=(i,),
                low=holder in ("low", "low-urgent", "low-critical"),
                priority_value=500 if holder == "low-urgent" else 0,
                reserved=holder == "reserved",
                critical=holder == "low-critical",
            )
    return NodeView(
        name=name,
        pool=pool,
        generation=1,
        devices=tuple(devices),
        images=frozenset({"img:1"}) if name.endswith(("1", "3")) else frozenset(),
        checkpoints=frozenset({"ckpt-7"}) if name.endswith("2") else frozenset(),
        holders=MappingProxyType(holders),
    )


requests = st.builds(
    request,
    st.integers(1, 9),
    priority=st.sampled_from(list(Priority)),
    owner=st.sampled_from(OWNERS),
    tier=st.sampled_from(list(Tier)),
    gpu_type=st.sampled_from([None, H20, A100]),
    reclaim=st.booleans(),
    checkpoint=st.sampled_from([None, "ckpt-7"]),
    images=st.sampled_from([(), ("img:1",)]),
    priority_value=st.sampled_from([0, 100, 1000]),
    preempts=st.booleans(),
)


def reference_verdict(req: GpuRequest, n: NodeView) -> tuple[scheduling.Code, scheduling.Cause, str]:
    """The general-pool verdict from the device-by-device counts, with no memo."""
    keys = RequestKeys.of(req)
    key = keys.for_node(n)
    v = scheduling._explain(keys.count, key, scheduling.count_devices(key, n), keys.preemptor)
    return v.code, v.cause, v.reason


def reference_score(req: GpuRequest, n: NodeView) -> int:
    keys = RequestKeys.of(req)
    f = scheduling.count_devices(keys.for_node(n), n)
    ckpt = req.checkpoint is not None and req.checkpoint in n.checkpoints
    image = not ckpt and bool(req.images) and not n.images.isdisjoint(req.images)
    return scheduling._compute_score(req, keys, f, cached_ckpt=ckpt, cached_image=image)


@settings(max_examples=400, deadline=None)
@given(reqs=st.lists(requests, min_size=1, max_size=4), nodes=alike_nodes())
def test_memoised_filter_and_scores_equal_the_device_by_device_answers(
    reqs: list[GpuRequest], nodes: list[NodeView]
) -> None:
    for req in reqs:  # earlier requests warm the memo for later ones
        keys = RequestKeys.of(req)
        verdicts = scheduling.filter_nodes(req, nodes)
        for n, v in zip(nodes, verdicts, strict=True):
            for key in (keys.exact, keys.open, keys.closed):
                assert scheduling.fit(key, n) == scheduling.count_devices(key, n)
                assert scheduling.count_groups(key, n.groups) == scheduling.count_devices(key, n)  # no memo
            if not n.standby:
                assert (v.code, v.cause, v.reason) == reference_verdict(req, n)
                assert scheduling.check_node(req, n) is v
            assert scheduling.score_node(req, n) == reference_score(req, n)


@settings(max_examples=200, deadline=None)
@given(nodes=alike_nodes())
def test_equal_groups_share_a_signature_and_different_groups_do_not(nodes: list[NodeView]) -> None:
    for a in nodes:
        for b in nodes:
            assert (a.signature == b.signature) == (a.groups == b.groups)


def test_a_node_that_changes_gets_a_new_signature_and_new_answers() -> None:
    free = node("a")
    busy = node("b", held={i: f"x{i}" for i in range(8)})
    assert free.signature == node("c").signature != busy.signature
    assert scheduling.check_node(request(2), free).ok
    assert not scheduling.check_node(request(2), busy).ok


def test_hp_and_lp_pods_on_one_untagged_node_get_their_own_scores() -> None:
    """Both normalise to the same key on an untagged node, but their scores use different
    preference levels (untagged-first applies to LP pods only): the memo keeps them apart."""
    n = node()
    for req in (hp(2), request(2), hp(2, reclaim=True), request(2, reclaim=True)):
        assert scheduling.score_node(req, n) == reference_score(req, n)
    assert scheduling.score_node(hp(2), n) != scheduling.score_node(request(2), n)


def test_the_memo_tables_are_emptied_past_their_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduling, "_MEMO_BUDGET", 5)
    nodes = [node(f"n{i}", held={j: f"x{j}" for j in range(i % 8)}) for i in range(8)]
    for count in (1, 2, 3):
        scheduling.filter_nodes(request(count), nodes)  # each request: at most one budget over
        assert scheduling._MEMO_ENTRIES[0] <= 5 + 3 * len(nodes)
    assert [v.ok for v in scheduling.filter_nodes(request(2), nodes)] == [
        scheduling.check_node(request(2), n).ok for n in nodes
    ]
    assert sum(len(t) for family in scheduling._MEMO_FAMILIES for t in family.values()) <= 5 + 3 * len(nodes)
