"""Which pods the extender keeps: a client-side predicate for :class:`~flexlease.store.kube.KubeStore`.

A label or field selector cannot say "requests ``nvidia.com/gpu``, or carries a
``flexlease.io/`` key, or runs on a GPU node", so the API server sends every pod and the
store drops the rest before they reach the informer (``KubeStore(pod_filter=...)``; see
there for how watch events are rewritten so the informer's cache stays exact). Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import Any

from flexlease.api import keys
from flexlease.api.pod import pod_gpu_count
from flexlease.errors import PodSpecError


def _no_nodes() -> Container[str]:
    return frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class ManagedPods:
    """Predicate over Pod JSON: True for pods flexlease must see.

    A pod matches when it requests ``resource`` (limits or requests, counted as
    :func:`flexlease.api.pod.pod_gpu_count` counts), carries any ``flexlease.io/`` annotation
    or label, or is bound (``spec.nodeName``) to a node in ``gpu_nodes()`` (called per pod;
    give it the inventory's live set of GPUNode names). A pod whose GPU quantity is malformed
    matches too, so the extender can report it instead of never seeing it.

    ``gpu_nodes`` is read when a pod is listed or changes: a pod that matches only because
    its node gained a GPUNode later shows up at its next change or the next re-list.
    """

    resource: str = keys.DEFAULT_GPU_RESOURCE
    gpu_nodes: Callable[[], Container[str]] = field(default=_no_nodes)

    def __call__(self, pod: dict[str, Any]) -> bool:
        meta = pod.get("metadata") or {}
        for section in ("annotations", "labels"):
            values = meta.get(section) or {}
            if isinstance(values, dict) and any(str(k).startswith(keys.PREFIX) for k in values):
                return True
        try:
            if pod_gpu_count(pod, self.resource) > 0:
                return True
        except PodSpecError:
            return True
        spec = pod.get("spec") or {}
        node = spec.get("nodeName") if isinstance(spec, dict) else None
        return bool(node) and node in self.gpu_nodes()
