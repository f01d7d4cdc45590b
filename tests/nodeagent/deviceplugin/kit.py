"""A node for the device-plugin tests: the agent's health watch and device plugin running
against the test kubelet (standins.kubelet_devices) over real gRPC on unix sockets, with a
MemoryStore and simulated GPUs on a ManualClock."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flexlease.api import keys
from flexlease.clock import ManualClock
from flexlease.sim import objects
from flexlease.store.base import JsonObj, Kind
from flexlease.store.memory import MemoryStore
from nodeagent import agent
from nodeagent.context import AgentContext
from nodeagent.deviceplugin.component import DevicePluginComponent
from nodeagent.health.simulated import SimulatedBackend
from nodeagent.health.watch import HealthWatch
from standins.kubelet_devices import DeviceKubelet
from tests.nodeagent.health.kit import NODE, START, eventually, make_context, make_settings, node_config

RESOURCE = keys.DEFAULT_GPU_RESOURCE


@dataclass
class Node:
    ctx: AgentContext
    store: MemoryStore
    clock: ManualClock
    backend: SimulatedBackend
    kubelet: DeviceKubelet
    plugin: DevicePluginComponent
    dir: Path
    stop: asyncio.Event
    task: asyncio.Task[None]

    @property
    def uuids(self) -> list[str]:
        """UUIDs by NVML index."""
        return [self.ctx.board.devices[i].uuid for i in sorted(self.ctx.board.devices)]

    async def bind(
        self, name: str, indices: list[int], *, namespace: str = "default", image: str | None = None
    ) -> JsonObj:
        """A pod requesting ``len(indices)`` GPUs, as the extender's bind leaves it: assigned
        ``indices`` of this node (annotations) and bound (``spec.nodeName``). With ``image``:
        a pod to run (that image, ``restartPolicy: Always``, a 3 s grace period)."""
        pod = objects.pod(name, namespace, gpus=len(indices), priority=keys.PRIORITY_LOW, owner=name)
        pod["spec"]["nodeName"] = NODE
        if image is not None:
            pod["spec"]["containers"][0]["image"] = image
            pod["spec"].update(restartPolicy="Always", terminationGracePeriodSeconds=3)
        pod["metadata"]["annotations"].update(
            {
                keys.ANN_ASSIGNED_GPUS: f"{NODE}:{','.join(str(i) for i in indices)}",
                keys.ANN_ASSIGNED_UUIDS: ",".join(self.uuids[i] for i in indices),
                keys.ANN_ASSIGNED_AT: "2026-11-22T12:00:00Z",
            }
        )
        return await self.store.create(Kind.POD, pod)

    def ids(self, *indices: int) -> frozenset[str]:
        """The UUIDs of NVML ``indices``."""
        return frozenset(self.uuids[i] for i in indices)

    async def admit(self, name: str, count: int, *, namespace: str = "default", **kw: Any) -> frozenset[str]:
        """kubelet admits the pod (one container ``main``); returns the IDs allocated (a set:
        kubelet's order is its own)."""
        got = await self.kubelet.admit(namespace, name, [("main", count)], resource=RESOURCE, **kw)
        return frozenset(got["main"].devices)

    async def advance(self, seconds: float, *, step: float = 5.0) -> None:
        """Advance the ManualClock, letting the health watch run between steps."""
        target = self.clock.now() + seconds
        while self.clock.now() < target:
            await eventually(lambda: self.clock.sleepers >= 1)
            await self.clock.advance(min(step, target - self.clock.now()))
        await eventually(lambda: self.clock.sleepers >= 1)


@asynccontextmanager
async def running_node(
    *, gpus: int = 4, events: list[dict[str, Any]] | None = None, **agent_settings: Any
) -> AsyncIterator[Node]:
    """The node, with the plugin registered and every GPU advertised Healthy."""
    # unix socket paths are limited to 107 bytes: keep them short
    base = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    options: dict[str, Any] = {
        "device_plugin_dir": base / "dp",
        "pod_resources_socket": base / "pr" / "kubelet.sock",
        "device_plugin_poll_seconds": 0.02,
        "pod_resources_seconds": 3600.0,
        "device_plugin_match_wait_seconds": 2.0,
        "recovery_hold_down_seconds": 60.0,
    }
    options.update(agent_settings)
    settings = make_settings(base, **options)
    store = MemoryStore()
    clock = ManualClock(START)
    ctx, backend = await make_context(settings, store, clock, node_config(gpus, events=events))
    kubelet = DeviceKubelet(settings.agent.device_plugin_dir, settings.agent.pod_resources_socket)
    await kubelet.start()
    plugin = DevicePluginComponent()
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(ctx, [HealthWatch(), plugin], stop=stop), name="test:agent")
    node = Node(ctx, store, clock, backend, kubelet, plugin, base, stop, task)
    try:
        await kubelet.wait_registered(RESOURCE)
        await kubelet.wait_devices(
            RESOURCE, lambda d: len(d) == gpus and all(h == "Healthy" for h in d.values())
        )
        yield node
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await kubelet.stop()
        shutil.rmtree(base, ignore_errors=True)
