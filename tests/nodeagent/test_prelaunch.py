"""The prelaunch window W (formulas 1-3, pure) and the prelaunch command on the testbed's
containerd with a checkpoint served over HTTP from 127.0.0.1."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from flexlease.errors import RequestError
from flexlease.prelaunch import GBIT, PrelaunchInputs, prelaunch_window
from nodeagent import prelaunch
from nodeagent.cache.checkpoints import CheckpointCache, CheckpointMetrics
from nodeagent.cri.client import GrpcCri
from nodeagent.prelaunch import Bandwidths
from tests.nodeagent.conftest import ContainerdTestbed

GB = 1e9


def inputs(**kw: float) -> PrelaunchInputs:
    base: dict[str, float] = dict(
        image_bytes=10 * GB,
        checkpoint_bytes=40 * GB,
        net_bps=10 * GBIT,  # 1.25 GB/s
        registry_bps=0.5 * GB,
        storage_bps=2 * GB,
        gpu_bps=20 * GB,
        image_hit_ratio=0.0,
        checkpoint_hit_ratio=0.0,
        gpu_adjust_seconds=5.0,
    )
    base.update(kw)
    return PrelaunchInputs(**base)


def test_formulas_1_to_3() -> None:
    w = prelaunch_window(inputs())
    assert w.image_seconds == pytest.approx(10 / 0.5)  # (1) registry-bound: 20 s
    assert w.checkpoint_seconds == pytest.approx(40 / 1.25 + 40 / 20)  # (2) network-bound + GPU: 34 s
    assert w.window_seconds == pytest.approx(5 + 34)  # (3)
    half = prelaunch_window(inputs(image_hit_ratio=0.5, checkpoint_hit_ratio=0.5))
    assert half.image_seconds == pytest.approx(10.0)
    assert half.checkpoint_seconds == pytest.approx(16 + 2)
    assert half.window_seconds == pytest.approx(5 + 18)


def test_everything_cached_leaves_gpu_transfer_and_adjustment() -> None:
    w = prelaunch_window(inputs(image_hit_ratio=1.0, checkpoint_hit_ratio=1.0))
    assert w.image_seconds == 0.0
    assert w.checkpoint_seconds == pytest.approx(40 / 20)
    assert w.window_seconds == pytest.approx(5 + 2)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("image_bytes", -1),
        ("checkpoint_bytes", float("nan")),
        ("gpu_adjust_seconds", -0.1),
        ("net_bps", 0),
        ("registry_bps", -5),
        ("storage_bps", float("inf")),
        ("gpu_bps", 0),
        ("image_hit_ratio", 1.5),
        ("checkpoint_hit_ratio", -0.1),
    ],
)
def test_invalid_input_is_refused(field: str, value: float) -> None:
    with pytest.raises(RequestError, match=field):
        prelaunch_window(inputs(**{field: value}))


@given(
    eta_img=st.floats(0, 1),
    eta_ckpt=st.floats(0, 1),
    more=st.floats(0, 1),
    size=st.floats(0, 1e13),
)
def test_more_cache_hits_never_widen_w(eta_img: float, eta_ckpt: float, more: float, size: float) -> None:
    w = prelaunch_window(inputs(image_bytes=size, image_hit_ratio=eta_img, checkpoint_hit_ratio=eta_ckpt))
    better = prelaunch_window(
        inputs(
            image_bytes=size,
            image_hit_ratio=eta_img + (1 - eta_img) * more,
            checkpoint_hit_ratio=eta_ckpt + (1 - eta_ckpt) * more,
        )
    )
    assert better.window_seconds <= w.window_seconds + 1e-9
    assert w.window_seconds >= 5.0


@pytest.fixture
async def checkpoint_server(tmp_path: Path) -> AsyncIterator[tuple[str, bytes]]:
    data = os.urandom(8 * 1024 * 1024)

    async def serve(request: web.Request) -> web.Response:
        return web.Response(body=data)

    app = web.Application()
    app.router.add_get("/ckpt/step-9", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/ckpt/step-9", data
    finally:
        await runner.cleanup()


@pytest.mark.containerd
async def test_prelaunch_pulls_and_fetches_then_reports_ready(
    cri: GrpcCri, containerd_testbed: ContainerdTestbed, checkpoint_server: tuple[str, bytes], tmp_path: Path
) -> None:
    url, data = checkpoint_server
    image = containerd_testbed.large_image
    await cri.remove_image(image)
    registry = CollectorRegistry()
    cache = CheckpointCache(tmp_path / "cache", capacity_bytes=1 << 30, metrics=CheckpointMetrics(registry))
    await cache.open()
    digest = hashlib.sha256(data).hexdigest()
    args = dict(
        image=image,
        checkpoint_url=url,
        checkpoint_id="job/step-9",
        sha256=digest,
        image_bytes=None,
        bandwidths=Bandwidths(gpu_adjust_seconds=1.0),
    )
    cold = await prelaunch.prelaunch(cri, cache, metrics_registry=registry, **args)  # type: ignore[arg-type]
    assert cold.ready and cold.error is None and cold.ready_at is not None
    assert cold.image is not None and not cold.image.cached and cold.image.size_bytes > 32 * 1024 * 1024
    assert cold.checkpoint is not None and cold.checkpoint.result == "miss"
    assert cold.checkpoint.entry.path.read_bytes() == data
    assert cold.measured_window is not None
    assert cold.window.image_seconds > 0 and cold.window.window_seconds > 1.0
    # The measured window uses the throughputs seen here; the transfers overlapped, so the
    # wall time is close to the larger of the two, not their sum.
    assert cold.elapsed_seconds < cold.image.seconds + cold.checkpoint.seconds + 1.0

    warm = await prelaunch.prelaunch(cri, cache, metrics_registry=CollectorRegistry(), **args)  # type: ignore[arg-type]
    assert warm.ready and warm.image is not None and warm.image.cached
    assert warm.checkpoint is not None and warm.checkpoint.hit
    assert warm.window.image_seconds == 0.0
    assert warm.window.checkpoint_seconds == pytest.approx(len(data) / Bandwidths().gpu_bps)
    doc = warm.to_json_obj()
    assert doc["ready"] is True and doc["checkpoint"]["result"] == "hit" and doc["image"]["cached"] is True
    await cri.remove_image(image)


@pytest.mark.containerd
async def test_prelaunch_command(
    containerd_testbed: ContainerdTestbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "ckpt.bin"
    data = os.urandom(100_000)
    src.write_bytes(data)
    argv = [
        "--image",
        containerd_testbed.trainer_v1,
        "--checkpoint",
        src.as_uri(),
        "--checkpoint-id",
        "c1",
        "--sha256",
        hashlib.sha256(data).hexdigest(),
        "--cri-endpoint",
        containerd_testbed.endpoint,
        "--cache-dir",
        str(tmp_path / "cache"),
        "--cache-bytes",
        str(1 << 20),
    ]
    assert await asyncio.to_thread(prelaunch.main, argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ready"] is True
    assert report["image"]["cached"] is True and report["checkpoint"]["result"] == "miss"
    assert report["window"]["imageSeconds"] == 0.0
    assert (tmp_path / "cache" / "c1.ckpt").read_bytes() == data

    bad = [*argv[:-6], "--sha256", "0" * 64, *argv[8:]]
    assert await asyncio.to_thread(prelaunch.main, bad) == 1
    failed = json.loads(capsys.readouterr().out)
    assert failed["ready"] is False and "does not match" in failed["error"]

    absent = [*argv[:8], "--cri-endpoint", f"unix://{tmp_path}/absent.sock", *argv[10:]]
    assert await asyncio.to_thread(prelaunch.main, absent) == 2
    assert "absent.sock" in json.loads(capsys.readouterr().out)["error"]
