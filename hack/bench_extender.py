"""Benchmark the extender at the paper's scale: 1,250 nodes × 8 GPUs, 5,000 running pods.

Usage: ``python hack/bench_extender.py [--cycles 1000] [--nodes 1250] [--pods 5000] [--scale 1250,2500,5000]
[--profile N] [--no-gc-policy] [--gen0 N] [--gen1 N]``

A server process (pinned to one CPU) loads the cluster into a ``MemoryStore`` — GPUNodes
with a mix of GPU types, tiers, tier overrides, ownership tags, unhealthy devices and a
standby pool; running pods holding GPUs through ``flexlease.io/assigned-gpus`` — plus the
pending pods to schedule, and serves the real extender app (:func:`extender.server.create_app`)
on loopback with the production runner. Beside it, on another port of the same process, an
empty aiohttp handler that reads the body and answers ``{}``: the HTTP floor.

A client process (pinned to another CPU) plays kube-scheduler with ``nodeCacheCapable``:
per pending pod, ``/filter`` with the candidate nodes, ``/prioritize`` with the nodes that
passed, ``/bind`` to the best one, one cycle at a time over a keep-alive connection. The
candidates are what kube-scheduler sends (``--candidates scheduler``, :class:`FeasibleNodes`):
the nodes whose free ``nvidia.com/gpu`` (allocatable minus the pods bound or assumed there)
covers the pod's count, in the order its parallel filter finds them, a different order in
every cycle; ``--candidates all`` sends every node in one order, as the rounds before the
sixth did. It prints p50
and p99 per verb measured by the client and by the server (exact per-request times from a
recording middleware wrapped around the app, and the Prometheus histogram's count), cycles
per second, and the empty handler's latency for the same filter body, so our cost is a ratio.

The server logs as ``extender.main`` does: JSON at ``--log-level`` (INFO: a line per bind)
to ``--server-log`` (``/dev/null``), the verbs' access log off unless ``--access-log``.

``--store kube``: the extender talks to the API server stand-in (:mod:`standins.apiserver`,
real Kubernetes JSON over HTTP) in a third process pinned to ``--apiserver-cpu``, through
``KubeStore`` (kubernetes_asyncio) as in a cluster: its lists, watches, pod reads and
Bindings cost the extender what its API client costs, which the in-process ``MemoryStore``
hides. The cluster is loaded through the same client (slower). Handler CPU then includes the
client's work, and whatever the loop ran while a handler waited for the API server (watch
events, other requests): the whole-process CPU per cycle is the figure to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import cProfile
import gc
import heapq
import json
import logging
import math
import multiprocessing
import os
import platform
import pstats
import random
import statistics
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final, TypeVar

import aiohttp
import uvloop
from aiohttp import web
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an installed copy
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as Dockerfile.extender: no BLAS thread pool

import flexlease.logging
from extender import gcpolicy
from extender import server as extserver
from extender.lease import controller as lease_controller
from extender.metrics import REQUEST_SECONDS
from flexlease.api import keys
from flexlease.config import ExtenderSettings, LeaseSettings, Settings, StoreSettings
from flexlease.store.base import JsonObj, Kind, Store
from flexlease.store.kube import KubeStore
from flexlease.store.memory import MemoryStore
from hack import interpreter

MODELS = ("NVIDIA H20", "NVIDIA H20", "NVIDIA H20", "NVIDIA H20", "NVIDIA A100-SXM4-80GB")
OWNERS = tuple(f"online/job-{i}" for i in range(20))
VERBS = ("filter", "prioritize", "bind")
FILTER_PARTS = (
    ("filter_incr", "filter, incremental"),
    ("filter_derived", "filter, new class derived from its family"),
    ("filter_full", "filter, full (new class)"),
    ("filter_arrays", "filter, many changed nodes re-checked over the arrays (incremental or derived)"),
    ("filter_refiltered", "filter, known class filtered afresh (new universe, change log too short)"),
)
"""The kinds of filter request, by the filter cache's counter that moved (key, report label)."""
_DECODER = json.JSONDecoder()


# --------------------------------------------------------------------------- the cluster


def gpunode(rng: random.Random, i: int, *, standby: bool) -> tuple[JsonObj, JsonObj]:
    """(object to create, status to patch) of node ``i``."""
    name = f"gpu-{i:05d}"
    model = MODELS[i % len(MODELS)]
    spec_devices: dict[str, Any] = {}
    if not standby and rng.random() < 0.15:  # an online job lent half the node
        owner = rng.choice(OWNERS)
        for d in range(4):
            spec_devices[str(d)] = {"owner": owner, "leasedAt": "2026-11-21T01:30:00Z"}
    if rng.random() < 0.02:
        spec_devices.setdefault("7", {})["tierOverride"] = "LA"
    devices = {}
    for d in range(8):
        r = rng.random()
        tier = "HA" if r < 0.7 else "MA" if r < 0.9 else "LA"
        unhealthy = rng.random() < 0.005
        devices[str(d)] = {
            "uuid": f"GPU-{i:05d}-{d}-9f1c-4a7e",
            "model": model,
            "memoryMiB": 97871,
            "health": "Unhealthy" if unhealthy else "Healthy",
            "tier": tier,
        }
    obj = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.GPUNODE_KIND,
        "metadata": {"name": name},
        "spec": {"pool": "standby" if standby else "general", "devices": spec_devices},
    }
    status = {
        "nodeIP": f"10.{i // 250}.{i % 250}.1",
        "devices": devices,
        "cache": {
            "images": [f"registry.local/train:{i % 7}"],
            "checkpoints": [{"id": f"ckpt-{i % 50}", "sizeBytes": 1 << 30, "sha256": "0" * 64}],
        },
    }
    return obj, status


