"""The per-class filter cache (extender.equivalence) answers exactly as a full filter does."""

from __future__ import annotations

import functools
import json
import random
from typing import Any
from unittest import mock

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from extender import equivalence, scheduling
from extender.equivalence import BLOCK, FilterCache, PriorityCache
from extender.scheduling import Code
from extender.state import Inventory
from flexlease.api.pod import GpuRequest, parse_pod
from flexlease.store.base import EventType, WatchEvent
from tests.extender import payloads

NAMES = [f"n{i}" for i in range(12)]


def cluster(rng: random.Random) -> Inventory:
    inv = Inventory()
    nodes = []
    for i, name in enumerate(NAMES[:-1]):  # the last candidate has no GPUNode
        nodes.append(
            payloads.gpunode(
                name,
                gpus=4,
                tiers=[rng.choice(["HA", "MA", "LA"]) for _ in range(4)],
                owners=_owners(i),
                pool="standby" if i >= 9 else "general",
                model=payloads.A100 if i == 5 else payloads.H20,
                checkpoints=_checkpoints(i),
            )
        )
    inv.replace_nodes(nodes)
    inv.replace_pods([])
    return inv


def _owners(i: int) -> dict[int, str]:
    """Tags of node ``i``: one job's, two jobs' or none."""
    if i % 3 == 0:
        return {0: "ml/online"}
    if i % 4 == 1:
        return {0: "ml/other", 1: "ml/third", 2: "ml/online"}
    return {}


def _checkpoints(i: int, rng: random.Random | None = None) -> list[str]:
    """Checkpoints cached on node ``i``: a fixed pattern, or drawn by ``rng``."""
    if rng is not None:
        return rng.sample(["ck-a", "ck-b", "ck-c"], rng.randrange(3))
    return [c for c, m in (("ck-a", 2), ("ck-b", 3)) if i % m == 0]


def random_change(inv: Inventory, rng: random.Random, step: int) -> None:
    name = rng.choice(NAMES[:-1])
    kind = rng.random()
    if kind < 0.6:
        idx = rng.sample(range(4), rng.choice((1, 2)))
        view = inv.snapshot().get(name)
        assert view is not None
        if any(view.devices[i].holder is not None for i in idx):
            return
        pod = payloads.pod(
            f"p{step}",
            uid=f"u{step}",
            node_name=name,
            phase="Running",
            priority=rng.choice(["low", "high"]),
            annotations=payloads.assigned(name, *sorted(idx)),
        )
        inv.apply_pod_event(WatchEvent(EventType.ADDED, pod))
    elif kind < 0.8:
        holders = [u for v in inv.snapshot().nodes.values() for u in v.holders]
        if holders:
            uid = rng.choice(holders)
            inv.apply_pod_event(WatchEvent(EventType.DELETED, {"metadata": {"uid": uid}}))
    else:
        unhealthy = {rng.randrange(4)} if rng.random() < 0.5 else set()
        i = NAMES.index(name)
        inv.apply_node_event(
            WatchEvent(
                EventType.MODIFIED,
                payloads.gpunode(
                    name,
                    gpus=4,
                    unhealthy=unhealthy,
                    owners=_owners(i),
                    pool="standby" if i >= 9 else "general",
                    model=payloads.A100 if i == 5 else payloads.H20,
                    checkpoints=_checkpoints(i, rng),
                ),
            )
        )


