"""A test kubelet for device plugins: kubelet's device manager and PodResources API over real
gRPC on unix sockets, behaving like upstream kubelet v1.36 (with containerd 1.6) where the
flexlease issue observed it:

* It serves ``v1beta1.Registration`` on ``<plugin_dir>/kubelet.sock``. On ``Register`` it
  checks the version (``v1beta1``) and the resource name (an extended resource
  ``<domain>/<name>``), takes the options from the request, dials
  ``<plugin_dir>/<endpoint>`` and follows the plugin's ``ListAndWatch`` stream; a second
  registration of a resource replaces the first.
* Admitting a pod (:meth:`DeviceKubelet.admit`, one pod at a time like kubelet's admission),
  for each container that requests ``n`` devices: ``GetPreferredAllocation(available=[every
  healthy, unallocated ID], must_include=[], size=n)`` when the plugin offers it and more than
  ``n`` are available (kubelet's devicemanager ``devicesToAllocate``: ``needed <
  aligned.Len()``), then ``Allocate(devices_ids=[the n chosen])``. A preference that is not a
  subset of the available devices of the right size is ignored (kubelet then takes the first
  ``n``). Too few healthy devices, or a plugin whose endpoint stopped → :class:`AdmissionError`
  (kubelet's UnexpectedAdmissionError); the pod is then rejected and no longer listed.
* **Before every start of a container** holding devices (the first and every restart:
  kubelet's ``GetDeviceRunContainerOptions`` → ``callPreStartContainerIfNeeded``,
  ``pkg/kubelet/cm/devicemanager/manager.go``), :meth:`DeviceKubelet.pre_start_container`
  calls ``PreStartContainer`` with the container's IDs in another order — only when the
  plugin registered with ``pre_start_required``. When that plugin's endpoint has stopped
  (its ``ListAndWatch`` stream ended: the plugin died or is restarting; kubelet keeps the
  stopped endpoint) the call fails with kubelet's message, ``device plugin
  PreStartContainer rpc failed with err: endpoint … has been stopped``
  (:class:`PreStartError`), and the container is not created (``CreateContainerConfigError``,
  :mod:`standins.kubelet_pods`). A plugin that does not require it is never called there.
* As kubelet's ``HandlePodAdditions`` adds a pod to its pod manager before admitting it (and
  the device manager releases its lock around GetPreferredAllocation), PodResources ``List``
  shows the pod being admitted, without devices, while the plugin is called.
* :meth:`DeviceKubelet.restart`: the plugin streams end, every socket in the directory is
  deleted (kubelet's checkpoint file kept) and ``kubelet.sock`` is created anew. Pods keep
  their devices and get no second ``Allocate``.
* ``v1.PodResourcesLister`` on ``pod_resources_socket``: ``List`` returns every admitted pod,
  one ``ContainerDevices`` entry per device; ``GetAllocatableResources`` every healthy device.
* Node status: :meth:`node_status` is the ``capacity``/``allocatable`` of the last node status
  update; updates run every ``node_status_seconds`` (kubelet: ~10 s), so a registration shows
  there only at the next one (or call :meth:`update_node_status`).

Used by ``tests/nodeagent/deviceplugin`` and by the demo (``hack/demo.py``), one per node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc

from flexlease import tasks
from nodeagent.deviceplugin import deviceplugin_pb2 as pb
from nodeagent.deviceplugin import podresources_pb2 as prpb
from nodeagent.deviceplugin import rpc

log = logging.getLogger(__name__)

KUBELET_SOCKET: Final = "kubelet.sock"
CHECKPOINT: Final = "kubelet_internal_checkpoint"
SUPPORTED_VERSIONS: Final = ("v1beta1",)
_EXTENDED_RESOURCE: Final = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
HEALTHY: Final = "Healthy"

Chooser = Callable[[Sequence[str], int], Sequence[str]]
"""Overrides kubelet's choice: ``(available, size) -> devices`` (tests forcing a mismatch)."""


class AdmissionError(Exception):
    """kubelet refused the pod (``UnexpectedAdmissionError``): not enough healthy devices, no
    plugin for the resource, or a plugin call failed."""


