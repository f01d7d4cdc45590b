"""The pods bound to this node with an assignment, and what kubelet allocated to them.

Fed by a pod watch (``spec.nodeName`` = this node) and by the device plugin's ``Allocate``
answers and the PodResources read-back; read by the matching in
:mod:`nodeagent.deviceplugin.matching`. A pod's device IDs come from its
``flexlease.io/assigned-gpus`` indices, each turned into the UUID this node's NVML reports
for that index (the agent's own inventory); ``assigned-uuids`` is used only for an index the
agent has not enumerated (NVML not up yet). Runs on the event loop; no locks needed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from flexlease.api import keys
from flexlease.api.pod import Assignment, salvage_assignment
from flexlease.logging import ctx
from flexlease.store.base import EventType, JsonObj, WatchEvent
from nodeagent.deviceplugin.matching import PendingPod

log = logging.getLogger(__name__)

UuidOf = Callable[[int], str | None]
"""NVML index → UUID on this node (None when not enumerated)."""


@dataclass(slots=True)
class _Entry:
    key: str
    uid: str
    assignment: Assignment
    annotated_uuids: tuple[str, ...]
    seq: int
    allocated: frozenset[str] = frozenset()


def _key(obj: JsonObj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


class PodBook:
    """This node's assigned pods (``node``), by ``<namespace>/<name>``; ``uuid_of`` maps an
    NVML index to the UUID on this node. :meth:`changed` gives an event set at the next
    change."""

    def __init__(self, node: str, uuid_of: UuidOf) -> None:
        self.node = node
        self._uuid_of = uuid_of
        self._pods: dict[str, _Entry] = {}
        self._seq = 0
        self._changed = asyncio.Event()

    def changed(self) -> asyncio.Event:
        """An event that is set at the next change (a fresh one after each change)."""
        return self._changed

    def _touch(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- the pod watch ------------------------------------------------------------------

    async def on_event(self, event: WatchEvent) -> None:
        """Informer handler: record, update or drop one pod."""
        self.apply(event)

    def apply(self, event: WatchEvent) -> None:
        """Apply one watch event (DELETED, a terminated pod, or one without an assignment on
        this node drops the pod)."""
        if event.type is EventType.BOOKMARK:
            return
        obj = event.object
        key = _key(obj)
        assignment = None if event.type is EventType.DELETED else salvage_assignment(obj)
        if assignment is None or assignment.node != self.node:
            if self._pods.pop(key, None) is not None:
                self._touch()
            return
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        raw = (meta.get("annotations") or {}).get(keys.ANN_ASSIGNED_UUIDS)
        uuids = tuple(u for u in raw.split(",") if u) if isinstance(raw, str) else ()
        old = self._pods.get(key)
        if old is not None and old.uid == uid:
            if old.assignment != assignment or old.annotated_uuids != uuids:
                old.assignment, old.annotated_uuids = assignment, uuids
                self._touch()
            return
        self._seq += 1
        self._pods[key] = _Entry(key, uid, assignment, uuids, self._seq)
        self._touch()

    # -- what kubelet did ---------------------------------------------------------------

    def record_allocation(self, key: str, devices: Iterable[str]) -> None:
        """kubelet allocated ``devices`` to pod ``key`` (an ``Allocate`` answered for it)."""
        entry = self._pods.get(key)
        if entry is not None:
            entry.allocated = entry.allocated | frozenset(devices)
            self._touch()

    def set_allocated(self, actual: Mapping[str, frozenset[str]]) -> None:
        """What PodResources ``List`` shows each pod holds (the truth): replaces the recorded
        allocation of every pod named in ``actual``."""
        for key, devices in actual.items():
            entry = self._pods.get(key)
            if entry is not None and entry.allocated != devices:
                entry.allocated = devices
                self._touch()

    # -- readers ------------------------------------------------------------------------

    def uuids(self, key: str) -> tuple[str, ...] | None:
        """The assigned device IDs of pod ``key`` in assignment order, or None."""
        entry = self._pods.get(key)
        return None if entry is None else self._uuids(entry)

    def _uuids(self, entry: _Entry) -> tuple[str, ...]:
        out: list[str] = []
        for pos, index in enumerate(entry.assignment.indices):
            uuid = self._uuid_of(index)
            if uuid is None and pos < len(entry.annotated_uuids):
                uuid = entry.annotated_uuids[pos]
            if uuid is None:
                log.debug(
                    "assigned GPU unknown on this node",
                    extra=ctx(pod=entry.key, node=self.node, gpu=index),
                )
                continue
            if pos < len(entry.annotated_uuids) and entry.annotated_uuids[pos] != uuid:
                log.debug(
                    "assigned-uuids disagrees with NVML; using NVML's UUID",
                    extra=ctx(pod=entry.key, node=self.node, gpu=index, annotated=entry.annotated_uuids[pos]),
                )
            out.append(uuid)
        return tuple(out)

    def pending(self) -> list[PendingPod]:
        """Every pod with an assignment here, as matching input (allocated ones included:
        matching uses ``remaining``; :func:`~nodeagent.deviceplugin.matching.allocated_pod`
        needs them all)."""
        return [
            PendingPod(key=e.key, uid=e.uid, uuids=self._uuids(e), allocated=e.allocated, seq=e.seq)
            for e in self._pods.values()
        ]
