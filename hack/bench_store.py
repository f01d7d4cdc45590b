"""Store benchmark: write throughput, list time and watch latency of MemoryStore and SqliteStore.

    python hack/bench_store.py [--pods 5000] [--writes 2000]

Scenario (the simulator's scale, DESIGN §5): ``--pods`` pods of ~1 KiB JSON and 1,250
GPUNodes are created; then ``--writes`` annotation patches (the extender's bind writes)
while one watch (all pods) and, for SQLite, a second process's watch consume them. Prints
per store: creates/s, patches/s, list of all pods (ms), watch latency p50/p99 (ms) from
commit to delivery, in-process and (SQLite) from another OS process. Timestamps travel in
the objects; both processes read the same clock.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flexlease.store.base import EventType, JsonObj, Kind, Store
from flexlease.store.memory import MemoryStore
from flexlease.store.sqlite import SqliteStore

NS = "bench"
NODES = 1250


def pod(i: int) -> JsonObj:
    return {
        "metadata": {
            "name": f"pod-{i}",
            "namespace": NS,
            "labels": {
                "flexlease.io/priority": "low" if i % 3 else "high",
                "flexlease.io/owner": f"{NS}/job-{i % 50}",
            },
            "annotations": {"flexlease.io/reliability": "MA"},
        },
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.local/train:1",
                    "resources": {"limits": {"nvidia.com/gpu": str(1 + i % 8), "cpu": "8"}},
                    "env": [{"name": f"ENV_{k}", "value": "x" * 16} for k in range(8)],
                }
            ],
        },
    }


def gpunode(i: int) -> JsonObj:
    return {
        "metadata": {"name": f"gpu-{i}"},
        "spec": {"pool": "general", "devices": {str(d): {"owner": None} for d in range(8)}},
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def consume(store: Store, resource_version: str, count: int, latencies: list[float]) -> None:
    """Watch pods from ``resource_version`` until ``count`` patch events arrived."""
    seen = 0
    async for event in store.watch(Kind.POD, resource_version=resource_version):
        if event.type is EventType.MODIFIED:
            sent = float(event.object["metadata"]["annotations"]["bench/sent"])
            latencies.append(time.time() - sent)
            seen += 1
            if seen == count:
                return


async def bench(store: Store, *, pods: int, writes: int, remote: Path | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    for i in range(NODES):
        await store.create(Kind.GPUNODE, gpunode(i))
    for i in range(pods):
        await store.create(Kind.POD, pod(i))
    out["creates_per_s"] = (NODES + pods) / (time.perf_counter() - t0)

    t0 = time.perf_counter()
    listed = await store.list(Kind.POD)
    out["list_pods_ms"] = (time.perf_counter() - t0) * 1000
    assert len(listed.items) == pods

    local: list[float] = []
    watcher = asyncio.create_task(consume(store, listed.resource_version, writes, local), name="bench-watch")
    proc = None
    if remote is not None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--watch",
            str(remote),
            listed.resource_version,
            str(writes),
            stdout=asyncio.subprocess.PIPE,
        )
        await asyncio.sleep(1.0)  # let it start and open the file
    t0 = time.perf_counter()
    for w in range(writes):
        await store.patch(
            Kind.POD,
            f"pod-{w % pods}",
            {"metadata": {"annotations": {"bench/sent": repr(time.time()), "bench/n": str(w)}}},
            namespace=NS,
        )
        await asyncio.sleep(0)  # let the local watcher run, as a server's other tasks would
    out["patches_per_s"] = writes / (time.perf_counter() - t0)
    await watcher
    out["watch_ms_p50"] = percentile(local, 0.5) * 1000
    out["watch_ms_p99"] = percentile(local, 0.99) * 1000
    if proc is not None:
        stdout, _ = await proc.communicate()
        remote_latencies = json.loads(stdout)
        out["other_process_watch_ms_p50"] = percentile(remote_latencies, 0.5) * 1000
        out["other_process_watch_ms_p99"] = percentile(remote_latencies, 0.99) * 1000
    return out


async def remote_watch(path: Path, resource_version: str, count: int) -> None:
    store = SqliteStore(path)
    latencies: list[float] = []
    try:
        await consume(store, resource_version, count, latencies)
    finally:
        await store.close()
    print(json.dumps(latencies))


async def main(pods: int, writes: int) -> None:
    memory = MemoryStore()
    results = {"MemoryStore": await bench(memory, pods=pods, writes=writes, remote=None)}
    await memory.close()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.db"
        sqlite = SqliteStore(path)
        results["SqliteStore"] = await bench(sqlite, pods=pods, writes=writes, remote=path)
        await sqlite.close()
    print(f"pods={pods} gpunodes={NODES} patches={writes}")
    for name, figures in results.items():
        print(name)
        for key, value in figures.items():
            print(f"  {key:28} {value:10.1f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--watch":
        asyncio.run(remote_watch(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
    else:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--pods", type=int, default=5000)
        parser.add_argument("--writes", type=int, default=2000)
        args = parser.parse_args()
        asyncio.run(main(args.pods, args.writes))
