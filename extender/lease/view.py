"""A frozen picture of the cluster's GPUs, derived from GPUNodes and pods (DESIGN §2).

State is derived, never duplicated: which pod holds a GPU comes only from the
``flexlease.io/assigned-gpus`` annotation of non-terminated pods; pool, tags, model, tier and
health come from the ``GPUNode``. A device is in the view when its GPUNode's status reports it
or its spec still tags it (a tagged device the agent no longer reports has *vanished*).
Pure; no I/O.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from extender.orchestrator import profile as profiles
from flexlease.api import keys
from flexlease.api.pod import Priority, parse_pod, salvage_assignment
from flexlease.api.resources import DeviceKey, GPUNode, Health, Pool
from flexlease.api.tiers import Tier
from flexlease.errors import PodSpecError


@dataclass(frozen=True, slots=True, kw_only=True)
class Holder:
    """A non-terminated pod that holds GPUs (``assigned-gpus``).

    ``deadline`` is its graceful-reclaim notice (``preempt-deadline``, UTC) or None;
    ``resource_version`` is the pod's ``metadata.resourceVersion`` when read.
    """

    namespace: str
    name: str
    uid: str
    owner: str | None
    priority: Priority
    deadline: datetime | None
    resource_version: str
    devices: tuple[DeviceKey, ...]
    terminating: bool = False
    """The pod has a ``deletionTimestamp``: it still holds its GPUs until it is gone, but
    needs no further notice or eviction."""
    critical: bool = False
    """Its ``flexlease.io/role`` is critical in its framework profile (coordinator, Ray head,
    rank 0: WeFlex §3.4): it is never given a reclaim notice or evicted; a lent GPU it holds is
    replaced from the standby pool instead, as for a high-priority pod."""

    @property
    def key(self) -> str:
        """``<namespace>/<name>``."""
        return f"{self.namespace}/{self.name}"

    def belongs_to(self, owner: str) -> bool:
        """MATCH(Pod, Owner) of Algorithm 1."""
        return self.owner == owner


@dataclass(frozen=True, slots=True, kw_only=True)
class Gpu:
    """One GPU as the lease controller sees it.

    ``model``, ``tier`` (effective: spec override, else agent's) and ``health`` are None when
    the agent does not report the device (vanished). ``owner``/``leased_at`` are its tag.
    """

    key: DeviceKey
    pool: Pool
    model: str | None
    tier: Tier | None
    health: Health | None
    owner: str | None
    leased_at: datetime | None
    holder: Holder | None

    @property
    def present(self) -> bool:
        """The node agent reports this device."""
        return self.health is not None

    @property
    def failed(self) -> bool:
        """Vanished, or reported Unhealthy or Unknown (NVML cannot see it): not reclaimable."""
        return self.health is not Health.HEALTHY

    @property
    def free(self) -> bool:
        """No non-terminated pod holds it."""
        return self.holder is None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterView:
    """GPUs by key, GPUNode pools and resourceVersions by node name, pods holding GPUs by
    ``<ns>/<name>``, and ``problems``: one line per object that could not be read (skipped).
    ``by_node``: each node's GPUs ordered by index, derived from ``gpus`` when not given."""

    gpus: Mapping[DeviceKey, Gpu]
    pools: Mapping[str, Pool]
    node_versions: Mapping[str, str]
    holders: Mapping[str, Holder]
    problems: tuple[str, ...] = ()
    by_node: Mapping[str, tuple[Gpu, ...]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.gpus and not self.by_node:
            index: dict[str, list[Gpu]] = {}
            for gpu in self.gpus.values():
                index.setdefault(gpu.key.node, []).append(gpu)
            by_node = {n: tuple(sorted(gs, key=lambda g: g.key.index)) for n, gs in index.items()}
            object.__setattr__(self, "by_node", by_node)

    def node_gpus(self, node: str) -> list[Gpu]:
        """The node's GPUs ordered by index (empty when the GPUNode is unknown)."""
        return list(self.by_node.get(node, ()))

    def tagged(self, owner: str) -> list[Gpu]:
        """GPUs tagged with ``owner``, ordered by key."""
        return sorted((g for g in self.gpus.values() if g.owner == owner), key=lambda g: g.key)

    def held_by(self, owner: str) -> set[DeviceKey]:
        """Devices (known or not) that pods of ``owner`` hold."""
        return {d for h in self.holders.values() if h.belongs_to(owner) for d in h.devices}


def parse_time(value: str) -> datetime:
    """Parse an RFC 3339 timestamp into an aware UTC datetime. Raises ``ValueError``."""
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone")
    return parsed.astimezone(UTC)


def read_holder(
    pod: dict[str, Any],
    resource: str = keys.DEFAULT_GPU_RESOURCE,
    *,
    critical: Mapping[str, frozenset[str]] | None = None,
) -> Holder | None:
    """The pod as a :class:`Holder`, or None when it holds no GPU (unbound or terminated).
    ``critical``: each framework profile's critical roles (default: the shipped profiles').
    Raises :class:`PodSpecError` on malformed flexlease labels/annotations."""
    request = parse_pod(pod, resource)
    if request.terminated or request.assignment is None:
        return None
    meta = pod.get("metadata") or {}
    raw_deadline = (meta.get("annotations") or {}).get(keys.ANN_PREEMPT_DEADLINE)
    deadline = None
    if raw_deadline:
        try:
            deadline = parse_time(str(raw_deadline))
        except ValueError as exc:
            raise PodSpecError(f"annotation {keys.ANN_PREEMPT_DEADLINE}={raw_deadline!r}: {exc}") from exc
    return Holder(
        namespace=request.namespace,
        name=request.name,
        uid=request.uid,
        owner=request.owner,
        priority=request.priority,
        deadline=deadline,
        resource_version=str(meta.get("resourceVersion") or ""),
        devices=request.assignment.devices,
        terminating=bool(meta.get("deletionTimestamp")),
        critical=profiles.is_critical(
            _labels(meta), profiles.builtin_critical() if critical is None else critical
        ),
    )


def _labels(meta: dict[str, Any]) -> dict[str, str]:
    labels = meta.get("labels")
    if not isinstance(labels, dict):
        return {}
    return {str(k): v for k, v in labels.items() if isinstance(v, str)}


def salvaged_holder(pod: Any) -> Holder | None:
    """For a pod :func:`read_holder` rejects (malformed flexlease fields): a holder of its
    ``assigned-gpus`` when those are readable, conservatively high priority with no owner
    (never preempted, never the owner's), else None. Never raises."""
    assignment = salvage_assignment(pod)
    if assignment is None:
        return None
    meta = pod.get("metadata") or {}
    return Holder(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        owner=None,
        priority=Priority.HIGH,
        deadline=None,
        resource_version=str(meta.get("resourceVersion") or ""),
        devices=assignment.devices,
        terminating=bool(meta.get("deletionTimestamp")),
    )


def build_view(
    nodes: Iterable[GPUNode], pods: Iterable[dict[str, Any]], *, resource: str = keys.DEFAULT_GPU_RESOURCE
) -> ClusterView:
    """Derive the view from GPUNodes and Pod JSON objects (see :func:`assemble`). Pods that
    cannot be parsed (:class:`PodSpecError`) are skipped and named in ``problems``."""
    problems: list[str] = []
    holders: list[Holder] = []
    for pod in pods:
        try:
            holder = read_holder(pod, resource)
        except PodSpecError as exc:
            name = (pod.get("metadata") or {}).get("name") if isinstance(pod, dict) else None
            problems.append(f"pod {name!r} malformed, kept only as holder of its GPUs: {exc}")
            holder = salvaged_holder(pod)
        if holder is not None:
            holders.append(holder)
    return assemble(nodes, holders, problems=problems)


def assemble(
    nodes: Iterable[GPUNode], holders: Iterable[Holder], *, problems: Iterable[str] = ()
) -> ClusterView:
    """The view from GPUNodes and the pods holding GPUs. When two pods claim one device, the
    first by ``<ns>/<name>`` keeps it and the clash is named in ``problems``. Never raises."""
    problems = list(problems)
    by_key = {h.key: h for h in holders}
    by_device: dict[DeviceKey, Holder] = {}
    for pod_key in sorted(by_key):
        for device in by_key[pod_key].devices:
            if device in by_device:
                problems.append(f"{device} is claimed by {by_device[device].key} and {pod_key}")
                continue
            by_device[device] = by_key[pod_key]

    gpus: dict[DeviceKey, Gpu] = {}
    pools: dict[str, Pool] = {}
    versions: dict[str, str] = {}
    for node in nodes:
        pools[node.name] = node.spec.pool
        versions[node.name] = node.metadata.resource_version or ""
        node_gpus, node_problems = node_entries(node, by_device.get)
        gpus.update((g.key, g) for g in node_gpus)
        problems.extend(node_problems)
    return ClusterView(
        gpus=gpus, pools=pools, node_versions=versions, holders=by_key, problems=tuple(problems)
    )


def node_entries(
    node: GPUNode, holder_of: Callable[[DeviceKey], Holder | None]
) -> tuple[tuple[Gpu, ...], tuple[str, ...]]:
    """One GPUNode's devices as :class:`Gpu` s ordered by index (``holder_of``: the pod that
    holds a device, or None), and one problem line per device key that is not an index."""
    problems: list[str] = []
    indices: set[str] = set(node.status.devices) | {
        i for i, spec in node.spec.devices.items() if spec.owner is not None
    }
    out: list[Gpu] = []
    for raw in sorted(indices):
        try:
            index = int(raw)
        except ValueError:
            problems.append(f"GPUNode {node.name}: device key {raw!r} is not an index")
            continue
        status = node.status.devices.get(raw)
        spec = node.spec.devices.get(raw)
        key = DeviceKey(node.name, index)
        out.append(
            Gpu(
                key=key,
                pool=node.spec.pool,
                model=status.model if status is not None else None,
                tier=node.effective_tier(index) if status is not None else None,
                health=status.health if status is not None else None,
                owner=spec.owner if spec is not None else None,
                leased_at=spec.leased_at if spec is not None else None,
                holder=holder_of(key),
            )
        )
    out.sort(key=lambda g: g.key.index)
    return tuple(out), tuple(problems)


class IncrementalView:
    """The :func:`assemble` view kept up to date one object at a time: give it each GPUNode
    and each pod's :class:`Holder` as they change (:meth:`set_node`, :meth:`set_pod`), and
    :meth:`view` rebuilds only the nodes whose GPUNode, or the holder of one of whose
    devices, changed since the last view (a reconcile after one bind rebuilds one node, not
    the cluster). Pure; no I/O.

    :meth:`view` equals ``assemble(nodes ordered by name, holders ordered by pod key,
    problems=pod problems ordered by pod key)`` of what it was given
    (``tests/extender/lease/test_view.py`` checks it under random sequences of changes).
    Pods are keyed by ``<namespace>/<name>`` (:attr:`Holder.key`); two pods never share one.
    """

    def __init__(self) -> None:
        self._nodes: dict[str, GPUNode] = {}
        self._pods: dict[str, tuple[Holder | None, str | None]] = {}
        self._holders: dict[str, Holder] = {}
        self._problems: dict[str, str] = {}
        self._claims: dict[DeviceKey, list[str]] = {}
        """Device → keys of the holders claiming it, sorted: the first holds it (as in assemble)."""
        self._by_node: dict[str, tuple[Gpu, ...]] = {}
        self._node_problems: dict[str, tuple[str, ...]] = {}
        self._gpus: dict[DeviceKey, Gpu] = {}
        self._clashing: set[DeviceKey] = set()
        """Devices with more than one claim."""
        self._dirty: set[str] = set()
        """Nodes to rebuild: a holder of one of their devices changed, or the GPUNode."""
        self._node_changed: set[str] = set()
        """Dirty nodes whose GPUNode changed (the others keep every device but the holders)."""
        self._view: ClusterView | None = None
        self._node_maps: tuple[dict[str, Pool], dict[str, str]] | None = None
        """The views' ``pools`` and ``node_versions``, kept until a GPUNode changes."""

    def set_node(self, name: str, node: GPUNode | None) -> None:
        """The GPUNode ``name`` as it is now (None: gone or unreadable)."""
        if node is None:
            if self._nodes.pop(name, None) is None:
                return
        elif self._nodes.get(name) is node:
            return
        else:
            self._nodes[name] = node
        self._dirty.add(name)
        self._node_changed.add(name)
        self._view = None
        self._node_maps = None

    def set_pod(self, key: str, holder: Holder | None, *, problem: str | None = None) -> None:
        """The pod ``key`` (``<namespace>/<name>``) as it is now: the GPUs it holds (None:
        none, or gone) and the problem line when it was malformed."""
        old = self._pods.get(key)
        if old is not None and old[0] is holder and old[1] == problem:
            return
        if old is not None and old[0] is not None:
            self._holders.pop(old[0].key, None)
            for device in old[0].devices:
                claims = self._claims[device]
                claims.remove(old[0].key)
                if not claims:
                    del self._claims[device]
                if len(claims) < 2:
                    self._clashing.discard(device)
                self._dirty.add(device.node)
        self._problems.pop(key, None)
        if holder is None and problem is None:
            self._pods.pop(key, None)
        else:
            self._pods[key] = (holder, problem)
        if problem is not None:
            self._problems[key] = problem
        if holder is not None:
            self._holders[holder.key] = holder
            for device in holder.devices:
                claims = self._claims.setdefault(device, [])
                insort(claims, holder.key)
                if len(claims) > 1:
                    self._clashing.add(device)
                self._dirty.add(device.node)
        self._view = None

    def view(self) -> ClusterView:
        """The view now (the same object while nothing changed)."""
        if self._view is not None:
            return self._view
        holders = self._holders

        def holder_of(device: DeviceKey) -> Holder | None:
            claims = self._claims.get(device)
            return holders[claims[0]] if claims else None

        for name in self._dirty:
            old = self._by_node.get(name)
            if old is not None and name not in self._node_changed:
                # Only holders changed: keep every other device as it was.
                gpus = tuple(g if g.holder is (h := holder_of(g.key)) else replace(g, holder=h) for g in old)
                self._by_node[name] = gpus
                self._gpus.update((g.key, g) for g, was in zip(gpus, old, strict=True) if g is not was)
                continue
            for gpu in self._by_node.pop(name, ()):
                del self._gpus[gpu.key]
            self._node_problems.pop(name, None)
            node = self._nodes.get(name)
            if node is None:
                continue
            gpus, node_problems = node_entries(node, holder_of)
            self._by_node[name] = gpus
            self._gpus.update((g.key, g) for g in gpus)
            if node_problems:
                self._node_problems[name] = node_problems
        self._dirty.clear()
        self._node_changed.clear()
        problems = [self._problems[k] for k in sorted(self._problems)]
        problems.extend(self._clashes())
        for name in sorted(self._node_problems):
            problems.extend(self._node_problems[name])
        if self._node_maps is None:  # a GPUNode changed: the views no longer share these
            names = sorted(self._nodes)
            self._node_maps = (
                {n: self._nodes[n].spec.pool for n in names},
                {n: self._nodes[n].metadata.resource_version or "" for n in names},
            )
        pools, node_versions = self._node_maps
        self._view = ClusterView(
            gpus=dict(self._gpus),
            pools=pools,
            node_versions=node_versions,
            holders=dict(holders),
            problems=tuple(problems),
            by_node=dict(self._by_node),
        )
        return self._view

    def _clashes(self) -> list[str]:
        """:func:`assemble`'s lines for devices claimed twice, in its order."""
        clashing = self._clashing
        if not clashing:
            return []
        out: list[str] = []
        first: dict[DeviceKey, str] = {}
        for pod_key in sorted({k for d in clashing for k in self._claims[d]}):
            for device in self._holders[pod_key].devices:
                if device not in clashing:
                    continue
                if device in first:
                    out.append(f"{device} is claimed by {first[device]} and {pod_key}")
                    continue
                first[device] = pod_key
        return out
