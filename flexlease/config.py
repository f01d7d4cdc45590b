"""Configuration: one pydantic-settings root with a group per component.

Sources, highest first: init arguments (tests build ``Settings(...)``), environment
(``FLEXLEASE_`` prefix, ``__`` between nesting levels, e.g. ``FLEXLEASE_EXTENDER__PORT=8888``),
a YAML file given by ``FLEXLEASE_CONFIG`` (or :func:`load`'s ``path``), defaults.
Load once in ``main`` before the event loop and pass it down; no import-time singletons.
Each component owns its group class here; add fields to your own group only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from flexlease.api import keys


class _Group(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StoreSettings(_Group):
    """Which store backs the process: the Kubernetes API server on a cluster, a shared SQLite file on
    one machine, or memory."""

    kind: Literal["sqlite", "kube", "memory"] = Field(
        default="sqlite",
        description="Where cluster state lives: ``kube`` (a real cluster's API server, through "
        "kubernetes_asyncio), ``sqlite`` (one machine: the extender and the agents are separate "
        "processes sharing one SQLite file, as k3s's kine does in place of etcd) or ``memory`` "
        "(in-process: unit tests and the simulator).",
    )
    sqlite_path: Path = Field(
        default=Path("/var/lib/flexlease/state.db"),
        description="``kind: sqlite``: the SQLite file every process on the machine opens (WAL mode).",
    )
    kubeconfig: Path | None = Field(
        default=None,
        description="``kind: kube``: the kubeconfig file to use. Unset: the in-cluster ServiceAccount "
        "when running in a pod, else ``$KUBECONFIG`` or ``~/.kube/config``.",
    )
    request_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Deadline of each API request, in seconds (``kind: sqlite``: the busy timeout of "
        "a write transaction).",
    )
    watch_timeout_seconds: float = Field(
        default=300.0,
        gt=0,
        description="``kind: kube``: a watch asks the API server to end it after this many seconds "
        "(``timeoutSeconds``) and is then resumed from its last resourceVersion; a watch silent for "
        "this plus ``request_timeout_seconds`` is taken as dead.",
    )
    history_revisions: int = Field(
        default=100_000,
        ge=100,
        description="``kind: sqlite``: revision-log rows kept for watches before compaction; a watch "
        "older than that gets 410 Gone and lists again.",
    )
    sqlite_poll_seconds: float = Field(
        default=0.05,
        gt=0,
        description="``kind: sqlite``: how often a watch reads the revision log for other processes' "
        "writes, in seconds (writes of the same process wake it at once).",
    )


class TierSettings(_Group):
    """Reliability tiering (WeFlex §3.5): thresholds as ratios 0–1, periods in seconds."""

    ha_threshold: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="A GPU whose availability ratio over the window is at least this is HA "
        "(WeFlex §3.5: 100 %, i.e. 1.0).",
    )
    ma_threshold: float = Field(
        default=0.97,
        ge=0.0,
        le=1.0,
        description="A GPU whose availability ratio is at least this (and below ``ha_threshold``) is "
        "MA; below it, LA (WeFlex §3.5: 97 %). Must not exceed ``ha_threshold``.",
    )
    window_seconds: float = Field(
        default=14 * 86400,
        gt=0,
        description="The rolling window the availability ratio is measured over, in seconds "
        "(default 14 days, WeFlex Fig. 5).",
    )
    refresh_seconds: float = Field(
        default=14 * 86400,
        gt=0,
        description="How often tiers are recomputed, in seconds (default 14 days). A failure "
        "downgrades a GPU at once; nothing upgrades between refreshes.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> TierSettings:
        if self.ma_threshold > self.ha_threshold:
            raise ValueError("tiers.ma_threshold must not exceed tiers.ha_threshold")
        return self


class ExtenderSettings(_Group):
    """The kube-scheduler HTTP extender."""

    host: str = Field(
        default="127.0.0.1",
        description="Address the extender listens on (the verbs and, with ``metrics_port``, the "
        "metrics listener); ``0.0.0.0`` in a pod.",
    )
    port: int = Field(
        default=8888,
        ge=0,
        le=65535,
        description="Port of the verbs ``/filter``, ``/prioritize``, ``/bind``, ``/preempt`` (0: "
        "any free port).",
    )
    tls_cert_file: Path | None = Field(
        default=None,
        description="Server certificate (PEM); with ``tls_key_file``, the extender serves HTTPS "
        "(kube-scheduler's ``enableHTTPS``). In the manifests: ``/etc/flexlease/tls/tls.crt``.",
    )
    tls_key_file: Path | None = Field(
        default=None,
        description="Private key (PEM) of ``tls_cert_file``; the two are set together.",
    )
    tls_client_ca_file: Path | None = Field(
        default=None,
        description="CA bundle (PEM) that signs kube-scheduler's client certificate. Set: mutual TLS, "
        "a connection without a client certificate signed by it fails the handshake and never "
        "reaches a handler. Needs ``tls_cert_file``.",
    )
    tls_client_names: tuple[str, ...] = Field(
        default=(),
        description="Client certificate names (subject CN or a DNS/URI SAN) allowed to call; others "
        "get 403. Empty: any certificate the CA signed. Needs ``tls_client_ca_file``.",
    )
    tls_reload_seconds: float = Field(
        default=60.0,
        gt=0,
        description="How often the extender looks whether ``tls_cert_file``, ``tls_key_file`` or "
        "``tls_client_ca_file`` changed (cert-manager renewing the Secret, kubelet updating the "
        "mounted volume) and loads them for new connections, without a restart. Files that do not "
        "load are logged and the last good ones stay.",
    )
    tls_handshake_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Seconds a client has to finish the TLS handshake on the verbs' listener "
        "(asyncio's default); a connection still shaking hands after that is closed and counted "
        'in flexlease_extender_tls_handshake_failures_total{reason="timeout"}.',
    )
    tls_handshake_log_interval_seconds: float = Field(
        default=60.0,
        gt=0,
        description="A refused TLS handshake (wrong, expired or missing client certificate, a "
        "client that rejects ours, plain HTTP on the TLS port...) is logged with the peer's "
        "address and OpenSSL's reason at most once per reason in this many seconds; the next "
        "line says how many were not logged. Every one is counted in "
        "flexlease_extender_tls_handshake_failures_total{reason}.",
    )
    scheduler_names: tuple[str, ...] = Field(
        default=(keys.DEFAULT_SCHEDULER_NAME,),
        min_length=1,
        description="kube-scheduler profiles (``spec.schedulerName``) whose pods flexlease places and "
        "binds; ``/bind`` refuses other pods, filter/prioritize/preempt pass them untouched.",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Set: a second, plain-HTTP listener on ``host`` serving only ``GET /metrics``, "
        "``/healthz`` and ``/readyz`` (Prometheus and kubelet probes present no client "
        "certificate); the verbs stay on ``port`` only. Unset: all on ``port``.",
    )
    insecure_http: bool = Field(
        default=False,
        description="Serve plain HTTP without TLS (local use only: the demo, tests). Without a "
        "certificate and with this false, the extender refuses to start.",
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        gt=0,
        description="Largest request body accepted, in bytes; a larger one is answered 413.",
    )
    access_log: bool = Field(
        default=False,
        description="Log every request to the verbs' listener (aiohttp's access log, logger "
        "``aiohttp.access``, at INFO). Off by default: kube-scheduler calls three verbs per "
        "scheduling cycle, so at 1,000 cycles a second it would be 3,000 lines a second, and "
        "formatting them cost the process ≈ 0.1–0.3 ms of CPU per cycle. Each request's verb, "
        "status and latency are in ``flexlease_extender_request_duration_seconds``; refused "
        "requests are logged at WARNING either way.",
    )
    gpu_resource: str = Field(
        default=keys.DEFAULT_GPU_RESOURCE,
        description="The extended resource that counts a pod's GPUs (its ``resources.limits``); pods "
        "asking for none pass every filter untouched. Must match kube-scheduler's "
        "``managedResources`` and ``agent.gpu_resource``.",
    )
    reservation_ttl_seconds: float = Field(
        default=30.0,
        gt=0,
        description="A bind's reservation not confirmed by the Pod watch within this many seconds "
        "is forgotten, and claims of pods unbound for longer are released.",
    )
    shutdown_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        description="On SIGTERM, how long running requests may take to finish before the "
        "extender's cleanup runs, in seconds (keep it below the pod's grace period).",
    )
    right_of_return: bool = Field(
        default=True,
        description='False: *plain leasing*, the baseline of WeFlex §4.7 / Fig. 14 ("GPU leasing '
        'without right-of-return"), where GPUs are interchangeable. Filter, prioritize, bind and '
        "preempt then ignore reliability tiers (every healthy GPU whose agent reports a tier meets "
        "any ``flexlease.io/reliability`` and none is preferred for its tier) and ownership tags "
        "(no GPU is kept for an owner; a reclaim takes whatever is free), and the lease controller "
        "marks every Lend and Reclaim ``GPULease`` Failed. GPU type, health, priority preemption "
        "and the standby pool's rules stay as they are.",
    )
    gc_freeze_survivors: bool = Field(
        default=True,
        description="Freeze what survives each generation-1 collection "
        "(``extender.gcpolicy.freeze_survivors``), so that full collections never re-traverse the "
        "inventory replaced since start-up. False: CPython collects them as usual (full "
        "collections of tens of milliseconds return after a few thousand binds, longer as the "
        "process ages); for a process whose memory grows from reference cycles formed among "
        "long-lived objects, which the policy never collects.",
    )

    @model_validator(mode="after")
    def _tls_pair(self) -> ExtenderSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("extender.tls_cert_file and tls_key_file must be set together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("extender.tls_client_ca_file needs tls_cert_file and tls_key_file")
        if self.tls_client_names and self.tls_client_ca_file is None:
            raise ValueError("extender.tls_client_names needs tls_client_ca_file (mutual TLS)")
        return self


class StandbySettings(_Group):
    """How the lease controller sizes the standby pool (``lease.standby``): a fixed size, or
    adaptive per GPU model from the shortfalls of past Reclaims (issue #40, WeFlex §6)."""

    mode: Literal["fixed", "adaptive"] = Field(
        default="fixed",
        description="``fixed``: keep the pool at ``lease.standby_pool_size`` GPUs in total (0: leave "
        "the pools as operators set them). ``adaptive``: per GPU model, keep ``floor_gpus`` plus the "
        "``quantile`` of the shortfalls (lent GPUs a Done Reclaim could not take back: supplemented "
        "from the standby pool or unrecoverable) of the Reclaims finished within ``window_seconds``.",
    )
    quantile: float = Field(
        default=0.99,
        gt=0,
        le=1,
        description="``adaptive``: the quantile of the per-Reclaim shortfalls the pool covers (0.99: "
        "99 % of Reclaims find every standby GPU they need); computed with the inverted-CDF rule, so "
        "with fewer than 1/(1-quantile) Reclaims it is the largest shortfall seen.",
    )
    window_seconds: float = Field(
        default=14 * 86400.0,
        gt=0,
        description="``adaptive``: only Reclaims that reached Done within this many seconds count, by "
        "their ``Returned`` condition's lastTransitionTime (default 14 days, the tiers' window).",
    )
    floor_gpus: int = Field(
        default=0,
        ge=0,
        description="``adaptive``: GPUs kept in the pool for every GPU model the cluster has, on top of "
        "the quantile (also the target of a model no Reclaim has needed yet).",
    )
    floors: dict[str, int] = Field(
        default={},
        description="``adaptive``: ``floor_gpus`` per GPU model (NVML name, e.g. ``NVIDIA A100-SXM4-80GB``)"
        ", overriding it for the models named.",
    )
    hold_seconds: float = Field(
        default=86400.0,
        ge=0,
        description="``adaptive`` hysteresis: the pool grows to the target of the last "
        "``window_seconds`` at once, but shrinks only below the target of the last ``window_seconds`` "
        "+ ``hold_seconds``, so a shortfall leaving the window frees its nodes this much later, and a "
        "node moves back only when the pool stays at or above that larger target without it.",
    )

    @model_validator(mode="after")
    def _floors_non_negative(self) -> StandbySettings:
        bad = sorted(model for model, n in self.floors.items() if n < 0)
        if bad:
            raise ValueError(f"lease.standby.floors: negative floor for {', '.join(bad)}")
        return self


class LeaseSettings(_Group):
    """The lease controller (lend, reclaim, standby pool)."""

    enabled: bool = Field(
        default=True,
        description="Run the lease controller (and the rollout and orchestration controllers) in "
        "the extender process, on the elected replica. False: the extender only places pods.",
    )
    resync_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Every lease, and the cluster view, is reconciled again at least this often, in "
        "seconds, whether or not a watch event asked for it.",
    )
    standby_pool_size: int = Field(
        default=0,
        ge=0,
        description="GPUs the standby pool is kept at (``standby.mode: fixed``), by moving whole free, "
        "untagged nodes between ``general`` and ``standby``. 0: leave the pools as operators set them.",
    )
    standby: StandbySettings = Field(
        default_factory=StandbySettings,
        description="How the standby pool is sized: ``fixed`` (``standby_pool_size``) or ``adaptive`` "
        "(per GPU model, from past Reclaims' shortfalls).",
    )
    cluster_min_interval_seconds: float = Field(
        default=0.0,
        ge=0,
        description="Least time between two cluster reconciles (tag release, the standby pool, the "
        "gauges: each over every GPU), in seconds. Every bound pod's watch event asks for one; "
        "without a floor the controller runs one per bind, in the process that answers "
        "kube-scheduler: ``manifests/base/extender/config.yaml`` sets 1. 0 (the default, and the "
        "simulator's and the demo's): none, every change reconciled at once.",
    )
    leader_election: bool = Field(
        default=False,
        description="Elect one leader among the extender's replicas through a "
        "``coordination.k8s.io`` Lease: only the leader binds and runs the controllers, the others "
        "answer ``/bind`` with an error naming the leader. The manifests set true (2 replicas).",
    )
    leader_lease_name: str = Field(
        default="flexlease-extender",
        description="Name of the leader-election Lease.",
    )
    leader_lease_namespace: str = Field(
        default="flexlease-system",
        description="Namespace of the leader-election Lease.",
    )
    leader_lease_seconds: float = Field(
        default=15.0,
        gt=0,
        description="The Lease's duration, in seconds; the leader renews every 2/15 of it and steps "
        "down when no renewal succeeded for 2/3 of it (client-go's ratios).",
    )
    identity: str = Field(
        default="",
        description="This replica's holder identity in the leader Lease. Empty: the host name, i.e. "
        "the pod name.",
    )
    retry_base_seconds: float = Field(
        default=0.5,
        gt=0,
        description="Back-off after a failed reconcile, in seconds; doubles per consecutive failure "
        "up to ``retry_max_seconds``.",
    )
    retry_max_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Longest back-off after failed reconciles, in seconds.",
    )
    eviction_retry_seconds: float = Field(
        default=5.0,
        gt=0,
        description="Wait before retrying an eviction a PodDisruptionBudget refused, in seconds, when "
        "the API server gives no Retry-After.",
    )
    standby_wait_seconds: float = Field(
        default=600.0,
        gt=0,
        description="How long a Reclaim waits for a standby GPU to replace a lent GPU that failed,"
        " vanished, fell below its lend-time tier or is held by a pod that is never evicted, in"
        " seconds, counted from when the Reclaim was accepted. Past it, that GPU is listed in"
        " status.unrecoverable (reason NoStandbyOfModel when the standby pool holds no healthy GPU"
        " of its model and tier, StandbyExhausted when it does but none was free) and the Reclaim"
        " can end Done.",
    )
    reconfigure_max_age_seconds: float = Field(
        default=600.0,
        gt=0,
        description="The in-place rollout controller (``extender.rollout``) reconfigures a job after "
        "a lend or reclaim only for completions it observes: never for a ``Done`` GPULease that "
        "completed before it started, nor one that completed longer ago than this many seconds.",
    )