class PreStartError(Exception):
    """kubelet's ``callPreStartContainerIfNeeded`` failed: the container is not created
    (``CreateContainerConfigError``); the message is kubelet's."""


@dataclass(slots=True)
class Plugin:
    """One registered plugin as kubelet tracks it."""

    resource: str
    endpoint: str
    options: pb.DevicePluginOptions
    channel: Any
    devices: dict[str, str] = field(default_factory=dict)
    """ID → health from the latest ListAndWatch response."""
    updates: int = 0
    stream: asyncio.Task[None] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    stopped: bool = False
    """Its ``ListAndWatch`` stream ended (kubelet's ``PluginDisconnected``: the endpoint's stop
    time is set; it stays registered until the plugin registers again)."""


@dataclass(frozen=True, slots=True)
class Call:
    """One call kubelet made to a plugin (for assertions on the sequence)."""

    method: str
    devices: tuple[str, ...] = ()
    available: tuple[str, ...] = ()
    must_include: tuple[str, ...] = ()
    size: int = 0


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """What one container got: the IDs kubelet allocated and the plugin's response."""

    resource: str
    devices: tuple[str, ...]
    response: pb.ContainerAllocateResponse


@dataclass(slots=True)
class _Pod:
    namespace: str
    name: str
    containers: dict[str, list[ContainerAllocation]] = field(default_factory=dict)


