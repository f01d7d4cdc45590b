"""KubeStore against the stand-in API server: the store contract, the wire format, error
mapping, paging, watch resumption (server timeouts, dropped connections, restarts, 410),
the client-side pod filter and timeouts."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import aiohttp
import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from flexlease.config import StoreSettings
from flexlease.errors import Conflict, Gone, NotFound, StoreError, TooManyRequests
from flexlease.store import kube as kube_module
from flexlease.store.base import EventType, JsonObj, Kind, Selector, Store, WatchEvent
from flexlease.store.informer import Backoff as InformerBackoff
from flexlease.store.informer import Informer, object_key
from flexlease.store.kube import Backoff, KubeStore
from flexlease.store.kube_filter import ManagedPods
from flexlease.store.kube_resources import RESOURCES
from standins.apiserver import FakeApiServer, Recorded
from tests.extender import payloads
from tests.store.contract import (
    NS,
    StoreContract,
    make_gpunode,
    make_pdb,
    make_pod,
    next_events,
    no_more_events,
    rv,
    summary,
    watching,
)
from tests.store.fake_apiserver_payloads import gpunode, replicaset_pod

SETTINGS = StoreSettings(kind="kube", request_timeout_seconds=5.0, watch_timeout_seconds=30.0)
FAST = Backoff(initial=0.02, maximum=0.2, jitter=0.0)


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(bookmark_interval=0.05) as server:
        yield server


@contextlib.asynccontextmanager
async def kube_store(
    api: FakeApiServer, settings: StoreSettings = SETTINGS, **kwargs: object
) -> AsyncIterator[KubeStore]:
    store = KubeStore.for_host(api.url, settings, reconnect=FAST, **kwargs)  # type: ignore[arg-type]
    try:
        yield store
    finally:
        await store.close()


async def eventually(condition: Callable[[], bool], *, within: float = 5.0) -> None:
    """Wait until ``condition()`` holds (polled every 10 ms); TimeoutError after ``within`` s."""
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110 - polls state owned by another component
            await asyncio.sleep(0.01)


def watch_requests(api: FakeApiServer) -> list[Recorded]:
    return [r for r in api.requests if r.method == "GET" and r.query.get("watch") == "1"]


class TestKubeStore(StoreContract):
    """The shared store contract, against the stand-in API server."""

    @pytest.fixture
    async def store(self, api: FakeApiServer) -> AsyncIterator[Store]:
        self.api = api
        api.kubelet_confirms_deletion = (
            False  # graceful deletion waits for grace 0, as the embedded stores do
        )
        async with kube_store(api) as s:
            yield s

    async def compact(self, store: Store) -> None:
        self.api.compact()


# -- what only a real API server does --------------------------------------------------------


async def test_pod_spec_updates_are_validated(api: FakeApiServer) -> None:
    """ValidatePodUpdate: replacing the container list with one that drops ``resources`` is
    refused (422) and nothing is written; an image change with the full list is accepted."""
    async with kube_store(api) as store:
        created = await store.create(Kind.POD, make_pod("p1"))
        with pytest.raises(StoreError) as refused:
            await store.patch(
                Kind.POD,
                "p1",
                {"spec": {"containers": [{"name": "main", "image": "registry.local/train:3"}]}},
                namespace=NS,
            )
        assert refused.value.status == 422 and "Forbidden" in str(refused.value)
        assert await store.get(Kind.POD, "p1", namespace=NS) == created
        containers = [dict(c, image="registry.local/train:2") for c in created["spec"]["containers"]]
        patched = await store.patch(Kind.POD, "p1", {"spec": {"containers": containers}}, namespace=NS)
        assert patched["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}


async def test_bound_pods_terminate_gracefully(api: FakeApiServer) -> None:
    """Deleting or evicting a Pod on a node shows a MODIFIED with ``deletionTimestamp`` and
    ``deletionGracePeriodSeconds`` before the DELETED (kubelet confirms); an unbound Pod goes
    at once."""
    async with kube_store(api) as store:
        await store.create(Kind.POD, make_pod("bound", node="gpu-1"))
        await store.create(Kind.POD, make_pod("evicted", node="gpu-1"))
        await store.create(Kind.POD, make_pod("unbound"))
        start = (await store.list(Kind.POD)).resource_version
        async with watching(store, Kind.POD, start) as watch:
            await store.delete(Kind.POD, "bound", namespace=NS)
            await store.evict(NS, "evicted", grace_period_seconds=12)
            await store.delete(Kind.POD, "unbound", namespace=NS)
            events: list[WatchEvent] = []
            async with asyncio.timeout(5):
                while len(events) < 5:
                    event = await anext(watch)
                    if event.type is not EventType.BOOKMARK:
                        events.append(event)
    assert summary(events) == [
        ("MODIFIED", "bound"),
        ("DELETED", "bound"),
        ("MODIFIED", "evicted"),
        ("DELETED", "evicted"),
        ("DELETED", "unbound"),
    ]
    assert events[0].object["metadata"]["deletionGracePeriodSeconds"] == 30
    assert events[2].object["metadata"]["deletionGracePeriodSeconds"] == 12


# -- the wire ----------------------------------------------------------------------------------


async def test_requests_are_kubernetes_api_calls(api: FakeApiServer) -> None:
    async with kube_store(api) as store:
        created = await store.create(Kind.POD, make_pod("p1"))
        patch: JsonObj = {"metadata": {"annotations": {"flexlease.io/assigned-gpus": "gpu-1:0"}}}
        await store.patch(
            Kind.POD, "p1", patch, namespace=NS, resource_version=created["metadata"]["resourceVersion"]
        )
        assert patch == {
            "metadata": {"annotations": {"flexlease.io/assigned-gpus": "gpu-1:0"}}
        }  # not mutated
        await store.bind(NS, "p1", uid=created["metadata"]["uid"], node="gpu-1")
        await store.create(Kind.GPUNODE, make_gpunode("gpu-1"))
        await store.patch(Kind.GPUNODE, "gpu-1", {"status": {"nodeIP": "10.0.0.1"}}, subresource="status")
        listed = await store.list(
            Kind.POD, selector=Selector(labels={"a": "b"}, fields={"spec.nodeName": "x,y"})
        )
        async with watching(store, Kind.POD, listed.resource_version) as watch:
            await store.evict(NS, "p1", grace_period_seconds=15)
            await next_events(watch, 1)

    by = {(r.method, r.path): r for r in api.requests}
    post = by[("POST", "/api/v1/namespaces/team-a/pods")]
    assert post.query["fieldManager"] == "flexlease"
    assert post.headers["User-Agent"].startswith("flexlease/")
    assert json.loads(post.body)["kind"] == "Pod"

    patch_req = by[("PATCH", "/api/v1/namespaces/team-a/pods/p1")]
    assert patch_req.headers["Content-Type"] == "application/merge-patch+json"
    assert json.loads(patch_req.body) == {
        "metadata": {
            "annotations": {"flexlease.io/assigned-gpus": "gpu-1:0"},
            "resourceVersion": created["metadata"]["resourceVersion"],
        }
    }
    binding = json.loads(by[("POST", "/api/v1/namespaces/team-a/pods/p1/binding")].body)
    assert binding == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p1", "namespace": NS, "uid": created["metadata"]["uid"]},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-1"},
    }
    assert ("PATCH", "/apis/flexlease.io/v1alpha1/gpunodes/gpu-1/status") in by
    eviction = json.loads(by[("POST", "/api/v1/namespaces/team-a/pods/p1/eviction")].body)
    assert eviction == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "p1", "namespace": NS},
        "deleteOptions": {"gracePeriodSeconds": 15},
    }
    listing = next(
        r for r in api.requests if r.method == "GET" and r.path == "/api/v1/pods" and "watch" not in r.query
    )
    assert listing.query == {"labelSelector": "a=b", "fieldSelector": "spec.nodeName=x\\,y", "limit": "500"}
    (watch_req,) = watch_requests(api)
    assert watch_req.query["resourceVersion"] == listed.resource_version
    assert watch_req.query["allowWatchBookmarks"] == "true"
    assert watch_req.query["timeoutSeconds"] == "30"


async def test_json_is_kept_as_the_server_sent_it(api: FakeApiServer) -> None:
    """Full objects (managedFields, ownerReferences, status, nulls, CR status) come back
    unchanged; list items, which the API server sends without kind/apiVersion for built-in
    kinds, get them filled in."""
    held = api.put(replicaset_pod("trainer-7d9c6b8f5-abcde", gpus=2))
    node = api.put(gpunode("gpu-node-1"), manager="flexlease-agent")
    async with aiohttp.ClientSession() as raw, raw.get(f"{api.url}/api/v1/namespaces/team-a/pods") as resp:
        raw_list = await resp.json()
    assert raw_list["kind"] == "PodList" and "kind" not in raw_list["items"][0]
    async with kube_store(api) as store:
        got = await store.get(Kind.POD, held["metadata"]["name"], namespace="team-a")
        listed = await store.list(Kind.POD, namespace="team-a")
        got_node = await store.get(Kind.GPUNODE, "gpu-node-1")
    assert got == held
    assert listed.items == [held]
    assert listed.resource_version == str(api.resource_version)
    assert got["status"]["conditions"][0]["lastProbeTime"] is None
    assert got["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    assert got_node == node and got_node["status"]["devices"]["7"]["lastXid"] is None


# -- errors ------------------------------------------------------------------------------------


async def test_http_failures_map_to_flexlease_errors_with_the_cause(api: FakeApiServer) -> None:
    async with kube_store(api) as store:
        with pytest.raises(NotFound) as missing:
            await store.get(Kind.POD, "nope", namespace=NS)
        cause = missing.value.__cause__
        assert isinstance(cause, ApiException) and cause.status == 404
        assert 'pods "nope" not found' in str(missing.value)

        await store.create(Kind.POD, make_pod("p1"))
        with pytest.raises(Conflict) as exists:
            await store.create(Kind.POD, make_pod("p1"))
        assert isinstance(exists.value.__cause__, ApiException) and "already exists" in str(exists.value)

        api.fail(500, method="GET")
        with pytest.raises(StoreError) as internal:
            await store.get(Kind.POD, "p1", namespace=NS)
        assert type(internal.value) is StoreError and internal.value.status == 500

        api.fail(429, path_contains="/eviction", retry_after=7)
        with pytest.raises(TooManyRequests) as throttled:
            await store.evict(NS, "p1")
        assert throttled.value.retry_after == 7.0

        api.fail(404, path_contains="/gpuleases")  # the CRD is not installed
        with pytest.raises(NotFound):
            await store.list(Kind.GPULEASE)

        with pytest.raises(StoreError) as no_namespace:
            await store.create(Kind.POD, {"metadata": {"name": "x"}, "spec": {}})
        assert no_namespace.value.status == 400


@contextlib.asynccontextmanager
async def _answering(
    status: int, body: bytes, headers: dict[str, str] | None = None
) -> AsyncIterator[KubeStore]:
    """A KubeStore whose API server answers every request with ``status``, ``body`` and
    ``headers``."""

    async def answer(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(
            status=status, body=body, content_type="application/json", headers=headers
        )

    app = aiohttp.web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    store = KubeStore.for_host(f"http://127.0.0.1:{port}", SETTINGS)
    try:
        yield store
    finally:
        await store.close()
        await runner.cleanup()


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (200, b"<html>proxy error</html>", "the response is not JSON"),
        (200, b"[1, 2]", "expected a JSON object, got list"),
        (204, b"", "expected a JSON object"),
        (200, b"", "the response is not JSON"),
    ],
)
async def test_a_response_that_is_not_a_json_object_is_a_store_error(
    status: int, body: bytes, message: str
) -> None:
    async with _answering(status, body) as store:
        with pytest.raises(StoreError, match=message):
            await store.get(Kind.POD, "p", namespace=NS)


async def test_responses_are_read_as_json_reads_them() -> None:
    """Integers beyond 64 bits stay integers (orjson alone reads them as floats); a response
    orjson refuses (NaN) is read as json reads it."""
    text = b'{"metadata": {"name": "p", "generation": 123456789012345678901234}, "spec": {"x": NaN}}'
    async with _answering(200, text) as store:
        got = await store.get(Kind.POD, "p", namespace=NS)
    assert got["metadata"]["generation"] == 123456789012345678901234
    assert json.dumps(got["spec"]) == '{"x": NaN}'


async def test_retry_after_is_read_from_the_header_alone() -> None:
    status = b'{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","code":429}'
    async with _answering(429, status, {"Retry-After": "7"}) as store:
        with pytest.raises(TooManyRequests) as throttled:
            await store.evict(NS, "p")
    assert throttled.value.retry_after == 7.0


def test_watch_lines_are_read_as_json_reads_them() -> None:
    """A watch line holding an integer beyond 64 bits or NaN decodes as ``json.loads`` reads
    it (orjson alone: a float, or a refused line and a broken stream)."""
    line = b'{"type":"MODIFIED","object":{"metadata":{"name":"p","generation":123456789012345678901234},"x":NaN}}'
    event = kube_module._decode_event(RESOURCES[Kind.POD], line, "7")
    assert event.type is EventType.MODIFIED
    assert event.object["metadata"]["generation"] == 123456789012345678901234
    assert json.dumps(event.object["x"]) == "NaN"


async def test_pod_disruption_budget_refusal_is_too_many_requests(api: FakeApiServer) -> None:
    api.put(replicaset_pod("a", namespace=NS, labels={"role": "worker"}))
    api.put(replicaset_pod("b", namespace=NS, labels={"role": "worker"}))
    async with kube_store(api) as store:
        pdb = make_pdb("workers", match={"role": "worker"})
        pdb["spec"]["minAvailable"] = 2
        await store.create(Kind.PDB, pdb)
        with pytest.raises(TooManyRequests) as refused:
            await store.evict(NS, "a")
        assert refused.value.retry_after is None
        assert "disruption budget" in str(refused.value)
        await store.patch(Kind.PDB, "workers", {"spec": {"minAvailable": 1}}, namespace=NS)
        status = (await store.get(Kind.PDB, "workers", namespace=NS))["status"]
        assert (status["currentHealthy"], status["desiredHealthy"], status["disruptionsAllowed"]) == (2, 1, 1)
        await store.evict(NS, "a")
        with pytest.raises(TooManyRequests):
            await store.evict(NS, "b")


async def test_wrong_credentials_are_a_store_error() -> None:
    async with FakeApiServer(token="s3cret") as api:
        async with kube_store(api) as anonymous:
            with pytest.raises(StoreError) as denied:
                await anonymous.list(Kind.POD)
        assert denied.value.status == 401
        store = KubeStore.for_host(api.url, SETTINGS, token="s3cret")
        try:
            assert (await store.list(Kind.POD)).items == []
        finally:
            await store.close()
        assert api.requests[-1].headers["Authorization"] == "Bearer s3cret"


async def test_closed_store_refuses_calls(api: FakeApiServer) -> None:
    async with kube_store(api) as store:
        pass
    with pytest.raises(StoreError):
        await store.list(Kind.POD)


# -- paging ------------------------------------------------------------------------------------


async def test_list_reads_pages_of_one_snapshot(api: FakeApiServer) -> None:
    for i in range(5):
        api.put(replicaset_pod(f"p{i}", namespace=NS))
    async with kube_store(api, list_page_size=2) as store:
        first = await store.list(Kind.POD)
        pages = [r for r in api.requests if r.path == "/api/v1/pods"]
        assert [r.query.get("limit") for r in pages] == ["2", "2", "2"]
        assert "continue" not in pages[0].query and "continue" in pages[2].query
        assert sorted(o["metadata"]["name"] for o in first.items) == [f"p{i}" for i in range(5)]
        assert first.resource_version == str(api.resource_version)

        api.requests.clear()
        api.fail(410, path_contains="continue=")  # the continue token expired between pages
        again = await store.list(Kind.POD)
        assert sorted(o["metadata"]["name"] for o in again.items) == [f"p{i}" for i in range(5)]
        assert "limit" not in api.requests[-1].query  # fell back to one unpaged list


# -- watch resumption --------------------------------------------------------------------------


async def test_watch_resumes_when_the_server_ends_the_stream(api: FakeApiServer) -> None:
    settings = StoreSettings(kind="kube", request_timeout_seconds=5.0, watch_timeout_seconds=1.0)
    async with kube_store(api, settings) as store:
        start = (await store.list(Kind.POD)).resource_version
        async with watching(store, Kind.POD, start) as watch:
            await store.create(Kind.POD, make_pod("a"))
            first = await next_events(watch, 1)
            await no_more_events(watch, wait=1.3)  # the server closes the stream after 1 s
            assert len(watch_requests(api)) == 2
            await store.create(Kind.POD, make_pod("b"))
            second = await next_events(watch, 1)
            await no_more_events(watch, wait=0.2)
    assert summary(first + second) == [("ADDED", "a"), ("ADDED", "b")]
    resumed = watch_requests(api)[1].query["resourceVersion"]
    assert int(resumed) >= rv(first[0].object)


async def test_watch_resumes_after_a_dropped_connection(api: FakeApiServer) -> None:
    async with kube_store(api) as store:
        start = (await store.list(Kind.POD)).resource_version
        async with watching(store, Kind.POD, start) as watch:
            a = await store.create(Kind.POD, make_pod("a"))
            await next_events(watch, 1)
            api.fail(503, path_contains="watch=1", times=3)  # reconnects are refused a while
            assert api.drop_watches() == 1
            b = await store.create(Kind.POD, make_pod("b"))
            await store.patch(Kind.POD, "a", {"metadata": {"labels": {"x": "1"}}}, namespace=NS)
            await store.delete(Kind.POD, "b", namespace=NS)
            events = await next_events(watch, 3)
            await no_more_events(watch, wait=0.2)
    assert summary(events) == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
    assert events[0].object == b
    resumed = watch_requests(api)[-1].query["resourceVersion"]
    assert int(resumed) >= rv(a)
    assert len(watch_requests(api)) >= 5  # the first, three refused, the one that worked


async def test_watch_gone_as_http_status_and_as_error_event(api: FakeApiServer) -> None:
    async with kube_store(api) as store:
        old = (await store.create(Kind.POD, make_pod("a")))["metadata"]["resourceVersion"]
        await store.patch(Kind.POD, "a", {"metadata": {"labels": {"x": "1"}}}, namespace=NS)
        api.compact()
        for as_status in (False, True):
            api.gone_as_http_status = as_status
            with pytest.raises(Gone) as gone:
                async with watching(store, Kind.POD, old) as watch:
                    await anext(watch)
            cause = gone.value.__cause__
            assert isinstance(cause, ApiException) and cause.status == 410
            assert "too old resource version" in str(gone.value)


async def test_watch_raises_on_permanent_errors(api: FakeApiServer) -> None:
    async with kube_store(api) as store:
        api.fail(403, path_contains="watch=1")
        with pytest.raises(StoreError) as forbidden:
            async with watching(store, Kind.POD, "1") as watch:
                await anext(watch)
        assert forbidden.value.status == 403


async def test_bookmarks_carry_the_latest_version(api: FakeApiServer) -> None:
    async with kube_store(api) as store:
        start = (await store.list(Kind.POD)).resource_version
        await store.create(Kind.GPUNODE, make_gpunode("gpu-1"))  # another kind moves the version on
        async with watching(store, Kind.POD, start) as watch:
            async with asyncio.timeout(5):
                event = await anext(watch)
                while int(event.resource_version) <= int(start):
                    event = await anext(watch)
    assert event.type is EventType.BOOKMARK
    assert event.resource_version == str(api.resource_version)


async def test_close_ends_a_watch_waiting_to_reconnect(api: FakeApiServer) -> None:
    slow = Backoff(initial=30.0, maximum=30.0, jitter=0.0)
    store = KubeStore.for_host(api.url, SETTINGS, reconnect=slow)
    api.fail(503, path_contains="watch=1", times=10)
    seen: list[WatchEvent] = []

    async def consume() -> None:
        async for event in store.watch(Kind.POD, resource_version="1"):
            seen.append(event)

    task = asyncio.create_task(consume(), name="watch-consumer")
    await eventually(lambda: bool(watch_requests(api)))
    await store.close()
    async with asyncio.timeout(10):  # a hang guard, not a speed bound
        await task
    requests_at_close = len(watch_requests(api))
    await asyncio.sleep(0)
    assert seen == [] and len(watch_requests(api)) == requests_at_close  # no retry after close


# -- the restart test: nothing lost, nothing doubled -------------------------------------------


class Inventory:
    """An informer handler that checks every event against what it holds: an ADDED for a
    held object, a DELETED for an unknown one, or a MODIFIED that goes back in time fails."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], JsonObj] = {}
        self.events: list[tuple[str, str]] = []

    async def __call__(self, event: WatchEvent) -> None:
        key = object_key(event.object)
        self.events.append((event.type.value, key[1]))
        held = self.objects.get(key)
        if event.type is EventType.ADDED:
            assert held is None, f"doubled: {key}"
            self.objects[key] = event.object
        elif event.type is EventType.MODIFIED:
            assert held is not None, f"modified before added: {key}"
            assert rv(event.object) > rv(held), f"stale event for {key}"
            self.objects[key] = event.object
        else:
            assert held is not None, f"deleted twice: {key}"
            del self.objects[key]

    def versions(self) -> dict[tuple[str, str], str]:
        return {k: o["metadata"]["resourceVersion"] for k, o in self.objects.items()}


