"""Keeps a job's readiness snapshot current (WeFlex §3.4 "continuous instance state
monitoring"): one list+watch of Pods per role, each filtered server-side by the job's labels
(``flexlease.io/owner=<ns>/<job>``, ``flexlease.io/role=<role>``), through
:class:`flexlease.store.informer.Informer` (so a 410 Gone re-lists and store errors back off).
Every change produces a new immutable :class:`~extender.orchestrator.snapshot.Snapshot` with
a higher ``version`` and wakes whoever waits for one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping

from extender.orchestrator.profile import Role
from extender.orchestrator.snapshot import PodState, Snapshot, pod_state
from flexlease import tasks
from flexlease.api import keys
from flexlease.api.pod import owner_label_value
from flexlease.clock import Clock
from flexlease.logging import ctx
from flexlease.store.base import EventType, Kind, Selector, Store, WatchEvent
from flexlease.store.informer import Handler, Informer

log = logging.getLogger(__name__)


class ReadinessWatch:
    """The readiness snapshot of one job's pods, kept from watches filtered by role labels.

    In: a store, the job's namespace and owner (``<ns>/<job>``, or the bare ``flexlease.io/owner``
    label value ``<job>``: pods are selected by the label value, which cannot hold ``/``), the
    profile's roles. Use ``async with watch.running():``; read :meth:`latest`, or wait for a
    change with :meth:`wait_newer`."""

    def __init__(self, store: Store, *, namespace: str, owner: str, roles: Mapping[str, Role]) -> None:
        self._store = store
        self._namespace = namespace
        self._owner = owner
        self._roles = dict(roles)
        self._pods: dict[str, dict[str, PodState]] = {r: {} for r in roles}
        self._listed: set[str] = set()
        self._snapshot = Snapshot()
        self._waiters: set[asyncio.Event] = set()

    def latest(self) -> Snapshot:
        """The newest snapshot (version 0 before anything was listed)."""
        return self._snapshot

    async def wait_newer(self, version: int, *, clock: Clock, within: float | None) -> Snapshot:
        """Return the latest snapshot once its version exceeds ``version``, or once ``within``
        seconds of ``clock`` time passed (None: no limit) — check the version to tell which."""
        if self._snapshot.version > version:
            return self._snapshot
        event = asyncio.Event()
        self._waiters.add(event)
        try:
            await clock.wait(event, within)
        finally:
            self._waiters.discard(event)
        return self._snapshot

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ReadinessWatch]:
        """Run one informer per role (tasks named ``orchestrator-watch/<owner>/<role>``) for the
        duration of the block; cancelled and awaited on exit."""
        watching: list[asyncio.Task[None]] = []
        for role in self._roles:
            informer = Informer(
                self._store,
                Kind.POD,
                handler=self._on_event(role),
                namespace=self._namespace,
                selector=Selector(
                    labels={keys.LABEL_OWNER: owner_label_value(self._owner), keys.LABEL_ROLE: role}
                ),
                name=f"orchestrator-watch/{self._owner}/{role}",
            )
            watching.append(asyncio.create_task(informer.run(), name=informer.name))
            watching.append(
                asyncio.create_task(self._mark_listed(role, informer), name=f"{informer.name}/listed")
            )
        try:
            yield self
        finally:
            await tasks.stop(*watching)

    def _on_event(self, role: str) -> Handler:
        async def handle(event: WatchEvent) -> None:
            state = pod_state(event.object, container=self._roles[role].container)
            if event.type is EventType.DELETED:
                self._pods[role].pop(state.name, None)
            else:
                self._pods[role][state.name] = state
            self._publish()

        return handle

    async def _mark_listed(self, role: str, informer: Informer) -> None:
        await informer.listed.wait()
        self._listed.add(role)
        log.debug("role listed", extra=ctx(owner=self._owner, role=role, pods=len(self._pods[role])))
        self._publish()

    def _publish(self) -> None:
        self._snapshot = Snapshot(
            version=self._snapshot.version + 1,
            pods={r: tuple(sorted(p.values(), key=lambda s: s.name)) for r, p in self._pods.items()},
            listed=frozenset(self._listed),
        )
        for event in self._waiters:
            event.set()
