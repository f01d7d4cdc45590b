"""Kill the extender (a real ``python -m extender.main`` process) during a burst of binds,
restart it, and check that every assignment is recovered from pod annotations and that no
GPU is ever held twice.

The cluster is the stand-in API server (the extender runs on KubeStore with a kubeconfig)
or a SQLite file shared with the extender (the embedded default). The test plays
kube-scheduler: ``/filter``, ``/prioritize``, ``/bind`` per pod, many pods at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from flexlease.api import keys
from flexlease.api.pod import Assignment, is_terminated, pod_gpu_count
from flexlease.config import StoreSettings
from flexlease.store.base import JsonObj, Kind, Store
from flexlease.store.kube import KubeStore
from flexlease.store.sqlite import SqliteStore
from standins.apiserver import FakeApiServer
from tests.store.fake_apiserver_payloads import gpunode, replicaset_pod

REPO = Path(__file__).resolve().parents[2]
NS = "team-a"
NODES = [f"gpu-node-{i}" for i in range(4)]
GPUS_PER_NODE = 8
PODS = [(f"trainer-{i:02d}", 2 if i % 6 == 0 else 1) for i in range(24)]  # 4 x 2 + 20 x 1 = 28 of 32 GPUs
START_TIMEOUT = 30.0


@dataclass
class Extender:
    """One extender process and the URL it listens on (read from its JSON log)."""

    proc: asyncio.subprocess.Process
    url: str = ""
    log: list[dict[str, Any]] = field(default_factory=list)
    drain: asyncio.Task[None] | None = None


async def start_extender(env: dict[str, str]) -> Extender:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "extender.main",
        cwd=REPO,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    ext = Extender(proc)
    listening = asyncio.get_running_loop().create_future()

    async def drain() -> None:
        assert proc.stderr is not None
        async for raw in proc.stderr:
            try:
                line = json.loads(raw)
            except ValueError:
                line = {"msg": raw.decode(errors="replace").rstrip()}
            ext.log.append(line)
            if line.get("msg") == "extender listening" and not listening.done():
                listening.set_result(line["urls"][0])
        if not listening.done():
            listening.set_exception(RuntimeError(f"extender exited: {ext.log[-5:]}"))

    ext.drain = asyncio.create_task(drain(), name=f"extender-{proc.pid}-stderr")
    async with asyncio.timeout(START_TIMEOUT):
        ext.url = await listening
    return ext


async def stop_extender(ext: Extender, *, kill: bool) -> None:
    if ext.proc.returncode is None:
        ext.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
    await ext.proc.wait()
    if ext.drain is not None:
        await ext.drain


async def wait_ready(session: aiohttp.ClientSession, url: str) -> None:
    async with asyncio.timeout(START_TIMEOUT):
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{url}/readyz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.05)


async def used_gpus(session: aiohttp.ClientSession, url: str) -> int:
    """``flexlease_extender_gpus{state="used"}`` summed over pools, tiers and types."""
    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("flexlease_extender_gpus{") and 'state="used"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


async def schedule(session: aiohttp.ClientSession, url: str, store: Store, name: str) -> bool:
    """One scheduling cycle for pod ``name`` as kube-scheduler runs it against an extender
    with ``nodeCacheCapable: true``. True when the pod got bound."""
    pod = await store.get(Kind.POD, name, namespace=NS)
    if pod["spec"].get("nodeName"):
        return True
    args = {"Pod": pod, "Nodes": None, "NodeNames": NODES}
    async with session.post(f"{url}/filter", json=args) as resp:
        result = await resp.json()
    fits = result.get("NodeNames") or []
    if not fits:
        return False
    async with session.post(f"{url}/prioritize", json={**args, "NodeNames": fits}) as resp:
        scores = {h["Host"]: h["Score"] for h in await resp.json()}
    node = max(fits, key=lambda n: (scores.get(n, 0), n))
    binding = {"PodName": name, "PodNamespace": NS, "PodUID": pod["metadata"]["uid"], "Node": node}
    async with session.post(f"{url}/bind", json=binding) as resp:
        return not (await resp.json()).get("Error")


async def burst(session: aiohttp.ClientSession, url: str, store: Store, names: list[str]) -> None:
    """Schedule ``names`` 8 at a time until each is bound, retrying as the scheduler's
    queue does; stops at the first transport error (the extender died)."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for n in names:
        queue.put_nowait(n)

    async def worker() -> None:
        while not queue.empty():
            name = queue.get_nowait()
            if not await schedule(session, url, store, name):
                queue.put_nowait(name)
                await asyncio.sleep(0.02)

    async with asyncio.TaskGroup() as tg:
        for i in range(8):
            tg.create_task(worker(), name=f"scheduler-worker-{i}")


def holdings(pods: list[JsonObj]) -> dict[str, Assignment]:
    """The assignment of every non-terminated pod that has one (the extender's truth)."""
    out: dict[str, Assignment] = {}
    for pod in pods:
        ann = pod["metadata"].get("annotations") or {}
        if "flexlease.io/assigned-gpus" in ann and not is_terminated(pod):
            out[pod["metadata"]["name"]] = Assignment.parse(ann["flexlease.io/assigned-gpus"])
    return out


