"""The extender over real HTTP (pytest-aiohttp), with bodies shaped as kube-scheduler sends them."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Final

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender import body, server
from extender.fitarrays import FitArrays
from flexlease.api import keys
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore
from tests.extender import payloads
from tests.extender.conftest import add_node, add_pod, eventually, make_settings, synced

Client = TestClient[web.Request, web.Application]


async def post(client: Client, verb: str, body: Any) -> Any:
    resp = await client.post(f"/{verb}", json=body)
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def seed_cluster(store: MemoryStore) -> dict[str, Any]:
    """n-free: 8 free H20 HA; n-busy: 2 GPUs both held by LP pods; n-a100: A100s;
    n-owned: 4 GPUs, 0-1 tagged for ml/online; s-1: standby pool."""
    await add_node(store, payloads.gpunode("n-free"))
    await add_node(store, payloads.gpunode("n-busy", gpus=2))
    await add_node(store, payloads.gpunode("n-a100", model=payloads.A100))
    await add_node(store, payloads.gpunode("n-owned", gpus=4, owners={0: "ml/online", 1: "ml/online"}))
    await add_node(store, payloads.gpunode("s-1", pool="standby"))
    lp1 = await add_pod(
        store,
        payloads.pod("lp-1", node_name="n-busy", phase="Running", annotations=payloads.assigned("n-busy", 0)),
    )
    lp2 = await add_pod(
        store,
        payloads.pod("lp-2", node_name="n-busy", phase="Running", annotations=payloads.assigned("n-busy", 1)),
    )
    return {"lp-1": lp1, "lp-2": lp2}


ALL = ["n-free", "n-busy", "n-a100", "n-owned", "s-1", "n-cpu-only"]


# --------------------------------------------------------------------------- filter


async def test_filter_reply_shape_and_verdicts(start: Any, store: MemoryStore) -> None:
    await seed_cluster(store)
    client = await start()
    pod = payloads.pod("p", gpus=2, priority="high", gpu_type=payloads.H20, spec_priority=1000)
    reply = await post(client, "filter", payloads.extender_args(pod, ALL))
    assert set(reply) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert reply["Nodes"] is None and reply["Error"] == ""
    # n-owned: GPUs 0-1 are tagged for ml/online, another owner; the 2 untagged ones fit
    assert reply["NodeNames"] == ["n-free", "n-owned"]
    assert reply["FailedNodes"] == {
        "n-busy": "node(s) had fewer than 2 free GPUs of type NVIDIA H20; "
        "preemptable lower-priority pods hold the rest"
    }
    assert reply["FailedAndUnresolvableNodes"] == {
        "n-a100": "node(s) had fewer than 2 GPUs of type NVIDIA H20",
        "s-1": "node(s) were in the standby pool, which only reclaim pods (flexlease.io/reclaim=true) may use",
        "n-cpu-only": "node(s) had no flexlease GPUNode (no agent reports their GPUs)",
    }


async def test_filter_hp_pod_cannot_use_another_owners_tags(start: Any, store: MemoryStore) -> None:
    await seed_cluster(store)
    client = await start()
    pod = payloads.pod("p", gpus=3, priority="high", owner="other")
    reply = await post(client, "filter", payloads.extender_args(pod, ["n-owned"]))
    assert reply["NodeNames"] == []
    assert reply["FailedAndUnresolvableNodes"]["n-owned"] == (
        "node(s) had fewer than 3 healthy GPUs open to this pod (others tagged for another owner)"
    )
    own = payloads.pod("q", gpus=3, priority="high", owner="online")  # label value completes to ml/online
    reply = await post(client, "filter", payloads.extender_args(own, ["n-owned"]))
    assert reply["NodeNames"] == ["n-owned"]


async def test_pod_asking_more_gpus_than_any_node_has(start: Any, store: MemoryStore) -> None:
    await seed_cluster(store)
    client = await start()
    reply = await post(client, "filter", payloads.extender_args(payloads.pod("huge", gpus=16), ALL[:4]))
    assert reply["NodeNames"] == [] and reply["FailedNodes"] == {}
    # one reason for both: kube-scheduler aggregates them as "2 node(s) had fewer than 16 GPUs in total"
    assert reply["FailedAndUnresolvableNodes"]["n-free"] == "node(s) had fewer than 16 GPUs in total"
    assert reply["FailedAndUnresolvableNodes"]["n-busy"] == "node(s) had fewer than 16 GPUs in total"


async def test_pods_without_managed_gpus_pass_untouched(start: Any, store: MemoryStore) -> None:
    await seed_cluster(store)
    client = await start()
    reply = await post(client, "filter", payloads.extender_args(payloads.pod("web", gpus=0), ALL))
    assert reply == {
        "Nodes": None,
        "NodeNames": ALL,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    scores = await post(client, "prioritize", payloads.extender_args(payloads.pod("web", gpus=0), ALL))
    assert scores == [{"Host": n, "Score": 0} for n in ALL]


async def test_filter_with_full_nodes_when_not_cache_capable(start: Any, store: MemoryStore) -> None:
    await seed_cluster(store)
    client = await start()
    items = [
        {"metadata": {"name": n, "labels": {}}, "status": {"allocatable": {"cpu": "96"}}} for n in ALL[:2]
    ]
    body = {"Pod": payloads.pod("p", gpus=4), "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
    reply = await post(client, "filter", body)
    assert reply["NodeNames"] is None
    assert [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == ["n-free"]


async def test_keys_are_accepted_case_insensitively(start: Any, store: MemoryStore) -> None:
    await seed_cluster(store)
    client = await start()
    reply = await post(client, "filter", {"pod": payloads.pod("p"), "nodes": None, "nodenames": ["n-free"]})
    assert reply["NodeNames"] == ["n-free"]


async def test_reclaim_pod_uses_standby_only_on_shortfall(start: Any, store: MemoryStore) -> None:
    await seed_cluster(store)
    client = await start()
    pod = payloads.pod("r", gpus=8, priority="high", owner="online", reclaim=True, gpu_type=payloads.H20)
    reply = await post(client, "filter", payloads.extender_args(pod, ["n-free", "s-1"]))
    assert reply["NodeNames"] == ["n-free"]
    assert "only when no general-pool node fits" in reply["FailedAndUnresolvableNodes"]["s-1"]
    reply = await post(client, "filter", payloads.extender_args(pod, ["n-busy", "n-owned", "s-1"]))
    assert reply["NodeNames"] == ["s-1"]


async def test_watch_changes_reach_filter(start: Any, store: MemoryStore) -> None:
    await seed_cluster(store)
    client = await start()
    pod = payloads.pod("p", gpus=1, priority="high", owner="x", spec_priority=1000)
    assert (await post(client, "filter", payloads.extender_args(pod, ["n-busy"])))["FailedNodes"]
    await store.delete(Kind.POD, "lp-1", namespace="ml", grace_period_seconds=0)
    after = await store.patch(
        Kind.GPUNODE,
        "n-free",
        {"status": {"devices": {str(i): {"health": "Unhealthy"} for i in range(8)}}},
        subresource="status",
    )
    await synced(client, Kind.GPUNODE, after)
    await eventually(lambda: client.app[server.INVENTORY].summary()["pods"] == 1)
    reply = await post(client, "filter", payloads.extender_args(pod, ["n-busy", "n-free"]))
    assert reply["NodeNames"] == ["n-busy"]
    assert reply["FailedAndUnresolvableNodes"]["n-free"].endswith("(others unhealthy)")


class SlowListStore(MemoryStore):
    """Pods cannot be listed until ``release`` is set (a slow API server)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def list(self, kind: Kind, **kw: Any) -> Any:
        if kind is Kind.POD:
            await self.release.wait()
        return await super().list(kind, **kw)


