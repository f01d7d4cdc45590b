"""The ``v1beta1.DevicePlugin`` gRPC service kubelet calls on the plugin's socket.

* ``GetDevicePluginOptions`` (:func:`plugin_options`, also sent with the registration): preferred
  allocation available; PreStartContainer **not** required. kubelet calls a plugin that
  requires it before every start of a container holding its devices
  (``callPreStartContainerIfNeeded``), and fails that start
  (``CreateContainerConfigError: device plugin PreStartContainer rpc failed … has been
  stopped``) while the plugin is away; so with it required, a GPU container that died while
  the agent was down (a rollout, a crash, an OOM kill) stayed down until the agent came back.
  The answer never depended on the agent anyway: kubelet restarts GPU containers without it.
* ``ListAndWatch``: the node's GPUs as devices (ID = NVML UUID; ``Healthy`` only when the
  health board says so: ``Unhealthy`` and ``Unknown`` are sent as ``Unhealthy``), sent at once
  and again at every change of the board, so a GPU that fails stops being allocatable and one
  that recovers comes back without a restart.
* ``GetPreferredAllocation``: for each container request, the assigned devices of the pod
  being admitted (:func:`~nodeagent.deviceplugin.matching.prefer`, told which pods kubelet's
  PodResources ``List`` shows: the one being admitted is among them).
* ``Allocate``: maps each container's device set back to the one pod whose assignment holds
  it (:func:`~nodeagent.deviceplugin.matching.allocated_pod`), records it, and answers with
  ``NVIDIA_VISIBLE_DEVICES`` (and device nodes / CDI names when configured). Devices that are
  no pod's assignment are still allocated (kubelet decided; refusing would fail the pod) and
  counted as ``unmatched``; the PodResources reconcile writes the truth back.
* ``PreStartContainer``: served for callers that make it anyway (kubelet does not: the option
  is off); checks the device set (kubelet may reorder it) against what was allocated, and
  answers.

When no pod fits yet, or only pods that kubelet does not list (the agent's pod watch trailing
kubelet's: the pod being admitted is not in the pod book yet), the answer waits up to
``agent.device_plugin_match_wait_seconds`` for the watch to catch up, then answers with what it
has.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final, TypeVar

import grpc

from flexlease.api.resources import Health
from flexlease.config import AgentSettings
from flexlease.logging import ctx
from nodeagent.deviceplugin import deviceplugin_pb2 as pb
from nodeagent.deviceplugin import rpc
from nodeagent.deviceplugin.matching import PendingPod, Preference, PreferenceKind, allocated_pod, prefer
from nodeagent.deviceplugin.metrics import UNLISTED, DevicePluginMetrics
from nodeagent.deviceplugin.pods import PodBook
from nodeagent.deviceplugin.response import container_response
from nodeagent.health.board import NodeBoard

log = logging.getLogger(__name__)


def plugin_options() -> pb.DevicePluginOptions:
    """The plugin's options (registration and ``GetDevicePluginOptions``): preferred
    allocation available, PreStartContainer not required (see the module docstring)."""
    return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


_T = TypeVar("_T")

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


def advertised(board: NodeBoard) -> list[pb.Device]:
    """The devices to advertise: every enumerated GPU by index, ID = UUID, health
    ``Healthy`` only when the board says Healthy."""
    out = []
    for index, ident in sorted(board.devices.items()):
        state = board.health.get(index)
        healthy = state is not None and state.health is Health.HEALTHY
        out.append(pb.Device(ID=ident.uuid, health=HEALTHY if healthy else UNHEALTHY))
    return out


_DOUBTFUL: Final = frozenset({PreferenceKind.NONE, PreferenceKind.ORDERED, PreferenceKind.UNFIT})
"""Preferences logged at warning: no pod's devices, a guess, or a pod whose assignment does
not fit."""


class DevicePluginService:
    """The servicer (``grpc.aio``), for node ``board.node``'s GPUs and ``book``'s pods."""

    def __init__(
        self,
        board: NodeBoard,
        book: PodBook,
        settings: AgentSettings,
        metrics: DevicePluginMetrics,
        *,
        listed: Callable[[], Awaitable[Mapping[str, frozenset[str]] | None]] | None = None,
    ) -> None:
        """``listed``: reads kubelet's PodResources ``List`` (pod → device IDs; None when it
        does not answer), asked once per preferred-allocation request."""
        self._listed = listed
        self._board = board
        self._book = book
        self._settings = settings
        self._metrics = metrics
        self.node = board.node

    def handler(self) -> grpc.GenericRpcHandler:
        """This service as a gRPC generic handler (``v1beta1.DevicePlugin``)."""
        return rpc.service(
            rpc.DEVICE_PLUGIN,
            {
                "GetDevicePluginOptions": rpc.unary_handler(self.GetDevicePluginOptions, pb.Empty),
                "ListAndWatch": rpc.stream_handler(self.ListAndWatch, pb.Empty),
                "GetPreferredAllocation": rpc.unary_handler(
                    self.GetPreferredAllocation, pb.PreferredAllocationRequest
                ),
                "Allocate": rpc.unary_handler(self.Allocate, pb.AllocateRequest),
                "PreStartContainer": rpc.unary_handler(self.PreStartContainer, pb.PreStartContainerRequest),
            },
        )

    # -- helpers ------------------------------------------------------------------------

    def _minors(self) -> dict[str, int | None]:
        return {ident.uuid: ident.minor_number for ident in self._board.devices.values()}

    async def _until(self, found: Callable[[_T], bool], compute: Callable[[], _T]) -> _T:
        """``compute()`` until ``found(result)`` or the match wait is over (then the last)."""
        deadline = time.monotonic() + self._settings.device_plugin_match_wait_seconds
        while True:
            changed = self._book.changed()
            result = compute()
            left = deadline - time.monotonic()
            if found(result) or left <= 0:
                return result
            try:
                await asyncio.wait_for(changed.wait(), left)
            except TimeoutError:
                return compute()

    # -- DevicePlugin -------------------------------------------------------------------

    async def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return plugin_options()

    async def ListAndWatch(self, request: pb.Empty, context: Any) -> AsyncIterator[pb.ListAndWatchResponse]:
        changed = self._board.subscribe()
        last: list[tuple[str, str]] | None = None
        try:
            while True:
                changed.clear()  # before reading: a change from here on wakes the next round
                devices = advertised(self._board)
                current = [(d.ID, d.health) for d in devices]
                if current != last:
                    last = current
                    healthy = sum(1 for _, h in current if h == HEALTHY)
                    self._metrics.devices.labels(node=self.node, health=HEALTHY).set(healthy)
                    self._metrics.devices.labels(node=self.node, health=UNHEALTHY).set(len(current) - healthy)
                    log.info(
                        "ListAndWatch: sending devices",
                        extra=ctx(node=self.node, devices=len(current), healthy=healthy),
                    )
                    yield pb.ListAndWatchResponse(devices=devices)
                await changed.wait()
        finally:
            self._board.unsubscribe(changed)

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        response = pb.PreferredAllocationResponse()
        for creq in request.container_requests:
            available = list(creq.available_deviceIDs)
            must = list(creq.must_include_deviceIDs)
            size = int(creq.allocation_size)
            if size < 0 or size > len(available) or not set(must) <= set(available):
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"allocation_size {size} with {len(available)} available and must_include {must}",
                )

            # kubelet's pods now (the one being admitted among them), read once: it admits one
            # pod at a time, so the list does not change while this request waits. Not needed
            # when must_include names the pod.
            listed = await self._listed() if self._listed is not None and not must else None

            def compute(
                available: list[str] = available,
                must: list[str] = must,
                size: int = size,
                listed: Mapping[str, frozenset[str]] | None = listed,
            ) -> Preference:
                return prefer(self._book.pending(), available, must, size, listed=listed)

            def settled(p: Preference, listed: Mapping[str, frozenset[str]] | None = listed) -> bool:
                # a pod kubelet does not list is not the one it admits: the pod watch trails
                # kubelet's, so wait for the pod kubelet is admitting to show up in the book
                return p.kind is not PreferenceKind.NONE and (listed is None or p.pod in listed)

            pref = await self._until(settled, compute)
            # the match wait ran out with a pod kubelet does not list: answered as before
            # (that pod's devices), but it is likely not the one being admitted
            unlisted = not settled(pref) and pref.kind is not PreferenceKind.NONE
            match = UNLISTED if unlisted else pref.kind.value
            self._metrics.preferred.labels(node=self.node, match=match).inc()
            doubtful = unlisted or pref.kind in _DOUBTFUL
            level = logging.WARNING if doubtful else logging.INFO
            log.log(
                level,
                "GetPreferredAllocation",
                extra=ctx(
                    node=self.node,
                    pod=pref.pod,
                    match=match,
                    gpu=list(pref.devices),
                    size=size,
                    available=len(available),
                    also_fitting=list(pref.others) or None,
                ),
            )
            response.container_responses.append(
                pb.ContainerPreferredAllocationResponse(deviceIDs=pref.devices)
            )
        return response

    async def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        known = {ident.uuid for ident in self._board.devices.values()}
        response = pb.AllocateResponse()
        for creq in request.container_requests:
            ids = list(creq.devices_ids)
            unknown = [i for i in ids if i not in known]
            if unknown:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown device IDs {unknown}")

            def compute(ids: list[str] = ids) -> PendingPod | None:
                return allocated_pod(self._book.pending(), ids)

            pod = await self._until(lambda p: p is not None, compute)
            if pod is not None:
                self._book.record_allocation(pod.key, ids)
                ordered = [u for u in pod.uuids if u in set(ids)]
                self._metrics.allocations.labels(node=self.node, result="matched").inc()
                log.info(
                    "Allocate: devices of the assigned pod",
                    extra=ctx(node=self.node, pod=pod.key, gpu=ordered),
                )
            else:
                ordered = ids
                self._metrics.allocations.labels(node=self.node, result="unmatched").inc()
                log.warning(
                    "Allocate: devices are no pod's assignment; allocating as kubelet chose",
                    extra=ctx(node=self.node, gpu=ids),
                )
            response.container_responses.append(
                container_response(
                    ordered,
                    self._minors(),
                    device_specs=self._settings.device_plugin_device_specs,
                    cdi_prefix=self._settings.cdi_prefix,
                )
            )
        return response

    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        ids = set(request.devices_ids)
        pod = allocated_pod(self._book.pending(), ids)
        if pod is None or not ids <= pod.allocated:
            log.warning(
                "PreStartContainer: devices not allocated to one pod",
                extra=ctx(node=self.node, gpu=sorted(ids)),
            )
        else:
            log.debug("PreStartContainer", extra=ctx(node=self.node, pod=pod.key, gpu=sorted(ids)))
        return pb.PreStartContainerResponse()
