"""The readiness snapshot (WeFlex §3.4): the job's pods by role, with their readiness, as of
the latest watch event. Pure: :func:`pod_state` reads a Pod's JSON, :class:`Snapshot` answers
the preconditions; the watch that keeps it current is :mod:`extender.orchestrator.watch`.

Readiness follows Kubernetes: a pod is Ready when it is not being deleted, its phase is
``Running`` and its ``Ready`` condition is ``"True"`` (kubelet sets it from the readiness
probes). A pod is *running* (a command can be executed in it) when the role's container has a
``containerID`` and a ``running`` state in ``status.containerStatuses``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flexlease.api import keys


@dataclass(frozen=True, slots=True)
class PodState:
    """One pod as the orchestrator sees it.

    ``container``: the container commands run in; ``container_id``: its runtime id with the
    ``<runtime>://`` prefix removed (None until it has one). ``ip``: ``status.podIP`` (the
    node's IP for host-network pods). ``port``: the container's first ``containerPort`` (0:
    none). ``reason``: why it is not Ready (empty when Ready)."""

    namespace: str
    name: str
    uid: str
    role: str
    ready: bool
    running: bool
    container: str
    container_id: str | None
    ip: str
    port: int
    reason: str = ""

    @property
    def key(self) -> str:
        """``<namespace>/<name>``: how logs and step records name the pod."""
        return f"{self.namespace}/{self.name}"

    @property
    def endpoint(self) -> str:
        """``<ip>:<port>`` (``<ip>`` alone when the container declares no port)."""
        return f"{self.ip}:{self.port}" if self.port else self.ip


def pod_state(obj: Mapping[str, Any], *, container: str | None = None) -> PodState:
    """Read a Pod's JSON. ``container``: the container to run commands in (default: the first
    in ``spec.containers``). Malformed or missing fields read as "not ready", never raise."""
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    status = _dict(obj.get("status"))
    labels = _dict(meta.get("labels"))
    containers = [c for c in _list(spec.get("containers")) if isinstance(c, dict)]
    chosen = next((c for c in containers if c.get("name") == container), None) if container else None
    if chosen is None and containers and container is None:
        chosen = containers[0]
    cname = str(container or (chosen or {}).get("name") or "")
    port = 0
    for p in _list((chosen or {}).get("ports")):
        if isinstance(p, dict) and isinstance(p.get("containerPort"), int):
            port = p["containerPort"]
            break
    cstatus = next(
        (s for s in _list(status.get("containerStatuses")) if isinstance(s, dict) and s.get("name") == cname),
        {},
    )
    raw_id = str(cstatus.get("containerID") or "")
    container_id = raw_id.split("://", 1)[-1] or None
    running = container_id is not None and isinstance(_dict(cstatus.get("state")).get("running"), dict)
    phase = str(status.get("phase") or "Pending")
    condition = next(
        (c for c in _list(status.get("conditions")) if isinstance(c, dict) and c.get("type") == "Ready"), {}
    )
    deleting = bool(meta.get("deletionTimestamp"))
    ready = not deleting and phase == "Running" and condition.get("status") == "True"
    reason = ""
    if deleting:
        reason = "Terminating"
    elif phase != "Running":
        reason = phase
    elif not ready:
        reason = str(condition.get("reason") or "NotReady")
    return PodState(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        role=str(labels.get(keys.LABEL_ROLE) or ""),
        ready=ready,
        running=running and not deleting,
        container=cname,
        container_id=container_id,
        ip=str(status.get("podIP") or ""),
        port=port,
        reason=reason,
    )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The job's pods by role (each tuple sorted by pod name, which gives ranks), as of watch
    change number ``version`` (0 = nothing listed yet). ``listed``: the roles whose initial list
    has arrived — a role not yet listed is "unknown", not "no pods"."""

    version: int = 0
    pods: Mapping[str, tuple[PodState, ...]] = field(default_factory=dict)
    listed: frozenset[str] = frozenset()

    def role(self, role: str) -> tuple[PodState, ...]:
        return self.pods.get(role, ())

    def ready_unmet(self, role: str, expected: int | None) -> str | None:
        """None when ``ready: <role>`` holds: the role is listed, has at least ``expected`` pods
        (None: at least one) and every one of them is Ready. Otherwise why not, for the log:
        ``worker: 1/2 ready (ns/w-1: ContainersNotReady)``."""
        return self._unmet(role, expected, lambda p: p.ready, "ready", lambda p: p.reason)

    def running_unmet(self, role: str, expected: int | None) -> str | None:
        """None when the role's pods can take a command: listed, at least ``expected`` pods
        (None: one), each with a running container. Otherwise why not."""
        return self._unmet(
            role, expected, lambda p: p.running, "running", lambda p: p.reason or "ContainerNotRunning"
        )

    def _unmet(self, role: str, expected: int | None, ok: Any, word: str, why: Any) -> str | None:
        if role not in self.listed:
            return f"{role}: pods not listed yet"
        pods = self.role(role)
        want = max(1, expected if expected is not None else len(pods))
        good = [p for p in pods if ok(p)]
        if len(pods) >= want and len(good) == len(pods):
            return None
        bad = ", ".join(f"{p.key}: {why(p)}" for p in pods if not ok(p))
        missing = f"{want - len(pods)} of {want} pods missing" if len(pods) < want else ""
        detail = "; ".join(x for x in (bad, missing) if x)
        return f"{role}: {len(good)}/{want} {word} ({detail})"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