class AutopilotSettings(_Group):
    """The lease autopilot (``extender.autopilot``): turns ``GPULeasePolicy`` plans into leases."""

    enabled: bool = Field(
        default=True,
        description="Run the lease autopilot in the extender's leader (beside the lease controller; "
        "needs lease.enabled). False: GPULeasePolicies are not acted on.",
    )
    resync_seconds: float = Field(
        default=60.0,
        gt=0,
        description="How often each policy is reconciled at the latest: demand read, plan made, "
        "a lease written when due (sooner when the plan changes before then). Part of leadTime: auto.",
    )
    prometheus_url: str | None = Field(
        default=None,
        description="Prometheus server the prometheus and forecast demand sources query "
        "(http://prometheus-operated.monitoring:9090); unset: those policies report DemandKnown=False.",
    )
    prometheus_timeout_seconds: float = Field(
        default=10.0, gt=0, description="Timeout of one Prometheus HTTP request (seconds)."
    )
    forecast_retrain_seconds: float = Field(
        default=86_400.0,
        gt=0,
        description="How often a forecast policy's model is trained again on its history (daily).",
    )
    forecast_step_seconds: float = Field(
        default=600.0,
        ge=60,
        description="Resolution of the forecast model (seconds per point; at least the policy's "
        "stepSeconds): 600 keeps 28 days of history under Prometheus' 11,000 points per query.",
    )
    retry_base_seconds: float = Field(
        default=1.0, gt=0, description="Back-off after a failed reconcile; doubles up to retry_max_seconds."
    )
    retry_max_seconds: float = Field(default=60.0, gt=0, description="Longest back-off after failures.")