def assert_no_gpu_held_twice(pods: list[JsonObj]) -> None:
    held = holdings(pods)
    devices = Counter(d for a in held.values() for d in a.devices)
    assert not [d for d, n in devices.items() if n > 1], f"GPUs held twice: {devices.most_common(3)}"
    for pod in pods:
        name = pod["metadata"]["name"]
        node = pod["spec"].get("nodeName")
        if node:  # every bound GPU pod holds exactly what it asked for, on its node
            assert name in held and held[name].node == node, name
            assert len(held[name].indices) == pod_gpu_count(pod)


@dataclass
class Cluster:
    store: Store
    env: dict[str, str]
    api: FakeApiServer | None = None


@pytest.fixture(params=["kube", "sqlite"])
async def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Cluster]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXLEASE_")}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "FLEXLEASE_LOG_FORMAT": "json",
            "FLEXLEASE_LOG_LEVEL": "INFO",
            "FLEXLEASE_EXTENDER__HOST": "127.0.0.1",
            "FLEXLEASE_EXTENDER__PORT": "0",
            "FLEXLEASE_EXTENDER__INSECURE_HTTP": "true",  # loopback only
            "FLEXLEASE_LEASE__ENABLED": "false",
            "FLEXLEASE_STORE__REQUEST_TIMEOUT_SECONDS": "5",
        }
    )
    if request.param == "kube":
        async with FakeApiServer(token="extender-token") as api:
            api.latency = 0.01  # widen the window between the annotation patch and the Binding
            kubeconfig = tmp_path / "kubeconfig"
            kubeconfig.write_text(
                yaml.safe_dump(
                    {
                        "apiVersion": "v1",
                        "kind": "Config",
                        "clusters": [{"name": "c", "cluster": {"server": api.url}}],
                        "users": [{"name": "u", "user": {"token": "extender-token"}}],
                        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                        "current-context": "c",
                    }
                )
            )
            env.update({"FLEXLEASE_STORE__KIND": "kube", "FLEXLEASE_STORE__KUBECONFIG": str(kubeconfig)})
            store = await KubeStore.connect(StoreSettings(kind="kube", kubeconfig=kubeconfig))
            try:
                yield Cluster(store, env, api)
            finally:
                await store.close()
    else:
        path = tmp_path / "state.db"
        env.update(
            {
                "FLEXLEASE_STORE__KIND": "sqlite",
                "FLEXLEASE_STORE__SQLITE_PATH": str(path),
                "FLEXLEASE_STORE__SQLITE_POLL_SECONDS": "0.01",
            }
        )
        sqlite = SqliteStore(path, poll_seconds=0.01)
        try:
            yield Cluster(sqlite, env)
        finally:
            await sqlite.close()


async def seed(cluster: Cluster) -> None:
    """GPUNodes as their agents write them (spec, then status), Pending GPU pods."""
    for name in NODES:
        node = gpunode(name, devices=GPUS_PER_NODE)
        status = node.pop("status")
        await cluster.store.create(Kind.GPUNODE, node)
        await cluster.store.patch(Kind.GPUNODE, name, {"status": status}, subresource="status")
    for name, gpus in PODS:
        pod = replicaset_pod(name, namespace=NS, node=None, gpus=gpus)
        pod["spec"]["schedulerName"] = keys.DEFAULT_SCHEDULER_NAME  # the profile that calls us
        pod["metadata"].pop("managedFields")
        pod.pop("status")
        await cluster.store.create(Kind.POD, pod)


async def test_killed_during_a_burst_of_binds_recovers_every_assignment(cluster: Cluster) -> None:
    await seed(cluster)
    names = [n for n, _ in PODS]
    async with aiohttp.ClientSession() as session:
        first = await start_extender(cluster.env)
        try:
            await wait_ready(session, first.url)
            binding = asyncio.create_task(burst(session, first.url, cluster.store, names), name="burst-1")
            async with asyncio.timeout(30):
                while len(holdings((await cluster.store.list(Kind.POD)).items)) < 8:  # noqa: ASYNC110
                    await asyncio.sleep(0.005)
        finally:
            await stop_extender(first, kill=True)  # SIGKILL in the middle of the burst
        with contextlib.suppress(aiohttp.ClientError, ExceptionGroup):
            await binding  # in-flight requests fail with the process
        pods = (await cluster.store.list(Kind.POD)).items
        assert_no_gpu_held_twice(pods)
        held_at_kill = holdings(pods)
        bound_at_kill = [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")]
        assert 8 <= len(held_at_kill) < len(PODS), "the kill did not land mid-burst"
        print(f"at the kill: {len(held_at_kill)} pods hold GPUs, {len(bound_at_kill)} bound")

        second = await start_extender(cluster.env)
        try:
            await wait_ready(session, second.url)
            # every assignment is recovered from the annotations before anything else happens
            want = sum(len(a.indices) for a in held_at_kill.values())
            assert await used_gpus(session, second.url) == want
            async with asyncio.timeout(60):
                await burst(session, second.url, cluster.store, names)
            pods = (await cluster.store.list(Kind.POD)).items
            assert_no_gpu_held_twice(pods)
            assert all(p["spec"].get("nodeName") for p in pods)
            for name in bound_at_kill:  # what was bound before the kill did not move
                assert holdings(pods)[name] == held_at_kill[name]
            assert await used_gpus(session, second.url) == sum(g for _, g in PODS)
        finally:
            await stop_extender(second, kill=False)
    assert second.proc.returncode == 0
    assert not [line for line in second.log if line.get("level") in ("error", "critical")]
