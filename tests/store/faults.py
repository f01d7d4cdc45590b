"""A store wrapper for conflict and fault paths: fail the Nth call of a verb, before it lands
(the server refused: 409, 500, 429) or after it (the write landed but the reply was lost, as
when a connection drops after etcd committed), and check every custom resource written
against its CRD. Wraps any :class:`flexlease.store.base.Store` (memory, sqlite, kube).

Real behaviours reproduced: kube-apiserver answers a stale ``resourceVersion`` precondition
with 409 Conflict ("the object has been modified; please apply your changes to the latest
version and try again", ``staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go``);
a client whose connection drops after the server committed sees an error although the write
took effect (client-go documents retries as possibly repeating a committed write, hence
``RetryOnConflict`` re-reads); custom resources are pruned and validated against the CRD's
structural schema on every write (:mod:`standins.crd_schema`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flexlease.errors import Conflict, StoreError
from flexlease.store.base import EVERYTHING, JsonObj, Kind, ObjectList, Selector, Store, WatchEvent
from standins.crd_schema import SchemaError, is_custom_kind, prune_and_validate

VERBS = ("get", "list", "create", "patch", "delete", "bind", "evict")


def conflict() -> Conflict:
    """The API server's 409 for a stale resourceVersion precondition."""
    return Conflict(
        "Operation cannot be fulfilled: the object has been modified; please apply your changes "
        "to the latest version and try again"
    )


@dataclass(slots=True)
class Fault:
    """Fail calls ``nth`` .. ``nth + times - 1`` (1-based, counted among the calls that
    match) of ``verb`` on ``kind`` whose arguments contain ``match`` (in their JSON text).
    ``after``: let the call land first, then raise (a lost reply)."""

    verb: str
    error: Callable[[], Exception]
    kind: Kind | None = None
    match: str = ""
    nth: int = 1
    times: int = 1
    after: bool = False
    seen: int = 0
    fired: int = 0

    def applies(self, verb: str, kind: Kind | None, text: str) -> bool:
        if verb != self.verb or (self.kind is not None and kind is not self.kind) or self.match not in text:
            return False
        self.seen += 1
        if self.nth <= self.seen < self.nth + self.times:
            self.fired += 1
            return True
        return False


@dataclass(slots=True)
class FaultyStore:
    """``inner`` with injected faults (:meth:`fail`), call counts per verb (``calls``) and,
    with ``check_crds``, every GPUNode/GPULease a write returns checked against its CRD:
    an object the API server would reject or prune is recorded in ``crd_violations`` (and
    the write raises 422, as the server would have refused it)."""

    inner: Store
    check_crds: bool = False
    faults: list[Fault] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    crd_checked: int = 0
    crd_violations: list[str] = field(default_factory=list)

    def fail(
        self,
        verb: str,
        *,
        kind: Kind | None = None,
        match: str = "",
        nth: int = 1,
        times: int = 1,
        after: bool = False,
        error: Callable[[], Exception] = conflict,
    ) -> Fault:
        """Register a fault (see :class:`Fault`); returns it, so a test can read ``fired``."""
        if verb not in VERBS:
            raise ValueError(f"unknown verb {verb!r}")
        fault = Fault(verb, error, kind=kind, match=match, nth=nth, times=times, after=after)
        self.faults.append(fault)
        return fault

    async def _call(self, verb: str, kind: Kind | None, args: Any, call: Callable[[], Any]) -> Any:
        self.calls[verb] = self.calls.get(verb, 0) + 1
        text = json.dumps(args, default=str, sort_keys=True)
        firing = [f for f in self.faults if f.applies(verb, kind, text)]
        before = next((f for f in firing if not f.after), None)
        if before is not None:
            raise before.error()
        result = await call()
        after = next((f for f in firing if f.after), None)
        if after is not None:
            raise after.error()
        return result

    def _check(self, kind: Kind, obj: JsonObj) -> JsonObj:
        if not self.check_crds or not is_custom_kind(kind.value):
            return obj
        self.crd_checked += 1
        dropped: list[str] = []
        name = (obj.get("metadata") or {}).get("name")
        try:
            prune_and_validate(obj, dropped=dropped)
        except SchemaError as exc:
            self.crd_violations.append(str(exc))
            raise StoreError(str(exc), status=422) from exc
        if dropped:
            self.crd_violations.append(f"{kind} {name}: the API server would prune {dropped}")
        return obj

    async def list(
        self, kind: Kind, *, namespace: str | None = None, selector: Selector = EVERYTHING
    ) -> ObjectList:
        result: ObjectList = await self._call(
            "list", kind, [namespace], lambda: self.inner.list(kind, namespace=namespace, selector=selector)
        )
        return result

    def watch(
        self,
        kind: Kind,
        *,
        resource_version: str,
        namespace: str | None = None,
        selector: Selector = EVERYTHING,
    ) -> AsyncIterator[WatchEvent]:
        return self.inner.watch(
            kind, resource_version=resource_version, namespace=namespace, selector=selector
        )

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> JsonObj:
        result: JsonObj = await self._call(
            "get", kind, [name, namespace], lambda: self.inner.get(kind, name, namespace=namespace)
        )
        return result

    async def create(self, kind: Kind, obj: JsonObj) -> JsonObj:
        result: JsonObj = await self._call("create", kind, obj, lambda: self.inner.create(kind, obj))
        return self._check(kind, result)

    async def patch(
        self,
        kind: Kind,
        name: str,
        patch: JsonObj,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        resource_version: str | None = None,
    ) -> JsonObj:
        result: JsonObj = await self._call(
            "patch",
            kind,
            [name, namespace, subresource, patch],
            lambda: self.inner.patch(
                kind,
                name,
                patch,
                namespace=namespace,
                subresource=subresource,
                resource_version=resource_version,
            ),
        )
        return self._check(kind, result)

    async def delete(self, kind: Kind, name: str, *, namespace: str | None = None, **kw: Any) -> None:
        await self._call(
            "delete",
            kind,
            [name, namespace],
            lambda: self.inner.delete(kind, name, namespace=namespace, **kw),
        )

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
        await self._call(
            "bind",
            Kind.POD,
            [namespace, name, node, annotations or {}],
            lambda: self.inner.bind(
                namespace,
                name,
                uid=uid,
                node=node,
                annotations=annotations,
                resource_version=resource_version,
            ),
        )

    async def evict(self, namespace: str, name: str, *, grace_period_seconds: int | None = None) -> None:
        await self._call(
            "evict",
            Kind.POD,
            [namespace, name],
            lambda: self.inner.evict(namespace, name, grace_period_seconds=grace_period_seconds),
        )

    async def close(self) -> None:
        await self.inner.close()
