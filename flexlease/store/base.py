"""The store seam: the small interface both deployables use to read and write cluster state.

flexlease keeps no state of its own (DESIGN.md §2): tiers, tags and health live in
``GPUNode`` objects, assignments in pod annotations. A store exposes exactly the Kubernetes
API verbs flexlease needs, over Kubernetes-shaped JSON objects (``dict``, camelCase, with
``metadata.resourceVersion``):

* ``list`` + ``watch`` (list, then watch from the list's resourceVersion; ``Gone`` → list again),
* ``get``, ``create``, JSON merge ``patch`` (RFC 7386) with an optional resourceVersion
  precondition and the ``status`` subresource, ``delete``,
* ``bind`` (the ``pods/binding`` subresource) and ``evict`` (``pods/eviction``, the
  Eviction API, so PodDisruptionBudgets are honoured).

Implementations: :mod:`flexlease.store.memory` (in-process; unit tests, simulator),
:mod:`flexlease.store.sqlite` (the embedded default: one SQLite file in WAL mode shared by
separate processes, watches read a revision log as k3s's kine does) and
:mod:`flexlease.store.kube` (kubernetes_asyncio). All pass ``tests/store/contract.py``.

Resource versions are opaque strings to callers (only compared for equality), but every
implementation also guarantees they are increasing integers rendered in decimal within one
store, which makes watches resumable.

Errors: only :mod:`flexlease.errors` — ``NotFound`` (404), ``Conflict`` (409: precondition
failed, already exists, already bound), ``Gone`` (410: resourceVersion too old to watch
from), ``TooManyRequests`` (429: eviction refused by a PodDisruptionBudget), ``StoreError``
for anything else, with the cause chained.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

JsonObj = dict[str, Any]


class Kind(enum.StrEnum):
    """Kinds a store serves. Values are the Kubernetes kind names."""

    POD = "Pod"
    GPUNODE = "GPUNode"  # flexlease.io/v1alpha1, cluster-scoped
    GPULEASE = "GPULease"  # flexlease.io/v1alpha1, namespaced
    GPULEASEPOLICY = "GPULeasePolicy"  # flexlease.io/v1alpha1, namespaced (the lease autopilot)
    EVENT = "Event"  # core/v1 (write-mostly; list/watch supported for tests)
    LEASE = "Lease"  # coordination.k8s.io/v1, for leader election
    PDB = "PodDisruptionBudget"  # policy/v1, consulted by evict
    NODE = "Node"  # core/v1, cluster-scoped; read by /bind to refuse nodes that do not exist
    STATEFULSET = "StatefulSet"  # apps/v1; watched by the in-place rollout (extender.rollout)
    # Training-operator jobs, custom resources of other projects (no dependency on their code):
    # read and annotated by the in-place rollout (extender.rollout.jobs)
    PYTORCHJOB = "PyTorchJob"  # kubeflow.org/v1 (kubeflow/training-operator)
    MPIJOB = "MPIJob"  # kubeflow.org/v1 (kubeflow/training-operator)
    RAYCLUSTER = "RayCluster"  # ray.io/v1 (ray-project/kuberay)

    @property
    def namespaced(self) -> bool:
        return self not in (Kind.GPUNODE, Kind.NODE)


class EventType(enum.StrEnum):
    """Watch event types, as in ``metav1.WatchEvent``. ``BOOKMARK`` carries only a
    resourceVersion in ``object.metadata`` and never changes state."""

    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    BOOKMARK = "BOOKMARK"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change. ``object`` is the full object after the change (for DELETED: its last state)."""

    type: EventType
    object: JsonObj

    @property
    def resource_version(self) -> str:
        return str(self.object.get("metadata", {}).get("resourceVersion", ""))


@dataclass(frozen=True, slots=True)
class ObjectList:
    """A consistent list: ``items`` as of ``resource_version`` (watch from there)."""

    items: list[JsonObj]
    resource_version: str


