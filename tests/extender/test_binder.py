"""Bind (extender.binder) over real HTTP when the store fails midway, retries, or the scheduler hangs up."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest

from extender import server
from extender.state import Inventory
from flexlease.api import keys
from flexlease.errors import Conflict, StoreError
from flexlease.store.base import JsonObj, Kind
from flexlease.store.memory import MemoryStore
from tests.extender import payloads
from tests.extender.conftest import add_node, add_pod, eventually, make_settings, synced
from tests.extender.test_server import post


class FlakyStore(MemoryStore):
    """A MemoryStore whose bind can fail or stall, as an API server can; pod patches are counted."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_bind = 0
        self.bind_delay = 0.0
        self.lose_bind_reply = False
        self.binds = 0
        self.pod_patches = 0
        self.fail_get = 0
        self.fail_read_back = False
        self.pod_reads = 0
        self.binding_versions: list[str | None] = []
        """Each Binding's resourceVersion precondition, in order (None: none)."""
        self.after_pod_read: list[JsonObj] = []
        """Merge patches another writer applies to a pod right after it is read, one per read."""
        self.churn = False
        """Another writer changes a pod's labels right after every read of it."""
        self.landed_409 = False
        """The next Binding lands and is answered 409, as a client's retry of it would be."""
        self.before_bind: list[Callable[[], Awaitable[None]]] = []
        """What another writer does just before each of the next Bindings, one per Binding."""

    async def get(self, kind: Kind, name: str, **kw: Any) -> JsonObj:
        if kind is Kind.POD:
            self.pod_reads += 1
        if kind is Kind.POD and self.fail_get:
            self.fail_get -= 1
            raise StoreError("etcdserver: request timed out", status=504)
        obj = await super().get(kind, name, **kw)
        if kind is Kind.POD and (self.after_pod_read or self.churn):
            change = (
                self.after_pod_read.pop(0)
                if self.after_pod_read
                else {"metadata": {"labels": {"churn": str(self.pod_reads)}}}
            )
            await super().patch(kind, name, change, **kw)
        return obj

    async def patch(self, kind: Kind, name: str, patch: JsonObj, **kw: Any) -> JsonObj:
        if kind is Kind.POD:
            self.pod_patches += 1
        return await super().patch(kind, name, patch, **kw)

    async def bind(
        self,
        namespace: str,
        name: str,
        *,
        uid: str | None,
        node: str,
        annotations: Mapping[str, str] | None = None,
        resource_version: str | None = None,
    ) -> None:
        self.binds += 1
        self.binding_versions.append(resource_version)
        if self.before_bind:
            await self.before_bind.pop(0)()
        if self.bind_delay:
            await asyncio.sleep(self.bind_delay)
        if self.fail_bind:
            self.fail_bind -= 1
            if self.fail_read_back:
                self.fail_get = 1
            raise StoreError("node n1 is being drained", status=500)
        await super().bind(
            namespace, name, uid=uid, node=node, annotations=annotations, resource_version=resource_version
        )
        if self.lose_bind_reply:
            self.lose_bind_reply = False
            raise StoreError("connection reset by peer")
        if self.landed_409:  # the reply lost, a retrying client answered 409
            self.landed_409 = False
            raise Conflict(
                f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already assigned'
            )


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


async def test_failed_binding_leaves_neither_annotations_nor_reservation(
    start: Any, store: FlakyStore
) -> None:
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


async def test_a_bind_is_one_write_the_binding_carrying_the_annotations(
    start: Any, store: FlakyStore
) -> None:
    await add_node(store, payloads.gpunode("n1", gpus=2))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=2))
    before = await store.get(Kind.POD, "p", namespace="ml")
    store.pod_patches = 0
    assert await bind(client, pod) == ""
    assert store.binds == 1 and store.pod_patches == 0
    stored = await store.get(Kind.POD, "p", namespace="ml")
    assert int(stored["metadata"]["resourceVersion"]) == int(before["metadata"]["resourceVersion"]) + 1
    ann = stored["metadata"]["annotations"]
    assert stored["spec"]["nodeName"] == "n1" and ann[keys.ANN_ASSIGNED_GPUS] == "n1:0,1"
    assert ann[keys.ANN_ASSIGNED_UUIDS].count(",") == 1


