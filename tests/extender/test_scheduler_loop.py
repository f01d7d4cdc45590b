"""The extender under a kube-scheduler stand-in that runs the real scheduling loop's steps.

kube-scheduler cannot run here, so :class:`KubeScheduler` plays the parts of it an
extender meets, in the order ``pkg/scheduler/schedule_one.go`` runs them, over real HTTP
with real wire bodies:

- the scheduler cache holds bound *and assumed* pods; ``NodeResourcesFit`` checks
  ``nvidia.com/gpu`` against the node's allocatable count, unless the extender's managed
  resource says ``ignoredByScheduler: true`` (then the scheduler ignores GPUs entirely);
- the extender's ``/filter`` and ``/prioritize`` see only the nodes the in-tree filters
  passed (``nodeCacheCapable``: ``NodeNames``); the best score wins, the pod is assumed;
- the binding cycle runs beside the next scheduling cycle: here each bind reaches
  ``/bind`` only after the next pod's filter and prioritize (deterministically), and a bind
  ``Error`` forgets the assumed pod and sends it back to the queue;
- with no feasible node, ``DefaultPreemption`` dry-runs each node that failed as
  Unschedulable: remove every lower-priority pod, check the pod fits by the in-tree filters
  only (extenders are not asked in the dry run), reprieve victims highest priority first
  while it still fits; a node left with no victim is no candidate ("expected at least one
  victim pod"); then ``/preempt`` narrows the candidates, the first kept node's victims are
  evicted, and the pod is retried.

Findings 1 and 2 of the issue are these two paths: with ``ignoredByScheduler: true`` the
dry run finds no victim and ``/preempt`` is never called, and consecutive pods are packed
onto one node whose binds then collide; with ``false`` neither happens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient

from extender import server
from flexlease.api import keys
from flexlease.store.base import JsonObj, Kind
from flexlease.store.graceful import confirm_pod_deletion
from flexlease.store.memory import MemoryStore
from tests.extender import payloads
from tests.extender.conftest import add_node, add_pod, eventually

Client = TestClient[web.Request, web.Application]


@dataclass
class Placed:
    node: str
    gpus: int
    priority: int
    uid: str


@dataclass
class KubeScheduler:
    """See the module docstring. ``allocatable``: node → ``nvidia.com/gpu`` it advertises."""

    client: Client
    store: MemoryStore
    allocatable: dict[str, int]
    ignored_by_scheduler: bool
    cache: dict[str, Placed] = field(default_factory=dict)
    """Scheduler cache: pod key → where it runs or is assumed."""
    calls: dict[str, int] = field(default_factory=dict)
    bind_errors: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    evicted_uids: list[str] = field(default_factory=list)
    in_flight: list[tuple[JsonObj, str]] = field(default_factory=list)

    async def call(self, verb: str, body: Any) -> Any:
        self.calls[verb] = self.calls.get(verb, 0) + 1
        resp = await self.client.post(f"/{verb}", json=body)
        assert resp.status == 200, await resp.text()
        return await resp.json()

    def fits_in_tree(self, need: int, node: str, *, without: frozenset[str] | set[str] = frozenset()) -> bool:
        if self.ignored_by_scheduler:
            return True
        used = sum(p.gpus for k, p in self.cache.items() if p.node == node and k not in without)
        return used + need <= self.allocatable[node]

    async def schedule_one(self, pod: JsonObj) -> str:
        """One scheduling cycle; returns ``assumed``, ``preempted`` or ``unschedulable``."""
        need = int(pod["spec"]["containers"][0]["resources"]["limits"][keys.DEFAULT_GPU_RESOURCE])
        feasible = [n for n in self.allocatable if self.fits_in_tree(need, n)]
        passed: list[str] = []
        if feasible:
            result = await self.call("filter", payloads.extender_args(pod, feasible))
            passed = result["NodeNames"]
            resolvable = [n for n in self.allocatable if n not in feasible or n in result["FailedNodes"]]
        else:
            resolvable = list(self.allocatable)
        if not passed:
            await self.flush_binds()
            return await self.preempt(pod, need, resolvable)
        scores = await self.call("prioritize", payloads.extender_args(pod, passed))
        best = max(scores, key=lambda s: s["Score"])["Host"]  # first of the best, as a stable pick
        meta = pod["metadata"]
        self.cache[f"{meta['namespace']}/{meta['name']}"] = Placed(
            best, need, pod["spec"]["priority"], meta["uid"]
        )
        await self.flush_binds()  # the previous pod's bind reaches the extender only now
        self.in_flight.append((pod, best))
        return "assumed"

    async def flush_binds(self) -> None:
        binds, self.in_flight = self.in_flight, []
        for pod, node in binds:
            reply = await self.call("bind", payloads.binding_args(pod, node))
            if reply["Error"]:
                self.bind_errors.append(reply["Error"])
                meta = pod["metadata"]
                del self.cache[f"{meta['namespace']}/{meta['name']}"]  # forget the assumed pod

    async def preempt(self, pod: JsonObj, need: int, candidates: list[str]) -> str:
        """DefaultPreemption's dry run on each candidate, then ``/preempt``, then eviction."""
        prio = pod["spec"]["priority"]
        proposal: dict[str, list[str]] = {}
        for node in candidates:
            lower = sorted(
                (k for k, p in self.cache.items() if p.node == node and p.priority < prio),
                key=lambda k: -self.cache[k].priority,
            )
            removed = set(lower)
            if not self.fits_in_tree(need, node, without=removed):
                continue
            for k in lower:  # reprieve, highest priority first
                removed.discard(k)
                if not self.fits_in_tree(need, node, without=removed):
                    removed.add(k)
            if removed:  # else: "expected at least one victim pod on node"
                proposal[node] = [self.cache[k].uid for k in sorted(removed)]
        if not proposal:
            return "unschedulable"
        kept = (await self.call("preempt", payloads.preemption_args(pod, proposal)))["NodeNameToMetaVictims"]
        for node in candidates:
            if node in kept:
                by_uid = {p.uid: k for k, p in self.cache.items()}
                for victim in kept[node]["Pods"]:
                    key = by_uid[victim["UID"]]
                    namespace, name = key.split("/")
                    await self.store.delete(Kind.POD, name, namespace=namespace)
                    # the victim's kubelet stops it and confirms: only then are its GPUs free
                    await confirm_pod_deletion(self.store, namespace, name)
                    del self.cache[key]
                    self.evicted.append(key)
                    self.evicted_uids.append(victim["UID"])
                return "preempted"
        return "unschedulable"

    async def run(self, pods: list[JsonObj], *, rounds: int = 6) -> list[JsonObj]:
        """Schedule ``pods`` in order; those not placed (unschedulable, preempted for, or
        whose bind failed) go back to the queue for the next round (the back-off queue,
        without the waiting). Returns the pods still not placed after ``rounds``."""
        queue = list(pods)
        for _ in range(rounds):
            for pod in queue:
                await self.schedule_one(pod)
            await self.flush_binds()
            queue = [p for p in queue if self._key(p) not in self.cache]
            if not queue:
                break
            await self._settle()
        return queue

    @staticmethod
    def _key(pod: JsonObj) -> str:
        return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"

    async def _settle(self) -> None:
        """Let the extender's watch catch up with binds and evictions before the next round,
        as the informers of a real scheduler and extender do between retries."""
        inv = self.client.app[server.INVENTORY]
        placed = {p.uid for p in self.cache.values()}
        gone = set(self.evicted_uids)
        await eventually(
            lambda: (
                all(inv.holding(u) is not None for u in placed) and all(inv.holding(u) is None for u in gone)
            )
        )