class OrchestratorSettings(_Group):
    """Topology-aware orchestration (WeFlex §3.4)."""

    profile_dirs: tuple[Path, ...] = Field(
        default=(),
        description="Directories of your own framework profiles (``*.yaml``), added to the shipped "
        "ones (a profile with a shipped name replaces it). Their critical roles are protected from "
        "reclaim. A malformed profile stops the extender at start, naming its file and line.",
    )
    executor: Literal["none", "kubernetes", "cri"] = Field(
        default="none",
        description="How the extender's leader runs a job's profile commands after a lend or reclaim "
        "of it completes: ``kubernetes`` (``pods/exec`` on the API server the store uses; the "
        "shipped RBAC does not grant it), ``cri`` (CRI ``ExecSync`` at ``cri_endpoint``: one node, "
        "e.g. the local demo) or ``none`` (no runs).",
    )
    cri_endpoint: str = Field(
        default="unix:///run/containerd/containerd.sock",
        description="``executor: cri``: the CRI runtime's gRPC endpoint.",
    )
    max_attempts: int = Field(
        default=5,
        ge=1,
        le=100,
        description="Executions per command before it is ``Failed`` (bounded exponential back-off "
        "between them: 1, 2, 4 … 30 s).",
    )
    ready_timeout_seconds: float = Field(
        default=300.0,
        gt=0,
        description="How long a command waits for its preconditions before it is ``TimedOut``, in seconds.",
    )