async def test_lost_binding_reply_is_success(start: Any, store: FlakyStore) -> None:
    await add_node(store, payloads.gpunode("n1", gpus=2))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=1))
    store.lose_bind_reply = True
    # the Binding was created but its reply lost: read back, the pod is bound as asked
    assert await bind(client, pod) == ""
    stored = await store.get(Kind.POD, "p", namespace="ml")
    assert stored["spec"]["nodeName"] == "n1"
    assert keys.ANN_ASSIGNED_GPUS in stored["metadata"]["annotations"]
    assert await bind(client, pod) == ""  # the scheduler's retry is idempotent


async def test_a_binding_of_unknown_outcome_keeps_its_gpus_reserved_until_the_ttl(
    start: Any, store: FlakyStore
) -> None:
    """The Binding fails with a 5xx (it may have committed) and the pod cannot be read back:
    its GPUs stay reserved, so no other pod gets them before the watch or the TTL says."""
    await add_node(store, payloads.gpunode("n1", gpus=1))
    client = await start(app_settings=make_settings(reservation_ttl_seconds=0.5))
    pod = await add_pod(store, payloads.pod("p", gpus=1))
    other = await add_pod(store, payloads.pod("q", gpus=1))
    store.fail_bind = 1
    store.fail_read_back = True  # the pod's read after the failed Binding fails too
    error = await bind(client, pod)
    assert "being drained" in error
    inv = client.app[server.INVENTORY]
    assert inv.reservation(pod["metadata"]["uid"]) is not None
    assert "no longer fits" in await bind(client, other)
    # after the TTL the reservation lapses (the Binding never landed): the GPU is free again
    await asyncio.sleep(0.7)
    assert await bind(client, other) == ""
    assert inv.reservation(pod["metadata"]["uid"]) is None


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


# --------------------------------------------------------------------------- untrusted claims (finding 3)


async def seed_checked_node(store: FlakyStore) -> JsonObj:
    """n1: 8 GPUs; 0-1 held by a running pod, 2 unhealthy, 3 at tier LA, 4 tagged for
    ml/other; 5-7 free and fine. Returns the running pod."""
    await add_node(
        store,
        payloads.gpunode(
            "n1",
            tiers=["HA", "HA", "HA", "LA", "HA", "HA", "HA", "HA"],
            owners={4: "ml/other"},
            unhealthy={2},
        ),
    )
    return await add_pod(
        store,
        payloads.pod(
            "run", node_name="n1", phase="Running", annotations=payloads.assigned("n1", 0, 1), gpus=2
        ),
    )


@pytest.mark.parametrize(
    ("claimed", "problem"),
    [
        ((0, 1), "GPU 0 is held by pod ml/run"),  # a running pod's YAML, copied
        ((2, 5), "GPU 2 is unhealthy"),
        ((3, 5), "GPU 3 is at tier LA, the pod needs HA or above"),
        ((4, 5), "GPU 4 is tagged for ml/other"),  # another owner's lent GPU, for an HP pod
        ((5, 99), "n1 has no GPU 99"),
        ((5,), "it names 1 GPU, the pod needs 2"),  # a 2-GPU pod holding one device
    ],
)
async def test_a_claim_that_does_not_check_out_is_chosen_afresh(
    start: Any,
    store: FlakyStore,
    caplog: pytest.LogCaptureFixture,
    claimed: tuple[int, ...],
    problem: str,
) -> None:
    running = await seed_checked_node(store)
    client = await start()
    await synced(client, Kind.POD, running)
    pod = await add_pod(
        store,
        payloads.pod(
            "p",
            gpus=2,
            priority="high",
            owner="online",
            tier="HA",
            annotations=payloads.assigned("n1", *claimed),
        ),
    )
    await synced(client, Kind.POD, pod)
    with caplog.at_level(logging.WARNING, logger="extender.binder"):
        assert await bind(client, pod) == ""
    assert f"pod's existing assigned-gpus cannot be kept ({problem}); choosing GPUs afresh" in caplog.text
    ann = await annotations(store, "p")
    assert ann[keys.ANN_ASSIGNED_GPUS] == "n1:5,6"
    assert ann[keys.ANN_ASSIGNED_UUIDS] == payloads.assigned("n1", 5, 6)[keys.ANN_ASSIGNED_UUIDS]
    inv = client.app[server.INVENTORY]
    await eventually(
        lambda: (inv.snapshot().get("n1") or _never()).devices[5].holder == pod["metadata"]["uid"]
    )
    view = inv.snapshot().get("n1")
    assert view is not None and [d.holder for d in view.devices[:2]] == [running["metadata"]["uid"]] * 2


