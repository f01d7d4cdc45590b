"""Checkpoint cache: training checkpoints kept on the node's disk (WeFlex §3.3, local loading).

A directory bounded to ``capacity_bytes`` (``AgentSettings.checkpoint_cache_bytes``) holding
one file per checkpoint id, evicted least-recently-used first. :meth:`CheckpointCache.fetch`
returns the local copy, downloading it when missing or when the cached copy has another
sha256. Downloads go through fsspec URLs (``file://``, ``http(s)://`` via fsspec's
aiohttp-based HTTP filesystem, and object stores such as ``s3://`` or ``gs://`` when their
fsspec plugin is installed), run in a worker thread, and are published atomically:
streamed to a temporary name in the cache directory while hashed, verified (sha256 and, when
given, size), fsynced, then renamed into place, its metadata written through
:mod:`flexlease.atomicfile` (unique temp file, fsync, rename, directory fsync), one writer at
a time. Concurrent requests for one checkpoint share one download.

On disk, for checkpoint id ``I`` (percent-encoded as ``Q``): ``Q.ckpt`` (data) and
``Q.json`` (``{"id", "sha256", "sizeBytes", "url"}``); the data file's mtime is its last use,
so LRU order survives restarts. Partial downloads (``.partial-*``), temp files of
interrupted metadata writes and halves of entries are removed when the cache opens. Evicting
a file another process still has open is safe (POSIX unlink).

Metrics (prefix ``flexlease_``, injected registry): requests by result (hit, miss, shared),
hit ratio (``η_ckpt`` of formula 2), used/capacity bytes, entries, evictions, fetch
duration, bytes fetched, failures and the measured storage throughput (``B_stor``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import fsspec
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from flexlease import atomicfile, errors
from flexlease.logging import ctx
from nodeagent.cache.rate import EwmaRate
from nodeagent.cache.singleflight import SingleFlight

log = logging.getLogger(__name__)

CHECKPOINT_REQUESTS: Final = "flexlease_checkpoint_cache_requests"
CHECKPOINT_HIT_RATIO: Final = "flexlease_checkpoint_cache_hit_ratio"
CHECKPOINT_USED_BYTES: Final = "flexlease_checkpoint_cache_used_bytes"
CHECKPOINT_CAPACITY_BYTES: Final = "flexlease_checkpoint_cache_capacity_bytes"
CHECKPOINT_ENTRIES: Final = "flexlease_checkpoint_cache_entries"
CHECKPOINT_EVICTIONS: Final = "flexlease_checkpoint_cache_evictions"
CHECKPOINT_FETCH_SECONDS: Final = "flexlease_checkpoint_fetch_seconds"
CHECKPOINT_FETCH_BYTES: Final = "flexlease_checkpoint_fetch_bytes"
CHECKPOINT_FETCH_FAILURES: Final = "flexlease_checkpoint_fetch_failures"
CHECKPOINT_FETCH_BYTES_PER_SECOND: Final = "flexlease_checkpoint_fetch_bytes_per_second"

RESULT_HIT: Final = "hit"
RESULT_MISS: Final = "miss"
RESULT_SHARED: Final = "shared"

_DATA: Final = ".ckpt"
_META: Final = ".json"
_PARTIAL: Final = ".partial-"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MAX_ID = 253
_CHUNK_BYTES: Final = 4 * 1024 * 1024


class CheckpointMetrics:
    """The checkpoint cache's Prometheus metrics, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            CHECKPOINT_REQUESTS,
            "Checkpoint requests by result (hit: served from the cache; miss: downloaded; "
            "shared: waited on a concurrent download).",
            ["result"],
            registry=registry,
        )
        for result in (RESULT_HIT, RESULT_MISS, RESULT_SHARED):
            self.requests.labels(result=result)
        self.hit_ratio = Gauge(
            CHECKPOINT_HIT_RATIO,
            "Share of checkpoint requests served from the local cache, ratio 0-1 (eta_ckpt).",
            registry=registry,
        )
        self.used_bytes = Gauge(
            CHECKPOINT_USED_BYTES, "Bytes of checkpoints in the cache.", registry=registry
        )
        self.capacity_bytes = Gauge(
            CHECKPOINT_CAPACITY_BYTES, "Size bound of the cache, bytes.", registry=registry
        )
        self.entries = Gauge(CHECKPOINT_ENTRIES, "Checkpoints in the cache.", registry=registry)
        self.evictions = Counter(CHECKPOINT_EVICTIONS, "Checkpoints evicted (LRU).", registry=registry)
        self.fetch_seconds = Histogram(
            CHECKPOINT_FETCH_SECONDS,
            "Duration of checkpoint downloads (including verification), seconds.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
            registry=registry,
        )
        self.fetch_bytes = Counter(
            CHECKPOINT_FETCH_BYTES, "Bytes of checkpoints downloaded.", registry=registry
        )
        self.fetch_failures = Counter(
            CHECKPOINT_FETCH_FAILURES,
            "Checkpoint downloads that failed or did not verify.",
            registry=registry,
        )
        self.bytes_per_second = Gauge(
            CHECKPOINT_FETCH_BYTES_PER_SECOND,
            "Measured checkpoint download throughput (EWMA), bytes per second (B_stor).",
            registry=registry,
        )


