"""Bind's retry paths through faults injected in the store (tests/store/faults.py): a
Binding whose reply is lost and answered 409 on the client's retry is a success; removing the
``assigned-*`` annotations after a failed Binding is retried on 409 and reported when it
keeps failing, leaving the GPUs held (never a phantom free GPU)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from extender import server
from extender.binder import ROLLBACK_ATTEMPTS
from flexlease.api import keys
from flexlease.errors import Conflict, StoreError
from flexlease.store.base import JsonObj, Kind
from flexlease.store.memory import MemoryStore
from tests.extender import payloads
from tests.extender.conftest import add_node, add_pod, eventually
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


async def test_annotation_removal_is_retried_after_a_conflict(start: Any, store: FaultyStore) -> None:
    await add_node(store, payloads.gpunode("n1", gpus=2))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=2))
    store.fail("bind", error=lambda: StoreError("node n1 is being drained", status=500))
    removal = store.fail("patch", kind=Kind.POD, match=REMOVAL)
    assert "node n1 is being drained" in await bind(client, pod)
    assert removal.seen == 2 and removal.fired == 1  # refused once, then done
    assert keys.ANN_ASSIGNED_GPUS not in await annotations(store, "p")
    inv = client.app[server.INVENTORY]
    await eventually(lambda: inv.holding(pod["metadata"]["uid"]) is None)


async def test_annotation_removal_that_keeps_failing_is_reported_and_keeps_the_gpus_held(
    start: Any, store: FaultyStore, caplog: pytest.LogCaptureFixture
) -> None:
    await add_node(store, payloads.gpunode("n1", gpus=2))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=2))
    store.fail("bind", error=lambda: StoreError("node n1 is being drained", status=500))
    removal = store.fail("patch", kind=Kind.POD, match=REMOVAL, times=ROLLBACK_ATTEMPTS)
    with caplog.at_level(logging.ERROR, logger="extender.binder"):
        assert "being drained" in await bind(client, pod)
    assert removal.fired == ROLLBACK_ATTEMPTS
    assert "could not remove assigned-gpus after a failed bind" in caplog.text
    assert (await annotations(store, "p"))[keys.ANN_ASSIGNED_GPUS] == "n1:0,1"
    inv = client.app[server.INVENTORY]
    await eventually(lambda: inv.holding(pod["metadata"]["uid"]) is not None)  # the watch keeps them taken
    other = await add_pod(store, payloads.pod("q", gpus=1))
    assert "no longer fits" in await bind(client, other)
