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
    """Which store backs the process (DESIGN §5)."""

    kind: Literal["sqlite", "kube", "memory"] = "sqlite"
    sqlite_path: Path = Path("/var/lib/flexlease/state.db")
    kubeconfig: Path | None = None
    """None: in-cluster config when available, else ``~/.kube/config``."""
    request_timeout_seconds: float = Field(default=10.0, gt=0)
    watch_timeout_seconds: float = Field(default=300.0, gt=0)
    history_revisions: int = Field(default=100_000, ge=100)
    """SqliteStore: revision-log rows kept for watches before compaction (older → 410 Gone)."""
    sqlite_poll_seconds: float = Field(default=0.05, gt=0)
    """SqliteStore: how often a watch reads the revision log for other processes' writes."""


class TierSettings(_Group):
    """Reliability tiering (WeFlex §3.5): thresholds as ratios 0–1, periods in seconds."""

    ha_threshold: float = Field(default=1.0, ge=0.0, le=1.0)
    ma_threshold: float = Field(default=0.97, ge=0.0, le=1.0)
    window_seconds: float = Field(default=14 * 86400, gt=0)
    refresh_seconds: float = Field(default=14 * 86400, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> TierSettings:
        if self.ma_threshold > self.ha_threshold:
            raise ValueError("tiers.ma_threshold must not exceed tiers.ha_threshold")
        return self


class ExtenderSettings(_Group):
    """The kube-scheduler HTTP extender."""

    host: str = "127.0.0.1"
    port: int = Field(default=8888, ge=0, le=65535)
    tls_cert_file: Path | None = None
    """Server certificate (PEM); with ``tls_key_file``, the extender serves HTTPS
    (kube-scheduler's ``enableHTTPS``). In the manifests: ``/etc/flexlease/tls/tls.crt``."""
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None
    """CA bundle (PEM) that signs kube-scheduler's client certificate. Set: mutual TLS, a
    connection without a client certificate signed by it fails the handshake and never reaches
    a handler. Needs ``tls_cert_file``."""
    tls_client_names: tuple[str, ...] = ()
    """Client certificate names (subject CN or a DNS/URI SAN) allowed to call; empty = any
    certificate the CA signed. Needs ``tls_client_ca_file``."""
    tls_reload_seconds: float = Field(default=60.0, gt=0)
    """How often the extender looks whether ``tls_cert_file``, ``tls_key_file`` or
    ``tls_client_ca_file`` changed (cert-manager renewing the Secret, kubelet updating the
    mounted volume) and loads them for new connections, without a restart."""
    scheduler_names: tuple[str, ...] = Field(default=(keys.DEFAULT_SCHEDULER_NAME,), min_length=1)
    """kube-scheduler profiles (``spec.schedulerName``) whose pods flexlease places and binds;
    ``/bind`` refuses other pods, filter/prioritize/preempt pass them untouched."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Set: a second, plain-HTTP listener on ``host`` serving only ``GET /metrics``,
    ``/healthz`` and ``/readyz`` (Prometheus and kubelet probes present no client
    certificate); the verbs stay on ``port`` only. None: all on ``port``."""
    insecure_http: bool = False
    """Serve plain HTTP without TLS (local use only: the demo, tests). Without a certificate
    and with this false, the extender refuses to start."""
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    access_log: bool = False
    """Log every request to the verbs' listener (aiohttp's access log, logger
    ``aiohttp.access``, at INFO). Off by default: kube-scheduler calls three verbs per
    scheduling cycle, so at 1,000 cycles a second it would be 3,000 lines a second, and
    formatting them cost the process ≈ 0.1–0.3 ms of CPU per cycle (README, "Extender
    speed, twelfth round"). Each request's verb, status and latency are in
    ``flexlease_extender_request_seconds``; refused requests are logged at WARNING either way."""
    gpu_resource: str = keys.DEFAULT_GPU_RESOURCE
    reservation_ttl_seconds: float = Field(default=30.0, gt=0)
    """A bind's reservation not confirmed by the watch within this time is forgotten."""
    shutdown_timeout_seconds: float = Field(default=5.0, gt=0)
    right_of_return: bool = True
    """False: *plain leasing*, the baseline of WeFlex §4.7 / Fig. 14 ("GPU leasing without
    right-of-return"), where GPUs are interchangeable. Filter, prioritize, bind and preempt
    then ignore reliability tiers (every healthy GPU whose agent reports a tier meets any
    ``flexlease.io/reliability`` and none is preferred for its tier) and ownership tags (no
    GPU is kept for an owner; a reclaim takes whatever is free), and the lease controller
    marks every Lend and Reclaim ``GPULease`` Failed (there is nothing to tag or return). GPU
    type, health, priority preemption and the standby pool's rules stay as they are."""
    gc_freeze_survivors: bool = True
    """Freeze what survives each generation-1 collection (:func:`extender.gcpolicy.freeze_survivors`),
    so that full collections never re-traverse the inventory replaced since start-up. False:
    CPython collects them as usual (full collections of tens of milliseconds return after a
    few thousand binds, longer as the process ages); for a process whose memory grows from
    reference cycles formed among long-lived objects, which the policy never collects."""

    @model_validator(mode="after")
    def _tls_pair(self) -> ExtenderSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("extender.tls_cert_file and tls_key_file must be set together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("extender.tls_client_ca_file needs tls_cert_file and tls_key_file")
        if self.tls_client_names and self.tls_client_ca_file is None:
            raise ValueError("extender.tls_client_names needs tls_client_ca_file (mutual TLS)")
        return self


class LeaseSettings(_Group):
    """The lease controller (lend, reclaim, standby pool)."""

    enabled: bool = True
    resync_seconds: float = Field(default=30.0, gt=0)
    standby_pool_size: int = Field(default=0, ge=0)
    """GPUs the standby pool is kept at (0 = leave the pool as operators set it)."""
    cluster_min_interval_seconds: float = Field(default=0.0, ge=0)
    """Least time between two cluster reconciles (tag release, the standby pool, the gauges: each
    over every GPU). Every bound pod's watch event asks for one; without a floor the controller
    runs one per bind, in the process that answers kube-scheduler (README, "ninth round"):
    ``manifests/base/extender/config.yaml`` sets 1. 0 (the default, and the simulator's and the
    demo's): none, every change reconciled at once."""
    leader_election: bool = False
    leader_lease_name: str = "flexlease-extender"
    leader_lease_namespace: str = "flexlease-system"
    leader_lease_seconds: float = Field(default=15.0, gt=0)
    identity: str = ""
    """This replica's holder identity in the leader Lease (default: the host name, i.e. the pod name)."""
    retry_base_seconds: float = Field(default=0.5, gt=0)
    """Back-off after a failed reconcile; doubles per consecutive failure up to ``retry_max_seconds``."""
    retry_max_seconds: float = Field(default=60.0, gt=0)
    eviction_retry_seconds: float = Field(default=5.0, gt=0)
    """Wait before retrying an eviction a PodDisruptionBudget refused, when no Retry-After is given."""
    standby_wait_seconds: float = Field(
        default=600.0,
        gt=0,
        description="How long a Reclaim waits for a standby GPU to replace a lent GPU that failed,"
        " vanished, fell below its lend-time tier or is held by a pod that is never evicted, counted"
        " from when the Reclaim was accepted. Past it, that GPU is listed in status.unrecoverable"
        " (reason NoStandbyOfModel when the standby pool holds no healthy GPU of its model and"
        " tier, StandbyExhausted when it does but none was free) and the Reclaim can end Done.",
    )
    reconfigure_max_age_seconds: float = Field(default=600.0, gt=0)
    """The in-place rollout controller (``extender.rollout``) reconfigures a job after a lend or
    reclaim only for completions it observes: never for a ``Done`` GPULease that completed
    before it started, nor one that completed longer ago than this (``extender.rollout.age``)."""


class OrchestratorSettings(_Group):
    """Topology-aware orchestration (WeFlex §3.4)."""

    profile_dirs: tuple[Path, ...] = ()
    """Directories of your own framework profiles (``*.yaml``), added to the shipped ones (a
    profile with a shipped name replaces it). Their critical roles are protected from reclaim."""
    executor: Literal["none", "kubernetes", "cri"] = "none"
    """How the extender's leader runs a job's profile commands after a lend or reclaim of it
    completes: ``kubernetes`` (``pods/exec`` on the API server the store uses), ``cri`` (CRI
    ``ExecSync`` at ``cri_endpoint``: one node, e.g. the local demo) or ``none`` (no runs)."""
    cri_endpoint: str = "unix:///run/containerd/containerd.sock"
    max_attempts: int = Field(default=5, ge=1, le=100)
    """Executions per command before it is ``Failed`` (bounded exponential back-off between)."""
    ready_timeout_seconds: float = Field(default=300.0, gt=0)
    """How long a command waits for its preconditions before it is ``TimedOut``."""


class AgentSettings(_Group):
    """The node agent (DaemonSet). Sub-groups are owned by their components."""

    node_name: str = Field(default_factory=lambda: os.environ.get("NODE_NAME", ""))
    node_ip: str = Field(default_factory=lambda: os.environ.get("NODE_IP", ""))
    nvml: Literal["real", "simulated"] = "real"
    node_config: Path | None = None
    """YAML describing simulated GPUs and an event script (``nvml: simulated``)."""
    state_dir: Path = Path("/var/lib/flexlease-agent")
    metrics_host: str = "0.0.0.0"
    metrics_port: int = Field(default=9400, ge=0, le=65535)
    heartbeat_seconds: float = Field(default=30.0, gt=0)
    poll_seconds: float = Field(default=5.0, gt=0)
    application_xids: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
    recovery_hold_down_seconds: float = Field(default=300.0, ge=0)
    cri_endpoint: str = "unix:///run/containerd/containerd.sock"
    cri_timeout_seconds: float = Field(default=10.0, gt=0)
    image_pull_timeout_seconds: float = Field(default=600.0, gt=0)
    checkpoint_dir: Path = Path("/var/lib/flexlease-agent/checkpoints")
    checkpoint_cache_bytes: int = Field(default=200 * 1024**3, gt=0)
    hot_restart_strategy: Literal["auto", "direct", "kubelet"] = "auto"
    """For hot-restart requests naming none: ``auto`` picks ``kubelet`` for sandboxes a kubelet
    manages and ``direct`` for those flexlease runs itself (``flexlease.io/no-kubelet``)."""
    device_plugin: bool = True
    """Serve the kubelet device-plugin API for ``gpu_resource`` (replaces NVIDIA's plugin)."""
    device_plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    """kubelet's device-plugin directory (fixed there upstream; a setting for tests and the demo):
    ``kubelet.sock`` (kubelet's Registration service) and the plugin's own socket."""
    device_plugin_socket: str = "flexlease-gpu.sock"
    """The plugin's socket, a file name inside ``device_plugin_dir``."""
    gpu_resource: str = keys.DEFAULT_GPU_RESOURCE
    """The extended resource the device plugin advertises (as ``extender.gpu_resource``)."""
    device_plugin_poll_seconds: float = Field(default=1.0, gt=0)
    """How often the plugin checks for kubelet's socket and its own (kubelet restarts)."""
    device_plugin_match_wait_seconds: float = Field(default=2.0, ge=0)
    """How long GetPreferredAllocation/Allocate wait for the pod watch to show a pod that fits
    (the agent's watch may trail kubelet's by a moment) before answering without one."""
    device_plugin_device_specs: bool = False
    """Allocate also returns the device nodes (``/dev/nvidia<minor>``, ``/dev/nvidiactl``,
    ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``); off when the NVIDIA container runtime
    injects them from ``NVIDIA_VISIBLE_DEVICES``."""
    cdi_prefix: str = ""
    """When set (e.g. ``nvidia.com/gpu``), Allocate also returns CDI device names
    ``<prefix>=<UUID>`` (a CDI spec generated with ``nvidia-ctk cdi generate
    --device-name-strategy=uuid``)."""
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    """kubelet's PodResources API socket (``List``, ``GetAllocatableResources``)."""
    pod_resources_seconds: float = Field(default=10.0, gt=0)
    """How often the device plugin reads PodResources back and compares it with assignments."""
    staging_nats_url: str | None = None
    """NATS JetStream server for streaming-data staging (``nats://host:4222``); staging is
    off when unset. Jobs opt in with ``flexlease.io/stream`` annotations (WeFlex §3.3)."""
    staging_rate_sample_seconds: float = Field(default=1.0, gt=0)
    staging_poll_seconds: float = Field(default=0.5, gt=0)
    staging_max_hold_seconds: float = Field(default=3600.0, gt=0)


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

    log_level: str = "INFO"
    log_format: Literal["json", "text"] = "json"
    clock_speedup: float = Field(default=1.0, gt=0)
    """Simulated time runs this many times faster than real time (demo, simulator); 1 = real.
    Scales grace periods and resyncs of the lease controller (``FLEXLEASE_CLOCK_SPEEDUP``)."""
    store: StoreSettings = Field(default_factory=StoreSettings)
    tiers: TierSettings = Field(default_factory=TierSettings)
    extender: ExtenderSettings = Field(default_factory=ExtenderSettings)
    lease: LeaseSettings = Field(default_factory=LeaseSettings)
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
