"""Algorithm 1 of WeFlex (PVLDB 2025, §3.5) as pure functions over immutable node views.

Role: decide, device by device, which GPUs a pod may use, and turn that into the four
kube-scheduler extender answers: per-node verdicts (filter), node scores 0–10 (prioritize),
the exact devices (bind) and preemption victims (preempt). No I/O, no asyncio.

Neighbours: :mod:`extender.state` builds the :class:`NodeView` values from the store's
``GPUNode`` and Pod objects and hands out immutable snapshots; :mod:`extender.server` parses
the pod once (:func:`flexlease.api.pod.parse_pod` → :class:`~flexlease.api.pod.GpuRequest`)
and calls the functions here. Verdict codes follow kube-scheduler's framework
(``Success`` / ``Unschedulable`` / ``UnschedulableAndUnresolvable``).

Algorithm 1, per node (DESIGN §3): a device is *usable* by a pod when it is healthy, free,
of the requested GPU type (if any), has an effective tier (``GPUNode.effective_tier``)
``>= ReqRel``, and is untagged, or the pod is low priority, or the pod is high priority and
the tag's owner is the pod's owner (MATCH). Standby-pool nodes are usable only by reclaim
pods, and only when no general candidate fits (FETCHSTANDBY: same type, tier ``>= ReqRel``).
"""

from __future__ import annotations

import bisect
import enum
import functools
import itertools
import json
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Final, NamedTuple, TypeVar

from flexlease.api.pod import GpuRequest, Priority
from flexlease.api.resources import Pool
from flexlease.api.tiers import Tier

MAX_SCORE: Final = 10
"""``MaxExtenderPriority`` of ``k8s.io/kube-scheduler/extender/v1``."""


class Code(enum.IntEnum):
    """Per-node outcome, after kube-scheduler's ``framework.Code``."""

    SUCCESS = 0
    UNSCHEDULABLE = 2
    """Does not fit now; preempting low-priority pods may help → ``FailedNodes``."""
    UNRESOLVABLE = 3
    """Cannot fit whatever is preempted → ``FailedAndUnresolvableNodes``."""


class Cause(enum.StrEnum):
    """Why a node got its verdict: a short, bounded label (metrics), beside the free-text reason."""

    FITS = "fits"
    NO_GPUNODE = "no_gpunode"
    NO_GPUS = "no_gpus"
    TOO_FEW_GPUS = "too_few_gpus"
    WRONG_TYPE = "wrong_type"
    NOT_USABLE = "not_usable"
    """Enough GPUs, but too many unhealthy, below the required tier or tagged for others."""
    HELD_PREEMPTABLE = "held_preemptable"
    HELD = "held"
    STANDBY_NOT_RECLAIM = "standby_not_reclaim"
    STANDBY_NOT_NEEDED = "standby_not_needed"