async def test_restart_mid_stream_ends_with_the_same_inventory_as_a_fresh_list(api: FakeApiServer) -> None:
    """The API server restarts under a running informer; while it is down pods change, one
    is recreated under its old name, and history is compacted, so the resumed watch gets
    410 and the informer lists again. Its inventory then equals a fresh list."""
    for i in range(6):
        api.put(replicaset_pod(f"trainer-{i}", gpus=1 + i % 2))
    inventory = Inventory()
    async with kube_store(api) as store:
        informer = Informer(
            store, Kind.POD, handler=inventory, backoff=InformerBackoff(initial=0.02, maximum=0.2)
        )
        async with informer.running():
            async with asyncio.timeout(5):
                await informer.listed.wait()
            live = api.put(
                replicaset_pod("trainer-0", annotations={"flexlease.io/assigned-gpus": "gpu-node-1:0"})
            )
            await eventually(
                lambda: (
                    inventory.versions().get(("team-a", "trainer-0")) == live["metadata"]["resourceVersion"]
                )
            )
            recreated_uid = ""

            def while_down() -> None:
                nonlocal recreated_uid
                api.put(
                    replicaset_pod("trainer-1", annotations={"flexlease.io/assigned-gpus": "gpu-node-1:1"})
                )
                api.remove("Pod", "trainer-2", "team-a")
                api.put(replicaset_pod("trainer-new", node="gpu-node-2"))
                api.remove("Pod", "trainer-3", "team-a")
                recreated_uid = api.put(replicaset_pod("trainer-3", node="gpu-node-2"))["metadata"]["uid"]
                api.compact()

            await api.restart(down_seconds=0.2, during=while_down)
            fresh = await store.list(Kind.POD)
            want = {object_key(o): o["metadata"]["resourceVersion"] for o in fresh.items}
            await eventually(lambda: inventory.versions() == want, within=10)
            assert informer.lists == 2
    assert inventory.objects[("team-a", "trainer-3")]["metadata"]["uid"] == recreated_uid
    after_restart = inventory.events[inventory.events.index(("MODIFIED", "trainer-0")) + 1 :]
    assert sorted(after_restart) == sorted(
        [
            ("DELETED", "trainer-2"),
            ("DELETED", "trainer-3"),
            ("MODIFIED", "trainer-1"),
            ("ADDED", "trainer-3"),
            ("ADDED", "trainer-new"),
        ]
    )


