"""The kubelet's confirmation helpers: Terminating pods are removed only when confirmed, and
with ``now`` only once their grace period has ended."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from flexlease.store.base import Kind
from flexlease.store.graceful import confirm_listed, confirm_pod_deletion, confirm_terminating, grace_expired
from flexlease.store.memory import MemoryStore
from tests.store.contract import NS, make_pod


async def test_confirm_terminating_honours_the_grace_period_when_given_a_time() -> None:
    store = MemoryStore()
    for name in ("short", "long", "running"):
        await store.create(Kind.POD, make_pod(name, node="gpu-1"))
    await store.delete(Kind.POD, "short", namespace=NS, grace_period_seconds=5)
    await store.delete(Kind.POD, "long", namespace=NS, grace_period_seconds=600)
    short = await store.get(Kind.POD, "short", namespace=NS)
    now = datetime.now(UTC)
    assert not grace_expired(short, now - timedelta(seconds=10))
    assert grace_expired(short, now + timedelta(seconds=10))
    assert await confirm_terminating(store, now=now + timedelta(seconds=60)) == [f"{NS}/short"]
    assert {p["metadata"]["name"] for p in (await store.list(Kind.POD)).items} == {"long", "running"}
    assert await confirm_terminating(store) == [f"{NS}/long"]  # without a time: every Terminating pod
    assert await confirm_pod_deletion(store, NS, "long") is False  # already gone
    assert [p["metadata"]["name"] for p in (await store.list(Kind.POD)).items] == ["running"]
    await store.close()


async def test_confirm_listed_confirms_the_terminating_pods_of_a_list_already_made() -> None:
    store = MemoryStore()
    for name in ("gone", "terminating", "running"):
        await store.create(Kind.POD, make_pod(name, node="gpu-1"))
    await store.delete(Kind.POD, "terminating", namespace=NS)
    listed = (await store.list(Kind.POD)).items
    await store.delete(Kind.POD, "gone", namespace=NS, grace_period_seconds=0)  # after the list
    assert await confirm_listed(store, listed) == [f"{NS}/terminating"]
    assert [p["metadata"]["name"] for p in (await store.list(Kind.POD)).items] == ["running"]
    await store.close()
