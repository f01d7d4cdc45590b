"""ImagePuller: pulls through the testbed's real containerd and registry; coalescing and
progress logging against the in-memory FakeCri."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry

from flexlease import errors
from nodeagent.cache.images import IMAGE_CACHE_HIT_RATIO, ImageMetrics, ImagePuller
from nodeagent.cri.client import GrpcCri
from nodeagent.cri.fake import FakeCri
from tests.nodeagent.conftest import ContainerdTestbed


@pytest.mark.containerd
async def test_prepull_from_the_registry_then_cached(
    cri: GrpcCri, containerd_testbed: ContainerdTestbed
) -> None:
    image = containerd_testbed.large_image
    await cri.remove_image(image)
    registry = CollectorRegistry()
    puller = ImagePuller(cri, ImageMetrics(registry))
    pulled = await puller.ensure(image, pod="ns/p")
    assert not pulled.cached and pulled.seconds > 0
    assert pulled.size_bytes > 32 * 1024 * 1024
    assert registry.get_sample_value("flexlease_image_pull_bytes_total") == pulled.size_bytes
    assert registry.get_sample_value("flexlease_image_pull_seconds_count") == 1
    assert registry.get_sample_value("flexlease_image_pulls_total", {"outcome": "pulled"}) == 1
    assert registry.get_sample_value("flexlease_image_pulls_in_progress") == 0
    assert puller.registry_rate.value == pytest.approx(pulled.size_bytes / pulled.seconds)
    again = await puller.ensure(image)
    assert again.cached and again.image_ref == pulled.image_ref
    assert puller.hit_ratio == 0.5 and registry.get_sample_value(IMAGE_CACHE_HIT_RATIO) == 0.5
    inventory = await puller.inventory()
    assert image in inventory
    assert {containerd_testbed.trainer_v1, containerd_testbed.trainer_v2} <= set(inventory)
    await cri.remove_image(image)


@pytest.mark.containerd
async def test_missing_image_is_a_cri_not_found(cri: GrpcCri, containerd_testbed: ContainerdTestbed) -> None:
    registry = CollectorRegistry()
    puller = ImagePuller(cri, ImageMetrics(registry))
    with pytest.raises(errors.CriNotFound):
        await puller.ensure(f"{containerd_testbed.registry}/flexlease/absent:v1")
    assert registry.get_sample_value("flexlease_image_pulls_total", {"outcome": "failed"}) == 1
    assert registry.get_sample_value("flexlease_image_pulls_in_progress") == 0


async def test_concurrent_requests_share_one_pull_and_log_progress(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeCri(registry={"reg/img:v1": 5_000})
    fake.pull_gate = asyncio.Event()
    registry = CollectorRegistry()
    puller = ImagePuller(fake, ImageMetrics(registry), progress_interval_seconds=0.01)
    caplog.set_level(logging.INFO, logger="nodeagent.cache.images")
    tasks = [asyncio.create_task(puller.ensure("reg/img:v1"), name=f"ensure-{i}") for i in range(3)]
    await asyncio.sleep(0.05)
    assert registry.get_sample_value("flexlease_image_pulls_in_progress") == 1
    fake.pull_gate.set()
    results = await asyncio.gather(*tasks)
    assert fake.pulls == ["reg/img:v1"]
    assert sorted(r.shared for r in results) == [False, True, True]
    assert all(r.size_bytes == 5_000 and not r.cached for r in results)
    messages = [r.getMessage() for r in caplog.records]
    assert "pulling image" in messages and "pulled image" in messages
    assert "still pulling image" in messages
    progress = next(r for r in caplog.records if r.getMessage() == "still pulling image")
    assert progress.__dict__["image"] == "reg/img:v1" and progress.__dict__["elapsed_seconds"] >= 0