# -- the client-side pod filter -----------------------------------------------------------------


async def test_pod_filter_keeps_gpu_pods_and_rewrites_transitions(api: FakeApiServer) -> None:
    gpu_nodes = {"gpu-node-1"}
    api.put(replicaset_pod("gpu", gpus=1, node="gpu-node-1"))
    api.put(replicaset_pod("cpu-on-gpu-node", gpus=0, node="gpu-node-1"))
    api.put(replicaset_pod("tagged", gpus=0, node="cpu-1", annotations={"flexlease.io/checkpoint": "ck-1"}))
    api.put(replicaset_pod("plain", gpus=0, node="cpu-1"))
    async with kube_store(api, pod_filter=ManagedPods(gpu_nodes=lambda: gpu_nodes)) as store:
        listed = await store.list(Kind.POD)
        assert sorted(o["metadata"]["name"] for o in listed.items) == ["cpu-on-gpu-node", "gpu", "tagged"]
        async with watching(store, Kind.POD, listed.resource_version) as watch:
            api.put(replicaset_pod("other-plain", gpus=0, node="cpu-1"))  # never matches: unseen
            api.put(
                replicaset_pod("plain", gpus=0, node="cpu-1", annotations={"flexlease.io/checkpoint": "c"})
            )
            api.put(replicaset_pod("plain", gpus=0, node="cpu-1"))  # stops matching
            api.put(replicaset_pod("plain", gpus=0, node="cpu-1", labels={"v": "2"}))  # still not
            api.put(replicaset_pod("tagged", gpus=0, node="cpu-1"))  # listed, stops matching
            api.put(replicaset_pod("gpu", gpus=1, node="gpu-node-1", labels={"v": "2"}))
            api.remove("Pod", "other-plain", "team-a")  # never matched: unseen
            api.remove("Pod", "gpu", "team-a")
            events = await next_events(watch, 5)
            await no_more_events(watch, wait=0.2)
    assert summary(events) == [
        ("ADDED", "plain"),
        ("DELETED", "plain"),
        ("DELETED", "tagged"),
        ("MODIFIED", "gpu"),
        ("DELETED", "gpu"),
    ]


