"""Bind (extender.binder) over real HTTP when the store fails midway, retries, or the scheduler hangs up."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from extender import server
from flexlease.api import keys
from flexlease.errors import StoreError
from flexlease.store.base import JsonObj, Kind
from flexlease.store.memory import MemoryStore
from tests.extender import payloads
from tests.extender.conftest import add_node, add_pod, eventually


class FlakyStore(MemoryStore):
    """A MemoryStore whose bind/patch can fail or stall, as an API server can."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_bind = 0
        self.fail_patch = 0
        self.bind_delay = 0.0
        self.lose_bind_reply = False
        self.binds = 0

    async def patch(self, kind: Kind, name: str, patch: JsonObj, **kw: Any) -> JsonObj:
        if kind is Kind.POD and self.fail_patch:
            self.fail_patch -= 1
            raise StoreError("etcdserver: request timed out", status=500)
        return await super().patch(kind, name, patch, **kw)

    async def bind(self, namespace: str, name: str, *, uid: str | None, node: str) -> None:
        self.binds += 1
        if self.bind_delay:
            await asyncio.sleep(self.bind_delay)
        if self.fail_bind:
            self.fail_bind -= 1
            raise StoreError("node n1 is being drained", status=500)
        await super().bind(namespace, name, uid=uid, node=node)
        if self.lose_bind_reply:
            self.lose_bind_reply = False
            raise StoreError("connection reset by peer")


@pytest.fixture
async def store() -> Any:
    s = FlakyStore()
    yield s
    await s.close()


async def bind(client: Any, pod: JsonObj, node: str = "n1") -> str:
    resp = await client.post("/bind", json=payloads.binding_args(pod, node))
    assert resp.status == 200
    error: str = (await resp.json())["Error"]
    return error


async def annotations(store: MemoryStore, name: str) -> dict[str, str]:
    pod = await store.get(Kind.POD, name, namespace="ml")
    ann: dict[str, str] = pod["metadata"].get("annotations", {})
    return ann


async def test_failed_binding_removes_annotations_and_reservation(start: Any, store: FlakyStore) -> None:
    await add_node(store, payloads.gpunode("n1", gpus=2))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=2))
    store.fail_bind = 1
    error = await bind(client, pod)
    assert "binding pod ml/p to n1 failed: node n1 is being drained" in error
    assert keys.ANN_ASSIGNED_GPUS not in await annotations(store, "p")
    inv = client.app[server.INVENTORY]
    assert inv.reservation(pod["metadata"]["uid"]) is None
    await eventually(lambda: inv.holding(pod["metadata"]["uid"]) is None)
    # no phantom: the GPUs are free for the next pod, and the retry of this one works
    assert await bind(client, pod) == ""
    assert (await annotations(store, "p"))[keys.ANN_ASSIGNED_GPUS] == "n1:0,1"


async def test_failed_annotation_write_forgets_the_reservation(start: Any, store: FlakyStore) -> None:
    await add_node(store, payloads.gpunode("n1", gpus=2))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=2))
    store.fail_patch = 1
    assert "recording assigned GPUs on pod ml/p failed" in await bind(client, pod)
    assert store.binds == 0
    view = client.app[server.INVENTORY].snapshot().get("n1")
    assert view is not None and all(d.holder is None for d in view.devices)


async def test_lost_binding_reply_is_success(start: Any, store: FlakyStore) -> None:
    await add_node(store, payloads.gpunode("n1", gpus=2))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=1))
    store.lose_bind_reply = True
    error = await bind(client, pod)
    # the Binding was created but its reply lost: the pod is bound, so roll back nothing
    stored = await store.get(Kind.POD, "p", namespace="ml")
    assert stored["spec"]["nodeName"] == "n1"
    assert "connection reset" in error or error == ""
    assert keys.ANN_ASSIGNED_GPUS in stored["metadata"]["annotations"]
    assert await bind(client, pod) == ""  # the scheduler's retry is idempotent


async def test_leftover_annotations_of_an_unfinished_bind_are_reused(start: Any, store: FlakyStore) -> None:
    await add_node(store, payloads.gpunode("n1", gpus=4))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=2, annotations=payloads.assigned("n1", 2, 3)))
    assert await bind(client, pod) == ""
    stored = await store.get(Kind.POD, "p", namespace="ml")
    assert stored["spec"]["nodeName"] == "n1"
    assert stored["metadata"]["annotations"][keys.ANN_ASSIGNED_GPUS] == "n1:2,3"


async def test_concurrent_binds_of_one_pod_bind_once(start: Any, store: FlakyStore) -> None:
    await add_node(store, payloads.gpunode("n1", gpus=8))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=2))
    store.bind_delay = 0.05
    errors = await asyncio.gather(*(bind(client, pod) for _ in range(3)))
    assert errors == ["", "", ""]
    assert store.binds == 1
    assert (await annotations(store, "p"))[keys.ANN_ASSIGNED_GPUS] == "n1:0,1"


async def test_bind_to_a_node_without_gpunode_or_to_standby(start: Any, store: FlakyStore) -> None:
    await add_node(store, payloads.gpunode("s1", pool="standby"))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=1))
    assert "node n9 has no GPUNode" in await bind(client, pod, "n9")
    assert "standby-pool node" in await bind(client, pod, "s1")
    assert keys.ANN_ASSIGNED_GPUS not in await annotations(store, "p")