@dataclass(frozen=True, slots=True)
class CheckpointEntry:
    """A cached checkpoint: local ``path``, ``size_bytes``, ``sha256`` (hex), source ``url``,
    ``last_used`` (seconds since the epoch)."""

    id: str
    path: Path
    size_bytes: int
    sha256: str
    url: str
    last_used: float


@dataclass(frozen=True, slots=True)
class FetchResult:
    """Outcome of :meth:`CheckpointCache.fetch`: the entry, how it was served (``hit``,
    ``miss``, ``shared``), seconds spent and bytes downloaded (0 on a hit)."""

    entry: CheckpointEntry
    result: str
    seconds: float
    bytes_fetched: int

    @property
    def hit(self) -> bool:
        return self.result == RESULT_HIT


def validate_id(checkpoint_id: str) -> str:
    """Checkpoint ids are non-empty printable strings of at most 253 characters (any
    characters, percent-encoded on disk). Raises ``RequestError``."""
    if not checkpoint_id or len(checkpoint_id) > _MAX_ID or not checkpoint_id.isprintable():
        raise errors.RequestError(
            f"checkpoint id {checkpoint_id!r}: must be 1-{_MAX_ID} printable characters"
        )
    return checkpoint_id


def validate_sha256(digest: str) -> str:
    """A lower-case hex sha256 (an optional ``sha256:`` prefix is dropped). Raises
    ``RequestError``."""
    value = digest.removeprefix("sha256:").lower()
    if not _SHA256.match(value):
        raise errors.RequestError(f"sha256 {digest!r}: expected 64 hex digits")
    return value


class _Aborted(Exception):
    """The download was abandoned (its caller was cancelled)."""