# -- timeouts ----------------------------------------------------------------------------------


async def test_every_request_has_a_deadline(api: FakeApiServer) -> None:
    settings = StoreSettings(kind="kube", request_timeout_seconds=0.3, watch_timeout_seconds=30.0)
    async with kube_store(api, settings) as store:
        await store.create(Kind.POD, make_pod("p1"))
        api.stall(30.0, method="GET", path_contains="/pods/p1")  # far beyond the hang guard below
        async with asyncio.timeout(10):
            with pytest.raises(StoreError) as slow:
                await store.get(Kind.POD, "p1", namespace=NS)
        assert isinstance(slow.value.__cause__, TimeoutError)
        assert "no answer within 0.3 s" in str(slow.value)


async def test_a_silent_watch_is_abandoned_and_reopened(api: FakeApiServer) -> None:
    """The first watch request hangs; the client gives up after timeoutSeconds plus the
    request timeout and opens a new one, which delivers."""
    settings = StoreSettings(kind="kube", request_timeout_seconds=0.3, watch_timeout_seconds=1.0)
    async with kube_store(api, settings) as store:
        start = (await store.list(Kind.POD)).resource_version
        api.stall(60.0, path_contains="watch=1")  # the first watch would hang past the test
        async with watching(store, Kind.POD, start) as watch:
            await store.create(Kind.POD, make_pod("a"))
            async with asyncio.timeout(20):  # a hang guard, not a speed bound
                event = await anext(watch)
                while event.type is EventType.BOOKMARK:
                    event = await anext(watch)
        assert event.object["metadata"]["name"] == "a"
        opened = watch_requests(api)
        assert len(opened) >= 2  # the silent one was abandoned and a new one opened
        assert opened[0].query.get("timeoutSeconds") == "1"


