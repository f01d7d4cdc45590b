"""Read back what kubelet really gave each pod (PodResources API) and keep the assignments true.

:meth:`PodResourcesReconciler.listed` also answers the device plugin's question "which pods
does kubelet list without their devices" during GetPreferredAllocation.

Every ``agent.pod_resources_seconds`` (and once at start, before the plugin registers, so an
agent restart knows which pods are already allocated) :class:`PodResourcesReconciler` calls
kubelet's ``v1.PodResourcesLister``:

* ``List``: per pod, the device IDs of the managed resource over all containers (kubelet sends
  one ``ContainerDevices`` entry per device; they are merged). Each pod's set is recorded as its
  allocation and compared with its assignment. A mismatch (or a pod holding GPUs with no
  assignment at all) seen in two rounds in a row is counted once, logged with both sets, and
  written back: the pod's
  ``assigned-gpus``/``assigned-uuids`` are set to what it holds, and pods still waiting for
  admission whose assignments held those devices get the ones it left free instead
  (:func:`~nodeagent.deviceplugin.matching.exchange`), so assignments stay disjoint;
  ``flexlease.io/assignment-corrected`` records each previous value. Every write is a merge
  patch conditional on the resourceVersion just read (a conflict is retried at the next
  round), so the extender's view stays true.
* ``GetAllocatableResources``: the number of devices kubelet considers allocatable, as a gauge,
  with a log line when it differs from the healthy devices the plugin advertises.

Device IDs are mapped to NVML indices through this node's own inventory; a device ID the node
does not have is never written (logged instead).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final

import grpc

from flexlease import errors
from flexlease.api import keys
from flexlease.api.pod import Assignment, is_terminated, salvage_assignment
from flexlease.clock import format_time
from flexlease.config import AgentSettings
from flexlease.logging import ctx
from flexlease.store.base import Kind, Store
from nodeagent.deviceplugin import podresources_pb2 as prpb
from nodeagent.deviceplugin import rpc
from nodeagent.deviceplugin.matching import Mismatch, compare, exchange, merge_container_devices
from nodeagent.deviceplugin.metrics import DevicePluginMetrics
from nodeagent.deviceplugin.pods import PodBook
from nodeagent.deviceplugin.server import HEALTHY, advertised
from nodeagent.health.board import NodeBoard

log = logging.getLogger(__name__)

CALL_TIMEOUT_SECONDS: Final = 5.0
LISTED_TIMEOUT_SECONDS: Final = 1.0


class PodResourcesReconciler:
    """Compares kubelet's PodResources with ``book``'s assignments for node ``board.node``."""

    def __init__(
        self,
        book: PodBook,
        board: NodeBoard,
        store: Store,
        settings: AgentSettings,
        metrics: DevicePluginMetrics,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._book = book
        self._board = board
        self._store = store
        self._settings = settings
        self._metrics = metrics
        self._now = now
        self._list_failing = False
        """The last :meth:`listed` call failed (its failures are logged at warning once)."""
        self.node = board.node
        self._counted: set[tuple[str, frozenset[str]]] = set()
        self._suspects: dict[str, frozenset[str]] = {}

    async def run(self) -> None:
        """Reconcile every ``pod_resources_seconds`` until cancelled; kubelet being absent or
        failing is logged and retried at the next round."""
        while True:
            await self.reconcile_logged()
            await asyncio.sleep(self._settings.pod_resources_seconds)

    async def reconcile_logged(self) -> list[Mismatch] | None:
        """:meth:`reconcile`, with kubelet or store failures logged (returns None then)."""
        try:
            return await self.reconcile()
        except grpc.aio.AioRpcError as exc:
            log.debug(
                "PodResources not answering",
                extra=ctx(
                    node=self.node, socket=str(self._settings.pod_resources_socket), code=exc.code().name
                ),
            )
        except errors.StoreError as exc:
            log.warning(
                "writing a corrected assignment failed; retrying", extra=ctx(node=self.node, error=str(exc))
            )
        return None

    def _channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(f"unix:{self._settings.pod_resources_socket}")

    async def _list(self, channel: grpc.aio.Channel, *, seconds: float) -> dict[str, tuple[str, ...]]:
        """kubelet's ``List``: ``<ns>/<name>`` → device IDs of the resource (merged over the
        pod's containers; empty for a pod holding none), answered within ``seconds``. Raises
        ``grpc.aio.AioRpcError``."""
        list_ = rpc.unary_call(channel, rpc.POD_RESOURCES, "List", prpb.ListPodResourcesResponse)
        response = await list_(prpb.ListPodResourcesRequest(), timeout=seconds)
        resource = self._settings.gpu_resource
        pods: dict[str, tuple[str, ...]] = {}
        for pod in response.pod_resources:
            entries = [(d.resource_name, list(d.device_ids)) for c in pod.containers for d in c.devices]
            pods[f"{pod.namespace}/{pod.name}"] = merge_container_devices(entries, resource)
        return pods

    async def listed(self) -> dict[str, frozenset[str]] | None:
        """kubelet's ``List`` now: every pod it lists → device IDs of the resource (empty for a
        pod being admitted); None when kubelet does not answer within a second."""
        try:
            async with self._channel() as channel:
                pods = await self._list(channel, seconds=LISTED_TIMEOUT_SECONDS)
        except grpc.aio.AioRpcError as exc:
            # asked on every preferred allocation: warn when it starts failing, not each time
            level = logging.DEBUG if self._list_failing else logging.WARNING
            self._list_failing = True
            log.log(level, "PodResources List failed", extra=ctx(node=self.node, code=exc.code().name))
            return None
        if self._list_failing:
            self._list_failing = False
            log.info("PodResources List answers again", extra=ctx(node=self.node))
        return {k: frozenset(v) for k, v in pods.items()}

    async def read(self) -> tuple[dict[str, tuple[str, ...]], tuple[str, ...]]:
        """kubelet's view: ``<ns>/<name>`` → device IDs of the resource (pods with none left
        out), and the allocatable device IDs. Raises ``grpc.aio.AioRpcError``."""
        async with self._channel() as channel:
            get_allocatable = rpc.unary_call(
                channel, rpc.POD_RESOURCES, "GetAllocatableResources", prpb.AllocatableResourcesResponse
            )
            listed = await self._list(channel, seconds=CALL_TIMEOUT_SECONDS)
            allocatable = await get_allocatable(
                prpb.AllocatableResourcesRequest(), timeout=CALL_TIMEOUT_SECONDS
            )
        pods = {k: v for k, v in listed.items() if v}
        alloc = merge_container_devices(
            ((d.resource_name, list(d.device_ids)) for d in allocatable.devices), self._settings.gpu_resource
        )
        return pods, alloc

    async def reconcile(self) -> list[Mismatch]:
        """One round; returns the mismatches seen. A mismatch is counted, logged and written
        back when the previous round saw the same one: kubelet's ``List`` names pods, not UIDs,
        and can briefly show a deleted pod under the name of its successor. A pod holding part
        of its assignment is being admitted, not mismatched. Raises ``grpc.aio.AioRpcError``
        when kubelet does not answer and ``StoreError`` when a write fails for another reason
        than a conflict."""
        actual, allocatable = await self.read()
        allocated = {k: frozenset(v) for k, v in actual.items()}
        self._book.set_allocated(allocated)
        self._check_allocatable(allocatable)
        found: list[Mismatch] = []
        previous, self._suspects = self._suspects, {}
        for key, ids in sorted(actual.items()):
            assigned = self._book.uuids(key)
            if assigned is None and not await self._unassigned_holder(key):
                continue
            mismatch = compare(key, assigned or (), ids)
            if mismatch is None or mismatch.actual < mismatch.assigned:
                continue
            found.append(mismatch)
            self._suspects[key] = mismatch.actual
            if previous.get(key) != mismatch.actual:
                log.info(
                    "kubelet's devices for a pod differ from its assignment; checking again next round",
                    extra=ctx(node=self.node, pod=key, actual=sorted(mismatch.actual)),
                )
                continue
            mark = (key, mismatch.actual)
            if mark not in self._counted:
                self._counted.add(mark)
                self._metrics.mismatches.labels(node=self.node).inc()
                log.warning(
                    "kubelet gave a pod other GPUs than assigned",
                    extra=ctx(
                        node=self.node,
                        pod=key,
                        assigned=sorted(mismatch.assigned),
                        actual=sorted(mismatch.actual),
                    ),
                )
            for pod, devices in exchange(key, ids, self._book.pending(), allocated=allocated).items():
                await self._write_back(pod, devices, cause=key)
        return found

    async def _unassigned_holder(self, key: str) -> bool:
        """Whether pod ``key``, listed by kubelet with devices but unknown to the pod book, is
        a live pod on this node without an assignment (kubelet still lists pods that were
        deleted or have terminated for a while; those are no mismatch)."""
        namespace, _, name = key.partition("/")
        try:
            pod = await self._store.get(Kind.POD, name, namespace=namespace)
        except errors.NotFound:
            return False
        if (pod.get("spec") or {}).get("nodeName") != self.node or is_terminated(pod):
            return False
        return salvage_assignment(pod) is None

    def _check_allocatable(self, allocatable: tuple[str, ...]) -> None:
        self._metrics.kubelet_allocatable.labels(node=self.node).set(len(allocatable))
        healthy = {d.ID for d in advertised(self._board) if d.health == HEALTHY}
        if set(allocatable) != healthy:
            log.debug(
                "kubelet's allocatable devices differ from the healthy ones advertised",
                extra=ctx(node=self.node, kubelet=sorted(allocatable), healthy=sorted(healthy)),
            )

    async def _write_back(self, key: str, ids: tuple[str, ...], *, cause: str) -> None:
        """Set pod ``key``'s assignment to ``ids`` (because of what kubelet gave pod ``cause``)."""
        index_of = {ident.uuid: index for index, ident in self._board.devices.items()}
        unknown = [u for u in ids if u not in index_of]
        if unknown:
            log.error(
                "kubelet reports devices this node does not have; not writing them",
                extra=ctx(node=self.node, pod=key, gpu=unknown),
            )
            return
        namespace, _, name = key.partition("/")
        try:
            pod = await self._store.get(Kind.POD, name, namespace=namespace)
        except errors.NotFound:
            return
        meta = pod.get("metadata") or {}
        if (pod.get("spec") or {}).get("nodeName") != self.node or is_terminated(pod):
            return
        annotations = meta.get("annotations") or {}
        was = salvage_assignment(pod)
        new = Assignment(self.node, tuple(index_of[u] for u in ids))
        if was == new:
            return
        now = format_time(self._now())
        patch = {
            "metadata": {
                "annotations": {
                    keys.ANN_ASSIGNED_GPUS: new.format(),
                    keys.ANN_ASSIGNED_UUIDS: ",".join(ids),
                    keys.ANN_ASSIGNED_AT: annotations.get(keys.ANN_ASSIGNED_AT) or now,
                    keys.ANN_ASSIGNMENT_CORRECTED: json.dumps(
                        {"was": was.format() if was else "", "at": now, "cause": cause},
                        sort_keys=True,
                    ),
                }
            }
        }
        try:
            await self._store.patch(
                Kind.POD,
                name,
                patch,
                namespace=namespace,
                resource_version=meta.get("resourceVersion") or None,
            )
        except errors.Conflict:
            log.info(
                "pod changed while correcting its assignment; next round", extra=ctx(node=self.node, pod=key)
            )
            return
        except errors.StoreError:
            self._metrics.writebacks.labels(node=self.node, result="error").inc()
            raise
        self._metrics.writebacks.labels(node=self.node, result="ok").inc()
        log.warning(
            "corrected the pod's assignment to what kubelet allocated",
            extra=ctx(
                node=self.node, pod=key, was=was.format() if was else None, gpu=new.format(), cause=cause
            ),
        )
