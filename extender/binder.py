"""Bind: choose the exact GPUs, record them on the pod, then create the Binding.

Role: the extender's ``/bind`` verb (kube-scheduler calls it after the scheduling cycle;
only one extender may bind). Follows kube-scheduler's assume → bind → forget:

1. read the pod; an already bound pod with its ``assigned-gpus`` on that node is an
   idempotent success;
2. take an inventory snapshot, in which the pod's own claim counts as free for it
   (:func:`extender.scheduling.release_own`); keep the pod's existing ``assigned-gpus`` only
   if :func:`extender.scheduling.claim_problem` finds nothing wrong with it (never trusted:
   anyone can write an annotation), else choose the devices
   (:func:`extender.scheduling.choose_devices`); :meth:`~extender.state.Inventory.assume`
   them — synchronously, with no ``await`` in between, so two concurrent binds never
   receive the same GPU;
3. write ``flexlease.io/assigned-gpus``, ``assigned-uuids`` and ``assigned-at`` with a JSON
   merge patch, then create the Binding (``store.bind``);
4. on any failure: forget the reservation and, when the annotations were written but the
   Binding failed, remove them again, so no phantom reservation survives.

Binds of one pod are serialised by a per-pod lock. Neighbours: called by
:mod:`extender.server`; reads :mod:`extender.state`, decides with :mod:`extender.scheduling`,
writes through the :class:`flexlease.store.base.Store`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from extender import scheduling
from extender.admission import BindCheck
from extender.state import Inventory
from flexlease.api import keys
from flexlease.api.pod import Assignment, GpuRequest, ParsedPods, Priority, parse_pod
from flexlease.clock import format_time
from flexlease.errors import Conflict, FlexleaseError, RequestError, StoreError
from flexlease.logging import ctx
from flexlease.store.base import Kind, Store

log = logging.getLogger(__name__)

ROLLBACK_ATTEMPTS: Final = 3
ROLLBACK_DELAY_SECONDS: Final = 0.2


@dataclass(frozen=True, slots=True)
class BindOutcome:
    """Result of one bind: ``error`` is empty on success; ``outcome`` is a bounded metrics
    label (``bound``, ``idempotent``, ``failed``, ``refused``); ``assignment`` is what the pod holds."""

    outcome: str
    error: str = ""
    assignment: Assignment | None = None
    cause: str = "fits"
    """Bounded metrics label: ``fits`` on success, else why (``no_longer_fits``, ``store_error``...)."""


@dataclass(slots=True)
class _PodLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


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
        store (outcome ``refused``). Never raises for a failed bind: the error text goes back
        to the scheduler."""
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
        try:
            pod = await self._store.get(Kind.POD, name, namespace=namespace)
        except StoreError as exc:
            return self._fail(key, node, f"cannot read pod {key}: {exc}", cause="store_error")
        try:
            req = self._pods.parse(pod)
        except RequestError as exc:
            return self._fail(key, node, f"pod {key}: {exc}", cause="bad_pod")
        if uid and req.uid and uid != req.uid:
            return self._fail(
                key,
                node,
                f"pod {key} has uid {req.uid}, the scheduler asked to bind {uid}",
                cause="uid_mismatch",
            )
        pod_uid = req.uid or key
        if check is not None and (refusal := await check(pod, req, node)) is not None:
            return BindOutcome("refused", error=refusal.message, cause=refusal.reason)

        if req.node_name is not None:
            if req.node_name == node and (
                req.count == 0 or (req.assignment is not None and req.assignment.node == node)
            ):
                return BindOutcome("idempotent", assignment=req.assignment)
            return self._fail(
                key, node, f"pod {key} is already bound to {req.node_name}", cause="already_bound"
            )

        if req.count == 0:  # a pod without managed GPUs: just the Binding
            try:
                await self._store.bind(namespace, name, uid=req.uid or None, node=node)
            except StoreError as exc:
                return self._fail(
                    key, node, f"binding pod {key} to {node} failed: {exc}", cause="store_error"
                )
            return BindOutcome("bound")

        # Snapshot → check or choose → assume, with no await in between. The pod's own
        # claim (an interrupted earlier attempt) counts as free for it.
        view = self._inventory.snapshot().get(node)
        if view is None:
            return self._fail(key, node, f"node {node} has no GPUNode", cause="no_gpunode")
        if view.standby and not req.reclaim:
            return self._fail(
                key,
                node,
                f"{node} is a standby-pool node; only reclaim pods (flexlease.io/reclaim=true) may use it",
                cause="standby_not_reclaim",
            )
        view = scheduling.release_own(view, pod_uid)
        indices: tuple[int, ...] | None = None
        if req.assignment is not None and req.assignment.node == node:
            # A claim already on the pod: a previous attempt of ours that did not bind, or
            # anyone's annotation (a copied YAML). Keep it only if it checks out.
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
            return self._fail(
                key,
                node,
                f"no longer fits on {node}: {verdict.reason or 'GPUs taken'}",
                cause="no_longer_fits",
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
            return self._fail(key, node, f"cannot reserve GPUs on {node}: {exc}", cause="no_longer_fits")

        assignment = Assignment(node, indices)
        by_index = {d.index: d for d in view.devices}
        uuids = ",".join(by_index[i].uuid for i in indices)
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if (
            annotations.get(keys.ANN_ASSIGNED_GPUS) == assignment.format()
            and annotations.get(keys.ANN_ASSIGNED_UUIDS) == uuids
        ):
            # Recorded already (a previous attempt): only the Binding is missing.
            return await self._create_binding(req, node=node, assignment=assignment, wrote_at=None)
        at = format_time(datetime.now(UTC))
        patch = {
            "metadata": {
                "annotations": {
                    keys.ANN_ASSIGNED_GPUS: assignment.format(),
                    keys.ANN_ASSIGNED_UUIDS: uuids,
                    keys.ANN_ASSIGNED_AT: at,
                }
            }
        }
        try:
            await self._store.patch(Kind.POD, name, patch, namespace=namespace)
        except StoreError as exc:
            self._inventory.forget(pod_uid)
            return self._fail(
                key, node, f"recording assigned GPUs on pod {key} failed: {exc}", cause="store_error"
            )
        self._inventory.renew(pod_uid)
        return await self._create_binding(req, node=node, assignment=assignment, wrote_at=at)

    async def _create_binding(
        self, req: GpuRequest, *, node: str, assignment: Assignment, wrote_at: str | None
    ) -> BindOutcome:
        key = req.key
        pod_uid = req.uid or key
        try:
            await self._store.bind(req.namespace, req.name, uid=req.uid or None, node=node)
        except StoreError as exc:
            if isinstance(exc, Conflict) and await self._bound_as_asked(
                req, node=node, assignment=assignment
            ):
                return BindOutcome("idempotent", assignment=assignment)
            self._inventory.forget(pod_uid)
            await self._remove_annotations(req, expect_at=wrote_at)
            return self._fail(key, node, f"binding pod {key} to {node} failed: {exc}", cause="store_error")
        self._inventory.renew(pod_uid)
        log.info(
            "bound pod",
            extra=ctx(pod=key, node=node, gpu=",".join(map(str, assignment.indices))),
        )
        return BindOutcome("bound", assignment=assignment)

    async def _bound_as_asked(self, req: GpuRequest, *, node: str, assignment: Assignment) -> bool:
        """After a 409: is the pod bound to ``node`` holding ``assignment`` (a lost reply)?"""
        try:
            cur = parse_pod(
                await self._store.get(Kind.POD, req.name, namespace=req.namespace), self._resource
            )
        except FlexleaseError:
            return False
        return cur.node_name == node and cur.assignment == assignment

    async def _remove_annotations(self, req: GpuRequest, *, expect_at: str | None) -> None:
        """Remove the ``assigned-*`` annotations after a failed Binding; retried, then reported."""
        patch: dict[str, Any] = {
            "metadata": {
                "annotations": {
                    keys.ANN_ASSIGNED_GPUS: None,
                    keys.ANN_ASSIGNED_UUIDS: None,
                    keys.ANN_ASSIGNED_AT: None,
                }
            }
        }
        last: StoreError | None = None
        for attempt in range(ROLLBACK_ATTEMPTS):
            try:
                cur = await self._store.get(Kind.POD, req.name, namespace=req.namespace)
                meta = cur.get("metadata") or {}
                ann = meta.get("annotations") or {}
                if (meta.get("uid") or "") != req.uid or (cur.get("spec") or {}).get("nodeName"):
                    return  # replaced or bound by someone else: not ours to touch
                if expect_at is not None and ann.get(keys.ANN_ASSIGNED_AT) != expect_at:
                    return  # rewritten since: not ours any more
                if keys.ANN_ASSIGNED_GPUS not in ann:
                    return
                await self._store.patch(
                    Kind.POD,
                    req.name,
                    patch,
                    namespace=req.namespace,
                    resource_version=str(meta.get("resourceVersion") or "") or None,
                )
                return
            except StoreError as exc:
                if exc.status == 404:
                    return
                last = exc
                await asyncio.sleep(ROLLBACK_DELAY_SECONDS * (attempt + 1))
        log.error(
            "could not remove assigned-gpus after a failed bind; the watch keeps the GPUs taken "
            "until the pod is deleted or rescheduled",
            extra=ctx(pod=req.key, error=str(last)),
        )

    @staticmethod
    def _fail(key: str, node: str, message: str, *, cause: str) -> BindOutcome:
        log.warning("bind failed: %s", message, extra=ctx(pod=key, node=node))
        return BindOutcome("failed", error=message, cause=cause)
