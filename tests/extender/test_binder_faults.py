"""Bind's retry paths through faults injected in the store (tests/store/faults.py): a
Binding whose reply is lost and answered 409 on the client's retry is a success."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from extender import server
from flexlease.api import keys
from flexlease.errors import Conflict
from flexlease.store.base import JsonObj, Kind
from flexlease.store.memory import MemoryStore
from tests.extender import payloads
from tests.extender.conftest import add_node, add_pod
from tests.store.faults import FaultyStore

REMOVAL = f'"{keys.ANN_ASSIGNED_GPUS}": null'


@pytest.fixture
async def store() -> AsyncIterator[FaultyStore]:
    s = FaultyStore(MemoryStore())
    yield s
    await s.close()


async def bind(client: Any, pod: JsonObj, node: str = "n1") -> str:
    resp = await client.post("/bind", json=payloads.binding_args(pod, node))
    assert resp.status == 200
    error: str = (await resp.json())["Error"]
    return error


async def annotations(store: FaultyStore, name: str) -> dict[str, str]:
    ann: dict[str, str] = (await store.get(Kind.POD, name, namespace="ml"))["metadata"].get("annotations", {})
    return ann


async def test_a_binding_answered_409_after_it_landed_is_a_success(start: Any, store: FaultyStore) -> None:
    await add_node(store, payloads.gpunode("n1", gpus=2))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=2))
    lost = store.fail(
        "bind",
        after=True,
        error=lambda: Conflict(
            'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "n1"'
        ),
    )
    assert await bind(client, pod) == ""
    assert lost.fired == 1
    stored = await store.get(Kind.POD, "p", namespace="ml")
    assert stored["spec"]["nodeName"] == "n1"
    assert stored["metadata"]["annotations"][keys.ANN_ASSIGNED_GPUS] == "n1:0,1"


@pytest.mark.parametrize("after", [False, True], ids=["before-the-binding", "after-the-binding"])
@pytest.mark.parametrize("gpus", [2, 0], ids=["gpu-pod", "cpu-pod"])
async def test_an_unexpected_store_exception_is_a_failed_binding_settled_by_a_read(
    start: Any, store: FaultyStore, after: bool, gpus: int
) -> None:
    """A store that raises something other than a StoreError (it broke its contract) is not a
    500 that leaves a reservation behind (issue #37): the Binding's outcome is unknown, so the
    pod is read back — bound as asked: success; not bound: the reservation is forgotten and
    the GPUs are free for the next pod at once."""
    await add_node(store, payloads.gpunode("n1", gpus=2))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=gpus))
    other = await add_pod(store, payloads.pod("q", gpus=2))
    broke = store.fail("bind", after=after, error=lambda: RuntimeError("the store's socket broke"))
    error = await bind(client, pod)
    assert broke.fired == 1
    stored = await store.get(Kind.POD, "p", namespace="ml")
    inv = client.app[server.INVENTORY]
    if after:
        assert error == "" and stored["spec"]["nodeName"] == "n1"
        return
    assert "unexpected RuntimeError: the store's socket broke" in error
    assert not stored["spec"].get("nodeName") and keys.ANN_ASSIGNED_GPUS not in await annotations(store, "p")
    assert inv.reservation(pod["metadata"]["uid"]) is None
    assert await bind(client, other) == ""  # its GPUs went to no one
