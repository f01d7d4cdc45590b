"""Every ``flexlease.io/`` label and annotation key, the CRD coordinates and wire constants.

One module so that a newcomer finds any annotation by its name (DESIGN.md §2).
"""

from typing import Final

GROUP: Final = "flexlease.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

GPUNODE_KIND: Final = "GPUNode"
GPUNODE_PLURAL: Final = "gpunodes"
GPULEASE_KIND: Final = "GPULease"
GPULEASE_PLURAL: Final = "gpuleases"
GPULEASEPOLICY_KIND: Final = "GPULeasePolicy"
GPULEASEPOLICY_PLURAL: Final = "gpuleasepolicies"

PREFIX: Final = f"{GROUP}/"

# Pod labels
LABEL_PRIORITY: Final = PREFIX + "priority"
"""``high`` or ``low`` (default ``low``): the paper's HP/LP classes (§3.5)."""
LABEL_OWNER: Final = PREFIX + "owner"
"""Job name ``<job>`` (a label value; the pod's namespace completes the identity ``<ns>/<job>``
for MATCH(Pod, Owner)); default: the pod's controller owner."""

LABEL_ROLE: Final = PREFIX + "role"
"""The pod's role in its job's framework profile (``coordinator``, ``worker``, ``head``...):
the orchestrator's readiness snapshot watches by it, and pods whose role the profile marks
critical are never noticed or evicted by the lease controller's Reclaim (WeFlex §3.4)."""
LABEL_FRAMEWORK: Final = PREFIX + "framework"
"""The job's framework profile name (``mpi``, ``pytorch``, ``ray``, ``tensorflow`` or a user's)."""
LABEL_NO_KUBELET: Final = PREFIX + "no-kubelet"
"""``"true"`` on CRI pod sandboxes that flexlease runs itself, with no kubelet behind them (the
local demo, the tests, the benches). Only such sandboxes may be hot-restarted with the
``direct`` strategy; a sandbox or container carrying kubelet's own marks is kubelet's
(``nodeagent.hotrestart.kubelet.kubelet_managed``)."""
LABEL_RESTART_POLICY: Final = PREFIX + "restart-policy"
"""``InPlace`` opts a workload in to in-place rollouts (WeFlex §3.3): on a StatefulSet with
``updateStrategy: OnDelete``, a template image edit is rolled through its pods with hot
restarts; on pods, a completed lend or reclaim of their job restarts them in place so the
framework picks up its new GPU set (:mod:`extender.rollout`)."""
RESTART_POLICY_IN_PLACE: Final = "InPlace"

# Node labels
LABEL_NODE_DEVICE_PLUGIN: Final = PREFIX + "device-plugin"
"""``"true"`` on GPU nodes whose ``nvidia.com/gpu`` flexlease's device plugin serves instead of
NVIDIA's: the agent DaemonSet's node selector (docs: getting-started/install.md, "Migrating
from NVIDIA's device plugin")."""

# Pod annotations
ANN_RELIABILITY: Final = PREFIX + "reliability"
"""Required minimum tier ``HA``/``MA``/``LA`` (default ``LA``)."""
ANN_GPU_TYPE: Final = PREFIX + "gpu-type"
"""Optional exact GPU model (NVML device name, e.g. ``NVIDIA H20``)."""
ANN_RECLAIM: Final = PREFIX + "reclaim"
"""``"true"`` on pods created to take back lent GPUs (Algorithm 1's IsReclaim)."""
ANN_CHECKPOINT: Final = PREFIX + "checkpoint"
"""Checkpoint id, for cache-aware placement (PICKGPUS)."""
ANN_ASSIGNED_GPUS: Final = PREFIX + "assigned-gpus"
"""Written by bind: ``<node>:<idx>,<idx>`` — the only record of which GPUs a pod holds."""
ANN_ASSIGNED_UUIDS: Final = PREFIX + "assigned-uuids"
"""Written by bind: comma-separated NVML UUIDs, in the order of ``assigned-gpus``."""
ANN_ASSIGNED_AT: Final = PREFIX + "assigned-at"
"""Written by bind: RFC 3339 UTC timestamp of the assignment."""
ANN_ASSIGNMENT_CORRECTED: Final = PREFIX + "assignment-corrected"
"""Written by the node agent when kubelet gave the pod other GPUs than ``assigned-gpus`` named
(read back from the kubelet PodResources API): JSON ``{"was": "<node>:<idx>,..", "at": RFC 3339}``;
``assigned-gpus``/``assigned-uuids`` then name what the pod really holds."""
ANN_HOT_RESTART: Final = PREFIX + "hot-restart"
"""In-sandbox restart request, JSON ``{"container", "image", "id"}`` (DESIGN §4)."""
ANN_HOT_RESTART_STATUS: Final = PREFIX + "hot-restart-status"
"""Outcome of the hot restart with that id, JSON, written by the node agent."""
ANN_PREEMPT_DEADLINE: Final = PREFIX + "preempt-deadline"
"""Graceful-reclaim notice on an LP pod: RFC 3339 UTC time after which it is evicted."""