@dataclass(frozen=True, slots=True)
class Selector:
    """Server-side filtering for list and watch, like ``labelSelector``/``fieldSelector``.

    ``labels``: every key must equal the value. ``fields``: dotted paths that must equal
    (``spec.nodeName``, ``metadata.name``). Empty = everything.
    """

    labels: Mapping[str, str] = field(default_factory=dict)
    fields: Mapping[str, str] = field(default_factory=dict)

    def matches(self, obj: JsonObj) -> bool:
        meta = obj.get("metadata") or {}
        obj_labels = meta.get("labels") or {}
        if any(obj_labels.get(k) != v for k, v in self.labels.items()):
            return False
        for path, want in self.fields.items():
            cur: Any = obj
            for part in path.split("."):
                cur = cur.get(part) if isinstance(cur, dict) else None
            if (cur if cur is not None else "") != want:
                return False
        return True


EVERYTHING = Selector()


@runtime_checkable
class Store(Protocol):
    """The store interface. Every method is a coroutine except ``watch`` (an async iterator)."""

    async def list(
        self, kind: Kind, *, namespace: str | None = None, selector: Selector = EVERYTHING
    ) -> ObjectList:
        """Objects of ``kind`` (all namespaces when ``namespace`` is None) and the list's
        resourceVersion."""
        ...

    def watch(
        self,
        kind: Kind,
        *,
        resource_version: str,
        namespace: str | None = None,
        selector: Selector = EVERYTHING,
    ) -> AsyncIterator[WatchEvent]:
        """Changes strictly after ``resource_version``, in order, until the caller stops
        iterating or the store closes. Raises ``Gone`` (possibly at the first ``__anext__``)
        when that version is no longer available. An object that stops matching
        ``selector`` is delivered as DELETED. May yield BOOKMARK events."""
        ...

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> JsonObj:
        """One object. Raises ``NotFound``."""
        ...

    async def create(self, kind: Kind, obj: JsonObj) -> JsonObj:
        """Create; the store sets ``metadata.uid``, ``resourceVersion``,
        ``creationTimestamp``. Raises ``Conflict`` if the name exists in that namespace.
        As the API server, create drops ``status`` for kinds with a status subresource (Pods
        start with ``status.phase: Pending``); write it with ``patch(subresource="status")``."""
        ...

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
        """Apply a JSON merge patch (RFC 7386: ``null`` deletes a key) and return the new
        object. ``subresource="status"`` patches only ``status``; otherwise ``status`` in the
        patch is ignored for kinds with a status subresource (GPUNode, GPULease, Pod).
        ``resource_version`` is an optimistic-concurrency precondition: ``Conflict`` when the
        object has moved on. Raises ``NotFound``."""
        ...

    async def delete(
        self, kind: Kind, name: str, *, namespace: str | None = None, grace_period_seconds: int | None = None
    ) -> None:
        """Delete. A Pod bound to a node is deleted gracefully, as by the API server (see
        :func:`flexlease.store.semantics.delete_pod`): it stays, Terminating (MODIFIED with
        ``metadata.deletionTimestamp`` and ``deletionGracePeriodSeconds``, default its
        ``spec.terminationGracePeriodSeconds`` or 30), still holding its devices, until a
        delete with ``grace_period_seconds=0`` — the kubelet's confirmation that its
        containers are gone (:func:`flexlease.store.graceful.confirm_pod_deletion`).
        Unbound and terminal pods and other kinds go at once. Raises ``NotFound``."""
        ...

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
        """Create the pod's Binding (``pods/binding``): sets ``spec.nodeName`` and adds the
        Binding's ``metadata.annotations`` to the pod's, in one write (the API server's
        ``BindingREST``, ``setPodNodeAndMetadata`` in pkg/registry/core/pod/storage). Raises
        ``NotFound``; ``Conflict`` when the pod is already bound (to any node), or ``uid`` or
        ``resource_version`` (the Binding's ``metadata.resourceVersion``: the pod must still
        be that version, a precondition the API server checks before anything else) does
        not match."""
        ...

    async def evict(self, namespace: str, name: str, *, grace_period_seconds: int | None = None) -> None:
        """Evict through the Eviction API (``policy/v1``): the pod is then deleted as by
        :meth:`delete` with ``grace_period_seconds`` (so it stays Terminating until
        confirmed). Raises ``NotFound``; ``TooManyRequests`` when a PodDisruptionBudget
        forbids it now."""
        ...

    async def close(self) -> None:
        """Release connections; running watches end."""
        ...
