"""Reclaim while evicted holders are still Terminating: the owner's reclaim pod is never
bound onto a GPU whose previous holder has not terminated. Eviction through the store leaves
the LP pod Terminating (``deletionTimestamp``; on a real node its containers run for up to the
grace period); only the kubelet's confirmation (delete with grace 0) frees its GPUs."""

from __future__ import annotations

from typing import Any

from extender import server
from flexlease.api import keys
from flexlease.store.base import Kind
from flexlease.store.graceful import confirm_pod_deletion
from flexlease.store.memory import MemoryStore
from tests.extender import payloads
from tests.extender.conftest import add_node, add_pod, synced
from tests.extender.test_server import post

OWNER = {0: "ml/online", 1: "ml/online", 2: "ml/online", 3: "ml/online"}


async def test_the_owner_binds_only_after_the_terminating_holders_are_gone(
    start: Any, store: MemoryStore
) -> None:
    await add_node(store, payloads.gpunode("n-owned", gpus=4, owners=OWNER))
    for name, gpus in (("lp-1", (0, 1)), ("lp-2", (2, 3))):
        await add_pod(
            store,
            payloads.pod(
                name,
                gpus=2,
                node_name="n-owned",
                phase="Running",
                annotations=payloads.assigned("n-owned", *gpus),
            ),
        )
    client = await start()
    reclaim = await add_pod(
        store, payloads.pod("rec-0", gpus=4, priority="high", owner="online", reclaim=True)
    )
    args = payloads.extender_args(reclaim, ["n-owned"])

    # the lease controller's evictions: both holders Terminating, still on their GPUs
    await store.evict("ml", "lp-1", grace_period_seconds=30)
    await store.evict("ml", "lp-2", grace_period_seconds=30)
    terminating = await store.get(Kind.POD, "lp-2", namespace="ml")
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 30
    await synced(client, Kind.POD, terminating)
    reply = await post(client, "filter", args)
    assert reply["NodeNames"] == []
    assert "n-owned" in {**reply["FailedNodes"], **reply["FailedAndUnresolvableNodes"]}
    bound = await post(client, "bind", payloads.binding_args(reclaim, "n-owned"))
    assert bound["Error"]  # kube-scheduler's stale cache cannot force it either
    assert not (await store.get(Kind.POD, "rec-0", namespace="ml"))["spec"].get("nodeName")

    # one holder's containers are gone: two GPUs free, still not enough for four
    await confirm_pod_deletion(store, "ml", "lp-1")
    await _synced_after_delete(client, store)
    assert (await post(client, "filter", args))["NodeNames"] == []

    # the last one confirmed: the owner gets exactly its GPUs back
    await confirm_pod_deletion(store, "ml", "lp-2")
    await _synced_after_delete(client, store)
    assert (await post(client, "filter", args))["NodeNames"] == ["n-owned"]
    assert await post(client, "bind", payloads.binding_args(reclaim, "n-owned")) == {"Error": ""}
    stored = await store.get(Kind.POD, "rec-0", namespace="ml")
    assert stored["metadata"]["annotations"][keys.ANN_ASSIGNED_GPUS] == "n-owned:0,1,2,3"


async def _synced_after_delete(client: Any, store: MemoryStore) -> None:
    """Wait until the app's pod watch reached the store's current revision (a DELETED has no
    object left to read the revision from)."""
    marker = await add_pod(store, payloads.pod(f"marker-{store.revision}", gpus=0))
    await synced(client, Kind.POD, marker)
    assert client.app[server.INVENTORY].ready