PODS = [
    payloads.pod("a", gpus=1),
    payloads.pod("b", gpus=3, tier="HA"),
    payloads.pod("c", gpus=2, priority="high", owner="online", reclaim=True, gpu_type=payloads.H20),
    payloads.pod("d", gpus=4, priority="high", owner="other"),
    payloads.pod("e", gpus=2, gpu_type=payloads.A100),
    # the same requests for other owners: classes derived from their family's
    payloads.pod("f", gpus=2, priority="high", owner="other", reclaim=True, gpu_type=payloads.H20),
    payloads.pod("g", gpus=2, priority="high", owner="third", reclaim=True, gpu_type=payloads.H20),
    payloads.pod("h", gpus=4, priority="high", owner="online"),
    payloads.pod("i", gpus=4, priority="high", owner="third"),
    payloads.pod("j", gpus=1, priority="high", owner="nobody"),
    payloads.pod("k", gpus=1, priority="high", owner="online"),
]
CKPT = payloads.H20
SCORED = [
    *PODS,
    # the same requests with checkpoints: classes derived from their family's in prioritize
    payloads.pod(
        "l", gpus=2, priority="high", owner="online", reclaim=True, gpu_type=CKPT, checkpoint="ck-a"
    ),
    payloads.pod("m", gpus=2, priority="high", owner="other", reclaim=True, gpu_type=CKPT, checkpoint="ck-b"),
    payloads.pod("n", gpus=1, checkpoint="ck-a"),
    payloads.pod("o", gpus=1, checkpoint="ck-c"),
    payloads.pod("p", gpus=4, priority="high", owner="third", checkpoint="ck-b"),
]


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    steps=st.integers(1, 60),
    # the shipped threshold, and low ones, so that twelve nodes are also re-checked over the arrays
    recheck_share=st.sampled_from([equivalence.ARRAY_RECHECK_SHARE, 0.0, 0.1, 0.25]),
)
def test_cached_filter_equals_full_filter(seed: int, steps: int, recheck_share: float) -> None:
    with mock.patch.object(equivalence, "ARRAY_RECHECK_SHARE", recheck_share):
        _cached_filter_equals_full_filter(seed, steps)


def _cached_filter_equals_full_filter(seed: int, steps: int) -> None:
    rng = random.Random(seed)
    inv = cluster(rng)
    cache = FilterCache(max_classes=3)
    reqs = [parse_pod(p) for p in PODS]
    for step in range(steps):
        random_change(inv, rng, step)
        req = rng.choice(reqs)
        snap = inv.snapshot()
        # every node (a fresh list each time, as requests arrive), or kube-scheduler's list: a
        # subset in a new order, sometimes with a name never seen
        names = list(NAMES)
        if rng.random() < 0.5:
            names = rng.sample(NAMES, rng.randrange(len(NAMES) + 1))
            if rng.random() < 0.1:
                names.append(f"new-{step}")
        got = cache.filter(
            req, snap.nodes, names, version=snap.version, changed_since=inv.changed_since, tagged=snap.tagged
        )
        want = scheduling.filter_nodes(req, [snap.nodes.get(n) for n in names])
        assert sorted(got.passed) == sorted(n for n, v in zip(names, want, strict=True) if v.ok)
        assert got.failed == {
            n: v.reason for n, v in zip(names, want, strict=True) if v.code is scheduling.Code.UNSCHEDULABLE
        }
        assert got.unresolvable == {
            n: v.reason for n, v in zip(names, want, strict=True) if v.code is scheduling.Code.UNRESOLVABLE
        }
        assert sum(got.counts.values()) == len(names)
        reply = json.loads(got.encode())
        text, passed = got.node_names_json()  # announced to the decoder for prioritize
        assert text == orjson.dumps(reply["NodeNames"]) and passed == reply["NodeNames"]
        assert sorted(reply.pop("NodeNames")) == sorted(got.passed)
        assert reply == {
            "Nodes": None,
            "FailedNodes": got.failed,
            "FailedAndUnresolvableNodes": got.unresolvable,
            "Error": "",
        }
    assert cache.full + cache.refiltered + cache.incremental + cache.derived == steps


