"""CheckpointCache against real sources: an aiohttp server on 127.0.0.1 (fsspec's HTTP
filesystem) and ``file://`` URLs."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from flexlease import errors
from nodeagent.cache.checkpoints import (
    CHECKPOINT_HIT_RATIO,
    CHECKPOINT_REQUESTS,
    CheckpointCache,
    CheckpointMetrics,
)

MIB = 1024 * 1024


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Blobs:
    """An HTTP checkpoint store: ``GET /<name>`` streams ``blobs[name]`` in 256 KiB chunks,
    pausing ``delay`` seconds between chunks; ``gets`` counts GETs per name."""

    blobs: dict[str, bytes] = field(default_factory=dict)
    gets: dict[str, int] = field(default_factory=dict)
    delay: float = 0.0
    url: str = ""

    async def serve(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in self.blobs:
            raise web.HTTPNotFound()
        data = self.blobs[name]
        if request.method == "HEAD":
            return web.Response(headers={"Content-Length": str(len(data))})
        self.gets[name] = self.gets.get(name, 0) + 1
        resp = web.StreamResponse(headers={"Content-Length": str(len(data))})
        await resp.prepare(request)
        for i in range(0, len(data), 256 * 1024):
            await resp.write(data[i : i + 256 * 1024])
            if self.delay:
                await asyncio.sleep(self.delay)
        await resp.write_eof()
        return resp


@pytest.fixture
async def blobs() -> AsyncIterator[Blobs]:
    store = Blobs()
    app = web.Application()
    app.router.add_get("/{name}", store.serve)  # with HEAD, which fsspec uses for the size
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    store.url = f"http://127.0.0.1:{port}"
    try:
        yield store
    finally:
        await runner.cleanup()


def _cache(directory: Path, capacity: int, registry: CollectorRegistry | None = None) -> CheckpointCache:
    return CheckpointCache(
        directory, capacity_bytes=capacity, metrics=CheckpointMetrics(registry or CollectorRegistry())
    )


async def test_file_url_miss_then_hit(tmp_path: Path) -> None:
    src = tmp_path / "src" / "step-100.pt"
    src.parent.mkdir()
    data = os.urandom(3 * MIB + 17)
    src.write_bytes(data)
    registry = CollectorRegistry()
    cache = _cache(tmp_path / "cache", 64 * MIB, registry)
    await cache.open()

    first = await cache.fetch("job/step-100", src.as_uri(), sha256=sha(data))
    assert first.result == "miss" and first.bytes_fetched == len(data)
    assert first.entry.path.read_bytes() == data
    assert first.entry.path.parent == tmp_path / "cache"
    second = await cache.fetch("job/step-100", src.as_uri(), sha256="sha256:" + sha(data))
    assert second.hit and second.bytes_fetched == 0 and second.entry.path == first.entry.path

    assert cache.hit_ratio == 0.5
    assert registry.get_sample_value(CHECKPOINT_HIT_RATIO) == 0.5
    assert registry.get_sample_value(CHECKPOINT_REQUESTS + "_total", {"result": "hit"}) == 1
    assert registry.get_sample_value(CHECKPOINT_REQUESTS + "_total", {"result": "miss"}) == 1
    assert registry.get_sample_value("flexlease_checkpoint_fetch_bytes_total") == len(data)
    assert registry.get_sample_value("flexlease_checkpoint_cache_used_bytes") == len(data)
    assert cache.storage_rate.value is not None and cache.storage_rate.value > 0
    assert cache.inventory() == [{"id": "job/step-100", "sizeBytes": len(data), "sha256": sha(data)}]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [
        "job%2Fstep-100.ckpt",
        "job%2Fstep-100.json",
    ]


async def test_http_concurrent_requests_share_one_download(tmp_path: Path, blobs: Blobs) -> None:
    data = os.urandom(2 * MIB)
    blobs.blobs["ckpt"] = data
    blobs.delay = 0.01
    cache = _cache(tmp_path / "cache", 64 * MIB)
    await cache.open()
    results = await asyncio.gather(
        *(cache.fetch("c1", f"{blobs.url}/ckpt", sha256=sha(data), pod=f"ns/p{i}") for i in range(5))
    )
    assert blobs.gets == {"ckpt": 1}
    assert sorted(r.result for r in results) == ["miss"] + ["shared"] * 4
    assert {r.entry.path for r in results} == {cache.get("c1").path}  # type: ignore[union-attr]
    assert results[0].entry.path.read_bytes() == data
    again = await cache.fetch("c1", f"{blobs.url}/ckpt", sha256=sha(data))
    assert again.hit and blobs.gets == {"ckpt": 1}


async def test_digest_mismatch_publishes_nothing_and_keeps_the_old_copy(tmp_path: Path, blobs: Blobs) -> None:
    good, bad = os.urandom(MIB), os.urandom(MIB)
    blobs.blobs["v1"] = good
    blobs.blobs["v2"] = bad
    registry = CollectorRegistry()
    cache = _cache(tmp_path / "cache", 64 * MIB, registry)
    await cache.open()
    await cache.fetch("c", f"{blobs.url}/v1", sha256=sha(good))
    with pytest.raises(errors.BackendError, match="does not match"):
        await cache.fetch("c", f"{blobs.url}/v2", sha256=sha(os.urandom(8)))
    entry = cache.get("c")
    assert entry is not None and entry.sha256 == sha(good) and entry.path.read_bytes() == good
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["c.ckpt", "c.json"]
    assert registry.get_sample_value("flexlease_checkpoint_fetch_failures_total") == 1
    # A new version under the same id replaces the old one once it verifies.
    replaced = await cache.fetch("c", f"{blobs.url}/v2", sha256=sha(bad))
    assert replaced.result == "miss" and replaced.entry.path.read_bytes() == bad
    assert json.loads((tmp_path / "cache" / "c.json").read_text())["sha256"] == sha(bad)


async def test_size_mismatch_and_missing_source(tmp_path: Path, blobs: Blobs) -> None:
    data = os.urandom(1000)
    blobs.blobs["x"] = data
    cache = _cache(tmp_path / "cache", MIB)
    await cache.open()
    with pytest.raises(errors.BackendError, match="expected 999"):
        await cache.fetch("x", f"{blobs.url}/x", sha256=sha(data), size_bytes=999)
    with pytest.raises(errors.BackendError, match="not found"):
        await cache.fetch("y", f"{blobs.url}/nope", sha256=sha(data))
    with pytest.raises(errors.BackendError):
        await cache.fetch("z", (tmp_path / "absent").as_uri(), sha256=sha(data))
    assert list((tmp_path / "cache").iterdir()) == []


async def test_bad_requests(tmp_path: Path) -> None:
    cache = _cache(tmp_path / "cache", MIB)
    await cache.open()
    src = tmp_path / "big"
    src.write_bytes(os.urandom(2 * MIB))
    with pytest.raises(errors.RequestError, match="larger than the cache"):
        await cache.fetch("big", src.as_uri(), sha256=sha(src.read_bytes()))
    with pytest.raises(errors.RequestError, match="sha256"):
        await cache.fetch("big", src.as_uri(), sha256="abc")
    with pytest.raises(errors.RequestError, match="checkpoint id"):
        await cache.fetch("", src.as_uri(), sha256="0" * 64)
    with pytest.raises(errors.RequestError, match="no fsspec filesystem"):
        await cache.fetch("q", "nosuchproto://bucket/key", sha256="0" * 64)
    with pytest.raises(errors.RequestError):
        CheckpointCache(tmp_path, capacity_bytes=0, metrics=CheckpointMetrics(CollectorRegistry()))
    assert list((tmp_path / "cache").iterdir()) == []


async def test_lru_eviction_keeps_the_bound(tmp_path: Path) -> None:
    srcs = {}
    for name in "abcd":
        path = tmp_path / name
        path.write_bytes(os.urandom(MIB))
        srcs[name] = (path.as_uri(), sha(path.read_bytes()))
    registry = CollectorRegistry()
    cache = _cache(tmp_path / "cache", 3 * MIB, registry)
    await cache.open()
    for name in "abc":
        await cache.fetch(name, srcs[name][0], sha256=srcs[name][1])
    assert (await cache.fetch("a", srcs["a"][0], sha256=srcs["a"][1])).hit  # a is now most recent
    await cache.fetch("d", srcs["d"][0], sha256=srcs["d"][1])
    assert [e["id"] for e in cache.inventory()] == ["d", "a", "c"]  # b was least recently used
    assert cache.used_bytes == 3 * MIB
    assert not (tmp_path / "cache" / "b.ckpt").exists()
    assert registry.get_sample_value("flexlease_checkpoint_cache_evictions_total") == 1
    assert registry.get_sample_value("flexlease_checkpoint_cache_entries") == 3


async def test_reopen_restores_lru_order_and_drops_leftovers(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    cache = _cache(directory, 10 * MIB)
    await cache.open()
    srcs = {}
    for name in ("old", "new"):
        path = tmp_path / name
        path.write_bytes(os.urandom(1000))
        srcs[name] = (path.as_uri(), sha(path.read_bytes()))
        await cache.fetch(name, *srcs[name][:1], sha256=srcs[name][1])
    past = time.time() - 3600
    os.utime(directory / "old.ckpt", (past, past))
    # Leftovers of a crash: a partial download, a metadata write's temp file, data without
    # metadata, metadata without data, and metadata that does not match its data.
    (directory / ".partial-deadbeef").write_bytes(b"half")
    (directory / ".new.json.tmp-0123abcd").write_bytes(b'{"id": "ne')
    (directory / "orphan.ckpt").write_bytes(b"x")
    (directory / "lonely.json").write_text("{}")
    (directory / "liar.ckpt").write_bytes(b"12345")
    (directory / "liar.json").write_text(json.dumps({"id": "liar", "sha256": "0" * 64, "sizeBytes": 4}))

    reopened = _cache(directory, 10 * MIB)
    await reopened.open()
    assert [e["id"] for e in reopened.inventory()] == ["new", "old"]
    assert sorted(p.name for p in directory.iterdir()) == ["new.ckpt", "new.json", "old.ckpt", "old.json"]
    assert (await reopened.fetch("old", srcs["old"][0], sha256=srcs["old"][1])).hit

    smaller = _cache(directory, 1500)  # a smaller bound evicts down at open, LRU first
    await smaller.open()
    assert [e["id"] for e in smaller.inventory()] == ["old"]


async def test_cancelled_download_leaves_no_partial_file(tmp_path: Path, blobs: Blobs) -> None:
    data = os.urandom(4 * MIB)
    blobs.blobs["slow"] = data
    blobs.delay = 0.05
    cache = _cache(tmp_path / "cache", 64 * MIB)
    await cache.open()
    task = asyncio.create_task(cache.fetch("slow", f"{blobs.url}/slow", sha256=sha(data)), name="fetch")
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    blobs.delay = 0.0
    for _ in range(200):  # the worker thread notices at its next chunk and removes its file
        if not any((tmp_path / "cache").iterdir()):
            break
        await asyncio.sleep(0.05)
    assert list((tmp_path / "cache").iterdir()) == []
    assert cache.get("slow") is None
    done = await cache.fetch("slow", f"{blobs.url}/slow", sha256=sha(data))
    assert done.result == "miss" and done.entry.path.read_bytes() == data
