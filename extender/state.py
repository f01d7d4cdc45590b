"""The extender's in-memory GPU inventory, derived from the store's GPUNode and Pod objects.

Role: hold what Algorithm 1 needs — devices, effective tiers, ownership tags, health,
pool, cache contents and which pod holds which GPU — and hand out immutable, versioned
:class:`Snapshot` values of :class:`extender.scheduling.NodeView` for each scheduling cycle.
Nothing here is authoritative (DESIGN §2, "state is derived, never duplicated"): GPUs
taken = the ``flexlease.io/assigned-gpus`` of non-terminated pods; tiers, tags and health =
``GPUNode``. A restart rebuilds everything from list + watch.

Binds follow kube-scheduler's assume → confirm → forget cycle: :meth:`Inventory.assume`
reserves devices synchronously (right after a snapshot, with no ``await`` in between), the
watch confirms the reservation when the pod's ``assigned-gpus`` arrives, :meth:`forget`
drops it on failure, and reservations unconfirmed after ``reservation_ttl_seconds`` expire.

An ``assigned-gpus`` annotation is a *claim*, not a fact (anyone can write one, e.g. by
copying a running pod's YAML). Claims are resolved by one rule, per node:

1. a claim by a pod bound to that node (``spec.nodeName``) beats a claim by a pod that is
   not; among bound pods the one created first (``creationTimestamp``, then
   ``namespace/name``) keeps a device claimed twice, the other keeps its remaining devices
   (it runs; the conflict is logged with both pods and counted);
2. a claim by a pod not bound there holds its devices only while none of them is held by
   another pod (else it loses its whole claim, logged and counted) and only for
   ``reservation_ttl_seconds`` after the extender first saw it (a bind in flight, or a claim
   written by hand or by an older two-step bind); after that the
   claim is released (logged and counted), and the pod may be scheduled afresh.

Neighbours: fed by the watch loops in :mod:`extender.server`; read by
:mod:`extender.scheduling` (through snapshots) and :mod:`extender.metrics` (gauges).
Pure bookkeeping, no I/O and no asyncio.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Final

import immutables
from pydantic import ValidationError

from extender.orchestrator import profile as profiles
from extender.scheduling import DeviceView, Holder, NodeView
from flexlease.api import pod as podapi
from flexlease.api import resources
from flexlease.api.keys import DEFAULT_GPU_RESOURCE
from flexlease.api.pod import Assignment, Priority
from flexlease.api.resources import Health, Pool
from flexlease.api.tiers import Tier
from flexlease.errors import Conflict, PodSpecError
from flexlease.logging import ctx
from flexlease.store.base import EventType, JsonObj, WatchEvent

log = logging.getLogger(__name__)

CHANGELOG_VERSIONS: Final = 4096
"""Snapshot versions whose changed-node sets are kept for :meth:`Inventory.changed_since`."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An immutable view of every node with a GPUNode, at inventory ``version``."""

    version: int
    nodes: Mapping[str, NodeView]
    tagged: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))
    """Owner → names of the nodes whose view has a device tagged for that owner
    (:attr:`NodeView.owners`)."""
    cached: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))
    """Checkpoint id → names of the nodes whose view caches it (:attr:`NodeView.checkpoints`)."""

    def get(self, name: str) -> NodeView | None:
        return self.nodes.get(name)


@dataclass(frozen=True, slots=True)
class Reservation:
    """An assumed bind: ``indices`` on ``node`` for pod ``uid``; expires at ``expires``
    (monotonic seconds) unless the watch confirms it first."""

    uid: str
    key: str
    node: str
    indices: tuple[int, ...]
    expires: float
    low: bool = False
    """The pod is low priority: its claim will read the same once the watch confirms it."""
    priority_value: int = 0
    """The pod's ``spec.priority``."""


@dataclass(frozen=True, slots=True)
class _Device:
    uuid: str
    model: str
    tier: Tier | None
    healthy: bool
    owner: str | None


@dataclass(slots=True)
class _Node:
    name: str
    pool: Pool
    devices: dict[int, _Device]
    images: frozenset[str]
    checkpoints: frozenset[str]