class AgentSettings(_Group):
    """The node agent (DaemonSet): NVML health, the availability ledger, the device plugin, image and
    checkpoint caches, hot restarts and streaming-data staging."""

    node_name: str = Field(
        default_factory=lambda: os.environ.get("NODE_NAME", ""),
        description="The node this agent serves (its GPUNode's name). Default: ``$NODE_NAME`` (the "
        "DaemonSet sets it from the downward API ``spec.nodeName``).",
    )
    node_ip: str = Field(
        default_factory=lambda: os.environ.get("NODE_IP", ""),
        description="The node's IP, reported in ``GPUNode.status.nodeIP``. Default: ``$NODE_IP`` "
        "(the DaemonSet sets it from ``status.hostIP``).",
    )
    nvml: Literal["real", "simulated"] = Field(
        default="real",
        description="GPU backend: ``real`` (NVML through nvidia-ml-py) or ``simulated`` (scripted "
        "GPUs from ``node_config``: the demo, tests, the simulator).",
    )
    node_config: Path | None = Field(
        default=None,
        description="``nvml: simulated``: YAML describing the simulated GPUs and an event script "
        "(XIDs, GPUs falling off the bus).",
    )
    state_dir: Path = Field(
        default=Path("/var/lib/flexlease-agent"),
        description="Directory of the availability ledger (``ledger.json``), kept across agent "
        "restarts (a hostPath in the DaemonSet).",
    )
    metrics_host: str = Field(
        default="0.0.0.0",
        description="Address of the agent's read-only HTTP listener (``GET /metrics``, "
        "``/healthz``, ``/readyz``).",
    )
    metrics_port: int = Field(
        default=9400,
        ge=0,
        le=65535,
        description="Port of the agent's read-only HTTP listener.",
    )
    heartbeat_seconds: float = Field(
        default=30.0,
        gt=0,
        description="The agent writes its GPUNode status at least this often, in seconds, even when "
        "nothing changed (``status.agent.heartbeat``); also how often it retries NVML when it "
        "cannot start.",
    )
    poll_seconds: float = Field(
        default=5.0,
        gt=0,
        description="How often each GPU is queried through NVML, in seconds (health events arrive "
        "between polls).",
    )
    application_xids: frozenset[int] = Field(
        default=frozenset({13, 31, 43, 45, 68, 109}),
        description="XID codes caused by applications, not by the GPU: they are counted but do not "
        "make a GPU Unhealthy. Every other XID is critical.",
    )
    recovery_hold_down_seconds: float = Field(
        default=300.0,
        ge=0,
        description="An Unhealthy GPU becomes Healthy again only after NVML has shown it healthy for "
        "this many seconds, also across agent restarts.",
    )
    cri_endpoint: str = Field(
        default="unix:///run/containerd/containerd.sock",
        description="The node's CRI runtime (containerd) gRPC endpoint: image pre-pulls and hot restarts.",
    )
    cri_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Deadline of each CRI call except image pulls, in seconds.",
    )
    image_pull_timeout_seconds: float = Field(
        default=600.0,
        gt=0,
        description="Deadline of one CRI image pull, in seconds.",
    )
    checkpoint_dir: Path = Field(
        default=Path("/var/lib/flexlease-agent/checkpoints"),
        description="Directory of the checkpoint cache (size-bounded, LRU, sha256-verified).",
    )
    checkpoint_cache_bytes: int = Field(
        default=200 * 1024**3,
        gt=0,
        description="Capacity of the checkpoint cache, in bytes; the least recently used "
        "checkpoints are evicted beyond it.",
    )
    hot_restart_strategy: Literal["auto", "direct", "kubelet"] = Field(
        default="auto",
        description="For hot-restart requests naming none: ``auto`` picks ``kubelet`` for sandboxes a "
        "kubelet manages and ``direct`` for those flexlease runs itself (``flexlease.io/no-kubelet``).",
    )
    hot_restart_kubelet_wait_seconds: float = Field(
        default=120.0,
        gt=0,
        description=(
            "Hot restart, kubelet strategy: how long the agent waits, after writing the new image "
            "into the pod spec, for kubelet's replacement container to run before it reports the "
            "restart Failed (seconds; it includes the pod's termination grace period, which kubelet "
            "gives the old container first). A replacement that fails sooner — StartError, exit code "
            "128, CrashLoopBackOff, ErrImagePull/ImagePullBackOff, CreateContainerError, "
            "CreateContainerConfigError, RunContainerError — is reported as soon as it is seen (the "
            "agent looks every 0.2 s). The same bound applies to kubelet running the previous image "
            "again after a rollback."
        ),
    )
    hot_restart_rollback: bool = Field(
        default=True,
        description=(
            "Undo a hot restart whose replacement fails after the old container was stopped, so the "
            "job trains again: kubelet strategy, the previous image is written back into the pod spec "
            "and kubelet's restart of it confirmed; direct strategy, the old container's config is "
            "started again as a new attempt. The hot-restart-status reports it under 'rollback'. "
            "Off: the failure is only reported and the pod is left as it is."
        ),
    )
    device_plugin: bool = Field(
        default=True,
        description="Serve the kubelet device-plugin API for ``gpu_resource`` (replaces NVIDIA's plugin).",
    )
    device_plugin_dir: Path = Field(
        default=Path("/var/lib/kubelet/device-plugins"),
        description="kubelet's device-plugin directory (fixed there upstream; a setting for tests and "
        "the demo): ``kubelet.sock`` (kubelet's Registration service) and the plugin's own socket.",
    )
    device_plugin_socket: str = Field(
        default="flexlease-gpu.sock",
        description="The plugin's socket, a file name inside ``device_plugin_dir``.",
    )
    gpu_resource: str = Field(
        default=keys.DEFAULT_GPU_RESOURCE,
        description="The extended resource the device plugin advertises (as ``extender.gpu_resource``).",
    )
    device_plugin_poll_seconds: float = Field(
        default=1.0,
        gt=0,
        description="How often the plugin checks for kubelet's socket and its own (kubelet restarts), "
        "in seconds.",
    )
    device_plugin_match_wait_seconds: float = Field(
        default=2.0,
        ge=0,
        description="How long GetPreferredAllocation/Allocate wait for the pod watch to show a pod "
        "that fits (the agent's watch may trail kubelet's by a moment) before answering without "
        "one, in seconds.",
    )
    device_plugin_device_specs: bool = Field(
        default=False,
        description="Allocate also returns the device nodes (``/dev/nvidia<minor>``, "
        "``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``); off when the NVIDIA "
        "container runtime injects them from ``NVIDIA_VISIBLE_DEVICES``.",
    )
    cdi_prefix: str = Field(
        default="",
        description="When set (e.g. ``nvidia.com/gpu``), Allocate also returns CDI device names "
        "``<prefix>=<UUID>`` (a CDI spec generated with ``nvidia-ctk cdi generate "
        "--device-name-strategy=uuid``).",
    )
    pod_resources_socket: Path = Field(
        default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
        description="kubelet's PodResources API socket (``List``, ``GetAllocatableResources``).",
    )
    pod_resources_seconds: float = Field(
        default=10.0,
        gt=0,
        description="How often the device plugin reads PodResources back and compares it with the "
        "assignments, in seconds.",
    )
    staging_nats_url: str | None = Field(
        default=None,
        description="NATS JetStream server for streaming-data staging (``nats://host:4222``); "
        "staging is off when unset. Jobs opt in with ``flexlease.io/stream`` annotations "
        "(WeFlex §3.3).",
    )
    staging_rate_sample_seconds: float = Field(
        default=1.0,
        gt=0,
        description="How long a job's input rate (records/s, bytes/s) is measured when a staging "
        "begins, in seconds; the staging stream is sized from it.",
    )
    staging_poll_seconds: float = Field(
        default=0.5,
        gt=0,
        description="How often a running staging is checked (rate, the job's committed offset), in seconds.",
    )
    staging_max_hold_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="A staging the job has not caught up with after this many seconds is dropped.",
    )