def test_reuses_results_for_any_subset_and_order_of_the_nodes_seen() -> None:
    inv = cluster(random.Random(1))
    cache = FilterCache()
    req = parse_pod(PODS[0])
    snap = inv.snapshot()
    first = cache.filter(req, snap.nodes, NAMES, version=snap.version, changed_since=inv.changed_since)
    again = cache.filter(req, snap.nodes, NAMES, version=snap.version, changed_since=inv.changed_since)
    assert again is first and cache.incremental == 1 and cache.full == 1
    # kube-scheduler's lists: the nodes its own filters pass, in a new order every cycle
    shuffled = random.Random(5).sample(NAMES, 7)
    part = cache.filter(req, snap.nodes, shuffled, version=snap.version, changed_since=inv.changed_since)
    assert (cache.full, cache.incremental) == (1, 2)
    assert part.names == shuffled and part.verdicts == [first.verdicts[NAMES.index(n)] for n in shuffled]
    assert json.loads(part.encode())["NodeNames"] == [n for n in shuffled if n in first.passed]
    # a name never seen grows the universe: every class is filtered again, once
    grown = [*shuffled, "new-node"]
    cache.filter(req, snap.nodes, grown, version=snap.version, changed_since=inv.changed_since)
    cache.filter(req, snap.nodes, NAMES, version=snap.version, changed_since=inv.changed_since)
    assert (cache.full, cache.refiltered, cache.incremental) == (1, 1, 3)


def _hold(inv: Inventory, name: str, uid: str, *indices: int) -> dict[str, Any]:
    """A running pod takes GPUs ``indices`` (default GPU 0) of node ``name``: the node's view
    changes. Returns the pod."""
    indices = indices or (0,)
    pod = payloads.pod(
        uid,
        uid=uid,
        gpus=len(indices),
        node_name=name,
        phase="Running",
        annotations=payloads.assigned(name, *indices),
    )
    inv.apply_pod_event(WatchEvent(EventType.ADDED, pod))
    return pod


def _filter_every_node(cache: FilterCache, inv: Inventory, req: GpuRequest) -> list[scheduling.Verdict]:
    """``cache``'s verdicts for ``req`` over every node at ``inv``'s snapshot, checked
    against the reference filter."""
    snap = inv.snapshot()
    got = cache.filter(req, snap.nodes, NAMES, version=snap.version, changed_since=inv.changed_since)
    assert got.verdicts == scheduling.filter_nodes(req, [snap.nodes.get(n) for n in NAMES])
    return got.verdicts


def test_an_idle_class_rechecks_its_nodes_over_the_arrays_past_the_threshold() -> None:
    """A class with more changed nodes to re-check than ARRAY_RECHECK_SHARE of the universe plus the rows the
    arrays lag behind re-checks them together over the arrays, in its own entry; with the
    arrays lagging as far, one by one. Either way it answers as a full filter does."""
    inv = cluster(random.Random(1))
    cache = FilterCache()
    idle, other = parse_pod(PODS[0]), parse_pod(PODS[1])

    run = functools.partial(_filter_every_node, cache, inv)

    with mock.patch.object(equivalence, "ARRAY_RECHECK_SHARE", 0.2):  # 2.4 of 12 nodes
        kept = run(idle)  # a new class: full, the arrays made now
        for i in range(4):
            _hold(inv, NAMES[i], f"a{i}")
        run(other)  # a new class: full, the arrays brought up to date (lag 0)
        assert run(idle) is kept  # 4 changed nodes > 2.4 + 0: over the arrays, in place
        assert (cache.full, cache.incremental, cache.over_arrays) == (2, 1, 1)
        for i in range(4, 8):
            _hold(inv, NAMES[i], f"b{i}")
        run(idle)  # 4 changed nodes, not above 2.4 + the arrays' lag of 4: one by one
        assert (cache.full, cache.incremental, cache.over_arrays) == (2, 2, 1)
        _hold(inv, NAMES[8], "c8")
        run(idle)  # one changed node: one by one
        assert (cache.full, cache.incremental, cache.over_arrays, cache.refiltered) == (2, 3, 1, 0)