@dataclass(frozen=True, slots=True)
class _Holding:
    """A pod's claim from its ``assigned-gpus``. ``bound``: the pod is bound to ``node``."""

    uid: str
    key: str
    node: str
    indices: tuple[int, ...]
    low: bool
    priority_value: int
    bound: bool = True
    created: str = ""
    critical: bool = False

    def order(self) -> tuple[bool, str, str]:
        """Rule 1 of the module docstring: the lower claim wins a device claimed twice."""
        return (not self.bound, self.created, self.key)


def _holder(
    was: Holder | None,
    uid: str,
    key: str,
    indices: tuple[int, ...],
    *,
    low: bool,
    value: int,
    reserved: bool,
    critical: bool,
) -> Holder:
    """``Holder(uid, key, indices, ...)``, or ``was`` (the node's current one) when equal:
    comparing fields is cheaper than building a frozen dataclass, and an unchanged holder
    keeps the node's view equal by identity."""
    if (
        was is not None
        and was.indices == indices
        and was.low is low
        and was.priority_value == value
        and was.reserved is reserved
        and was.critical is critical
        and was.key == key
    ):
        return was
    return Holder(
        uid=uid, key=key, indices=indices, low=low, priority_value=value, reserved=reserved, critical=critical
    )


@dataclass(frozen=True, slots=True)
class DeviceCount:
    """Inventory gauge sample: ``count`` devices of ``model`` at ``tier`` (``"unknown"``
    when unreported) in ``state`` (``free``, ``used``, ``unhealthy``) on the nodes of node
    pool ``pool`` (``general``, ``standby``: ``GPUNode.spec.pool``); ``lent`` counts devices
    tagged with an owner (lent by an online job), whatever their state."""

    pool: str
    state: str
    tier: str
    model: str
    count: int


@dataclass(slots=True)
class _Listed:
    nodes: bool = False
    pods: bool = False