async def test_nodes_are_read_from_the_core_api(api: FakeApiServer) -> None:
    """``/bind`` checks that a node exists (issue #18): a cluster-scoped core/v1 GET."""
    async with kube_store(api) as store:
        await store.create(Kind.NODE, payloads.node("cpu-0"))
        got = await store.get(Kind.NODE, "cpu-0", namespace="ignored")
        assert got["spec"]["providerID"] == "kind://docker/cluster/cpu-0"
        with pytest.raises(NotFound):
            await store.get(Kind.NODE, "ghost")
    paths = [(r.method, r.path) for r in api.requests]
    assert ("GET", "/api/v1/nodes/cpu-0") in paths
    assert ("GET", "/api/v1/nodes/ghost") in paths


async def test_a_binding_carries_resource_version_and_uid_preconditions(api: FakeApiServer) -> None:
    """The stand-in checks a Binding's ``metadata.uid`` and ``metadata.resourceVersion`` against
    the pod, as the API server's BindingREST does (409 with storage's precondition message)."""
    async with kube_store(api) as store:
        created = await store.create(Kind.POD, make_pod("p1"))
    path = f"{api.url}/api/v1/namespaces/{NS}/pods/p1/binding"

    def binding(**meta: str) -> JsonObj:
        return {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "p1", "namespace": NS, **meta},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-1"},
        }

    async with aiohttp.ClientSession() as http:
        async with http.post(path, json=binding(resourceVersion="1")) as resp:
            status = await resp.json()
            assert resp.status == 409 and status["reason"] == "Conflict"
            assert "Precondition failed: ResourceVersion in precondition: 1" in status["message"]
        async with http.post(
            path, json=binding(resourceVersion=created["metadata"]["resourceVersion"])
        ) as resp:
            assert resp.status == 201


