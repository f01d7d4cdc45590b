"""Agent wiring for the containerd-side components: ``cache`` (CRI connection, image
pre-pull, checkpoint cache, ``GPUNode.status.cache``) and ``hotrestart`` (the controller,
with streaming-data staging around each restart when ``agent.staging_nats_url`` is set; then
also the prelaunch for reclaim pods, :mod:`nodeagent.reclaim`, with the same staging hook).

:func:`runtime_components` builds both around one shared
:class:`~nodeagent.cache.component.NodeRuntime`; ``nodeagent.agent.components`` appends them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from flexlease import errors
from flexlease.api import keys
from flexlease.prelaunch import PrelaunchInputs, prelaunch_window
from flexlease.store.base import JsonObj
from flexlease.store.kube_util import EventRecorder
from flexlease.streaming.jetstream import JetStreamBroker
from nodeagent.cache.component import CacheComponent, NodeRuntime
from nodeagent.hotrestart.controller import HotRestartController, HotRestartMetrics
from nodeagent.hotrestart.model import Strategy
from nodeagent.hotrestart.restarter import HotRestarter
from nodeagent.prelaunch import Bandwidths
from nodeagent.reclaim import ReclaimPrelaunch
from nodeagent.staging import Stager, StagingMetrics

if TYPE_CHECKING:
    from nodeagent.context import AgentContext, Component


async def restart_window(runtime: NodeRuntime, pod: JsonObj, *, image: str) -> float:
    """W for a hot restart of ``pod`` into ``image`` (formulas 1–3, default bandwidths):
    S_img from the runtime (η_cache = 1 when the image is on the node, else the size is
    unknown and counted 0), S_ckpt from the node's checkpoint cache for the pod's
    ``flexlease.io/checkpoint`` (η_ckpt = 1 when cached). Seconds."""
    b = Bandwidths()
    try:
        present = await runtime.cri.image_status(image)
    except errors.CriError:
        present = None
    ckpt_id = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.ANN_CHECKPOINT)
    entry = runtime.checkpoints.get(ckpt_id) if ckpt_id else None
    return prelaunch_window(
        PrelaunchInputs(
            image_bytes=float(present.size_bytes if present else 0),
            checkpoint_bytes=float(entry.size_bytes if entry else 0),
            net_bps=b.net_bps,
            registry_bps=b.registry_bps,
            storage_bps=b.storage_bps,
            gpu_bps=b.gpu_bps,
            image_hit_ratio=1.0 if present else 0.0,
            checkpoint_hit_ratio=1.0 if entry else 0.0,
        )
    ).window_seconds


class RuntimeStaging:
    """The hot-restart controller's staging hook: W from :func:`restart_window`, then
    :meth:`Stager.begin`; returns the staging's ``restarted``."""

    def __init__(self, stager: Stager, runtime: NodeRuntime) -> None:
        self.stager = stager
        self.runtime = runtime

    async def begin(self, pod: JsonObj, *, image: str) -> Callable[[], None] | None:
        window = await restart_window(self.runtime, pod, image=image)
        staging = await self.stager.begin(pod, window_seconds=window)
        return staging.restarted if staging is not None else None


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
            checkpoints=self.runtime.checkpoints,
            kubelet_wait_seconds=s.hot_restart_kubelet_wait_seconds,
            rollback=s.hot_restart_rollback,
        )

        strategy = None if s.hot_restart_strategy == "auto" else Strategy(s.hot_restart_strategy)

        def controller(staging: RuntimeStaging | None) -> HotRestartController:
            return HotRestartController(
                ctx.store,
                self.runtime.cri,
                restarter,
                node=ctx.node,
                default_strategy=strategy,
                metrics=self.metrics,
                events=EventRecorder(ctx.store, component="flexlease-agent", instance=ctx.node),
                staging=staging,
                rollback=s.hot_restart_rollback,
            )

        if s.staging_nats_url is None:
            self.controller = controller(None)
            await self.controller.run()
            return
        async with JetStreamBroker(s.staging_nats_url) as broker:
            stager = Stager(
                broker,
                ctx.store,
                StagingMetrics(ctx.registry, node=ctx.node),
                node=ctx.node,
                rate_sample_seconds=s.staging_rate_sample_seconds,
                poll_seconds=s.staging_poll_seconds,
                max_hold_seconds=s.staging_max_hold_seconds,
            )
            hook = RuntimeStaging(stager, self.runtime)
            self.controller = controller(hook)
            reclaims = ReclaimPrelaunch(ctx.store, hook, node=ctx.node, puller=self.runtime.images)
            async with asyncio.TaskGroup() as tg:
                tg.create_task(stager.run(), name="staging")
                tg.create_task(self.controller.run(), name="hotrestart-controller")
                tg.create_task(reclaims.run(), name="reclaim-prelaunch")


def runtime_components(ctx: AgentContext) -> list[Component]:
    """The ``cache`` and ``hotrestart`` components, sharing one :class:`NodeRuntime`."""
    runtime = NodeRuntime(ctx.settings.agent, ctx.registry)
    return [CacheComponent(runtime), HotRestartComponent(runtime, HotRestartMetrics(ctx.registry))]