def _bindable_copy(pod: JsonObj) -> JsonObj | None:
    """``pod`` (a live pod not bound to a node) as :meth:`Inventory.unbound_pod` keeps it: a
    shallow copy without ``metadata.managedFields`` (often the largest part of a pod, read by
    no one here), or None when a Binding would be refused anyway (``deletionTimestamp`` set,
    or ``spec.schedulingGates`` not empty: ``BindingREST``'s checks)."""
    meta = pod.get("metadata")
    spec = pod.get("spec")
    if not isinstance(meta, dict) or meta.get("deletionTimestamp"):
        return None
    if isinstance(spec, dict) and spec.get("schedulingGates"):
        return None
    if "managedFields" not in meta:
        return pod
    return {**pod, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


@dataclass(slots=True)
class InventoryStats:
    """Counters the metrics module reads: confirmations, expiries, bad objects ignored."""

    confirmed: int = 0
    expired: int = 0
    forgotten: int = 0
    bad_objects: int = 0
    conflicts: int = 0
    claim_conflicts: int = 0
    """Pods found claiming a GPU another pod claims (counted once per pod and claim)."""
    claims_released: int = 0
    """Claims of pods that stayed unbound past the reservation TTL, released."""


class Inventory:
    """Devices, tags, tiers, health and assignments, fed by watch events.

    ``gpu_resource``: the extended resource name pods request (``nvidia.com/gpu``).
    ``reservation_ttl_seconds``: how long an assumed bind waits for the watch to confirm.
    ``clock``: monotonic seconds (injectable for tests).
    ``right_of_return``: False for plain leasing (``extender.right_of_return``): the views
    handed to scheduling carry no ownership tags and one tier for every GPU that has one
    (HA, so it meets any requirement and no GPU is preferred for its tier); the inventory
    itself (gauges, summary) keeps what the GPUNodes say.
    """

    def __init__(
        self,
        *,
        gpu_resource: str = DEFAULT_GPU_RESOURCE,
        reservation_ttl_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        right_of_return: bool = True,
        critical_roles: Mapping[str, frozenset[str]] | None = None,
    ) -> None:
        self._resource = gpu_resource
        self._right_of_return = right_of_return
        self._critical_roles = profiles.builtin_critical() if critical_roles is None else critical_roles
        """Critical roles by framework profile (:func:`extender.orchestrator.profile.critical_roles`)."""
        self._critical: set[str] = set()
        """uids of live pods (with or without GPUs) whose ``flexlease.io/role`` is critical."""
        self._ttl = reservation_ttl_seconds
        self._clock = clock
        self._nodes: dict[str, _Node] = {}
        self._holdings: dict[str, _Holding] = {}
        self._pending_pods: dict[str, tuple[JsonObj, podapi.GpuRequest]] = {}
        """uid → the latest object the Pod watch delivered for each live pod not bound to a
        node, not being deleted and not scheduling-gated, without its ``managedFields``
        (:func:`_bindable_copy`), and its parse: :meth:`unbound_pod`, :meth:`pending_request`."""
        self._on_node: dict[str, dict[str, None]] = {}
        self._reservations: dict[str, Reservation] = {}
        self._unbound: dict[str, float] = {}
        """uid → monotonic deadline of each live claim by a pod not bound to its node."""
        self._stale: set[str] = set()
        """Claims of unbound pods past their deadline: released, ignored until they change."""
        self._views: immutables.Map[str, NodeView] = immutables.Map()
        """The current view of every node: a persistent map (HAMT), so a snapshot shares it
        and the next version changes a few entries without copying the rest."""
        self._built_from: dict[str, _Node] = {}
        """The ``_Node`` each view was built from (``_Node`` values are replaced, never
        changed, when a GPUNode changes): a view rebuilt from the same one keeps its devices."""
        self._dirty: set[str] = set()
        self._tagged: dict[str, frozenset[str]] = {}
        """Owner → the nodes whose current view has a device tagged for that owner."""
        self._cached: dict[str, frozenset[str]] = {}
        """Checkpoint id → the nodes whose current view caches it."""
        self._indexes: tuple[Mapping[str, frozenset[str]], Mapping[str, frozenset[str]]] = (
            MappingProxyType({}),
            MappingProxyType({}),
        )
        """Read-only copies of ``_tagged`` and ``_cached`` for snapshots, made again only
        when one changes (most snapshots differ in holders only)."""
        self._generation = 0
        self._version = 0
        self._snapshot: Snapshot | None = None
        self._changelog: deque[tuple[int, frozenset[str]]] = deque(maxlen=CHANGELOG_VERSIONS)
        self._listed = _Listed()
        self.stats = InventoryStats()

    # ------------------------------------------------------------------ readiness

    @property
    def ready(self) -> bool:
        """True once both Pods and GPUNodes have been listed."""
        return self._listed.nodes and self._listed.pods

    @property
    def listed(self) -> tuple[bool, bool]:
        """(GPUNodes listed, Pods listed)."""
        return self._listed.nodes, self._listed.pods

    # ------------------------------------------------------------------ GPUNode events

    def replace_nodes(self, objects: Iterable[JsonObj]) -> None:
        """Replace every node with the result of a list (after start or ``410 Gone``)."""
        seen: set[str] = set()
        for obj in objects:
            name = self._upsert_node(obj)
            if name is not None:
                seen.add(name)
        for name in list(self._nodes):
            if name not in seen:
                del self._nodes[name]
                self._dirty.add(name)
        self._listed.nodes = True

    def apply_node_event(self, event: WatchEvent) -> None:
        """Apply one GPUNode watch event (BOOKMARK is ignored)."""
        if event.type is EventType.BOOKMARK:
            return
        if event.type is EventType.DELETED:
            name = (event.object.get("metadata") or {}).get("name")
            if isinstance(name, str) and self._nodes.pop(name, None) is not None:
                self._dirty.add(name)
            return
        self._upsert_node(event.object)

    def _upsert_node(self, obj: JsonObj) -> str | None:
        try:
            gn = resources.parse_gpunode(obj)
        except ValidationError as exc:
            self.stats.bad_objects += 1
            name = (obj.get("metadata") or {}).get("name") if isinstance(obj, dict) else None
            log.warning(
                "ignoring malformed GPUNode: %s",
                exc.errors(include_url=False)[:3],
                extra=ctx(node=name),
            )
            return None
        devices: dict[int, _Device] = {}
        for raw_index, status in gn.status.devices.items():
            try:
                index = int(raw_index)
            except ValueError:
                self.stats.bad_objects += 1
                log.warning(
                    "ignoring device with a non-integer index", extra=ctx(node=gn.name, gpu=raw_index)
                )
                continue
            spec = gn.spec.devices.get(raw_index)
            devices[index] = _Device(
                uuid=status.uuid,
                model=status.model,
                tier=gn.effective_tier(index),
                healthy=status.health is Health.HEALTHY,
                owner=spec.owner if spec is not None else None,
            )
        node = _Node(
            name=gn.name,
            pool=gn.spec.pool,
            devices=devices,
            images=frozenset(gn.status.cache.images),
            checkpoints=frozenset(c.id for c in gn.status.cache.checkpoints),
        )
        old = self._nodes.get(gn.name)
        if old is None or old != node:
            self._nodes[gn.name] = node
            self._dirty.add(gn.name)
        return gn.name

    # ------------------------------------------------------------------ Pod events

    def replace_pods(self, objects: Iterable[JsonObj]) -> None:
        """Replace every holding with the result of a Pod list."""
        seen: set[str] = set()
        self._critical.clear()
        self._pending_pods.clear()
        for obj in objects:
            uid = self._upsert_pod(obj)
            if uid is not None:
                seen.add(uid)
        for uid in list(self._holdings):
            if uid not in seen:
                self._release(uid)
        self._listed.pods = True

    def apply_pod_event(self, event: WatchEvent) -> None:
        """Apply one Pod watch event: record, move or release the pod's devices and confirm
        a pending reservation when its assignment arrives."""
        if event.type is EventType.BOOKMARK:
            return
        if event.type is EventType.DELETED:
            uid = str((event.object.get("metadata") or {}).get("uid") or "")
            self._pending_pods.pop(uid, None)
            self._release(uid)
            self._critical.discard(uid)
            res = self._reservations.pop(uid, None)
            if res is not None:
                self._dirty.add(res.node)
            return
        self._upsert_pod(event.object)

    def _upsert_pod(self, obj: JsonObj) -> str | None:
        critical = self._note_critical(obj)
        try:
            req = podapi.parse_pod(obj, self._resource)
        except PodSpecError as exc:
            self._forget_pending(obj)
            return self._upsert_malformed_pod(obj, exc, critical=critical)
        if req.uid:
            copy = _bindable_copy(obj) if req.node_name is None and not req.terminated else None
            if copy is not None:
                self._pending_pods[req.uid] = (copy, req)
            else:
                self._pending_pods.pop(req.uid, None)
        uid = req.uid or req.key
        if req.assignment is None or req.terminated:
            self._release(uid)
            return uid
        holding = _Holding(
            uid=uid,
            key=req.key,
            node=req.assignment.node,
            indices=req.assignment.indices,
            low=req.priority is Priority.LOW,
            priority_value=req.priority_value,
            bound=req.node_name == req.assignment.node,
            created=req.created,
            critical=critical,
        )
        return self._hold(holding)

    def _forget_pending(self, obj: JsonObj) -> None:
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        uid = meta.get("uid") if isinstance(meta, dict) else None
        if isinstance(uid, str):
            self._pending_pods.pop(uid, None)

    def unbound_pod(self, uid: str) -> JsonObj | None:
        """The latest object the Pod watch (or list) delivered for pod ``uid`` while it is
        live, not bound to a node, not being deleted and not scheduling-gated (a Binding
        would be refused), else None: what the API server sent, at its
        ``metadata.resourceVersion``, possibly behind the API server by the watch's lag,
        without ``metadata.managedFields``. Shares its other members with the watch: not to
        be changed."""
        kept = self._pending_pods.get(uid)
        return kept[0] if kept is not None else None

    def pending_request(self, pod: JsonObj) -> podapi.GpuRequest | None:
        """This inventory's parse of ``pod`` when the Pod watch holds it unbound
        (:meth:`unbound_pod`) at the same ``metadata.uid`` and ``metadata.resourceVersion``,
        else None. The API server gives one object per version, so that parse is the pod's
        whatever copy ``pod`` is (kube-scheduler's, which lacks ``managedFields``, or the
        watch's own), and a copy at the same version that says otherwise was not written by the
        API server: the parse of what it wrote wins."""
        meta = pod.get("metadata")
        if not isinstance(meta, dict):
            return None
        uid, version = meta.get("uid"), meta.get("resourceVersion")
        if not isinstance(uid, str) or not isinstance(version, str) or not version:
            return None  # no version to match: parse what came in
        kept = self._pending_pods.get(uid)
        if kept is None or kept[0]["metadata"].get("resourceVersion") != version:
            return None
        return kept[1]

    def _note_critical(self, obj: JsonObj) -> bool:
        """Record whether the pod holds a critical role (coordinator, Ray head, rank 0: WeFlex
        §3.4) — for every live pod, GPUs or not, since ``/preempt`` must never accept one as a
        victim. A terminated pod is forgotten. Returns the verdict."""
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        uid = meta.get("uid")
        labels = meta.get("labels")
        critical = (
            isinstance(labels, dict)
            and profiles.is_critical(labels, self._critical_roles)
            and not podapi.is_terminated(obj)
        )
        if isinstance(uid, str) and uid:
            if critical:
                self._critical.add(uid)
            else:
                self._critical.discard(uid)
        return critical

    @property
    def critical_roles(self) -> Mapping[str, frozenset[str]]:
        """Critical roles by framework profile, as this inventory judges pods."""
        return self._critical_roles

    def is_critical(self, uid: str) -> bool:
        """Whether live pod ``uid`` holds a role its framework profile marks critical."""
        return uid in self._critical

    def _upsert_malformed_pod(self, obj: JsonObj, exc: PodSpecError, *, critical: bool) -> str | None:
        """A pod whose flexlease fields are malformed (e.g. ``priority=High``) still holds the
        GPUs of its ``assigned-gpus``: kept as a high-priority holder, never a victim, so a
        label typo never frees GPUs that are in use. Without an assignment it is ignored."""
        self.stats.bad_objects += 1
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        namespace = meta.get("namespace") if isinstance(meta, dict) else None
        uid = meta.get("uid") if isinstance(meta, dict) else None
        assignment = podapi.salvage_assignment(obj)
        log.warning(
            "pod with malformed flexlease fields, ignoring its request but keeping any GPUs it holds: %s",
            exc,
            extra=ctx(pod=f"{namespace}/{name}", gpu=assignment.format() if assignment else None),
        )
        if assignment is None or not isinstance(uid, str) or not uid:
            return None
        spec = obj.get("spec") if isinstance(obj, dict) else None
        node_name = spec.get("nodeName") if isinstance(spec, dict) else None
        created = meta.get("creationTimestamp") if isinstance(meta, dict) else None
        holding = _Holding(
            uid=uid,
            key=f"{namespace}/{name}",
            node=assignment.node,
            indices=assignment.indices,
            low=False,
            priority_value=0,
            bound=node_name == assignment.node,
            created=created if isinstance(created, str) else "",
            critical=critical,
        )
        return self._hold(holding)

    def _hold(self, holding: _Holding) -> str:
        """Record ``holding`` (replacing the pod's previous one) and confirm a matching
        reservation; returns the pod's uid."""
        uid = holding.uid
        old = self._holdings.get(uid)
        if old != holding:
            if old is not None:
                self._release(uid)
            self._holdings[uid] = holding
            self._on_node.setdefault(holding.node, {})[uid] = None
            self._dirty.add(holding.node)
            if not holding.bound:
                self._unbound[uid] = self._clock() + self._ttl
            self._report_conflicts(holding)
        pending = self._reservations.get(uid)
        if pending is not None and pending.node == holding.node and pending.indices == holding.indices:
            del self._reservations[uid]
            self._dirty.add(pending.node)
            self.stats.confirmed += 1
            if not holding.bound:  # our own bind wrote this claim: its TTL starts now
                self._stale.discard(uid)
                self._unbound[uid] = self._clock() + self._ttl
        return uid

    def _report_conflicts(self, holding: _Holding) -> None:
        """Log and count each other pod that claims one of ``holding``'s devices, naming
        which of the two keeps it by the module's rule."""
        mine = set(holding.indices)
        for other_uid in self._on_node.get(holding.node, ()):
            other = self._holdings[other_uid]
            if other_uid == holding.uid or mine.isdisjoint(other.indices):
                continue
            keeps, loses = sorted((holding, other), key=_Holding.order)
            self.stats.claim_conflicts += 1
            log.warning(
                "two pods claim the same GPU; %s keeps it (%s), %s %s",
                keeps.key,
                "bound first" if loses.bound else "bound" if keeps.bound else "claimed first",
                loses.key,
                "keeps its other GPUs" if loses.bound else "loses its claim",
                extra=ctx(
                    pod=holding.key,
                    other=other.key,
                    node=holding.node,
                    gpu=",".join(map(str, sorted(mine.intersection(other.indices)))),
                ),
            )

    def _release(self, uid: str) -> None:
        self._unbound.pop(uid, None)
        self._stale.discard(uid)
        holding = self._holdings.pop(uid, None)
        if holding is None:
            return
        on = self._on_node.get(holding.node)
        if on is not None:
            on.pop(uid, None)
            if not on:
                del self._on_node[holding.node]
        self._dirty.add(holding.node)

    # ------------------------------------------------------------------ assume / forget

    def assume(
        self,
        *,
        uid: str,
        key: str,
        node: str,
        indices: tuple[int, ...],
        low: bool = False,
        priority_value: int = 0,
    ) -> Reservation:
        """Reserve ``indices`` on ``node`` for pod ``uid`` until confirmed, forgotten or expired.

        Call right after choosing the devices from a :meth:`snapshot`, with no ``await`` in
        between. ``low`` and ``priority_value`` describe the pod (as its claim will once the
        watch delivers it), so the confirmation leaves the node's view as it is. With no change
        pending since that snapshot, the devices taken are read from the node's view (built
        from the same claims and reservations) instead of resolving them again. Raises
        :class:`~flexlease.errors.Conflict` when a device is unknown, already held or
        reserved, or the pod already has a reservation.
        """
        self._expire()
        if uid in self._reservations:
            raise Conflict(f"pod {key} already has a reservation on {self._reservations[uid].node}")
        n = self._nodes.get(node)
        if n is None:
            raise Conflict(f"node {node} has no GPUNode")
        view = self._views.get(node) if not self._dirty and self._built_from.get(node) is n else None
        if view is not None:  # current (nothing changed since the last snapshot): its holders
            taken = {d.index: d.holder for d in view.devices if d.holder is not None}
        else:
            taken = self._taken(node)
        for i in indices:
            if i not in n.devices:
                raise Conflict(f"{node} has no GPU {i}")
            if i in taken and taken[i] != uid:
                self.stats.conflicts += 1
                raise Conflict(f"GPU {node}/{i} is already taken by {taken[i]}")
        res = Reservation(
            uid=uid,
            key=key,
            node=node,
            indices=tuple(indices),
            expires=self._clock() + self._ttl,
            low=low,
            priority_value=priority_value,
        )
        self._reservations[uid] = res
        self._dirty.add(node)
        return res

    def renew(self, uid: str) -> bool:
        """Restart ``uid``'s reservation TTL (the binder calls it as each write of a bind
        completes, so the TTL counts from the last write, not from the choice: slow writes
        cannot let the reservation lapse before the watch can confirm it). Returns whether
        there was one (False: already confirmed or forgotten)."""
        res = self._reservations.get(uid)
        if res is None:
            return False
        self._reservations[uid] = replace(res, expires=self._clock() + self._ttl)
        return True

    def forget(self, uid: str) -> bool:
        """Drop ``uid``'s reservation (bind failed). Returns whether there was one."""
        res = self._reservations.pop(uid, None)
        if res is None:
            return False
        self._dirty.add(res.node)
        self.stats.forgotten += 1
        return True

    def reservation(self, uid: str) -> Reservation | None:
        """The pending reservation of pod ``uid``, if any."""
        return self._reservations.get(uid)

    def claimed_nodes(self, uid: str) -> set[str]:
        """Nodes where pod ``uid`` holds or reserves devices (a claim not released): there
        its own devices count as free for it (:func:`extender.scheduling.release_own`)."""
        out: set[str] = set()
        h = self._holdings.get(uid)
        if h is not None and uid not in self._stale:
            out.add(h.node)
        res = self._reservations.get(uid)
        if res is not None:
            out.add(res.node)
        return out

    def holding(self, uid: str) -> Assignment | None:
        """The confirmed assignment of pod ``uid`` as the watch last saw it, if any."""
        h = self._holdings.get(uid)
        return Assignment(h.node, h.indices) if h is not None else None

    def _expire(self) -> None:
        if self._unbound:
            self._expire_unbound_claims()
        if not self._reservations:
            return
        now = self._clock()
        for uid, res in list(self._reservations.items()):
            if res.expires <= now:
                del self._reservations[uid]
                self._dirty.add(res.node)
                self.stats.expired += 1
                log.warning(
                    "reservation expired without confirmation",
                    extra=ctx(pod=res.key, node=res.node, gpu=",".join(map(str, res.indices))),
                )

    def _expire_unbound_claims(self) -> None:
        """Release the claims of pods still unbound past their deadline (rule 2)."""
        now = self._clock()
        for uid, deadline in list(self._unbound.items()):
            if deadline > now or uid in self._reservations:
                continue  # a bind of ours in flight renews its own reservation
            del self._unbound[uid]
            self._stale.add(uid)
            h = self._holdings[uid]
            self._dirty.add(h.node)
            self.stats.claims_released += 1
            log.warning(
                "releasing the GPUs claimed by a pod that stayed unbound past the reservation TTL",
                extra=ctx(pod=h.key, node=h.node, gpu=",".join(map(str, h.indices))),
            )

    # ------------------------------------------------------------------ snapshots

    def _claims(self, node: str) -> dict[str, tuple[int, ...]]:
        """uid → the devices each pod holds on ``node`` after resolving claims by the
        module's rule (winners only; released and losing claims absent)."""
        on = self._on_node.get(node)
        if not on:
            return {}
        holdings = sorted((self._holdings[uid] for uid in on if uid not in self._stale), key=_Holding.order)
        taken: dict[int, str] = {}
        out: dict[str, tuple[int, ...]] = {}
        for h in holdings:
            if h.bound:
                won = tuple(i for i in h.indices if taken.setdefault(i, h.uid) == h.uid)
            elif all(i not in taken for i in h.indices):
                for i in h.indices:
                    taken[i] = h.uid
                won = h.indices
            else:
                continue
            if won:
                out[h.uid] = won
        return out

    def _taken(self, node: str, claims: Mapping[str, tuple[int, ...]] | None = None) -> dict[int, str]:
        """Device index → uid of the pod holding (claims, resolved) or reserving it."""
        if claims is None:
            claims = self._claims(node)
        taken = {i: uid for uid, indices in claims.items() for i in indices}
        for res in self._reservations.values():
            if res.node == node:
                for i in res.indices:
                    taken.setdefault(i, res.uid)
        return taken

    def _build_view(self, n: _Node, current: NodeView | None) -> NodeView:
        """The view of node ``n``; ``current`` is its view now (reused where nothing differs)."""
        claims = self._claims(n.name)
        taken = self._taken(n.name, claims)
        before: Mapping[str, Holder] = current.holders if current is not None else {}
        holders: dict[str, Holder] = {}
        for uid, indices in claims.items():
            h = self._holdings[uid]
            # a bind in flight (or interrupted) is reserved: never a victim
            holders[uid] = _holder(
                before.get(uid), uid, h.key, indices, low=h.low, value=h.priority_value, reserved=not h.bound,
                critical=h.critical,
            )  # fmt: skip
        for res in self._reservations.values():
            if res.node == n.name and res.uid not in holders:
                holders[res.uid] = _holder(
                    before.get(res.uid), res.uid, res.key, res.indices, low=res.low, value=res.priority_value,
                    reserved=True, critical=res.uid in self._critical,
                )  # fmt: skip
        old = current if self._built_from.get(n.name) is n else None
        if old is not None:
            # The GPUNode is the one the current view was built from: only holders can
            # differ. Keep every device whose holder is the same, and the whole view when
            # nothing differs (e.g. the watch confirming a reservation with an equal claim).
            same = True
            kept: list[DeviceView] = []
            for dv in old.devices:
                holder = taken.get(dv.index)
                if dv.holder == holder:
                    kept.append(dv)
                else:
                    dv_new = DeviceView(dv.index, dv.uuid, dv.model, dv.tier, dv.healthy, dv.owner, holder)
                    kept.append(dv_new)
                    same = False
            if same and holders == old.holders:
                return old
            devices = tuple(kept)
        else:
            ror = self._right_of_return
            devices = tuple(
                DeviceView(
                    index=i,
                    uuid=d.uuid,
                    model=d.model,
                    tier=d.tier if ror or d.tier is None else Tier.HA,
                    healthy=d.healthy,
                    owner=d.owner if ror else None,
                    holder=taken.get(i),
                )
                for i, d in sorted(n.devices.items())
            )
        self._built_from[n.name] = n
        self._generation += 1
        return NodeView(
            name=n.name,
            pool=n.pool,
            generation=self._generation,
            devices=devices,
            images=n.images,
            checkpoints=n.checkpoints,
            holders=MappingProxyType(holders),
        )

    def snapshot(self) -> Snapshot:
        """An immutable view of all nodes. Rebuilds only nodes changed since the last call and
        returns the same object when nothing changed (compare ``version``)."""
        self._expire()
        if self._snapshot is not None and not self._dirty:
            return self._snapshot
        changed: set[str] = set()
        moved = False
        views = self._views.mutate()
        for name in self._dirty:
            before = views.get(name)
            n = self._nodes.get(name)
            view = self._build_view(n, before) if n is not None else None
            if n is None:
                self._built_from.pop(name, None)
            if view is before:
                continue
            changed.add(name)
            if view is None:
                del views[name]
            else:
                views[name] = view
            empty: frozenset[str] = frozenset()
            moved |= _move(
                self._tagged,
                name,
                before.owners if before is not None else empty,
                view.owners if view is not None else empty,
            )
            moved |= _move(
                self._cached,
                name,
                before.checkpoints if before is not None else empty,
                view.checkpoints if view is not None else empty,
            )
        if moved:
            self._indexes = (MappingProxyType(dict(self._tagged)), MappingProxyType(dict(self._cached)))
        self._dirty.clear()
        if self._snapshot is not None and not changed:
            return self._snapshot  # every change cancelled out: the same views
        self._views = views.finish()
        self._version += 1
        self._changelog.append((self._version, frozenset(changed)))
        self._snapshot = Snapshot(self._version, self._views, *self._indexes)
        return self._snapshot

    def changed_since(self, version: int) -> set[str] | None:
        """Names of nodes whose view changed (or vanished) between snapshot ``version`` and
        the latest snapshot; None when that version is older than the change log keeps."""
        latest = self._version
        if version == latest:
            return set()
        if version > latest or not self._changelog or self._changelog[0][0] > version + 1:
            return None
        out: set[str] = set()
        for v, names in reversed(self._changelog):
            if v <= version:
                break
            out |= names
        return out

    # ------------------------------------------------------------------ gauges

    def device_counts(self) -> list[DeviceCount]:
        """Devices by (pool, state, tier, model), plus ``lent`` (tagged) devices by pool, tier
        and model. Reads the current state; meant for a Prometheus collector at scrape time."""
        counts: Counter[tuple[str, str, str, str]] = Counter()
        for name, n in self._nodes.items():
            taken = self._taken(name) if name in self._on_node or self._reservations else {}
            pool = n.pool.value
            for i, d in n.devices.items():
                tier = d.tier.value if d.tier is not None else "unknown"
                if not d.healthy:
                    state = "unhealthy"
                elif i in taken:
                    state = "used"
                else:
                    state = "free"
                counts[(pool, state, tier, d.model)] += 1
                if d.owner is not None:
                    counts[(pool, "lent", tier, d.model)] += 1
        return [DeviceCount(p, s, t, m, c) for (p, s, t, m), c in sorted(counts.items())]

    def summary(self) -> dict[str, Any]:
        """Sizes for logs and ``/readyz``: nodes, devices, holding pods, reservations."""
        return {
            "nodes": len(self._nodes),
            "devices": sum(len(n.devices) for n in self._nodes.values()),
            "pods": len(self._holdings),
            "reservations": len(self._reservations),
        }


def _move(index: dict[str, frozenset[str]], name: str, old: frozenset[str], new: frozenset[str]) -> bool:
    """Move node ``name`` in ``index`` (key → nodes) from keys ``old`` to keys ``new``;
    whether anything moved."""
    if old == new:
        return False
    for key in old - new:
        rest = index[key] - {name}
        if rest:
            index[key] = rest
        else:
            del index[key]
    for key in new - old:
        index[key] = index.get(key, frozenset()) | {name}
    return True