def _never() -> Any:
    raise AssertionError("node vanished")


async def test_a_copied_claim_on_a_full_node_fails_with_a_clear_error(start: Any, store: FlakyStore) -> None:
    await add_node(store, payloads.gpunode("n1", gpus=2))
    running = await add_pod(
        store,
        payloads.pod(
            "run", node_name="n1", phase="Running", annotations=payloads.assigned("n1", 0, 1), gpus=2
        ),
    )
    client = await start()
    copy = await add_pod(store, payloads.pod("copy", gpus=2, annotations=payloads.assigned("n1", 0, 1)))
    await synced(client, Kind.POD, copy)
    error = await bind(client, copy)
    assert error.startswith("no longer fits on n1: node(s) had fewer than 2 free GPUs")
    stored = await store.get(Kind.POD, "copy", namespace="ml")
    assert "nodeName" not in stored["spec"]
    inv = client.app[server.INVENTORY]
    view = inv.snapshot().get("n1")
    assert view is not None and {d.holder for d in view.devices} == {running["metadata"]["uid"]}
    assert inv.stats.claim_conflicts == 1


async def test_a_valid_leftover_claim_is_finished_without_rewriting(start: Any, store: FlakyStore) -> None:
    await add_node(store, payloads.gpunode("n1", gpus=4))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=2, annotations=payloads.assigned("n1", 2, 3)))
    await synced(client, Kind.POD, pod)
    assert await bind(client, pod) == ""
    stored = await store.get(Kind.POD, "p", namespace="ml")
    assert stored["metadata"]["annotations"] == pod["metadata"]["annotations"], "only the Binding was missing"
    assert stored["spec"]["nodeName"] == "n1"


# --------------------------------------------------------------------------- half-finished binds (finding 4)


async def test_an_interrupted_bind_does_not_strand_its_pod_and_its_claim_expires(
    start: Any, store: FlakyStore
) -> None:
    """The annotation was written, the Binding never created (the extender crashed between):
    the pod's own claim is free for it in filter, prioritize and bind; for other pods the GPUs
    stay taken until the reservation TTL, then they are released."""
    await add_node(store, payloads.gpunode("n1", gpus=2))
    await add_node(store, payloads.gpunode("n2", gpus=2))
    client = await start(app_settings=make_settings(reservation_ttl_seconds=0.5))
    stuck = await add_pod(
        store, payloads.pod("stuck", gpus=2, spec_priority=1000, annotations=payloads.assigned("n1", 0, 1))
    )
    await synced(client, Kind.POD, stuck)
    reply = await post(client, "filter", payloads.extender_args(stuck, ["n1", "n2"]))
    assert reply["NodeNames"] == ["n1", "n2"]
    assert reply["FailedNodes"] == {} and reply["FailedAndUnresolvableNodes"] == {}
    scores = await post(client, "prioritize", payloads.extender_args(stuck, ["n1", "n2"]))
    assert scores[0]["Score"] == scores[1]["Score"] > 0
    other = payloads.pod("other", gpus=2, spec_priority=1000)
    reply = await post(client, "filter", payloads.extender_args(other, ["n1"]))
    assert reply["FailedAndUnresolvableNodes"] == {
        "n1": "node(s) had fewer than 2 free GPUs; pods this pod cannot preempt hold the rest"
    }, "a bind in flight is never a victim"
    inv = client.app[server.INVENTORY]
    await eventually(lambda: inv.snapshot() is not None and inv.stats.claims_released == 1)
    reply = await post(client, "filter", payloads.extender_args(other, ["n1"]))
    assert reply["NodeNames"] == ["n1"]
    assert await bind(client, stuck) == ""
    assert (await annotations(store, "stuck"))[keys.ANN_ASSIGNED_GPUS] == "n1:0,1"


