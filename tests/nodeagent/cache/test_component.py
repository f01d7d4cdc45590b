"""The ``cache`` agent component: CRI probing and ``GPUNode.status.cache`` publishing, on
the testbed's containerd and a MemoryStore."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from flexlease.api import keys
from flexlease.api.resources import PrelaunchStatus
from flexlease.config import AgentSettings
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore
from nodeagent.cache.component import CRI_UP, CacheComponent, NodeRuntime
from nodeagent.prelaunch import Bandwidths
from tests.nodeagent.conftest import ContainerdTestbed


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    s = MemoryStore()
    await s.create(
        Kind.GPUNODE,
        {"apiVersion": keys.API_VERSION, "kind": keys.GPUNODE_KIND, "metadata": {"name": "n1"}, "spec": {}},
    )
    try:
        yield s
    finally:
        await s.close()


def _runtime(endpoint: str, tmp_path: Path, registry: CollectorRegistry) -> NodeRuntime:
    settings = AgentSettings(
        node_name="n1",
        cri_endpoint=endpoint,
        cri_timeout_seconds=2,
        checkpoint_dir=tmp_path / "ckpt",
        checkpoint_cache_bytes=1 << 30,
    )
    return NodeRuntime(settings, registry)


@contextlib.asynccontextmanager
async def _probing(runtime: NodeRuntime) -> AsyncIterator[None]:
    task = asyncio.create_task(runtime.keep_probing(interval_seconds=0.05), name="test:probe")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await runtime.cri.close()


@pytest.mark.containerd
async def test_publishes_images_and_checkpoints(
    store: MemoryStore, containerd_testbed: ContainerdTestbed, tmp_path: Path
) -> None:
    registry = CollectorRegistry()
    runtime = _runtime(containerd_testbed.endpoint, tmp_path, registry)
    component = CacheComponent(runtime)
    await runtime.checkpoints.open()
    src = tmp_path / "ckpt.bin"
    data = os.urandom(1234)
    src.write_bytes(data)
    await runtime.checkpoints.fetch("job/step-7", src.as_uri(), sha256=hashlib.sha256(data).hexdigest())
    async with _probing(runtime):
        await asyncio.wait_for(runtime.connected.wait(), 10)
        assert registry.get_sample_value(CRI_UP) == 1
        assert await component.publish(store, "n1")
        assert not await component.publish(store, "n1")  # unchanged: no write
        sizes = {i.repo_tags[0]: i.size_bytes for i in await runtime.cri.list_images() if i.repo_tags}
    node = await store.get(Kind.GPUNODE, "n1")
    cache = node["status"]["cache"]
    assert {containerd_testbed.trainer_v1, containerd_testbed.trainer_v2} <= set(cache["images"])
    assert cache["checkpoints"] == [
        {"id": "job/step-7", "sizeBytes": 1234, "sha256": hashlib.sha256(data).hexdigest()}
    ]
    # the prelaunch inputs the lease autopilot reads: each image's size as containerd reports
    # it, the storage throughput this node measured (the fetch above), the rest assumed
    prelaunch = PrelaunchStatus.model_validate(node["status"]["prelaunch"])
    assert prelaunch.image_bytes[containerd_testbed.trainer_v1] == sizes[containerd_testbed.trainer_v1] > 0
    assert prelaunch.measured == ["storage"]
    assert prelaunch.storage_bytes_per_second == runtime.checkpoints.storage_rate.value
    assert prelaunch.registry_bytes_per_second == Bandwidths().registry_bps


async def test_absent_runtime_is_reported_and_checkpoints_still_published(
    store: MemoryStore, tmp_path: Path
) -> None:
    registry = CollectorRegistry()
    runtime = _runtime(f"unix://{tmp_path}/absent.sock", tmp_path, registry)
    component = CacheComponent(runtime)
    await runtime.checkpoints.open()
    async with _probing(runtime):
        await asyncio.sleep(0.2)
        assert not runtime.connected.is_set()
        assert registry.get_sample_value(CRI_UP) == 0
        assert await component.publish(store, "n1")
        assert not await component.publish(store, "absent-node")  # no GPUNode yet: skipped
    node = await store.get(Kind.GPUNODE, "n1")
    assert node["status"]["cache"] == {"images": [], "checkpoints": []}
    assert PrelaunchStatus.model_validate(node["status"]["prelaunch"]) == PrelaunchStatus(
        net_bytes_per_second=Bandwidths().net_bps,
        registry_bytes_per_second=Bandwidths().registry_bps,
        storage_bytes_per_second=Bandwidths().storage_bps,
        gpu_bytes_per_second=Bandwidths().gpu_bps,
    )
