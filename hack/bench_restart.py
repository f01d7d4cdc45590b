#!/usr/bin/env python3
"""Benchmark: full pod recreate versus in-sandbox hot restart, on a real containerd.

Starts its own testbed (``hack/containerd-testbed.sh``: containerd, CNI bridge, local
registry holding a trainer image with its own ``--image-mib`` MiB layer) and serves a
``--checkpoint-mib`` MiB checkpoint over HTTP from 127.0.0.1 (aiohttp). Then, ``--runs``
times:

* **full recreate** (what Kubernetes does without flexlease): stop and remove the pod's
  sandbox, run a new sandbox (new pod IP), pull the image from the registry (removed from the
  node beforehand), download the checkpoint over HTTP (evicted from the cache beforehand),
  create and start the container;
* **hot restart, direct** (flexlease, ``strategy: direct``, pods no kubelet manages): the
  image is prelaunched and the checkpoint cached; read the checkpoint from the cache, then
  restart only the container in the existing sandbox
  (:class:`nodeagent.hotrestart.restarter.HotRestarter`: pre-pull check, create, stop, start);
* **hot restart, spec patch** (flexlease, ``strategy: kubelet``, pods a kubelet manages — here
  the stand-in kubelet ``standins.kubelet_pods`` on the same containerd, syncing every 10 ms):
  prelaunched the same way; the agent patches the pod spec's image and waits for the
  kubelet's in-place restart, confirmed by image ID — once to the new (large) image, once
  with the **same image** (registry trainer, its spec switching between tag and digest form,
  which changes the spec hash so that the kubelet restarts it at once, without back-off).

Prints a Markdown table: per run, every duration (the hot restarts with ``pause``: no
trainer running, from CRI timestamps for the spec patch) and the ratios recreate / direct,
recreate / spec patch and the pause under the two strategies (spec patch / direct); then the
medians, and a line with both pauses and their ratio. Needs root (the testbed does).

    python hack/bench_restart.py [--runs 5] [--image-mib 256] [--checkpoint-mib 256]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flexlease import tasks
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore
from nodeagent.cache.checkpoints import CheckpointCache, CheckpointMetrics
from nodeagent.cache.images import ImageMetrics, ImagePuller
from nodeagent.cri import podspec
from nodeagent.cri.client import GrpcCri
from nodeagent.hotrestart.decide import PodFacts, Restart, RuntimeView, decide
from nodeagent.hotrestart.kubelet import image_patch, restart_policy, spec_image
from nodeagent.hotrestart.model import HotRestartRequest, Strategy
from nodeagent.hotrestart.restarter import HotRestarter
from standins.kubelet_pods import StandInKubelet

SCRIPT = Path(__file__).resolve().parent / "containerd-testbed.sh"
MIB = 1024 * 1024


@dataclass(frozen=True)
class Recreate:
    teardown: float
    sandbox: float
    pull: float
    checkpoint: float
    start: float

    @property
    def total(self) -> float:
        return self.teardown + self.sandbox + self.pull + self.checkpoint + self.start


@dataclass(frozen=True)
class Hot:
    checkpoint: float
    pull: float
    stop: float
    start: float
    total_restart: float
    pause: float

    @property
    def total(self) -> float:
        return self.checkpoint + self.total_restart


def testbed(cmd: str, directory: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    out = subprocess.run(
        [str(SCRIPT), cmd, str(directory)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
    )
    if out.returncode != 0:
        raise SystemExit(f"{SCRIPT.name} {cmd} failed:\n{out.stderr[-3000:]}")
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


async def serve_checkpoint(data: bytes) -> tuple[web.AppRunner, str]:
    async def get(request: web.Request) -> web.Response:
        return web.Response(body=data)

    app = web.Application()
    app.router.add_get("/checkpoints/step-1000.pt", get)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/checkpoints/step-1000.pt"


class Bench:
    def __init__(
        self, cri: GrpcCri, env: dict[str, str], cache: CheckpointCache, url: str, digest: str
    ) -> None:
        self.cri = cri
        self.env = env
        self.cache = cache
        self.url = url
        self.digest = digest
        self.log_root = Path(env["FLEXLEASE_TESTBED_DIR"]) / "pod-logs"
        self.cgroup = env["FLEXLEASE_TESTBED_CGROUP_PARENT"]
        self.large = env["FLEXLEASE_TESTBED_LARGE_IMAGE"]
        self.v2 = env["FLEXLEASE_TESTBED_TRAINER_V2"]

    async def run_pod(self, name: str, image: str) -> tuple[str, podspec.PodRef]:
        ref = podspec.PodRef("bench", name, str(uuid.uuid4()))
        config = podspec.sandbox_config(ref, self.log_root, cgroup_parent=self.cgroup)
        sid = await self.cri.run_pod_sandbox(config)
        spec = podspec.ContainerSpec(name="trainer", image=image)
        cid = await self.cri.create_container(sid, podspec.container_config(ref, spec), config)
        await self.cri.start_container(cid)
        return sid, ref

    async def remove_pod(self, sandbox_id: str) -> None:
        await self.cri.stop_pod_sandbox(sandbox_id)
        await self.cri.remove_pod_sandbox(sandbox_id)

    async def full_recreate(self, old_sandbox: str, name: str) -> tuple[Recreate, str]:
        t0 = time.monotonic()
        await self.remove_pod(old_sandbox)
        teardown = time.monotonic() - t0
        # Cold node for the new pod: image not present, checkpoint not cached (untimed; done
        # after the teardown so that no container still holds the image's layers).
        await self.cri.remove_image(self.large)
        await self.cache.evict("step-1000")
        t1 = time.monotonic()
        ref = podspec.PodRef("bench", name, str(uuid.uuid4()))
        config = podspec.sandbox_config(ref, self.log_root, cgroup_parent=self.cgroup)
        sid = await self.cri.run_pod_sandbox(config)
        t2 = time.monotonic()
        await self.cri.pull_image(self.large)
        t3 = time.monotonic()
        fetched = await self.cache.fetch("step-1000", self.url, sha256=self.digest)
        assert not fetched.hit
        t4 = time.monotonic()
        spec = podspec.ContainerSpec(name="trainer", image=self.large)
        cid = await self.cri.create_container(sid, podspec.container_config(ref, spec), config)
        await self.cri.start_container(cid)
        t5 = time.monotonic()
        return Recreate(teardown, t2 - t1, t3 - t2, t4 - t3, t5 - t4), sid

    async def hot_restart(
        self, sandbox_id: str, image: str, restarter: HotRestarter, puller: ImagePuller, run: int
    ) -> Hot:
        # Prelaunched: image on the node, checkpoint in the cache (untimed).
        await puller.ensure(image)
        await self.cache.fetch("step-1000", self.url, sha256=self.digest)
        sandbox = await self.cri.pod_sandbox_status(sandbox_id)
        containers = tuple(
            c for c in await self.cri.list_containers(sandbox_id=sandbox_id) if c.name == "trainer"
        )
        request = HotRestartRequest(id=f"bench-{run}", container="trainer", image=image)
        plan = decide(request, None, RuntimeView(sandbox, containers), default_strategy=Strategy.DIRECT)
        assert isinstance(plan, Restart), plan
        t0 = time.monotonic()
        fetched = await self.cache.fetch("step-1000", self.url, sha256=self.digest)
        assert fetched.hit
        t1 = time.monotonic()
        outcome = await restarter.execute(plan, pod=f"bench/{sandbox.name}")
        assert outcome.succeeded, outcome.message
        after = await self.cri.pod_sandbox_status(sandbox_id)
        assert after.ip == sandbox.ip  # same sandbox, same pod IP
        return Hot(
            t1 - t0,
            outcome.timings.pull,
            outcome.timings.stop,
            outcome.timings.start,
            outcome.total_seconds,
            outcome.pause_seconds or 0.0,
        )

    async def spec_patch(
        self,
        store: MemoryStore,
        kubelet: StandInKubelet,
        name: str,
        *,
        image: str,
        restarter: HotRestarter,
        puller: ImagePuller,
        run: int,
    ) -> Hot:
        """The kubelet strategy on a stand-in kubelet's pod: patch the spec, wait for the
        kubelet's replacement, confirm it by image ID."""
        await puller.ensure(image)
        await self.cache.fetch("step-1000", self.url, sha256=self.digest)
        pod = await store.get(Kind.POD, name, namespace="bench")
        sandbox_id = kubelet.sandbox_id("bench", name)
        sandbox = await self.cri.pod_sandbox_status(sandbox_id)
        containers = tuple(
            c for c in await self.cri.list_containers(sandbox_id=sandbox_id) if c.name == "trainer"
        )
        view = RuntimeView(sandbox, containers, await self.cri.image_status(image))
        request = HotRestartRequest(id=f"bench-{name}-{run}", container="trainer", image=image)
        facts = PodFacts(restart_policy(pod), spec_image(pod, "trainer"))
        plan = decide(request, None, view, default_strategy=None, pod=facts)
        assert isinstance(plan, Restart) and plan.strategy is Strategy.KUBELET, plan

        async def patch_spec(new_image: str) -> None:
            current = await store.get(Kind.POD, name, namespace="bench")
            await store.patch(Kind.POD, name, image_patch(current, "trainer", new_image), namespace="bench")

        t0 = time.monotonic()
        fetched = await self.cache.fetch("step-1000", self.url, sha256=self.digest)
        assert fetched.hit
        t1 = time.monotonic()
        outcome = await restarter.execute(plan, pod=f"bench/{name}", patch_spec=patch_spec)
        assert outcome.succeeded, outcome.message
        after = await self.cri.pod_sandbox_status(sandbox_id)
        assert after.ip == sandbox.ip  # same sandbox, same pod IP
        return Hot(
            t1 - t0,
            outcome.timings.pull,
            outcome.timings.stop,
            outcome.timings.start,
            outcome.total_seconds,
            outcome.pause_seconds or 0.0,
        )


