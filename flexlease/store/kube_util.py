"""Two client-go helpers on the Store Protocol, for the lease controller and the node agent:
read-modify-write retried on conflict (``k8s.io/client-go/util/retry.RetryOnConflict``) and an
Event recorder (``k8s.io/client-go/tools/record``). Both work on every store
(KubeStore, SqliteStore, MemoryStore): they only use ``get``/``patch``/``create``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal, TypeVar

from flexlease.clock import Clock, format_time
from flexlease.errors import Conflict, NotFound, StoreError
from flexlease.logging import ctx
from flexlease.store.base import JsonObj, Kind, Store

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How often and how patiently to retry on ``Conflict`` (client-go ``wait.Backoff``):
    at most ``steps`` attempts; before attempt n+1 wait ``delay * factor**(n-1)`` seconds
    (capped at ``maximum``) stretched by up to ``jitter`` (ratio 0–1)."""

    steps: int = 5
    delay: float = 0.01
    factor: float = 1.0
    jitter: float = 0.1
    maximum: float = 1.0

    def wait(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        base = min(self.maximum, self.delay * self.factor ** max(0, attempt - 1))
        return base * (1.0 + self.jitter * random.random())


DEFAULT_RETRY: Final = RetryPolicy()
"""client-go ``retry.DefaultRetry``: 5 attempts, 10 ms apart, jitter 0.1."""
DEFAULT_BACKOFF: Final = RetryPolicy(steps=4, delay=0.01, factor=5.0)
"""client-go ``retry.DefaultBackoff``: 4 attempts, 10 ms growing ×5 (for contended objects)."""


async def retry_on_conflict(attempt: Callable[[], Awaitable[T]], *, policy: RetryPolicy = DEFAULT_RETRY) -> T:
    """Run ``attempt`` until it returns without ``Conflict``, at most ``policy.steps`` times.

    ``attempt`` must read what it modifies afresh each time (a GET, not a cached copy).
    Returns its result; re-raises the last ``Conflict`` when every attempt conflicted, and
    any other error at once.
    """
    for n in range(1, policy.steps + 1):
        try:
            return await attempt()
        except Conflict:
            if n == policy.steps:
                raise
            await asyncio.sleep(policy.wait(n))
    raise AssertionError("unreachable: RetryPolicy.steps must be at least 1")


Mutation = Callable[[JsonObj], JsonObj | None]
"""Given the object as just read, the JSON merge patch to apply, or None when nothing needs
to change. Pure: it may run several times."""


async def update_with_retry(
    store: Store,
    kind: Kind,
    name: str,
    mutate: Mutation,
    *,
    namespace: str | None = None,
    subresource: str | None = None,
    policy: RetryPolicy = DEFAULT_RETRY,
) -> JsonObj:
    """Read-modify-write under optimistic concurrency: GET the object, ``patch = mutate(obj)``,
    PATCH it with the object's resourceVersion as precondition; on ``Conflict`` start again
    from a fresh GET (up to ``policy.steps`` times).

    Returns the object after the write (or as read, when ``mutate`` returned None). Raises
    ``NotFound``, ``Conflict`` (every attempt lost the race), other ``StoreError``s, and what
    ``mutate`` raises. A write is either applied whole or not at all.
    """

    async def attempt() -> JsonObj:
        current = await store.get(kind, name, namespace=namespace)
        patch = mutate(current)
        if patch is None:
            return current
        return await store.patch(
            kind,
            name,
            patch,
            namespace=namespace,
            subresource=subresource,
            resource_version=str(current["metadata"]["resourceVersion"]),
        )

    return await retry_on_conflict(attempt, policy=policy)


EventType = Literal["Normal", "Warning"]

_MAX_MESSAGE: Final = 1024
_MAX_REASON: Final = 128
_CACHE_SIZE: Final = 4096
_DEFAULT_NAMESPACE: Final = "default"


class EventRecorder:
    """Writes core/v1 Events about objects, as client-go's ``record.EventRecorder`` does.

    ``component``: the ``source.component`` and ``reportingComponent`` (e.g.
    ``flexlease-extender``); ``instance``: ``reportingInstance`` and ``source.host`` (pod or
    node name). An Event goes in the involved object's namespace (``default`` for
    cluster-scoped objects such as GPUNodes). A repeat of the same (object, type, reason,
    message) within ``aggregate_seconds`` bumps ``count`` and ``lastTimestamp`` of the
    existing Event instead of creating one (client-go's EventCorrelator). ``clock``: where the
    timestamps and the aggregation window's time come from (default: the system's; a
    simulation passes its virtual clock so that its Events do not depend on wall time).

    Events are best-effort by Kubernetes' design: a name clash is retried once under a new
    name; any other failed write is reported as a warning log line, never raised.
    """

    def __init__(
        self,
        store: Store,
        *,
        component: str,
        instance: str = "",
        aggregate_seconds: float = 600.0,
        clock: Clock | None = None,
    ) -> None:
        self._clock = clock
        self._store = store
        self._component = component
        self._instance = instance
        self._aggregate = aggregate_seconds
        self._seen: OrderedDict[tuple[str, ...], tuple[str, str, int, float]] = OrderedDict()

    def _utc(self) -> datetime:
        return self._clock.now_utc() if self._clock is not None else datetime.now(UTC)

    async def record(
        self,
        involved: JsonObj,
        *,
        type: EventType,
        reason: str,
        message: str,
        action: str = "",
    ) -> JsonObj | None:
        """Record an Event about ``involved`` (any object with ``apiVersion``, ``kind`` and
        ``metadata.name``/``uid``). ``reason``: UpperCamelCase, ≤ 128 characters;
        ``message``: free text, cut at 1024 characters. Returns the Event written, or None
        when the write failed (logged)."""
        meta = involved.get("metadata") or {}
        obj_ns = str(meta.get("namespace") or "")
        namespace = obj_ns or _DEFAULT_NAMESPACE
        reason = reason[:_MAX_REASON]
        message = message[:_MAX_MESSAGE]
        key = (
            str(involved.get("kind")),
            obj_ns,
            str(meta.get("name")),
            str(meta.get("uid")),
            type,
            reason,
            message,
        )
        now = self._clock.now() if self._clock is not None else time.monotonic()
        cached = self._seen.get(key)
        try:
            if cached is not None and now - cached[3] < self._aggregate:
                name, ns, count, _ = cached
                try:
                    event = await self._store.patch(
                        Kind.EVENT,
                        name,
                        {"count": count + 1, "lastTimestamp": format_time(self._utc())},
                        namespace=ns,
                    )
                    self._remember(key, name, ns, count + 1, now)
                    return event
                except NotFound:
                    pass  # the Event expired (the API server keeps them 1 h by default): write anew
            event = await self._create(
                involved, namespace, type=type, reason=reason, message=message, action=action
            )
        except StoreError as exc:
            log.warning(
                "event not recorded",
                extra=ctx(
                    object=f"{obj_ns}/{meta.get('name')}",
                    kind=involved.get("kind"),
                    reason=reason,
                    error=str(exc),
                ),
            )
            return None
        self._remember(key, str(event["metadata"]["name"]), namespace, 1, now)
        return event

    def _remember(self, key: tuple[str, ...], name: str, namespace: str, count: int, when: float) -> None:
        self._seen[key] = (name, namespace, count, when)
        self._seen.move_to_end(key)
        while len(self._seen) > _CACHE_SIZE:
            self._seen.popitem(last=False)

    async def _create(
        self, involved: JsonObj, namespace: str, *, type: EventType, reason: str, message: str, action: str
    ) -> JsonObj:
        meta = involved.get("metadata") or {}
        ref: JsonObj = {
            "apiVersion": involved.get("apiVersion", ""),
            "kind": involved.get("kind", ""),
            "name": meta.get("name", ""),
        }
        for src, dst in (("namespace", "namespace"), ("uid", "uid"), ("resourceVersion", "resourceVersion")):
            if meta.get(src):
                ref[dst] = meta[src]
        stamp = format_time(self._utc())
        event: JsonObj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta.get('name')}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": ref,
            "reason": reason,
            "message": message,
            "type": type,
            "source": {"component": self._component, **({"host": self._instance} if self._instance else {})},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "reportingComponent": self._component,
            "reportingInstance": self._instance,
        }
        if action:
            event["action"] = action
        try:
            return await self._store.create(Kind.EVENT, event)
        except Conflict:
            event["metadata"]["name"] = f"{meta.get('name')}.{time.time_ns():x}"
            return await self._store.create(Kind.EVENT, event)