async def test_not_ready_until_pods_and_gpunodes_are_listed(aiohttp_client: Any) -> None:
    store = SlowListStore()
    try:
        await add_node(store, payloads.gpunode("n1"))
        client = await aiohttp_client(server.create_app(make_settings(), store))
        watches = client.app[server.WATCHES]
        await eventually(lambda: watches[Kind.GPUNODE].listed)
        resp = await client.get("/readyz")
        assert resp.status == 503
        assert (await resp.json())["checks"] == {"inventory": False}
        reply = await post(client, "filter", payloads.extender_args(payloads.pod("p"), ["n1"]))
        assert reply["Error"] == "extender not ready: Pods not listed yet"
        resp = await client.post("/preempt", json=payloads.preemption_args(payloads.pod("p"), {"n1": []}))
        assert resp.status == 503
        plain = await post(client, "filter", payloads.extender_args(payloads.pod("web", gpus=0), ["a"]))
        assert plain["NodeNames"] == ["a"] and plain["Error"] == ""
        store.release.set()
        await eventually(lambda: client.app[server.INVENTORY].ready)
        assert (await client.get("/readyz")).status == 200
        reply = await post(client, "filter", payloads.extender_args(payloads.pod("p"), ["n1"]))
        assert reply["NodeNames"] == ["n1"]
    finally:
        await store.close()


# --------------------------------------------------------------------------- prioritize


async def test_prioritize_scores_every_candidate(start: Any, store: MemoryStore) -> None:
    await add_node(store, payloads.gpunode("cached", checkpoints=["ckpt-9"]))
    await add_node(store, payloads.gpunode("plain"))
    await add_node(store, payloads.gpunode("own", owners={i: "ml/online" for i in range(8)}))
    client = await start()
    pod = payloads.pod("r", gpus=2, priority="high", owner="online", reclaim=True, checkpoint="ckpt-9")
    reply = await post(client, "prioritize", payloads.extender_args(pod, ["plain", "cached", "own", "gone"]))
    assert [h["Host"] for h in reply] == ["plain", "cached", "own", "gone"]
    scores = {h["Host"]: h["Score"] for h in reply}
    assert scores["own"] > scores["cached"] > scores["plain"] >= 0
    assert scores["gone"] == 0
    assert all(set(h) == {"Host", "Score"} and 0 <= h["Score"] <= 10 for h in reply)


