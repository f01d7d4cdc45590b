"""Filter results per equivalence class of pods, kept up to date between snapshots.

Role: a filter over 1,250 candidate nodes costs O(nodes) even when every node answer is
memoised. Pods of one job ask the same thing (same GPU count, priority, owner, tier, type,
reclaim flag): they form an equivalence class (as in kube-scheduler's former equivalence
cache), and between two of them usually only the few nodes touched by binds change. This
cache keeps, per class, the verdict of every candidate node and the reply built from them,
and on the next request of that class re-checks only the nodes the inventory reports as
changed since (:meth:`extender.state.Inventory.changed_since`). A different candidate list,
a change log that no longer reaches back, or a flip of "some general node fits" for a
reclaim pod (which changes every standby verdict) falls back to a full filter.

Pure bookkeeping over immutable snapshots: no I/O, no asyncio. Neighbours: used by
:mod:`extender.server`; decisions come from :mod:`extender.scheduling`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import compress
from operator import not_
from typing import Final

import orjson

from extender import scheduling
from extender.scheduling import Code, FitKey, NodeView, RequestKeys, Verdict
from flexlease.api.pod import GpuRequest

DEFAULT_MAX_CLASSES: Final = 128


@dataclass(slots=True)
class FilterResult:
    """The filter answer for one class over one candidate list, at snapshot ``version``.

    ``passed`` keeps input order until nodes flip; ``failed``/``unresolvable`` map node →
    reason; ``counts`` counts nodes per (interned) verdict. ``encoded`` is a cache slot for
    the serialised reply, cleared whenever a verdict changes. Shared between requests:
    read it synchronously after :meth:`FilterCache.filter`, before the next call.
    """

    version: int
    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    counts: dict[Verdict, int]
    encoded: bytes | None = None

    def encode(self) -> bytes:
        """The ``ExtenderFilterResult`` JSON (nodeCacheCapable form), cached until a verdict
        changes."""
        if self.encoded is None:
            self.encoded = b"".join(
                (
                    b'{"Nodes":null,"NodeNames":',
                    orjson.dumps(self.passed),
                    b',"FailedNodes":',
                    orjson.dumps(self.failed),
                    b',"FailedAndUnresolvableNodes":',
                    orjson.dumps(self.unresolvable),
                    b',"Error":""}',
                )
            )
        return self.encoded


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
    names: list[str]
    index: dict[str, int]
    verdicts: list[Verdict]
    standby: bytearray
    """1 where the candidate is a standby-pool node (a bytearray: nothing for the collector)."""
    general_passes: int
    result: FilterResult

    def copy(self) -> _Entry:
        """A copy whose updates leave this entry as it is (the candidate list is shared)."""
        r = self.result
        return _Entry(
            names=self.names,
            index=self.index,
            verdicts=list(self.verdicts),
            standby=bytearray(self.standby),
            general_passes=self.general_passes,
            result=FilterResult(
                r.version, list(r.passed), dict(r.failed), dict(r.unresolvable), dict(r.counts), r.encoded
            ),
        )


class FilterCache:
    """Per-class filter results, updated incrementally. ``max_classes`` bounds memory
    (least recently used classes are dropped; each holds one verdict per candidate node)."""

    def __init__(self, *, max_classes: int = DEFAULT_MAX_CLASSES) -> None:
        self._max = max_classes
        self._entries: dict[tuple[RequestKeys, bool], _Entry] = {}
        self._names: list[str] = []
        self._index: dict[str, int] = {}
        """The latest candidate list and its positions, shared by every entry made for it
        (the scheduler sends the same list for most pods): one copy for the collector to
        traverse, not one per class."""
        self._families: dict[tuple[FitKey, int, int | None, bool], tuple[RequestKeys, bool]] = {}
        """Per family (a class without its owner), its most recently filtered class."""
        self.full = 0
        self.incremental = 0
        self.derived = 0

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
        """The filter result of ``req`` over candidate ``names`` against snapshot ``nodes``
        at ``version``. ``changed_since(v)`` names the nodes changed after snapshot ``v``
        (None when unknown). Same verdicts as :func:`extender.scheduling.filter_nodes`.

        ``tagged``: owner → the snapshot's nodes with a device tagged for that owner
        (:attr:`extender.state.Snapshot.tagged`). Given it, the first request of a
        high-priority class is derived from the latest class that differs only in its owner:
        the owner decides only on nodes tagged for one of the two (elsewhere both see the
        same devices), so only those and the changed nodes are re-checked."""
        if names is not self._names and self._names != names:
            self._names = list(names)
            self._index = {n: i for i, n in enumerate(self._names)}
        keys = RequestKeys.of(req)
        class_key = (keys, req.reclaim)
        family = (keys.exact._replace(owner=None), keys.count, keys.preemptor, req.reclaim)
        entry = self._entries.pop(class_key, None)
        reusable = entry is not None and (entry.names is self._names or entry.names == names)
        if (
            reusable
            and entry is not None
            and (entry.result.version == version or self._update(req, entry, nodes, version, changed_since))
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
            entry = self._full(req, nodes, self._names, self._index, version)
            self.full += 1
        self._entries[class_key] = entry
        if keys.exact.owner is not None:
            self._families[family] = class_key
        if len(self._entries) > self._max:
            del self._entries[next(iter(self._entries))]
        return entry.result

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
        if (
            sibling is None
            or sibling_key == class_key
            or not (sibling.names is self._names or sibling.names == self._names)
        ):
            return None

        assert sibling_key is not None
        empty: frozenset[str] = frozenset()
        owners_nodes = tagged.get(req.owner, empty) | tagged.get(sibling_key[0].exact.owner or "", empty)

        def widened(since: int) -> set[str] | None:
            changed = changed_since(since)
            return None if changed is None else changed.union(owners_nodes)

        entry = sibling.copy()
        return entry if self._update(req, entry, nodes, version, widened) else None

    @staticmethod
    def _full(
        req: GpuRequest, nodes: Mapping[str, NodeView], names: list[str], index: dict[str, int], version: int
    ) -> _Entry:
        views = list(map(nodes.get, names))
        verdicts, standby_at = scheduling.filter_pools(req, views)
        standby = bytearray(len(names))
        for i in standby_at:
            standby[i] = 1
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        ok = scheduling.PASS
        unschedulable = Code.UNSCHEDULABLE
        for name, v in zip(names, verdicts, strict=True):
            if v is ok:
                passed.append(name)
            elif v.code is unschedulable:
                failed[name] = v.reason
            else:
                unresolvable[name] = v.reason
        general_passes = len(passed) - sum(1 for i in standby_at if verdicts[i] is ok)
        return _Entry(
            names=names,
            index=index,
            verdicts=verdicts,
            standby=standby,
            general_passes=general_passes,
            result=FilterResult(
                version,
                passed,
                failed,
                unresolvable,
                dict(Counter(verdicts)),
            ),
        )

    @staticmethod
    def _update(
        req: GpuRequest,
        entry: _Entry,
        nodes: Mapping[str, NodeView],
        version: int,
        changed_since: Callable[[int], set[str] | None],
    ) -> bool:
        """Re-check the changed nodes; False when a full filter is needed instead."""
        changed = changed_since(entry.result.version)
        if changed is None:
            return False
        updates: list[tuple[int, str, Verdict]] = []
        passes = entry.general_passes
        check: scheduling.Checker | None = None
        for name in changed:
            i = entry.index.get(name)
            if i is None:
                continue
            view = nodes.get(name)
            on_standby = view is not None and view.standby
            if on_standby != entry.standby[i] or (on_standby and req.reclaim):
                return False  # pool moved, or a standby verdict that hangs on the others
            if view is None:
                new = scheduling.NO_GPUNODE
            elif on_standby:
                new = scheduling.STANDBY_NOT_RECLAIM
            else:
                if check is None:
                    check = scheduling.Checker(req)
                new = check(view)
            old = entry.verdicts[i]
            if new is not old:
                updates.append((i, name, new))
                if not on_standby:
                    passes += (new is scheduling.PASS) - (old is scheduling.PASS)
        if req.reclaim and (passes > 0) != (entry.general_passes > 0) and any(entry.standby):
            return False  # "a general node fits" flipped: every standby verdict changes
        result = entry.result
        for i, name, new in updates:
            _remove(result, name, entry.verdicts[i])
            _add(result, name, new)
            entry.verdicts[i] = new
            result.encoded = None
        entry.general_passes = passes
        result.version = version
        return True


def _remove(result: FilterResult, name: str, v: Verdict) -> None:
    n = result.counts[v] - 1
    if n:
        result.counts[v] = n
    else:
        del result.counts[v]
    if v is scheduling.PASS:
        result.passed.remove(name)
    elif v.code is Code.UNSCHEDULABLE:
        del result.failed[name]
    else:
        del result.unresolvable[name]


def _add(result: FilterResult, name: str, v: Verdict) -> None:
    result.counts[v] = result.counts.get(v, 0) + 1
    if v is scheduling.PASS:
        result.passed.append(name)
    elif v.code is Code.UNSCHEDULABLE:
        result.failed[name] = v.reason
    else:
        result.unresolvable[name] = v.reason


@dataclass(slots=True)
class _Scores:
    by_name: dict[str, bytes]
    """node → its ``{"Host": ..., "Score": ...}`` JSON member, valid at ``version``."""
    version: int


class PriorityCache:
    """Per-class prioritize answers (``HostPriorityList``), updated incrementally like
    :class:`FilterCache`: each node's score is kept per class until the node changes, so the
    candidate list may differ from call to call (it is the previous filter's answer). The
    class adds the pod's checkpoint and images (cache affinity) to the filter's."""

    def __init__(self, *, max_classes: int = DEFAULT_MAX_CLASSES) -> None:
        self._max = max_classes
        self._entries: dict[tuple[RequestKeys, bool, str | None, tuple[str, ...]], _Scores] = {}
        self.computed = 0
        self.reused = 0

    def prioritize(
        self,
        req: GpuRequest,
        nodes: Mapping[str, NodeView],
        names: Sequence[str],
        *,
        version: int,
        changed_since: Callable[[int], set[str] | None],
    ) -> bytes:
        """The JSON ``HostPriorityList`` for ``names``: :func:`extender.scheduling.score_node`
        per node (0 for a node without a GPUNode), in input order."""
        keys = RequestKeys.of(req)
        class_key = (keys, req.reclaim, req.checkpoint, req.images)
        entry = self._entries.pop(class_key, None)
        if entry is not None:
            changed = changed_since(entry.version)
            if changed is None:
                entry = None
            else:
                for name in changed:
                    entry.by_name.pop(name, None)
        if entry is None:
            entry = _Scores({}, version)
        entry.version = version
        by_name = entry.by_name
        fragments = list(map(by_name.get, names))
        computed = 0
        if None in fragments:
            scorer = scheduling.Scorer(req, keys)
            # the candidates without a score: C-level selection (a fragment is never empty)
            for name in compress(names, map(not_, fragments)):
                if name not in by_name:  # a candidate listed twice is scored once
                    view = nodes.get(name)
                    by_name[name] = _host_score(name, scorer(view) if view is not None else 0)
                    computed += 1
            fragments = list(map(by_name.__getitem__, names))
        self.computed += computed
        self.reused += len(names) - computed
        self._entries[class_key] = entry
        if len(self._entries) > self._max:
            del self._entries[next(iter(self._entries))]
        return b"[" + b",".join(fragments) + b"]"  # type: ignore[arg-type]  # no None left


def _host_score(name: str, score: int) -> bytes:
    return ('{"Host":' + _json_str(name) + ',"Score":' + str(score) + "}").encode()