def pod(
    name: str,
    *,
    gpus: int,
    priority: str,
    owner: str | None,
    tier: str,
    gpu_type: str | None = None,
    reclaim: bool = False,
    checkpoint: str | None = None,
    node: str | None = None,
    indices: tuple[int, ...] = (),
) -> JsonObj:
    """A Pod as the API server holds it (camelCase, full metadata and spec)."""
    labels = {keys.LABEL_PRIORITY: priority, "batch.kubernetes.io/job-name": name.rsplit("-", 1)[0]}
    if owner is not None:
        labels[keys.LABEL_OWNER] = owner.split("/")[1]
    ann = {keys.ANN_RELIABILITY: tier}
    if gpu_type:
        ann[keys.ANN_GPU_TYPE] = gpu_type
    if reclaim:
        ann[keys.ANN_RECLAIM] = "true"
    if checkpoint:
        ann[keys.ANN_CHECKPOINT] = checkpoint
    if node is not None:
        ann[keys.ANN_ASSIGNED_GPUS] = f"{node}:{','.join(map(str, indices))}"
        ann[keys.ANN_ASSIGNED_AT] = "2026-11-21T20:00:00Z"
    limits = {"cpu": "16", "memory": "128Gi", keys.DEFAULT_GPU_RESOURCE: str(gpus)}
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "trainer",
                "image": "registry.local/train:3",
                "command": ["torchrun", "train.py"],
                "resources": {"limits": limits, "requests": dict(limits)},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "restartPolicy": "Never",
        "schedulerName": keys.DEFAULT_SCHEDULER_NAME,
        "priority": 1000 if priority == "high" else 0,
        "preemptionPolicy": "PreemptLowerPriority",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "online" if priority == "high" else "batch",
            "labels": labels,
            "annotations": ann,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name.rsplit("-", 1)[0],
                    "uid": "j",
                    "controller": True,
                }
            ],
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1"}
            ],
        },
        "spec": spec,
    }