class Settings(BaseSettings):
    """Root of all configuration."""

    config_path: ClassVar[Path | None] = None
    """The YAML file :func:`load` was given (None: ``$FLEXLEASE_CONFIG``)."""

    model_config = SettingsConfigDict(
        env_prefix="FLEXLEASE_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
    )

    log_level: str = Field(
        default="INFO",
        description="Lowest level logged: ``DEBUG``, ``INFO``, ``WARNING``, ``ERROR``.",
    )
    log_format: Literal["json", "text"] = Field(
        default="json",
        description="One JSON object per line (``json``) or human-readable lines (``text``).",
    )
    clock_speedup: float = Field(
        default=1.0,
        gt=0,
        description="Simulated time runs this many times faster than real time (demo, simulator); "
        "1 = real. Scales grace periods and resyncs of the lease controller.",
    )
    clock_origin: float | None = Field(
        default=None,
        description="With clock_speedup: the real epoch second at which the accelerated clock "
        "equals real time; it reads origin + (now - origin) x speedup, so another process (the demo) "
        "knows the extender's time exactly. Unset: the clock starts at the process's start.",
    )
    store: StoreSettings = Field(default_factory=StoreSettings)
    tiers: TierSettings = Field(default_factory=TierSettings)
    extender: ExtenderSettings = Field(default_factory=ExtenderSettings)
    lease: LeaseSettings = Field(default_factory=LeaseSettings)
    autopilot: AutopilotSettings = Field(default_factory=AutopilotSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)
    orchestrator: OrchestratorSettings = Field(default_factory=OrchestratorSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _YamlFileSource(settings_cls, cls.config_path))


class _YamlFileSource(PydanticBaseSettingsSource):
    """Values from a YAML file: ``path``, else the file named by ``$FLEXLEASE_CONFIG``."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None = None) -> None:
        super().__init__(settings_cls)
        self._path = path

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = self._path or (Path(p) if (p := os.environ.get("FLEXLEASE_CONFIG")) else None)
        if path is None:
            return {}
        data = yaml.safe_load(path.read_text())
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: the config file must hold a mapping")
        return data


def load(path: Path | None = None, **overrides: Any) -> Settings:
    """Build :class:`Settings` from ``overrides`` > environment > the YAML file ``path``
    (else ``$FLEXLEASE_CONFIG``) > defaults. Raises ``pydantic.ValidationError`` on bad
    values and ``OSError`` when the file cannot be read."""
    if path is None:
        return Settings(**overrides)
    from_file = type("Settings", (Settings,), {"config_path": path})
    settings: Settings = from_file(**overrides)
    return settings
