"""Filter results per equivalence class of pods, kept up to date between snapshots.

Role: a filter over 1,250 candidate nodes costs O(nodes) even when every node answer is
memoised. Pods of one job ask the same thing (same GPU count, priority, owner, tier, type,
reclaim flag): they form an equivalence class (as in kube-scheduler's former equivalence
cache), and between two of them usually only the few nodes touched by binds change. This
cache keeps, per class, the verdict of every candidate node and the reply built from them,
and on the next request of that class re-checks only the nodes the inventory reports as
changed since (:meth:`extender.state.Inventory.changed_since`). A change log that no longer
reaches back, or a flip of "some general node fits" for a reclaim pod (which changes every
standby verdict) falls back to a full filter. A class with many changed nodes to re-check
(one idle for a few hundred cycles) re-checks every node over the arrays instead, in place
(:data:`ARRAY_RECHECK_SHARE`).

kube-scheduler does not send one candidate list: it sends the nodes its own filters pass
(those with enough free ``nvidia.com/gpu`` for this pod, so the list shrinks as pods bind and
differs between GPU counts) in the order its parallel filter finds them, a new order in every
cycle. So the verdicts are kept for every node seen (the snapshot's nodes and any candidate
without a GPUNode, the *universe*), and a request's candidates — any subset, in any order —
are answered from them in O(candidates); a list equal to the universe reuses the reply
encoded block by block.

Pure bookkeeping over immutable snapshots: no I/O, no asyncio. Neighbours: used by
:mod:`extender.server`; decisions come from :mod:`extender.scheduling`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import chain, compress
from operator import is_not, not_
from typing import Final, NamedTuple, cast

import orjson

from extender import scheduling
from extender.fitarrays import FitArrays
from extender.scheduling import Code, FitKey, NodeView, RequestKeys, Verdict
from flexlease.api.pod import GpuRequest

DEFAULT_MAX_CLASSES: Final = 128
ARRAY_RECHECK_SHARE: Final = 0.05
"""A class with more changed nodes to re-check than this share (ratio 0–1) of the universe
plus the rows the arrays lag behind (nodes changed since :class:`extender.fitarrays.FitArrays`
were last brought up to date) re-checks every node over the arrays instead, and changes its
verdicts in place where they differ (:meth:`FilterCache._update_over`). One by one, each
changed node costs Python work (a check, ≈ 4 µs in a hot micro-benchmark, 3–5 times that in
the server, whose caches are cold); over the arrays, each row they lag behind costs about as
much, plus one pass that grows with the universe (≈ 0.1 ms hot at 1,250 nodes, about 25
node checks). Past this (62 nodes at 1,250, 250 at 5,000) the pass is no dearer, and its
cost stops growing with the class's idle time (docs/results/benchmarks.md, round 8: a fixed 64 made the
pass too frequent at 5,000 nodes)."""
_UNIVERSE_SLACK: Final = 1024
"""Names the universe may hold beyond twice the snapshot's nodes (nodes that left the
cluster, candidates without a GPUNode) before it starts again (:meth:`FilterCache._positions`)."""


@dataclass(slots=True)
class FilterResult:
    """The filter answer for one class over one candidate list, at snapshot ``version``.

    ``names`` are the candidates (each once, in the order given) and ``verdicts`` their
    verdicts, aligned; ``counts`` counts nodes per (interned) verdict. ``passed``,
    ``failed`` and ``unresolvable`` are derived from them. The reply is encoded block by
    block (:class:`_Blocks`) and kept in ``encoded`` until a verdict changes. Shared
    between requests: read it synchronously after :meth:`FilterCache.filter`, before the
    next call.
    """

    version: int
    names: list[str]
    verdicts: list[Verdict]
    counts: dict[Verdict, int]
    blocks: _Blocks | None
    """None for a result made for one request's candidates (:meth:`FilterCache._restrict`):
    encoded whole, once."""
    encoded: bytes | None = None
    node_names: tuple[bytes, list[str]] | None = None
    """:meth:`node_names_json` of a result encoded whole."""

    def members(self) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """(``NodeNames``, ``FailedNodes``, ``FailedAndUnresolvableNodes``): the candidates
        that pass, in candidate order, and node → reason of those that do not fit now and of
        those preemption cannot help. New containers, the caller's to change."""
        return _partition(self.names, self.verdicts)

    @property
    def passed(self) -> list[str]:
        """The candidates that pass, in candidate order."""
        return self.members()[0]

    @property
    def failed(self) -> dict[str, str]:
        """Node → reason of the candidates that do not fit now (``FailedNodes``)."""
        return self.members()[1]

    @property
    def unresolvable(self) -> dict[str, str]:
        """Node → reason of the candidates preemption cannot help (``FailedAndUnresolvableNodes``)."""
        return self.members()[2]

    def encode(self) -> bytes:
        """The ``ExtenderFilterResult`` JSON (nodeCacheCapable form; ``NodeNames`` in
        candidate order), cached until a verdict changes."""
        if self.encoded is None:
            if self.blocks is None:
                self.encoded, self.node_names = _encode_whole(self.names, self.verdicts)
            else:
                self.encoded = self.blocks.encode(self.names, self.verdicts)
        return self.encoded

    def node_names_json(self) -> tuple[bytes, list[str]]:
        """The reply's ``NodeNames`` (:meth:`encode`'s, byte for byte) as a JSON array and
        as a list of names: what kube-scheduler sends ``/prioritize`` next when no other
        filter or extender removes a node (:meth:`extender.body.ExtenderArgsDecoder.announce`)."""
        self.encode()
        if self.blocks is None:
            assert self.node_names is not None
            return self.node_names
        return self.blocks.passed()

    def changed(self, i: int, new: Verdict) -> None:
        """Candidate ``i``'s verdict is now ``new``."""
        old = self.verdicts[i]
        n = self.counts[old] - 1
        if n:
            self.counts[old] = n
        else:
            del self.counts[old]
        self.counts[new] = self.counts.get(new, 0) + 1
        self.verdicts[i] = new
        assert self.blocks is not None  # an entry's result
        self.blocks.parts[i // BLOCK] = None
        self.encoded = None

    def copy(self) -> FilterResult:
        """A copy whose changes leave this result as it is (the candidate list is shared)."""
        assert self.blocks is not None  # an entry's result
        return FilterResult(
            self.version, self.names, list(self.verdicts), dict(self.counts), self.blocks.copy(), self.encoded
        )


BLOCK: Final = 32
"""Candidates per block of an encoded filter reply (:class:`_Blocks`). A changed verdict
re-encodes its block (≈ 6 µs at 32, 11 µs at 64 on the 2-core VM) and every reply joins
all blocks (≈ 10 µs at 32, 8 µs at 64 for 1,250 candidates): an incremental filter usually
changes a few blocks, so 32 costs less than 64 (0.9 % fewer of the bench server's
instructions per cycle) and about what 16 does."""


class _Block(NamedTuple):
    """One block of a filter reply: its ``NodeNames``, ``FailedNodes`` and
    ``FailedAndUnresolvableNodes`` members as JSON without their brackets, and the names
    that pass (in candidate order)."""

    passed: bytes
    failed: bytes
    unresolvable: bytes
    names: tuple[str, ...]
    """A tuple, not a list: a tuple of strings leaves the collector's lists at its first pass."""


@dataclass(slots=True)
class _Blocks:
    """A filter reply's three members encoded per block of :data:`BLOCK` candidates and
    kept until a verdict in the block changes: a reply after a few changed nodes
    re-encodes a few blocks and joins the rest (encoding in proportion to the changes, one
    copy of the reply), instead of encoding every candidate again. ``parts[k]`` is block
    ``k`` (:class:`_Block`), or None when it must be encoded again. ``node_names`` is the
    ``NodeNames`` member of the last reply encoded, without its brackets. The candidates
    must be distinct (each name one member)."""

    parts: list[_Block | None]
    node_names: bytes = b""

    @classmethod
    def of(cls, size: int) -> _Blocks:
        """No block encoded yet, for ``size`` candidates."""
        return cls([None] * -(-size // BLOCK))

    def copy(self) -> _Blocks:
        return _Blocks(list(self.parts), self.node_names)

    def encode(self, names: list[str], verdicts: list[Verdict]) -> bytes:
        passed: list[bytes] = []
        failed: list[bytes] = []
        unresolvable: list[bytes] = []
        parts = self.parts
        for k, kept in enumerate(parts):
            if kept is None:
                lo = k * BLOCK
                block = parts[k] = _encode_block(names[lo : lo + BLOCK], verdicts[lo : lo + BLOCK])
            else:
                block = kept
            if block.passed:
                passed.append(block.passed)
            if block.failed:
                failed.append(block.failed)
            if block.unresolvable:
                unresolvable.append(block.unresolvable)
        self.node_names = b",".join(passed)
        return b"".join(
            (
                b'{"Nodes":null,"NodeNames":[',
                self.node_names,
                b'],"FailedNodes":{',
                b",".join(failed),
                b'},"FailedAndUnresolvableNodes":{',
                b",".join(unresolvable),
                b'},"Error":""}',
            )
        )

    def passed(self) -> tuple[bytes, list[str]]:
        """The ``NodeNames`` of the last reply encoded: its JSON text (the array, byte for
        byte as in the reply) and the names. Call after :meth:`encode`."""
        names = list(chain.from_iterable(b.names for b in self.parts if b is not None))
        return b"[" + self.node_names + b"]", names


def _partition(names: list[str], verdicts: list[Verdict]) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """The passing names, and name → reason of the unschedulable and of the unresolvable
    ones (the three members of a filter reply), in one pass."""
    ok, unschedulable = scheduling.PASS, Code.UNSCHEDULABLE
    passed: list[str] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    for name, v in zip(names, verdicts, strict=True):
        if v is ok:
            passed.append(name)
        elif v.code is unschedulable:
            failed[name] = v.reason
        else:
            unresolvable[name] = v.reason
    return passed, failed, unresolvable


def _encode_whole(names: list[str], verdicts: list[Verdict]) -> tuple[bytes, tuple[bytes, list[str]]]:
    """The ``ExtenderFilterResult`` JSON for distinct ``names`` and their ``verdicts``
    (aligned; ``NodeNames`` in that order), and its ``NodeNames`` as JSON and as a list.
    One partitioning pass (:func:`_partition`) and one orjson call per member: a request's
    own candidates are encoded once, so nothing is kept per block. (Partitioning by a dozen
    C-level passes — ``map``, ``compress``, ``zip`` — cost twice as much at 540 candidates:
    each pass over the list costs about what the Python loop costs per member.)"""
    passed, failed, unresolvable = _partition(names, verdicts)
    node_names = orjson.dumps(passed)
    body = b"".join(
        (
            b'{"Nodes":null,"NodeNames":',
            node_names,
            b',"FailedNodes":',
            orjson.dumps(failed),
            b',"FailedAndUnresolvableNodes":',
            orjson.dumps(unresolvable),
            b',"Error":""}',
        )
    )
    return body, (node_names, passed)


def _encode_block(names: list[str], verdicts: list[Verdict]) -> _Block:
    """A block's three reply members as JSON without their brackets, and its passing names."""
    passed, failed, unresolvable = _partition(names, verdicts)
    return _Block(
        orjson.dumps(passed)[1:-1],
        orjson.dumps(failed)[1:-1],
        orjson.dumps(unresolvable)[1:-1],
        tuple(passed),
    )


def _either(index: Mapping[str, AbstractSet[str]], a: str | None, b: str | None) -> AbstractSet[str]:
    """The nodes ``index`` lists under key ``a`` or key ``b`` (None: no key), e.g. the nodes
    tagged for either of two owners, or caching either of two checkpoints."""
    empty: frozenset[str] = frozenset()
    return (index.get(a, empty) if a is not None else empty) | (
        index.get(b, empty) if b is not None else empty
    )


_QUOTED: dict[str, str] = {}
_QUOTED_LIMIT: Final = 1 << 17


def _json_str(s: str) -> str:
    """``s`` as a JSON string literal (memoised: node names recur in every reply)."""
    quoted = _QUOTED.get(s)
    if quoted is None:
        if len(_QUOTED) >= _QUOTED_LIMIT:
            _QUOTED.clear()
        quoted = _QUOTED[s] = orjson.dumps(s).decode()
    return quoted


@dataclass(slots=True)
class _Entry:
    index: dict[str, int]
    """Candidate name → its position in ``result.names``."""
    standby: bytearray
    """1 where the candidate is a standby-pool node (a bytearray: nothing for the collector)."""
    general_passes: int
    result: FilterResult

    def copy(self) -> _Entry:
        """A copy whose updates leave this entry as it is (the candidate list is shared)."""
        return _Entry(self.index, bytearray(self.standby), self.general_passes, self.result.copy())


class FilterCache:
    """Per-class filter results, updated incrementally. ``max_classes`` bounds memory
    (least recently used classes are dropped; each holds one verdict per candidate node)."""

    def __init__(self, *, max_classes: int = DEFAULT_MAX_CLASSES) -> None:
        self._max = max_classes
        self._entries: dict[tuple[RequestKeys, bool], _Entry] = {}
        self._given: list[str] = []
        """The latest candidate list as given (a private copy)."""
        self._wanted: tuple[list[str], list[int]] | None = None
        """``_given`` without repeated names and their positions in the universe; None when
        that is the universe itself, in its order."""
        self._names: list[str] = []
        self._index: dict[str, int] = {}
        """The universe (every node seen: the snapshot's and the candidates without a
        GPUNode, each once) and its positions, shared by every entry made for it: one copy
        for the collector to traverse, not one per class."""
        self._families: dict[tuple[FitKey, int, int | None, bool], tuple[RequestKeys, bool]] = {}
        """Per family (a class without its owner), its most recently filtered class."""
        self._arrays = FitArrays()
        self._arrays_of: tuple[list[str], int] | None = None
        """The universe's devices as arrays (:class:`extender.fitarrays.FitArrays`) at a
        snapshot version, brought up to date by ``changed_since`` for each full filter: a
        class no memo has seen costs a few array operations, not a count per node."""
        self.full = 0
        """Full filters of a class with no entry (a new class, or one dropped as least used)."""
        self.refiltered = 0
        """Full filters of a class with an entry: a new universe, a change log that no longer
        reaches back, a reclaim class's standby verdicts."""
        self.incremental = 0
        self.derived = 0
        self.over_arrays = 0
        """Incremental and derived filters whose nodes were re-checked over the arrays."""

    def clear(self) -> None:
        """Forget every class, the universe and the arrays, as a new cache (after a failed
        request: :func:`extender.server.forget_request_state`); counters are kept."""
        self._entries.clear()
        self._given = []
        self._wanted = None
        self._names = []
        self._index = {}
        self._families.clear()
        self._arrays = FitArrays()
        self._arrays_of = None

    @property
    def universe(self) -> list[str]:
        """Every node name seen, each once (the snapshot's nodes and candidates without a
        GPUNode): the same list object until the universe changes. Not to be changed; for
        :meth:`extender.body.ExtenderArgsDecoder.intern`, so that later candidate lists
        hold these very strings."""
        return self._names

    def filter(
        self,
        req: GpuRequest,
        nodes: Mapping[str, NodeView],
        names: Sequence[str],
        *,
        version: int,
        changed_since: Callable[[int], set[str] | None],
        tagged: Mapping[str, AbstractSet[str]] | None = None,
    ) -> FilterResult:
        """The filter result of ``req`` over candidate ``names`` (a name given twice is
        answered once) against snapshot ``nodes`` at ``version``. ``changed_since(v)``
        names the nodes changed after snapshot ``v`` (None when unknown). ``nodes``,
        ``version`` and ``changed_since`` come from one inventory (its snapshots and change
        log; versions only grow). Same verdicts as :func:`extender.scheduling.filter_nodes`.

        ``tagged``: owner → the snapshot's nodes with a device tagged for that owner
        (:attr:`extender.state.Snapshot.tagged`). Given it, the first request of a
        high-priority class is derived from the latest class that differs only in its owner:
        the owner decides only on nodes tagged for one of the two (elsewhere both see the
        same devices), so only those and the changed nodes are re-checked.

        The class's entry holds a verdict for every node of the universe; the result is that
        entry's (shared, see :class:`FilterResult`) when ``names`` is the universe in its
        order, else a new one for ``names`` alone (:meth:`_restrict`)."""
        if self._given != names:  # a private copy: the caller may reuse its list
            self._given = list(names)
            self._wanted = self._positions(self._given, nodes)
        keys = RequestKeys.of(req)
        class_key = (keys, req.reclaim)
        family = (keys.ownerless, keys.count, keys.preemptor, req.reclaim)
        entry = self._entries.pop(class_key, None)
        known = entry is not None
        if (
            entry is not None
            and self._current(entry)
            and (
                entry.result.version == version
                or self._update(
                    req,
                    entry,
                    nodes,
                    version,
                    changed_since(entry.result.version),
                    changed_since=changed_since,
                )
            )
        ):
            self.incremental += 1
        elif (
            entry := self._derive(
                req,
                class_key,
                family=family,
                nodes=nodes,
                version=version,
                changed_since=changed_since,
                tagged=tagged,
            )
        ) is not None:
            self.derived += 1
        else:
            arrays = self._arrays_at(nodes, version, changed_since)
            entry = self._full(
                req, keys, arrays=arrays, names=self._names, index=self._index, version=version
            )
            if known:
                self.refiltered += 1
            else:
                self.full += 1
        self._entries[class_key] = entry
        if keys.exact.owner is not None:
            self._families[family] = class_key
        if len(self._entries) > self._max:
            del self._entries[next(iter(self._entries))]
        if self._wanted is None:
            return entry.result
        names, positions = self._wanted
        return self._restrict(req, keys, entry=entry, nodes=nodes, names=names, positions=positions)

    def _positions(
        self, given: list[str], nodes: Mapping[str, NodeView]
    ) -> tuple[list[str], list[int]] | None:
        """``given`` without repeated names and their positions in the universe, which grows
        to take in names it lacks (then every entry is made again, once); None when
        ``given`` is the universe in its order. The universe starts, and starts again when
        nodes that left make up most of it, as ``given`` followed by the snapshot's other
        nodes, so that a scheduler sending every node in one order gets the shared result."""
        if given == self._names:
            return None
        index = self._index
        found = list(map(index.get, given))
        if None in found:
            # a new universe (entries made for the old one are not current), or a fresh one
            index = {} if len(index) > 2 * len(nodes) + _UNIVERSE_SLACK else dict(index)
            for name in chain(given, nodes):
                index.setdefault(name, len(index))
            self._index, self._names = index, list(index)
            found = list(map(index.get, given))
        positions = cast(list[int], found)  # every name is in the universe now
        unique = given
        if len(set(positions)) < len(positions):  # a name given twice
            unique = list(dict.fromkeys(given))
            positions = list(map(index.__getitem__, unique))
        return None if unique == self._names else (unique, positions)

    @staticmethod
    def _restrict(
        req: GpuRequest,
        keys: RequestKeys,
        *,
        entry: _Entry,
        nodes: Mapping[str, NodeView],
        names: list[str],
        positions: list[int],
    ) -> FilterResult:
        """The result for candidates ``names`` (distinct, at ``positions`` in the universe)
        from ``entry``, which is current. For a reclaim pod the standby candidates' verdicts
        depend on whether a general *candidate* passes (Algorithm 1 line 19), so they are
        decided again for these candidates."""
        verdicts = list(map(entry.result.verdicts.__getitem__, positions))
        standby = entry.standby
        if req.reclaim and any(map(standby.__getitem__, positions)):
            ok = scheduling.PASS
            general_ok = any(v is ok and not standby[i] for v, i in zip(verdicts, positions, strict=True))
            for k, i in enumerate(positions):
                if standby[i]:
                    view = nodes.get(names[k])
                    assert view is not None  # entry.standby is the snapshot's pool
                    verdicts[k] = scheduling.standby_verdict(keys, view, general_ok=general_ok)
        return FilterResult(entry.result.version, names, verdicts, dict(Counter(verdicts)), None)

    def _current(self, entry: _Entry) -> bool:
        """Whether ``entry`` was made for the latest candidate list (then it shares it)."""
        names = entry.result.names
        if names is self._names:
            return True
        if names != self._names:
            return False
        entry.result.names, entry.index = self._names, self._index  # one copy, shared
        return True

    def _derive(
        self,
        req: GpuRequest,
        class_key: tuple[RequestKeys, bool],
        *,
        family: tuple[FitKey, int, int | None, bool],
        nodes: Mapping[str, NodeView],
        version: int,
        changed_since: Callable[[int], set[str] | None],
        tagged: Mapping[str, AbstractSet[str]] | None,
    ) -> _Entry | None:
        """A new entry for ``req`` from its family's latest class, or None."""
        if tagged is None or req.owner is None:
            return None
        sibling_key = self._families.get(family)
        sibling = self._entries.get(sibling_key) if sibling_key is not None else None
        if sibling is None or sibling_key == class_key or not self._current(sibling):
            return None

        assert sibling_key is not None
        changed = changed_since(sibling.result.version)
        if changed is None:
            return None
        changed |= _either(tagged, req.owner, sibling_key[0].exact.owner)
        entry = sibling.copy()
        updated = self._update(req, entry, nodes, version, changed, changed_since=changed_since)
        return entry if updated else None

    def _arrays_for(
        self,
        rechecks: int,
        nodes: Mapping[str, NodeView],
        version: int,
        changed_since: Callable[[int], set[str] | None],
    ) -> FitArrays | None:
        """The arrays at ``version`` when re-checking ``rechecks`` nodes over them is no
        dearer than one by one (more than :data:`ARRAY_RECHECK_SHARE` of the universe plus
        the rows they lag behind, and made for this universe); else None."""
        above = ARRAY_RECHECK_SHARE * len(self._names)
        if rechecks <= above:
            return None
        kept = self._arrays_of
        if kept is None or kept[0] is not self._names or kept[1] > version:
            return None  # they would be loaded afresh (≈ 10 ms at 1,250 nodes)
        lag = changed_since(kept[1]) if kept[1] != version else set()
        if lag is None or rechecks <= above + len(lag):
            return None
        return self._arrays_at(nodes, version, changed_since)

    def _arrays_at(
        self, nodes: Mapping[str, NodeView], version: int, changed_since: Callable[[int], set[str] | None]
    ) -> FitArrays:
        """The universe's devices as arrays at ``version``: the kept arrays with the rows of
        the nodes changed since they were made written again, or all rows loaded afresh."""
        arrays = self._arrays
        kept = self._arrays_of
        if kept is not None and kept[0] is self._names and kept[1] <= version:
            changed = changed_since(kept[1]) if kept[1] != version else set()
            if changed is not None:
                index, views = self._index, arrays.views
                at: list[int] = []
                for name in changed:
                    i = index.get(name)
                    if i is not None:
                        views[i] = nodes.get(name)
                        at.append(i)
                arrays.update(at)
                self._arrays_of = (self._names, version)
                return arrays
        arrays.load(list(map(nodes.get, self._names)))
        self._arrays_of = (self._names, version)
        return arrays

    @staticmethod
    def _full(
        req: GpuRequest,
        keys: RequestKeys,
        *,
        arrays: FitArrays,
        names: list[str],
        index: dict[str, int],
        version: int,
    ) -> _Entry:
        verdicts, standby_at = arrays.filter_pools(req, keys)
        counts = dict(Counter(verdicts))
        return _Entry(
            index=index,
            standby=_standby_flags(len(names), standby_at),
            general_passes=_general_passes(counts, verdicts, standby_at),
            result=FilterResult(version, names, verdicts, counts, _Blocks.of(len(names))),
        )

    def _update(
        self,
        req: GpuRequest,
        entry: _Entry,
        nodes: Mapping[str, NodeView],
        version: int,
        changed: set[str] | None,
        *,
        changed_since: Callable[[int], set[str] | None],
    ) -> bool:
        """Re-check the ``changed`` nodes (one by one, or every node over the arrays: see
        :data:`ARRAY_RECHECK_SHARE`) and bring ``entry`` to ``version``; False when a full
        filter is needed instead (``changed`` None: the change log does not reach back)."""
        result = entry.result
        if changed is None:
            return False
        keys = RequestKeys.of(req)
        arrays = self._arrays_for(len(changed), nodes, version, changed_since)
        if arrays is not None and self._update_over(req, keys, entry, version, arrays):
            self.over_arrays += 1
            return True
        updates: list[tuple[int, Verdict]] = []
        passes = entry.general_passes
        check: scheduling.Checker | None = None
        verdicts = result.verdicts
        # bound once: an idle class's update re-checks hundreds of nodes
        position, view_of, standby, reclaim = entry.index.get, nodes.get, entry.standby, req.reclaim
        for name in changed:
            i = position(name)
            if i is None:
                continue
            view = view_of(name)
            on_standby = view is not None and view.standby
            if on_standby != standby[i] or (on_standby and reclaim):
                return False  # pool moved, or a standby verdict that hangs on the others
            if view is None:
                new = scheduling.NO_GPUNODE
            elif on_standby:
                new = scheduling.STANDBY_NOT_RECLAIM
            else:
                if check is None:
                    check = scheduling.Checker(req, keys)
                new = check(view)
            old = verdicts[i]
            if new is not old:
                updates.append((i, new))
                if not on_standby:
                    passes += (new is scheduling.PASS) - (old is scheduling.PASS)
        if req.reclaim and (passes > 0) != (entry.general_passes > 0) and any(entry.standby):
            return False  # "a general node fits" flipped: every standby verdict changes
        for i, new in updates:
            result.changed(i, new)
        entry.general_passes = passes
        result.version = version
        return True

    @staticmethod
    def _update_over(
        req: GpuRequest, keys: RequestKeys, entry: _Entry, version: int, arrays: FitArrays
    ) -> bool:
        """Every node of ``req``'s class re-checked over ``arrays`` (at ``version``, made for
        the entry's universe; a reclaim pod's standby verdicts as in a full filter), the
        entry's verdicts changed in place where they differ: no per-node Python work but for
        the differences, and no new result for the collector to traverse. False when the
        rows are not the entry's."""
        verdicts, standby_at = arrays.filter_pools(req, keys)
        result = entry.result
        old = result.verdicts
        if len(verdicts) != len(old):
            return False
        for i in compress(range(len(old)), map(is_not, old, verdicts)):
            result.changed(i, verdicts[i])
        entry.standby = _standby_flags(len(old), standby_at)  # nodes may have moved between pools
        entry.general_passes = _general_passes(result.counts, verdicts, standby_at)
        result.version = version
        return True


def _standby_flags(size: int, standby_at: list[int]) -> bytearray:
    """:attr:`_Entry.standby` for ``size`` nodes, those at ``standby_at`` in the standby pool."""
    flags = bytearray(size)
    for i in standby_at:
        flags[i] = 1
    return flags


def _general_passes(counts: Mapping[Verdict, int], verdicts: list[Verdict], standby_at: list[int]) -> int:
    """:attr:`_Entry.general_passes`: the passing verdicts (``counts``) less the standby nodes'."""
    ok = scheduling.PASS
    return counts.get(ok, 0) - sum(1 for i in standby_at if verdicts[i] is ok)


@dataclass(slots=True)
class _Scores:
    by_name: dict[str, bytes]
    """node → its ``{"Host": ..., "Score": ...}`` JSON member, valid at ``version``."""
    version: int

    def drop(self, changed: AbstractSet[str] | None) -> bool:
        """Forget the scores of the ``changed`` nodes; False when ``changed`` is None
        (unknown: nothing is kept)."""
        if changed is None:
            return False
        by_name = self.by_name
        for name in changed:
            by_name.pop(name, None)
        return True


class PriorityCache:
    """Per-class prioritize answers (``HostPriorityList``), updated incrementally like
    :class:`FilterCache`: each node's score is kept per class until the node changes, so the
    candidate list may differ from call to call (it is the previous filter's answer). The
    class adds the pod's checkpoint and images (cache affinity) to the filter's.

    A new class starts from the latest class of its family (the same request but for the
    owner and the checkpoint): a node scores the same for both unless it changed since, is
    tagged for one of the two owners, or caches one of the two checkpoints."""

    def __init__(self, *, max_classes: int = DEFAULT_MAX_CLASSES) -> None:
        self._max = max_classes
        self._entries: dict[tuple[RequestKeys, bool, str | None, tuple[str, ...]], _Scores] = {}
        self._families: dict[
            tuple[FitKey, bool, int, int | None, bool, tuple[str, ...]],
            tuple[RequestKeys, bool, str | None, tuple[str, ...]],
        ] = {}
        """Per family, its most recently scored class."""
        self.computed = 0
        self.reused = 0
        self.derived = 0

    def clear(self) -> None:
        """Forget every class's scores, as a new cache (after a failed request); counters
        are kept."""
        self._entries.clear()
        self._families.clear()

    def prioritize(
        self,
        req: GpuRequest,
        nodes: Mapping[str, NodeView],
        names: Sequence[str],
        *,
        version: int,
        changed_since: Callable[[int], set[str] | None],
        tagged: Mapping[str, AbstractSet[str]] | None = None,
        cached: Mapping[str, AbstractSet[str]] | None = None,
    ) -> bytes:
        """The JSON ``HostPriorityList`` for ``names``: :func:`extender.scheduling.score_node`
        per node (0 for a node without a GPUNode), in input order. ``tagged`` (owner → nodes
        with a device tagged for it) and ``cached`` (checkpoint → nodes caching it), from
        the same snapshot as ``nodes`` (:class:`extender.state.Snapshot`), let a new class
        start from its family's latest scores; without them it starts empty."""
        keys = RequestKeys.of(req)
        class_key = (keys, req.reclaim, req.checkpoint, req.images)
        family = (
            keys.ownerless,
            keys.exact.owner is None,
            keys.count,
            keys.preemptor,
            req.reclaim,
            req.images,
        )
        entry = self._entries.pop(class_key, None)
        if entry is not None and not entry.drop(changed_since(entry.version)):
            entry = None
        if entry is None and tagged is not None and cached is not None:
            entry = self._derive(class_key, family, changed_since, tagged, cached)
        if entry is None:
            entry = _Scores({}, version)
        entry.version = version
        by_name = entry.by_name
        fragments = list(map(by_name.get, names))
        computed = 0
        if not all(fragments):  # a None among them (a fragment is never empty): truth tests, not == None
            scorer = scheduling.Scorer(req, keys)
            # the candidates without a score: C-level selection (a fragment is never empty)
            for i in compress(range(len(fragments)), map(not_, fragments)):
                name = names[i]
                fragment = by_name.get(name)
                if fragment is None:  # a candidate listed twice is scored once
                    view = nodes.get(name)
                    fragment = by_name[name] = _host_score(name, scorer(view) if view is not None else 0)
                    computed += 1
                fragments[i] = fragment
        self.computed += computed
        self.reused += len(names) - computed
        self._entries[class_key] = entry
        self._families[family] = class_key
        if len(self._entries) > self._max:
            del self._entries[next(iter(self._entries))]
        if len(self._families) > self._max:
            del self._families[next(iter(self._families))]
        return b"[" + b",".join(fragments) + b"]"  # type: ignore[arg-type]  # no None left

    def _derive(
        self,
        class_key: tuple[RequestKeys, bool, str | None, tuple[str, ...]],
        family: tuple[FitKey, bool, int, int | None, bool, tuple[str, ...]],
        changed_since: Callable[[int], set[str] | None],
        tagged: Mapping[str, AbstractSet[str]],
        cached: Mapping[str, AbstractSet[str]],
    ) -> _Scores | None:
        """Scores for a new class from its family's latest class, or None."""
        sibling_key = self._families.get(family)
        sibling = self._entries.get(sibling_key) if sibling_key is not None else None
        if sibling is None or sibling_key is None or sibling_key == class_key:
            return None
        changed = changed_since(sibling.version)
        if changed is None:
            return None
        owner, other = class_key[0].exact.owner, sibling_key[0].exact.owner
        if owner != other:
            changed |= _either(tagged, owner, other)
        ckpt, other_ckpt = class_key[2], sibling_key[2]
        if ckpt != other_ckpt:
            changed |= _either(cached, ckpt, other_ckpt)
        entry = _Scores(dict(sibling.by_name), sibling.version)
        entry.drop(changed)
        self.derived += 1
        return entry


def _host_score(name: str, score: int) -> bytes:
    return ('{"Host":' + _json_str(name) + ',"Score":' + str(score) + "}").encode()