async def load_cluster(
    store: Store, *, nodes: int, running: int, pending: int, seed: int
) -> tuple[list[JsonObj], dict[str, int]]:
    """Create the cluster in ``store``; return the pending pods as stored (with uids) and
    each node's free ``nvidia.com/gpu`` as kube-scheduler counts it (healthy devices, the
    device plugin's allocatable, minus those the running pods hold)."""
    rng = random.Random(seed)
    standby_from = nodes - max(1, nodes // 25)  # 4 % of nodes form the standby pool
    free: dict[str, list[int]] = {}
    for i in range(nodes):
        obj, status = gpunode(rng, i, standby=i >= standby_from)
        await store.create(Kind.GPUNODE, obj)
        await store.patch(Kind.GPUNODE, obj["metadata"]["name"], {"status": status}, subresource="status")
        free[obj["metadata"]["name"]] = [
            d for d in range(8) if status["devices"][str(d)]["health"] == "Healthy"
        ]
    names = list(free)[:standby_from]
    for p in range(running):
        gpus = rng.choice((1, 1, 1, 2))
        node = rng.choice(names)
        while len(free[node]) < gpus:
            node = rng.choice(names)
        indices = tuple(free[node][:gpus])
        del free[node][:gpus]
        prio = "high" if rng.random() < 0.3 else "low"
        obj = pod(
            f"run-{p}-0",
            gpus=gpus,
            priority=prio,
            owner=rng.choice(OWNERS),
            tier="LA",
            node=node,
            indices=indices,
        )
        created = await store.create(Kind.POD, obj)
        meta = created["metadata"]
        await store.patch(
            Kind.POD,
            meta["name"],
            {"status": {"phase": "Running"}},
            namespace=meta["namespace"],
            subresource="status",
        )
    # Pending pods arrive as jobs (1-8 pods with one spec each, scheduled one after the
    # other, as kube-scheduler sees a job's pods): HP reclaim pods of online jobs, HP
    # online pods, LP batch pods.
    out: list[JsonObj] = []
    job = 0
    while len(out) < pending:
        job += 1
        size = rng.choice((1, 1, 2, 4, 8))
        r = rng.random()
        if r < 0.15:
            spec: dict[str, Any] = dict(
                gpus=rng.choice((1, 2, 4)), priority="high", owner=rng.choice(OWNERS),
                tier=rng.choice(("HA", "MA")), gpu_type=MODELS[0], reclaim=True,
                checkpoint=f"ckpt-{job % 50}",
            )  # fmt: skip
            prefix = "reclaim"
        elif r < 0.35:
            spec = dict(gpus=rng.choice((2, 4, 8)), priority="high", owner=rng.choice(OWNERS), tier="HA")
            prefix = "online"
        else:
            spec = dict(
                gpus=rng.choice((1, 1, 2, 4)), priority="low", owner=None,
                tier=rng.choice(("LA", "LA", "MA")), gpu_type=rng.choice((None, None, MODELS[-1])),
            )  # fmt: skip
            prefix = "batch"
        for k in range(min(size, pending - len(out))):
            out.append(await store.create(Kind.POD, pod(f"{prefix}-{job}-{k}", **spec)))
    return out, {name: len(indices) for name, indices in free.items()}


class FeasibleNodes:
    """The candidate lists kube-scheduler sends a ``nodeCacheCapable`` extender's ``/filter``
    (``findNodesThatFitPod`` in pkg/scheduler/schedule_one.go, with the shipped
    ``percentageOfNodesToScore: 100``), for pods that ask only for GPUs.

    * Which nodes: NodeResourcesFit passes a node when its allocatable ``nvidia.com/gpu``
      minus what the pods there request (bound ones and those assumed by an earlier cycle
      whose bind is in flight) covers the pod's count (``ignoredByScheduler: false``).
    * In which order: ``findNodesThatPassFilters`` checks the nodes with
      ``Parallelizer().Until`` — 16 workers taking chunks of ``min(√n, n/16 + 1)``
      consecutive nodes (``chunkSizeFor``) — and appends each feasible node when its check
      ends, so the list interleaves the workers' chunks differently in every cycle. Here each
      check takes a random 0.5–1.5 time units; ``orders`` such interleavings are drawn once
      (seeded) and used in turn. The search starts at node 0 every cycle: with 100 % to
      score, ``nextStartNodeIndex`` advances by every node, back to where it was.
    """

    def __init__(
        self,
        names: list[str],
        free: dict[str, int],
        rng: random.Random,
        *,
        parallelism: int = 16,
        orders: int = 64,
    ) -> None:
        self.names = names
        self.free = dict(free)
        self._orders = [self._interleaving(len(names), parallelism, rng) for _ in range(orders)]
        self._turn = 0

    @staticmethod
    def _interleaving(n: int, parallelism: int, rng: random.Random) -> list[int]:
        """Node positions in the order parallel checks of ``n`` nodes end."""
        size = max(1, min(math.isqrt(n), n // parallelism + 1))
        chunks = deque(range(lo, min(lo + size, n)) for lo in range(0, n, size))
        clocks = [(rng.random() * 0.5, w) for w in range(parallelism)]  # (time free, worker)
        heapq.heapify(clocks)
        ends: list[tuple[float, int]] = []  # (when its check ends, node position)
        while chunks:
            start, worker = heapq.heappop(clocks)
            t = start
            for i in chunks.popleft():
                t += 0.5 + rng.random()
                ends.append((t, i))
            heapq.heappush(clocks, (t, worker))
        return [i for _, i in sorted(ends)]

    def candidates(self, gpus: int) -> list[str]:
        """The next cycle's candidates for a pod asking ``gpus``."""
        order = self._orders[self._turn % len(self._orders)]
        self._turn += 1
        names, free = self.names, self.free
        return [name for name in map(names.__getitem__, order) if free[name] >= gpus]

    def assume(self, node: str, gpus: int) -> None:
        """The scheduler assumed a pod of ``gpus`` on ``node`` (its bind is in flight)."""
        self.free[node] -= gpus

    def forget(self, node: str, gpus: int) -> None:
        """The bind failed: the scheduler forgets the assumed pod."""
        self.free[node] += gpus


# --------------------------------------------------------------------------- server process


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


_R = TypeVar("_R")


def _timed(
    method: Callable[..., Awaitable[_R]], spent: contextvars.ContextVar[list[float] | None]
) -> Callable[..., Awaitable[_R]]:
    """``method`` adding its seconds to the calling request's ``spent`` counter. MemoryStore's
    methods never suspend, so the time between call and return is theirs, on the CPU: read
    from ``perf_counter`` (user space, ≈ 60 ns) rather than ``thread_time`` (a system call,
    ≈ 3 µs in the server, most of it inside the handler being measured; a bind makes two
    store calls)."""

    async def timed(*args: Any, **kwargs: Any) -> _R:
        counter = spent.get()
        start = time.perf_counter()
        try:
            return await method(*args, **kwargs)
        finally:
            if counter is not None:
                counter[0] += time.perf_counter() - start

    return timed


def server_main(conn: Connection, args: argparse.Namespace) -> None:
    os.sched_setaffinity(0, {args.server_cpu})
    # Logged as extender.main logs (JSON at --log-level, one "bound pod" line per bind at INFO),
    # to --server-log; binds racing for a node are expected (warnings there).
    flexlease.logging.setup(args.log_level, "json", stream=open(args.server_log, "a", encoding="utf-8"))  # noqa: SIM115
    run = asyncio.run if args.asyncio_loop else uvloop.run  # as extender.main: uvloop
    if not args.profile:
        run(_server(conn, args))
        return
    profile = cProfile.Profile()
    profile.runcall(run, _server(conn, args, profile=profile))
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)


async def _server(
    conn: Connection, args: argparse.Namespace, *, profile: cProfile.Profile | None = None
) -> None:
    store: MemoryStore | KubeStore
    if args.store == "kube":
        api_settings = StoreSettings(kind="kube", request_timeout_seconds=30.0, watch_timeout_seconds=300.0)
        store = KubeStore.for_host(args.apiserver_url, api_settings)
    else:
        store = MemoryStore(history_revisions=1_000_000)
    t0 = time.perf_counter()
    pending, free = await load_cluster(
        store, nodes=args.nodes, running=args.pods, pending=args.cycles + args.warmup, seed=args.seed
    )
    load_s = time.perf_counter() - t0
    settings = Settings(
        store=StoreSettings(kind=args.store),
        extender=ExtenderSettings(port=0, reservation_ttl_seconds=300),
        lease=LeaseSettings(cluster_min_interval_seconds=args.cluster_interval),
    )
    contexts = (
        []
        if args.no_gc_policy
        else [gcpolicy.cleanup_ctx(gen0_threshold=args.gen0, gen1_threshold=args.gen1)]
    )
    if args.lease_controller:  # as extender.main: the controller shares the process (no election)
        contexts.insert(0, lease_controller.cleanup_ctx(settings, store, registry=CollectorRegistry()))
    app = extserver.create_app(settings, store, extra_contexts=contexts)
    cache = app[extserver.FILTER_CACHE]
    recorded: dict[str, list[float]] = {v: [] for v in (*VERBS, "empty", *(p for p, _ in FILTER_PARTS))}
    filter_parts: list[str] = []  # each filter's kind, in the order of recorded["filter"]
    on_cpu: dict[str, list[float]] = {v: [] for v in VERBS}  # the handlers' CPU seconds
    in_store: dict[str, list[float]] = {v: [] for v in VERBS}  # … of which the store's calls
    store_cpu: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar("store_cpu", default=None)
    for method in ("get", "list", "create", "patch", "bind", "delete", "evict"):
        if isinstance(store, KubeStore):
            break  # its calls wait for the API server: the time between call and return is not theirs
        # MemoryStore's methods never suspend: the CPU between call and return is theirs
        setattr(store, method, _timed(getattr(store, method), store_cpu))
    serving_cpu = [0.0, 0.0]  # process CPU seconds when the cycles start and when they end

    @web.middleware
    async def record(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        start, cpu = time.perf_counter(), time.thread_time()
        spent = [0.0]
        store_cpu.set(spent)
        full, derived, refiltered, arrays = cache.full, cache.derived, cache.refiltered, cache.over_arrays
        verb = request.path.lstrip("/")
        if verb == "empty" and not serving_cpu[1]:
            serving_cpu[1] = time.process_time()  # the cycles are done: the floor comes last
        try:
            return await handler(request)
        finally:
            took = time.perf_counter() - start
            if verb in recorded:
                recorded[verb].append(took)
            if verb in on_cpu:
                on_cpu[verb].append(time.thread_time() - cpu)
                in_store[verb].append(spent[0])
            if verb == "filter":  # full filter (a new class of pods) or an incremental one
                filter_parts.append(
                    "filter_full"
                    if cache.full > full
                    else "filter_refiltered"
                    if cache.refiltered > refiltered
                    else "filter_arrays"
                    if cache.over_arrays > arrays
                    else "filter_derived"
                    if cache.derived > derived
                    else "filter_incr"
                )

    app.middlewares.insert(0, record)

    async def empty(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({})

    floor = web.Application(client_max_size=64 << 20, middlewares=[record])
    floor.router.add_post("/empty", empty)
    # access log as extender.main serves the verbs (off unless extender.access_log)
    access_log = aiohttp.log.access_logger if args.access_log else None
    runners = [web.AppRunner(app, access_log=access_log), web.AppRunner(floor, access_log=None)]
    urls = []
    for runner in runners:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        urls.append(f"http://{host}:{port}")
    inv = app[extserver.INVENTORY]
    # ready, and every watch (the extender's, the lease controller's) applied the last write of
    # its kind (polling: nothing to wait on). The API server's lists, made after the load, hold
    # the whole cluster: ready is enough there (the lease controller's mirrors not waited for).
    while not inv.ready or (isinstance(store, MemoryStore) and not store.idle):  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    while not args.no_gc_policy and not gc.get_freeze_count():  # noqa: ASYNC110
        await asyncio.sleep(0.05)  # the extender's policy froze the listed inventory
    gc_pauses: list[tuple[int, float, float]] = []  # generation, wall seconds, CPU seconds
    gc_started = [0.0, 0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_started[:] = time.perf_counter(), time.thread_time()
        else:
            wall, cpu = time.perf_counter() - gc_started[0], time.thread_time() - gc_started[1]
            gc_pauses.append((info["generation"], wall, cpu))

    gc.callbacks.append(on_gc)
    if profile is not None:  # profile the serving only
        profile.disable()
        profile.clear()
        profile.enable()
    serving_cpu[0] = time.process_time()
    conn.send({"urls": urls, "pending": pending, "free": free, "load_s": load_s, "summary": inv.summary()})
    await asyncio.to_thread(conn.recv)  # the client is done
    # the filters of the measured cycles, by kind
    for part, took in zip(filter_parts[args.warmup :], recorded["filter"][args.warmup :], strict=True):
        recorded[part].append(took)
    for v in VERBS:
        recorded[v] = recorded[v][args.warmup :]
        on_cpu[v] = on_cpu[v][args.warmup :]
        in_store[v] = in_store[v][args.warmup :]
    reg = app[extserver.METRICS].registry
    hist = {
        v: (
            reg.get_sample_value(f"{REQUEST_SECONDS}_sum", {"verb": v, "status": "200"}) or 0.0,
            reg.get_sample_value(f"{REQUEST_SECONDS}_count", {"verb": v, "status": "200"}) or 0.0,
        )
        for v in VERBS
    }
    gc.callbacks.remove(on_gc)
    conn.send(
        {
            "recorded": recorded,
            "on_cpu": on_cpu,
            "in_store": in_store,
            "process_cpu": serving_cpu[1] - serving_cpu[0],
            "hist": hist,
            "summary": inv.summary(),
            "gc": gc_pauses,
            "frozen": gc.get_freeze_count(),
        }
    )
    for runner in runners:
        await runner.cleanup()
    await store.close()


def apiserver_main(conn: Connection, cpu: int) -> None:
    """The API server stand-in's process (``--store kube``): serve until terminated."""
    from standins.apiserver import FakeApiServer  # noqa: PLC0415 - only this process needs it

    os.sched_setaffinity(0, {cpu})
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

    async def serve() -> None:
        # bookmarks about once a minute, as kube-apiserver's watch cache sends them
        async with FakeApiServer(bookmark_interval=60.0) as api:
            conn.send(api.url)
            await asyncio.Event().wait()  # until terminated

    uvloop.run(serve())


# --------------------------------------------------------------------------- client


def go_json(value: Any) -> bytes:
    """``value`` as Go's encoding/json writes it (kube-scheduler's extender client): no
    spaces; ``<``, ``>``, ``&``, U+2028 and U+2029 escaped; other characters as they are."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in _GO_ESCAPES:
        text = text.replace(char, escaped)
    return text.encode()


_GO_ESCAPES: Final = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


async def client(
    args: argparse.Namespace, urls: list[str], pending: list[JsonObj], names: list[str], free: dict[str, int]
) -> dict[str, Any]:
    url, floor_url = urls
    times: dict[str, list[float]] = {v: [] for v in (*VERBS, "empty", "cycle")}
    outcomes = {"bound": 0, "unschedulable": 0, "bind_error": 0}
    binds: set[asyncio.Task[None]] = set()
    sizes: dict[str, list[int]] = {v: [] for v in (*VERBS, "empty")}
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.bind_connections)) as bind_session,
    ):

        async def call(
            u: str, body: Any, verb: str, record: bool, on: aiohttp.ClientSession | None = None
        ) -> Any:
            data = body if isinstance(body, bytes) else go_json(body)
            t = time.perf_counter()
            async with (on or session).post(
                u, data=data, headers={"Content-Type": "application/json"}
            ) as resp:
                raw = await resp.read()
                assert resp.status == 200, raw[:300]
            if record:
                times[verb].append(time.perf_counter() - t)
                sizes[verb].append(len(raw))
            if verb == "filter":
                # The scheduler's cycle needs only NodeNames: decode just that member (the
                # reasons are for its FailedScheduling event, which Go decodes in no time).
                start = raw.index(b'"NodeNames":') + len(b'"NodeNames":')
                return {"NodeNames": _DECODER.raw_decode(raw[start:].decode())[0]}
            return json.loads(raw)

        t_start = 0.0
        names_json = go_json(names)
        feasible = (
            FeasibleNodes(names, free, random.Random(args.seed)) if args.candidates == "scheduler" else None
        )
        candidate_sizes: list[int] = []
        for n, p in enumerate(pending):
            record = n >= args.warmup
            if n == args.warmup:
                t_start = time.perf_counter()
            t_cycle = time.perf_counter()
            # encoded as a Go client would: once per request, the node list spliced in
            pod_json = go_json(p)
            gpus = int(p["spec"]["containers"][0]["resources"]["limits"][keys.DEFAULT_GPU_RESOURCE])
            if feasible is not None:
                candidates = feasible.candidates(gpus)
                if not candidates:  # kube-scheduler's own filter left no node: the extender is not called
                    outcomes["unschedulable"] += 1
                    continue
                listed = go_json(candidates)
                if record:
                    candidate_sizes.append(len(candidates))
            else:
                listed = names_json
            body = b'{"Pod":' + pod_json + b',"Nodes":null,"NodeNames":' + listed + b"}"
            res = await call(f"{url}/filter", body, "filter", record)
            passed = res["NodeNames"]
            if not passed:
                outcomes["unschedulable"] += 1
                continue
            body = b'{"Pod":' + pod_json + b',"Nodes":null,"NodeNames":' + go_json(passed) + b"}"
            scores = await call(f"{url}/prioritize", body, "prioritize", record)
            best = max(scores, key=lambda h: h["Score"])["Host"]
            meta = p["metadata"]
            bind = {
                "PodName": meta["name"],
                "PodNamespace": meta["namespace"],
                "PodUID": meta["uid"],
                "Node": best,
            }

            if feasible is not None:
                feasible.assume(best, gpus)

            async def bind_async(body: dict[str, str], record: bool, gpus: int = gpus) -> None:
                res = await call(f"{url}/bind", body, "bind", record, bind_session)
                outcomes["bound" if not res["Error"] else "bind_error"] += 1
                if res["Error"] and feasible is not None:
                    feasible.forget(body["Node"], gpus)

            if args.sync_bind:
                await bind_async(bind, record)
            else:  # kube-scheduler binds in a goroutine while the next cycle runs
                task = asyncio.create_task(bind_async(bind, record), name=f"bind-{n}")
                binds.add(task)
                task.add_done_callback(binds.discard)
            if record:
                times["cycle"].append(time.perf_counter() - t_cycle)
        await asyncio.gather(*binds)
        elapsed = time.perf_counter() - t_start
        empty_body = b'{"Pod":' + go_json(pending[0]) + b',"Nodes":null,"NodeNames":' + names_json + b"}"
        for _ in range(args.cycles):
            await call(f"{floor_url}/empty", empty_body, "empty", True)
    return {
        "times": times,
        "elapsed": elapsed,
        "outcomes": outcomes,
        "sizes": sizes,
        "candidates": candidate_sizes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--pods", type=int, default=0, help="running pods holding GPUs (default 4 per node)")
    parser.add_argument("--cycles", type=int, default=1000, help="scheduling cycles measured")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=0)
    parser.add_argument("--sync-bind", action="store_true", help="await each bind before the next cycle")
    parser.add_argument("--bind-connections", type=int, default=4)
    parser.add_argument(
        "--gc-freeze", action="store_true", help="gc.freeze() the client's pending pods after loading"
    )
    parser.add_argument(
        "--no-gc-policy",
        action="store_true",
        help="serve without the extender's GC policy (extender.gcpolicy: freeze after listing)",
    )
    parser.add_argument(
        "--asyncio-loop", action="store_true", help="serve on asyncio's own event loop, not uvloop"
    )
    parser.add_argument(
        "--lease-controller",
        action="store_true",
        help="also run the lease controller in the server process, as extender.main does "
        "(its Pod, GPUNode and GPULease mirrors; no leader election)",
    )
    parser.add_argument(
        "--cluster-interval",
        type=float,
        default=1.0,
        help="with --lease-controller: lease.cluster_min_interval_seconds (1, as "
        "manifests/base/extender/config.yaml; 0: a cluster reconcile per bind)",
    )
    parser.add_argument(
        "--gen0", type=int, default=gcpolicy.GEN0_THRESHOLD, help="the GC policy's generation-0 threshold"
    )
    parser.add_argument(
        "--gen1", type=int, default=gcpolicy.GEN1_THRESHOLD, help="the GC policy's generation-1 threshold"
    )
    parser.add_argument(
        "--scale",
        type=str,
        default="",
        help="comma-separated node counts (e.g. 1250,2500,5000): one run each, 4 running pods per "
        "node, then a table of the figures against the node count",
    )
    parser.add_argument("--profile", type=int, default=0, help="print the server's N costliest functions")
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
        default="INFO",
        help="the server's log level (extender.main's default, INFO: a JSON line per bind; the rounds "
        "before the twelfth ran with the extender's loggers at ERROR)",
    )
    parser.add_argument(
        "--access-log",
        action="store_true",
        help="log every request as extender.access_log: true does (aiohttp.access, INFO)",
    )
    parser.add_argument(
        "--server-log", default=os.devnull, help="where the server's log lines go (JSON, appended)"
    )
    parser.add_argument(
        "--store",
        choices=("memory", "kube"),
        default="memory",
        help="the extender's store: in-process (MemoryStore, the default) or KubeStore over HTTP to "
        "the API server stand-in in its own process (standins.apiserver)",
    )
    parser.add_argument(
        "--apiserver-cpu", type=int, default=1, help="with --store kube: the API server stand-in's CPU"
    )
    parser.add_argument(
        "--candidates",
        choices=("scheduler", "all"),
        default="scheduler",
        help="the filter's NodeNames: kube-scheduler's feasible nodes in its parallel filter's order "
        "(FeasibleNodes), or every node in one order (the rounds before the sixth)",
    )
    args = parser.parse_args()
    try:  # the server opens it after the fork: refuse a path it cannot open here, before
        with open(args.server_log, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        parser.error(f"--server-log: {exc}")
    if not args.scale:
        args.pods = args.pods or 4 * args.nodes
        report(args, *run_once(args))
        return
    rows = []
    for nodes in (int(n) for n in args.scale.split(",")):
        run_args = argparse.Namespace(**{**vars(args), "nodes": nodes, "pods": 4 * nodes})
        hello, result, server = run_once(run_args)
        report(run_args, hello, result, server)
        print()
        rows.append((nodes, result, server))
    scaling_table(rows)


def run_once(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """One server process and one client run: (server hello, client result, server figures)."""
    ctx = multiprocessing.get_context("fork")
    apiserver = None
    try:
        if args.store == "kube":
            api_parent, api_child = ctx.Pipe()
            apiserver = ctx.Process(
                target=apiserver_main,
                args=(api_child, args.apiserver_cpu),
                name="extender-bench-apiserver",
                daemon=True,
            )
            apiserver.start()
            api_child.close()  # the stand-in's end: a stand-in that dies is an EOFError here
            args = argparse.Namespace(**{**vars(args), "apiserver_url": api_parent.recv()})
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=server_main, args=(child, args), name="extender-bench-server")
        proc.start()
        child.close()  # the server's end: a server that dies is an EOFError here, not a hang
        affinity = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {args.client_cpu})
        hello = parent.recv()
        names = [f"gpu-{i:05d}" for i in range(args.nodes)]
        if args.gc_freeze:  # the client's own long-lived data (the pending pods) out of the collector's way
            gc.collect()
            gc.freeze()
        result = asyncio.run(client(args, hello["urls"], hello["pending"], names, hello["free"]))
        parent.send("done")
        server = parent.recv()
        proc.join()
        os.sched_setaffinity(0, affinity)
        if args.gc_freeze:
            gc.unfreeze()
    finally:
        if apiserver is not None:
            apiserver.terminate()  # a daemon: stopped on every way out
            apiserver.join()
    return hello, result, server


def _ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1000:.2f}"


def _per_cycle(result: dict[str, Any], server: dict[str, Any], part: str = "recorded") -> float:
    """Server seconds per measured cycle (filter + prioritize + bind handler times): wall
    clock (``recorded``) or on CPU (``on_cpu``)."""
    return sum(sum(server[part][v]) for v in VERBS) / len(result["times"]["cycle"])


def report(
    args: argparse.Namespace, hello: dict[str, Any], result: dict[str, Any], server: dict[str, Any]
) -> None:
    """Print the figures, the table in Markdown (for docs/results/benchmarks.md)."""
    t, rec = result["times"], server["recorded"]
    cpu = platform.processor() or platform.platform()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs ({cpu}), python {platform.python_version()}")
    print(f"interpreter: {interpreter.describe()}")
    print(f"server on CPU {args.server_cpu}, client on CPU {args.client_cpu}; load average {os.getloadavg()}")
    access = "on" if args.access_log else "off"
    print(f"server log: {args.log_level} as JSON to {args.server_log}; access log {access}")
    print(
        f"cluster: {args.nodes} nodes x 8 GPUs, {args.pods} running pods, loaded in {hello['load_s']:.1f} s"
    )
    print(f"inventory: {hello['summary']}")
    print(f"cycles: {len(t['cycle'])} measured after {args.warmup} warm-up; outcomes {result['outcomes']}")
    if result["candidates"]:
        sizes_c = result["candidates"]
        print(
            f"candidates: kube-scheduler's feasible nodes in its filter's order, "
            f"{statistics.fmean(sizes_c):.0f} a cycle on average ({min(sizes_c)}-{max(sizes_c)})"
        )
    else:
        print("candidates: every node, in one order")
    sizes = result["sizes"]
    print(
        "mean reply: "
        + ", ".join(f"{v} {statistics.fmean(sizes[v]) / 1024:.1f} KiB" for v in VERBS if sizes[v])
    )
    print()
    floor_c, floor_s = percentile(t["empty"], 0.5), percentile(rec["empty"], 0.5)
    print(
        "| verb | client p50 ms | client p99 ms | server p50 ms | server p99 ms | server mean ms (hist.) "
        "| client p50 / floor | server p50 / floor |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for verb in VERBS:
        total, count = server["hist"][verb]
        mean = total / max(1.0, count) * 1000
        row = [
            _ms(t[verb], 0.5),
            _ms(t[verb], 0.99),
            _ms(rec[verb], 0.5),
            _ms(rec[verb], 0.99),
            f"{mean:.2f}",
            f"{percentile(t[verb], 0.5) / floor_c:.1f}x",
            f"{percentile(rec[verb], 0.5) / floor_s:.1f}x",
        ]
        print(f"| {verb} | " + " | ".join(row) + " |")
    for part, label in FILTER_PARTS:
        if rec[part]:
            row = [
                "",
                "",
                _ms(rec[part], 0.5),
                _ms(rec[part], 0.99),
                f"{statistics.fmean(rec[part]) * 1000:.2f}",
            ]
            print(
                f"| {label} ({len(rec[part])}) | "
                + " | ".join(row)
                + f" | | {percentile(rec[part], 0.5) / floor_s:.1f}x |"
            )
    floor = " | ".join(_ms(xs, q) for xs in (t["empty"], rec["empty"]) for q in (0.5, 0.99))
    print(f"| empty handler (HTTP floor, same body as filter) | {floor} | | 1.0x | 1.0x |")
    print(f"| whole cycle | {_ms(t['cycle'], 0.5)} | {_ms(t['cycle'], 0.99)} | | | | | |")
    print()
    binds = "awaited" if args.sync_bind else "asynchronous, as kube-scheduler's binding cycle"
    print(
        f"cycles per second: {len(t['cycle']) / result['elapsed']:.0f} (filter -> prioritize, bind {binds})"
    )
    per_cycle = _per_cycle(result, server)
    print(
        f"server time per cycle: {per_cycle * 1000:.2f} ms = {1 / per_cycle:.0f} cycles/s of one core "
        f"= {per_cycle / floor_s:.1f}x the empty handler's server time (handlers, wall clock)"
    )
    cpu = server["on_cpu"]
    cpu_cycle = _per_cycle(result, server, "on_cpu")
    whole = server["process_cpu"] / (len(t["cycle"]) + args.warmup)
    print(
        f"server CPU per cycle: handlers {cpu_cycle * 1000:.2f} ms "
        f"({1 / cpu_cycle:.0f} cycles/s of one core; p50/p99 ms "
        + ", ".join(f"{v} {_ms(cpu[v], 0.5)}/{_ms(cpu[v], 0.99)}" for v in VERBS)
        + f"); whole process {whole * 1000:.2f} ms "
        f"({1 / whole:.0f} cycles/s of one core: HTTP, watches, binds)"
    )
    if args.store == "kube":
        print(
            f"store: KubeStore over HTTP to the API server stand-in (its own process, CPU "
            f"{args.apiserver_cpu}); the handlers' CPU includes the API client's work and what the "
            f"loop ran while they waited for the API server"
        )
    else:
        store_cycle = _per_cycle(result, server, "in_store")
        own = cpu_cycle - store_cycle
        print(
            f"… of which the in-process store (the API server's stand-in: reads, merge patches, "
            f"Bindings): {store_cycle * 1000:.2f} ms; the extender's own handler code: "
            f"{own * 1000:.2f} ms ({1 / own:.0f} cycles/s of one core)"
        )
    print(f"filter p50 / HTTP floor p50: {percentile(t['filter'], 0.5) / floor_c:.2f}x")
    pauses = server["gc"]
    by_gen = [[p for g, p, _ in pauses if g == gen] for gen in range(3)]
    longest = max(pauses, key=lambda p: p[1], default=(0, 0.0, 0.0))
    print(
        "server GC: "
        + ", ".join(
            f"gen {g} {len(ps)} x, longest {max(ps, default=0) * 1000:.1f} ms" for g, ps in enumerate(by_gen)
        )
        + f"; longest pause {longest[1] * 1000:.1f} ms (of which on CPU {longest[2] * 1000:.1f} ms)"
        + f"; {server['frozen']} objects frozen"
    )
    gc_cpu = sum(c for _, _, c in pauses) / (len(t["cycle"]) + args.warmup)
    print(f"server GC CPU per cycle (every generation, warm-up included): {gc_cpu * 1000:.3f} ms")
    full, derived, incremental = len(rec["filter_full"]), len(rec["filter_derived"]), len(rec["filter_incr"])
    print(
        f"filter cache (measured cycles): {full} full / {derived} derived / {incremental} incremental"
        f" / {len(rec['filter_arrays'])} re-checked over the arrays"
        f" / {len(rec['filter_refiltered'])} known class filtered afresh"
    )


def scaling_table(rows: list[tuple[int, dict[str, Any], dict[str, Any]]]) -> None:
    """Markdown table of the per-run figures against the node count (``--scale``)."""
    print(
        "| nodes (GPUs) | server ms / cycle (wall) | server CPU ms / cycle | cycles/s of one core (CPU) "
        "| server p99 filter / prioritize / bind ms | incremental filter p50 ms | full filter p50 ms "
        "| filter reply KiB | longest GC pause ms |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for nodes, result, server in rows:
        rec = server["recorded"]
        per_cycle = _per_cycle(result, server)
        cpu_cycle = _per_cycle(result, server, "on_cpu")
        p99 = " / ".join(_ms(rec[v], 0.99) for v in VERBS)
        longest = max((p for _, p, _ in server["gc"]), default=0) * 1000
        print(
            f"| {nodes:,} ({8 * nodes:,}) | {per_cycle * 1000:.2f} | {cpu_cycle * 1000:.2f} "
            f"| {1 / cpu_cycle:.0f} | {p99} "
            f"| {_ms(rec['filter_incr'], 0.5)} | {_ms(rec['filter_full'], 0.5)} "
            f"| {statistics.fmean(result['sizes']['filter']) / 1024:.1f} | {longest:.1f} |"
        )


if __name__ == "__main__":
    main()