@dataclass(frozen=True, slots=True, eq=False)
class Verdict:
    """A node's filter outcome, its :class:`Cause` and, when it failed, a reason a person
    can act on.

    Compared and hashed by identity: verdicts are interned (equal verdicts are one object),
    so a filter over thousands of nodes can count outcomes per distinct verdict cheaply.
    """

    code: Code
    cause: Cause = Cause.FITS
    reason: str = ""
    reason_json: str = field(init=False, repr=False)
    """``reason`` as a JSON string literal (derived), for replies assembled from fragments."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason_json", json.dumps(self.reason))

    @property
    def ok(self) -> bool:
        return self.code is Code.SUCCESS


PASS: Final = Verdict(Code.SUCCESS, Cause.FITS)


@dataclass(frozen=True, slots=True)
class Holder:
    """A pod that holds (or, for an in-flight bind, reserves) devices on one node.

    ``low``: the pod is low priority (``flexlease.io/priority=low``), so a candidate
    preemption victim. ``priority_value``: its ``spec.priority`` (kube-scheduler only
    preempts pods of lower value). ``reserved``: an assumed bind not yet confirmed (never a victim).
    ``critical``: its ``flexlease.io/role`` is critical in its framework profile (coordinator,
    Ray head, rank 0: WeFlex §3.4); never a victim, whatever its priority.
    """

    uid: str
    key: str
    indices: tuple[int, ...]
    low: bool
    priority_value: int = 0
    reserved: bool = False
    critical: bool = False


@dataclass(frozen=True, slots=True)
class DeviceView:
    """One GPU as scheduling sees it. ``tier`` is the effective tier (override, else agent's);
    None when the agent has not reported one (never usable). ``holder`` is the uid of the pod
    that holds or reserves it, None when free."""

    index: int
    uuid: str
    model: str
    tier: Tier | None
    healthy: bool
    owner: str | None
    holder: str | None = None
    rank: int = field(init=False, repr=False, compare=False)
    """``tier.rank`` (0 LA, 1 MA, 2 HA), -1 without a tier: derived, for fast comparisons."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "rank", self.tier.rank if self.tier is not None else -1)

    @property
    def free(self) -> bool:
        return self.holder is None


class FitKey(NamedTuple):
    """The parts of a request that decide per-device usability (the memo key of a node).

    A named tuple rather than a dataclass: it is hashed once per node per request, and a
    tuple hashes in C.
    """

    tier: Tier
    gpu_type: str | None
    high: bool
    owner: str | None

    @classmethod
    def of(cls, req: GpuRequest) -> FitKey:
        high = req.priority is Priority.HIGH
        return cls(req.required_tier, req.gpu_type, high, req.owner if high else None)


class RequestKeys(NamedTuple):
    """A request's :class:`FitKey` and its two equivalents, computed once per request.

    On a node without ownership tags every pod sees the same devices (``open``: tags do not
    matter, as for LP pods); on a tagged node an HP pod whose owner has no tag there sees
    only untagged devices (``closed``). Normalising to these few keys lets the per-node
    memo serve almost every request. ``preemptor``: the pod's ``spec.priority`` when it may
    preempt (``preemptionPolicy`` is not ``Never``), else None; kube-scheduler only evicts
    pods of lower priority, so it decides whether "preemption may help". ``ownerless``:
    ``exact`` without its owner (derived), what the requests of one family (alike but for
    the owner) share.

    A named tuple: its hash (a part of every class key) is computed in C, and
    :meth:`of` returns one object per distinct request (memoised).
    """

    exact: FitKey
    open: FitKey
    closed: FitKey
    count: int  # type: ignore[assignment]  # the field shadows tuple.count(), unused on keys
    preemptor: int | None
    ownerless: FitKey

    @classmethod
    def of(cls, req: GpuRequest) -> RequestKeys:
        """The keys of ``req``; equal requests get the same object (memoised: a request's
        keys are computed by filter, prioritize and every changed node's check)."""
        high = req.priority is Priority.HIGH
        owner = req.owner if high else None
        return _request_keys(
            (req.required_tier, req.gpu_type, high, owner, req.count),
            req.priority_value if req.preempts else None,
        )

    def for_node(self, node: NodeView) -> FitKey:
        """The key equivalent to ``exact`` on ``node``."""
        if not node.owners or not self.exact.high:
            return self.open
        if self.exact.owner is not None and self.exact.owner in node.owners:
            return self.exact
        return self.closed


@functools.lru_cache(maxsize=4096)
def _request_keys(
    asked: tuple[Tier, str | None, bool, str | None, int], preemptor: int | None
) -> RequestKeys:
    """:class:`RequestKeys` of ``asked`` (tier, GPU type, high, owner, count) and the
    preemptor's priority (None: may not preempt)."""
    tier, gpu_type, high, owner, count = asked
    return RequestKeys(
        exact=FitKey(tier, gpu_type, high, owner),
        open=FitKey(tier, gpu_type, False, None),
        closed=FitKey(tier, gpu_type, True, None),
        count=count,
        preemptor=preemptor,
        ownerless=FitKey(tier, gpu_type, high, None),
    )


class NodeFit(NamedTuple):
    """Device counts of one node for one :class:`FitKey` (independent of the GPU count asked).
    A named tuple: equal situations on different nodes share one verdict through a memo.

    ``usable``: devices this pod could use if nobody held them; ``free``: usable and free;
    ``low_held``: for each usable device held by a low-priority pod (not a bind in flight,
    not a critical role), that pod's ``spec.priority``, ascending — a preemptor of higher
    priority could free it; ``own_free``: free usable devices tagged with the pod's owner;
    ``untagged_free``: free usable untagged devices;
    ``node_free``: free healthy devices of any kind (for packing). The rest explain failures.
    """

    total: int
    matching_type: int
    usable: int
    free: int
    low_held: tuple[int, ...]
    own_free: int
    untagged_free: int
    node_free: int
    unhealthy: int
    below_tier: int
    foreign_tagged: int


class DeviceGroup(NamedTuple):
    """Devices of one node alike in model, tier rank, owner tag and health: ``total`` of
    them, ``free`` unheld; ``low_held``: the ``spec.priority`` of the low-priority (not
    reserved) holder of each held one."""

    model: str
    rank: int
    owner: str | None
    healthy: bool
    total: int
    free: int
    low_held: tuple[int, ...]


@dataclass(frozen=True, slots=True, eq=False)
class NodeView:
    """An immutable view of one node's GPUs, built by :mod:`extender.state`.

    ``devices`` is sorted by index. ``holders`` maps pod uid → :class:`Holder`.
    ``generation`` increases whenever the node's view changes. ``memo`` is a slot for
    callers' pure results derived from this (immutable) view, never part of equality;
    Algorithm 1's own memos are shared across nodes by ``signature`` instead.
    """

    name: str
    pool: Pool
    generation: int
    devices: tuple[DeviceView, ...]
    images: frozenset[str] = frozenset()
    checkpoints: frozenset[str] = frozenset()
    holders: Mapping[str, Holder] = field(default_factory=dict)
    memo: dict[object, object] = field(default_factory=dict, repr=False)
    owners: frozenset[str] = field(init=False, repr=False)
    """Owners of the node's tagged devices (derived)."""
    groups: tuple[DeviceGroup, ...] = field(init=False, repr=False)
    """Devices grouped by what decides usability (derived, in a canonical order): :func:`fit`
    counts groups."""
    signature: int = field(init=False, repr=False)
    """An id shared by every view with equal ``groups`` (derived): equal groups give equal
    :func:`fit` counts, so nodes with one signature get one answer per request class
    (the cross-node memo). Ids are never reused within a process."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "owners", frozenset(d.owner for d in self.devices if d.owner is not None))
        counts: dict[tuple[str, int, str | None, bool], list[int]] = {}
        low_held: dict[tuple[str, int, str | None, bool], list[int]] = {}
        for d in self.devices:
            k = (d.model, d.rank, d.owner, d.healthy)
            c = counts.setdefault(k, [0, 0])
            c[0] += 1
            if d.holder is None:
                c[1] += 1
            else:
                h = self.holders.get(d.holder)
                if h is not None and h.low and not h.reserved and not h.critical:
                    low_held.setdefault(k, []).append(h.priority_value)
        groups = tuple(
            sorted(
                (
                    DeviceGroup(m, r, o, hl, c[0], c[1], tuple(sorted(low_held.get((m, r, o, hl), ()))))
                    for (m, r, o, hl), c in counts.items()
                ),
                key=_group_order,
            )
        )
        object.__setattr__(self, "groups", groups)
        object.__setattr__(self, "signature", _signature(groups))

    @property
    def standby(self) -> bool:
        return self.pool is Pool.STANDBY


def _group_order(g: DeviceGroup) -> tuple[str, int, bool, str, bool]:
    return (g.model, g.rank, g.owner is not None, g.owner or "", g.healthy)


_K = TypeVar("_K")
_S = TypeVar("_S")
_V = TypeVar("_V")
_SIGNATURES: dict[tuple[DeviceGroup, ...], int] = {}
_NEXT_SIGNATURE: Final = itertools.count(1)
_MEMO_LIMIT: Final = 65_536
"""Entries at most in each cross-node memo table; a full table is emptied (ids keep
counting, so a dropped entry is only computed again, never confused with another)."""


def _signature(groups: tuple[DeviceGroup, ...]) -> int:
    """The interned id of ``groups`` (see :attr:`NodeView.signature`)."""
    sig = _SIGNATURES.get(groups)
    if sig is None:
        if len(_SIGNATURES) >= _MEMO_LIMIT:
            _SIGNATURES.clear()
        sig = _SIGNATURES[groups] = next(_NEXT_SIGNATURE)
    return sig


def release_own(node: NodeView, uid: str) -> NodeView:
    """``node`` as pod ``uid`` sees it: devices the pod itself holds or reserves there (a
    claim left by an interrupted bind, a bind being retried) count as free, so a pod never
    stands in its own way. Returns ``node`` itself when the pod holds nothing there."""
    if not uid or uid not in node.holders:
        return node
    return NodeView(
        name=node.name,
        pool=node.pool,
        generation=node.generation,
        devices=tuple(replace(d, holder=None) if d.holder == uid else d for d in node.devices),
        images=node.images,
        checkpoints=node.checkpoints,
        holders=MappingProxyType({k: h for k, h in node.holders.items() if k != uid}),
    )


# --------------------------------------------------------------------------- usability


def tag_allows(key: FitKey, owner: str | None) -> bool:
    """Algorithm 1 lines 8–13: untagged, or LP, or HP with MATCH(pod, owner)."""
    return owner is None or not key.high or (key.owner is not None and owner == key.owner)


def device_usable(key: FitKey, dev: DeviceView, *, ignore_holder: bool = False) -> bool:
    """True when ``dev`` is usable for a request with ``key``: healthy, right type, tier
    ``>= ReqRel``, tag allowed, and free (unless ``ignore_holder``)."""
    return (
        dev.healthy
        and dev.rank >= key.tier.rank
        and (key.gpu_type is None or dev.model == key.gpu_type)
        and tag_allows(key, dev.owner)
        and (ignore_holder or dev.holder is None)
    )


_FITS: dict[FitKey, dict[int, NodeFit]] = {}
"""Cross-node memo of :func:`fit`: key → node signature → counts. Two levels, so that the
per-node lookup hashes only an int."""


_MEMO_BUDGET: Final = 1 << 19
"""Entries at most in all cross-node memo tables together (about 60 MB): past it, every
table is emptied at the next request (:func:`_table`), and answers are computed afresh."""
_MEMO_ENTRIES = [0]
"""Entries added to the memo tables since they were last emptied (a list: mutable in place)."""


def _table(tables: dict[_K, dict[_S, _V]], key: _K) -> dict[_S, _V]:
    """The per-signature table of ``key`` in ``tables`` (created empty; both levels bounded
    by :data:`_MEMO_LIMIT`, all tables together by :data:`_MEMO_BUDGET`)."""
    if _MEMO_ENTRIES[0] > _MEMO_BUDGET:
        for family in _MEMO_FAMILIES:
            family.clear()
        _MEMO_ENTRIES[0] = 0
    table = tables.get(key)
    if table is None:
        if len(tables) >= _MEMO_LIMIT:
            tables.clear()
        table = tables[key] = {}
    elif len(table) >= _MEMO_LIMIT:
        table.clear()
    return table


def fit(key: FitKey, node: NodeView) -> NodeFit:
    """Count ``node``'s devices for ``key``. Memoised across nodes: every view with the same
    :attr:`NodeView.signature` shares one result per key (:func:`count_groups` is the
    computation, :func:`count_devices` the same counts device by device)."""
    table = _table(_FITS, key)
    result = table.get(node.signature)
    if result is None:
        result = table[node.signature] = count_groups(key, node.groups)
        _MEMO_ENTRIES[0] += 1
    return result


def count_groups(key: FitKey, groups: Iterable[DeviceGroup]) -> NodeFit:
    """:class:`NodeFit` of a node whose devices form ``groups`` (no memo). Runs once per
    distinct node signature and key: the groups are unpacked in the loop header and the
    result built positionally (a third faster than attribute reads and keywords)."""
    total = matching = usable = free = own_free = untagged_free = node_free = 0
    unhealthy = below = foreign = 0
    low_held: tuple[int, ...] = ()
    need_rank = key.tier.rank
    gpu_type, owner = key.gpu_type, key.owner
    for model, rank, g_owner, healthy, g_total, g_free, g_low in groups:
        total += g_total
        if healthy:
            node_free += g_free
        if gpu_type is not None and model != gpu_type:
            continue
        matching += g_total
        if not healthy:
            unhealthy += g_total
        elif rank < need_rank:
            below += g_total
        elif not tag_allows(key, g_owner):
            foreign += g_total
        else:
            usable += g_total
            free += g_free
            if g_low:
                low_held = (*low_held, *g_low) if low_held else g_low
            if g_owner is None:
                untagged_free += g_free
            elif owner is not None and g_owner == owner:
                own_free += g_free
    if len(low_held) > 1:
        low_held = tuple(sorted(low_held))
    return _new_fit(
        (
            total,
            matching,
            usable,
            free,
            low_held,
            own_free,
            untagged_free,
            node_free,
            unhealthy,
            below,
            foreign,
        )
    )


_new_fit: Final = NodeFit._make
"""``NodeFit`` from a tuple of its fields in order (positional, no keyword handling)."""


def count_devices(key: FitKey, node: NodeView) -> NodeFit:
    """:func:`fit` computed device by device from ``node.devices`` and ``node.holders``,
    without groups or memo: the reference the memoised path is tested against."""
    usable = [d for d in node.devices if device_usable(key, d, ignore_holder=True)]
    low_held = []
    for d in usable:
        h = node.holders.get(d.holder) if d.holder is not None else None
        if h is not None and h.low and not h.reserved and not h.critical:
            low_held.append(h.priority_value)
    typed = [d for d in node.devices if key.gpu_type is None or d.model == key.gpu_type]
    return NodeFit(
        total=len(node.devices),
        matching_type=len(typed),
        usable=len(usable),
        free=sum(d.free for d in usable),
        low_held=tuple(sorted(low_held)),
        own_free=sum(d.free and key.owner is not None and d.owner == key.owner for d in usable),
        untagged_free=sum(d.free and d.owner is None for d in usable),
        node_free=sum(d.healthy and d.free for d in node.devices),
        unhealthy=sum(not d.healthy for d in typed),
        below_tier=sum(d.healthy and d.rank < key.tier.rank for d in typed),
        foreign_tagged=sum(
            d.healthy and d.rank >= key.tier.rank and not tag_allows(key, d.owner) for d in typed
        ),
    )


# --------------------------------------------------------------------------- filter


def _plural(n: int) -> str:
    return "GPU" if n == 1 else "GPUs"


def check_node(req: GpuRequest, node: NodeView) -> Verdict:
    """Filter verdict of one general-pool node for a GPU pod (``req.count > 0``).

    Ignores the pool (see :func:`filter_nodes` for standby rules). Unresolvable when the
    node could never serve the pod (too few GPUs in total, wrong type, unhealthy, tier too
    low, tagged for another owner, or held by pods preemption cannot move); Unschedulable
    when enough usable devices are held by low-priority pods.
    """
    return check_keyed(RequestKeys.of(req), node)


def check_keyed(keys: RequestKeys, node: NodeView) -> Verdict:
    """:func:`check_node` for a request whose keys are ``keys`` (:meth:`RequestKeys.of`),
    through the cross-node memo."""
    return _check_keyed(keys.for_node(node), keys.count, keys.preemptor, node)


_BY_FIT: dict[tuple[FitKey, int, int | None], dict[NodeFit, Verdict]] = {}
"""Verdicts by (normalised key, count, preemptor) and then by the node's counts for that key:
nodes whose groups differ in ways this key does not see (other tiers above the one
asked, other models when any will do) still share one verdict."""


class _Lane(NamedTuple):
    """The memo tables of one normalised key of a request, resolved once per request."""

    key: FitKey
    verdicts: dict[int, Verdict]
    fits: dict[int, NodeFit]
    by_fit: dict[NodeFit, Verdict]


def _lane(key: FitKey, count: int, preemptor: int | None) -> _Lane:
    memo = (key, count, preemptor)
    return _Lane(key, _table(_VERDICTS, memo), _table(_FITS, key), _table(_BY_FIT, memo))


def _lane_verdict(lane: _Lane, count: int, preemptor: int | None, node: NodeView) -> Verdict:
    """The verdict of ``node`` on ``lane``, through the lane's tables."""
    sig = node.signature
    verdict = lane.verdicts.get(sig)
    if verdict is None:
        f = lane.fits.get(sig)
        if f is None:
            f = lane.fits[sig] = count_groups(lane.key, node.groups)
            _MEMO_ENTRIES[0] += 1
        verdict = lane.by_fit.get(f)
        if verdict is None:
            verdict = lane.by_fit[f] = _verdict(count, lane.key, f, preemptor)
            _MEMO_ENTRIES[0] += 1
        lane.verdicts[sig] = verdict
        _MEMO_ENTRIES[0] += 1
    return verdict


class Checker:
    """:func:`check_node` of one request, for many general-pool nodes:
    ``Checker(req)(node) -> Verdict``. Resolves the cross-node memo tables of the
    request's three normalised keys once, so each node costs one lookup by signature."""

    __slots__ = ("_count", "_high", "_lanes", "_owner", "_preemptor")

    def __init__(self, req: GpuRequest, keys: RequestKeys | None = None) -> None:
        keys = keys if keys is not None else RequestKeys.of(req)
        self._count, self._preemptor = keys.count, keys.preemptor
        self._high, self._owner = keys.exact.high, keys.exact.owner
        self._lanes = tuple(
            _lane(k, keys.count, keys.preemptor) for k in (keys.open, keys.exact, keys.closed)
        )

    def __call__(self, node: NodeView) -> Verdict:
        owners = node.owners
        if not owners or not self._high:
            lane = self._lanes[0]
        elif self._owner is not None and self._owner in owners:
            lane = self._lanes[1]
        else:
            lane = self._lanes[2]
        return _lane_verdict(lane, self._count, self._preemptor, node)


_VERDICTS: dict[tuple[FitKey, int, int | None], dict[int, Verdict]] = {}
"""Cross-node memo of verdicts: (normalised key, count, preemptor) → node signature → verdict."""


def _check_keyed(key: FitKey, count: int, preemptor: int | None, node: NodeView) -> Verdict:
    """The verdict for ``key`` (already normalised for ``node``), memoised across nodes by
    :attr:`NodeView.signature`."""
    return _lane_verdict(_lane(key, count, preemptor), count, preemptor, node)


_INTERNED: dict[tuple[Code, Cause, str], Verdict] = {}
_INTERN_LIMIT: Final = 65_536


def _intern(code: Code, cause: Cause, reason: str) -> Verdict:
    k = (code, cause, reason)
    v = _INTERNED.get(k)
    if v is None:
        if len(_INTERNED) >= _INTERN_LIMIT:
            _INTERNED.clear()
        v = _INTERNED[k] = Verdict(code, cause, reason)
    return v


_BY_SITUATION: dict[tuple[int, FitKey, NodeFit, int | None], Verdict] = {}


def _verdict(need: int, key: FitKey, f: NodeFit, preemptor: int | None) -> Verdict:
    situation = (need, key, f, preemptor)
    v = _BY_SITUATION.get(situation)
    if v is None:
        if len(_BY_SITUATION) >= _INTERN_LIMIT:
            _BY_SITUATION.clear()
        v = _explain(need, key, f, preemptor)
        v = _BY_SITUATION[situation] = v if v is PASS else _intern(v.code, v.cause, v.reason)
    return v


def _gpus(n: int, what: str) -> str:
    """``no free GPU`` / ``fewer than 2 free GPUs`` — the start of a reason, sized for ``n``."""
    return f"no {what}GPU" if n == 1 else f"fewer than {n} {what}GPUs"


def _ask(key: FitKey) -> str:
    """What the pod asks beyond a count: `` of type X`` and `` at tier MA or above``."""
    out = f" of type {key.gpu_type}" if key.gpu_type is not None else ""
    if key.tier is not Tier.LA:
        out += f" at tier {key.tier} or above"
    return out


def preemptable_by(f: NodeFit, preemptor: int | None) -> int:
    """Usable devices of ``f`` held by low-priority pods that a pod of ``spec.priority``
    ``preemptor`` (None: may not preempt) could evict: kube-scheduler only preempts pods
    of lower priority."""
    if preemptor is None:
        return 0
    return bisect.bisect_left(f.low_held, preemptor)


def _explain(need: int, key: FitKey, f: NodeFit, preemptor: int | None) -> Verdict:
    """The verdict and its reason.

    Reasons are phrased for kube-scheduler's aggregation, which prefixes each distinct
    reason with the number of nodes that gave it (``0/1250 nodes are available: 800 node(s)
    had no free GPU of type NVIDIA H20 at tier HA or above.``): they start with
    ``node(s) had`` and name the pod's request and the node's situation but not the node's
    exact counts, so nodes in the same situation share one reason. Unschedulable (preemption
    may help) only when enough usable devices are held by low-priority pods this pod may
    preempt (lower ``spec.priority``, ``preemptionPolicy`` not ``Never``); otherwise the
    scheduler's preemption pass would be futile, so the node is unresolvable.
    """
    if f.free >= need:
        return PASS
    ask = _ask(key)
    if f.total == 0:
        return Verdict(Code.UNRESOLVABLE, Cause.NO_GPUS, "node(s) had a GPUNode that reports no GPUs")
    if need > f.total:
        return Verdict(Code.UNRESOLVABLE, Cause.TOO_FEW_GPUS, f"node(s) had {_gpus(need, '')} in total")
    if f.matching_type < need:
        return Verdict(
            Code.UNRESOLVABLE, Cause.WRONG_TYPE, f"node(s) had {_gpus(need, '')} of type {key.gpu_type}"
        )
    if f.usable < need:
        parts = []
        if f.unhealthy:
            parts.append("unhealthy")
        if f.below_tier:
            parts.append(f"below tier {key.tier}")
        if f.foreign_tagged:
            parts.append("tagged for another owner")
        return Verdict(
            Code.UNRESOLVABLE,
            Cause.NOT_USABLE,
            f"node(s) had {_gpus(need, 'healthy ')}{ask} open to this pod (others {' or '.join(parts)})",
        )
    if f.free + preemptable_by(f, preemptor) >= need:
        return Verdict(
            Code.UNSCHEDULABLE,
            Cause.HELD_PREEMPTABLE,
            f"node(s) had {_gpus(need, 'free ')}{ask}; preemptable lower-priority pods hold the rest",
        )
    return Verdict(
        Code.UNRESOLVABLE,
        Cause.HELD,
        f"node(s) had {_gpus(need, 'free ')}{ask}; pods this pod cannot preempt hold the rest",
    )


STANDBY_NOT_RECLAIM: Final = Verdict(
    Code.UNRESOLVABLE,
    Cause.STANDBY_NOT_RECLAIM,
    "node(s) were in the standby pool, which only reclaim pods (flexlease.io/reclaim=true) may use",
)
STANDBY_NOT_NEEDED: Final = Verdict(
    Code.UNRESOLVABLE,
    Cause.STANDBY_NOT_NEEDED,
    "node(s) were in the standby pool, which a reclaim pod uses only when no general-pool node fits",
)
NO_GPUNODE: Final = Verdict(
    Code.UNRESOLVABLE, Cause.NO_GPUNODE, "node(s) had no flexlease GPUNode (no agent reports their GPUs)"
)


def filter_nodes(req: GpuRequest, nodes: Sequence[NodeView | None]) -> list[Verdict]:
    """Verdicts for ``nodes`` (None = a candidate without a GPUNode), aligned with the input.

    General-pool nodes are checked with :func:`check_node`. Standby-pool nodes pass only
    for a reclaim pod and only when no general-pool candidate passes (Algorithm 1 lines
    19–23, FETCHSTANDBY: same type, tier ``>= ReqRel``; the general candidates fall short).
    """
    return filter_pools(req, nodes)[0]


def filter_pools(req: GpuRequest, nodes: Sequence[NodeView | None]) -> tuple[list[Verdict], list[int]]:
    """:func:`filter_nodes`, and the positions of the standby-pool nodes among ``nodes``
    (ascending). Node by node through the cross-node memo: the reference the filter cache's
    paths are tested against (:mod:`extender.equivalence` answers requests from its entries
    and computes full filters with :mod:`extender.fitarrays`)."""
    keys = RequestKeys.of(req)
    out: list[Verdict] = []
    standby_at: list[int] = []
    for i, node in enumerate(nodes):
        if node is None:
            out.append(NO_GPUNODE)
        elif node.standby:
            out.append(STANDBY_NOT_RECLAIM)
            standby_at.append(i)
        else:
            out.append(check_keyed(keys, node))
    if req.reclaim and standby_at:
        general_ok = PASS in out  # standby and absent nodes are not PASS (identity: interned)
        for i in standby_at:
            node = nodes[i]
            assert node is not None
            out[i] = standby_verdict(keys, node, general_ok=general_ok)
    return out, standby_at


def standby_verdict(keys: RequestKeys, node: NodeView, *, general_ok: bool) -> Verdict:
    """The verdict of standby-pool ``node`` for a reclaim pod with ``keys``, given whether
    some general-pool candidate passes (``general_ok``): Algorithm 1 lines 19–23
    (FETCHSTANDBY), checked as a general node would be when no general candidate fits;
    otherwise not needed. A standby GPU the lease controller tagged for this owner (a
    one-for-one supplement for a lent GPU that failed) is FETCHSTANDBY's answer already,
    so such a node is checked either way."""
    exact = keys.exact
    supplemented = exact.high and exact.owner is not None and exact.owner in node.owners
    return check_keyed(keys, node) if supplemented or not general_ok else STANDBY_NOT_NEEDED


def standby_allowed(req: GpuRequest, general: Iterable[NodeView]) -> bool:
    """Whether standby-pool nodes may serve ``req``: a reclaim pod for which no general
    node in ``general`` fits now (the shortfall of Algorithm 1 line 19)."""
    if not req.reclaim:
        return False
    return not any(check_node(req, n).ok for n in general if not n.standby)


# --------------------------------------------------------------------------- prioritize


def score_node(req: GpuRequest, node: NodeView) -> int:
    """Score 0–10 of a node that passed filter (0 for one that does not fit).

    The preference order of DESIGN §3, most significant first: (a) for a high-priority
    reclaim pod, its own tagged free GPUs cover none / part / all of the request; (b) the
    node caches nothing / one of the pod's images / its checkpoint (PICKGPUS); (c) for a
    low-priority pod, the request fits on untagged GPUs (so a reclaim needs fewer
    preemptions); (d) packing: the fewer free GPUs left on the node after placement, the
    better (whole free nodes stay for large jobs). See :func:`banded_score` for how this
    is mapped onto the 11 scores without rounding ever erasing or inverting (a)–(c).
    """
    return score_keyed(req, RequestKeys.of(req), node)


def preference_levels(
    req: GpuRequest, keys: RequestKeys, f: NodeFit, *, cached_ckpt: bool, cached_image: bool
) -> tuple[tuple[int, int], ...]:
    """The discrete preference levels (a)–(c) of :func:`score_node` as ``(value, number of
    values)`` pairs, most significant first; only the levels that apply to this pod."""
    need = req.count
    levels: list[tuple[int, int]] = []
    if req.reclaim and keys.exact.high and keys.exact.owner is not None:
        own = min(f.own_free, need)
        levels.append((0 if own == 0 else 2 if own >= need else 1, 3))
    levels.append((2 if cached_ckpt else 1 if cached_image else 0, 3))
    if not keys.exact.high:
        levels.append((1 if f.untagged_free >= need else 0, 2))
    return tuple(levels)


def banded_score(levels: Iterable[tuple[int, int]], fraction: float) -> int:
    """Map discrete ``levels`` (``(value, number of values)``, most significant first) and
    a tie-breaking ``fraction`` in [0, 1] onto scores 1..``MAX_SCORE``.

    The levels form a mixed-radix rank ``r`` in ``[0, N)``; rank ``r`` owns the band
    ``1 + r*10//N .. (r+1)*10//N`` (at least one score when ``N <= 10``), and bands of
    higher ranks lie strictly above lower ones, so a better level always scores strictly
    higher whatever the fraction. Inside its band the fraction picks a score monotonically
    (it may tie, never invert). Raises ValueError when ``N > MAX_SCORE``.
    """
    rank, n = 0, 1
    for value, size in levels:
        rank, n = rank * size + value, n * size
    if n > MAX_SCORE:
        raise ValueError(f"{n} preference classes do not fit in scores 1..{MAX_SCORE}")
    lo = 1 + rank * MAX_SCORE // n
    width = (rank + 1) * MAX_SCORE // n - lo + 1
    return lo + min(int(max(fraction, 0.0) * width), width - 1)


def score_nodes(req: GpuRequest, nodes: Sequence[NodeView | None]) -> list[int]:
    """:func:`score_node` for each of ``nodes`` (0 for None), aligned with the input."""
    score = Scorer(req)
    return [score(n) if n is not None else 0 for n in nodes]


def score_keyed(req: GpuRequest, keys: RequestKeys, node: NodeView) -> int:
    """:func:`score_node` with the request's keys computed once by the caller."""
    return Scorer(req, keys)(node)


class Scorer:
    """:func:`score_node` of one request, for many nodes: ``Scorer(req)(node) -> 0..10``.

    A node's score depends on its device groups (:attr:`NodeView.signature`), which of the
    request's three normalised keys applies there (:meth:`RequestKeys.for_node`) and
    whether it caches the pod's checkpoint or an image; the request's own count, reclaim
    flag, priority and owner are fixed. So scores are memoised across nodes and requests
    per (key, cache state) and signature, and this object resolves the nine possible
    tables once per request instead of hashing the key at every node.
    """

    __slots__ = ("_by_key", "_keys", "_req", "_tables")

    def __init__(self, req: GpuRequest, keys: RequestKeys | None = None) -> None:
        self._req = req
        self._keys = keys if keys is not None else RequestKeys.of(req)
        k = self._keys
        self._by_key = (k.open, k.exact, k.closed)
        self._tables: list[dict[int, int] | None] = [None] * 9

    def __call__(self, node: NodeView) -> int:
        req, keys = self._req, self._keys
        exact = keys.exact
        owners = node.owners
        if not owners or not exact.high:
            slot = 0
        elif exact.owner is not None and exact.owner in owners:
            slot = 3
        else:
            slot = 6
        cached_ckpt = req.checkpoint is not None and req.checkpoint in node.checkpoints
        cached_image = not cached_ckpt and bool(req.images) and not node.images.isdisjoint(req.images)
        slot += 2 if cached_ckpt else 1 if cached_image else 0
        table = self._tables[slot]
        key = self._by_key[slot // 3]
        if table is None:
            # Everything the score reads besides the node's groups: the normalised key
            # (fit), the count, the reclaim flag, the request's own priority and owner
            # (which levels apply) and the cache state.
            table = self._tables[slot] = _table(
                _SCORES,
                (
                    key,
                    keys.count,
                    req.reclaim,
                    exact.high,
                    exact.owner is not None,
                    cached_ckpt,
                    cached_image,
                ),
            )
        score = table.get(node.signature)
        if score is None:
            _MEMO_ENTRIES[0] += 1
            score = table[node.signature] = _compute_score(
                req, keys, fit(key, node), cached_ckpt=cached_ckpt, cached_image=cached_image
            )
        return score


_SCORES: dict[tuple[FitKey, int, bool, bool, bool, bool, bool], dict[int, int]] = {}
"""Cross-node memo of scores: what the score reads besides the node → signature → score."""
_MEMO_FAMILIES: Final[tuple[dict[Any, Any], ...]] = (_FITS, _VERDICTS, _BY_FIT, _SCORES)


def _compute_score(
    req: GpuRequest, keys: RequestKeys, f: NodeFit, *, cached_ckpt: bool, cached_image: bool
) -> int:
    need = req.count
    if need <= 0 or f.free < need:
        return 0
    levels = preference_levels(req, keys, f, cached_ckpt=cached_ckpt, cached_image=cached_image)
    left = max(f.node_free - need, 0)
    packing = 1.0 - left / f.total if f.total else 0.0
    return banded_score(levels, packing)


# --------------------------------------------------------------------------- bind


def device_order(key: FitKey, *, reclaim: bool) -> Callable[[DeviceView], tuple[int, int, int]]:
    """Sort key for usable devices: the rules prioritize scores nodes by, applied to devices.

    HP reclaim pods take their own tagged GPUs first; LP pods take untagged GPUs before
    tagged ones (fewer preemptions when the owner reclaims); then the lowest adequate tier
    (HA stays for pods that require it); then the lowest index.
    """

    def order(dev: DeviceView) -> tuple[int, int, int]:
        own = 0 if (reclaim and key.high and key.owner is not None and dev.owner == key.owner) else 1
        tagged = 1 if (not key.high and dev.owner is not None) else 0
        return (own, tagged, dev.rank * 1000 + dev.index)

    return order


def choose_devices(req: GpuRequest, node: NodeView) -> tuple[int, ...] | None:
    """The exact device indices (ascending) to bind on ``node``, or None when fewer than
    ``req.count`` usable devices are free. Pool rules are the caller's (see
    :func:`filter_nodes`); ``req.count`` must be positive."""
    if req.count <= 0:
        raise ValueError("choose_devices needs a GPU pod (count > 0)")
    key = FitKey.of(req)
    usable = [d for d in node.devices if device_usable(key, d)]
    if len(usable) < req.count:
        return None
    usable.sort(key=device_order(key, reclaim=req.reclaim))
    return tuple(sorted(d.index for d in usable[: req.count]))


def claim_problem(req: GpuRequest, node: NodeView, indices: Sequence[int]) -> str | None:
    """Why pod ``req`` may not keep the devices ``indices`` it claims on ``node`` (its
    ``assigned-gpus``, written by someone — never trusted), or None when it may: every
    device exists, is healthy, is usable by the pod (type, tier, ownership tag), is held by
    no other pod, and the claim names exactly ``req.count`` devices. ``node`` should be the
    pod's view (:func:`release_own`); pool rules are the caller's."""
    if len(indices) != req.count:
        return f"it names {len(indices)} {_plural(len(indices))}, the pod needs {req.count}"
    key = FitKey.of(req)
    by_index = {d.index: d for d in node.devices}
    for i in indices:
        d = by_index.get(i)
        if d is None:
            return f"{node.name} has no GPU {i}"
        if d.holder is not None:
            other = node.holders.get(d.holder)
            return f"GPU {i} is held by pod {other.key if other is not None else d.holder}"
        if not d.healthy:
            return f"GPU {i} is unhealthy"
        if key.gpu_type is not None and d.model != key.gpu_type:
            return f"GPU {i} is a {d.model}, the pod needs a {key.gpu_type}"
        if d.rank < key.tier.rank:
            return f"GPU {i} is at tier {d.tier or 'unknown'}, the pod needs {key.tier} or above"
        if not tag_allows(key, d.owner):
            return f"GPU {i} is tagged for {d.owner}"
    return None


# --------------------------------------------------------------------------- preempt


@dataclass(frozen=True, slots=True)
class Victims:
    """Pods to preempt on one node: uids in eviction order."""

    uids: tuple[str, ...]


def select_victims(
    req: GpuRequest,
    node: NodeView,
    *,
    proposed: Iterable[str],
    preemptor_priority: int = 0,
    protected: Container[str] = frozenset(),
) -> Victims | None:
    """Victims on ``node`` so that ``req`` fits, or None when no eviction can make it fit.

    ``proposed``: the scheduler's victim uids for this node (chosen for the resources it
    judges itself). Proposed pods that hold no managed GPU on this node are kept as they
    are; proposed GPU pods are kept only if they are low priority and hold devices this
    pod could use. When the GPUs still fall short, more low-priority pods holding usable
    devices (``spec.priority`` below ``preemptor_priority``) are added, those freeing
    the most usable devices first, proposed ones before others. Never a high-priority pod,
    never a reserved (binding) pod, never a critical one (:attr:`Holder.critical`, or a uid
    in ``protected``: pods whose role is critical, GPUs or not). A proposed pod without
    GPUs here that is ``protected`` cannot be replaced by another choice (the scheduler
    needs what it holds), so the node is given up: None.
    """
    key = FitKey.of(req)
    f = fit(key, node)
    proposed_list = list(dict.fromkeys(proposed))
    passthrough = [uid for uid in proposed_list if uid not in node.holders]
    if any(uid in protected for uid in passthrough):
        return None
    if f.free >= req.count:
        return Victims(tuple(passthrough))
    by_index = {d.index: d for d in node.devices}

    def frees(holder: Holder) -> int:
        return sum(
            1
            for i in holder.indices
            if (d := by_index.get(i)) is not None and device_usable(key, d, ignore_holder=True)
        )

    proposed_set = set(proposed_list)
    candidates: list[tuple[int, int, str, Holder]] = []
    for uid, holder in node.holders.items():
        if not holder.low or holder.reserved or holder.critical or uid in protected:
            continue
        if uid not in proposed_set and holder.priority_value >= preemptor_priority:
            continue
        n = frees(holder)
        if n > 0:
            candidates.append((0 if uid in proposed_set else 1, -n, uid, holder))
    candidates.sort(key=lambda c: (c[0], c[1], c[2]))
    need = req.count - f.free
    chosen: list[tuple[str, int]] = []
    freed = 0
    for _, neg, uid, _holder in candidates:
        if freed >= need:
            break
        chosen.append((uid, -neg))
        freed -= neg
    if freed < need:
        return None
    # Reprieve (as kube-scheduler does): give back any victim not needed after all,
    # smallest first.
    for uid, n in sorted(chosen, key=lambda c: c[1]):
        if freed - n >= need:
            chosen.remove((uid, n))
            freed -= n
    return Victims(tuple(passthrough + [uid for uid, _ in chosen]))
