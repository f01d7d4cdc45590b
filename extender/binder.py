"""Bind: choose the exact GPUs, then create the Binding that records them on the pod.

Role: the extender's ``/bind`` verb (kube-scheduler calls it after the scheduling cycle;
only one extender may bind). Follows kube-scheduler's assume → bind → forget:

1. read the pod; an already bound pod with its ``assigned-gpus`` on that node is an
   idempotent success. The read is skipped when the extender's own Pod watch holds the pod,
   unbound (:meth:`extender.state.Inventory.unbound_pod`: what the API server sent, never
   what a caller sent): the bind decides on that copy, and its Binding carries the copy's
   ``resourceVersion`` as a precondition, which the API server checks before anything else
   (409 unless the pod is still that version: ``BindingREST``'s ``GuaranteedUpdate`` with
   ``storage.Preconditions``, pkg/registry/core/pod/storage). When the watch lags — the
   Binding answers 409 — or the copy gives any outcome but success, an admission refusal or
   a Binding error other than 409 (step 4 settles those as before), the bind is decided
   again on a fresh read: the copy only ever saves the read of a pod that binds, one API
   call per bind instead of two (``BindOutcome.source`` says which way each bind went). The
   watch holds the pods the store passes it: under ``KubeStore``'s pod filter, GPU pods and
   pods with ``flexlease.io/`` keys; other pods are read. A Binding made on a read is
   conditional on the version read as well, so no decision is applied to a pod that changed
   since (a label, an annotation, another binder): after a 409 the pod is read once
   (:meth:`Binder._refused`) — bound as asked: success; at another version: decided again
   on that read, :data:`BINDINGS_ON_READS` Bindings at the most; at the same version: the
   pod's own state refused it (being deleted, scheduling gates), reported as it is;
2. take an inventory snapshot, in which the pod's own claim counts as free for it
   (:func:`extender.scheduling.release_own`); keep the pod's existing ``assigned-gpus`` only
   if :func:`extender.scheduling.claim_problem` finds nothing wrong with it (never trusted:
   anyone can write an annotation), else choose the devices
   (:func:`extender.scheduling.choose_devices`); :meth:`~extender.state.Inventory.assume`
   them — synchronously, with no ``await`` in between, so two concurrent binds never
   receive the same GPU;
3. create the Binding (``store.bind``) carrying ``flexlease.io/assigned-gpus``,
   ``assigned-uuids`` and ``assigned-at`` in its metadata: the API server adds a Binding's
   annotations to the pod in the same write that sets ``spec.nodeName``
   (``setPodNodeAndMetadata``, pkg/registry/core/pod/storage), so a pod is bound with its
   GPUs recorded, or neither — one API write per bind and nothing to undo;
4. on any failure: forget the reservation, so no phantom reservation survives — once a read
   shows the Binding did not land (an unexpected exception from the store counts as a
   failed Binding whose outcome is unknown; one before the Binding forgets at once and
   propagates): a Binding that landed although its reply was lost, or
   was answered 409 by a client's retry, is a success whose reservation is kept until the
   watch confirms it (:meth:`Binder._binding_failed`, :meth:`Binder._refused`).

Binds of one pod are serialised by a per-pod lock. Neighbours: called by
:mod:`extender.server`; reads :mod:`extender.state`, decides with :mod:`extender.scheduling`,
writes through the :class:`flexlease.store.base.Store`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Final

from extender import scheduling
from extender.admission import BindCheck
from extender.state import Inventory
from flexlease.api import keys
from flexlease.api.pod import Assignment, GpuRequest, ParsedPods, Priority, parse_pod
from flexlease.clock import format_time
from flexlease.errors import Conflict, FlexleaseError, RequestError, StoreError
from flexlease.logging import ctx
from flexlease.store.base import JsonObj, Kind, Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BindOutcome:
    """Result of one bind: ``error`` is empty on success; ``outcome`` is a bounded metrics
    label (``bound``, ``idempotent``, ``failed``, ``refused``); ``assignment`` is what the pod holds."""

    outcome: str
    error: str = ""
    assignment: Assignment | None = None
    cause: str = "fits"
    """Bounded metrics label: ``fits`` on success, else why (``no_longer_fits``, ``store_error``...)."""
    source: str = "read"
    """Bounded metrics label (:data:`extender.metrics.POD_SOURCES`): which copy of the pod
    the bind decided on — ``watch`` (the Pod watch's), ``read`` (the watch held no unbound
    copy), ``stale_watch`` (a read after the watch's copy did not bind)."""


@dataclass(slots=True)
class _PodLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


BINDINGS_ON_READS: Final = 3
"""Bindings per bind, at the most, made on a pod as read (each conditional on the version
read, each refusal read once, that read deciding the next): a pod that changes between each
read and its Binding fails the bind (kube-scheduler retries the pod)."""


@dataclass(frozen=True, slots=True)
class _Again:
    """Decide again on a fresh read: ``pod`` is one already made after the refusal, or None."""

    pod: JsonObj | None = None


def _bound_as_asked(req: GpuRequest, cur: GpuRequest, node: str, assignment: Assignment | None) -> bool:
    """Whether ``cur`` (pod ``req`` read back after a failed Binding) is that same pod (the
    uid the bind decided on, when it had one) bound to ``node`` with ``assignment`` (any
    binding to ``node`` for a pod without GPUs, ``assignment`` None): the Binding landed."""
    same_pod = not req.uid or cur.uid == req.uid
    return same_pod and cur.node_name == node and (assignment is None or cur.assignment == assignment)


def _resource_version(pod: JsonObj) -> str | None:
    """``metadata.resourceVersion`` of ``pod`` when it is a non-empty string, else None."""
    meta = pod.get("metadata")
    version = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return version if isinstance(version, str) and version else None


def _annotations(pod: JsonObj, view: scheduling.NodeView, assignment: Assignment) -> dict[str, str]:
    """The ``assigned-*`` annotations of a Binding of ``pod`` to ``assignment`` on ``view``'s
    node. A claim the pod already records as it stands keeps its time: only the Binding was
    missing."""
    assigned = assignment.format()
    by_index = {d.index: d for d in view.devices}
    uuids = ",".join(by_index[i].uuid for i in assignment.indices)
    recorded = (pod.get("metadata") or {}).get("annotations") or {}
    kept = (
        recorded.get(keys.ANN_ASSIGNED_GPUS) == assigned
        and recorded.get(keys.ANN_ASSIGNED_UUIDS) == uuids
        and recorded.get(keys.ANN_ASSIGNED_AT)
    )
    return {
        keys.ANN_ASSIGNED_GPUS: assigned,
        keys.ANN_ASSIGNED_UUIDS: uuids,
        keys.ANN_ASSIGNED_AT: kept or format_time(datetime.now(UTC)),
    }


class Binder:
    """Binds pods to nodes with exact GPUs. ``gpu_resource``: the extended resource name."""

    def __init__(
        self, store: Store, inventory: Inventory, *, gpu_resource: str, pods: ParsedPods | None = None
    ) -> None:
        self._store = store
        self._inventory = inventory
        self._resource = gpu_resource
        self._pods = pods if pods is not None else ParsedPods(gpu_resource)
        """Parsed pods shared with filter and prioritize (the same version parses once)."""
        self._locks: dict[str, _PodLock] = {}

    async def bind(
        self, namespace: str, name: str, *, uid: str, node: str, check: BindCheck | None = None
    ) -> BindOutcome:
        """Bind pod ``namespace/name`` (``uid`` as the scheduler saw it; empty = unchecked) to
        ``node``. ``check`` (:mod:`extender.admission`) may refuse the pod as read from the
        store or held by the Pod watch (outcome ``refused``). Never raises for a failed bind:
        the error text goes back to the scheduler."""
        key = f"{namespace}/{name}"
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = _PodLock()
        entry.users += 1
        try:
            async with entry.lock:
                return await self._bind_locked(namespace, name, uid=uid, node=node, check=check)
        finally:
            entry.users -= 1
            if entry.users == 0:  # the last bind of this pod drops the lock
                del self._locks[key]

    async def _bind_locked(
        self, namespace: str, name: str, *, uid: str, node: str, check: BindCheck | None
    ) -> BindOutcome:
        key = f"{namespace}/{name}"
        source = "read"
        fresh: JsonObj | None = None
        """The pod as read after a refused Binding, for the next decision (saves its read)."""
        watched = self._watched(namespace, name, uid)
        if watched is not None:
            pod, version = watched
            on_copy = await self._bind_pod(pod, key, uid=uid, node=node, check=check, version=version)
            if isinstance(on_copy, BindOutcome):
                return replace(on_copy, source="watch")
            fresh = on_copy.pod
            source = "stale_watch"
            log.debug("the watch's copy did not bind; deciding on a read", extra=ctx(pod=key, node=node))
        for attempt in range(1, BINDINGS_ON_READS + 1):
            if fresh is not None:
                pod, fresh = fresh, None
            else:
                try:
                    pod = await self._store.get(Kind.POD, name, namespace=namespace)
                except StoreError as exc:
                    failed = self._fail(key, node, f"cannot read pod {key}: {exc}", cause="store_error")
                    return replace(failed, source=source)
            outcome = await self._bind_pod(
                pod, key, uid=uid, node=node, check=check, version=_resource_version(pod), read=True
            )
            if isinstance(outcome, BindOutcome):
                return replace(outcome, source=source)
            fresh = outcome.pod
            if attempt < BINDINGS_ON_READS:
                log.debug(
                    "the pod changed between its read and its Binding; deciding again",
                    extra=ctx(pod=key, node=node),
                )
        message = f"pod {key} changed between its read and its Binding {BINDINGS_ON_READS} times; retry"
        return replace(self._fail(key, node, message, cause="conflict"), source=source)

    def _watched(self, namespace: str, name: str, uid: str) -> tuple[JsonObj, str] | None:
        """The Pod watch's copy of unbound pod ``uid`` and its ``resourceVersion``, when it is
        ``namespace/name`` at a known version; else None (``uid`` empty: nothing to match)."""
        pod = self._inventory.unbound_pod(uid) if uid else None
        meta = pod.get("metadata") if pod is not None else None
        if pod is None or not isinstance(meta, dict):
            return None
        if meta.get("name") != name or (meta.get("namespace") or "default") != namespace:
            return None
        version = meta.get("resourceVersion")
        return (pod, version) if isinstance(version, str) and version else None

    async def _bind_pod(
        self,
        pod: JsonObj,
        key: str,
        *,
        uid: str,
        node: str,
        check: BindCheck | None,
        version: str | None,
        read: bool = False,
    ) -> BindOutcome | _Again:
        """Bind ``pod``, the Pod watch's copy or (``read``) the pod as just read, whose
        ``resourceVersion`` is ``version``: the Binding is conditional on it (unconditional
        when None: a pod without one), so a decision is never applied to a pod that changed
        since the copy it was made on. :class:`_Again` (decide again on a fresh read): the
        Binding was refused with 409 and the pod, read again, is at another version and not
        bound as asked (:meth:`_refused`); and, for the watch's copy, every outcome but
        success, an admission refusal and a Binding error other than 409 (failed as before,
        or settled by :meth:`_binding_failed`)."""

        def failed(message: str, *, cause: str) -> BindOutcome | _Again:
            return self._fail(key, node, message, cause=cause) if read else _Again()

        known = self._inventory.pending_request(pod) if version is not None else None
        try:
            req = known if known is not None else self._pods.parse(pod)
        except RequestError as exc:
            return failed(f"pod {key}: {exc}", cause="bad_pod")
        if uid and req.uid and uid != req.uid:
            return failed(
                f"pod {key} has uid {req.uid}, the scheduler asked to bind {uid}", cause="uid_mismatch"
            )
        pod_uid = req.uid or key
        if check is not None and (refusal := await check(pod, req, node)) is not None:
            return BindOutcome("refused", error=refusal.message, cause=refusal.reason)

        if req.node_name is not None:
            if not read:
                return _Again()
            if req.node_name == node and (
                req.count == 0 or (req.assignment is not None and req.assignment.node == node)
            ):
                return BindOutcome("idempotent", assignment=req.assignment)
            return failed(f"pod {key} is already bound to {req.node_name}", cause="already_bound")

        if req.count == 0:  # a pod without managed GPUs: just the Binding
            try:
                await self._bind(req, node=node, annotations=None, version=version)
            except StoreError as exc:
                if version is not None and isinstance(exc, Conflict):
                    return await self._refused(req, None, node=node, version=version, exc=exc)
                return await self._binding_failed(req, None, node=node, assignment=None, exc=exc)
            return BindOutcome("bound")

        # Snapshot → check or choose → assume, with no await in between. The pod's own
        # claim (an interrupted earlier attempt) counts as free for it.
        view = self._inventory.snapshot().get(node)
        if view is None:
            return failed(f"node {node} has no GPUNode", cause="no_gpunode")
        if view.standby and not req.reclaim:
            return failed(
                f"{node} is a standby-pool node; only reclaim pods (flexlease.io/reclaim=true) may use it",
                cause="standby_not_reclaim",
            )
        view = scheduling.release_own(view, pod_uid)
        indices: tuple[int, ...] | None = None
        if req.assignment is not None and req.assignment.node == node:
            # A claim already on an unbound pod: never ours (a Binding writes the claim and
            # the node together), so anyone's (a copied YAML, an older two-step bind). Keep
            # it only if it checks out.
            problem = scheduling.claim_problem(req, view, req.assignment.indices)
            if problem is None:
                indices = req.assignment.indices
            else:
                log.warning(
                    "pod's existing assigned-gpus cannot be kept (%s); choosing GPUs afresh",
                    problem,
                    extra=ctx(pod=key, node=node, gpu=req.assignment.format()),
                )
        if indices is None:
            indices = scheduling.choose_devices(req, view)
        if indices is None:
            verdict = scheduling.check_node(req, view)
            return failed(
                f"no longer fits on {node}: {verdict.reason or 'GPUs taken'}", cause="no_longer_fits"
            )
        try:
            self._inventory.assume(
                uid=pod_uid,
                key=key,
                node=node,
                indices=indices,
                low=req.priority is Priority.LOW,
                priority_value=req.priority_value,
            )
        except Conflict as exc:
            return failed(f"cannot reserve GPUs on {node}: {exc}", cause="no_longer_fits")

        assignment = Assignment(node, indices)
        try:
            annotations = _annotations(pod, view, assignment)
        except BaseException:  # a fault before the Binding: its reservation goes with it
            self._inventory.forget(pod_uid)
            raise
        try:
            await self._bind(req, node=node, annotations=annotations, version=version)
        except StoreError as exc:
            if version is not None and isinstance(exc, Conflict):
                return await self._refused(
                    req, pod_uid, node=node, version=version, exc=exc, assignment=assignment
                )
            return await self._binding_failed(req, pod_uid, node=node, assignment=assignment, exc=exc)
        self._inventory.renew(pod_uid)
        log.info("bound pod", extra=ctx(pod=key, node=node, gpu=",".join(map(str, indices))))
        return BindOutcome("bound", assignment=assignment)

    async def _bind(
        self, req: GpuRequest, *, node: str, annotations: dict[str, str] | None, version: str | None
    ) -> None:
        """Create pod ``req``'s Binding to ``node`` (with ``annotations``; conditional on
        ``version`` unless None). Raises ``StoreError``; any other exception from the store
        (one that broke its contract) is logged with its traceback and raised as a
        ``StoreError`` without a status: a Binding whose outcome is unknown, settled by a read
        like any other (never a 500 that leaves a reservation behind)."""
        try:
            await self._store.bind(
                req.namespace,
                req.name,
                uid=req.uid or None,
                node=node,
                annotations=annotations,
                resource_version=version,
            )
        except StoreError:
            raise
        except Exception as exc:
            log.exception("the store failed a Binding unexpectedly", extra=ctx(pod=req.key, node=node))
            raise StoreError(f"unexpected {type(exc).__name__}: {exc}") from exc

    async def _refused(
        self,
        req: GpuRequest,
        pod_uid: str | None,
        *,
        node: str,
        version: str,
        exc: Conflict,
        assignment: Assignment | None = None,
    ) -> BindOutcome | _Again:
        """After a Binding conditional on ``version`` was refused with 409 (``exc``): read the
        pod once to tell why. The same pod (uid) bound to ``node`` as asked (``assignment``;
        any binding to it for a pod without GPUs): the Binding landed and its reply was lost
        (a client that retries gets the 409), or another binder made the same one: success,
        the reservation of pod ``pod_uid`` kept (renewed) until the watch confirms it.
        Otherwise nothing of this Binding landed and the reservation is forgotten; then a pod
        at another version is decided again on that read (:class:`_Again`), and one still at
        ``version`` was refused for its own state (being deleted, scheduling gates): reported
        as the API server said, since reading again cannot change it. When the pod cannot be
        read (or parsed) back, whether the Binding landed is unknown: the bind fails and the
        reservation stays until its TTL, so its GPUs go to no other pod before the watch
        tells (as :meth:`_binding_failed` does after an error that may have committed)."""
        key = req.key
        try:
            raw, cur = await self._read_back(req)
        except FlexleaseError as read_exc:
            message = f"binding pod {key} to {node} failed: {exc}; reading the pod back failed: {read_exc}"
            return self._fail(key, node, message, cause="store_error")
        if _bound_as_asked(req, cur, node, assignment):
            if pod_uid is not None:
                self._inventory.renew(pod_uid)
            return BindOutcome("idempotent", assignment=cur.assignment)
        if pod_uid is not None:
            self._inventory.forget(pod_uid)
        if _resource_version(raw) != version:
            return _Again(raw)
        return self._fail(key, node, f"binding pod {key} to {node} failed: {exc}", cause="store_error")

    async def _binding_failed(
        self,
        req: GpuRequest,
        pod_uid: str | None,
        *,
        node: str,
        assignment: Assignment | None,
        exc: StoreError,
    ) -> BindOutcome:
        """After a failed Binding: read the pod back. Bound as asked (a reply lost, a 409 on
        the client's retry): success. Not bound as asked: forget the reservation of pod
        ``pod_uid`` (None: a pod without GPUs, which reserves none). Unknown (the read fails
        too, after an error that may have committed: a timeout, a 5xx, a reset connection):
        keep the reservation until its TTL, so the GPUs are not handed to another pod before
        the watch says whether the Binding landed."""
        key = req.key
        try:
            _, cur = await self._read_back(req)
        except FlexleaseError as read_exc:
            if pod_uid is None:
                pass
            elif exc.status is not None and 400 <= exc.status < 500:  # refused: it did not land
                self._inventory.forget(pod_uid)
            else:
                gpus = ",".join(map(str, assignment.indices)) if assignment is not None else None
                log.warning(
                    "outcome of a Binding unknown (%s, and reading the pod back failed: %s); "
                    "keeping its GPUs reserved until the watch or the reservation TTL settles it",
                    exc,
                    read_exc,
                    extra=ctx(pod=key, node=node, gpu=gpus),
                )
        else:
            if _bound_as_asked(req, cur, node, assignment):
                return BindOutcome("idempotent", assignment=assignment)
            if pod_uid is not None:
                self._inventory.forget(pod_uid)
        return self._fail(key, node, f"binding pod {key} to {node} failed: {exc}", cause="store_error")

    async def _read_back(self, req: GpuRequest) -> tuple[JsonObj, GpuRequest]:
        """Pod ``req`` as the store holds it now, and its parse. Raises ``StoreError`` (the
        read) or ``RequestError`` (the parse), both ``FlexleaseError``."""
        raw = await self._store.get(Kind.POD, req.name, namespace=req.namespace)
        return raw, parse_pod(raw, self._resource)

    @staticmethod
    def _fail(key: str, node: str, message: str, *, cause: str) -> BindOutcome:
        log.warning("bind failed: %s", message, extra=ctx(pod=key, node=node))
        return BindOutcome("failed", error=message, cause=cause)