class DeviceKubelet:
    """The test kubelet (see the module docstring). Use ``async with`` or start()/stop()."""

    def __init__(
        self, plugin_dir: Path, pod_resources_socket: Path, *, node_status_seconds: float = 10.0
    ) -> None:
        self.plugin_dir = plugin_dir
        self.kubelet_socket = plugin_dir / KUBELET_SOCKET
        self.pod_resources_socket = pod_resources_socket
        self.node_status_seconds = node_status_seconds
        self.plugins: dict[str, Plugin] = {}
        self.registrations: list[pb.RegisterRequest] = []
        self.calls: list[Call] = []
        self.restarts = 0
        self._pods: dict[tuple[str, str], _Pod] = {}
        self._registration: grpc.aio.Server | None = None
        self._pod_resources: grpc.aio.Server | None = None
        self._status_task: asyncio.Task[None] | None = None
        self._admission = asyncio.Lock()
        self._node_status: dict[str, dict[str, int]] = {"capacity": {}, "allocatable": {}}

    async def __aenter__(self) -> DeviceKubelet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Serve Registration and PodResources; start node status updates."""
        await asyncio.to_thread(self.plugin_dir.mkdir, parents=True, exist_ok=True)
        await asyncio.to_thread(self.pod_resources_socket.parent.mkdir, parents=True, exist_ok=True)
        await self._serve_registration()
        with contextlib.suppress(FileNotFoundError):
            self.pod_resources_socket.unlink()
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (
                rpc.service(
                    rpc.POD_RESOURCES,
                    {
                        "List": rpc.unary_handler(self._list, prpb.ListPodResourcesRequest),
                        "GetAllocatableResources": rpc.unary_handler(
                            self._allocatable, prpb.AllocatableResourcesRequest
                        ),
                    },
                ),
            )
        )
        server.add_insecure_port(f"unix:{self.pod_resources_socket}")
        await server.start()
        self._pod_resources = server
        self._status_task = asyncio.create_task(self._status_loop(), name="test-kubelet:node-status")

    async def _serve_registration(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.kubelet_socket.unlink()
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (
                rpc.service(
                    rpc.REGISTRATION, {"Register": rpc.unary_handler(self._register, pb.RegisterRequest)}
                ),
            )
        )
        server.add_insecure_port(f"unix:{self.kubelet_socket}")
        await server.start()
        self._registration = server

    async def _drop_plugins(self) -> None:
        plugins, self.plugins = self.plugins, {}
        for plugin in plugins.values():
            await self._close(plugin)

    @staticmethod
    async def _close(plugin: Plugin) -> None:
        if plugin.stream is not None:
            await tasks.stop(plugin.stream)
        await plugin.channel.close()
        plugin.changed.set()  # waiters on this plugin look again (at its successor, if any)

    async def stop(self) -> None:
        """Stop serving (plugin sockets are left as they are)."""
        if self._status_task is not None:
            await tasks.stop(self._status_task)
            self._status_task = None
        await self._drop_plugins()
        for server in (self._registration, self._pod_resources):
            if server is not None:
                await server.stop(grace=None)
        self._registration = self._pod_resources = None

    async def restart(self) -> None:
        """A kubelet restart: plugin streams end, the sockets in the plugin directory are deleted
        (the checkpoint kept), ``kubelet.sock`` is recreated. Admitted pods keep their devices."""
        if self._registration is not None:
            await self._registration.stop(grace=None)
            self._registration = None
        await self._drop_plugins()
        for path in await asyncio.to_thread(lambda: list(self.plugin_dir.iterdir())):
            if path.name != CHECKPOINT:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        self.restarts += 1
        await self._serve_registration()

    # -- Registration -------------------------------------------------------------------

    async def _register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        self.registrations.append(request)
        if request.version not in SUPPORTED_VERSIONS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Unsupported version {request.version!r}; supported: {list(SUPPORTED_VERSIONS)}",
            )
        if not _EXTENDED_RESOURCE.match(request.resource_name) or request.resource_name.startswith(
            "kubernetes.io/"
        ):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"invalid extended resource name {request.resource_name!r}"
            )
        old = self.plugins.pop(request.resource_name, None)
        if old is not None:
            await self._close(old)
        channel = grpc.aio.insecure_channel(f"unix:{self.plugin_dir / request.endpoint}")
        plugin = Plugin(request.resource_name, request.endpoint, request.options, channel)
        plugin.stream = asyncio.create_task(
            self._follow(plugin), name=f"test-kubelet:{request.resource_name}"
        )
        self.plugins[request.resource_name] = plugin
        return pb.Empty()

    async def _follow(self, plugin: Plugin) -> None:
        list_and_watch = rpc.stream_call(
            plugin.channel, rpc.DEVICE_PLUGIN, "ListAndWatch", pb.ListAndWatchResponse
        )
        try:
            async for response in list_and_watch(pb.Empty()):
                plugin.devices = {d.ID: d.health for d in response.devices}
                plugin.updates += 1
                plugin.changed.set()
                plugin.changed = asyncio.Event()
        except grpc.aio.AioRpcError as exc:
            log.info("ListAndWatch ended", extra={"resource": plugin.resource, "code": exc.code().name})
        finally:
            plugin.stopped = True
            plugin.changed.set()

    async def wait_registered(
        self, resource: str, *, registrations: int = 1, limit_s: float = 10.0
    ) -> Plugin:
        """The plugin for ``resource`` once it has registered ``registrations`` times in all and
        sent its first device list. Raises ``TimeoutError``."""

        async def wait() -> Plugin:
            while True:
                count = sum(1 for r in self.registrations if r.resource_name == resource)
                plugin = self.plugins.get(resource)
                if count >= registrations and plugin is not None and plugin.updates > 0:
                    return plugin
                await asyncio.sleep(0.02)

        return await asyncio.wait_for(wait(), limit_s)

    async def wait_devices(
        self, resource: str, predicate: Callable[[dict[str, str]], bool], *, limit_s: float = 10.0
    ) -> dict[str, str]:
        """The plugin's device list (ID → health) once ``predicate`` holds. Raises ``TimeoutError``."""

        async def wait() -> dict[str, str]:
            while True:
                plugin = self.plugins.get(resource)
                if plugin is not None and predicate(plugin.devices):
                    return dict(plugin.devices)
                if plugin is not None:
                    await plugin.changed.wait()
                else:
                    await asyncio.sleep(0.02)

        return await asyncio.wait_for(wait(), limit_s)

    # -- admission ----------------------------------------------------------------------

    def _in_use(self, resource: str) -> set[str]:
        return {
            d
            for pod in self._pods.values()
            for allocations in pod.containers.values()
            for a in allocations
            if a.resource == resource
            for d in a.devices
        }

    async def admit(
        self,
        namespace: str,
        name: str,
        containers: Sequence[tuple[str, int]],
        *,
        resource: str,
        choose: Chooser | None = None,
    ) -> dict[str, ContainerAllocation]:
        """Admit a pod whose containers ``(name, count)`` request ``resource`` (see the module
        docstring). Returns each requesting container's allocation. Raises
        :class:`AdmissionError`. An already admitted pod is not allocated again."""
        async with self._admission:
            existing = self._pods.get((namespace, name))
            if existing is not None:
                return {c: a[0] for c, a in existing.containers.items() if a}
            pod = _Pod(namespace, name)
            self._pods[(namespace, name)] = pod  # in the pod manager (and List) during admission
            try:
                for container, count in containers:
                    if count <= 0:
                        pod.containers[container] = []
                        continue
                    pod.containers[container] = [await self._allocate_container(pod, resource, count, choose)]
            except grpc.aio.AioRpcError as exc:
                del self._pods[(namespace, name)]
                raise AdmissionError(
                    f"{namespace}/{name}: plugin call failed: {exc.code().name}: {exc.details()}"
                ) from exc
            except AdmissionError:
                del self._pods[(namespace, name)]  # rejected: Failed, so no longer active
                raise
            return {c: a[0] for c, a in pod.containers.items() if a}

    async def _allocate_container(
        self, pod: _Pod, resource: str, count: int, choose: Chooser | None
    ) -> ContainerAllocation:
        plugin = self.plugins.get(resource)
        if plugin is None:
            raise AdmissionError(f"{pod.namespace}/{pod.name}: no device plugin registered for {resource}")
        if plugin.stopped:
            raise AdmissionError(
                f"{pod.namespace}/{pod.name}: UnexpectedAdmissionError: Allocate failed due to "
                f"{self._stopped_message(plugin)}, which is unexpected"
            )
        in_use = self._in_use(resource) | {
            d for allocations in pod.containers.values() for a in allocations for d in a.devices
        }
        available = sorted(i for i, h in plugin.devices.items() if h == HEALTHY and i not in in_use)
        if len(available) < count:
            raise AdmissionError(
                f"{pod.namespace}/{pod.name}: UnexpectedAdmissionError: requested {count} {resource}, "
                f"{len(available)} available"
            )
        chosen: list[str] = available[:count]
        if plugin.options.get_preferred_allocation_available and count < len(available):
            gpa = rpc.unary_call(
                plugin.channel, rpc.DEVICE_PLUGIN, "GetPreferredAllocation", pb.PreferredAllocationResponse
            )
            self.calls.append(Call("GetPreferredAllocation", available=tuple(available), size=count))
            answer = await gpa(
                pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(
                            available_deviceIDs=available, allocation_size=count
                        )
                    ]
                ),
                timeout=30,
            )
            preferred = list(answer.container_responses[0].deviceIDs) if answer.container_responses else []
            if len(preferred) == count and set(preferred) <= set(available):
                chosen = preferred
        if choose is not None:
            chosen = list(choose(available, count))
        allocate = rpc.unary_call(plugin.channel, rpc.DEVICE_PLUGIN, "Allocate", pb.AllocateResponse)
        self.calls.append(Call("Allocate", devices=tuple(chosen)))
        response = await allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=chosen)]),
            timeout=30,
        )
        if len(response.container_responses) != 1:
            raise AdmissionError(
                f"{pod.namespace}/{pod.name}: Allocate answered "
                f"{len(response.container_responses)} containers for 1"
            )
        return ContainerAllocation(resource, tuple(chosen), response.container_responses[0])

    def _stopped_message(self, plugin: Plugin) -> str:
        """kubelet's ``errEndpointStopped`` (``endpoint %v has been stopped``; kubelet prints
        its endpoint struct, the stand-in the socket and the resource)."""
        return f"endpoint &{{{self.plugin_dir / plugin.endpoint} {plugin.resource}}} has been stopped"

    async def pre_start_container(self, namespace: str, name: str, container: str) -> None:
        """kubelet before it creates ``container`` of the pod (each start): for each resource
        the container was allocated, ``PreStartContainer`` when the plugin requires it (see
        the module docstring). Raises :class:`PreStartError` with kubelet's message."""
        pod = self._pods.get((namespace, name))
        for allocation in pod.containers.get(container, []) if pod is not None else []:
            plugin = self.plugins.get(allocation.resource)
            if plugin is None:
                raise PreStartError(
                    f"endpoint not found in cache for a registered resource: {allocation.resource}"
                )
            if not plugin.options.pre_start_required:
                continue  # "Plugin options indicate to skip PreStartContainer for resource"
            if plugin.stopped:
                raise PreStartError(
                    f"device plugin PreStartContainer rpc failed with err: {self._stopped_message(plugin)}"
                )
            pre_start = rpc.unary_call(
                plugin.channel, rpc.DEVICE_PLUGIN, "PreStartContainer", pb.PreStartContainerResponse
            )
            reordered = list(reversed(allocation.devices))  # kubelet's order is a set's
            self.calls.append(Call("PreStartContainer", devices=tuple(reordered)))
            try:
                await pre_start(pb.PreStartContainerRequest(devices_ids=reordered), timeout=30)
            except grpc.aio.AioRpcError as exc:
                code = exc.code().name.title().replace("_", "")  # Go's names: Unavailable, …
                raise PreStartError(
                    "device plugin PreStartContainer rpc failed with err: "
                    f"rpc error: code = {code} desc = {exc.details()}"
                ) from exc

    def remove(self, namespace: str, name: str) -> None:
        """The pod is gone: its devices are free again (no plugin call, as in kubelet)."""
        self._pods.pop((namespace, name), None)

    def allocations(self, namespace: str, name: str) -> dict[str, tuple[ContainerAllocation, ...]]:
        """Container → what it was allocated (IDs and the plugin's response); empty when the
        pod was not admitted."""
        pod = self._pods.get((namespace, name))
        return {} if pod is None else {c: tuple(a) for c, a in pod.containers.items() if a}

    def allocated(self, namespace: str, name: str) -> dict[str, tuple[str, ...]]:
        """Container → device IDs kubelet allocated to the pod (empty when not admitted)."""
        pod = self._pods.get((namespace, name))
        if pod is None:
            return {}
        return {
            c: tuple(d for a in allocs for d in a.devices) for c, allocs in pod.containers.items() if allocs
        }

    # -- PodResources -------------------------------------------------------------------

    async def _list(
        self, request: prpb.ListPodResourcesRequest, context: Any
    ) -> prpb.ListPodResourcesResponse:
        response = prpb.ListPodResourcesResponse()
        for pod in self._pods.values():
            entry = response.pod_resources.add(name=pod.name, namespace=pod.namespace)
            for container, allocations in pod.containers.items():
                c = entry.containers.add(name=container)
                for a in allocations:
                    for device in a.devices:  # one entry per device, as kubelet sends them
                        c.devices.add(resource_name=a.resource, device_ids=[device])
        return response

    async def _allocatable(
        self, request: prpb.AllocatableResourcesRequest, context: Any
    ) -> prpb.AllocatableResourcesResponse:
        response = prpb.AllocatableResourcesResponse()
        for resource, plugin in sorted(self.plugins.items()):
            for device, health in sorted(plugin.devices.items()):
                if health == HEALTHY:
                    response.devices.add(resource_name=resource, device_ids=[device])
        return response

    # -- node status --------------------------------------------------------------------

    def update_node_status(self) -> dict[str, dict[str, int]]:
        """One node status update: ``capacity`` = every device of each registered resource,
        ``allocatable`` = the healthy ones."""
        self._node_status = {
            "capacity": {r: len(p.devices) for r, p in self.plugins.items()},
            "allocatable": {
                r: sum(1 for h in p.devices.values() if h == HEALTHY) for r, p in self.plugins.items()
            },
        }
        return self._node_status

    def node_status(self) -> dict[str, dict[str, int]]:
        """``{"capacity": {resource: n}, "allocatable": {resource: n}}`` as of the last update."""
        return self._node_status

    async def _status_loop(self) -> None:
        while True:
            await asyncio.sleep(self.node_status_seconds)
            self.update_node_status()
