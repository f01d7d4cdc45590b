"""A frozen picture of the cluster's GPUs, derived from GPUNodes and pods (DESIGN §2).

State is derived, never duplicated: which pod holds a GPU comes only from the
``flexlease.io/assigned-gpus`` annotation of non-terminated pods; pool, tags, model, tier and
health come from the ``GPUNode``. A device is in the view when its GPUNode's status reports it
or its spec still tags it (a tagged device the agent no longer reports has *vanished*).
Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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
    ``<ns>/<name>``, and ``problems``: one line per object that could not be read (skipped)."""

    gpus: Mapping[DeviceKey, Gpu]
    pools: Mapping[str, Pool]
    node_versions: Mapping[str, str]
    holders: Mapping[str, Holder]
    problems: tuple[str, ...] = ()

    def node_gpus(self, node: str) -> list[Gpu]:
        """The node's GPUs ordered by index (empty when the GPUNode is unknown)."""
        return sorted((g for g in self.gpus.values() if g.key.node == node), key=lambda g: g.key.index)

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
        indices: set[str] = set(node.status.devices) | {
            i for i, spec in node.spec.devices.items() if spec.owner is not None
        }
        for raw in indices:
            try:
                index = int(raw)
            except ValueError:
                problems.append(f"GPUNode {node.name}: device key {raw!r} is not an index")
                continue
            status = node.status.devices.get(raw)
            spec = node.spec.devices.get(raw)
            key = DeviceKey(node.name, index)
            gpus[key] = Gpu(
                key=key,
                pool=node.spec.pool,
                model=status.model if status is not None else None,
                tier=node.effective_tier(index) if status is not None else None,
                health=status.health if status is not None else None,
                owner=spec.owner if spec is not None else None,
                leased_at=spec.leased_at if spec is not None else None,
                holder=by_device.get(key),
            )
    return ClusterView(
        gpus=gpus, pools=pools, node_versions=versions, holders=by_key, problems=tuple(problems)
    )