async def gpu_cluster(store: MemoryStore, nodes: int, gpus: int) -> dict[str, int]:
    names = [f"gpu-node-{i}" for i in range(nodes)]
    for n in names:
        await add_node(store, payloads.gpunode(n, gpus=gpus))
    return dict.fromkeys(names, gpus)


async def pending(store: MemoryStore, name: str, gpus: int, **kw: Any) -> JsonObj:
    return await add_pod(store, payloads.pod(name, gpus=gpus, **kw))


async def assert_no_gpu_held_twice(store: MemoryStore) -> dict[str, int]:
    """Every bound pod's devices are distinct; returns GPUs bound per node."""
    seen: set[tuple[str, int]] = set()
    per_node: dict[str, int] = {}
    for pod in (await store.list(Kind.POD)).items:
        raw = (pod["metadata"].get("annotations") or {}).get(keys.ANN_ASSIGNED_GPUS)
        if not pod["spec"].get("nodeName") or raw is None:
            continue
        node, _, idx = raw.partition(":")
        assert node == pod["spec"]["nodeName"]
        for i in idx.split(","):
            assert (node, int(i)) not in seen, f"GPU {node}/{i} held twice"
            seen.add((node, int(i)))
        per_node[node] = per_node.get(node, 0) + len(idx.split(","))
    return per_node


