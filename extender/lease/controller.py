"""The lease controller: reconciles GPULeases, right-of-return tags and the standby pool.

Layout (kopf / OpenKruise style): three :class:`~extender.lease.mirror.Mirror` s (store
informers for GPULease, GPUNode, Pod) only enqueue keys; one worker takes keys from a
:class:`~extender.lease.workqueue.WorkQueue` and reconciles them, level-triggered:

* ``lease/<ns>/<name>``: GET the lease fresh, plan with :mod:`extender.lease.planner` from the
  mirrors' GPUNodes and pods, then write — the lend baseline annotation, the status (phase,
  lent, reclaimed, supplementedFromStandby, preemptedPods, message, conditions), GPUNode tags,
  ``preempt-deadline`` notices, evictions — and Events. Status writes carry the lease's
  resourceVersion; GPUNode and pod writes carry theirs; a ``Conflict`` re-reads and retries
  (RetryOnConflict), anything else backs off per key. Grace periods requeue the key at their
  deadline; a PodDisruptionBudget refusal (``TooManyRequests``) requeues after its
  Retry-After (or ``eviction_retry_seconds``) and is reported in the status, a Warning Event
  and ``flexlease_lease_evictions_refused_total``.

  Event reasons: on the lease ``LendStarted``, ``LendDone``, ``ReclaimStarted``,
  ``ReclaimDone``, ``LendFailed``/``ReclaimFailed``, ``LendCancelled``/``ReclaimCancelled``
  (superseded by a newer lease of the owner), ``Supplemented``, ``StandbyShortfall``,
  ``Unrecoverable``, ``EvictionBlocked``, ``InvalidSpec``; on pods ``PreemptNotice``,
  ``EvictionBlocked``, ``Preempted``; on GPUNodes ``StandbyPool``. A lease change also
  enqueues the other open leases (one may now be superseded, or stop waiting).

  The interface for writers of GPULeases (operators, the lease autopilot): create a Lend
  (``devices`` released, or ``count`` before the pods go) and a Reclaim (``count`` or
  ``devices``); never edit one; read ``status.phase`` (final: Done, Failed, Cancelled) and the
  per-device lists. An owner's leases are ordered by ``creationTimestamp`` then name (name
  them so that, within one second, the newer sorts last), and the newest wins (see
  :mod:`extender.lease.planner`, "Overlap").
* ``cluster``: release the tags of GPUs their owner's pods hold again, give critical
  ReplicaSet pods the highest ``controller.kubernetes.io/pod-deletion-cost``
  (:mod:`extender.lease.deletion_cost`), keep the standby pool at ``standby_pool_size``
  (:func:`extender.lease.planner.plan_standby`), refresh gauges.

Everything the controller knows is in the objects (lease status and annotations, GPUNode
tags, pod annotations), so a restarted controller picks up any lease mid-reclaim. Every
key is also enqueued every ``resync_seconds``. Time comes from the injected clock.

Entry points: :func:`cleanup_ctx` (an aiohttp cleanup context; the extender's wiring),
:func:`run` / :func:`serve` (until cancelled, leader-elected when ``leader_election`` is on),
:class:`LeaseController` (``run``, ``ready``, ``reconcile``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import datetime
from typing import Any, Final

from aiohttp import web
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from extender import tasks
from extender.lease import deletion_cost, planner, standby
from extender.lease.events import ObjectRef, event_object
from extender.lease.ledger import FINISHED, Ledger, owner_ledger
from extender.lease.metrics import Gauges, LeaseMetrics
from extender.lease.mirror import Mirror
from extender.lease.planner import EventType, LeasePlan, TagChange
from extender.lease.view import (
    ClusterView,
    Holder,
    IncrementalView,
    read_holder,
    salvaged_holder,
)
from extender.lease.workqueue import WorkQueue, warn_and_retry
from extender.orchestrator import profile as profiles
from flexlease.api import keys
from flexlease.api.resources import (
    GPULease,
    GPUNode,
    LeaseAction,
    LeasePhase,
    parse_gpulease,
    parse_gpunode,
)
from flexlease.clock import Clock, SystemClock, format_time
from flexlease.config import Settings
from flexlease.errors import Conflict, NotFound, PodSpecError, TooManyRequests
from flexlease.logging import ctx
from flexlease.store.base import EventType as WatchType
from flexlease.store.base import JsonObj, Kind, Store
from flexlease.store.informer import object_key
from flexlease.store.leader import LeaderElector, run_leader_only

log = logging.getLogger(__name__)

CLUSTER_KEY: Final = "cluster"
LEASE_PREFIX: Final = "lease/"
CONFLICT_RETRIES: Final = 5


def lease_key(namespace: str, name: str) -> str:
    """The work-queue key of a GPULease: ``lease/<namespace>/<name>``."""
    return f"{LEASE_PREFIX}{namespace}/{name}"


def _meta(obj: JsonObj) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


class LeaseController:
    """Reconciles GPULeases against the store (see the module docstring).

    ``settings``: the root settings (``settings.lease`` and ``settings.extender.gpu_resource``
    are read). ``registry``: where the ``flexlease_lease_*`` metrics are registered.
    ``clock``: time for grace periods, back-offs and resyncs (default: the system clock).
    ``instance``: ``reportingInstance`` of Events (default: the host name).
    """

    def __init__(
        self,
        settings: Settings,
        store: Store,
        *,
        registry: CollectorRegistry,
        clock: Clock | None = None,
        instance: str | None = None,
    ) -> None:
        self._settings = settings.lease
        self._resource = settings.extender.gpu_resource
        self._right_of_return = settings.extender.right_of_return
        self._critical = profiles.critical_for(settings.orchestrator.profile_dirs)
        """Critical roles by framework: their pods are never noticed or evicted (WeFlex §3.4)."""
        self._store = store
        self._clock: Clock = clock or SystemClock()
        self._cluster_at: float | None = None
        """Clock time of the last cluster reconcile (``lease.cluster_min_interval_seconds``)."""
        self._instance = instance or socket.gethostname()
        self.metrics = LeaseMetrics(registry)
        self._queue = WorkQueue(
            self._clock,
            base_delay=self._settings.retry_base_seconds,
            max_delay=self._settings.retry_max_seconds,
        )
        self._warn = warn_and_retry("reconcile", quiet=Conflict, logger=log)
        self._leases = Mirror(store, Kind.GPULEASE, on_change=self._lease_changed)
        self._nodes = Mirror(store, Kind.GPUNODE, on_change=self._world_changed)
        self._pods = Mirror(store, Kind.POD, on_change=self._pod_changed)
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._blocked: dict[str, dict[str, str]] = {}
        """lease key → pod key → message of the last PodDisruptionBudget refusal."""
        self._parsed_nodes: dict[str, tuple[str, GPUNode | None]] = {}
        self._parsed_pods: dict[str, tuple[str, Holder | None, str | None]] = {}
        self._cost_due: set[tuple[str, str]] = set()
        """(namespace, name) of the mirrored pods that need the highest deletion cost
        (:func:`~extender.lease.deletion_cost.needs_cost`), kept up to date as the pod mirror
        changes, so :meth:`_protect_critical` reads those pods, not every pod."""
        self._parsed_lease_cache: dict[str, tuple[str, GPULease | None]] = {}
        self._cluster = IncrementalView()
        self._open_leases: tuple[int, list[str]] | None = None
        self._shortfalls: tuple[int, list[standby.Shortfall]] | None = None
        """The lease mirror's generation and the Done Reclaims' shortfalls then (adaptive pool)."""
        self._targets: dict[str, standby.Target] = {}
        """The adaptive pool's last targets (only to log a change)."""
        self._ledger_cache: tuple[tuple[int, str, str], Ledger] | None = None
        """The lease mirror's generation, owner and excluded lease, and :meth:`_ledger` then."""
        """The lease mirror's generation and :meth:`_open_lease_keys` then."""
        """GPUNodes and pods holding GPUs, fed from the mirrors' changes (:meth:`view`)."""

    # ------------------------------------------------------------------ lifecycle

    @property
    def ready(self) -> bool:
        """True once GPULeases, GPUNodes and Pods have each been listed."""
        return all(m.listed.is_set() for m in (self._leases, self._nodes, self._pods))

    @property
    def idle(self) -> bool:
        """No key ready or being reconciled (a simulation steps time only when this holds
        and the store's watches have delivered everything)."""
        return self._queue.idle

    @property
    def settled(self) -> bool:
        """:attr:`idle`, or paused with no reconcile under way (keys may wait for
        :meth:`resume`)."""
        return self._queue.idle or (self.paused and self._queue.active == 0)

    @property
    def paused(self) -> bool:
        """True between :meth:`pause` and :meth:`resume`."""
        return not self._resumed.is_set()

    def pause(self) -> None:
        """Take no new key until :meth:`resume` (keys keep queueing; a reconcile under way
        finishes). The simulator pauses the controller for a scheduling round, so that its
        reconciles fall between rounds instead of between HTTP calls at timing-dependent
        points."""
        self._resumed.clear()

    def resume(self) -> None:
        """Take keys again."""
        self._resumed.set()

    async def run(self) -> None:
        """Watch and reconcile until cancelled (named tasks in one TaskGroup)."""
        log.info(
            "lease controller starting",
            extra=ctx(
                standby_mode=self._settings.standby.mode, standby_pool_size=self._settings.standby_pool_size
            ),
        )
        self._enqueue_world()  # after a restart of run() (leadership regained) look at everything
        async with asyncio.TaskGroup() as group:
            for mirror in (self._leases, self._nodes, self._pods):
                group.create_task(mirror.run(), name=f"lease-mirror-{mirror.kind.value}")
            group.create_task(self._resync(), name="lease-resync")
            group.create_task(self._work(), name="lease-worker")

    async def _resync(self) -> None:
        tick = asyncio.Event()
        while True:
            tick.clear()
            await self._clock.wait(tick, self._settings.resync_seconds)
            self._enqueue_world()

    async def _work(self) -> None:
        while True:
            await self._resumed.wait()
            await self._queue.process_next(self.reconcile, on_error=self._failed, admit=self._resumed.is_set)

    def _failed(self, key: str, exc: Exception, backoff: float) -> None:
        self.metrics.reconcile_errors.labels(kind="cluster" if key == CLUSTER_KEY else "lease").inc()
        self._warn(key, exc, backoff)

    # ------------------------------------------------------------------ triggers

    def _lease_changed(self, type: WatchType, obj: JsonObj) -> None:
        meta = _meta(obj)
        key = lease_key(str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if type is WatchType.DELETED:
            self._blocked.pop(key, None)
        self._queue.add(key)
        # the owner's other open leases may now be superseded, or stop waiting for this one
        self._enqueue_world()  # (and the gauges count outstanding reclaims)

    def _world_changed(self, type: WatchType, obj: JsonObj) -> None:
        self._enqueue_world()

    def _pod_changed(self, type: WatchType, obj: JsonObj) -> None:
        due = self._note_cost(object_key(obj))
        if keys.ANN_ASSIGNED_GPUS in (_meta(obj).get("annotations") or {}):
            self._enqueue_world()
        elif due:
            self._queue.add(CLUSTER_KEY)

    def _put_pod(self, obj: JsonObj) -> None:
        """Remember the pod ``obj`` one of the controller's own calls returned (:meth:`Mirror.put`)."""
        self._pods.put(obj)
        self._note_cost(object_key(obj))

    def _note_cost(self, key: tuple[str, str]) -> bool:
        """Keep :attr:`_cost_due` right for the pod ``key`` (namespace, name) as the mirror has
        it now; True when it needs the highest deletion cost."""
        pod = self._pods.current(key[0], key[1])
        if pod is not None and deletion_cost.needs_cost(pod, self._critical):
            self._cost_due.add(key)
            return True
        self._cost_due.discard(key)
        return False

    def _enqueue_world(self) -> None:
        self._queue.add(CLUSTER_KEY)
        for key in self._open_lease_keys():
            self._queue.add(key)

    def _open_lease_keys(self) -> list[str]:
        """Keys of the leases not Done or Failed, in the lease mirror's order; kept until
        that mirror changes (every pod change asks, leases change rarely)."""
        generation = self._leases.generation
        if self._open_leases is None or self._open_leases[0] != generation:
            open_keys: list[str] = []
            for obj in self._leases.values():
                status = obj.get("status") or {}
                if not isinstance(status, dict) or status.get("phase") not in FINISHED:
                    meta = _meta(obj)
                    open_keys.append(lease_key(str(meta.get("namespace") or ""), str(meta.get("name") or "")))
            self._open_leases = (generation, open_keys)
        return self._open_leases[1]

    # ------------------------------------------------------------------ reading

    def _gpunode(self, name: str, obj: JsonObj | None) -> GPUNode | None:
        """The GPUNode ``obj`` parsed (memoised per resourceVersion); None when gone or
        invalid (logged)."""
        if obj is None:
            self._parsed_nodes.pop(name, None)
            return None
        version = str(_meta(obj).get("resourceVersion") or "")
        cached = self._parsed_nodes.get(name)
        if cached is None or cached[0] != version:
            try:
                node: GPUNode | None = parse_gpunode(obj)
            except ValidationError as exc:
                log.warning("GPUNode skipped: invalid", extra=ctx(node=name, error=str(exc)))
                node = None
            cached = (version, node)
            self._parsed_nodes[name] = cached
        return cached[1]

    def _holder(self, key: str, obj: JsonObj | None) -> tuple[Holder | None, str | None]:
        """The pod ``obj`` as a holder of GPUs and its problem line (memoised per
        resourceVersion); (None, None) when gone or holding nothing."""
        if obj is None:
            self._parsed_pods.pop(key, None)
            return None, None
        version = str(_meta(obj).get("resourceVersion") or "")
        cached = self._parsed_pods.get(key)
        if cached is None or cached[0] != version:
            try:
                cached = (version, read_holder(obj, self._resource, critical=self._critical), None)
            except PodSpecError as exc:
                problem = f"pod {key} malformed, kept only as holder of its GPUs: {exc}"
                cached = (version, salvaged_holder(obj), problem)
            self._parsed_pods[key] = cached
        return cached[1], cached[2]

    def view(self) -> ClusterView:
        """The cluster as the mirrors hold it now: the objects delivered or written since the
        last view are parsed (unless their resourceVersion was parsed before) and only their
        nodes rebuilt (:class:`~extender.lease.view.IncrementalView`)."""
        for namespace, name in sorted(self._nodes.take_changed()):
            self._cluster.set_node(name, self._gpunode(name, self._nodes.current(namespace or None, name)))
        for namespace, name in sorted(self._pods.take_changed()):
            key = f"{namespace}/{name}"
            holder, problem = self._holder(key, self._pods.current(namespace, name))
            self._cluster.set_pod(key, holder, problem=problem)
        view = self._cluster.view()
        for problem in view.problems:
            log.debug("view: %s", problem)
        return view

    def _ledger(self, owner: str, *, exclude: str) -> Ledger:
        """:func:`~extender.lease.ledger.owner_ledger` of the mirrored leases, kept until the
        lease mirror changes (an open Reclaim is reconciled after every pod change; its
        owner's history only grows)."""
        mark = (self._leases.generation, owner, exclude)
        if self._ledger_cache is None or self._ledger_cache[0] != mark:
            self._ledger_cache = (mark, owner_ledger(self._parsed_leases(), owner, exclude=exclude))
        return self._ledger_cache[1]

    def _parsed_leases(self, objects: list[JsonObj] | None = None) -> list[GPULease]:
        """The GPULeases (``objects``, default: the mirror's now) parsed, memoised per
        resourceVersion; invalid ones left out."""
        out: list[GPULease] = []
        seen: set[str] = set()
        for obj in self._leases.values() if objects is None else objects:
            meta = _meta(obj)
            key = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
            version = str(meta.get("resourceVersion") or "")
            seen.add(key)
            cached = self._parsed_lease_cache.get(key)
            if cached is None or cached[0] != version:
                try:
                    cached = (version, parse_gpulease(obj))
                except ValidationError:
                    cached = (version, None)  # its own reconcile reports it as Failed
                self._parsed_lease_cache[key] = cached
            if cached[1] is not None:
                out.append(cached[1])
        for key in set(self._parsed_lease_cache) - seen:
            del self._parsed_lease_cache[key]
        return out

    # ------------------------------------------------------------------ reconcile

    async def reconcile(self, key: str) -> float | None:
        """Reconcile one key (``cluster`` or ``lease/<ns>/<name>``) once; returns seconds
        until it wants to be reconciled again (None: only on change). Retries conflicts
        ``CONFLICT_RETRIES`` times after a fresh GET, then raises ``Conflict``; raises other
        ``StoreError`` s for the caller's back-off. Raises ``ValueError`` on an unknown key."""
        if key == CLUSTER_KEY:
            floor = self._settings.cluster_min_interval_seconds
            now = self._clock.now()
            if self._cluster_at is not None and now < self._cluster_at + floor:
                return self._cluster_at + floor - now  # asked again too soon: once, then
            self._cluster_at = now
            await self._reconcile_cluster()
            return None
        if not key.startswith(LEASE_PREFIX) or key.count("/") != 2:
            raise ValueError(f"unknown work-queue key {key!r}")
        namespace, name = key[len(LEASE_PREFIX) :].split("/")
        for attempt in range(CONFLICT_RETRIES):
            try:
                return await self._reconcile_lease(namespace, name, key=key)
            except Conflict:
                if attempt == CONFLICT_RETRIES - 1:
                    raise
        return None  # unreachable

    async def _reconcile_lease(self, namespace: str, name: str, *, key: str) -> float | None:
        try:
            raw = await self._store.get(Kind.GPULEASE, name, namespace=namespace)
        except NotFound:
            self._blocked.pop(key, None)
            return None
        self._leases.put(raw)
        version = str(_meta(raw).get("resourceVersion") or "")
        cached = self._parsed_lease_cache.get(f"{namespace}/{name}")
        if cached is not None and cached[0] == version and cached[1] is not None:
            lease = cached[1]  # parsed at this resourceVersion already
        else:
            try:
                lease = parse_gpulease(raw)
            except ValidationError as exc:
                await self._reject(raw, namespace=namespace, name=name, version=version, exc=exc)
                return None
        if lease.status.phase in FINISHED:
            self._blocked.pop(key, None)
            return None
        now = self._clock.now_utc()
        view = self.view()
        ledger = self._ledger(lease.spec.owner, exclude=name)
        plan = planner.plan_lease(
            lease,
            view,
            ledger=ledger,
            now=now,
            blocked=self._blocked.get(key),
            right_of_return=self._right_of_return,
            standby_wait=self._settings.standby_wait_seconds,
        )
        ref = ObjectRef.lease(namespace, name, lease.metadata.uid)

        if plan.baseline is not None:
            patch = {
                "metadata": {"annotations": {keys.ANN_LEND_BASELINE: planner.format_baseline(plan.baseline)}}
            }
            raw = await self._store.patch(
                Kind.GPULEASE, name, patch, namespace=namespace, resource_version=version
            )
            self._leases.put(raw)
            version = str(_meta(raw).get("resourceVersion") or "")
        # tags first: a status that says Tagged/Done must never be written before the tags
        # are (a tag write that keeps conflicting fails this reconcile, which backs off and
        # plans again; a Done lease would never be reconciled again)
        await self._apply_tags(plan.tags)
        new_status = plan.status.to_json_obj()
        if new_status != lease.status.to_json_obj():
            raw = await self._store.patch(
                Kind.GPULEASE,
                name,
                {"status": new_status},
                namespace=namespace,
                subresource="status",
                resource_version=version,
            )
            self._leases.put(raw)
            log.info(
                "lease status",
                extra=ctx(
                    lease=f"{namespace}/{name}", phase=plan.status.phase.value, detail=plan.status.message
                ),
            )
        await self._notify(plan, lease)
        retry = await self._evict(plan, lease, key=key)
        for note in plan.notes:
            await self._emit(ref, note.reason, message=note.message, type=note.type, now=now)
        added = len(plan.status.supplemented_from_standby) - len(lease.status.supplemented_from_standby)
        if added > 0:
            self.metrics.supplements.inc(added)
        returned = len(plan.status.reclaimed) - len(lease.status.reclaimed)
        if returned > 0:
            self.metrics.reclaimed_gpus.inc(returned)
        known = {u.key for u in lease.status.unrecoverable}
        for entry in plan.status.unrecoverable:
            if entry.key not in known:
                self.metrics.unrecoverable.labels(reason=entry.reason).inc()
                log.warning(
                    "lent GPU unrecoverable",
                    extra=ctx(
                        lease=f"{namespace}/{name}",
                        gpu=str(entry.key),
                        reason=entry.reason,
                        detail=entry.message,
                    ),
                )
        if plan.status.superseded_by is not None and lease.status.superseded_by is None:
            phase = plan.status.phase.value
            self.metrics.superseded.labels(action=lease.spec.action.value, phase=phase).inc()
        if (
            lease.spec.action is LeaseAction.RECLAIM
            and plan.status.phase is LeasePhase.DONE
            and lease.status.phase is not LeasePhase.DONE
        ):
            started = next(
                (c.last_transition_time for c in plan.status.conditions if c.type == planner.COND_ACCEPTED),
                None,
            )
            started = started or lease.metadata.creation_timestamp or now
            self.metrics.reclaim_duration.observe(max(0.0, (now - started).total_seconds()))
        if plan.status.phase in FINISHED:
            self._blocked.pop(key, None)
        delays = [d for d in (plan.requeue_after, retry) if d is not None]
        return min(delays) if delays else None

    async def _reject(
        self, raw: JsonObj, *, namespace: str, name: str, version: str, exc: ValidationError
    ) -> None:
        """A lease whose spec does not validate: Failed, with pydantic's message."""
        message = "invalid spec: " + "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        status = raw.get("status") or {}
        if (
            isinstance(status, dict)
            and status.get("phase") == LeasePhase.FAILED
            and status.get("message") == message
        ):
            return
        new = await self._store.patch(
            Kind.GPULEASE,
            name,
            {"status": {"phase": LeasePhase.FAILED.value, "message": message}},
            namespace=namespace,
            subresource="status",
            resource_version=version,
        )
        self._leases.put(new)
        ref = ObjectRef.lease(namespace, name, _meta(raw).get("uid"))
        await self._emit(
            ref, "InvalidSpec", message=message, type=EventType.WARNING, now=self._clock.now_utc()
        )

    # ------------------------------------------------------------------ writes

    async def _apply_tags(self, changes: Iterable[TagChange]) -> None:
        by_node: dict[str, list[TagChange]] = {}
        for change in changes:
            by_node.setdefault(change.key.node, []).append(change)
        for node, node_changes in sorted(by_node.items()):
            await self._tag_node(node, node_changes)

    async def _tag_node(self, node: str, changes: list[TagChange]) -> None:
        obj = self._nodes.get(None, node)
        for attempt in range(CONFLICT_RETRIES):
            if obj is None or attempt > 0:
                try:
                    obj = await self._store.get(Kind.GPUNODE, node)
                except NotFound:
                    return  # vanished: nothing to tag
                self._nodes.put(obj)
            devices = (obj.get("spec") or {}).get("devices") or {}
            patch: dict[str, Any] = {}
            for change in changes:
                index = str(change.key.index)
                current = (devices.get(index) or {}).get("owner")
                if change.owner is None:
                    if current is not None:
                        patch[index] = {"owner": None, "leasedAt": None}
                elif current != change.owner:
                    if current is not None:
                        log.warning(
                            "GPU tagged by another owner; left alone",
                            extra=ctx(gpu=str(change.key), owner=current, wanted=change.owner),
                        )
                        continue
                    leased = format_time(change.leased_at) if change.leased_at is not None else None
                    patch[index] = {"owner": change.owner, "leasedAt": leased}
            if not patch:
                return
            try:
                new = await self._store.patch(
                    Kind.GPUNODE,
                    node,
                    {"spec": {"devices": patch}},
                    resource_version=_meta(obj).get("resourceVersion"),
                )
            except NotFound:
                return
            except Conflict:
                continue
            self._nodes.put(new)
            log.info("tags", extra=ctx(node=node, gpu=",".join(sorted(patch)), owner=changes[0].owner))
            return
        raise Conflict(f"GPUNode {node}: tags still conflicting after {CONFLICT_RETRIES} attempts")

    async def _notify(self, plan: LeasePlan, lease: GPULease) -> None:
        for notice in plan.notices:
            pod = notice.pod
            deadline = format_time(notice.deadline)
            version: str | None = pod.resource_version or None
            for attempt in range(CONFLICT_RETRIES):
                if attempt > 0:
                    try:
                        fresh = await self._store.get(Kind.POD, pod.name, namespace=pod.namespace)
                    except NotFound:
                        break
                    self._put_pod(fresh)
                    if keys.ANN_PREEMPT_DEADLINE in (_meta(fresh).get("annotations") or {}):
                        break  # noticed meanwhile
                    version = _meta(fresh).get("resourceVersion")
                patch = {"metadata": {"annotations": {keys.ANN_PREEMPT_DEADLINE: deadline}}}
                try:
                    new = await self._store.patch(
                        Kind.POD, pod.name, patch, namespace=pod.namespace, resource_version=version
                    )
                except NotFound:
                    break
                except Conflict:
                    continue
                self._put_pod(new)
                self.metrics.notices.inc()
                gpus = ",".join(str(d) for d in notice.devices)
                message = (
                    f"GPUs {gpus} are reclaimed by {lease.spec.owner} (GPULease "
                    f"{lease.metadata.namespace}/{lease.metadata.name}); the pod is evicted after "
                    f"{deadline} ({lease.spec.grace_period_seconds}s grace period)"
                )
                log.info("preempt notice", extra=ctx(pod=pod.key, gpu=gpus, deadline=deadline))
                await self._emit(
                    ObjectRef.pod(pod.namespace, pod.name, pod.uid),
                    "PreemptNotice",
                    message=message,
                    type=EventType.WARNING,
                    now=self._clock.now_utc(),
                )
                break
            else:
                raise Conflict(f"pod {pod.key}: notice still conflicting after {CONFLICT_RETRIES} attempts")

    async def _evict(self, plan: LeasePlan, lease: GPULease, *, key: str) -> float | None:
        retry: float | None = None
        blocked = self._blocked.setdefault(key, {})
        for eviction in plan.evictions:
            pod = eviction.pod
            ref = ObjectRef.pod(pod.namespace, pod.name, pod.uid)
            gpus = ",".join(str(d) for d in eviction.devices)
            try:
                await self._store.evict(pod.namespace, pod.name)
            except NotFound:
                blocked.pop(pod.key, None)
                continue
            except TooManyRequests as exc:
                self.metrics.evictions_refused.inc()
                wait = (
                    exc.retry_after if exc.retry_after is not None else self._settings.eviction_retry_seconds
                )
                retry = wait if retry is None else min(retry, wait)
                first = pod.key not in blocked
                blocked[pod.key] = str(exc)
                log.info(
                    "eviction refused by a PodDisruptionBudget", extra=ctx(pod=pod.key, retry_seconds=wait)
                )
                if first:
                    await self._emit(
                        ref,
                        "EvictionBlocked",
                        message=str(exc),
                        type=EventType.WARNING,
                        now=self._clock.now_utc(),
                    )
                continue
            blocked.pop(pod.key, None)
            self.metrics.evictions.inc()
            log.info("evicted", extra=ctx(pod=pod.key, gpu=gpus))
            message = f"evicted after its grace period: GPUs {gpus} are reclaimed by {lease.spec.owner}"
            await self._emit(
                ref, "Preempted", message=message, type=EventType.WARNING, now=self._clock.now_utc()
            )
        if not blocked:
            self._blocked.pop(key, None)
        return retry

    async def _emit(
        self, ref: ObjectRef, reason: str, *, message: str, type: EventType, now: datetime
    ) -> None:
        """Create an Event; a failure is logged (Events are best effort) and never raised."""
        event = event_object(ref, reason, message=message, type=type, now=now, instance=self._instance)
        try:
            await self._store.create(Kind.EVENT, event)
        except Exception as exc:
            log.warning("event not recorded", extra=ctx(reason=reason, object=ref.name, error=str(exc)))

    # ------------------------------------------------------------------ cluster

    async def _reconcile_cluster(self) -> None:
        view = self.view()
        await self._apply_tags(planner.plan_tag_release(view))
        await self._protect_critical()
        goal: dict[str, standby.Target] = {}
        if self._settings.standby.mode == "adaptive":
            goal = self._standby_targets(view)
            changes = standby.plan_pools(view, goal)
        else:
            changes = planner.plan_standby(view, size=self._settings.standby_pool_size)
        for change in changes:
            obj = self._nodes.get(None, change.node)
            version = _meta(obj).get("resourceVersion") if obj is not None else None
            new = await self._store.patch(
                Kind.GPUNODE, change.node, {"spec": {"pool": change.pool.value}}, resource_version=version
            )
            self._nodes.put(new)
            verb = "joined" if change.pool.value == "standby" else "left"
            message = f"node {verb} the standby pool with {change.gpus} spare GPUs"
            model = planner.node_model(view.node_gpus(change.node))
            if model in goal:
                message += f" (target {goal[model].reason})"
            log.info("standby pool", extra=ctx(node=change.node, pool=change.pool.value, gpus=change.gpus))
            await self._emit(
                ObjectRef.gpunode(change.node, _meta(new).get("uid")),
                "StandbyPool",
                message=message,
                type=EventType.NORMAL,
                now=self._clock.now_utc(),
            )
        self._update_gauges(self.view() if changes else view, goal)

    def _standby_targets(self, view: ClusterView) -> dict[str, standby.Target]:
        """The adaptive standby pool's target per model now (:func:`extender.lease.standby.targets`
        over the mirrored Done Reclaims' shortfalls); a changed target is logged."""
        generation = self._leases.generation
        if self._shortfalls is None or self._shortfalls[0] != generation:
            self._shortfalls = (generation, standby.shortfalls(self._parsed_leases()))
        cfg = self._settings.standby
        goal = standby.targets(
            self._shortfalls[1],
            models=standby.cluster_models(view),
            now=self._clock.now_utc(),
            q=cfg.quantile,
            window_seconds=cfg.window_seconds,
            hold_seconds=cfg.hold_seconds,
            floor=cfg.floor_gpus,
            floors=cfg.floors,
        )
        for model, target in goal.items():
            before = self._targets.get(model)
            if before is None or (before.grow, before.keep) != (target.grow, target.keep):
                log.info(
                    "standby target",
                    extra=ctx(
                        model=model, target_gpus=target.grow, keep_gpus=target.keep, reason=target.reason
                    ),
                )
        self._targets = goal
        return goal

    async def _protect_critical(self) -> None:
        """Give critical ReplicaSet pods the highest ``pod-deletion-cost``
        (:mod:`extender.lease.deletion_cost`). A pod that changed or vanished meanwhile is
        left to its next watch event."""
        due = [self._pods.current(namespace, name) for namespace, name in self._cost_due]
        for patch in deletion_cost.plan_costs((pod for pod in due if pod is not None), self._critical):
            try:
                new = await self._store.patch(
                    Kind.POD,
                    patch.name,
                    patch.body(),
                    namespace=patch.namespace,
                    resource_version=patch.resource_version or None,
                )
            except (Conflict, NotFound):
                continue
            self._put_pod(new)
            log.info(
                "critical pod: highest deletion cost",
                extra=ctx(
                    pod=f"{patch.namespace}/{patch.name}",
                    annotation=deletion_cost.ANN_POD_DELETION_COST,
                    value=deletion_cost.CRITICAL_DELETION_COST,
                ),
            )

    def _update_gauges(self, view: ClusterView, goal: dict[str, standby.Target]) -> None:
        leases = self._leases.values()
        self.metrics.defer_gauges(lambda: self._gauges(view, leases, goal))

    def _gauges(self, view: ClusterView, leases: list[JsonObj], goal: dict[str, standby.Target]) -> Gauges:
        """The gauges for ``view`` and the GPULease objects ``leases`` (both as they were at
        the reconcile: the view is frozen, the list a copy)."""
        lent: dict[tuple[str, str], int] = {}
        for gpu in view.gpus.values():
            if gpu.owner is not None:
                label = (gpu.model or "", gpu.tier.value if gpu.tier else "")
                lent[label] = lent.get(label, 0) + 1
        spare: dict[tuple[str, str], int] = {}
        for gpu in planner.spare_gpus(view):
            label = (gpu.model or "", gpu.tier.value if gpu.tier else "")
            spare[label] = spare.get(label, 0) + 1
        outstanding = sum(
            1
            for lease in self._parsed_leases(leases)
            if lease.spec.action is LeaseAction.RECLAIM and lease.status.phase not in FINISHED
        )
        return Gauges(
            lent=lent,
            outstanding_reclaims=outstanding,
            standby=spare,
            standby_target={m: t.grow for m, t in goal.items()},
            standby_shortfall={m: t.quantile_gpus for m, t in goal.items()},
        )


async def serve(
    controller: LeaseController,
    settings: Settings,
    *,
    store: Store,
    instance: str,
    elector: LeaderElector | None = None,
) -> None:
    """Run ``controller`` until cancelled; with ``settings.lease.leader_election`` only while
    this process (``instance``, unique per replica) holds the ``coordination.k8s.io`` Lease
    ``leader_lease_namespace/leader_lease_name`` (client-go's algorithm,
    :mod:`flexlease.store.leader`), stopping it whenever leadership is lost. ``elector``: an
    elector the caller already runs (the extender shares one between bind and this
    controller); None: this function runs its own."""
    await run_leader_only(
        controller.run,
        settings.lease,
        store=store,
        instance=instance,
        name="lease-controller",
        elector=elector,
    )


async def run(
    settings: Settings,
    store: Store,
    *,
    registry: CollectorRegistry,
    clock: Clock | None = None,
    instance: str | None = None,
) -> None:
    """Run a :class:`LeaseController` (leader-elected when configured) until cancelled;
    return at once when ``settings.lease.enabled`` is false. ``instance``: this replica's
    identity (default: the host name, i.e. the pod name)."""
    if not settings.lease.enabled:
        log.info("lease controller disabled")
        return
    instance = instance or socket.gethostname()
    controller = LeaseController(settings, store, registry=registry, clock=clock, instance=instance)
    await serve(controller, settings, store=store, instance=instance)


LEASE_CONTROLLER: Final = web.AppKey("lease_controller", LeaseController)
"""Where :func:`cleanup_ctx` puts the controller (for ``/readyz``: ``.ready``)."""


def cleanup_ctx(
    settings: Settings,
    store: Store,
    *,
    registry: CollectorRegistry,
    clock: Clock | None = None,
    instance: str | None = None,
    elector: LeaderElector | None = None,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """An aiohttp cleanup context running the controller (see :func:`serve`) as the task
    ``lease-controller`` for the application's lifetime (cancelled and awaited on shutdown)
    and storing it under :data:`LEASE_CONTROLLER`. With ``settings.lease.enabled`` false it
    runs nothing::

        app.cleanup_ctx.append(extender.lease.controller.cleanup_ctx(settings, store, registry=registry))
    """

    async def context(app: web.Application) -> AsyncIterator[None]:
        if not settings.lease.enabled:
            log.info("lease controller disabled")
            yield
            return
        name = instance or socket.gethostname()
        controller = LeaseController(settings, store, registry=registry, clock=clock, instance=name)
        app[LEASE_CONTROLLER] = controller
        work = serve(controller, settings, store=store, instance=name, elector=elector)
        async with tasks.running(work, name="lease-controller"):
            yield

    return context