async def test_prioritize_after_filter_reuses_the_filters_node_names(start: Any, store: MemoryStore) -> None:
    """kube-scheduler sends /prioritize the nodes /filter passed, in the reply's order and
    (encoding/json) without spaces: that body is split by its tail, and nothing in it is
    decoded again; the scores are those of a body decoded in full."""
    await seed_cluster(store)
    client = await start()
    pod = payloads.pod("p", gpus=2, priority="high", gpu_type=payloads.H20, spec_priority=1000)
    headers = {"Content-Type": "application/json"}
    resp = await client.post("/filter", data=orjson.dumps(payloads.extender_args(pod, ALL)), headers=headers)
    passed = (await resp.json())["NodeNames"]
    assert passed == ["n-free", "n-owned"]
    decoder = client.app[server.ARGS_DECODER]
    misses = decoder.misses
    body = orjson.dumps(payloads.extender_args(pod, passed))
    resp = await client.post("/prioritize", data=body, headers=headers)
    scores = await resp.json()
    assert decoder.misses == misses  # the pod and the node list were both known
    assert [h["Host"] for h in scores] == passed
    spaced = await post(client, "prioritize", payloads.extender_args(pod, passed))  # the general way
    assert scores == spaced


async def test_candidate_lists_decode_into_the_filter_caches_universe(start: Any, store: MemoryStore) -> None:
    """After a filter, the next candidate lists (any subset, any order) decode into the
    strings of the filter cache's universe, so that its index finds them by identity."""
    await seed_cluster(store)
    client = await start()
    pod = payloads.pod("p", gpus=2, priority="high", gpu_type=payloads.H20, spec_priority=1000)
    headers = {"Content-Type": "application/json"}
    first = await client.post("/filter", data=orjson.dumps(payloads.extender_args(pod, ALL)), headers=headers)
    assert first.status == 200
    universe = client.app[server.FILTER_CACHE].universe
    assert sorted(universe) == sorted(ALL)
    subset = list(reversed(ALL))[1:]
    args = client.app[server.ARGS_DECODER].decode(orjson.dumps(payloads.extender_args(pod, subset)))
    assert args is not None and args.node_names == subset
    assert all(any(n is u for u in universe) for n in args.node_names)
    second = await client.post(
        "/filter", data=orjson.dumps(payloads.extender_args(pod, subset)), headers=headers
    )
    expected = await post(client, "filter", payloads.extender_args(pod, subset))  # the general way
    assert await second.json() == expected


# --------------------------------------------------------------------------- bind


async def test_bind_writes_annotations_then_binds(start: Any, store: MemoryStore) -> None:
    await seed_cluster(store)
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=2, tier="HA"))
    reply = await post(client, "bind", payloads.binding_args(pod, "n-free"))
    assert reply == {"Error": ""}
    stored = await store.get(Kind.POD, "p", namespace="ml")
    ann = stored["metadata"]["annotations"]
    assert stored["spec"]["nodeName"] == "n-free"
    assert ann[keys.ANN_ASSIGNED_GPUS] == "n-free:0,1"
    assert ann[keys.ANN_ASSIGNED_UUIDS] == "GPU-n-free-00-4c1e-9d2b-7a51,GPU-n-free-01-4c1e-9d2b-7a51"
    assert ann[keys.ANN_ASSIGNED_AT].endswith("Z")
    await synced(client, Kind.POD, stored)
    inv = client.app[server.INVENTORY]
    assert inv.reservation(stored["metadata"]["uid"]) is None  # confirmed by the watch
    # the next pod gets the next devices
    pod2 = await add_pod(store, payloads.pod("p2", gpus=1))
    assert (await post(client, "bind", payloads.binding_args(pod2, "n-free"))) == {"Error": ""}
    stored2 = await store.get(Kind.POD, "p2", namespace="ml")
    assert stored2["metadata"]["annotations"][keys.ANN_ASSIGNED_GPUS] == "n-free:2"


async def test_rebinding_a_bound_pod_is_idempotent(start: Any, store: MemoryStore) -> None:
    await seed_cluster(store)
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=2))
    args = payloads.binding_args(pod, "n-free")
    assert (await post(client, "bind", args)) == {"Error": ""}
    before = await store.get(Kind.POD, "p", namespace="ml")
    assert (await post(client, "bind", args)) == {"Error": ""}
    after = await store.get(Kind.POD, "p", namespace="ml")
    assert after == before  # nothing rewritten
    other = await post(client, "bind", payloads.binding_args(pod, "n-owned"))
    assert "already bound to n-free" in other["Error"]


async def test_concurrent_binds_never_share_a_gpu(start: Any, store: MemoryStore) -> None:
    await add_node(store, payloads.gpunode("n1"))
    client = await start()
    pods = [await add_pod(store, payloads.pod(f"p{i}", gpus=2)) for i in range(7)]
    replies = await asyncio.gather(*(post(client, "bind", payloads.binding_args(p, "n1")) for p in pods))
    ok = [r for r in replies if r["Error"] == ""]
    assert len(ok) == 4
    assert all("no longer fits" in r["Error"] for r in replies if r["Error"])
    taken: list[int] = []
    for p in pods:
        stored = await store.get(Kind.POD, p["metadata"]["name"], namespace="ml")
        value = stored["metadata"].get("annotations", {}).get(keys.ANN_ASSIGNED_GPUS)
        if value is not None:
            assert stored["spec"]["nodeName"] == "n1"
            taken += [int(i) for i in value.split(":")[1].split(",")]
        else:
            assert "nodeName" not in stored["spec"]
    assert sorted(taken) == list(range(8))
    text = await (await client.get("/metrics")).text()
    assert 'flexlease_extender_decisions_total{cause="fits",outcome="bound",verb="bind"} 4.0' in text
    assert (
        'flexlease_extender_decisions_total{cause="no_longer_fits",outcome="failed",verb="bind"} 3.0' in text
    )