# ---------------------------------------------------------------- the Pod watch's copy of the pod


def sources(client: Any) -> dict[str, float]:
    """``flexlease_extender_bind_pod_sources_total`` by source."""
    registry = client.app[server.METRICS].registry
    return {
        src: registry.get_sample_value("flexlease_extender_bind_pod_sources_total", {"source": src}) or 0.0
        for src in ("watch", "read", "stale_watch")
    }


async def filtered(client: Any, pod: JsonObj, nodes: list[str]) -> JsonObj:
    """``/filter`` with ``pod`` as a nodeCacheCapable kube-scheduler sends it; the reply."""
    reply: JsonObj = await post(client, "filter", payloads.extender_args(pod, nodes))
    return reply


async def watched(client: Any, pod: JsonObj) -> JsonObj:
    """The Pod watch's copy of ``pod`` once the extender holds it (unbound)."""
    inv = client.app[server.INVENTORY]
    await eventually(lambda: inv.unbound_pod(pod["metadata"]["uid"]) is not None)
    copy: JsonObj = inv.unbound_pod(pod["metadata"]["uid"])
    return copy


def watch_lag(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Make the extender's Pod watch lag on demand (call before the app starts: the watch binds
    ``Inventory.apply_pod_event`` then): after the returned function is called, pod events
    are delivered no more."""
    lagging = [False]
    apply = Inventory.apply_pod_event

    def apply_unless_lagging(self: Inventory, event: Any) -> None:
        if not lagging[0]:
            apply(self, event)

    monkeypatch.setattr(Inventory, "apply_pod_event", apply_unless_lagging)

    def start_lagging() -> None:
        lagging[0] = True

    return start_lagging


async def watch_held_back(client: Any, pod: JsonObj, monkeypatch: pytest.MonkeyPatch) -> JsonObj:
    """The watch's copy of ``pod`` now, which the binder keeps getting after later changes
    (a lagging watch); returned."""
    old = await watched(client, pod)
    uid = pod["metadata"]["uid"]
    monkeypatch.setattr(client.app[server.INVENTORY], "unbound_pod", lambda u: old if u == uid else None)
    return old


async def test_a_bind_decides_on_the_watchs_copy_and_binds_on_its_version(
    start: Any, store: FlakyStore
) -> None:
    """The extender's Pod watch holds the pending pod: the binder decides on that copy (no read
    of the pod) and the Binding is conditional on the copy's resourceVersion."""
    await add_node(store, payloads.gpunode("n1", gpus=2))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=2))
    assert (await watched(client, pod))["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
    store.pod_reads = 0
    assert await bind(client, pod) == ""
    assert store.pod_reads == 0
    assert store.binding_versions == [pod["metadata"]["resourceVersion"]]
    assert sources(client) == {"watch": 1.0, "read": 0.0, "stale_watch": 0.0}
    stored = await store.get(Kind.POD, "p", namespace="ml")
    assert stored["spec"]["nodeName"] == "n1"
    assert stored["metadata"]["annotations"][keys.ANN_ASSIGNED_GPUS] == "n1:0,1"
    inv = client.app[server.INVENTORY]
    await eventually(lambda: inv.unbound_pod(pod["metadata"]["uid"]) is None)  # bound: no copy
    store.pod_reads = 0
    assert await bind(client, pod) == ""  # the scheduler's retry: bound as asked, on a read
    assert store.pod_reads == 1 and len(store.binding_versions) == 1
    assert sources(client)["read"] == 1.0


async def test_a_pod_without_gpus_binds_on_the_watchs_copy_too(start: Any, store: FlakyStore) -> None:
    await add_node(store, payloads.gpunode("n1", gpus=2))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=0))
    await watched(client, pod)
    store.pod_reads = 0
    assert await bind(client, pod) == ""
    assert store.pod_reads == 0 and store.binding_versions == [pod["metadata"]["resourceVersion"]]
    assert (await store.get(Kind.POD, "p", namespace="ml"))["spec"]["nodeName"] == "n1"


