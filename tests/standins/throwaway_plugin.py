"""A throwaway device plugin (the one the issue used to check kubelet): serves ``v1beta1``
DevicePlugin on a unix socket with fixed devices, records the calls it gets, registers with a
kubelet with the options given, and can be stopped (the plugin going away)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from nodeagent.deviceplugin import deviceplugin_pb2 as pb
from nodeagent.deviceplugin import rpc


class ThrowawayPlugin:
    """Devices ``ids`` (all Healthy) for ``resource``; ``Allocate`` answers ``DEVICES=<ids>``;
    ``PreStartContainer`` is recorded in :attr:`pre_starts`."""

    def __init__(self, plugin_dir: Path, resource: str, ids: list[str], *, pre_start_required: bool) -> None:
        self.socket = plugin_dir / "throwaway.sock"
        self.resource = resource
        self.ids = ids
        self.options = pb.DevicePluginOptions(pre_start_required=pre_start_required)
        self.pre_starts: list[list[str]] = []
        self._server: grpc.aio.Server | None = None
        self._stopped = asyncio.Event()

    async def _options(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return self.options

    async def _list_and_watch(
        self, request: pb.Empty, context: Any
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health="Healthy") for i in self.ids])
        await self._stopped.wait()

    async def _allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        return pb.AllocateResponse(
            container_responses=[
                pb.ContainerAllocateResponse(envs={"DEVICES": ",".join(r.devices_ids)})
                for r in request.container_requests
            ]
        )

    async def _pre_start(
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        self.pre_starts.append(list(request.devices_ids))
        return pb.PreStartContainerResponse()

    async def start(self, kubelet_socket: Path) -> None:
        """Serve, then register with the kubelet on ``kubelet_socket``."""
        self._stopped.clear()
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (
                rpc.service(
                    rpc.DEVICE_PLUGIN,
                    {
                        "GetDevicePluginOptions": rpc.unary_handler(self._options, pb.Empty),
                        "ListAndWatch": rpc.stream_handler(self._list_and_watch, pb.Empty),
                        "Allocate": rpc.unary_handler(self._allocate, pb.AllocateRequest),
                        "PreStartContainer": rpc.unary_handler(self._pre_start, pb.PreStartContainerRequest),
                    },
                ),
            )
        )
        self.socket.unlink(missing_ok=True)
        server.add_insecure_port(f"unix:{self.socket}")
        await server.start()
        self._server = server
        request = pb.RegisterRequest(
            version="v1beta1", endpoint=self.socket.name, resource_name=self.resource, options=self.options
        )
        async with grpc.aio.insecure_channel(f"unix:{kubelet_socket}") as channel:
            await rpc.unary_call(channel, rpc.REGISTRATION, "Register", pb.Empty)(request, timeout=5)

    async def stop(self) -> None:
        """The plugin goes away: its streams end and its socket stops answering."""
        self._stopped.set()
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