async def test_bind_of_an_unknown_pod_or_uid_mismatch_reports_error(start: Any, store: MemoryStore) -> None:
    await seed_cluster(store)
    client = await start()
    ghost = payloads.pod("ghost")
    assert (
        "cannot read pod ml/ghost"
        in (await post(client, "bind", payloads.binding_args(ghost, "n-free")))["Error"]
    )
    pod = await add_pod(store, payloads.pod("p"))
    args = payloads.binding_args(pod, "n-free") | {"PodUID": "another-uid"}
    assert "the scheduler asked to bind another-uid" in (await post(client, "bind", args))["Error"]


async def test_bind_of_a_pod_without_gpus_just_binds(start: Any, store: MemoryStore) -> None:
    await seed_cluster(store)
    client = await start()
    await store.create(Kind.NODE, payloads.node("n-cpu-only"))  # a Node, no GPUNode
    pod = await add_pod(store, payloads.pod("web", gpus=0))
    assert (await post(client, "bind", payloads.binding_args(pod, "n-cpu-only"))) == {"Error": ""}
    stored = await store.get(Kind.POD, "web", namespace="ml")
    assert stored["spec"]["nodeName"] == "n-cpu-only"
    assert keys.ANN_ASSIGNED_GPUS not in stored["metadata"]["annotations"]


# --------------------------------------------------------------------------- preempt


async def test_preempt_proposes_only_lp_pods_freeing_usable_gpus(start: Any, store: MemoryStore) -> None:
    await add_node(store, payloads.gpunode("n1", gpus=4, owners={0: "ml/online", 1: "ml/online"}))
    held = {}
    for i, (name, prio) in enumerate([("lp-0", "low"), ("lp-1", "low"), ("hp-2", "high"), ("lp-3", "low")]):
        held[name] = await add_pod(
            store,
            payloads.pod(
                name, priority=prio, node_name="n1", phase="Running", annotations=payloads.assigned("n1", i)
            ),
        )
    client = await start()
    uid = {n: p["metadata"]["uid"] for n, p in held.items()}
    pod = payloads.pod("r", gpus=2, priority="high", owner="online", reclaim=True, spec_priority=1000)
    body = payloads.preemption_args(
        pod, {"n1": [uid["lp-0"], uid["hp-2"], "cpu-pod-uid"], "n-unknown": ["x"]}
    )
    reply = await post(client, "preempt", body)
    assert set(reply) == {"NodeNameToMetaVictims"}
    victims = reply["NodeNameToMetaVictims"]
    assert set(victims) == {"n1"}
    uids = {p["UID"] for p in victims["n1"]["Pods"]}
    assert uid["hp-2"] not in uids
    assert "cpu-pod-uid" in uids  # no GPUs here: the scheduler's own choice, passed through
    assert uid["lp-0"] in uids and len(uids & {uid["lp-0"], uid["lp-1"], uid["lp-3"]}) == 2
    assert victims["n1"]["NumPDBViolations"] == 0


async def test_preempt_drops_nodes_where_eviction_cannot_help(start: Any, store: MemoryStore) -> None:
    await add_node(store, payloads.gpunode("n1", gpus=2, tiers="LA"))
    lp = await add_pod(
        store,
        payloads.pod(
            "lp", node_name="n1", phase="Running", annotations=payloads.assigned("n1", 0, 1), gpus=2
        ),
    )
    client = await start()
    pod = payloads.pod("r", gpus=2, priority="high", tier="HA", spec_priority=1000)
    reply = await post(client, "preempt", payloads.preemption_args(pod, {"n1": [lp["metadata"]["uid"]]}))
    assert reply == {"NodeNameToMetaVictims": {}}


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("verb", "body", "status", "needle"),
    [
        ("filter", b"{not json", 400, "malformed JSON"),
        ("filter", b"[1, 2]", 400, "must be a JSON object"),
        ("filter", json.dumps({"Pod": payloads.pod("p"), "NodeNames": "n1"}).encode(), 400, "NodeNames"),
        ("filter", json.dumps({"NodeNames": ["n1"]}).encode(), 400, "Pod"),
        ("prioritize", json.dumps({"Pod": "p", "NodeNames": []}).encode(), 400, "Pod"),
        (
            "filter",
            json.dumps(payloads.extender_args(payloads.pod("p", tier="XA"), ["n1"])).encode(),
            400,
            "expected HA, MA or LA",
        ),
        (
            "filter",
            json.dumps(
                payloads.extender_args(payloads.pod("p", annotations={keys.ANN_RECLAIM: "yes"}), [])
            ).encode(),
            400,
            "reclaim",
        ),
        (
            "bind",
            json.dumps({"PodName": "", "PodNamespace": "ml", "PodUID": "u", "Node": "n"}).encode(),
            400,
            "PodName",
        ),
        (
            "preempt",
            json.dumps({"Pod": payloads.pod("p"), "NodeNameToMetaVictims": {"n": 3}}).encode(),
            400,
            "n",
        ),
        # wrong JSON types inside otherwise valid bodies (found by review: these were 500s)
        (
            "filter",
            json.dumps(
                payloads.extender_args(payloads.pod("p", annotations={keys.ANN_GPU_TYPE: ["H20"]}), ["n1"])
            ).encode(),  # type: ignore[dict-item]
            400,
            "must be a string",
        ),
        (
            "prioritize",
            json.dumps(
                payloads.extender_args(payloads.pod("p", annotations={keys.ANN_CHECKPOINT: ["c"]}), ["n1"])
            ).encode(),  # type: ignore[dict-item]
            400,
            "must be a string",
        ),
        (
            "filter",
            json.dumps({"Pod": payloads.pod("p"), "Nodes": {"items": [{"metadata": "n1"}]}}).encode(),
            400,
            "metadata.name",
        ),
        (
            "preempt",
            json.dumps(
                {"Pod": payloads.pod("p"), "NodeNameToVictims": {"n1": {"Pods": [{"metadata": "x"}]}}}
            ).encode(),
            400,
            "metadata.uid",
        ),
        ("score", b"{}", 404, "unknown path"),
        ("filter/extra", b"{}", 404, "unknown path"),
        ("filter", b"\xff\xfe", 400, "malformed JSON"),
        # kube-scheduler's compact envelope with a name that is not UTF-8 (msgspec raises
        # UnicodeDecodeError, not its own error: once a 500)
        ("filter", b'{"Pod":{},"Nodes":null,"NodeNames":["\xff"]}', 400, "malformed JSON"),
        ("prioritize", b'{"Pod":{"a":NaN},"Nodes":null,"NodeNames":["\xff"]}', 400, "malformed JSON"),
    ],
)
async def test_bad_input_gets_a_clear_answer_and_the_server_keeps_serving(
    start: Any,
    store: MemoryStore,
    caplog: pytest.LogCaptureFixture,
    verb: str,
    body: bytes,
    status: int,
    needle: str,
) -> None:
    await seed_cluster(store)
    client = await start()
    with caplog.at_level(logging.WARNING, logger="extender.server"):
        resp = await client.post(f"/{verb}", data=body, headers={"Content-Type": "application/json"})
    assert resp.status == status
    reply = await resp.json()
    assert needle in reply["Error"]
    warned = [r for r in caplog.records if r.name == "extender.server" and r.levelno >= logging.WARNING]
    assert len(warned) == 1  # logged once
    ok = await post(client, "filter", payloads.extender_args(payloads.pod("p"), ["n-free"]))
    assert ok["NodeNames"] == ["n-free"]