# Streaming-data staging (WeFlex §3.3, "Short-Duration Streaming-Data Staging"); parsed by
# flexlease.streaming.config. stream, stream-subject and stream-durable go together.
ANN_STREAM: Final = PREFIX + "stream"
"""The JetStream stream that holds the job's live input (the bounded live buffer)."""
ANN_STREAM_SUBJECT: Final = PREFIX + "stream-subject"
"""The subject the job's records are published on; must be one of the stream's subjects."""
ANN_STREAM_DURABLE: Final = PREFIX + "stream-durable"
"""The job's durable name: its committed offset and its staging stream are keyed by it
(letters, digits, ``-`` and ``_``)."""
ANN_STAGING_MARGIN: Final = PREFIX + "staging-margin-seconds"
"""Seconds added to the prelaunch window W to give W_stage (default 30)."""
ANN_STREAM_RESUME: Final = PREFIX + "stream-resume"
"""Written by the node agent when staging overflowed: JSON ``{"seq", "lost", "at"}`` — the
stream sequence where the job's data resumes and how many records were lost before it."""

# Workload annotations (written by the rollout controller, extender.rollout)
ANN_MAX_UNAVAILABLE: Final = PREFIX + "max-unavailable"
"""On an opted-in StatefulSet: how many pods may be restarting at once, a positive integer
or ``all`` (default 1)."""
ANN_ROLLOUT_STATUS: Final = PREFIX + "rollout-status"
"""Progress of an in-place rollout, JSON (``revision``, ``phase``, ``updated``, ``total``,
``current``, ``lastError``, ``skipped``, ``restartSeconds``...), on the StatefulSet for an image
edit and on the GPULease for the reconfiguration after it."""

# GPULease annotations (written by the lease controller and the orchestrator)
ANN_LEND_BASELINE: Final = PREFIX + "lend-baseline"
"""On a ``Lend`` lease with ``spec.count``: the GPUs the owner's pods held when the controller
first saw the lease, ``<node>:<idx>,<idx>;<node>:<idx>`` (released GPUs are taken from these)."""

ANN_ORCHESTRATION_STATUS: Final = PREFIX + "orchestration-status"
"""On a GPULease: the orchestrator run its completion started for the owner's job (JSON:
``leaseUID``, ``leaseGeneration``, ``profile``, ``phase`` Running/Succeeded/Failed/Refused,
``replicas``, ``commands``, ``done`` steps, ``message``...), written by the extender's leader
(:mod:`extender.orchestrator.relaunch`); a final phase for the lease's generation is never rerun."""

# GPULease labels (written by the lease autopilot, extender.autopilot)
LABEL_POLICY: Final = PREFIX + "policy"
"""On a GPULease the lease autopilot wrote: the name of its ``GPULeasePolicy`` (same namespace)."""
LABEL_POLICY_SEQUENCE: Final = PREFIX + "policy-sequence"
"""On a GPULease the lease autopilot wrote: its decision's sequence number (decimal), so the next
lease's name is never one the policy used before, even when its status write was lost."""

PRIORITY_HIGH: Final = "high"
PRIORITY_LOW: Final = "low"

DEFAULT_GPU_RESOURCE: Final = "nvidia.com/gpu"

DEFAULT_SCHEDULER_NAME: Final = "flexlease-scheduler"
"""``spec.schedulerName`` of pods flexlease places: the kube-scheduler profile that calls the extender."""
KUBE_DEFAULT_SCHEDULER_NAME: Final = "default-scheduler"
"""What the API server defaults an unset ``spec.schedulerName`` to (``v1.DefaultSchedulerName``)."""

# k8s.io/kube-scheduler/extender/v1: MaxExtenderPriority / MinExtenderPriority
MAX_EXTENDER_PRIORITY: Final = 10
MIN_EXTENDER_PRIORITY: Final = 0