def test_nodes_trading_pools_are_rechecked_over_the_arrays_in_place() -> None:
    """A general node moving to the standby pool while a standby node moves back (as many
    standby nodes as before): the pass over the arrays changes the verdicts and the entry's
    pools in place, so a later change is re-checked one by one, not filtered afresh."""
    inv = cluster(random.Random(1))
    cache = FilterCache()
    req, other = parse_pod(PODS[0]), parse_pod(PODS[1])

    run = functools.partial(_filter_every_node, cache, inv)

    def pool(i: int, name: str) -> None:
        obj = payloads.gpunode(NAMES[i], gpus=4, owners=_owners(i), pool=name, checkpoints=_checkpoints(i))
        inv.apply_node_event(WatchEvent(EventType.MODIFIED, obj))

    with mock.patch.object(equivalence, "ARRAY_RECHECK_SHARE", 0.0):
        run(req)
        pool(2, "standby")
        pool(9, "general")
        run(other)  # a new class: full, the arrays brought up to date
        run(req)  # 2 changed nodes > 0 + a lag of 0: over the arrays
        assert (cache.full, cache.over_arrays, cache.refiltered) == (2, 1, 0)
        _hold(inv, NAMES[9], "now-general")
        run(req)  # 1 changed node, not above 0 + a lag of 1: one by one, n9 now general
        assert (cache.full, cache.over_arrays, cache.refiltered, cache.incremental) == (2, 1, 0, 2)


def test_a_reclaim_class_rechecked_over_the_arrays_still_sees_a_general_node_free_up() -> None:
    """A reclaim class whose standby nodes pass because no general node fits, re-checked
    over the arrays, then one general node frees up: the standby verdicts change with it
    (the pass over the arrays counted the class's general passes, not the standby ones)."""
    inv = cluster(random.Random(1))
    cache = FilterCache()
    req, other = parse_pod(PODS[2]), parse_pod(PODS[0])
    assert req.reclaim

    run = functools.partial(_filter_every_node, cache, inv)

    with mock.patch.object(equivalence, "ARRAY_RECHECK_SHARE", 0.0):
        held = [_hold(inv, NAMES[i], f"three-{i}", 0, 1, 2) for i in range(9)]  # every general node: 1 free
        before = run(req)
        assert not any(v.ok for v in before[:9]) and before[10].ok  # n9 is tagged: checked either way
        for i in range(4):
            _hold(inv, NAMES[i], f"fourth-{i}", 3)
        run(other)  # the arrays brought up to date
        run(req)  # 4 changed nodes > 0 + 0: over the arrays
        assert cache.over_arrays == 1
        inv.apply_pod_event(WatchEvent(EventType.DELETED, held[6]))  # n6: 4 free
        after = run(req)  # one by one: a general node fits now, the standby ones are not needed
        assert after[6].ok and not after[10].ok


def test_a_reclaim_pod_gets_the_standby_pool_when_no_general_candidate_fits() -> None:
    """FETCHSTANDBY looks at the general nodes among this request's candidates, not at every
    node the cache knows: with the fitting general nodes left out of the list, the standby
    node is checked (and passes) although it was "not needed" for the whole list."""
    inv = cluster(random.Random(1))
    cache = FilterCache()
    req = parse_pod(PODS[2])  # a reclaim pod
    assert req.reclaim
    snap = inv.snapshot()
    whole = cache.filter(req, snap.nodes, NAMES, version=snap.version, changed_since=inv.changed_since)
    assert whole.passed and whole.verdicts[NAMES.index("n10")] is scheduling.STANDBY_NOT_NEEDED
    only = ["n11", "n10"]  # no GPUNode, and a standby node
    part = cache.filter(req, snap.nodes, only, version=snap.version, changed_since=inv.changed_since)
    assert part.verdicts == scheduling.filter_nodes(req, [snap.nodes.get(n) for n in only])
    assert part.passed == ["n10"] and cache.full == 1


def test_the_universe_starts_again_when_departed_nodes_fill_it() -> None:
    inv = cluster(random.Random(1))
    cache = FilterCache()
    req = parse_pod(PODS[0])
    snap = inv.snapshot()
    gone = [f"gone-{i}" for i in range(2 * len(snap.nodes) + 1100)]
    cache.filter(req, snap.nodes, gone, version=snap.version, changed_since=inv.changed_since)
    result = cache.filter(
        req, snap.nodes, [*NAMES, "new-node"], version=snap.version, changed_since=inv.changed_since
    )
    assert cache._names == [*NAMES, "new-node"]  # the departed names were dropped
    assert result.names == cache._names and (cache.full, cache.refiltered) == (1, 1)