async def test_a_lagging_watch_costs_a_refused_binding_and_a_read(
    start: Any, store: FlakyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pod changed and the watch has not delivered it yet (held at the older copy): the
    conditional Binding is refused (409), its reservation forgotten, and the bind decided
    again on the pod as read."""
    await add_node(store, payloads.gpunode("n1", gpus=4))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=2))
    old = await watch_held_back(client, pod, monkeypatch)
    inv = client.app[server.INVENTORY]
    changed = await store.patch(Kind.POD, "p", {"metadata": {"labels": {"team": "ranking"}}}, namespace="ml")
    store.pod_reads = 0
    assert await bind(client, pod) == ""
    assert store.binding_versions == [
        old["metadata"]["resourceVersion"],
        changed["metadata"]["resourceVersion"],
    ]
    assert store.pod_reads == 1
    assert sources(client) == {"watch": 0.0, "read": 0.0, "stale_watch": 1.0}
    stored = await store.get(Kind.POD, "p", namespace="ml")
    assert stored["spec"]["nodeName"] == "n1" and stored["metadata"]["labels"]["team"] == "ranking"
    assert int(stored["metadata"]["resourceVersion"]) > int(changed["metadata"]["resourceVersion"])
    assert stored["metadata"]["annotations"][keys.ANN_ASSIGNED_GPUS] == "n1:0,1"
    await eventually(lambda: inv.holding(pod["metadata"]["uid"]) is not None)
    assert inv.claimed_nodes(pod["metadata"]["uid"]) == {"n1"}


async def without_watch_copy(
    start: Any, store: FlakyStore, monkeypatch: pytest.MonkeyPatch, node: JsonObj, pod: JsonObj
) -> tuple[Any, JsonObj]:
    """``node`` and pending ``pod`` in the store, the extender started, and its Pod watch
    giving the binder no copy of any pod (as for pods outside the watch's filter): every bind
    reads the pod. Returns (client, the pod as created)."""
    await add_node(store, node)
    client = await start()
    created = await add_pod(store, pod)
    monkeypatch.setattr(client.app[server.INVENTORY], "unbound_pod", lambda uid: None)
    return client, created


async def test_a_decision_on_a_read_is_never_applied_to_a_pod_changed_since(
    start: Any, store: FlakyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No watch copy: the bind decides on the pod as read, and another writer raises its
    reliability to HA before the Binding. The Binding, conditional on the version read, is
    refused; the pod read again no longer fits n1's LA GPUs, and nothing is written."""
    client, pod = await without_watch_copy(
        start, store, monkeypatch, payloads.gpunode("n1", gpus=2, tiers="LA"), payloads.pod("p", gpus=2)
    )
    inv = client.app[server.INVENTORY]
    store.after_pod_read = [{"metadata": {"annotations": {keys.ANN_RELIABILITY: "HA"}}}]
    error = await bind(client, pod)
    assert error.startswith("no longer fits on n1"), error
    assert store.binding_versions == [pod["metadata"]["resourceVersion"]]  # refused: the pod changed
    assert store.pod_reads == 2  # the read after the refusal decided the second time
    stored = await store.get(Kind.POD, "p", namespace="ml")
    assert (
        "nodeName" not in stored["spec"] and keys.ANN_ASSIGNED_GPUS not in stored["metadata"]["annotations"]
    )
    assert inv.reservation(pod["metadata"]["uid"]) is None
    assert sources(client)["read"] == 1.0


async def test_a_pod_that_changes_after_every_read_fails_its_bind_after_three(
    start: Any, store: FlakyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, pod = await without_watch_copy(
        start, store, monkeypatch, payloads.gpunode("n1", gpus=2), payloads.pod("p", gpus=2)
    )
    inv = client.app[server.INVENTORY]
    store.churn = True
    error = await bind(client, pod)
    assert error == "pod ml/p changed between its read and its Binding 3 times; retry"
    assert len(store.binding_versions) == 3 and None not in store.binding_versions
    assert inv.reservation(pod["metadata"]["uid"]) is None
    store.churn = False
    assert await bind(client, pod) == ""  # the scheduler's retry, once the pod holds still


async def two_pods_for_one_gpu(
    start: Any, store: FlakyStore, monkeypatch: pytest.MonkeyPatch, *, watch_copy: bool
) -> tuple[Any, JsonObj, JsonObj]:
    """Node n1 with one GPU, pending pods p and q held by the Pod watch, which then lags (so
    only reservations keep a GPU from the next pod); without ``watch_copy`` the binder gets
    no copy from the watch and reads each pod. Returns (client, p, q)."""
    lag = watch_lag(monkeypatch)  # before the watch starts
    await add_node(store, payloads.gpunode("n1", gpus=1))
    client = await start()
    p = await add_pod(store, payloads.pod("p", gpus=1))
    q = await add_pod(store, payloads.pod("q", gpus=1))
    await watched(client, q)
    await watched(client, p)
    if not watch_copy:
        monkeypatch.setattr(client.app[server.INVENTORY], "unbound_pod", lambda uid: None)
    lag()
    return client, p, q


@pytest.mark.parametrize("copy", ["watch", "read"])
async def test_a_binding_that_landed_but_was_answered_409_keeps_its_gpus_reserved(
    start: Any, store: FlakyStore, monkeypatch: pytest.MonkeyPatch, copy: str
) -> None:
    """The Binding landed, its reply was lost and the retry answered 409: one read finds the
    pod bound as asked, so the bind succeeds and the GPU stays reserved until the watch
    (lagging here) confirms it; the next pod cannot get it meanwhile."""
    client, p, q = await two_pods_for_one_gpu(start, store, monkeypatch, watch_copy=copy == "watch")
    inv = client.app[server.INVENTORY]
    store.landed_409 = True
    store.pod_reads = 0
    assert await bind(client, p) == ""
    assert store.pod_reads == (1 if copy == "watch" else 2) and len(store.binding_versions) == 1
    assert sources(client)[copy] == 1.0
    assert inv.reservation(p["metadata"]["uid"]) is not None
    assert (await bind(client, q)).startswith("no longer fits on n1")
    assert (await annotations(store, "p"))[keys.ANN_ASSIGNED_GPUS] == "n1:0"
    assert keys.ANN_ASSIGNED_GPUS not in await annotations(store, "q")


async def test_a_refused_binding_whose_pod_cannot_be_read_back_keeps_its_gpus_reserved(
    start: Any, store: FlakyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """409, then the read that would tell whether the Binding landed fails: unknown, so the
    bind fails and its reservation stays until its TTL; the next pod cannot get the GPU."""
    client, p, q = await two_pods_for_one_gpu(start, store, monkeypatch, watch_copy=False)
    inv = client.app[server.INVENTORY]

    async def reads_fail() -> None:
        store.fail_get = 1

    store.before_bind = [reads_fail]
    store.landed_409 = True
    error = await bind(client, p)
    assert "reading the pod back failed: etcdserver: request timed out" in error
    assert inv.reservation(p["metadata"]["uid"]) is not None
    assert (await bind(client, q)).startswith("no longer fits on n1")


async def test_a_pod_recreated_under_its_name_and_bound_is_not_the_pod_asked_for(
    start: Any, store: FlakyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the read and the Binding, pod p (uid U1) is deleted and created again (U2)
    already on n1: the Binding for U1 is refused, and the bind fails on the uid rather than
    reporting U2's binding as U1's."""
    client, pod = await without_watch_copy(
        start, store, monkeypatch, payloads.gpunode("n1", gpus=2), payloads.pod("p", gpus=0)
    )

    async def recreate() -> None:
        await store.delete(Kind.POD, "p", namespace="ml", grace_period_seconds=0)
        again = payloads.pod("p", gpus=0, node_name="n1")
        del again["metadata"]["resourceVersion"]
        await store.create(Kind.POD, again)

    store.before_bind = [recreate]
    error = await bind(client, pod)
    now = await store.get(Kind.POD, "p", namespace="ml")
    assert now["metadata"]["uid"] != pod["metadata"]["uid"]
    assert (
        error
        == f"pod ml/p has uid {now['metadata']['uid']}, the scheduler asked to bind {pod['metadata']['uid']}"
    )


async def test_a_pod_without_gpus_behind_a_lagging_watch_binds_on_one_read(
    start: Any, store: FlakyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await add_node(store, payloads.gpunode("n1", gpus=2))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=0))
    old = await watch_held_back(client, pod, monkeypatch)
    changed = await store.patch(Kind.POD, "p", {"metadata": {"labels": {"team": "ranking"}}}, namespace="ml")
    store.pod_reads = 0
    assert await bind(client, pod) == ""
    assert store.binding_versions == [
        old["metadata"]["resourceVersion"],
        changed["metadata"]["resourceVersion"],
    ]
    assert store.pod_reads == 1 and sources(client)["stale_watch"] == 1.0
    assert (await store.get(Kind.POD, "p", namespace="ml"))["spec"]["nodeName"] == "n1"


async def test_a_refusal_the_pod_itself_causes_is_reported_not_retried(start: Any, store: FlakyStore) -> None:
    """A 409 that reading again cannot cure (scheduling gates: the pod is at the version read)
    is reported in the API server's words after one Binding, not retried as a changed pod."""
    await add_node(store, payloads.gpunode("n1", gpus=2))
    client = await start()
    gated = payloads.pod("p", gpus=2)
    gated["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    pod = await add_pod(store, gated)
    error = await bind(client, pod)
    assert error == "binding pod ml/p to n1 failed: pod p has non-empty .spec.schedulingGates"
    assert store.binding_versions == [pod["metadata"]["resourceVersion"]]
    assert client.app[server.INVENTORY].reservation(pod["metadata"]["uid"]) is None


async def test_a_pod_bound_elsewhere_behind_the_watch_fails_and_frees_its_reservation(
    start: Any, store: FlakyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await add_node(store, payloads.gpunode("n1", gpus=2))
    await add_node(store, payloads.gpunode("n2", gpus=2))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=2))
    old = await watch_held_back(client, pod, monkeypatch)
    inv = client.app[server.INVENTORY]
    await store.bind("ml", "p", uid=None, node="n2")  # another binder got there first
    store.binding_versions.clear()
    error = await bind(client, pod, "n1")
    assert error == "pod ml/p is already bound to n2"
    assert store.binding_versions == [old["metadata"]["resourceVersion"]]  # none after the read
    assert inv.reservation(pod["metadata"]["uid"]) is None
    other = await add_pod(store, payloads.pod("q", gpus=2))
    assert await bind(client, other, "n1") == ""  # n1's GPUs were not left reserved


async def test_what_a_caller_sends_never_stands_in_for_the_pod(start: Any, store: FlakyStore) -> None:
    """A client that may call /filter sends a forged copy of another scheduler's pod (the
    right uid and resourceVersion, this scheduler's name, one GPU instead of four): /bind
    still decides on what the API server holds, and refuses it."""
    await add_node(store, payloads.gpunode("n1", gpus=2))
    client = await start()
    real = payloads.pod("p", gpus=4)
    real["spec"]["schedulerName"] = "someone-elses-scheduler"
    pod = await add_pod(store, real)
    await watched(client, pod)
    forged = copy.deepcopy(pod)
    forged["spec"]["schedulerName"] = keys.DEFAULT_SCHEDULER_NAME
    forged["spec"]["containers"][0]["resources"]["limits"][keys.DEFAULT_GPU_RESOURCE] = "1"
    forged["spec"]["containers"][0]["resources"]["requests"] = {keys.DEFAULT_GPU_RESOURCE: "1"}
    await post(client, "filter", payloads.extender_args(forged, ["n1"]))
    store.pod_reads = 0
    error = await bind(client, pod)
    assert "someone-elses-scheduler" in error
    assert store.pod_reads == 0 and sources(client)["watch"] == 1.0  # refused on the watch's copy
    stored = await store.get(Kind.POD, "p", namespace="ml")
    assert not stored["spec"].get("nodeName") and store.binds == 0


async def test_a_bind_naming_one_pod_with_anothers_uid_binds_neither(start: Any, store: FlakyStore) -> None:
    """The watch's copy is found by uid but used only for the pod /bind names: p with q's uid
    is read, and refused for its uid."""
    await add_node(store, payloads.gpunode("n1", gpus=4))
    client = await start()
    p = await add_pod(store, payloads.pod("p", gpus=1))
    q = await add_pod(store, payloads.pod("q", gpus=1))
    await watched(client, q)
    args = {**payloads.binding_args(p, "n1"), "PodUID": q["metadata"]["uid"]}
    resp = await client.post("/bind", json=args)
    assert "the scheduler asked to bind" in (await resp.json())["Error"]
    assert store.binds == 0 and sources(client)["read"] == 1.0
    for name in ("p", "q"):
        assert not (await store.get(Kind.POD, name, namespace="ml"))["spec"].get("nodeName")


async def test_the_watchs_copy_is_left_as_it_was(start: Any, store: FlakyStore) -> None:
    await add_node(store, payloads.gpunode("n1", gpus=2))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=2, annotations=payloads.assigned("n1", 0, 1)))
    held = await watched(client, pod)
    before = copy.deepcopy(held)
    assert await bind(client, pod) == ""
    assert held == before


async def test_a_failed_read_is_counted_as_a_read(
    start: Any, store: FlakyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, pod = await without_watch_copy(
        start, store, monkeypatch, payloads.gpunode("n1", gpus=2), payloads.pod("p", gpus=1)
    )
    store.fail_get = 1
    assert "cannot read pod ml/p" in await bind(client, pod)
    assert sources(client) == {"watch": 0.0, "read": 1.0, "stale_watch": 0.0}


async def test_filter_answers_for_the_pod_the_api_server_holds_at_that_version(
    start: Any, store: FlakyStore
) -> None:
    """A filter body at the version the Pod watch holds is answered from the watch's parse
    (what the API server wrote: four GPUs, whatever the body claims); a body at another
    version (the watch behind) is parsed as it comes."""
    await add_node(store, payloads.gpunode("n2", gpus=2))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=4))
    await watched(client, pod)
    claimed = copy.deepcopy(pod)
    claimed["spec"]["containers"][0]["resources"]["limits"][keys.DEFAULT_GPU_RESOURCE] = "1"
    claimed["spec"]["containers"][0]["resources"]["requests"] = {keys.DEFAULT_GPU_RESOURCE: "1"}
    reply = await filtered(client, claimed, ["n2"])
    assert reply["NodeNames"] == [] and "n2" in reply["FailedAndUnresolvableNodes"]
    claimed["metadata"]["resourceVersion"] = str(int(pod["metadata"]["resourceVersion"]) + 100)
    assert (await filtered(client, claimed, ["n2"]))["NodeNames"] == ["n2"]


async def test_an_honest_body_at_the_watchs_version_is_not_parsed_again(
    start: Any, store: FlakyStore
) -> None:
    """Filter, prioritize and preempt take the watch's parse: the shared parse cache sees
    nothing; a body the watch does not hold at that version is parsed (and a malformed one
    answered 400), while a malformed body at the watch's version is answered for the pod."""
    await add_node(store, payloads.gpunode("n1", gpus=4))
    client = await start()
    pod = await add_pod(store, payloads.pod("p", gpus=2))
    await watched(client, pod)
    pods = client.app[server.PODS]
    misses, hits = pods.misses, pods.hits
    assert (await filtered(client, pod, ["n1"]))["NodeNames"] == ["n1"]
    scores = await post(client, "prioritize", payloads.extender_args(pod, ["n1"]))
    assert [s["Host"] for s in scores] == ["n1"]
    await post(client, "preempt", payloads.preemption_args(pod, {}))
    assert (pods.misses, pods.hits) == (misses, hits)
    bad = copy.deepcopy(pod)
    bad["metadata"]["labels"][keys.LABEL_PRIORITY] = "High"
    assert (await filtered(client, bad, ["n1"]))["NodeNames"] == ["n1"]  # the API server's pod
    bad["metadata"]["resourceVersion"] = "999999"
    resp = await client.post("/filter", json=payloads.extender_args(bad, ["n1"]))
    assert resp.status == 400 and "priority" in (await resp.json())["Error"]
