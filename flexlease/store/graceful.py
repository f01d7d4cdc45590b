"""The kubelet's half of graceful pod deletion, for places that have no kubelet.

A DELETE or an eviction of a bound pod leaves it Terminating (``metadata.deletionTimestamp``),
still holding its GPUs, until the kubelet on its node has stopped its containers and sends a
DELETE with grace period 0 (kubelet ``status_manager``: ``Delete`` with
``GracePeriodSeconds: 0`` and a UID precondition once the pod's containers are gone; it kills
them at the latest when the grace period ends). The demo's kubelet stand-in, the simulator and
tests confirm deletions with these helpers; on a real cluster the kubelet does it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from datetime import datetime

from flexlease.errors import NotFound
from flexlease.store import semantics
from flexlease.store.base import JsonObj, Kind, Store


async def confirm_pod_deletion(store: Store, namespace: str, name: str) -> bool:
    """Confirm that pod ``namespace/name``'s containers are gone: DELETE with grace 0, so the
    pod is removed. Returns False when it was already gone. Raises ``StoreError`` otherwise."""
    try:
        await store.delete(Kind.POD, name, namespace=namespace, grace_period_seconds=0)
    except NotFound:
        return False
    return True


def grace_expired(pod: JsonObj, now: datetime) -> bool:
    """True when ``pod`` is Terminating and its ``deletionTimestamp`` (the end of its grace
    period, RFC 3339) is at or before ``now`` (timezone-aware)."""
    stamp = (pod.get("metadata") or {}).get("deletionTimestamp")
    if not stamp:
        return False
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")) <= now


async def confirm_terminating(
    store: Store, *, now: datetime | None = None, namespace: str | None = None
) -> list[str]:
    """Confirm the deletion of every Terminating pod (only those whose grace period has
    ended at ``now``, when given), as kubelets would once the containers stopped. Returns
    the ``namespace/name`` of the pods removed, sorted."""
    return await confirm_listed(store, (await store.list(Kind.POD, namespace=namespace)).items, now=now)


async def confirm_listed(store: Store, pods: Iterable[JsonObj], *, now: datetime | None = None) -> list[str]:
    """:func:`confirm_terminating` for pods already listed (``pods``: Pod objects as a list
    returned them): confirm the deletion of those Terminating (at ``now``, when given).
    Returns the ``namespace/name`` of the pods removed, sorted."""
    done: list[str] = []
    for pod in pods:
        if not semantics.is_terminating(pod) or (now is not None and not grace_expired(pod, now)):
            continue
        meta = pod["metadata"]
        with contextlib.suppress(NotFound):
            if await confirm_pod_deletion(store, meta["namespace"], meta["name"]):
                done.append(f"{meta['namespace']}/{meta['name']}")
    return sorted(done)