def test_reply_encoded_by_blocks_reencodes_only_changed_blocks() -> None:
    inv = cluster(random.Random(3))
    cache = FilterCache()
    req = parse_pod(PODS[0])
    names = [f"absent-{i}" for i in range(3 * BLOCK + 5)] + list(NAMES)  # most without a GPUNode
    snap = inv.snapshot()
    first = cache.filter(req, snap.nodes, names, version=snap.version, changed_since=inv.changed_since)
    body = first.encode()
    reply = json.loads(body)
    assert len(reply["FailedAndUnresolvableNodes"]) + len(reply["FailedNodes"]) + len(
        reply["NodeNames"]
    ) == len(names)
    assert first.blocks is not None  # the list is the universe: the entry's own result
    kept = list(first.blocks.parts)
    assert all(p is not None for p in kept)
    rng = random.Random(4)
    step = 0
    while inv.snapshot().version == snap.version:
        random_change(inv, rng, step)
        step += 1
    snap = inv.snapshot()
    again = cache.filter(req, snap.nodes, names, version=snap.version, changed_since=inv.changed_since)
    want = scheduling.filter_nodes(req, [snap.nodes.get(n) for n in names])
    reply = json.loads(again.encode())
    assert reply["NodeNames"] == [n for n, v in zip(names, want, strict=True) if v.ok]  # candidate order
    assert reply["FailedNodes"] == {
        n: v.reason for n, v in zip(names, want, strict=True) if v.code is Code.UNSCHEDULABLE
    }
    # the blocks of nodes without a GPUNode were not encoded again
    assert again.blocks is not None
    assert again.blocks.parts[:3] == kept[:3]


def test_a_name_given_twice_is_answered_once() -> None:
    inv = cluster(random.Random(2))
    cache = FilterCache()
    snap = inv.snapshot()
    req = parse_pod(PODS[0])
    names = [*NAMES, NAMES[0], NAMES[3]]
    result = cache.filter(req, snap.nodes, names, version=snap.version, changed_since=inv.changed_since)
    reply = json.loads(result.encode())
    members = [*reply["NodeNames"], *reply["FailedNodes"], *reply["FailedAndUnresolvableNodes"]]
    assert sorted(members) == sorted(NAMES)
    assert sum(result.counts.values()) == len(NAMES)
    # the same list again is an incremental filter of the same entry
    again = cache.filter(req, snap.nodes, list(names), version=snap.version, changed_since=inv.changed_since)
    assert again is result and cache.incremental == 1


def test_a_candidate_list_changed_in_place_by_the_caller_is_seen() -> None:
    inv = cluster(random.Random(2))
    cache = FilterCache()
    snap = inv.snapshot()
    req = parse_pod(PODS[0])
    names = NAMES[:6]
    cache.filter(req, snap.nodes, names, version=snap.version, changed_since=inv.changed_since)
    names[:] = NAMES[6:]
    result = cache.filter(req, snap.nodes, names, version=snap.version, changed_since=inv.changed_since)
    reply = json.loads(result.encode())
    members = [*reply["NodeNames"], *reply["FailedNodes"], *reply["FailedAndUnresolvableNodes"]]
    assert sorted(members) == sorted(NAMES[6:])


def test_node_names_needing_escapes_are_encoded_correctly() -> None:
    inv = cluster(random.Random(2))
    cache = FilterCache()
    snap = inv.snapshot()
    names = ['we"ird\\node', "ünïcode"]
    result = cache.filter(
        parse_pod(PODS[0]), snap.nodes, names, version=snap.version, changed_since=inv.changed_since
    )
    assert set(json.loads(result.encode())["FailedAndUnresolvableNodes"]) == set(names)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 60))
