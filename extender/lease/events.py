"""Kubernetes Events (core/v1 ``Event``) the lease controller writes. Pure; no I/O.

Shape as ``kubectl describe`` reads it: ``involvedObject``, ``reason``, ``message``, ``type``
(Normal/Warning), ``source.component``, ``firstTimestamp``/``lastTimestamp``, ``count``, plus
``reportingComponent``/``reportingInstance``. Events of a cluster-scoped object (GPUNode) go
to the ``default`` namespace, as kubelet does for Nodes.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from extender.lease.planner import EventType
from flexlease.api import keys
from flexlease.clock import format_time

COMPONENT: Final = "flexlease-lease-controller"
MESSAGE_LIMIT: Final = 1024
"""The API server rejects Event messages longer than this (validation of core/v1 Event)."""


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """``involvedObject``: what the Event is about."""

    api_version: str
    kind: str
    name: str
    namespace: str | None = None
    uid: str | None = None

    @classmethod
    def pod(cls, namespace: str, name: str, uid: str | None) -> ObjectRef:
        return cls("v1", "Pod", name, namespace, uid or None)

    @classmethod
    def lease(cls, namespace: str, name: str, uid: str | None) -> ObjectRef:
        return cls(keys.API_VERSION, keys.GPULEASE_KIND, name, namespace, uid or None)

    @classmethod
    def gpunode(cls, name: str, uid: str | None) -> ObjectRef:
        return cls(keys.API_VERSION, keys.GPUNODE_KIND, name, None, uid or None)


def event_object(
    ref: ObjectRef, reason: str, *, message: str, type: EventType, now: datetime, instance: str
) -> dict[str, Any]:
    """A core/v1 Event for ``ref`` at ``now`` (count 1). ``message`` is cut at
    :data:`MESSAGE_LIMIT` characters. The name is ``<object>.<16 hex digits>``, unique."""
    involved: dict[str, Any] = {"apiVersion": ref.api_version, "kind": ref.kind, "name": ref.name}
    if ref.namespace is not None:
        involved["namespace"] = ref.namespace
    if ref.uid is not None:
        involved["uid"] = ref.uid
    stamp = format_time(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{ref.name}.{secrets.token_hex(8)}", "namespace": ref.namespace or "default"},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:MESSAGE_LIMIT],
        "type": type.value,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
