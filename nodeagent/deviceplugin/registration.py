"""The plugin's socket and its registration with kubelet, again after every kubelet restart.

Upstream kubelet (observed on v1.36) keeps plugins in ``/var/lib/kubelet/device-plugins/``
(``agent.device_plugin_dir`` here): it serves ``v1beta1.Registration`` on ``kubelet.sock``
there and, when it restarts, deletes the plugins' sockets in that directory and creates a new
``kubelet.sock``. :class:`PluginEndpoint` therefore loops:

1. wait until ``kubelet.sock`` exists (polling every ``device_plugin_poll_seconds``);
2. serve the DevicePlugin service on ``<dir>/<device_plugin_socket>`` (a stale file of that
   name is removed first);
3. ``Register(version=v1beta1, endpoint=<socket file name>, resource_name, options)`` (preferred
   allocation, no PreStartContainer: kubelet starts GPU containers while the agent is away); a
   failed registration is counted, logged and retried after the poll interval;
4. watch both files: when the plugin's socket disappears or ``kubelet.sock`` is replaced (a new
   inode) or removed, stop serving and start over at 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Final

import grpc

from flexlease.config import AgentSettings
from flexlease.logging import ctx
from nodeagent.deviceplugin import deviceplugin_pb2 as pb
from nodeagent.deviceplugin import rpc
from nodeagent.deviceplugin.metrics import DevicePluginMetrics
from nodeagent.deviceplugin.server import DevicePluginService, plugin_options

log = logging.getLogger(__name__)

API_VERSION: Final = "v1beta1"
KUBELET_SOCKET: Final = "kubelet.sock"
REGISTER_TIMEOUT_SECONDS: Final = 5.0


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


class PluginEndpoint:
    """Serves ``service`` on the plugin socket and keeps it registered with kubelet."""

    def __init__(
        self, service: DevicePluginService, settings: AgentSettings, metrics: DevicePluginMetrics
    ) -> None:
        self._service = service
        self._settings = settings
        self._metrics = metrics
        self.node = service.node
        self.dir = settings.device_plugin_dir
        self.socket = self.dir / settings.device_plugin_socket
        self.kubelet_socket = self.dir / KUBELET_SOCKET
        self.registrations = 0
        """Successful registrations so far (1 + re-registrations)."""
        self.registered = False
        """True from a successful registration until the plugin stops serving."""

    async def run(self) -> None:
        """Serve and register until cancelled (see the module docstring)."""
        poll = self._settings.device_plugin_poll_seconds
        while True:
            kubelet = await self._wait_for_kubelet(poll)
            server = await self._serve()
            try:
                if await self._register():
                    await self._watch(kubelet, poll)
                else:
                    await asyncio.sleep(poll)
            finally:
                self._set_registered(False)
                await server.stop(grace=0.1)

    def _set_registered(self, on: bool) -> None:
        self.registered = on
        self._metrics.registered.labels(node=self.node).set(1 if on else 0)

    async def _wait_for_kubelet(self, poll: float) -> int:
        logged = False
        while True:
            inode = _inode(self.kubelet_socket)
            if inode is not None:
                return inode
            if not logged:
                log.info(
                    "waiting for kubelet's device-plugin socket",
                    extra=ctx(node=self.node, path=str(self.kubelet_socket)),
                )
                logged = True
            await asyncio.sleep(poll)

    async def _serve(self) -> grpc.aio.Server:
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((self._service.handler(),))
        server.add_insecure_port(f"unix:{self.socket}")
        await server.start()
        return server

    async def _register(self) -> bool:
        request = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket.name,
            resource_name=self._settings.gpu_resource,
            options=plugin_options(),
        )
        try:
            async with grpc.aio.insecure_channel(f"unix:{self.kubelet_socket}") as channel:
                register = rpc.unary_call(channel, rpc.REGISTRATION, "Register", pb.Empty)
                await register(request, timeout=REGISTER_TIMEOUT_SECONDS)
        except grpc.aio.AioRpcError as exc:
            self._metrics.registrations.labels(node=self.node, result="error").inc()
            log.warning(
                "device plugin registration failed; retrying",
                extra=ctx(
                    node=self.node, resource=request.resource_name, code=exc.code().name, error=exc.details()
                ),
            )
            return False
        self.registrations += 1
        self._metrics.registrations.labels(node=self.node, result="ok").inc()
        self._set_registered(True)
        log.info(
            "registered with kubelet",
            extra=ctx(
                node=self.node,
                resource=request.resource_name,
                endpoint=str(self.socket),
                times=self.registrations,
            ),
        )
        return True

    async def _watch(self, kubelet: int, poll: float) -> None:
        while True:
            await asyncio.sleep(poll)
            if _inode(self.socket) is None:
                log.info(
                    "plugin socket removed (kubelet restarted?); registering again", extra=ctx(node=self.node)
                )
                return
            if _inode(self.kubelet_socket) != kubelet:
                log.info(
                    "kubelet socket replaced (kubelet restarted); registering again",
                    extra=ctx(node=self.node),
                )
                return
