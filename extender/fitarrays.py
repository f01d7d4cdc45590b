"""Algorithm 1's filter over every node at once, as array operations (numpy).

Role: the per-node memos of :mod:`extender.scheduling` answer a node in one lookup once
its signature has been seen for the request's key, but the first request of a new key
(another tier, GPU type or owner) meets every signature at once: at 1,250 nodes that is
about a thousand device-group counts in Python (3-4 ms, the filter's slowest requests).
Here the devices of a list of nodes are kept as ``nodes × width`` arrays (width: the most
devices on one node), updated row by row for the nodes that changed, and a request's
counts for every node are a few vectorised comparisons and sums whatever the memos hold.

The counts are those of :func:`extender.scheduling.count_devices` (the device-by-device
reference) and the verdict's branch is that of :func:`extender.scheduling._explain`
(paper §3.5, Algorithm 1; the reasons phrased for kube-scheduler's aggregation): nodes in
the same branch get the same verdict, so each distinct branch is explained once, through
the memoised scalar check of its first node. Standby-pool nodes follow
:func:`extender.scheduling.filter_pools` (FETCHSTANDBY).

Pure computation over immutable views: no I/O, no asyncio. Neighbours: used by
:mod:`extender.equivalence` for full filters; reads :mod:`extender.scheduling`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, cast

import numpy as np
import numpy.typing as npt

from extender import scheduling
from extender.scheduling import NodeView, RequestKeys, Verdict
from flexlease.api.pod import GpuRequest

_NO_LOW: Final = np.iinfo(np.int64).max
"""``low`` of a device that no preemptable pod holds (never below a preemptor's priority)."""

# Branches of the verdict, in _explain's order (a node takes the first that applies).
_PASS: Final = 0
_NO_GPUS: Final = 1
_TOO_FEW: Final = 2
_WRONG_TYPE: Final = 3
_NOT_USABLE: Final = 4
"""… plus 1 when some matching devices are unhealthy, 2 below the tier, 4 tagged for
another owner (the parts of the reason): 4 to 11."""
_HELD_PREEMPTABLE: Final = 12
_HELD: Final = 13
_STANDBY: Final = 14
_NO_GPUNODE: Final = 15
_BRANCHES: Final = _NO_GPUNODE + 1
_TABLES: Final = 1024
"""Requests' keys whose branch → verdict tables :class:`FitArrays` keeps (all dropped at once
past this: a table is rebuilt from the memoised per-node checks in microseconds)."""

_GENERAL, _STANDBY_POOL, _ABSENT = 0, 1, 2
"""Kinds of node (``kind`` array): general pool, standby pool, no GPUNode."""

_WORD: Final = 8
"""Bytes in a ``uint64``: rows are padded to a multiple of this many devices, so a row of
booleans (one byte each, 0 or 1) reads as whole 64-bit words (:func:`_count`, :func:`_any`)."""


def _count(mask: npt.NDArray[np.bool_]) -> npt.NDArray[np.intp]:
    """The number of True devices in each row of ``mask`` (shape ``(nodes, width)``, width a
    multiple of :data:`_WORD`): each True byte is one set bit, so the population count
    (``np.bitwise_count``, NumPy 2.0) of the row's 64-bit words is the count. At 1,250 × 8
    this takes about 1.3 µs against 25 µs for ``mask.sum(axis=1)``, which casts every byte
    and runs a reduction loop of eight per row (micro-benchmark, 2-core VM)."""
    bits: npt.NDArray[np.uint8] = np.bitwise_count(mask.view(np.uint64))
    counts: npt.NDArray[np.intp] = (
        bits[:, 0].astype(np.intp) if bits.shape[1] == 1 else bits.sum(axis=1, dtype=np.intp)
    )
    return counts


def _any(mask: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """Whether each row of ``mask`` (as for :func:`_count`) holds a True device: a row is any
    True when one of its 64-bit words is not zero (1.3 µs against 17.5 µs for
    ``mask.any(axis=1)`` at 1,250 × 8)."""
    words: npt.NDArray[np.uint64] = mask.view(np.uint64)
    found: npt.NDArray[np.bool_] = words[:, 0] != 0 if words.shape[1] == 1 else (words != 0).any(axis=1)
    return found


class FitArrays:
    """The devices of a list of nodes (``views``, None for a node without a GPUNode) as
    arrays of shape ``(nodes, width)``: model id (0: no device), tier rank (-1: none),
    owner-tag id (0: untagged), healthy, free, and the ``spec.priority`` of the
    low-priority pod holding it when kube-scheduler could evict that pod (not reserved, not
    critical; else a value above every priority). Model and owner ids are this object's own.
    """

    def __init__(self) -> None:
        self._models: dict[str, int] = {}
        self._owners: dict[str, int] = {}
        self._width = 0
        self.size = 0
        self.views: list[NodeView | None] = []
        self.model: npt.NDArray[np.int32] = np.zeros((0, 0), np.int32)
        self.rank: npt.NDArray[np.int8] = np.zeros((0, 0), np.int8)
        self.owner: npt.NDArray[np.int32] = np.zeros((0, 0), np.int32)
        self.healthy: npt.NDArray[np.bool_] = np.zeros((0, 0), np.bool_)
        self.free: npt.NDArray[np.bool_] = np.zeros((0, 0), np.bool_)
        self.low: npt.NDArray[np.int64] = np.zeros((0, 0), np.int64)
        self.kind: npt.NDArray[np.int8] = np.zeros(0, np.int8)
        self._tables: dict[RequestKeys, list[Verdict | None]] = {}
        """Per request keys, the verdict of each branch met so far (:meth:`_table`)."""

    def load(self, views: Sequence[NodeView | None]) -> None:
        """Fill the arrays from ``views`` (every row). The width is the most devices on one
        node rounded up to a multiple of :data:`_WORD` (padding: no device)."""
        most = max((len(v.devices) for v in views if v is not None), default=0)
        self._width = -(-most // _WORD) * _WORD
        self.size = len(views)
        self.views = list(views)
        rows = self._rows(range(self.size))
        (self.model, self.rank, self.owner, self.healthy, self.free, self.low), self.kind = rows

    def update(self, positions: Sequence[int]) -> None:
        """Rows ``positions`` of :attr:`views` changed (the caller replaced those views):
        write them again (all rows when a node now has more devices than the width)."""
        if not positions:
            return
        if any(
            v is not None and len(v.devices) > self._width for v in map(self.views.__getitem__, positions)
        ):
            self.load(self.views)
            return
        at = np.fromiter(positions, np.intp, len(positions))
        (model, rank, owner, healthy, free, low), kind = self._rows(positions)
        self.model[at] = model
        self.rank[at] = rank
        self.owner[at] = owner
        self.healthy[at] = healthy
        self.free[at] = free
        self.low[at] = low
        self.kind[at] = kind

    def _rows(
        self, positions: Sequence[int]
    ) -> tuple[
        tuple[
            npt.NDArray[np.int32],
            npt.NDArray[np.int8],
            npt.NDArray[np.int32],
            npt.NDArray[np.bool_],
            npt.NDArray[np.bool_],
            npt.NDArray[np.int64],
        ],
        npt.NDArray[np.int8],
    ]:
        """The rows of ``positions`` (model, rank, owner, healthy, free, low) and their kinds."""
        width, models, owners = self._width, self._models, self._owners
        model: list[list[int]] = []
        rank: list[list[int]] = []
        owner: list[list[int]] = []
        healthy: list[list[bool]] = []
        free: list[list[bool]] = []
        low: list[list[int]] = []
        kind: list[int] = []
        for i in positions:
            view = self.views[i]
            row_model, row_owner, row_low = [0] * width, [0] * width, [_NO_LOW] * width
            row_rank, row_healthy, row_free = [-1] * width, [False] * width, [False] * width
            if view is None:
                kind.append(_ABSENT)
            else:
                kind.append(_STANDBY_POOL if view.standby else _GENERAL)
                holders = view.holders
                for j, d in enumerate(view.devices):
                    row_model[j] = models.setdefault(d.model, len(models) + 1)
                    if d.owner is not None:
                        row_owner[j] = owners.setdefault(d.owner, len(owners) + 1)
                    row_rank[j] = d.rank
                    row_healthy[j] = d.healthy
                    if d.holder is None:
                        row_free[j] = True
                    else:
                        h = holders.get(d.holder)
                        if h is not None and h.low and not h.reserved and not h.critical:
                            row_low[j] = h.priority_value
            model.append(row_model)
            rank.append(row_rank)
            owner.append(row_owner)
            healthy.append(row_healthy)
            free.append(row_free)
            low.append(row_low)
        shape = (len(kind), width)
        return (
            np.array(model, np.int32).reshape(shape),
            np.array(rank, np.int8).reshape(shape),
            np.array(owner, np.int32).reshape(shape),
            np.array(healthy, np.bool_).reshape(shape),
            np.array(free, np.bool_).reshape(shape),
            np.array(low, np.int64).reshape(shape),
        ), np.array(kind, np.int8)

    def branches(self, keys: RequestKeys) -> npt.NDArray[np.int8]:
        """The verdict branch of every node (module constants ``_PASS`` … ``_NO_GPUNODE``)
        for a request with ``keys``; standby-pool nodes are ``_STANDBY``."""
        exact, need = keys.exact, keys.count
        need_rank = exact.tier.rank
        present = self.model > 0
        match = present if exact.gpu_type is None else self.model == self._models.get(exact.gpu_type, -1)
        healthy = match & self.healthy
        tiered = healthy & (self.rank >= need_rank)
        if exact.high:  # Algorithm 1 lines 8-13: untagged, or tagged for this pod's owner
            own = self._owners.get(exact.owner, -1) if exact.owner is not None else -1
            allowed = (self.owner == 0) | (self.owner == own)
            usable_at = tiered & allowed
            foreign = _any(tiered & ~allowed)
        else:  # a low-priority pod may use any tag
            usable_at = tiered
            foreign = np.zeros(self.size, np.bool_)
        total = _count(present)
        matching = _count(match)
        usable = _count(usable_at)
        free = _count(usable_at & self.free)
        branch = np.full(self.size, _HELD, np.int8)
        if keys.preemptor is not None:  # scheduling.preemptable_by: held by lower-priority pods
            evictable = _count(usable_at & (self.low < keys.preemptor))
            branch[free + evictable >= need] = _HELD_PREEMPTABLE
        short = usable < need
        unhealthy = _any(match & ~self.healthy)
        below = _any(healthy & (self.rank < need_rank))
        parts = unhealthy.astype(np.int8) + 2 * below.astype(np.int8) + 4 * foreign.astype(np.int8)
        branch[short] = _NOT_USABLE + parts[short]
        branch[matching < need] = _WRONG_TYPE
        branch[total < need] = _TOO_FEW
        branch[total == 0] = _NO_GPUS
        branch[free >= need] = _PASS
        branch[self.kind == _STANDBY_POOL] = _STANDBY
        branch[self.kind == _ABSENT] = _NO_GPUNODE
        return branch

    def filter_pools(self, req: GpuRequest, keys: RequestKeys) -> tuple[list[Verdict], list[int]]:
        """:func:`extender.scheduling.filter_pools` of ``req`` (whose keys are ``keys``) over
        :attr:`views`: the verdicts, and the positions of the standby-pool nodes."""
        branch = self.branches(keys)
        present = np.bincount(branch, minlength=_BRANCHES)
        table = self._table(keys, branch, np.flatnonzero(present).tolist())
        verdicts = list(map(table.__getitem__, branch.tolist()))
        standby_at: list[int] = np.flatnonzero(branch == _STANDBY).tolist()
        if req.reclaim and standby_at:
            general_ok = bool(present[_PASS])
            views = self.views
            for i in standby_at:
                view = views[i]
                assert view is not None
                verdicts[i] = scheduling.standby_verdict(keys, view, general_ok=general_ok)
        return verdicts, standby_at

    def _table(self, keys: RequestKeys, branch: npt.NDArray[np.int8], found: list[int]) -> list[Verdict]:
        """Branch → verdict for ``keys``, with an entry for each branch in ``found``. A
        verdict is a function of the request's keys and the branch alone (its reason names
        the request and the kind of shortfall, not the node's counts: :func:`scheduling._explain`),
        so the table is kept per ``keys`` (up to :data:`_TABLES` of them) and a branch is
        explained once, by the memoised check of the first node in it."""
        table = self._tables.get(keys)
        if table is None:
            if len(self._tables) >= _TABLES:
                self._tables.clear()
            table = self._tables[keys] = [None] * _BRANCHES
            table[_STANDBY] = scheduling.STANDBY_NOT_RECLAIM
            table[_NO_GPUNODE] = scheduling.NO_GPUNODE
        for b in found:
            if table[b] is None:
                view = self.views[int(np.argmax(branch == b))]
                assert view is not None  # branches below _STANDBY are general-pool nodes'
                table[b] = scheduling.check_keyed(keys, view)
        return cast(list[Verdict], table)
