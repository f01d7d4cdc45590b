"""Differential, stateful test of the extender over real HTTP (issue #37): hostile requests
interleaved with valid ones over a changing inventory must never leave the extender
answering differently from a fresh one.

A hypothesis ``RuleBasedStateMachine`` drives one long-lived extender (the real app served
by aiohttp's test server, over a :class:`MemoryStore`) with

* inventory changes written to the store: GPUNodes added, removed, tagged for an owner,
  a device turned unhealthy; pods pending or holding GPUs, added and deleted;
* valid requests to all four verbs, in kube-scheduler's compact form (the fast decoders) or
  spaced (the general path), plain or gzip/deflate-compressed;
* hostile requests: lone surrogates, NUL, control and bidirectional characters, 64 KiB
  names, 20,000 names, duplicates, names that differ from a node's only in case or Unicode
  normalisation, wrong JSON types, huge numbers, truncated and compressed bodies, corrupt
  compression — in node names, pod fields and the bind and preemption arguments; each must
  be answered below 500, and 400 naming the field where Kubernetes would refuse the value;
* a fault: one internal step of a request raises (after changing what it changes), the
  request is answered 500 — by construction, the only 5xx allowed;
* binds: the same bind is sent to the long-lived extender and to a fresh one over a copy of
  the store (same objects, uids and previous binds); the replies, the pods as bound and the
  two inventories (every node's holders, reservations included) must be equal.

After every step, filter, prioritize and preempt for the store's pending pods go to the
long-lived extender and to a fresh one built over the same store, and the replies must be
equal, as must their inventories.

Deterministic and bounded for CI (``derandomize``); ``FLEXLEASE_STATEFUL_EXAMPLES`` and
``FLEXLEASE_STATEFUL_STEPS`` raise the budget for a longer run.
"""

from __future__ import annotations

import asyncio
import copy
import gzip
import itertools
import json
import os
import re
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from prometheus_client import CollectorRegistry

from extender import body, equivalence, scheduling, server
from extender.state import Inventory
from flexlease.api import keys
from flexlease.api.pod import ParsedPods
from flexlease.clock import ManualClock
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore
from tests.extender import payloads
from tests.extender.conftest import add_node, add_pod, eventually, make_settings

Client = TestClient[web.Request, web.Application]
T = TypeVar("T")

EXAMPLES = int(os.environ.get("FLEXLEASE_STATEFUL_EXAMPLES", "30"))
STEPS = int(os.environ.get("FLEXLEASE_STATEFUL_STEPS", "25"))

NODES = ("n-a", "n-b", "n-c", "s-a")
"""GPUNode names the inventory rules use (``s-`` ones go to the standby pool)."""
NO_GPUNODE = "cpu-1"
"""A candidate node without a GPUNode."""
PODS = ("p-1", "p-2", "p-3", "hp-1", "lp-1", "lp-2")
OWNERS = ("ml/online", "ml/job-a", "ml/other")
MODELS = (payloads.H20, payloads.A100)
SETTINGS = make_settings(reservation_ttl_seconds=3600.0)
"""Reservations and unbound claims outlive any run: old and fresh extenders never differ by time."""


# --------------------------------------------------------------------------- request bodies


@dataclass(frozen=True)
class Request:
    """One HTTP request: ``verb``, ``data`` (the body as sent), extra ``headers``; ``expect``:
    the status it must get (None: any below 500), ``needle``: text its ``Error`` must hold."""

    verb: str
    data: bytes
    headers: tuple[tuple[str, str], ...] = ()
    expect: int | None = None
    needle: str = ""


def compact(obj: Any) -> bytes:
    """As Go's encoding/json writes it (no spaces; lone surrogates escaped as ``\\ud800``)."""
    try:
        return orjson.dumps(obj)
    except TypeError:  # a lone surrogate: only the json module writes it, escaped
        return json.dumps(obj, separators=(",", ":")).encode()


