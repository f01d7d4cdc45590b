"""Agent wiring for the containerd-side components: ``cache`` (CRI connection, image
pre-pull, checkpoint cache, ``GPUNode.status.cache``) and ``hotrestart`` (the controller).

:func:`runtime_components` builds both around one shared
:class:`~nodeagent.cache.component.NodeRuntime`; ``nodeagent.agent.components`` appends them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flexlease.store.kube_util import EventRecorder
from nodeagent.cache.component import CacheComponent, NodeRuntime
from nodeagent.hotrestart.controller import HotRestartController, HotRestartMetrics
from nodeagent.hotrestart.model import Strategy
from nodeagent.hotrestart.restarter import HotRestarter

if TYPE_CHECKING:
    from nodeagent.agent import AgentContext, Component


class HotRestartComponent:
    """Agent component ``hotrestart``: reconciles this node's hot-restart requests. Ready
    once the node's pods are listed."""

    name = "hotrestart"

    def __init__(self, runtime: NodeRuntime, metrics: HotRestartMetrics) -> None:
        self.runtime = runtime
        self.metrics = metrics
        self.controller: HotRestartController | None = None

    def ready(self) -> bool:
        return self.controller is not None and self.controller.ready()

    async def run(self, ctx: AgentContext) -> None:
        s = ctx.settings.agent
        restarter = HotRestarter(
            self.runtime.cri,
            self.runtime.images,
            images=self.runtime.cri,
            checkpoints=self.runtime.checkpoints,
        )
        self.controller = HotRestartController(
            ctx.store,
            self.runtime.cri,
            restarter,
            node=ctx.node,
            default_strategy=None if s.hot_restart_strategy == "auto" else Strategy(s.hot_restart_strategy),
            metrics=self.metrics,
            images=self.runtime.cri,
            events=EventRecorder(ctx.store, component="flexlease-agent", instance=ctx.node),
        )
        await self.controller.run()


def runtime_components(ctx: AgentContext) -> list[Component]:
    """The ``cache`` and ``hotrestart`` components, sharing one :class:`NodeRuntime`."""
    runtime = NodeRuntime(ctx.settings.agent, ctx.registry)
    return [CacheComponent(runtime), HotRestartComponent(runtime, HotRestartMetrics(ctx.registry))]