@dataclass(frozen=True)
class Row:
    recreate: Recreate
    direct: Hot
    spec_new: Hot
    spec_same: Hot


def table(rows: list[Row]) -> str:
    lines = [
        "| run | full recreate (s) | teardown + sandbox + pull + ckpt + create/start "
        "| direct (s) | direct pause | spec patch, new image (s) | its pause "
        "| spec patch, same image, tag↔digest (s) | its pause | recreate / direct | recreate / spec patch "
        "| pause: spec patch / direct |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def cells(r: Row) -> tuple[float, ...]:
        return (
            r.recreate.total,
            r.direct.total,
            r.direct.pause,
            r.spec_new.total,
            r.spec_new.pause,
            r.spec_same.total,
            r.spec_same.pause,
            r.recreate.total / r.direct.total,
            r.recreate.total / r.spec_new.total,
            r.spec_new.pause / r.direct.pause,
        )

    for i, r in enumerate(rows, 1):
        c = r.recreate
        parts = " + ".join(f"{x:.3f}" for x in (c.teardown, c.sandbox, c.pull, c.checkpoint, c.start))
        v = cells(r)
        lines.append(
            f"| {i} | {v[0]:.3f} | {parts} | {v[1]:.3f} | {v[2]:.3f} | {v[3]:.3f} | {v[4]:.3f} "
            f"| {v[5]:.3f} | {v[6]:.3f} | {v[7]:.1f}× | {v[8]:.1f}× | {v[9]:.2f}× |"
        )
    m = [statistics.median(cells(r)[k] for r in rows) for k in range(10)]
    lines.append(
        f"| median | {m[0]:.3f} | | {m[1]:.3f} | {m[2]:.3f} | {m[3]:.3f} | {m[4]:.3f} | {m[5]:.3f} "
        f"| {m[6]:.3f} | {m[7]:.1f}× | {m[8]:.1f}× | {m[9]:.2f}× |"
    )
    lines.append(
        f"\npause the pod sees (median): kubelet strategy (spec patch, new image) {m[4]:.3f} s, "
        f"direct strategy (agent CRI restart) {m[2]:.3f} s; ratio kubelet / direct "
        f"{m[4] / m[2]:.2f}× (medians), {m[9]:.2f}× (median of per-run ratios)"
    )
    return "\n".join(lines)


async def kubelet_pod(store: MemoryStore, kubelet: StandInKubelet, name: str, image: str) -> None:
    await store.create(
        Kind.POD,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "bench"},
            "spec": {
                "nodeName": "bench-node",
                "terminationGracePeriodSeconds": 10,
                "containers": [{"name": "trainer", "image": image}],
            },
        },
    )
    await kubelet.sync_once()


