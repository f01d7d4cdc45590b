"""Build CRI configs for a pod the way kubelet does (``kuberuntime_sandbox.go``,
``kuberuntime_container.go``): the ``io.kubernetes.*`` labels that tie a sandbox and its
containers to the pod, per-pod log directory, pod-shared network and IPC namespaces,
container-private PID namespace, ``<name>/<attempt>.log`` log paths.

Used where flexlease itself must create a pod without a kubelet (the direct-restart
benchmark, the standby prelaunch check, the demo, the tests): such sandboxes carry
``flexlease.io/no-kubelet=true`` (:data:`flexlease.api.keys.LABEL_NO_KUBELET`), which is what
lets the hot-restart ``direct`` strategy touch them. The stand-in kubelet
(``standins.kubelet_pods``) builds its sandboxes with ``no_kubelet=False``, as kubelet would.
Pure: builds messages, does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from flexlease.api import keys
from flexlease.cri import api_pb2
from nodeagent.cri.client import (
    LABEL_CONTAINER_NAME,
    LABEL_POD_NAME,
    LABEL_POD_NAMESPACE,
    LABEL_POD_UID,
)


@dataclass(frozen=True, slots=True)
class PodRef:
    """The pod a sandbox belongs to: namespace, name, UID."""

    namespace: str
    name: str
    uid: str

    @property
    def labels(self) -> dict[str, str]:
        return {LABEL_POD_NAME: self.name, LABEL_POD_NAMESPACE: self.namespace, LABEL_POD_UID: self.uid}


@dataclass(frozen=True, slots=True)
class HostMount:
    """A volume: host path mounted at ``container_path``."""

    host_path: Path
    container_path: str
    readonly: bool = False


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """The part of a pod's container spec the runtime sees. ``command`` overrides the image
    entrypoint when non-empty."""

    name: str
    image: str
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[HostMount, ...] = ()


def sandbox_config(
    pod: PodRef,
    log_root: Path,
    *,
    cgroup_parent: str = "",
    attempt: int = 0,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    no_kubelet: bool = True,
    host_network: bool = False,
) -> api_pb2.PodSandboxConfig:
    """A ``PodSandboxConfig`` for ``pod``: kubelet's ``io.kubernetes.pod.*`` labels (plus
    ``labels``, as kubelet copies the pod's labels), ``flexlease.io/no-kubelet=true`` unless
    ``no_kubelet`` is False, log directory ``<log_root>/<ns>_<name>_<uid>``, pod network/IPC
    namespaces (the node's network with ``host_network``, as ``hostNetwork: true``: no CNI,
    and the node's hostname), hostname = pod name."""
    all_labels = {**(labels or {}), **pod.labels}
    if no_kubelet:
        all_labels[keys.LABEL_NO_KUBELET] = "true"
    return api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(
            name=pod.name, uid=pod.uid, namespace=pod.namespace, attempt=attempt
        ),
        hostname="" if host_network else pod.name,  # runc sets no hostname in the node's UTS namespace
        log_directory=str(log_root / f"{pod.namespace}_{pod.name}_{pod.uid}"),
        labels=all_labels,
        annotations=dict(annotations or {}),
        linux=api_pb2.LinuxPodSandboxConfig(
            cgroup_parent=cgroup_parent,
            security_context=api_pb2.LinuxSandboxSecurityContext(
                namespace_options=api_pb2.NamespaceOption(
                    network=api_pb2.NODE if host_network else api_pb2.POD,
                    pid=api_pb2.CONTAINER,
                    ipc=api_pb2.POD,
                ),
            ),
        ),
    )


def container_config(
    pod: PodRef, spec: ContainerSpec, *, attempt: int = 0, host_network: bool = False
) -> api_pb2.ContainerConfig:
    """A ``ContainerConfig`` for ``spec`` in ``pod``: kubelet labels, log path
    ``<name>/<attempt>.log``, pod network/IPC (the node's network with ``host_network``,
    matching the sandbox), private PID namespace."""
    return api_pb2.ContainerConfig(
        metadata=api_pb2.ContainerMetadata(name=spec.name, attempt=attempt),
        image=api_pb2.ImageSpec(image=spec.image),
        command=list(spec.command),
        args=list(spec.args),
        envs=[api_pb2.KeyValue(key=k, value=v) for k, v in sorted(spec.env.items())],
        mounts=[
            api_pb2.Mount(host_path=str(m.host_path), container_path=m.container_path, readonly=m.readonly)
            for m in spec.mounts
        ],
        labels={**pod.labels, LABEL_CONTAINER_NAME: spec.name},
        log_path=f"{spec.name}/{attempt}.log",
        linux=api_pb2.LinuxContainerConfig(
            security_context=api_pb2.LinuxContainerSecurityContext(
                namespace_options=api_pb2.NamespaceOption(
                    network=api_pb2.NODE if host_network else api_pb2.POD,
                    pid=api_pb2.CONTAINER,
                    ipc=api_pb2.POD,
                ),
            ),
        ),
    )
