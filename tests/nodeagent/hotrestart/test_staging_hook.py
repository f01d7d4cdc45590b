"""The hot-restart controller starts streaming-data staging before it replaces the container
and marks the restart over after (real Stager and nats-server, FakeCri); W for the staging
comes from formulas 1–3 with the node's image and checkpoint cache."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from flexlease.api import keys
from flexlease.store.base import JsonObj, Kind
from flexlease.store.memory import MemoryStore
from flexlease.streaming.jetstream import JetStreamBroker, ensure_live_stream
from nodeagent.cache.images import ImageMetrics, ImagePuller
from nodeagent.cri import podspec
from nodeagent.cri.fake import FakeCri
from nodeagent.hotrestart.component import RuntimeStaging, restart_window
from nodeagent.hotrestart.controller import HotRestartController
from nodeagent.hotrestart.model import Phase, Strategy, parse_status
from nodeagent.hotrestart.restarter import HotRestarter
from nodeagent.staging import Stager, StagingMetrics
from tests.natsserver import NatsServer

V1, V2 = "reg/t:v1", "reg/t:v2"
ANNOTATIONS = {
    keys.ANN_STREAM: "LIVE",
    keys.ANN_STREAM_SUBJECT: "live.job",
    keys.ANN_STREAM_DURABLE: "job-1",
}


class NoCheckpoints:
    """An empty checkpoint cache."""

    def get(self, checkpoint_id: str) -> None:
        return None


class Recording:
    """Wraps the real hook; records what happened in which order."""

    def __init__(self, inner: RuntimeStaging, cri: FakeCri) -> None:
        self.inner = inner
        self.cri = cri
        self.calls: list[str] = []

    async def begin(self, pod: JsonObj, *, image: str) -> Callable[[], None] | None:
        self.calls.append(f"begin containers={sorted(self.cri.containers)} image={image}")
        done = await self.inner.begin(pod, image=image)
        assert done is not None

        def restarted() -> None:
            self.calls.append(f"restarted containers={sorted(self.cri.containers)}")
            done()

        return restarted


async def test_staging_begins_before_the_restart_and_ends_after(nats_server: NatsServer) -> None:
    store = MemoryStore()
    pod = await store.create(
        Kind.POD,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "annotations": ANNOTATIONS},
            "spec": {"nodeName": "n1", "containers": [{"name": "trainer", "image": V1}]},
        },
    )
    cri = FakeCri(registry={V2: 10})
    cri.add_image(V1, 10)
    cri.add_image(V2, 5_000_000_000)
    ref = podspec.PodRef("ns", "p", pod["metadata"]["uid"])
    sandbox_config = podspec.sandbox_config(ref, Path("/tmp/logs"))
    sid = await cri.run_pod_sandbox(sandbox_config)
    cid = await cri.create_container(
        sid, podspec.container_config(ref, podspec.ContainerSpec("trainer", V1)), sandbox_config
    )
    await cri.start_container(cid)
    registry = CollectorRegistry()
    runtime: Any = SimpleNamespace(cri=cri, checkpoints=NoCheckpoints())
    async with JetStreamBroker(nats_server.url, timeout=2) as broker:
        await ensure_live_stream(broker, "LIVE", subjects=["live.job"], max_msgs=100)
        stager = Stager(
            broker, store, StagingMetrics(registry, node="n1"), node="n1", rate_sample_seconds=0.05
        )
        hook = Recording(RuntimeStaging(stager, runtime), cri)
        controller = HotRestartController(
            store,
            cri,
            HotRestarter(cri, ImagePuller(cri, ImageMetrics(registry))),
            node="n1",
            default_strategy=Strategy.DIRECT,
            staging=hook,
        )
        request = json.dumps({"id": "r1", "container": "trainer", "image": V2})
        await store.patch(
            Kind.POD, "p", {"metadata": {"annotations": {keys.ANN_HOT_RESTART: request}}}, namespace="ns"
        )
        await controller.reconcile("ns", "p")
        [replacement] = [c for c in cri.containers if c != cid]
        assert hook.calls[0] == f"begin containers={[cid]} image=reg/t:v2"  # before anything was touched
        assert hook.calls[1].startswith("restarted") and replacement in hook.calls[1]
        staging = stager.stagings["ns/p"]
        assert staging.restarted_at is not None
        # the image was on the node: W has no image term (formula 1 with η_cache = 1)
        assert staging.window_seconds == 0.0
        assert staging.start_seq == 1
        assert (await broker.stream_state("FLEXLEASE_STAGE_job-1")).messages == 0
        status = parse_status(
            (await store.get(Kind.POD, "p", namespace="ns"))["metadata"]["annotations"][
                keys.ANN_HOT_RESTART_STATUS
            ]
        )
        assert status is not None and status.phase is Phase.SUCCEEDED
        task = asyncio.create_task(stager.run(), name="stager")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await store.close()


async def test_restart_window_is_formulas_1_to_3_with_the_node_caches() -> None:
    cri = FakeCri(registry={V2: 10})
    cri.add_image(V2, 5_000_000_000)
    entry = SimpleNamespace(size_bytes=50_000_000_000)

    class Cached:
        def get(self, checkpoint_id: str) -> Any:
            return entry if checkpoint_id == "ck-1" else None

    runtime: Any = SimpleNamespace(cri=cri, checkpoints=Cached())
    pod = {"metadata": {"annotations": {keys.ANN_CHECKPOINT: "ck-1"}}}
    # both cached: T_img = 0, T_ckpt = S_ckpt / B_gpu = 50 GB / 25 GB/s = 2 s
    assert await restart_window(runtime, pod, image=V2) == 2.0
    assert await restart_window(runtime, {"metadata": {}}, image=V2) == 0.0