async def bench(args: argparse.Namespace, env: dict[str, str]) -> str:
    data = os.urandom(args.checkpoint_mib * MIB)
    digest = hashlib.sha256(data).hexdigest()
    runner, url = await serve_checkpoint(data)
    cache_dir = Path(env["FLEXLEASE_TESTBED_DIR"]) / "checkpoint-cache"
    cache = CheckpointCache(
        cache_dir, capacity_bytes=4 * len(data), metrics=CheckpointMetrics(CollectorRegistry())
    )
    await cache.open()
    try:
        async with GrpcCri(
            env["FLEXLEASE_CRI_ENDPOINT"], timeout_seconds=30, pull_timeout_seconds=600
        ) as cri:
            b = Bench(cri, env, cache, url, digest)
            puller = ImagePuller(cri, ImageMetrics(CollectorRegistry()))
            restarter = HotRestarter(cri, puller, stop_timeout_seconds=10, poll_seconds=0.01)
            store = MemoryStore()
            kubelet = StandInKubelet(
                cri,
                store,
                node="bench-node",
                log_root=b.log_root,
                cgroup_parent=b.cgroup,
                period_seconds=0.01,
            )
            same_image = env["FLEXLEASE_TESTBED_REGISTRY_TRAINER"]
            await kubelet_pod(store, kubelet, "spec-new", env["FLEXLEASE_TESTBED_TRAINER_V1"])
            await kubelet_pod(store, kubelet, "spec-same", same_image)
            kubelet_task = asyncio.create_task(kubelet.run(), name="bench:standin-kubelet")
            await cri.pull_image(b.large)  # warm-up: the first pull also fills containerd's caches
            recreate_sandbox, _ = await b.run_pod("recreate", env["FLEXLEASE_TESTBED_TRAINER_V1"])
            hot_sandbox, _ = await b.run_pod("hot", env["FLEXLEASE_TESTBED_TRAINER_V1"])
            rows = []
            for run in range(1, args.runs + 1):
                # Hot restart to the (prelaunched) large image, then back to a small one,
                # untimed, so that the full recreate below finds the large image unused.
                hot = await b.hot_restart(hot_sandbox, b.large, restarter, puller, run)
                await b.hot_restart(hot_sandbox, b.v2, restarter, puller, run + 1000)
                spec_new = await b.spec_patch(
                    store, kubelet, "spec-new", image=b.large, restarter=restarter, puller=puller, run=run
                )
                await b.spec_patch(
                    store, kubelet, "spec-new", image=b.v2, restarter=restarter, puller=puller, run=run + 1000
                )
                spec_same = await b.spec_patch(
                    store, kubelet, "spec-same", image=same_image, restarter=restarter, puller=puller, run=run
                )
                recreate, recreate_sandbox = await b.full_recreate(recreate_sandbox, f"recreate-{run}")
                rows.append(Row(recreate, hot, spec_new, spec_same))
                print(
                    f"run {run}: recreate {recreate.total:.3f} s, direct {hot.total:.3f} s "
                    f"(pause {hot.pause:.3f}), spec patch {spec_new.total:.3f} s "
                    f"(pause {spec_new.pause:.3f}), "
                    f"same image {spec_same.total:.3f} s (pause {spec_same.pause:.3f})",
                    file=sys.stderr,
                )
            backoffs = [e for e in kubelet.events if e.reason == "BackOff"]
            assert not backoffs, backoffs
            await tasks.stop(kubelet_task)
            await kubelet.remove_all()
            await store.close()
            for sid in (recreate_sandbox, hot_sandbox):
                await b.remove_pod(sid)
    finally:
        await runner.cleanup()
    return table(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--image-mib", type=int, default=256, help="size of the image's own layer, MiB")
    p.add_argument("--checkpoint-mib", type=int, default=256, help="checkpoint size, MiB")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench_restart.py needs root (it starts containerd)", file=sys.stderr)
        return 2
    directory = Path(tempfile.mkdtemp(prefix="flexlease-bench-", dir="/tmp"))
    env = testbed("start", directory, {"FLEXLEASE_TESTBED_LARGE_MIB": str(args.image_mib)})
    try:
        result = asyncio.run(bench(args, env))
    finally:
        testbed("stop", directory)
    print(
        f"containerd testbed, {os.cpu_count()}-core {platform.machine()} {platform.system()}, "
        f"image layer {args.image_mib} MiB from a local registry, "
        f"checkpoint {args.checkpoint_mib} MiB over HTTP (127.0.0.1), {args.runs} runs\n"
    )
    print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