def test_cached_scores_equal_fresh_scores(seed: int, steps: int) -> None:
    rng = random.Random(seed)
    inv = cluster(rng)
    cache = PriorityCache(max_classes=3)
    reqs = [parse_pod(p) for p in SCORED]
    for step in range(steps):
        random_change(inv, rng, step)
        req = rng.choice(reqs)
        snap = inv.snapshot()
        where = {
            c: {n for n, v in snap.nodes.items() if c in v.checkpoints} for c in ("ck-a", "ck-b", "ck-c")
        }
        assert snap.cached == {c: nodes for c, nodes in where.items() if nodes}
        names = rng.sample(NAMES, rng.randrange(len(NAMES) + 1)) if rng.random() < 0.3 else NAMES
        body = cache.prioritize(
            req,
            snap.nodes,
            names,
            version=snap.version,
            changed_since=inv.changed_since,
            tagged=snap.tagged,
            cached=snap.cached,
        )
        want = scheduling.score_nodes(req, [snap.nodes.get(n) for n in names])
        assert json.loads(body) == [{"Host": n, "Score": s} for n, s in zip(names, want, strict=True)]


def test_a_new_owner_or_checkpoint_is_scored_only_where_it_matters() -> None:
    """A class that differs from its family's latest one in owner and checkpoint starts from
    its scores: only the nodes tagged for either owner or caching either checkpoint are
    scored again."""
    inv = cluster(random.Random(5))
    cache = PriorityCache()
    snap = inv.snapshot()
    first, second = (
        parse_pod(
            payloads.pod(n, gpus=2, priority="high", owner=o, reclaim=True, gpu_type=CKPT, checkpoint=c)
        )
        for n, o, c in (("x", "online", "ck-a"), ("y", "other", "ck-b"))
    )

    def score(req: GpuRequest) -> list[dict[str, Any]]:
        body = cache.prioritize(
            req,
            snap.nodes,
            NAMES,
            version=snap.version,
            changed_since=inv.changed_since,
            tagged=snap.tagged,
            cached=snap.cached,
        )
        reply: list[dict[str, Any]] = json.loads(body)
        return reply

    score(first)
    assert cache.computed == len(NAMES) and cache.derived == 0
    got = score(second)
    assert cache.derived == 1
    again = snap.tagged["ml/online"] | snap.tagged["ml/other"] | snap.cached["ck-a"] | snap.cached["ck-b"]
    assert cache.computed == len(NAMES) + len(again) < 2 * len(NAMES)
    want = scheduling.score_nodes(second, [snap.nodes.get(n) for n in NAMES])
    assert got == [{"Host": n, "Score": s} for n, s in zip(NAMES, want, strict=True)]


def test_a_new_owner_of_a_known_family_is_derived_not_filtered_in_full() -> None:
    """Two online jobs asking alike differ only on tagged nodes: the second class starts
    from the first one's verdicts and re-checks only the tagged nodes."""
    inv = cluster(random.Random(3))
    cache = FilterCache()
    snap = inv.snapshot()
    assert snap.tagged == {
        owner: {n for n, v in snap.nodes.items() if owner in v.owners}
        for owner in ("ml/online", "ml/other", "ml/third")
    }
    first, second, lp = (
        parse_pod(payloads.pod("x", gpus=1, priority="high", owner="online")),
        parse_pod(payloads.pod("y", gpus=1, priority="high", owner="third")),
        parse_pod(payloads.pod("z", gpus=1)),
    )
    for req in (first, second, lp):
        got = cache.filter(
            req, snap.nodes, NAMES, version=snap.version, changed_since=inv.changed_since, tagged=snap.tagged
        )
        want = scheduling.filter_nodes(req, [snap.nodes.get(n) for n in NAMES])
        assert sorted(got.passed) == sorted(n for n, v in zip(NAMES, want, strict=True) if v.ok)
    assert (cache.full, cache.derived, cache.incremental) == (2, 1, 0)  # an LP pod has no family
    # without the tagged set there is nothing to derive from
    plain = FilterCache()
    for req in (first, second):
        plain.filter(req, snap.nodes, NAMES, version=snap.version, changed_since=inv.changed_since)
    assert (plain.full, plain.derived) == (2, 0)
