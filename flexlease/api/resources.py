"""The ``GPUNode`` and ``GPULease`` custom resources (group ``flexlease.io/v1alpha1``).

Shapes follow DESIGN.md §2. ``GPUNode`` is cluster-scoped and named after its node; its
``spec`` is written by the lease controller and operators, its ``status`` only by that node's
agent. ``GPULease`` is namespaced (the owner's namespace) and carries a Lend or Reclaim
directive (WeFlex §3.2 step a).
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any, NamedTuple, Self

from pydantic import Field, model_validator

from flexlease.api import keys
from flexlease.api.base import KubeModel
from flexlease.api.tiers import Tier


class DeviceKey(NamedTuple):
    """A GPU: ``(node name, device index)``. Index is NVML's device index on that node.

    A named tuple (immutable, ordered by node then index): hashing and comparing it run in C,
    and it is the key of every per-GPU map in the extender and the simulator (a dict lookup
    costs about a quarter of a frozen dataclass's). Like any tuple it equals a plain
    ``(node, index)`` tuple."""

    node: str
    index: int  # type: ignore[assignment]  # the field shadows tuple.index(), unused on a key

    def __str__(self) -> str:
        return f"{self.node}/{self.index}"


class Pool(enum.StrEnum):
    """Node pool: ``general`` serves everyone; ``standby`` only backfills reclaim shortfalls."""

    GENERAL = "general"
    STANDBY = "standby"


class Health(enum.StrEnum):
    """Device health as reported by the node agent. ``Unknown`` when NVML cannot see it."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


class ObjectMeta(KubeModel):
    """The subset of Kubernetes ``metav1.ObjectMeta`` flexlease reads."""

    name: str
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: datetime | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


# --------------------------------------------------------------------------- GPUNode


class DeviceSpec(KubeModel):
    """``spec.devices["<index>"]``: ownership tag (right-of-return) and an operator's tier override."""

    owner: str | None = None
    """``<ns>/<job>`` of the online job that lent this GPU, or None when untagged."""
    leased_at: datetime | None = None
    tier_override: Tier | None = None


class GPUNodeSpec(KubeModel):
    pool: Pool = Pool.GENERAL
    devices: dict[str, DeviceSpec] = Field(default_factory=dict)


class Availability(KubeModel):
    """Availability over the rolling window, seconds. ``ratio`` = 1 − unavailable/observed (0–1).

    ``unknownSeconds`` is time the agent was not running: excluded from ``observedSeconds``.
    """

    window_seconds: float
    observed_seconds: float
    unavailable_seconds: float
    unknown_seconds: float = 0.0
    ratio: float = Field(ge=0.0, le=1.0)


class DeviceStatus(KubeModel):
    """``status.devices["<index>"]``: what the node agent sees of one GPU."""

    uuid: str
    model: str
    memory_mib: int = Field(alias="memoryMiB")
    health: Health
    reason: str | None = None
    availability: Availability | None = None
    tier: Tier
    tier_computed_at: datetime | None = None
    last_xid: int | None = None
    minor_number: int | None = None
    pci_bus_id: str | None = None


class AgentInfo(KubeModel):
    version: str
    heartbeat: datetime


class CheckpointRef(KubeModel):
    id: str
    size_bytes: int
    sha256: str


class CacheStatus(KubeModel):
    images: list[str] = Field(default_factory=list)
    checkpoints: list[CheckpointRef] = Field(default_factory=list)


class NodeSummary(KubeModel):
    """Counts for ``kubectl get gpunodes`` printer columns (JSONPath cannot count).

    Written by the agent with the rest of ``status``; derived by :func:`summarize`.
    """

    gpus: int = 0
    healthy: int = 0
    ha: int = 0
    ma: int = 0
    la: int = 0
    lent: int = 0


class GPUNodeStatus(KubeModel):
    node_ip: str | None = Field(default=None, alias="nodeIP")
    agent: AgentInfo | None = None
    devices: dict[str, DeviceStatus] = Field(default_factory=dict)
    cache: CacheStatus = Field(default_factory=CacheStatus)
    summary: NodeSummary | None = None


class GPUNode(KubeModel):
    """The ``GPUNode`` custom resource (cluster-scoped, name = node name)."""

    api_version: str = keys.API_VERSION
    kind: str = keys.GPUNODE_KIND
    metadata: ObjectMeta
    spec: GPUNodeSpec = Field(default_factory=GPUNodeSpec)
    status: GPUNodeStatus = Field(default_factory=GPUNodeStatus)

    @property
    def name(self) -> str:
        return self.metadata.name

    def effective_tier(self, index: int) -> Tier | None:
        """The tier scheduling uses for device ``index``: the spec override if set, else the
        agent's tier; None when the agent has not reported that device."""
        spec = self.spec.devices.get(str(index))
        if spec is not None and spec.tier_override is not None:
            return spec.tier_override
        status = self.status.devices.get(str(index))
        return status.tier if status is not None else None


def summarize(spec: GPUNodeSpec, devices: dict[str, DeviceStatus]) -> NodeSummary:
    """Printer-column counts: devices reported, healthy, per effective tier, tagged (lent)."""
    tiers = [
        (spec.devices[i].tier_override if i in spec.devices and spec.devices[i].tier_override else d.tier)
        for i, d in devices.items()
    ]
    return NodeSummary(
        gpus=len(devices),
        healthy=sum(1 for d in devices.values() if d.health is Health.HEALTHY),
        ha=tiers.count(Tier.HA),
        ma=tiers.count(Tier.MA),
        la=tiers.count(Tier.LA),
        lent=sum(1 for d in spec.devices.values() if d.owner),
    )


# --------------------------------------------------------------------------- GPULease


class LeaseAction(enum.StrEnum):
    LEND = "Lend"
    RECLAIM = "Reclaim"


class LeasePhase(enum.StrEnum):
    """``Pending`` (not taken up yet), ``InProgress``, and three final phases: ``Done`` (its end
    state reached), ``Failed`` (invalid; nothing was done) and ``Cancelled`` (superseded by a
    newer lease of the opposite action before it was done: ``status.supersededBy``)."""

    PENDING = "Pending"
    IN_PROGRESS = "InProgress"
    DONE = "Done"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


FINAL_PHASES = frozenset({LeasePhase.DONE, LeasePhase.FAILED, LeasePhase.CANCELLED})
"""Phases a lease never leaves: the lease controller does not reconcile it again."""


class LeaseDevice(KubeModel):
    node: str
    index: int = Field(ge=0)
    model: str | None = None
    """GPU type recorded by the lease controller in ``status`` (when lent); ignored in ``spec``."""
    tier: Tier | None = None
    """Effective tier recorded by the lease controller in ``status`` (when lent); ignored in ``spec``."""
    in_kind: bool | None = None
    """Recorded in ``status`` (ignored in ``spec``): a GPU of a standby-pool node the owner held
    (a standby supplement) and lent: it went back to the standby pool untagged, and the owner's
    right-of-return to it is in kind (this GPU when it is still free at the Reclaim, else a
    standby GPU of the same model and a tier >= ``tier``)."""

    @property
    def key(self) -> DeviceKey:
        return DeviceKey(self.node, self.index)


MIN_GRACE_SECONDS = 30
MAX_GRACE_SECONDS = 60
DEFAULT_GRACE_SECONDS = 45


class GPULeaseSpec(KubeModel):
    """A lend or reclaim directive. Exactly one of ``devices`` and ``count`` is set."""

    owner: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$")
    action: LeaseAction
    devices: list[LeaseDevice] | None = None
    count: int | None = Field(default=None, ge=1)
    grace_period_seconds: int = Field(
        default=DEFAULT_GRACE_SECONDS, ge=MIN_GRACE_SECONDS, le=MAX_GRACE_SECONDS
    )

    @model_validator(mode="after")
    def _devices_xor_count(self) -> Self:
        if (self.devices is None) == (self.count is None):
            raise ValueError("exactly one of spec.devices and spec.count must be set")
        return self


class Condition(KubeModel):
    """``metav1.Condition``."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None


class Supplement(KubeModel):
    """A lent GPU that could not be reclaimed and the standby GPU that replaced it.
    ``returned``: the owner's pods have held the replacement (the original is back in kind)."""

    original: LeaseDevice
    replacement: LeaseDevice
    returned: bool | None = None


class Unrecoverable(KubeModel):
    """A GPU of a Reclaim that can neither come back nor be replaced from the standby pool:
    ``reason`` is a CamelCase word (``NoStandbyOfModel``, ``StandbyExhausted``,
    ``LendRecordIncomplete``), ``message`` says it in words. ``model``/``tier``: its lend-time
    record (None when unknown)."""

    node: str
    index: int = Field(ge=0)
    model: str | None = None
    tier: Tier | None = None
    reason: str
    message: str = ""

    @property
    def key(self) -> DeviceKey:
        return DeviceKey(self.node, self.index)


class GPULeaseStatus(KubeModel):
    """What the lease controller did. Lend: ``lent`` (each GPU with its lend-time model and
    tier). Reclaim: ``lent`` (its targets), ``reclaimed`` (targets back with the owner),
    ``supplementedFromStandby`` (target → standby replacement), ``unrecoverable`` (targets
    neither back nor replaceable, with the reason), ``stillLent`` (a Cancelled Reclaim: the
    targets, or their chosen replacements, that stay lent to the platform), ``preemptedPods``.
    ``supersededBy``: the newer lease of the opposite action that finished or cancelled this one."""

    phase: LeasePhase = LeasePhase.PENDING
    lent: list[LeaseDevice] = Field(default_factory=list)
    reclaimed: list[LeaseDevice] = Field(default_factory=list)
    supplemented_from_standby: list[Supplement] = Field(default_factory=list)
    unrecoverable: list[Unrecoverable] = Field(default_factory=list)
    still_lent: list[LeaseDevice] = Field(default_factory=list)
    superseded_by: str | None = None
    preempted_pods: list[str] = Field(default_factory=list)
    message: str = ""
    conditions: list[Condition] = Field(default_factory=list)


class GPULease(KubeModel):
    """The ``GPULease`` custom resource (namespaced, in the owner's namespace)."""

    api_version: str = keys.API_VERSION
    kind: str = keys.GPULEASE_KIND
    metadata: ObjectMeta
    spec: GPULeaseSpec
    status: GPULeaseStatus = Field(default_factory=GPULeaseStatus)


def parse_gpunode(obj: dict[str, Any]) -> GPUNode:
    """Validate a ``GPUNode`` JSON object. Raises ``pydantic.ValidationError``."""
    return GPUNode.model_validate(obj)


def parse_gpulease(obj: dict[str, Any]) -> GPULease:
    """Validate a ``GPULease`` JSON object. Raises ``pydantic.ValidationError``."""
    return GPULease.model_validate(obj)
