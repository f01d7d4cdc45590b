"""The contract every :class:`flexlease.store.base.Store` passes (house rule 8).

Plug a store in by subclassing :class:`StoreContract` in a ``test_*.py`` module::

    class TestMyStore(StoreContract):
        @pytest.fixture
        async def store(self) -> AsyncIterator[Store]:
            s = MyStore(...)
            yield s
            await s.close()

        async def compact(self, store: Store) -> None:
            ...  # make every revision before the store's current one unavailable (410 Gone)

The suite speaks only the Protocol, so it holds for MemoryStore, SqliteStore and KubeStore
(against the fake API server) alike. Each test is small and bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import pytest

from flexlease.errors import Conflict, Gone, NotFound, StoreError, TooManyRequests
from flexlease.store.base import EventType, JsonObj, Kind, Selector, Store, WatchEvent
from tests.store import operator_payloads

TIMEOUT = 5.0
NS = "team-a"


def make_pod(
    name: str,
    *,
    namespace: str = NS,
    labels: dict[str, str] | None = None,
    node: str | None = None,
    gpus: int = 1,
) -> JsonObj:
    """A Pod as a client would create it (camelCase Kubernetes JSON)."""
    spec: JsonObj = {
        "schedulerName": "default-scheduler",
        "containers": [
            {
                "name": "main",
                "image": "registry.local/train:1",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
            }
        ],
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": spec,
    }


def make_gpunode(name: str, *, pool: str = "general") -> JsonObj:
    return {
        "apiVersion": "flexlease.io/v1alpha1",
        "kind": "GPUNode",
        "metadata": {"name": name, "labels": {"pool": pool}},
        "spec": {"pool": pool, "devices": {"0": {"owner": None}, "1": {"owner": "team-a/job"}}},
    }


def make_pdb(name: str, *, namespace: str = NS, match: dict[str, str]) -> JsonObj:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": match}},
    }


def rv(obj: JsonObj) -> int:
    return int(obj["metadata"]["resourceVersion"])


def terminating(event: WatchEvent) -> bool:
    """A MODIFIED that only starts a graceful deletion (``metadata.deletionTimestamp``): every
    store sends it for a bound pod before the DELETED that the kubelet's confirmation causes."""
    return event.type is EventType.MODIFIED and bool(event.object["metadata"].get("deletionTimestamp"))


async def _raw_events(watch: AsyncIterator[WatchEvent], count: int) -> list[WatchEvent]:
    """The next ``count`` events but BOOKMARKs, within :data:`TIMEOUT`."""
    out: list[WatchEvent] = []
    async with asyncio.timeout(TIMEOUT):
        while len(out) < count:
            event = await anext(watch)
            if event.type is not EventType.BOOKMARK:
                out.append(event)
    return out


async def next_events(watch: AsyncIterator[WatchEvent], count: int) -> list[WatchEvent]:
    """The next ``count`` events, within :data:`TIMEOUT`, skipping BOOKMARKs and
    :func:`terminating` MODIFIEDs."""
    out: list[WatchEvent] = []
    async with asyncio.timeout(TIMEOUT):
        while len(out) < count:
            event = await anext(watch)
            if event.type is not EventType.BOOKMARK and not terminating(event):
                out.append(event)
    return out