def spaced(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def candidate_args(pod: dict[str, Any], names: list[Any]) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


BAD_NAMES: tuple[tuple[Any, str], ...] = (
    ("\ud800", "not valid Unicode"),  # a lone surrogate (issue #37's reproduction)
    ("n-a\udc00", "not valid Unicode"),
    ("n-a\x00", "RFC 1123 subdomain"),  # NUL
    ("n-\x1bb", "RFC 1123 subdomain"),  # a control character
    ("n-\u202ea", "RFC 1123 subdomain"),  # right-to-left override
    ("N-A", "RFC 1123 subdomain"),  # differs from n-a only in case
    ("ｎ-a", "RFC 1123 subdomain"),  # fullwidth: NFKC makes it n-a
    ("n-a\u0301", "RFC 1123 subdomain"),  # a combining accent
    ("n" * 65536, "at most 253 characters"),  # 64 KiB
    ("", "RFC 1123 subdomain"),
    ("-n-a", "RFC 1123 subdomain"),
    ("n-a.", "RFC 1123 subdomain"),
    ("n..a", "RFC 1123 subdomain"),
    ("n-a\n", "RFC 1123 subdomain"),  # what a ``$`` anchor would let through
    (5, "valid string"),
    (None, "valid string"),
    (["n-a"], "valid string"),
    ({"n": 1}, "valid string"),
)
"""Node names Kubernetes does not allow, and what the 400 says about them."""

BAD_POD_FIELDS: tuple[tuple[tuple[str | int, ...], Any, str], ...] = (
    (("metadata", "name"), "\ud800", "not valid Unicode"),
    (("metadata", "name"), "P-1", "metadata.name"),
    (("metadata", "name"), "p" * 65536, "metadata.name"),
    (("metadata", "name"), 7, "metadata.name"),
    (("metadata", "namespace"), "ML", "metadata.namespace"),
    (("metadata", "namespace"), "m\x00l", "metadata.namespace"),
    (("metadata", "uid"), "u\u202e1", "metadata.uid"),
    (("metadata", "uid"), "u" * 200, "metadata.uid"),
    (("metadata", "labels", keys.LABEL_PRIORITY), "hígh", 'labels["flexlease.io/priority"]'),
    (("metadata", "labels", keys.LABEL_OWNER), "other/job", 'labels["flexlease.io/owner"]'),
    (("metadata", "labels", keys.LABEL_OWNER), "job\ud800", "not valid Unicode"),
    (("metadata", "labels", keys.LABEL_OWNER), ["job"], 'labels["flexlease.io/owner"]'),
    (
        ("metadata", "annotations", keys.ANN_ASSIGNED_GPUS),
        "N-A:0",
        'annotations["flexlease.io/assigned-gpus"]',
    ),
    (("metadata", "annotations", keys.ANN_GPU_TYPE), 3, 'annotations["flexlease.io/gpu-type"]'),
    (("metadata", "ownerReferences", 0, "name"), "Job A", "ownerReferences[0].name"),
    (("metadata", "ownerReferences"), {"name": "x"}, "ownerReferences"),
    (("metadata", "creationTimestamp"), "yesterday", "creationTimestamp"),
    (("spec", "schedulerName"), "Flexlease-Scheduler", "spec.schedulerName"),
    (("spec", "nodeName"), "n-a\x00", "spec.nodeName"),
    (("spec", "priority"), 2**40, "spec.priority"),
    (("spec", "priority"), 10**30, "integer literal of 31 digits"),
    (("spec", "preemptionPolicy"), "Sometimes", "spec.preemptionPolicy"),
    (("spec", "containers", 0, "image"), " registry.local/x:1", "spec.containers[0].image"),
    (("spec",), [], "Pod.spec"),
)
"""Pod fields the extender reads, a value Kubernetes does not allow there, and the 400's text."""


def with_field(pod: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A deep copy of ``pod`` with ``value`` at ``path``."""
    out = copy.deepcopy(pod)
    node: Any = out
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return out


# --------------------------------------------------------------------------- the harness


class Harness:
    """The event loop, the store and the long-lived extender of one example."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()
        self._uids = itertools.count(1)
        self.store = MemoryStore(clock=self.clock, uids=lambda: f"uid-{next(self._uids):06d}")
        self.client = self.run(self.start(self.store))

    def run(self, coro: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coro)

    async def start(self, store: MemoryStore) -> Client:
        """A new extender over ``store``, served over HTTP, with its inventory listed."""
        app = server.create_app(SETTINGS, store, registry=CollectorRegistry())
        client: Client = TestClient(TestServer(app))
        await client.start_server()
        await settle(store)
        await eventually(lambda: app[server.INVENTORY].ready)
        return client

    def close(self) -> None:
        async def stop() -> None:
            await self.client.close()
            await self.store.close()

        try:
            self.run(stop())
        finally:
            self.loop.close()

    @contextmanager
    def fresh(self, store: MemoryStore | None = None) -> Iterator[Client]:
        """A fresh extender over ``store`` (default: the long-lived one's), closed after."""
        client = self.run(self.start(store or self.store))
        try:
            yield client
        finally:
            self.run(client.close())


async def settle(store: MemoryStore) -> None:
    """Until every watch of ``store`` applied every change (and one more turn of the loop)."""
    await asyncio.sleep(0)
    await eventually(lambda: store.idle)
    await asyncio.sleep(0)


async def send(client: Client, req: Request) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", **dict(req.headers)}
    resp = await client.post(f"/{req.verb}", data=req.data, headers=headers)
    raw = await resp.read()
    try:
        return resp.status, orjson.loads(raw)
    except orjson.JSONDecodeError:
        return resp.status, raw


async def clone(store: MemoryStore, clock: ManualClock) -> MemoryStore:
    """A new store holding ``store``'s GPUNodes and pods: same names, uids, specs, statuses,
    annotations and bindings (resourceVersions are the new store's own)."""
    pending: deque[str] = deque()
    out = MemoryStore(clock=clock, uids=pending.popleft)
    for kind in (Kind.GPUNODE, Kind.POD):
        for obj in (await store.list(kind)).items:
            meta = obj["metadata"]
            pending.append(meta["uid"])
            created = await out.create(
                kind, {**obj, "metadata": {k: v for k, v in meta.items() if k != "resourceVersion"}}
            )
            if obj.get("status"):
                await out.patch(
                    kind,
                    meta["name"],
                    {"status": obj["status"]},
                    namespace=created["metadata"].get("namespace"),
                    subresource="status",
                )
    return out


def inventory_state(inv: Inventory) -> tuple[Any, ...]:
    """What an inventory hands to scheduling, without the build counter (``generation``):
    every node's pool, devices (with holders), caches and holders (reservations included)."""
    snap = inv.snapshot()
    nodes = {
        name: (v.pool, v.devices, v.images, v.checkpoints, dict(v.holders)) for name, v in snap.nodes.items()
    }
    return nodes, inv.summary()


class _Fault(RuntimeError):
    """The injected fault."""


_TARGETS: dict[str, tuple[Any, str, str]] = {
    "positions": (equivalence.FilterCache, "_positions", "filter"),
    "restrict": (equivalence.FilterCache, "_restrict", "filter"),
    "intern": (body.ExtenderArgsDecoder, "intern", "filter"),
    "announce": (body.ExtenderArgsDecoder, "announce", "filter"),
    "parse": (ParsedPods, "parse", "prioritize"),
    "prioritize": (equivalence.PriorityCache, "prioritize", "prioritize"),
    "victims": (scheduling, "select_victims", "preempt"),
}
"""Internal steps a fault may hit (each changes the extender's state, then raises), and the
verb whose request reaches it."""


@contextmanager
def _failing_once(target: str) -> Iterator[None]:
    """``target``'s function does its work, then raises :class:`_Fault` — on its first call
    only; restored on exit."""
    owner, attr, _ = _TARGETS[target]
    raw = vars(owner)[attr]  # as stored: a function, or a staticmethod object
    original = getattr(owner, attr)
    fired = False

    def failing(*args: Any, **kwargs: Any) -> Any:
        nonlocal fired
        result = original(*args, **kwargs)
        if not fired:
            fired = True
            raise _Fault(f"injected fault after {target}")
        return result

    setattr(owner, attr, staticmethod(failing) if isinstance(raw, staticmethod) else failing)
    try:
        yield
    finally:
        setattr(owner, attr, raw)


# --------------------------------------------------------------------------- the machine


class ExtenderMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = Harness()
        self.step = 0

    def teardown(self) -> None:
        self.h.close()

    # ---------------------------------------------------------------- reading the store

    def objects(self, kind: Kind) -> list[dict[str, Any]]:
        return self.h.run(self.h.store.list(kind)).items

    def pods(self) -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in self.objects(Kind.POD)}

    def pending(self) -> list[dict[str, Any]]:
        return [p for p in self.pods().values() if not p["spec"].get("nodeName")]

    def gpunodes(self) -> dict[str, dict[str, Any]]:
        return {n["metadata"]["name"]: n for n in self.objects(Kind.GPUNODE)}

    def write(self, coro: Awaitable[Any]) -> None:
        async def go() -> None:
            await coro
            await settle(self.h.store)

        self.h.run(go())

    # ---------------------------------------------------------------- inventory

    @initialize()
    def seed(self) -> None:
        self.add_node("n-a", 4, payloads.H20, "HA")
        self.add_node("n-b", 2, payloads.H20, "MA")
        self.add_node("s-a", 2, payloads.H20, "HA")
        self.add_pending("p-1", 1, None, None)

    @rule(
        name=st.sampled_from(NODES),
        gpus=st.integers(1, 4),
        model=st.sampled_from(MODELS),
        tier=st.sampled_from(("HA", "MA", "LA")),
    )
    def add_node(self, name: str, gpus: int, model: str, tier: str) -> None:
        if name in self.gpunodes():
            return
        pool = "standby" if name.startswith("s-") else "general"
        obj = payloads.gpunode(name, gpus=gpus, model=model, tiers=tier, pool=pool)
        self.write(add_node(self.h.store, obj))

    @rule(name=st.sampled_from(NODES))
    def remove_node(self, name: str) -> None:
        if name in self.gpunodes():
            self.write(self.h.store.delete(Kind.GPUNODE, name))

    @rule(name=st.sampled_from(NODES), index=st.integers(0, 3), owner=st.sampled_from((*OWNERS, None)))
    def tag(self, name: str, index: int, owner: str | None) -> None:
        node = self.gpunodes().get(name)
        if node is None or str(index) not in node["status"]["devices"]:
            return
        device = {"owner": owner, "leasedAt": "2026-11-21T01:30:00Z" if owner else None, "tierOverride": None}
        self.write(self.h.store.patch(Kind.GPUNODE, name, {"spec": {"devices": {str(index): device}}}))

    @rule(name=st.sampled_from(NODES), index=st.integers(0, 3), healthy=st.booleans())
    def set_health(self, name: str, index: int, healthy: bool) -> None:
        node = self.gpunodes().get(name)
        if node is None or str(index) not in node["status"]["devices"]:
            return
        status = {"health": "Healthy" if healthy else "Unhealthy", "reason": None if healthy else "XID 79"}
        patch = {"status": {"devices": {str(index): status}}}
        self.write(self.h.store.patch(Kind.GPUNODE, name, patch, subresource="status"))

    @rule(
        name=st.sampled_from(PODS),
        gpus=st.integers(0, 3),
        owner=st.sampled_from(("online", "job-a", None)),
        gpu_type=st.sampled_from((None, payloads.H20)),
    )
    def add_pending(self, name: str, gpus: int, owner: str | None, gpu_type: str | None) -> None:
        if name in self.pods():
            return
        high = name.startswith("hp-")
        pod = payloads.pod(
            name,
            gpus=gpus,
            priority="high" if high else ("low" if name.startswith("lp-") else None),
            owner=owner,
            gpu_type=gpu_type,
            reclaim=high and owner == "online",
            spec_priority=1000 if high else 0,
        )
        self.write(add_pod(self.h.store, pod))

    @rule(
        name=st.sampled_from(PODS),
        node=st.sampled_from(NODES),
        indices=st.sets(st.integers(0, 3), min_size=1),
    )
    def add_running(self, name: str, node: str, indices: set[int]) -> None:
        """A pod bound to ``node`` holding ``indices`` (as a bind left it; a claim on a device
        another pod holds, or that the node lacks, is the inventory's to resolve)."""
        if name in self.pods():
            return
        order = sorted(indices)
        pod = payloads.pod(
            name,
            gpus=len(order),
            priority="low" if not name.startswith("hp-") else "high",
            node_name=node,
            phase="Running",
            annotations=payloads.assigned(node, *order),
        )
        self.write(add_pod(self.h.store, pod))

    @rule(name=st.sampled_from(PODS))
    def delete_pod(self, name: str) -> None:
        pod = self.pods().get(name)
        if pod is not None:
            ns = pod["metadata"]["namespace"]
            self.write(self.h.store.delete(Kind.POD, name, namespace=ns, grace_period_seconds=0))

    # ---------------------------------------------------------------- valid requests

    def probes(self, *, rotate: int = 0) -> list[Request]:
        """Filter, prioritize and preempt for each pending pod over every GPUNode (rotated
        by ``rotate``), a node without a GPUNode and one name twice; preempt proposes, on
        each node, the pods that hold GPUs there."""
        names = sorted(self.gpunodes())
        if names:
            k = rotate % len(names)
            names = names[k:] + names[:k]
        candidates = [*names, NO_GPUNODE, *names[:1]]
        holders: dict[str, list[str]] = {}
        for pod in self.pods().values():
            node = pod["spec"].get("nodeName")
            if node:
                holders.setdefault(node, []).append(pod["metadata"]["uid"])
        out: list[Request] = []
        for pod in self.pending()[:3]:
            args = candidate_args(pod, candidates)
            out.append(Request("filter", compact(args)))
            out.append(Request("prioritize", compact(args)))
            proposal = {n: holders.get(n, []) for n in names}
            out.append(Request("preempt", compact(payloads.preemption_args(pod, proposal))))
        return out

    def agree(self, requests: list[Request], fresh: Client) -> None:
        """Each of ``requests`` gets the same status and reply from the long-lived extender
        and from ``fresh``, never a 5xx."""

        async def go() -> None:
            for req in requests:
                old = await send(self.h.client, req)
                new = await send(fresh, req)
                assert old[0] < 500, (req.verb, old)
                assert old == new, (req.verb, req.data[:300], old, new)

        self.h.run(go())

    @invariant()
    def answers_as_a_fresh_extender(self) -> None:
        self.step += 1
        with self.h.fresh() as fresh:
            self.agree(self.probes(rotate=self.step), fresh)
            assert inventory_state(self.h.client.app[server.INVENTORY]) == inventory_state(
                fresh.app[server.INVENTORY]
            )

    @rule(
        verb=st.sampled_from(("filter", "prioritize")),
        picks=st.lists(st.integers(0, 5), max_size=12),
        form=st.sampled_from(("compact", "spaced", "gzip", "deflate")),
        many=st.booleans(),
    )
    def valid_request(self, verb: str, picks: list[int], form: str, many: bool) -> None:
        """A valid request in any order, with duplicates, unknown nodes, sometimes 20,000
        names, compressed or not: the same answer as a fresh extender's."""
        pending = self.pending()
        if not pending:
            return
        universe = [*sorted(self.gpunodes()), NO_GPUNODE, "gpu-unknown"]
        names = [universe[i % len(universe)] for i in picks]
        if many:
            names += [f"h-{i}" for i in range(20_000)]
        args = candidate_args(pending[len(picks) % len(pending)], names)
        data = spaced(args) if form == "spaced" else compact(args)
        headers: tuple[tuple[str, str], ...] = ()
        if form == "gzip":
            data, headers = gzip.compress(data), (("Content-Encoding", "gzip"),)
        elif form == "deflate":
            data, headers = zlib.compress(data), (("Content-Encoding", "deflate"),)
        with self.h.fresh() as fresh:
            self.agree([Request(verb, data, headers)], fresh)

    # ---------------------------------------------------------------- hostile requests

    def hostile(self, req: Request) -> None:
        status, reply = self.h.run(send(self.h.client, req))
        assert status < 500, (req.verb, req.data[:300], status, reply)
        if req.expect is not None:
            assert status == req.expect, (req.verb, req.data[:300], status, reply)
        if req.needle:
            assert isinstance(reply, dict) and req.needle in reply.get("Error", ""), (req.needle, reply)

    def some_pod(self) -> dict[str, Any]:
        pending = self.pending()
        return pending[0] if pending else payloads.pod("p-9", uid="uid-999999")

    @rule(
        verb=st.sampled_from(("filter", "prioritize")),
        bad=st.sampled_from(BAD_NAMES),
        at=st.integers(0, 3),
        encode=st.sampled_from((compact, spaced)),
    )
    def hostile_node_name(
        self, verb: str, bad: tuple[Any, str], at: int, encode: Callable[[Any], bytes]
    ) -> None:
        names: list[Any] = sorted(self.gpunodes())
        names.insert(min(at, len(names)), bad[0])
        self.hostile(Request(verb, encode(candidate_args(self.some_pod(), names)), expect=400, needle=bad[1]))

    @rule(bad=st.sampled_from(BAD_NAMES), form=st.sampled_from(("meta", "victims", "nodelist")))
    def hostile_preempt_or_node_list(self, bad: tuple[Any, str], form: str) -> None:
        pod = self.some_pod()
        if form == "nodelist":  # a scheduler that is not nodeCacheCapable: whole Nodes
            items = [payloads.node(n) for n in sorted(self.gpunodes())]
            items.append({**payloads.node("x"), "metadata": {"name": bad[0]}})
            args = {"Pod": pod, "Nodes": {"items": items}, "NodeNames": None}
            req = Request("filter", compact(args), needle=f"Nodes.items[{len(items) - 1}].metadata.name")
        elif form == "meta":
            if not isinstance(bad[0], str):
                return  # a JSON object key is always a string
            args = {"Pod": pod, "NodeNameToVictims": None, "NodeNameToMetaVictims": {bad[0]: {"Pods": []}}}
            req = Request("preempt", compact(args), needle="NodeNameToMetaVictims")
        else:
            victim = payloads.pod("v", uid="uid-999998", node_name="n-a")
            if not isinstance(bad[0], str):
                return
            args = {
                "Pod": pod,
                "NodeNameToVictims": {bad[0]: {"Pods": [victim]}},
                "NodeNameToMetaVictims": None,
            }
            req = Request("preempt", compact(args), needle="NodeNameToVictims")
        self.hostile(Request(req.verb, req.data, expect=400, needle=req.needle))

    @rule(
        verb=st.sampled_from(("filter", "prioritize", "preempt")),
        bad=st.sampled_from(BAD_POD_FIELDS),
        encode=st.sampled_from((compact, spaced)),
    )
    def hostile_pod(
        self, verb: str, bad: tuple[tuple[str | int, ...], Any, str], encode: Callable[[Any], bytes]
    ) -> None:
        pod = with_field(self.some_pod(), bad[0], bad[1])
        names = sorted(self.gpunodes())
        args = candidate_args(pod, names) if verb != "preempt" else payloads.preemption_args(pod, {})
        self.hostile(Request(verb, encode(args), expect=400, needle=bad[2]))

    @rule(
        field=st.sampled_from(("PodName", "PodNamespace", "PodUID", "Node")),
        bad=st.sampled_from(BAD_NAMES),
        encode=st.sampled_from((compact, spaced)),
    )
    def hostile_bind(self, field: str, bad: tuple[Any, str], encode: Callable[[Any], bytes]) -> None:
        pod = self.some_pod()
        args: dict[str, Any] = payloads.binding_args(pod, "n-a")
        if (
            field == "PodUID"
            and isinstance(bad[0], str)
            and re.fullmatch(r"([A-Za-z0-9][-A-Za-z0-9_.:]*)?", bad[0])
        ):
            return  # a valid UID ("" means unchecked): a real bind, the bind rule's business
        args[field] = bad[0]
        self.hostile(Request("bind", encode(args), expect=400, needle=field))

    @rule(
        value=st.sampled_from((2**63, -(2**63) - 1, 2**64, 10**25, -1)),
        where=st.sampled_from(("meta", "victims")),
    )
    def huge_numbers(self, value: int, where: str) -> None:
        pod = self.some_pod()
        victims = {"Pods": [], "NumPDBViolations": value}
        args = {
            "Pod": pod,
            "NodeNameToVictims": {"n-a": victims} if where == "victims" else None,
            "NodeNameToMetaVictims": {"n-a": victims} if where == "meta" else None,
        }
        if value == -1:  # a valid int64 (Go would send it): answered
            self.hostile(Request("preempt", compact(args)))
        else:
            self.hostile(Request("preempt", json.dumps(args).encode(), expect=400))

    @rule(
        verb=st.sampled_from(("filter", "prioritize", "bind", "preempt")),
        shape=st.sampled_from(("array", "string", "number", "null", "object", "pod-array", "names-object")),
    )
    def wrong_types(self, verb: str, shape: str) -> None:
        pod = self.some_pod()
        value: Any = {
            "array": [],
            "string": "filter",
            "number": 1e400 if verb == "bind" else 12,
            "null": None,
            "object": {},
            "pod-array": {"Pod": [pod], "NodeNames": [], "NodeNameToMetaVictims": {}},
            "names-object": {"Pod": pod, "NodeNames": {"n-a": 1}, "PodName": {}, "Node": []},
        }[shape]
        data = b"1e400" if shape == "number" and verb == "bind" else compact(value)
        harmless = verb == "preempt" and shape == "names-object"  # members a preemption ignores
        self.hostile(Request(verb, data, expect=None if harmless else 400))

    @rule(
        verb=st.sampled_from(("filter", "prioritize", "bind", "preempt")),
        cut=st.floats(0.0, 0.999),
        encoding=st.sampled_from((None, "gzip", "deflate", "gzip-corrupt", "gzip-plain")),
    )
    def truncated_or_compressed(self, verb: str, cut: float, encoding: str | None) -> None:
        """A valid body cut short, sent plain or compressed; a compressed one corrupted; a
        plain one labelled gzip."""
        pod = self.some_pod()
        valid = {
            "filter": candidate_args(pod, sorted(self.gpunodes())),
            "prioritize": candidate_args(pod, sorted(self.gpunodes())),
            "bind": payloads.binding_args(pod, "n-a"),
            "preempt": payloads.preemption_args(pod, {}),
        }[verb]
        whole = compact(valid)
        data = whole[: int(len(whole) * cut)]
        headers: tuple[tuple[str, str], ...] = ()
        if encoding == "gzip":
            data, headers = gzip.compress(data), (("Content-Encoding", "gzip"),)
        elif encoding == "deflate":
            data, headers = zlib.compress(data), (("Content-Encoding", "deflate"),)
        elif encoding == "gzip-corrupt":
            packed = gzip.compress(whole)
            data, headers = (
                packed[: max(11, int(len(packed) * cut))] + b"\x00garbage",
                (("Content-Encoding", "gzip"),),
            )
        elif encoding == "gzip-plain":
            data, headers = whole, (("Content-Encoding", "gzip"),)
        self.hostile(Request(verb, data, headers, expect=400))

    # ---------------------------------------------------------------- faults

    @rule(step=st.sampled_from(tuple(_TARGETS)), rotate=st.integers(1, 3))
    def fault(self, step: str, rotate: int) -> None:
        """One internal step of a request raises after doing its work: the request may be
        answered 500 (the only 5xx allowed); kube-scheduler's retry, and every request after
        it (the invariant), must be answered as a fresh extender answers them. The request
        is one the step serves, over a candidate order not sent just before."""
        verb = _TARGETS[step][2]
        requests = [r for r in self.probes(rotate=self.step + rotate) if r.verb == verb][:1]
        if not requests:
            return
        with _failing_once(step):
            status, _ = self.h.run(send(self.h.client, requests[0]))
        assert status in (200, 500)
        with self.h.fresh() as fresh:
            self.agree(requests, fresh)

    # ---------------------------------------------------------------- binds

    @precondition(lambda self: bool(self.pending()))
    @rule(
        pick=st.integers(0, 5),
        node=st.sampled_from((*NODES, NO_GPUNODE)),
        store_fault=st.sampled_from((None, "before", "after")),
        encode=st.sampled_from((compact, spaced)),
    )
    def bind(self, pick: int, node: str, store_fault: str | None, encode: Callable[[Any], bytes]) -> None:
        """The same bind to the long-lived extender and to a fresh one over a copy of the
        store: equal replies, equal pods, equal inventories (reservations included).
        ``store_fault``: the long-lived extender's store raises an unexpected exception
        before or after writing the Binding (a broken store: the bind must not leave a
        reservation the pod's state does not justify)."""
        pending = self.pending()
        pod = pending[pick % len(pending)]
        req = Request("bind", encode(payloads.binding_args(pod, node)))
        copied = self.h.run(clone(self.h.store, self.h.clock))
        try:
            with self.h.fresh(copied) as fresh:
                with _store_raising(self.h.store, store_fault):
                    old = self.h.run(send(self.h.client, req))
                new = self.h.run(send(fresh, req))
                self.h.run(settle(self.h.store))
                self.h.run(settle(copied))
                assert old[0] < 500 and new[0] < 500, (old, new)
                if store_fault is None:
                    assert old == new, (old, new)
                name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]
                mine = self.h.run(self.h.store.get(Kind.POD, name, namespace=ns))
                theirs = self.h.run(copied.get(Kind.POD, name, namespace=ns))
                if store_fault != "before":
                    assert _bound(mine) == _bound(theirs), (_bound(mine), _bound(theirs))
                    assert inventory_state(self.h.client.app[server.INVENTORY]) == inventory_state(
                        fresh.app[server.INVENTORY]
                    )
        finally:
            self.h.run(copied.close())


def _bound(pod: dict[str, Any]) -> tuple[Any, ...]:
    """What a bind writes on a pod, but for the time it wrote it."""
    ann = pod["metadata"].get("annotations") or {}
    return pod["spec"].get("nodeName"), ann.get(keys.ANN_ASSIGNED_GPUS), ann.get(keys.ANN_ASSIGNED_UUIDS)


@contextmanager
def _store_raising(store: MemoryStore, when: str | None) -> Iterator[None]:
    """``store.bind`` raises ``RuntimeError`` ``before`` or ``after`` writing the Binding."""
    if when is None:
        yield
        return
    real = store.bind

    async def broken(*args: Any, **kwargs: Any) -> None:
        if when == "after":
            await real(*args, **kwargs)
        raise RuntimeError(f"store broke {when} the Binding")

    store.bind = broken  # type: ignore[method-assign]
    try:
        yield
    finally:
        del store.bind


def test_the_extender_answers_as_a_fresh_one_whatever_came_before() -> None:
    run_state_machine_as_test(
        ExtenderMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            derandomize=True,
            suppress_health_check=(HealthCheck.too_slow, HealthCheck.filter_too_much),
        ),
    )
