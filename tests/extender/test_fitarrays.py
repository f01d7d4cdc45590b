"""Algorithm 1 as array operations (extender.fitarrays) answers as the per-node filter does."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from extender import fitarrays, scheduling
from extender.fitarrays import FitArrays
from extender.scheduling import Cause, Holder, NodeView, RequestKeys
from flexlease.api.pod import GpuRequest
from tests.extender.test_scheduling import node, request
from tests.extender.test_scheduling_memo import _build, _shape, alike_nodes, reference_verdict, requests


@st.composite
def node_lists(draw: st.DrawFn) -> list[NodeView | None]:
    """Nodes alike in few shapes, some without a GPUNode (None)."""
    nodes: list[NodeView | None] = list(draw(alike_nodes()))
    for _ in range(draw(st.integers(0, 2))):
        nodes.insert(draw(st.integers(0, len(nodes))), None)
    return nodes


@st.composite
def wide_node_lists(draw: st.DrawFn) -> list[NodeView | None]:
    """Nodes of 9 to 24 devices and fewer (rows of two or three 64-bit words), some without
    a GPUNode."""
    shapes = draw(st.lists(_shape(), min_size=1, max_size=3))
    nodes: list[NodeView | None] = []
    for i in range(draw(st.integers(1, 8))):
        pool, devices = shapes[draw(st.integers(0, len(shapes) - 1))]
        nodes.append(_build(f"w{i}", (pool, devices * draw(st.integers(1, 3)))))
    if draw(st.booleans()):
        nodes.insert(draw(st.integers(0, len(nodes))), None)
    return nodes


CAUSES = {
    fitarrays._PASS: Cause.FITS,
    fitarrays._NO_GPUS: Cause.NO_GPUS,
    fitarrays._TOO_FEW: Cause.TOO_FEW_GPUS,
    fitarrays._WRONG_TYPE: Cause.WRONG_TYPE,
    **{fitarrays._NOT_USABLE + parts: Cause.NOT_USABLE for parts in range(8)},
    fitarrays._HELD_PREEMPTABLE: Cause.HELD_PREEMPTABLE,
    fitarrays._HELD: Cause.HELD,
}
"""The cause of each branch of a general-pool node's verdict."""


def _triples(verdicts: list[scheduling.Verdict]) -> list[tuple[scheduling.Code, scheduling.Cause, str]]:
    return [(v.code, v.cause, v.reason) for v in verdicts]


@settings(max_examples=400, deadline=None)
@given(reqs=st.lists(requests, min_size=1, max_size=4), nodes=node_lists() | wide_node_lists())
def test_array_filter_equals_the_per_node_filter(
    reqs: list[GpuRequest], nodes: list[NodeView | None]
) -> None:
    arrays = FitArrays()
    arrays.load(nodes)
    for req in reqs:
        keys = RequestKeys.of(req)
        verdicts, standby_at = arrays.filter_pools(req, keys)
        want, want_standby = scheduling.filter_pools(req, nodes)
        assert _triples(verdicts) == _triples(want)
        assert standby_at == want_standby
        # Each node's own branch, not only its branch's verdict (explained by the first node
        # in it), agrees with the device-by-device reference (no memo).
        branches = arrays.branches(keys).tolist()
        for n, v, b in zip(nodes, verdicts, branches, strict=True):
            if n is not None and not n.standby:
                code, cause, reason = reference_verdict(req, n)
                assert (v.code, v.cause, v.reason) == (code, cause, reason)
                assert CAUSES[b] is cause


@given(
    masks=st.integers(0, 4).flatmap(
        lambda words: hnp.arrays(np.bool_, st.tuples(st.integers(0, 9), st.just(8 * words)))
    )
)
def test_word_counts_equal_the_row_reductions(masks: np.ndarray) -> None:
    assert fitarrays._count(masks).tolist() == masks.sum(axis=1).tolist()
    assert fitarrays._any(masks).tolist() == masks.any(axis=1).tolist()


@settings(max_examples=150, deadline=None)
@given(
    req=requests,
    nodes=node_lists(),
    changes=st.lists(st.tuples(st.integers(0, 30), st.none() | _shape()), min_size=1, max_size=5),
)
def test_rows_updated_in_place_equal_arrays_loaded_afresh(
    req: GpuRequest, nodes: list[NodeView | None], changes: list[tuple[int, object]]
) -> None:
    arrays = FitArrays()
    arrays.load(nodes)
    changed = []
    for at, shape in changes:
        i = at % len(nodes)
        arrays.views[i] = None if shape is None else _build(f"c{i}", shape)  # type: ignore[arg-type]
        changed.append(i)
    arrays.update(changed)  # a node with more devices than any before widens every row
    fresh = FitArrays()
    fresh.load(arrays.views)
    keys = RequestKeys.of(req)
    assert _triples(arrays.filter_pools(req, keys)[0]) == _triples(fresh.filter_pools(req, keys)[0])
    assert _triples(fresh.filter_pools(req, keys)[0]) == _triples(
        scheduling.filter_pools(req, arrays.views)[0]
    )


def test_only_pods_of_lower_priority_count_as_evictable() -> None:
    """kube-scheduler preempts only pods of lower ``spec.priority``: a low-priority holder of
    the preemptor's own priority does not make the node Unschedulable (preemption may help)."""
    holders = {
        u: Holder(uid=u, key=f"ml/{u}", indices=(i,), low=True, priority_value=100)
        for i, u in enumerate("ab")
    }
    n = node(gpus=2, held={0: "a", 1: "b"}, holders=holders)
    arrays = FitArrays()
    arrays.load([n])
    for value, cause in ((100, Cause.HELD), (101, Cause.HELD_PREEMPTABLE)):
        req = request(1, priority_value=value)
        (verdict,), _ = arrays.filter_pools(req, RequestKeys.of(req))
        (branch,) = arrays.branches(RequestKeys.of(req)).tolist()
        assert verdict.cause is cause and CAUSES[branch] is cause