class CheckpointCache:
    """Size-bounded, LRU, sha256-verified checkpoint cache in ``directory``.

    ``capacity_bytes``: the bound (bytes, > 0). ``storage_options``: fsspec options per
    protocol, e.g. ``{"s3": {"anon": True}}``. Call :meth:`open` once before use.
    """

    def __init__(
        self,
        directory: Path,
        *,
        capacity_bytes: int,
        metrics: CheckpointMetrics,
        storage_options: Mapping[str, Mapping[str, Any]] | None = None,
        chunk_bytes: int = _CHUNK_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity_bytes <= 0:
            raise errors.RequestError(f"checkpoint cache capacity must be > 0 bytes, got {capacity_bytes}")
        self.directory = directory
        self.capacity_bytes = capacity_bytes
        self._metrics = metrics
        self._storage_options = {k: dict(v) for k, v in (storage_options or {}).items()}
        self._chunk = chunk_bytes
        self._clock = clock
        self._entries: OrderedDict[str, CheckpointEntry] = OrderedDict()  # LRU first
        self._reserved = 0
        self._flight: SingleFlight[str, FetchResult] = SingleFlight()
        self._requests = 0
        self._hits = 0
        self._lock = asyncio.Lock()  # guards _entries/_reserved across awaits in eviction
        self.storage_rate = EwmaRate()
        metrics.capacity_bytes.set(capacity_bytes)

    # --- state -----------------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return sum(e.size_bytes for e in self._entries.values())

    @property
    def hit_ratio(self) -> float | None:
        """``η_ckpt``: hits / requests since start, ratio 0–1; None before any request."""
        return self._hits / self._requests if self._requests else None

    def get(self, checkpoint_id: str) -> CheckpointEntry | None:
        """The cached entry, without touching its LRU position."""
        return self._entries.get(checkpoint_id)

    def inventory(self) -> list[dict[str, Any]]:
        """``GPUNode.status.cache.checkpoints``: ``[{id, sizeBytes, sha256}]``, most recently
        used first."""
        return [
            {"id": e.id, "sizeBytes": e.size_bytes, "sha256": e.sha256}
            for e in reversed(self._entries.values())
        ]

    def _update_gauges(self) -> None:
        self._metrics.used_bytes.set(self.used_bytes)
        self._metrics.entries.set(len(self._entries))

    def _count(self, result: str) -> None:
        self._requests += 1
        self._hits += int(result == RESULT_HIT)
        self._metrics.requests.labels(result=result).inc()
        self._metrics.hit_ratio.set(self._hits / self._requests)

    def _paths(self, checkpoint_id: str) -> tuple[Path, Path]:
        name = quote(checkpoint_id, safe="")
        return self.directory / (name + _DATA), self.directory / (name + _META)

    # --- open ------------------------------------------------------------------------

    async def open(self) -> None:
        """Create the directory, drop partial downloads and half entries, load the index
        (LRU order from mtimes), and evict down to the capacity. Raises ``BackendError``
        when the directory cannot be used."""
        try:
            entries, dropped = await asyncio.to_thread(self._scan)
        except OSError as exc:
            raise errors.BackendError(f"checkpoint cache {self.directory}: {exc}") from exc
        self._entries = OrderedDict((e.id, e) for e in sorted(entries, key=lambda e: e.last_used))
        if dropped:
            log.warning(
                "removed incomplete checkpoint cache files",
                extra=ctx(directory=str(self.directory), files=sorted(dropped)),
            )
        async with self._lock:
            await self._evict_for(0, keep=None)
        self._update_gauges()
        log.info(
            "checkpoint cache opened",
            extra=ctx(
                directory=str(self.directory),
                entries=len(self._entries),
                used_bytes=self.used_bytes,
                capacity_bytes=self.capacity_bytes,
            ),
        )

    def _scan(self) -> tuple[list[CheckpointEntry], list[str]]:
        self.directory.mkdir(parents=True, exist_ok=True)
        entries: list[CheckpointEntry] = []
        dropped: list[str] = []
        names = {p.name for p in self.directory.iterdir()}
        for name in sorted(names):
            path = self.directory / name
            orphan_meta = name.endswith(_META) and name[: -len(_META)] + _DATA not in names
            if name.startswith(_PARTIAL) or atomicfile.is_temp(name) or orphan_meta:
                path.unlink(missing_ok=True)
                dropped.append(name)
            elif name.endswith(_DATA):
                meta_path = self.directory / (name[: -len(_DATA)] + _META)
                entry = self._load_entry(path, meta_path) if meta_path.name in names else None
                if entry is None:
                    path.unlink(missing_ok=True)
                    meta_path.unlink(missing_ok=True)
                    dropped.append(name)
                else:
                    entries.append(entry)
        return entries, dropped

    def _load_entry(self, data: Path, meta_path: Path) -> CheckpointEntry | None:
        try:
            meta = json.loads(meta_path.read_text())
            st = data.stat()
            checkpoint_id = str(meta["id"])
            if quote(checkpoint_id, safe="") + _DATA != data.name or int(meta["sizeBytes"]) != st.st_size:
                return None
            return CheckpointEntry(
                id=checkpoint_id,
                path=data,
                size_bytes=st.st_size,
                sha256=validate_sha256(str(meta["sha256"])),
                url=str(meta.get("url", "")),
                last_used=st.st_mtime,
            )
        except (OSError, ValueError, KeyError, TypeError, errors.RequestError):
            return None

    # --- fetch -----------------------------------------------------------------------

    async def fetch(
        self,
        checkpoint_id: str,
        url: str,
        *,
        sha256: str,
        size_bytes: int | None = None,
        pod: str | None = None,
    ) -> FetchResult:
        """The local copy of checkpoint ``checkpoint_id`` with digest ``sha256``, downloading
        it from ``url`` (an fsspec URL) when it is not cached with that digest.

        Raises ``RequestError`` for a malformed id/digest or a checkpoint larger than the
        cache, ``BackendError`` when the download fails or does not verify (nothing is
        published then; an older cached copy stays).
        """
        validate_id(checkpoint_id)
        digest = validate_sha256(sha256)
        if size_bytes is not None and size_bytes < 0:
            raise errors.RequestError(f"checkpoint {checkpoint_id}: size_bytes must be >= 0")
        started = self._clock()
        entry = self._entries.get(checkpoint_id)
        if entry is not None and entry.sha256 == digest and not self._flight.in_flight(checkpoint_id):
            touched = await self._touch(entry)
            self._count(RESULT_HIT)
            log.debug("checkpoint cache hit", extra=ctx(checkpoint=checkpoint_id, pod=pod))
            return FetchResult(touched, RESULT_HIT, self._clock() - started, 0)
        result, shared = await self._flight.do(
            checkpoint_id, lambda: self._download(checkpoint_id, url, digest, size_bytes, pod)
        )
        if shared:
            if result.entry.sha256 != digest:
                # Another request fetched another version meanwhile: fetch ours.
                return await self.fetch(checkpoint_id, url, sha256=digest, size_bytes=size_bytes, pod=pod)
            self._count(RESULT_SHARED)
            return FetchResult(result.entry, RESULT_SHARED, self._clock() - started, 0)
        self._count(RESULT_MISS)
        return result

    async def _touch(self, entry: CheckpointEntry) -> CheckpointEntry:
        now = time.time()
        with contextlib.suppress(FileNotFoundError):  # removed behind our back: keep reporting it
            await asyncio.to_thread(os.utime, entry.path, (now, now))
        touched = CheckpointEntry(entry.id, entry.path, entry.size_bytes, entry.sha256, entry.url, now)
        if entry.id in self._entries:
            self._entries[entry.id] = touched
            self._entries.move_to_end(entry.id)
        return touched

    async def _download(
        self, checkpoint_id: str, url: str, digest: str, size_bytes: int | None, pod: str | None
    ) -> FetchResult:
        started = self._clock()
        expected = size_bytes
        if expected is None:
            expected = await asyncio.to_thread(self._remote_size, url)
        if expected is not None and expected > self.capacity_bytes:
            raise errors.RequestError(
                f"checkpoint {checkpoint_id} ({expected} bytes) is larger than the cache "
                f"({self.capacity_bytes} bytes)"
            )
        reserve = expected or 0
        async with self._lock:
            await self._evict_for(reserve, keep=None)
            self._reserved += reserve
        data_path, meta_path = self._paths(checkpoint_id)
        tmp = self.directory / f"{_PARTIAL}{uuid.uuid4().hex}"
        abort = threading.Event()
        log.info(
            "downloading checkpoint",
            extra=ctx(checkpoint=checkpoint_id, url=url, pod=pod, size_bytes=expected),
        )
        try:
            try:
                nbytes = await asyncio.to_thread(self._download_blocking, url, tmp, digest, size_bytes, abort)
            except asyncio.CancelledError:
                abort.set()  # the worker thread stops at its next chunk and removes its file
                raise
            meta = {"id": checkpoint_id, "sha256": digest, "sizeBytes": nbytes, "url": url}
            async with self._lock:  # one writer at a time: not beside an eviction of the id
                await asyncio.to_thread(self._publish, tmp, data_path, meta_path, meta)
        except asyncio.CancelledError:
            raise
        except errors.FlexleaseError:
            self._metrics.fetch_failures.inc()
            raise
        except Exception as exc:
            self._metrics.fetch_failures.inc()
            raise errors.BackendError(
                f"checkpoint {checkpoint_id}: download from {url} failed: {exc}"
            ) from exc
        finally:
            self._reserved -= reserve
        seconds = self._clock() - started
        entry = CheckpointEntry(checkpoint_id, data_path, nbytes, digest, url, time.time())
        async with self._lock:
            self._entries.pop(checkpoint_id, None)
            self._entries[checkpoint_id] = entry
            await self._evict_for(0, keep=checkpoint_id)
        self._update_gauges()
        self._metrics.fetch_seconds.observe(seconds)
        self._metrics.fetch_bytes.inc(nbytes)
        rate = self.storage_rate.observe(nbytes, seconds)
        if rate is not None:
            self._metrics.bytes_per_second.set(rate)
        log.info(
            "cached checkpoint",
            extra=ctx(checkpoint=checkpoint_id, pod=pod, size_bytes=nbytes, seconds=round(seconds, 3)),
        )
        return FetchResult(entry, RESULT_MISS, seconds, nbytes)

    def _fs(self, url: str) -> tuple[Any, str, str]:
        protocol = url.split("://", 1)[0] if "://" in url else "file"
        options = self._storage_options.get(protocol, {})
        if protocol in ("http", "https"):
            options = {"skip_instance_cache": True, **options}
        try:
            fs, path = fsspec.core.url_to_fs(url, **options)
        except (ImportError, ValueError) as exc:
            raise errors.RequestError(f"checkpoint URL {url!r}: no fsspec filesystem for it ({exc})") from exc
        return fs, path, protocol

    def _remote_size(self, url: str) -> int | None:
        fs, path, _ = self._fs(url)
        try:
            size = fs.size(path)
        except FileNotFoundError as exc:
            raise errors.BackendError(f"checkpoint {url}: not found") from exc
        except Exception:  # a store that cannot tell the size: find out while downloading
            return None
        return int(size) if size is not None else None

    def _download_blocking(
        self, url: str, tmp: Path, digest: str, size_bytes: int | None, abort: threading.Event
    ) -> int:
        """Stream ``url`` into ``tmp`` while hashing; verify; fsync. Removes ``tmp`` on any
        failure. Runs in a worker thread."""
        try:
            fs, path, protocol = self._fs(url)
            hasher = hashlib.sha256()
            nbytes = 0
            open_kwargs: dict[str, Any] = {"block_size": 0} if protocol in ("http", "https") else {}
            with fs.open(path, "rb", **open_kwargs) as src, open(tmp, "wb") as dst:
                while chunk := src.read(self._chunk):
                    if abort.is_set():
                        raise _Aborted
                    hasher.update(chunk)
                    dst.write(chunk)
                    nbytes += len(chunk)
                    if nbytes > self.capacity_bytes:
                        raise errors.RequestError(
                            f"checkpoint {url} is larger than the cache ({self.capacity_bytes} bytes)"
                        )
                dst.flush()
                os.fsync(dst.fileno())
            got = hasher.hexdigest()
            if got != digest:
                raise errors.BackendError(
                    f"checkpoint {url}: sha256 {got} does not match the expected {digest}"
                )
            if size_bytes is not None and nbytes != size_bytes:
                raise errors.BackendError(f"checkpoint {url}: {nbytes} bytes, expected {size_bytes}")
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return nbytes

    def _publish(self, tmp: Path, data_path: Path, meta_path: Path, meta: dict[str, Any]) -> None:
        """Rename the verified download into place and write its metadata through
        :class:`~flexlease.atomicfile.AtomicFile` (unique temp file, fsync, rename, directory
        fsync). Runs in a worker thread, under the cache's lock (one writer at a time)."""
        # Replace an older version: its metadata goes first, so a crash in between leaves a
        # data file without metadata (dropped at open), never new data under old metadata.
        meta_file = atomicfile.AtomicFile(meta_path)
        with meta_file.locked() as dir_fd:
            meta_path.unlink(missing_ok=True)
            os.replace(tmp, data_path)
            os.fsync(dir_fd)
        meta_file.replace(json.dumps(meta).encode())

    # --- eviction --------------------------------------------------------------------

    async def _evict_for(self, incoming: int, *, keep: str | None) -> None:
        """Evict LRU entries (never ``keep``) until used + reserved + incoming fits."""
        while self.used_bytes + self._reserved + incoming > self.capacity_bytes:
            victim = next((e for e in self._entries.values() if e.id != keep), None)
            if victim is None:
                return
            del self._entries[victim.id]
            data_path, meta_path = self._paths(victim.id)
            await asyncio.to_thread(_remove_pair, meta_path, data_path)
            self._metrics.evictions.inc()
            log.info(
                "evicted checkpoint",
                extra=ctx(
                    checkpoint=victim.id, size_bytes=victim.size_bytes, capacity_bytes=self.capacity_bytes
                ),
            )
        self._update_gauges()

    async def evict(self, checkpoint_id: str) -> bool:
        """Remove one checkpoint from the cache. Returns whether it was there."""
        async with self._lock:
            entry = self._entries.pop(checkpoint_id, None)
            if entry is None:
                return False
            data_path, meta_path = self._paths(checkpoint_id)
            await asyncio.to_thread(_remove_pair, meta_path, data_path)
        self._update_gauges()
        return True


def _remove_pair(meta_path: Path, data_path: Path) -> None:
    meta_path.unlink(missing_ok=True)
    data_path.unlink(missing_ok=True)
