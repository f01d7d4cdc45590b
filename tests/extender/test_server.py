"""The extender over real HTTP (pytest-aiohttp), with bodies shaped as kube-scheduler sends them."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from extender import server
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
    await store.delete(Kind.POD, "lp-1", namespace="ml")
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

    monkeypatch.setattr(server.scheduling, "filter_nodes", boom)
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
    assert 'flexlease_extender_gpus{state="used",tier="HA",type="NVIDIA H20"} 2.0' in text
    assert 'flexlease_extender_gpus{state="lent",tier="HA",type="NVIDIA H20"} 2.0' in text
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
            await store.delete(Kind.POD, "p0", namespace="ml")
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
