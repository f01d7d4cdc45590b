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

    owner: str | None = Field(
        default=None,
        description="Ownership tag: ``<namespace>/<job>`` of the online job that lent this GPU and may "
        "take it back (right-of-return), or null when untagged. Written by the lease controller.",
    )
    leased_at: datetime | None = Field(
        default=None, description="When the lease controller tagged the GPU (RFC 3339)."
    )
    tier_override: Tier | None = Field(
        default=None,
        description="An operator's tier for this GPU: placement uses it instead of the tier the node "
        "agent computed (``status.devices.*.tier``).",
    )


class GPUNodeSpec(KubeModel):
    """What the lease controller and operators decide about the node's GPUs."""

    pool: Pool = Field(
        default=Pool.GENERAL,
        description="``general``: the node serves every pod. ``standby``: its GPUs serve only reclaim "
        "pods, when the general nodes fall short (FETCHSTANDBY). The lease controller moves whole "
        "free nodes between the pools to keep ``lease.standby_pool_size`` GPUs in standby.",
    )
    devices: dict[str, DeviceSpec] = Field(
        default_factory=dict, description="Per GPU, keyed by its NVML device index as a string."
    )


class Availability(KubeModel):
    """Availability over the rolling window, seconds. ``ratio`` = 1 − unavailable/observed (0–1).

    ``unknownSeconds`` is time the agent was not running: excluded from ``observedSeconds``.
    """

    window_seconds: float = Field(description="The window's length (``tiers.window_seconds``).")
    observed_seconds: float = Field(description="Time within the window the agent observed the GPU.")
    unavailable_seconds: float = Field(description="Observed time the GPU was Unhealthy.")
    unknown_seconds: float = Field(
        default=0.0,
        description="Time within the window nobody observed (the agent or NVML down): excluded "
        "from the ratio.",
    )
    ratio: float = Field(ge=0.0, le=1.0, description="1 − unavailableSeconds / observedSeconds (0–1).")


class DeviceStatus(KubeModel):
    """``status.devices["<index>"]``: what the node agent sees of one GPU."""

    uuid: str = Field(description="The GPU's NVML UUID (the device plugin's device ID).")
    model: str = Field(
        description="NVML product name, e.g. ``NVIDIA H20`` (what ``flexlease.io/gpu-type`` matches)."
    )
    memory_mib: int = Field(alias="memoryMiB", description="Total GPU memory in MiB.")
    health: Health = Field(
        description="``Healthy``, ``Unhealthy`` (critical XID, double-bit ECC error, fallen off the bus, "
        "failed row remapping) or ``Unknown`` (NVML cannot see it). Only Healthy GPUs are placed."
    )
    reason: str | None = Field(default=None, description="Why the GPU has this health, for people.")
    availability: Availability | None = Field(
        default=None, description="Availability over the rolling window, from the node's ledger."
    )
    tier: Tier = Field(
        description="Reliability tier computed from ``availability.ratio`` (HA ≥ ``tiers.ha_threshold``, "
        "MA ≥ ``tiers.ma_threshold``, else LA); downgraded at once on a failure."
    )
    tier_computed_at: datetime | None = Field(default=None, description="When ``tier`` was last computed.")
    last_xid: int | None = Field(default=None, description="The last XID code NVML reported for the GPU.")
    minor_number: int | None = Field(default=None, description="NVML minor number (``/dev/nvidia<minor>``).")
    pci_bus_id: str | None = Field(default=None, description="The GPU's PCI bus ID.")


class AgentInfo(KubeModel):
    """The node agent that writes this status."""

    version: str = Field(description="The agent's version.")
    heartbeat: datetime = Field(
        description="Time of the agent's last status write; written at least every "
        "``agent.heartbeat_seconds``."
    )


class CheckpointRef(KubeModel):
    """A checkpoint in the node's checkpoint cache."""

    id: str = Field(description="The checkpoint's id (what ``flexlease.io/checkpoint`` names).")
    size_bytes: int = Field(description="Size in bytes.")
    sha256: str = Field(description="SHA-256 of its content, verified on download.")


