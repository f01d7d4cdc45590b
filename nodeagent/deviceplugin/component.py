"""Agent component ``deviceplugin``: the pod watch, the PodResources reconcile and the plugin
endpoint, run together.

Start order: the pod watch lists this node's pods and one PodResources round records what
kubelet already allocated (after an agent restart nothing looks pending that is not), then
the plugin serves and registers. Ready once registered with kubelet.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from flexlease.store.base import Kind, Selector
from flexlease.store.informer import Informer
from nodeagent.deviceplugin.metrics import DevicePluginMetrics
from nodeagent.deviceplugin.pods import PodBook
from nodeagent.deviceplugin.reconcile import PodResourcesReconciler
from nodeagent.deviceplugin.registration import PluginEndpoint
from nodeagent.deviceplugin.server import DevicePluginService

if TYPE_CHECKING:
    from nodeagent.context import AgentContext


class DevicePluginComponent:
    """Runs the device plugin of ``ctx.node`` until cancelled."""

    name = "deviceplugin"

    def __init__(self) -> None:
        self.endpoint: PluginEndpoint | None = None
        self.book: PodBook | None = None
        self.reconciler: PodResourcesReconciler | None = None

    def ready(self) -> bool:
        return self.endpoint is not None and self.endpoint.registered

    async def run(self, ctx: AgentContext) -> None:
        s = ctx.settings.agent
        board = ctx.board
        metrics = DevicePluginMetrics(ctx.registry, ctx.node)

        def uuid_of(index: int) -> str | None:
            ident = board.devices.get(index)
            return ident.uuid if ident is not None else None

        book = PodBook(ctx.node, uuid_of)
        informer = Informer(
            ctx.store,
            Kind.POD,
            handler=book.on_event,
            selector=Selector(fields={"spec.nodeName": ctx.node}),
            name=f"deviceplugin-pods:{ctx.node}",
        )
        reconciler = PodResourcesReconciler(book, board, ctx.store, s, metrics)
        service = DevicePluginService(board, book, s, metrics, listed=reconciler.listed)
        endpoint = PluginEndpoint(service, s, metrics)
        self.book, self.reconciler = book, reconciler
        async with asyncio.TaskGroup() as tg:
            tg.create_task(informer.run(), name=informer.name)
            await informer.listed.wait()
            await reconciler.reconcile_logged()
            self.endpoint = endpoint
            tg.create_task(endpoint.run(), name=f"deviceplugin-endpoint:{ctx.node}")
            tg.create_task(reconciler.run(), name=f"deviceplugin-podresources:{ctx.node}")