async def test_wrong_method_is_405(start: Any, store: MemoryStore) -> None:
    client = await start()
    resp = await client.get("/filter")
    assert resp.status == 405
    assert "allowed POST" in (await resp.json())["Error"]


async def test_body_over_the_limit_is_413(aiohttp_client: Any, store: MemoryStore) -> None:
    settings = make_settings(max_body_bytes=4096)
    client = await aiohttp_client(server.create_app(settings, store))
    await eventually(lambda: client.app[server.INVENTORY].ready)
    body = payloads.extender_args(payloads.pod("p"), [f"node-{i:05d}" for i in range(1000)])
    resp = await client.post("/filter", json=body)
    assert resp.status == 413
    assert "exceeds 4096 bytes" in (await resp.json())["Error"]
    small = await client.post("/filter", json=payloads.extender_args(payloads.pod("web", gpus=0), ["a"]))
    assert small.status == 200


async def test_internal_faults_are_logged_500(
    start: Any, store: MemoryStore, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    await seed_cluster(store)
    client = await start()

    def boom(*args: object, **kwargs: object) -> object:
        raise RuntimeError("boom")

    monkeypatch.setattr(FitArrays, "filter_pools", boom)  # a full filter's computation
    with caplog.at_level(logging.ERROR):
        resp = await client.post("/filter", json=payloads.extender_args(payloads.pod("p"), ["n-free"]))
    assert resp.status == 500
    assert "internal error in filter" in (await resp.json())["Error"]
    assert "boom" in caplog.text


# --------------------------------------------------------------------------- probes and metrics


async def test_healthz_and_readyz(start: Any, store: MemoryStore) -> None:
    await seed_cluster(store)
    client = await start()
    assert (await client.get("/healthz")).status == 200
    resp = await client.get("/readyz")
    assert resp.status == 200
    body = await resp.json()
    assert body["ready"] is True and body["nodes"] == 5 and body["pods"] == 2
    client.app[server.READY_CHECKS]["leader"] = lambda: False
    resp = await client.get("/readyz")
    assert resp.status == 503
    assert (await resp.json())["checks"] == {"inventory": True, "leader": False}


async def test_metrics_expose_latency_decisions_and_inventory(start: Any, store: MemoryStore) -> None:
    await seed_cluster(store)
    client = await start()
    await post(client, "filter", payloads.extender_args(payloads.pod("p", gpus=2, spec_priority=1), ALL))
    await client.post("/filter", data=b"{")
    text = await (await client.get("/metrics")).text()
    assert 'flexlease_extender_request_duration_seconds_count{status="200",verb="filter"} 1.0' in text
    assert 'flexlease_extender_request_duration_seconds_count{status="400",verb="filter"} 1.0' in text
    assert 'flexlease_extender_decisions_total{cause="fits",outcome="success",verb="filter"} 3.0' in text
    assert (
        'flexlease_extender_decisions_total{cause="held_preemptable",outcome="unschedulable",verb="filter"} 1.0'
        in text
    )
    assert 'flexlease_extender_bad_requests_total{reason="bad_json",verb="filter"} 1.0' in text
    assert 'flexlease_extender_gpus{pool="general",state="used",tier="HA",type="NVIDIA H20"} 2.0' in text
    assert 'flexlease_extender_gpus{pool="general",state="lent",tier="HA",type="NVIDIA H20"} 2.0' in text
    assert "flexlease_extender_ready 1.0" in text


async def test_watch_lists_again_after_gone(aiohttp_client: Any, caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    try:
        await add_node(store, payloads.gpunode("n1", gpus=2))
        client = await aiohttp_client(server.create_app(make_settings(), store))
        inv = client.app[server.INVENTORY]
        await eventually(lambda: inv.ready)
        with caplog.at_level(logging.INFO, logger="extender.server"):
            # a burst, then a compaction before the watch caught up (etcd compacts too)
            for i in range(6):
                await add_pod(
                    store,
                    payloads.pod(
                        f"p{i}", node_name="n1", phase="Running", annotations=payloads.assigned("n1", i % 2)
                    ),
                )
            await store.delete(Kind.POD, "p0", namespace="ml", grace_period_seconds=0)
            await store.compact()
            await eventually(lambda: inv.summary()["pods"] == 5)
        assert "watch too old; listing again" in caplog.text
        view = inv.snapshot().get("n1")
        assert view is not None and all(d.holder is not None for d in view.devices)
    finally:
        await store.close()


async def test_extra_contexts_run_with_the_app(aiohttp_client: Any, store: MemoryStore) -> None:
    events: list[str] = []

    async def controller(app: web.Application) -> AsyncIterator[None]:
        assert app[server.INVENTORY] is not None  # the app's parts are there for it
        events.append("start")
        yield
        events.append("stop")

    client = await aiohttp_client(server.create_app(make_settings(), store, extra_contexts=[controller]))
    assert events == ["start"]
    await client.close()
    assert events == ["start", "stop"]


# --------------------------------------------------------------------------- quantities (finding 6)


def with_gpus(value: Any, **kw: Any) -> dict[str, Any]:
    pod = payloads.pod("q", **kw)
    for field in ("limits", "requests"):
        pod["spec"]["containers"][0]["resources"][field][keys.DEFAULT_GPU_RESOURCE] = value
    return pod


async def test_canonical_quantities_are_read_and_absurd_requests_do_not_fit(
    start: Any, store: MemoryStore
) -> None:
    await seed_cluster(store)
    client = await start()
    reply = await post(client, "filter", payloads.extender_args(with_gpus("2k"), ["n-free", "n-busy"]))
    assert reply["NodeNames"] == [] and reply["FailedNodes"] == {}
    assert set(reply["FailedAndUnresolvableNodes"].values()) == {"node(s) had fewer than 2000 GPUs in total"}
    for value in ("1000m", "+1", 1, "1e0"):
        reply = await post(client, "filter", payloads.extender_args(with_gpus(value), ["n-free"]))
        assert reply["NodeNames"] == ["n-free"], value


@pytest.mark.parametrize("value", ["1_000", "１", "1K", "1e", "0.5", "-1", "NaN", True])
async def test_quantities_the_api_server_refuses_are_400(start: Any, store: MemoryStore, value: Any) -> None:
    await seed_cluster(store)
    client = await start()
    resp = await client.post("/filter", json=payloads.extender_args(with_gpus(value), ["n-free"]))
    assert resp.status == 400
    assert "spec.containers[0].resources.limits[nvidia.com/gpu]" in (await resp.json())["Error"]


# --------------------------------------------------------------------------- malformed bodies (finding 7)


def nested(depth: int) -> bytes:
    return b'{"Pod": ' + b"[" * depth + b"]" * depth + b', "NodeNames": []}'


@pytest.mark.parametrize(
    ("body", "headers", "needle"),
    [
        (nested(1000), {}, "nests deeper than 100 levels"),  # RecursionError, was a 500
        (nested(150), {}, "nests deeper than 100 levels"),
        (b'{"Pod": {"metadata": {"name": "p", "x": ' + b"9" * 5000 + b"}}}", {}, "integer literal"),
        (
            json.dumps(
                payloads.extender_args(
                    {**payloads.pod("p"), "metadata": {"name": "p", "ownerReferences": 3}}, []
                )
            ).encode(),
            {},
            "ownerReferences must be a list",
        ),
        (b"garbage, not deflate", {"Content-Encoding": "deflate"}, "cannot read the request body"),
        (b"\x1f\x8b garbage, not gzip", {"Content-Encoding": "gzip"}, "cannot read the request body"),
    ],
)
async def test_malformed_bodies_get_a_4xx_and_no_error_log(
    start: Any,
    store: MemoryStore,
    caplog: pytest.LogCaptureFixture,
    body: bytes,
    headers: dict[str, str],
    needle: str,
) -> None:
    await seed_cluster(store)
    client = await start()
    with caplog.at_level(logging.DEBUG):
        resp = await client.post(
            "/filter", data=body, headers={"Content-Type": "application/json", **headers}
        )
        assert resp.status == 400
        assert needle in (await resp.json())["Error"]
        ok = await post(client, "filter", payloads.extender_args(payloads.pod("p"), ["n-free"]))
    assert ok["NodeNames"] == ["n-free"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_compressed_bodies_are_read(start: Any, store: MemoryStore) -> None:
    await seed_cluster(store)
    client = await start()
    body = gzip.compress(json.dumps(payloads.extender_args(payloads.pod("p"), ["n-free"])).encode())
    resp = await client.post(
        "/filter", data=body, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}
    )
    assert resp.status == 200 and (await resp.json())["NodeNames"] == ["n-free"]


async def test_a_client_hanging_up_mid_body_is_logged_at_debug(
    store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Served as extender.main serves it (an AppRunner: handlers are not cancelled when the
    client goes, unlike aiohttp's TestServer), the body read fails; that is no internal error."""
    await seed_cluster(store)
    app = server.create_app(make_settings(), store)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        await eventually(lambda: app[server.INVENTORY].ready)
        port = runner.addresses[0][1]
        caplog.set_level(logging.DEBUG, logger="extender.server")
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b'POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n{"Pod": ')
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()
        await writer.wait_closed()
        await eventually(lambda: "client disconnected" in caplog.text)
    finally:
        await runner.cleanup()
    (record,) = [r for r in caplog.records if "client disconnected" in r.getMessage()]
    assert record.levelno == logging.DEBUG
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_json_depth() -> None:
    assert body.json_depth(json.loads('{"a": [1, {"b": "[[[{{"}], "c": "\\"[["}')) == 3
    assert body.json_depth([]) == 1 and body.json_depth(7) == 0
    assert body.json_depth([[[[]]], {"a": {"b": [1, "x"]}}]) == 4
    assert body.json_depth([[[[[[]]]]]], stop_above=2) == 3


HUGE_INT: Final = "__huge_int__"
DEEP: Final = "__deep__"
"""Placeholders spliced into the body's text: a 5,000-digit integer, 1,000 nested arrays."""
SPLICE: Final = {json.dumps(HUGE_INT): "9" * 5000, json.dumps(DEEP): "[" * 1000 + "]" * 1000}

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
NASTY = JSON | st.sampled_from(
    [
        HUGE_INT,
        DEEP,
        "2k",
        "1_000",
        "１",
        "+1",
        "1e999999999",
        "NaN",
        "-1",
        "0.5",
        "1Ki",
        10**30,
        -(2**63),
        1e308,
    ]
)
READ_FIELDS: Final = (
    ("Pod", "metadata"),
    ("Pod", "metadata", "name"),
    ("Pod", "metadata", "namespace"),
    ("Pod", "metadata", "uid"),
    ("Pod", "metadata", "labels"),
    ("Pod", "metadata", "labels", keys.LABEL_PRIORITY),
    ("Pod", "metadata", "annotations"),
    ("Pod", "metadata", "annotations", keys.ANN_RELIABILITY),
    ("Pod", "metadata", "ownerReferences"),
    ("Pod", "metadata", "ownerReferences", 0),
    ("Pod", "metadata", "ownerReferences", 0, "name"),
    ("Pod", "metadata", "ownerReferences", 0, "controller"),
    ("Pod", "metadata", "creationTimestamp"),
    ("Pod", "spec"),
    ("Pod", "spec", "containers"),
    ("Pod", "spec", "containers", 0),
    ("Pod", "spec", "containers", 0, "image"),
    ("Pod", "spec", "containers", 0, "resources"),
    ("Pod", "spec", "containers", 0, "resources", "limits"),
    ("Pod", "spec", "containers", 0, "resources", "limits", keys.DEFAULT_GPU_RESOURCE),
    ("Pod", "spec", "nodeName"),
    ("Pod", "spec", "priority"),
    ("Pod", "spec", "preemptionPolicy"),
    ("Pod", "status"),
    ("Pod", "status", "phase"),
    ("NodeNameToVictims", "n-busy", "Pods", 0, "metadata"),
    ("NodeNameToVictims", "n-busy", "Pods", 0, "metadata", "labels"),
    ("NodeNameToVictims", "n-busy", "Pods", 0, "metadata", "uid"),
    ("NodeNameToVictims", "n-busy", "Pods", 0, "metadata", "labels", keys.LABEL_ROLE),
    ("NodeNameToVictims", "n-busy", "Pods", 0, "metadata", "labels", keys.LABEL_FRAMEWORK),
)
"""Fields of the embedded Pod the extender reads: the fuzzer aims there half the time."""


def paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into ``obj`` (dict keys and list indices), the root included."""
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += paths(v, (*prefix, i))
    return out


def mutate(obj: Any, path: tuple[Any, ...], value: Any, *, delete: bool) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(obj, dict):
        out = dict(obj)
        if delete and not rest:
            del out[head]
        else:
            out[head] = mutate(obj[head], rest, value, delete=delete)
        return out
    out_list = list(obj)
    out_list[head] = mutate(obj[head], rest, value, delete=delete)
    return out_list


def valid_bodies() -> dict[str, Any]:
    pod = payloads.pod("f", gpus=2, priority="high", owner="online", tier="HA", spec_priority=1000)
    victim = payloads.pod("v", uid="u-1", node_name="n-busy")
    victim["metadata"]["labels"].update({keys.LABEL_ROLE: "worker", keys.LABEL_FRAMEWORK: "mpi"})
    return {
        "filter": payloads.extender_args(pod, ALL),
        "prioritize": payloads.extender_args(pod, ALL),
        "preempt": payloads.preemption_args(pod, {"n-busy": ["u-1", "u-2"]}),
        # nodeCacheCapable off: whole victim pods, whose role labels /preempt reads
        "preempt:full": {
            "Pod": pod,
            "NodeNameToVictims": {"n-busy": {"Pods": [victim], "NumPDBViolations": 0}},
        },
        "bind": payloads.binding_args(pod, "n-free"),
    }


FUZZ_SERVER: dict[int, Client] = {}
"""The fuzz test's server, by ``id(store)``: hypothesis runs every example on one server."""


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
async def test_fuzzed_wire_bodies_never_get_a_5xx(
    start: Any, store: MemoryStore, data: st.DataObject
) -> None:
    """Finding 7: bodies mutated anywhere in the wire models (and the embedded Pod) get a
    200 or a 4xx with a message, never a 5xx."""
    if id(store) not in FUZZ_SERVER:  # one server per test run; hypothesis draws many bodies
        FUZZ_SERVER.clear()
        await seed_cluster(store)
        FUZZ_SERVER[id(store)] = await start()
    client = FUZZ_SERVER[id(store)]
    verb = data.draw(st.sampled_from(sorted(valid_bodies())))
    body = valid_bodies()[verb]
    for _ in range(data.draw(st.integers(1, 3))):
        reachable = paths(body)
        aimed = [p for p in READ_FIELDS if p in reachable]
        path = data.draw(
            st.sampled_from(aimed) | st.sampled_from(reachable) if aimed else st.sampled_from(reachable)
        )
        body = mutate(body, path, data.draw(NASTY), delete=bool(path) and data.draw(st.booleans()))
    text = json.dumps(body)
    for placeholder, raw in SPLICE.items():
        text = text.replace(placeholder, raw)
    path = verb.split(":")[0]
    resp = await client.post(f"/{path}", data=text, headers={"Content-Type": "application/json"})
    assert resp.status < 500, await resp.text()
    if resp.status >= 400:
        assert (await resp.json())["Error"]


# --------------------------------------------------------------------------- reasons (finding 8)


def fit_error(total: int, reply: dict[str, Any]) -> str:
    """kube-scheduler's FitError message: each distinct reason prefixed by its node count,
    sorted (pkg/scheduler/framework/types.go, FitError.Error)."""
    counts: dict[str, int] = {}
    for reason in [*reply["FailedNodes"].values(), *reply["FailedAndUnresolvableNodes"].values()]:
        counts[reason] = counts.get(reason, 0) + 1
    parts = sorted(f"{n} {reason}" for reason, n in counts.items())
    return f"0/{total} nodes are available: {', '.join(parts)}."


async def test_reasons_read_well_in_the_schedulers_aggregation_and_say_whether_preemption_helps(
    start: Any, store: MemoryStore
) -> None:
    names = [f"gpu-node-{i}" for i in range(4)]
    for n in names:
        await add_node(store, payloads.gpunode(n, gpus=2))
        await add_pod(
            store,
            payloads.pod(
                f"lp-{n}", gpus=2, node_name=n, phase="Running", annotations=payloads.assigned(n, 0, 1)
            ),
        )
    client = await start()
    await eventually(lambda: client.app[server.INVENTORY].summary()["pods"] == 4)
    # a low-priority pod of the same priority cannot preempt: unresolvable, no futile pass
    lp = payloads.pod("lp-new", gpus=1, tier="HA", gpu_type=payloads.H20)
    reply = await post(client, "filter", payloads.extender_args(lp, names))
    assert reply["FailedNodes"] == {}
    assert fit_error(4, reply) == (
        "0/4 nodes are available: 4 node(s) had no free GPU of type NVIDIA H20 at tier HA or above; "
        "pods this pod cannot preempt hold the rest."
    )
    hp = payloads.pod("hp", gpus=2, priority="high", spec_priority=1000)
    reply = await post(client, "filter", payloads.extender_args(hp, names))
    assert set(reply["FailedNodes"]) == set(names)
    assert fit_error(4, reply) == (
        "0/4 nodes are available: 4 node(s) had fewer than 2 free GPUs; preemptable lower-priority pods hold the rest."
    )
    never = payloads.pod("never", gpus=1, priority="high", spec_priority=1000)
    never["spec"]["preemptionPolicy"] = "Never"
    reply = await post(client, "filter", payloads.extender_args(never, names))
    assert reply["FailedNodes"] == {} and len(reply["FailedAndUnresolvableNodes"]) == 4


@pytest.mark.parametrize(
    "literal",
    [
        b"NaN",  # Python's json reads it, orjson refuses it
        b'"\\ud800"',  # a lone surrogate: likewise
        b"-9223372036854775809",  # below int64 but 20 characters: within MAX_JSON_INT_DIGITS
        b"18446744073709551615",  # uint64's largest: both decoders read it
    ],
)
async def test_fast_decoder_accepts_what_the_reference_decoder_accepts(
    start: Any, store: MemoryStore, literal: bytes
) -> None:
    """Bodies are decoded by orjson first and by the reference decoder when orjson refuses
    them: the extender accepts what it accepted before."""
    await seed_cluster(store)
    client = await start()
    args = json.dumps(payloads.extender_args(payloads.pod("p"), ["n-free"])).encode()
    body = args.replace(b'"metadata": {', b'"metadata": {"x": ' + literal + b", ", 1)
    assert body != args
    resp = await client.post("/filter", data=body, headers={"Content-Type": "application/json"})
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["NodeNames"] == ["n-free"]