class CacheStatus(KubeModel):
    """What the node holds already, for cache-aware placement (PICKGPUS)."""

    images: list[str] = Field(
        default_factory=list,
        description="Images present in the node's container runtime: every repo tag (an image known "
        "only by digest by its first repo digest).",
    )
    checkpoints: list[CheckpointRef] = Field(
        default_factory=list, description="Checkpoints in the node agent's checkpoint cache."
    )


class PrelaunchStatus(KubeModel):
    """``status.prelaunch``: the node's inputs of the prelaunch window W (WeFlex §3.3, formulas
    1–3; :func:`flexlease.prelaunch.prelaunch_window`) other than the job's own sizes, written by
    the node agent's cache component, read by the extender's lease autopilot for the lead time
    of a Reclaim. Bandwidths in bytes per second: the registry's and the checkpoint storage's
    as measured by this node's transfers (an exponentially weighted average) when ``measured``
    names them, else the agent's assumed values, as are the network's and the GPU's;
    ``gpuAdjustSeconds`` T_gpu_adj. ``imageBytes``: the size of each image on the node (η_cache
    is 1 for an image listed here; a job's image listed on any node gives its S_img)."""

    net_bytes_per_second: float = Field(
        gt=0, description="B_net: the network's bandwidth to this node, bytes per second (assumed)."
    )
    registry_bytes_per_second: float = Field(
        gt=0,
        description="B_reg: the image registry's bandwidth, bytes per second (measured when listed in "
        "measured).",
    )
    storage_bytes_per_second: float = Field(
        gt=0,
        description="B_sto: the checkpoint storage's bandwidth, bytes per second (measured when listed in "
        "measured).",
    )
    gpu_bytes_per_second: float = Field(
        gt=0, description="B_gpu: host-to-GPU copy bandwidth, bytes per second (assumed)."
    )
    gpu_adjust_seconds: float = Field(
        default=0.0, ge=0, description="T_gpu_adj: the GPU's adjustment time before a start, seconds."
    )
    measured: list[str] = Field(
        default_factory=list,
        description="Which bandwidths were measured by this node's transfers (``registry``, ``storage``); "
        "the others are the agent's assumed values.",
    )
    image_bytes: dict[str, int] = Field(
        default_factory=dict, description="Size in bytes of each image on the node (η_cache is 1 for these)."
    )


class NodeSummary(KubeModel):
    """Counts for ``kubectl get gpunodes`` printer columns (JSONPath cannot count).

    Written by the agent with the rest of ``status``; derived by :func:`summarize`.
    """

    gpus: int = Field(default=0, description="GPUs the agent reports.")
    healthy: int = Field(default=0, description="Healthy GPUs.")
    ha: int = Field(default=0, description="GPUs whose effective tier (override, else computed) is HA.")
    ma: int = Field(default=0, description="GPUs whose effective tier is MA.")
    la: int = Field(default=0, description="GPUs whose effective tier is LA.")
    lent: int = Field(default=0, description="GPUs tagged with an owner (``spec.devices.*.owner``).")


class GPUNodeStatus(KubeModel):
    """What the node's agent observes; written only by that agent."""

    node_ip: str | None = Field(default=None, alias="nodeIP", description="The node's IP address.")
    agent: AgentInfo | None = Field(default=None, description="The agent writing this status.")
    devices: dict[str, DeviceStatus] = Field(
        default_factory=dict, description="Per GPU, keyed by its NVML device index as a string."
    )
    cache: CacheStatus = Field(default_factory=CacheStatus, description="Images and checkpoints on the node.")
    prelaunch: PrelaunchStatus | None = Field(
        default=None,
        description="The node's inputs of the prelaunch window (WeFlex §3.3), written by the agent's "
        "cache component and read by the lease autopilot.",
    )
    summary: NodeSummary | None = Field(
        default=None, description="Counts for ``kubectl get gpunodes`` (JSONPath cannot count)."
    )


