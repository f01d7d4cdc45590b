"""Bind's retry paths through faults injected in the store (tests/store/faults.py): a
Binding whose reply is lost and answered 409 on the client's retry is a success."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

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