async def test_counting_gpus_in_the_scheduler_avoids_bind_collisions(start: Any, store: MemoryStore) -> None:
    """Finding 2: with ``ignoredByScheduler: false`` the scheduler counts the assumed pod of
    the previous cycle, so consecutive pods never land on a node their binds overfill."""
    allocatable = await gpu_cluster(store, nodes=4, gpus=8)
    pods = [await pending(store, f"w-{i:02d}", 2) for i in range(16)]  # exactly fills 4 x 8
    client = await start()
    scheduler = KubeScheduler(client, store, allocatable, ignored_by_scheduler=False)
    assert await scheduler.run(pods) == []
    assert scheduler.bind_errors == []
    assert await assert_no_gpu_held_twice(store) == dict.fromkeys(allocatable, 8)


async def test_ignoring_gpus_in_the_scheduler_makes_binds_collide(start: Any, store: MemoryStore) -> None:
    """Finding 2, the shipped configuration before: blind to in-flight pods, the scheduler
    packs consecutive pods onto one node and the extender must refuse binds (each a retry
    with back-off on a real cluster). The extender still never hands out a GPU twice."""
    allocatable = await gpu_cluster(store, nodes=4, gpus=8)
    pods = [await pending(store, f"w-{i:02d}", 2) for i in range(16)]
    client = await start()
    scheduler = KubeScheduler(client, store, allocatable, ignored_by_scheduler=True)
    await scheduler.run(pods, rounds=10)
    assert scheduler.bind_errors, "expected collisions"
    assert all(e.startswith("no longer fits on gpu-node-") for e in scheduler.bind_errors)
    await assert_no_gpu_held_twice(store)


async def full_cluster(store: MemoryStore) -> tuple[dict[str, int], list[JsonObj]]:
    """4 nodes x 2 GPUs, each held by one low-priority pod (spec.priority 0)."""
    allocatable = await gpu_cluster(store, nodes=4, gpus=2)
    lp = [
        await add_pod(
            store,
            payloads.pod(
                f"lp-{n}",
                gpus=2,
                priority="low",
                node_name=n,
                phase="Running",
                annotations=payloads.assigned(n, 0, 1),
            ),
        )
        for n in allocatable
    ]
    return allocatable, lp


async def test_preemption_round_trip_frees_gpus_and_binds(start: Any, store: MemoryStore) -> None:
    """Finding 1: candidates from the scheduler's dry run → ``/preempt`` narrows them to
    low-priority pods whose eviction frees usable GPUs → eviction → bind."""
    allocatable, lp = await full_cluster(store)
    client = await start()
    scheduler = KubeScheduler(client, store, allocatable, ignored_by_scheduler=False)
    for pod in lp:
        meta = pod["metadata"]
        scheduler.cache[f"ml/{meta['name']}"] = Placed(pod["spec"]["nodeName"], 2, 0, meta["uid"])
    hp = await pending(store, "hp", 2, priority="high", spec_priority=1000)
    assert await scheduler.run([hp]) == []
    assert scheduler.calls.get("preempt") == 1
    assert scheduler.evicted == ["ml/lp-gpu-node-0"]
    assert scheduler.bind_errors == []
    stored = await store.get(Kind.POD, "hp", namespace="ml")
    assert stored["spec"]["nodeName"] == "gpu-node-0"
    assert stored["metadata"]["annotations"][keys.ANN_ASSIGNED_GPUS] == "gpu-node-0:0,1"


async def test_with_gpus_ignored_preemption_never_reaches_the_extender(
    start: Any, store: MemoryStore
) -> None:
    """Finding 1, the shipped configuration before: the dry run ignores GPUs, needs no
    victim anywhere, ``/preempt`` is never called and the pod stays Pending for good."""
    allocatable, lp = await full_cluster(store)
    client = await start()
    scheduler = KubeScheduler(client, store, allocatable, ignored_by_scheduler=True)
    for pod in lp:
        meta = pod["metadata"]
        scheduler.cache[f"ml/{meta['name']}"] = Placed(pod["spec"]["nodeName"], 2, 0, meta["uid"])
    hp = await pending(store, "hp", 2, priority="high", spec_priority=1000)
    assert await scheduler.run([hp], rounds=3) == [hp]
    assert "preempt" not in scheduler.calls and scheduler.evicted == []
    assert scheduler.calls["filter"] == 3  # the extender said "preemption may help" each time