class GPUNode(KubeModel):
    """The ``GPUNode`` custom resource (cluster-scoped, name = node name)."""

    api_version: str = keys.API_VERSION
    kind: str = keys.GPUNODE_KIND
    metadata: ObjectMeta
    spec: GPUNodeSpec = Field(
        default_factory=GPUNodeSpec,
        description="Pool and per-GPU ownership tags, written by the lease controller and operators.",
    )
    status: GPUNodeStatus = Field(
        default_factory=GPUNodeStatus,
        description="Health, availability, tiers and caches, written only by the node's agent.",
    )

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
    """A GPU: node name and NVML device index."""

    node: str = Field(description="The GPU's node (its GPUNode's name).")
    index: int = Field(ge=0, description="The GPU's NVML device index on that node.")
    model: str | None = Field(
        default=None,
        description="GPU type recorded by the lease controller in ``status`` (when lent); ignored "
        "in ``spec``.",
    )
    tier: Tier | None = Field(
        default=None,
        description="Effective tier recorded by the lease controller in ``status`` (when lent); ignored "
        "in ``spec``. A reclaimed GPU must come back at this tier or above.",
    )
    in_kind: bool | None = Field(
        default=None,
        description="Recorded in ``status`` (ignored in ``spec``): a GPU of a standby-pool node the owner "
        "held (a standby supplement) and lent: it went back to the standby pool untagged, and the owner's "
        "right-of-return to it is in kind (this GPU when it is still free at the Reclaim, else a standby "
        "GPU of the same model and a tier >= ``tier``).",
    )

    @property
    def key(self) -> DeviceKey:
        return DeviceKey(self.node, self.index)


MIN_GRACE_SECONDS = 30
MAX_GRACE_SECONDS = 60
DEFAULT_GRACE_SECONDS = 45


class GPULeaseSpec(KubeModel):
    """A lend or reclaim directive. Exactly one of ``devices`` and ``count`` is set."""

    owner: str = Field(
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$",
        description="The online job, ``<namespace>/<job>``: the pods' namespace and their "
        "``flexlease.io/owner`` label.",
    )
    action: LeaseAction = Field(
        description="``Lend`` (the job scaled down: tag the HA and MA GPUs it released with its owner) "
        "or ``Reclaim`` (the job scales up: take its lent GPUs back)."
    )
    devices: list[LeaseDevice] | None = Field(
        default=None,
        description="The GPUs to lend (released by the job's pods) or to reclaim (lent by this owner). "
        "Exactly one of ``devices`` and ``count``.",
    )
    count: int | None = Field(
        default=None,
        ge=1,
        description="Lend: the first ``count`` GPUs the job's pods release after the lease is created. "
        "Reclaim: ``count`` of the owner's outstanding lent GPUs. Exactly one of ``devices`` and "
        "``count``.",
    )
    grace_period_seconds: int = Field(
        default=DEFAULT_GRACE_SECONDS,
        ge=MIN_GRACE_SECONDS,
        le=MAX_GRACE_SECONDS,
        description="Reclaim: seconds a low-priority pod on a lent GPU is given between its "
        "``flexlease.io/preempt-deadline`` notice and its eviction (WeFlex: 30–60 s).",
    )

    @model_validator(mode="after")
    def _devices_xor_count(self) -> Self:
        if (self.devices is None) == (self.count is None):
            raise ValueError("exactly one of spec.devices and spec.count must be set")
        return self


class Condition(KubeModel):
    """``metav1.Condition``."""

    type: str = Field(description="``Accepted``, ``Tagged`` (Lend) or ``GPUsFreed`` (Reclaim).")
    status: str = Field(description="``True``, ``False`` or ``Unknown``.")
    reason: str = Field(
        default="", description="A CamelCase reason, e.g. ``EvictionBlocked``, ``StandbyShortfall``."
    )
    message: str = Field(default="", description="What is happening, for people.")
    last_transition_time: datetime | None = Field(default=None, description="When ``status`` last changed.")


