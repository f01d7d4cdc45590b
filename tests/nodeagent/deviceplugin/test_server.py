"""The DevicePlugin service's ListAndWatch stream, driven directly (no gRPC): a health change
made while kubelet has not yet asked for the next list is still sent."""

from __future__ import annotations

import asyncio
from pathlib import Path

from flexlease.clock import ManualClock
from flexlease.store.memory import MemoryStore
from nodeagent.deviceplugin import deviceplugin_pb2 as pb
from nodeagent.deviceplugin.metrics import DevicePluginMetrics
from nodeagent.deviceplugin.pods import PodBook
from nodeagent.deviceplugin.server import DevicePluginService
from nodeagent.health.backend import DeviceEvent, EventKind
from tests.nodeagent.health.kit import NODE, START, make_context, make_settings, node_config


async def test_a_change_while_the_previous_list_is_in_flight_is_sent(tmp_path: Path) -> None:
    ctx, backend = await make_context(
        make_settings(tmp_path), MemoryStore(), ManualClock(START), node_config(2)
    )
    board = ctx.board
    board.set_devices(await backend.start(), START)
    for index in sorted(board.devices):
        board.apply_sample(await backend.query(index))
    service = DevicePluginService(
        board, PodBook(NODE, lambda _i: None), ctx.settings.agent, DevicePluginMetrics(ctx.registry, NODE)
    )
    stream = service.ListAndWatch(pb.Empty(), None)
    try:
        first = await anext(stream)
        assert [d.health for d in first.devices] == ["Healthy", "Healthy"]
        # GPU 1 fails after the first list is yielded, before kubelet reads the next one
        assert board.apply_event(DeviceEvent(1, EventKind.XID, START + 1, xid=79)) is not None
        second = await asyncio.wait_for(anext(stream), 10)
        assert [(d.ID, d.health) for d in second.devices] == [
            (board.devices[0].uuid, "Healthy"),
            (board.devices[1].uuid, "Unhealthy"),
        ]
    finally:
        await stream.aclose()