async def no_more_events(watch: AsyncIterator[WatchEvent], *, wait: float = 0.3) -> None:
    """Assert that nothing but BOOKMARKs arrives within ``wait`` seconds."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(wait):
            while True:
                event = await anext(watch)
                assert event.type is EventType.BOOKMARK, f"unexpected event {event}"


@contextlib.asynccontextmanager
async def watching(
    store: Store,
    kind: Kind,
    resource_version: str,
    *,
    namespace: str | None = None,
    selector: Selector | None = None,
) -> AsyncIterator[AsyncIterator[WatchEvent]]:
    """A watch that is closed (``aclose``) on exit."""
    if selector is None:
        watch = store.watch(kind, resource_version=resource_version, namespace=namespace)
    else:
        watch = store.watch(kind, resource_version=resource_version, namespace=namespace, selector=selector)
    try:
        yield watch
    finally:
        aclose = getattr(watch, "aclose", None)
        if aclose is not None:
            await aclose()


def summary(events: Sequence[WatchEvent]) -> list[tuple[str, str]]:
    return [(e.type.value, e.object["metadata"]["name"]) for e in events]


class StoreContract:
    """The store contract. Subclasses supply the ``store`` fixture and :meth:`compact`."""

    async def compact(self, store: Store) -> None:
        """Force compaction: afterwards a watch from any revision before the store's current
        one raises ``Gone``."""
        raise NotImplementedError

    # -- create / get / list -------------------------------------------------------------

    async def test_create_sets_server_fields_and_get_returns_it(self, store: Store) -> None:
        created = await store.create(Kind.POD, make_pod("p1", labels={"app": "x"}))
        meta = created["metadata"]
        assert meta["name"] == "p1" and meta["namespace"] == NS
        assert meta["uid"] and meta["creationTimestamp"]
        assert int(meta["resourceVersion"]) > 0
        assert created["apiVersion"] == "v1" and created["kind"] == "Pod"
        got = await store.get(Kind.POD, "p1", namespace=NS)
        assert got == created

    async def test_create_existing_name_conflicts_per_namespace(self, store: Store) -> None:
        await store.create(Kind.POD, make_pod("p1"))
        with pytest.raises(Conflict):
            await store.create(Kind.POD, make_pod("p1"))
        other = await store.create(Kind.POD, make_pod("p1", namespace="team-b"))
        assert other["metadata"]["namespace"] == "team-b"

    async def test_create_drops_status_of_status_subresource_kinds(self, store: Store) -> None:
        pod = make_pod("p1")
        pod["status"] = {"phase": "Running"}
        created = await store.create(Kind.POD, pod)
        assert created["status"]["phase"] == "Pending"
        node = make_gpunode("gpu-1")
        node["status"] = {"nodeIP": "10.0.0.1"}
        created_node = await store.create(Kind.GPUNODE, node)
        assert "nodeIP" not in (created_node.get("status") or {})

    async def test_cluster_scoped_kind_ignores_namespace(self, store: Store) -> None:
        await store.create(Kind.GPUNODE, make_gpunode("gpu-1"))
        got = await store.get(Kind.GPUNODE, "gpu-1")
        assert got["spec"]["devices"]["1"]["owner"] == "team-a/job"
        assert "namespace" not in got["metadata"]
        listed = await store.list(Kind.GPUNODE)
        assert [o["metadata"]["name"] for o in listed.items] == ["gpu-1"]

    async def test_not_found(self, store: Store) -> None:
        with pytest.raises(NotFound):
            await store.get(Kind.POD, "nope", namespace=NS)
        with pytest.raises(NotFound):
            await store.patch(Kind.POD, "nope", {"metadata": {"labels": {"a": "b"}}}, namespace=NS)
        with pytest.raises(NotFound):
            await store.delete(Kind.POD, "nope", namespace=NS)
        with pytest.raises(NotFound):
            await store.bind(NS, "nope", uid=None, node="gpu-1")
        with pytest.raises(NotFound):
            await store.evict(NS, "nope")
        with pytest.raises(NotFound):
            await store.get(Kind.GPUNODE, "nope")

    async def test_list_namespaces_and_version(self, store: Store) -> None:
        a = await store.create(Kind.POD, make_pod("a"))
        b = await store.create(Kind.POD, make_pod("b", namespace="team-b"))
        await store.create(Kind.GPUNODE, make_gpunode("gpu-1"))
        everything = await store.list(Kind.POD)
        assert sorted(o["metadata"]["name"] for o in everything.items) == ["a", "b"]
        assert int(everything.resource_version) >= max(rv(a), rv(b))
        only_a = await store.list(Kind.POD, namespace=NS)
        assert [o["metadata"]["name"] for o in only_a.items] == ["a"]
        assert (await store.list(Kind.GPULEASE)).items == []

    async def test_objects_are_copies(self, store: Store) -> None:
        pod = make_pod("p1", labels={"app": "x"})
        created = await store.create(Kind.POD, pod)
        pod["metadata"]["labels"]["app"] = "mutated-input"
        created["metadata"]["labels"]["app"] = "mutated-output"
        got = await store.get(Kind.POD, "p1", namespace=NS)
        assert got["metadata"]["labels"]["app"] == "x"

    async def test_invalid_object_is_refused_and_nothing_written(self, store: Store) -> None:
        before = await store.list(Kind.POD)
        with pytest.raises(StoreError):
            await store.create(Kind.POD, {"metadata": {"namespace": NS}, "spec": {}})  # no name
        with pytest.raises(StoreError):
            await store.create(Kind.POD, {"metadata": {"name": "x"}, "spec": {}})  # no namespace
        after = await store.list(Kind.POD)
        assert after.items == before.items == []

    # -- patch ---------------------------------------------------------------------------

    async def test_merge_patch_semantics(self, store: Store) -> None:
        created = await store.create(Kind.POD, make_pod("p1", labels={"app": "x", "tier": "lp"}))
        container = created["spec"]["containers"][0]
        patched = await store.patch(
            Kind.POD,
            "p1",
            {
                "metadata": {"labels": {"tier": None, "new": "y"}, "annotations": {"k": "v"}},
                "spec": {"containers": [{**container, "image": "registry.local/train:2"}]},
            },
            namespace=NS,
        )
        assert patched["metadata"]["labels"] == {"app": "x", "new": "y"}
        assert patched["metadata"]["annotations"] == {"k": "v"}
        assert patched["spec"]["containers"] == [{**container, "image": "registry.local/train:2"}]
        assert patched["spec"]["schedulerName"] == "default-scheduler"
        assert rv(patched) > rv(created)
        assert patched["metadata"]["uid"] == created["metadata"]["uid"]
        assert await store.get(Kind.POD, "p1", namespace=NS) == patched

    async def test_merge_patch_replaces_arrays(self, store: Store) -> None:
        lease = {
            "metadata": {"name": "lend-1", "namespace": NS},
            "spec": {"owner": f"{NS}/job", "action": "Lend", "devices": [{"node": "gpu-1", "index": 0}]},
        }
        await store.create(Kind.GPULEASE, lease)
        patched = await store.patch(
            Kind.GPULEASE, "lend-1", {"spec": {"devices": [{"node": "gpu-2", "index": 3}]}}, namespace=NS
        )
        assert patched["spec"] == {
            "owner": f"{NS}/job",
            "action": "Lend",
            "devices": [{"node": "gpu-2", "index": 3}],
        }

    async def test_pod_spec_is_immutable_but_for_images(self, store: Store) -> None:
        created = await store.create(Kind.POD, make_pod("p1", gpus=2))
        with pytest.raises(StoreError):
            await store.patch(Kind.POD, "p1", {"spec": {"nodeName": "gpu-1"}}, namespace=NS)  # bind does that
        with pytest.raises(StoreError):
            await store.patch(
                Kind.POD, "p1", {"spec": {"containers": [{"name": "main", "image": "x"}]}}, namespace=NS
            )
        assert await store.get(Kind.POD, "p1", namespace=NS) == created

    async def test_patch_that_changes_nothing_keeps_the_version(self, store: Store) -> None:
        created = await store.create(Kind.POD, make_pod("p1", labels={"app": "x"}))
        same = await store.patch(Kind.POD, "p1", {"metadata": {"labels": {"app": "x"}}}, namespace=NS)
        assert rv(same) == rv(created)

    async def test_status_subresource(self, store: Store) -> None:
        await store.create(Kind.POD, make_pod("p1"))
        main = await store.patch(
            Kind.POD, "p1", {"status": {"phase": "Running"}, "metadata": {"labels": {"a": "b"}}}, namespace=NS
        )
        assert main["status"]["phase"] == "Pending"
        assert main["metadata"]["labels"] == {"a": "b"}
        status = await store.patch(
            Kind.POD,
            "p1",
            {"status": {"phase": "Running"}, "metadata": {"labels": {"a": "c"}}},
            namespace=NS,
            subresource="status",
        )
        assert status["status"]["phase"] == "Running"
        assert status["metadata"]["labels"] == {"a": "b"}
        node = await store.create(Kind.GPUNODE, make_gpunode("gpu-1"))
        node = await store.patch(
            Kind.GPUNODE, "gpu-1", {"status": {"nodeIP": "10.0.0.7"}}, subresource="status"
        )
        assert node["status"]["nodeIP"] == "10.0.0.7"
        node = await store.patch(Kind.GPUNODE, "gpu-1", {"spec": {"pool": "standby"}, "status": None})
        assert node["status"]["nodeIP"] == "10.0.0.7" and node["spec"]["pool"] == "standby"

    async def test_patch_precondition_conflicts(self, store: Store) -> None:
        created = await store.create(Kind.GPUNODE, make_gpunode("gpu-1"))
        first = await store.patch(
            Kind.GPUNODE,
            "gpu-1",
            {"spec": {"devices": {"0": {"owner": "team-b/job"}}}},
            resource_version=created["metadata"]["resourceVersion"],
        )
        assert first["spec"]["devices"]["0"]["owner"] == "team-b/job"
        with pytest.raises(Conflict):
            await store.patch(
                Kind.GPUNODE,
                "gpu-1",
                {"spec": {"devices": {"0": {"owner": "team-c/job"}}}},
                resource_version=created["metadata"]["resourceVersion"],
            )
        with pytest.raises(Conflict):
            await store.patch(
                Kind.GPUNODE,
                "gpu-1",
                {
                    "metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
                    "spec": {"pool": "x"},
                },
            )
        got = await store.get(Kind.GPUNODE, "gpu-1")
        assert got == first

    async def test_patch_nulls_delete_nested_keys(self, store: Store) -> None:
        await store.create(Kind.GPUNODE, make_gpunode("gpu-1"))
        node = await store.patch(Kind.GPUNODE, "gpu-1", {"spec": {"devices": {"1": None}}})
        assert node["spec"]["devices"] == {"0": {"owner": None}}  # nulls in a created object stay
        node = await store.patch(Kind.GPUNODE, "gpu-1", {"spec": {"devices": {"0": {"owner": "a/b"}}}})
        assert node["spec"]["devices"] == {"0": {"owner": "a/b"}}
        node = await store.patch(Kind.GPUNODE, "gpu-1", {"spec": {"devices": {"0": {"owner": None}}}})
        assert node["spec"]["devices"] == {"0": {}}

    # -- delete --------------------------------------------------------------------------

    async def test_delete(self, store: Store) -> None:
        await store.create(Kind.POD, make_pod("p1"))
        await store.delete(Kind.POD, "p1", namespace=NS)
        with pytest.raises(NotFound):
            await store.get(Kind.POD, "p1", namespace=NS)
        recreated = await store.create(Kind.POD, make_pod("p1"))
        assert recreated["metadata"]["name"] == "p1"

    # -- selectors -----------------------------------------------------------------------

    async def test_label_and_field_selectors(self, store: Store) -> None:
        await store.create(Kind.POD, make_pod("a", labels={"flexlease.io/priority": "high"}, node="gpu-1"))
        await store.create(Kind.POD, make_pod("b", labels={"flexlease.io/priority": "low"}, node="gpu-1"))
        await store.create(Kind.POD, make_pod("c", labels={"flexlease.io/priority": "low"}))

        async def names(selector: Selector) -> list[str]:
            return sorted(
                o["metadata"]["name"] for o in (await store.list(Kind.POD, selector=selector)).items
            )

        assert await names(Selector(labels={"flexlease.io/priority": "low"})) == ["b", "c"]
        assert await names(Selector(fields={"spec.nodeName": "gpu-1"})) == ["a", "b"]
        assert await names(Selector(fields={"spec.nodeName": ""})) == ["c"]
        assert await names(Selector(fields={"metadata.name": "b"})) == ["b"]
        both = Selector(labels={"flexlease.io/priority": "low"}, fields={"spec.nodeName": "gpu-1"})
        assert await names(both) == ["b"]

    # -- other operators' custom objects (training-operator jobs, KubeRay clusters) -----------

    async def test_operator_custom_objects_get_list_and_patch(self, store: Store) -> None:
        """PyTorchJobs, MPIJobs and RayClusters are stored as sent (their operators' schemas),
        listed with ``kind``/``apiVersion``, patched by merge patch; ``status`` only through
        the status subresource."""
        objs = {
            Kind.PYTORCHJOB: operator_payloads.pytorchjob("pt", NS, image="reg/pt:v1"),
            Kind.MPIJOB: operator_payloads.mpijob("mpi", NS, image="reg/mpi:v1"),
            Kind.RAYCLUSTER: operator_payloads.raycluster("ray", NS, image="reg/ray:v1"),
        }
        for kind, obj in objs.items():
            created = await store.create(kind, {**obj, "status": {"conditions": []}})
            assert "status" not in created
            assert created["spec"] == obj["spec"]
            assert (created["kind"], created["apiVersion"]) == (obj["kind"], obj["apiVersion"])
            name = obj["metadata"]["name"]
            assert await store.get(kind, name, namespace=NS) == created
            listed = await store.list(kind, namespace=NS)
            assert [(o["kind"], o["apiVersion"], o["metadata"]["name"]) for o in listed.items] == [
                (obj["kind"], obj["apiVersion"], name)
            ]
            assert (await store.list(kind, namespace="team-b")).items == []
            status = await store.patch(
                kind,
                name,
                {"status": {"startTime": "2026-11-22T10:00:00Z"}},
                namespace=NS,
                subresource="status",
            )
            assert status["status"] == {"startTime": "2026-11-22T10:00:00Z"}
        head = {
            "spec": {
                "headGroupSpec": {
                    "template": {"spec": {"containers": [{"name": "ray-head", "image": "reg/ray:v2"}]}}
                }
            }
        }
        patched = await store.patch(Kind.RAYCLUSTER, "ray", head, namespace=NS)
        assert patched["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == "reg/ray:v2"
        assert patched["spec"]["workerGroupSpecs"] == objs[Kind.RAYCLUSTER]["spec"]["workerGroupSpecs"]
        assert patched["spec"]["headGroupSpec"]["rayStartParams"] == {"dashboard-host": "0.0.0.0"}
        with pytest.raises(NotFound):
            await store.get(Kind.PYTORCHJOB, "mpi", namespace=NS)  # kinds are separate

    async def test_operator_custom_objects_watch(self, store: Store) -> None:
        listed = await store.list(Kind.PYTORCHJOB)
        async with watching(store, Kind.PYTORCHJOB, listed.resource_version) as watch:
            job = await store.create(
                Kind.PYTORCHJOB, operator_payloads.pytorchjob("pt", NS, image="reg/pt:v1")
            )
            await store.create(
                Kind.MPIJOB, operator_payloads.mpijob("mpi", NS, image="reg/mpi:v1")
            )  # not seen
            edit = {
                "spec": {
                    "pytorchReplicaSpecs": {
                        "Worker": {
                            "template": {"spec": {"containers": [{"name": "pytorch", "image": "reg/pt:v2"}]}}
                        }
                    }
                }
            }
            edited = await store.patch(Kind.PYTORCHJOB, "pt", edit, namespace=NS)
            await store.delete(Kind.PYTORCHJOB, "pt", namespace=NS)
            events = await next_events(watch, 3)
        assert summary(events) == [("ADDED", "pt"), ("MODIFIED", "pt"), ("DELETED", "pt")]
        assert events[0].object == job and events[1].object == edited
        assert edited["spec"]["pytorchReplicaSpecs"]["Master"] == job["spec"]["pytorchReplicaSpecs"]["Master"]
        worker = edited["spec"]["pytorchReplicaSpecs"]["Worker"]
        assert worker["replicas"] == 2 and worker["template"]["spec"]["containers"][0]["image"] == "reg/pt:v2"

    # -- watch ---------------------------------------------------------------------------

    async def test_watch_from_list_version_in_order(self, store: Store) -> None:
        await store.create(Kind.POD, make_pod("before"))
        listed = await store.list(Kind.POD)
        async with watching(store, Kind.POD, listed.resource_version) as watch:
            a = await store.create(Kind.POD, make_pod("a"))
            await store.create(Kind.GPUNODE, make_gpunode("gpu-1"))  # another kind: not seen
            a2 = await store.patch(Kind.POD, "a", {"metadata": {"labels": {"x": "1"}}}, namespace=NS)
            await store.delete(Kind.POD, "before", namespace=NS)
            events = await next_events(watch, 3)
        assert summary(events) == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "before")]
        assert events[0].object == a and events[1].object == a2
        versions = [int(e.resource_version) for e in events]
        assert versions == sorted(versions) and len(set(versions)) == 3
        assert versions[0] > int(listed.resource_version)

    async def test_watch_resumes_strictly_after_a_version(self, store: Store) -> None:
        a = await store.create(Kind.POD, make_pod("a"))
        b = await store.create(Kind.POD, make_pod("b"))
        c = await store.patch(Kind.POD, "a", {"metadata": {"labels": {"x": "1"}}}, namespace=NS)
        async with watching(store, Kind.POD, a["metadata"]["resourceVersion"]) as watch:
            events = await next_events(watch, 2)
            assert [e.object for e in events] == [b, c]
            await no_more_events(watch)

    async def test_watch_namespace_filter(self, store: Store) -> None:
        start = (await store.list(Kind.POD)).resource_version
        async with watching(store, Kind.POD, start, namespace="team-b") as watch:
            await store.create(Kind.POD, make_pod("a"))
            await store.create(Kind.POD, make_pod("b", namespace="team-b"))
            events = await next_events(watch, 1)
        assert summary(events) == [("ADDED", "b")]
        assert events[0].object["metadata"]["namespace"] == "team-b"

    async def test_watch_selector_transitions(self, store: Store) -> None:
        start = (await store.list(Kind.POD)).resource_version
        on_node = Selector(fields={"spec.nodeName": "gpu-1"})
        async with watching(store, Kind.POD, start, selector=on_node) as watch:
            await store.create(Kind.POD, make_pod("a"))  # not on gpu-1: unseen
            await store.bind(NS, "a", uid=None, node="gpu-1")  # starts matching: ADDED
            await store.patch(Kind.POD, "a", {"metadata": {"labels": {"x": "1"}}}, namespace=NS)
            await store.create(Kind.POD, make_pod("b", node="gpu-1"))
            await store.delete(Kind.POD, "a", namespace=NS, grace_period_seconds=0)
            events = await next_events(watch, 4)
        assert summary(events) == [("ADDED", "a"), ("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "a")]
        assert events[0].object["spec"]["nodeName"] == "gpu-1"

        labelled = Selector(labels={"flexlease.io/priority": "low"})
        start = (await store.list(Kind.POD)).resource_version
        async with watching(store, Kind.POD, start, selector=labelled) as watch:
            await store.patch(
                Kind.POD, "b", {"metadata": {"labels": {"flexlease.io/priority": "low"}}}, namespace=NS
            )
            left = await store.patch(
                Kind.POD, "b", {"metadata": {"labels": {"flexlease.io/priority": "high"}}}, namespace=NS
            )
            events = await next_events(watch, 2)
        assert summary(events) == [("ADDED", "b"), ("DELETED", "b")]
        gone = events[1].object
        assert gone["metadata"]["labels"]["flexlease.io/priority"] == "low"  # its last matching state
        assert gone["metadata"]["resourceVersion"] == left["metadata"]["resourceVersion"]

    async def test_watch_deleted_carries_last_state(self, store: Store) -> None:
        await store.create(Kind.POD, make_pod("a"))
        last = await store.patch(Kind.POD, "a", {"metadata": {"labels": {"x": "1"}}}, namespace=NS)
        start = (await store.list(Kind.POD)).resource_version
        async with watching(store, Kind.POD, start) as watch:
            await store.delete(Kind.POD, "a", namespace=NS)
            (event,) = await next_events(watch, 1)
        assert event.type is EventType.DELETED
        assert event.object["metadata"]["labels"] == {"x": "1"}
        assert event.object["metadata"]["uid"] == last["metadata"]["uid"]
        assert int(event.resource_version) > rv(last)

    async def test_watch_gone_after_compaction(self, store: Store) -> None:
        first = await store.create(Kind.POD, make_pod("a"))
        for i in range(3):
            await store.patch(Kind.POD, "a", {"metadata": {"labels": {"i": str(i)}}}, namespace=NS)
        await self.compact(store)
        with pytest.raises(Gone):
            async with watching(store, Kind.POD, first["metadata"]["resourceVersion"]) as watch:
                async with asyncio.timeout(TIMEOUT):
                    await anext(watch)
        # a fresh list gives a version one can watch from again
        listed = await store.list(Kind.POD)
        async with watching(store, Kind.POD, listed.resource_version) as watch:
            await store.patch(Kind.POD, "a", {"metadata": {"labels": {"i": "new"}}}, namespace=NS)
            (event,) = await next_events(watch, 1)
        assert event.object["metadata"]["labels"] == {"i": "new"}

    async def test_close_ends_running_watches(self, store: Store) -> None:
        start = (await store.list(Kind.POD)).resource_version
        watch = store.watch(Kind.POD, resource_version=start)
        seen: list[WatchEvent] = []
        added = asyncio.Event()

        async def consume() -> None:
            async for event in watch:
                seen.append(event)
                if event.type is EventType.ADDED:
                    added.set()

        task = asyncio.create_task(consume(), name="contract-watch-consumer")
        await store.create(Kind.POD, make_pod("a"))
        async with asyncio.timeout(TIMEOUT):
            await added.wait()
            await store.close()
            await task  # ends by itself: the iteration stops
        assert [e.object["metadata"]["name"] for e in seen if e.type is EventType.ADDED] == ["a"]

    # -- bind ----------------------------------------------------------------------------

    async def test_bind(self, store: Store) -> None:
        created = await store.create(Kind.POD, make_pod("p1"))
        await store.bind(NS, "p1", uid=created["metadata"]["uid"], node="gpu-3")
        pod = await store.get(Kind.POD, "p1", namespace=NS)
        assert pod["spec"]["nodeName"] == "gpu-3"
        scheduled = [c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"]
        assert [c["status"] for c in scheduled] == ["True"]
        assert rv(pod) > rv(created)
        with pytest.raises(Conflict):
            await store.bind(NS, "p1", uid=None, node="gpu-3")  # already bound, even to the same node
        with pytest.raises(Conflict):
            await store.bind(NS, "p1", uid=None, node="gpu-4")
        assert (await store.get(Kind.POD, "p1", namespace=NS)) == pod

    async def test_bind_adds_the_bindings_annotations_in_the_same_write(self, store: Store) -> None:
        pod = make_pod("p1")
        pod["metadata"]["annotations"] = {"keep": "me", "flexlease.io/assigned-gpus": "old:0"}
        created = await store.create(Kind.POD, pod)
        async with watching(store, Kind.POD, created["metadata"]["resourceVersion"]) as events:
            await store.bind(
                NS,
                "p1",
                uid=created["metadata"]["uid"],
                node="gpu-3",
                annotations={"flexlease.io/assigned-gpus": "gpu-3:0,1", "flexlease.io/assigned-at": "t"},
            )
            (event,) = await next_events(events, 1)
            await no_more_events(events)  # one event: node and annotations together
        assert event.type is EventType.MODIFIED
        got = event.object
        assert got["spec"]["nodeName"] == "gpu-3"
        assert got["metadata"]["annotations"] == {
            "keep": "me",
            "flexlease.io/assigned-gpus": "gpu-3:0,1",
            "flexlease.io/assigned-at": "t",
        }
        assert await store.get(Kind.POD, "p1", namespace=NS) == got
        with pytest.raises(Conflict):  # a refused Binding writes no annotation either
            await store.bind(NS, "p1", uid=None, node="gpu-4", annotations={"other": "x"})
        assert "other" not in (await store.get(Kind.POD, "p1", namespace=NS))["metadata"]["annotations"]

    async def test_bind_uid_mismatch_conflicts(self, store: Store) -> None:
        await store.create(Kind.POD, make_pod("p1"))
        with pytest.raises(Conflict):
            await store.bind(NS, "p1", uid="00000000-0000-0000-0000-000000000000", node="gpu-1")
        pod = await store.get(Kind.POD, "p1", namespace=NS)
        assert not pod["spec"].get("nodeName")

    async def test_bind_on_a_resource_version(self, store: Store) -> None:
        """A Binding's ``metadata.resourceVersion`` is a precondition: a pod changed since that
        version is not bound (nor annotated); the current version binds."""
        created = await store.create(Kind.POD, make_pod("p1"))
        changed = await store.patch(Kind.POD, "p1", {"metadata": {"labels": {"a": "b"}}}, namespace=NS)
        with pytest.raises(Conflict, match="Precondition failed: ResourceVersion in precondition"):
            await store.bind(
                NS,
                "p1",
                uid=None,
                node="gpu-1",
                annotations={"x": "y"},
                resource_version=created["metadata"]["resourceVersion"],
            )
        assert await store.get(Kind.POD, "p1", namespace=NS) == changed
        await store.bind(
            NS, "p1", uid=None, node="gpu-1", resource_version=changed["metadata"]["resourceVersion"]
        )
        assert (await store.get(Kind.POD, "p1", namespace=NS))["spec"]["nodeName"] == "gpu-1"

    async def test_binding_a_scheduling_gated_pod_conflicts(self, store: Store) -> None:
        """The API server refuses to bind a pod whose ``spec.schedulingGates`` is not empty."""
        pod = make_pod("p1")
        pod["spec"]["schedulingGates"] = [{"name": "example.com/wait"}]
        created = await store.create(Kind.POD, pod)
        with pytest.raises(Conflict, match=r"non-empty \.spec\.schedulingGates"):
            await store.bind(
                NS, "p1", uid=None, node="gpu-1", annotations={"flexlease.io/assigned-gpus": "gpu-1:0"}
            )
        assert await store.get(Kind.POD, "p1", namespace=NS) == created  # nothing written

    async def test_bind_clears_the_nominated_node(self, store: Store) -> None:
        """``ClearingNominatedNodeNameAfterBinding``: a preemptor's nomination goes with its bind."""
        await store.create(Kind.POD, make_pod("p1"))
        nominated = await store.patch(
            Kind.POD, "p1", {"status": {"nominatedNodeName": "gpu-9"}}, namespace=NS, subresource="status"
        )
        assert nominated["status"]["nominatedNodeName"] == "gpu-9"
        await store.bind(NS, "p1", uid=None, node="gpu-9")
        bound = await store.get(Kind.POD, "p1", namespace=NS)
        assert bound["spec"]["nodeName"] == "gpu-9" and "nominatedNodeName" not in bound["status"]

    async def test_concurrent_binds_one_wins(self, store: Store) -> None:
        await store.create(Kind.POD, make_pod("p1"))
        results = await asyncio.gather(
            *(store.bind(NS, "p1", uid=None, node=f"gpu-{i}") for i in range(5)), return_exceptions=True
        )
        assert sum(r is None for r in results) == 1
        assert all(isinstance(r, Conflict) for r in results if r is not None)

    # -- evict ---------------------------------------------------------------------------

    async def _running_pod(
        self, store: Store, name: str, labels: dict[str, str], *, namespace: str = NS
    ) -> JsonObj:
        await store.create(Kind.POD, make_pod(name, namespace=namespace, labels=labels, node="gpu-1"))
        return await store.patch(
            Kind.POD, name, {"status": {"phase": "Running"}}, namespace=namespace, subresource="status"
        )

    async def test_evict_without_budget_deletes_gracefully(self, store: Store) -> None:
        await self._running_pod(store, "p1", {"app": "x"})
        start = (await store.list(Kind.POD)).resource_version
        async with watching(store, Kind.POD, start) as watch:
            await store.evict(NS, "p1", grace_period_seconds=30)
            (marked,) = await _raw_events(watch, 1)
            terminating_pod = await store.get(Kind.POD, "p1", namespace=NS)
            await store.delete(Kind.POD, "p1", namespace=NS, grace_period_seconds=0)  # the kubelet confirms
            (event,) = await next_events(watch, 1)
        assert terminating(marked) and marked.object["metadata"]["deletionGracePeriodSeconds"] == 30
        assert terminating_pod["metadata"]["deletionTimestamp"]
        assert (event.type, event.object["metadata"]["name"]) == (EventType.DELETED, "p1")
        with pytest.raises(NotFound):
            await store.get(Kind.POD, "p1", namespace=NS)

    async def test_graceful_pod_deletion(self, store: Store) -> None:
        """A bound pod stays Terminating until a delete with grace 0; a repeated delete only
        shortens the grace period; the deletion marks cannot be patched away; an unbound pod
        goes at once."""
        await self._running_pod(store, "p1", {})
        await store.delete(Kind.POD, "p1", namespace=NS)
        first = await store.get(Kind.POD, "p1", namespace=NS)
        assert first["metadata"]["deletionGracePeriodSeconds"] == 30  # terminationGracePeriodSeconds default
        await store.delete(Kind.POD, "p1", namespace=NS, grace_period_seconds=60)  # longer: ignored
        assert await store.get(Kind.POD, "p1", namespace=NS) == first
        await store.delete(Kind.POD, "p1", namespace=NS, grace_period_seconds=5)  # shorter: taken
        shortened = await store.get(Kind.POD, "p1", namespace=NS)
        assert shortened["metadata"]["deletionGracePeriodSeconds"] == 5
        patched = await store.patch(
            Kind.POD,
            "p1",
            {
                "metadata": {
                    "deletionTimestamp": None,
                    "deletionGracePeriodSeconds": None,
                    "labels": {"a": "b"},
                }
            },
            namespace=NS,
        )
        assert patched["metadata"]["deletionTimestamp"] == shortened["metadata"]["deletionTimestamp"]
        await store.delete(Kind.POD, "p1", namespace=NS, grace_period_seconds=-1)  # counts as 1 s
        assert (await store.get(Kind.POD, "p1", namespace=NS))["metadata"]["deletionGracePeriodSeconds"] == 1
        await store.delete(Kind.POD, "p1", namespace=NS, grace_period_seconds=0)
        with pytest.raises(NotFound):
            await store.get(Kind.POD, "p1", namespace=NS)
        await store.create(Kind.POD, make_pod("unbound"))
        await store.delete(Kind.POD, "unbound", namespace=NS)
        with pytest.raises(NotFound):
            await store.get(Kind.POD, "unbound", namespace=NS)

    async def test_evict_honours_pod_disruption_budget(self, store: Store) -> None:
        await self._running_pod(store, "p1", {"app": "x"})
        await self._running_pod(store, "p2", {"app": "x"})
        await self._running_pod(store, "other", {"app": "y"})
        await store.create(Kind.PDB, make_pdb("x-budget", match={"app": "x"}))
        with pytest.raises(TooManyRequests):  # no status yet: 0 disruptions allowed
            await store.evict(NS, "p1")
        await store.patch(
            Kind.PDB, "x-budget", {"status": {"disruptionsAllowed": 1}}, namespace=NS, subresource="status"
        )
        await store.evict(NS, "p1")
        assert (await store.get(Kind.POD, "p1", namespace=NS))["metadata"]["deletionTimestamp"]
        pdb = await store.get(Kind.PDB, "x-budget", namespace=NS)
        assert pdb["status"]["disruptionsAllowed"] == 0
        with pytest.raises(TooManyRequests):
            await store.evict(NS, "p2")
        assert (await store.get(Kind.POD, "p2", namespace=NS))["metadata"]["name"] == "p2"
        await store.evict(NS, "other")  # not selected by the budget
        # a budget in another namespace does not apply
        await self._running_pod(store, "q", {"app": "x"}, namespace="team-b")
        await store.evict("team-b", "q")

    async def test_evict_pending_pod_ignores_budget(self, store: Store) -> None:
        await store.create(Kind.POD, make_pod("p1", labels={"app": "x"}))
        await store.create(Kind.PDB, make_pdb("x-budget", match={"app": "x"}))
        await store.evict(NS, "p1")
        with pytest.raises(NotFound):
            await store.get(Kind.POD, "p1", namespace=NS)

    # -- concurrency ---------------------------------------------------------------------

    async def test_concurrent_writers_lose_and_double_nothing(self, store: Store) -> None:
        """Writers increment a counter with read-modify-write under a resourceVersion
        precondition, retrying on Conflict; a watch sees every increment exactly once, in
        order."""
        writers, per_writer = 4, 15
        await store.create(Kind.GPUNODE, make_gpunode("gpu-1"))
        listed = await store.list(Kind.GPUNODE)

        async def writer(i: int) -> int:
            conflicts = 0
            for _ in range(per_writer):
                while True:
                    cur = await store.get(Kind.GPUNODE, "gpu-1")
                    count = int(cur["metadata"].get("annotations", {}).get("count", "0"))
                    try:
                        await store.patch(
                            Kind.GPUNODE,
                            "gpu-1",
                            {"metadata": {"annotations": {"count": str(count + 1), "by": str(i)}}},
                            resource_version=cur["metadata"]["resourceVersion"],
                        )
                        break
                    except Conflict:
                        conflicts += 1
                        await asyncio.sleep(0)
            return conflicts

        async with watching(store, Kind.GPUNODE, listed.resource_version) as watch:
            async with asyncio.timeout(TIMEOUT * 4):
                await asyncio.gather(*(writer(i) for i in range(writers)))
            events = await next_events(watch, writers * per_writer)
            await no_more_events(watch, wait=0.2)
        counts = [int(e.object["metadata"]["annotations"]["count"]) for e in events]
        assert counts == list(range(1, writers * per_writer + 1))
        versions = [int(e.resource_version) for e in events]
        assert versions == sorted(set(versions))
        final = await store.get(Kind.GPUNODE, "gpu-1")
        assert final["metadata"]["annotations"]["count"] == str(writers * per_writer)

    async def test_watch_from_now(self, store: Store) -> None:
        """``"0"`` asks for the current state as ADDED events, then changes (Kubernetes'
        "any" resourceVersion)."""
        await store.create(Kind.POD, make_pod("a"))
        async with watching(store, Kind.POD, "0") as watch:
            first = await next_events(watch, 1)
            await store.create(Kind.POD, make_pod("b"))
            second = await next_events(watch, 1)
        assert summary(first + second) == [("ADDED", "a"), ("ADDED", "b")]