class Supplement(KubeModel):
    """A lent GPU that could not be reclaimed and the standby GPU that replaced it.
    ``returned``: the owner's pods have held the replacement (the original is back in kind)."""

    original: LeaseDevice = Field(description="The lent GPU that could not be taken back.")
    replacement: LeaseDevice = Field(
        description="The standby GPU (same model, tier ≥ the original's lend-time tier) that replaced it."
    )
    returned: bool | None = Field(
        default=None, description="The owner's pods have held the replacement (the original is back in kind)."
    )


class Unrecoverable(KubeModel):
    """A GPU of a Reclaim that can neither come back nor be replaced from the standby pool:
    ``reason`` is a CamelCase word (``NoStandbyOfModel``, ``StandbyExhausted``,
    ``LendRecordIncomplete``), ``message`` says it in words. ``model``/``tier``: its lend-time
    record (None when unknown)."""

    node: str = Field(description="The GPU's node (its GPUNode's name).")
    index: int = Field(ge=0, description="The GPU's NVML device index on that node.")
    model: str | None = Field(default=None, description="GPU type recorded when it was lent.")
    tier: Tier | None = Field(default=None, description="Effective tier recorded when it was lent.")
    reason: str = Field(
        description="Why, as a CamelCase word: NoStandbyOfModel, StandbyExhausted, LendRecordIncomplete."
    )
    message: str = Field(default="", description="The reason in words.")

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

    phase: LeasePhase = Field(
        default=LeasePhase.PENDING,
        description="``Pending``, ``InProgress``, ``Done`` (Lend: every GPU released; Reclaim: every lent "
        "GPU is held by the owner's pods, replaced one-for-one from the standby pool, or listed in "
        "``unrecoverable``), ``Cancelled`` or ``Failed`` (see ``message``).",
    )
    lent: list[LeaseDevice] = Field(
        default_factory=list,
        description="Lend: the GPUs lent, with their model and tier at lend time. Reclaim: the lent "
        "GPUs it takes back, fixed at its first reconcile.",
    )
    reclaimed: list[LeaseDevice] = Field(
        default_factory=list, description="Reclaim: lent GPUs the owner's pods hold again."
    )
    supplemented_from_standby: list[Supplement] = Field(
        default_factory=list,
        description="Reclaim: lent GPUs replaced one-for-one from the standby pool (failed, vanished, "
        "downgraded, or held by a pod that cannot be evicted).",
    )
    unrecoverable: list[Unrecoverable] = Field(
        default_factory=list,
        description="Reclaim: lent GPUs neither back nor replaceable from the standby pool, each with its "
        "reason.",
    )
    still_lent: list[LeaseDevice] = Field(
        default_factory=list,
        description="A Cancelled Reclaim: the targets, or their chosen replacements, that stay lent.",
    )
    superseded_by: str | None = Field(
        default=None,
        description="The newer lease of the opposite action that finished or cancelled this one.",
    )
    preempted_pods: list[str] = Field(
        default_factory=list,
        description="Reclaim: ``<namespace>/<name>`` of the low-priority pods given a notice to leave "
        "lent GPUs.",
    )
    message: str = Field(default="", description="The last outcome, for people.")
    conditions: list[Condition] = Field(
        default_factory=list, description="Kubernetes conditions (``metav1.Condition``)."
    )


class GPULease(KubeModel):
    """The ``GPULease`` custom resource (namespaced, in the owner's namespace)."""

    api_version: str = keys.API_VERSION
    kind: str = keys.GPULEASE_KIND
    metadata: ObjectMeta
    spec: GPULeaseSpec = Field(description="The directive: whose GPUs, lend or reclaim, which ones.")
    status: GPULeaseStatus = Field(
        default_factory=GPULeaseStatus, description="Progress, written by the lease controller."
    )


def parse_gpunode(obj: dict[str, Any]) -> GPUNode:
    """Validate a ``GPUNode`` JSON object. Raises ``pydantic.ValidationError``."""
    return GPUNode.model_validate(obj)


def parse_gpulease(obj: dict[str, Any]) -> GPULease:
    """Validate a ``GPULease`` JSON object. Raises ``pydantic.ValidationError``."""
    return GPULease.model_validate(obj)
