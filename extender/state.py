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

Neighbours: fed by the watch loops in :mod:`extender.server`; read by
:mod:`extender.scheduling` (through snapshots) and :mod:`extender.metrics` (gauges).
Pure bookkeeping, no I/O and no asyncio.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Final

from pydantic import ValidationError

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
    uid: str
    key: str
    node: str
    indices: tuple[int, ...]
    low: bool
    priority_value: int


@dataclass(frozen=True, slots=True)
class DeviceCount:
    """Inventory gauge sample: ``count`` devices of ``model`` at ``tier`` (``"unknown"``
    when unreported) in ``state`` (``free``, ``used``, ``unhealthy``); ``lent`` counts
    devices tagged with an owner (lent by an online job), whatever their state."""

    state: str
    tier: str
    model: str
    count: int


@dataclass(slots=True)
class _Listed:
    nodes: bool = False
    pods: bool = False


@dataclass(slots=True)
class InventoryStats:
    """Counters the metrics module reads: confirmations, expiries, bad objects ignored."""

    confirmed: int = 0
    expired: int = 0
    forgotten: int = 0
    bad_objects: int = 0
    conflicts: int = 0


class Inventory:
    """Devices, tags, tiers, health and assignments, fed by watch events.

    ``gpu_resource``: the extended resource name pods request (``nvidia.com/gpu``).
    ``reservation_ttl_seconds``: how long an assumed bind waits for the watch to confirm.
    ``clock``: monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        *,
        gpu_resource: str = DEFAULT_GPU_RESOURCE,
        reservation_ttl_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._resource = gpu_resource
        self._ttl = reservation_ttl_seconds
        self._clock = clock
        self._nodes: dict[str, _Node] = {}
        self._holdings: dict[str, _Holding] = {}
        self._on_node: dict[str, dict[str, None]] = {}
        self._reservations: dict[str, Reservation] = {}
        self._views: dict[str, NodeView] = {}
        self._dirty: set[str] = set()
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
            self._release(uid)
            res = self._reservations.pop(uid, None)
            if res is not None:
                self._dirty.add(res.node)
            return
        self._upsert_pod(event.object)

    def _upsert_pod(self, obj: JsonObj) -> str | None:
        try:
            req = podapi.parse_pod(obj, self._resource)
        except PodSpecError as exc:
            return self._upsert_malformed_pod(obj, exc)
        uid = req.uid or req.key
        if req.assignment is None or req.terminated:
            self._release(uid)
            return uid
        spec = obj.get("spec") or {}
        raw_prio = spec.get("priority") if isinstance(spec, dict) else None
        holding = _Holding(
            uid=uid,
            key=req.key,
            node=req.assignment.node,
            indices=req.assignment.indices,
            low=req.priority is Priority.LOW,
            priority_value=raw_prio if isinstance(raw_prio, int) else 0,
        )
        return self._hold(holding)

    def _upsert_malformed_pod(self, obj: JsonObj, exc: PodSpecError) -> str | None:
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
        holding = _Holding(
            uid=uid,
            key=f"{namespace}/{name}",
            node=assignment.node,
            indices=assignment.indices,
            low=False,
            priority_value=0,
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
        pending = self._reservations.get(uid)
        if pending is not None and pending.node == holding.node and pending.indices == holding.indices:
            del self._reservations[uid]
            self._dirty.add(pending.node)
            self.stats.confirmed += 1
        return uid

    def _release(self, uid: str) -> None:
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

    def assume(self, *, uid: str, key: str, node: str, indices: tuple[int, ...]) -> Reservation:
        """Reserve ``indices`` on ``node`` for pod ``uid`` until confirmed, forgotten or expired.

        Call right after choosing the devices from a :meth:`snapshot`, with no ``await`` in
        between. Raises :class:`~flexlease.errors.Conflict` when a device is unknown, already
        held or reserved, or the pod already has a reservation.
        """
        self._expire()
        if uid in self._reservations:
            raise Conflict(f"pod {key} already has a reservation on {self._reservations[uid].node}")
        n = self._nodes.get(node)
        if n is None:
            raise Conflict(f"node {node} has no GPUNode")
        taken = self._taken(node)
        for i in indices:
            if i not in n.devices:
                raise Conflict(f"{node} has no GPU {i}")
            if i in taken and taken[i] != uid:
                self.stats.conflicts += 1
                raise Conflict(f"GPU {node}/{i} is already taken by {taken[i]}")
        res = Reservation(
            uid=uid, key=key, node=node, indices=tuple(indices), expires=self._clock() + self._ttl
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

    def holding(self, uid: str) -> Assignment | None:
        """The confirmed assignment of pod ``uid`` as the watch last saw it, if any."""
        h = self._holdings.get(uid)
        return Assignment(h.node, h.indices) if h is not None else None

    def _expire(self) -> None:
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

    # ------------------------------------------------------------------ snapshots

    def _taken(self, node: str) -> dict[int, str]:
        taken: dict[int, str] = {}
        for uid in self._on_node.get(node, ()):
            for i in self._holdings[uid].indices:
                taken.setdefault(i, uid)
        for res in self._reservations.values():
            if res.node == node:
                for i in res.indices:
                    taken.setdefault(i, res.uid)
        return taken

    def _build_view(self, n: _Node) -> NodeView:
        taken = self._taken(n.name)
        holders: dict[str, Holder] = {}
        for uid in self._on_node.get(n.name, ()):
            h = self._holdings[uid]
            holders[uid] = Holder(
                uid=uid, key=h.key, indices=h.indices, low=h.low, priority_value=h.priority_value
            )
        for res in self._reservations.values():
            if res.node == n.name:
                holders[res.uid] = Holder(
                    uid=res.uid, key=res.key, indices=res.indices, low=False, reserved=True
                )
        devices = tuple(
            DeviceView(
                index=i,
                uuid=d.uuid,
                model=d.model,
                tier=d.tier,
                healthy=d.healthy,
                owner=d.owner,
                holder=taken.get(i),
            )
            for i, d in sorted(n.devices.items())
        )
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
        for name in self._dirty:
            n = self._nodes.get(name)
            if n is None:
                self._views.pop(name, None)
            else:
                self._views[name] = self._build_view(n)
        self._version += 1
        self._changelog.append((self._version, frozenset(self._dirty)))
        self._dirty.clear()
        self._snapshot = Snapshot(self._version, MappingProxyType(dict(self._views)))
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
        """Devices by (state, tier, model), plus ``lent`` (tagged) devices by tier and model.
        Reads the current state; meant for a Prometheus collector at scrape time."""
        counts: Counter[tuple[str, str, str]] = Counter()
        for name, n in self._nodes.items():
            taken = self._taken(name) if name in self._on_node or self._reservations else {}
            for i, d in n.devices.items():
                tier = d.tier.value if d.tier is not None else "unknown"
                if not d.healthy:
                    state = "unhealthy"
                elif i in taken:
                    state = "used"
                else:
                    state = "free"
                counts[(state, tier, d.model)] += 1
                if d.owner is not None:
                    counts[("lent", tier, d.model)] += 1
        return [DeviceCount(s, t, m, c) for (s, t, m), c in sorted(counts.items())]

    def summary(self) -> dict[str, Any]:
        """Sizes for logs and ``/readyz``: nodes, devices, holding pods, reservations."""
        return {
            "nodes": len(self._nodes),
            "devices": sum(len(n.devices) for n in self._nodes.values()),
            "pods": len(self._holdings),
            "reservations": len(self._reservations),
        }