_T = TypeVar("_T")


class _CountingExecutor(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor, counting what is handed to it."""

    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.submitted: list[str] = []

    def submit(
        self, fn: Callable[..., _T], /, *args: object, **kwargs: object
    ) -> concurrent.futures.Future[_T]:
        self.submitted.append(getattr(fn, "__qualname__", repr(fn)))
        return super().submit(fn, *args, **kwargs)


async def test_requests_stay_on_the_event_loop(api: FakeApiServer) -> None:
    """No API call hands work to a thread: kubernetes_asyncio's session (``trust_env=True``)
    would look up ``~/.netrc`` and the proxy variables in the loop's executor on every
    request (two hand-offs each); the store reads the environment once, when built."""
    loop = asyncio.get_running_loop()
    executor = _CountingExecutor()
    loop.set_default_executor(executor)
    async with kube_store(api) as store:
        await store.create(Kind.POD, make_pod("p1"))
        for _ in range(5):
            await store.get(Kind.POD, "p1", namespace=NS)
        await store.patch(Kind.POD, "p1", {"metadata": {"labels": {"a": "b"}}}, namespace=NS)
        await store.list(Kind.POD, namespace=NS)
        await store.bind(NS, "p1", uid=None, node="gpu-1")
    assert executor.submitted == []
