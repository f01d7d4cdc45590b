"""Where each :class:`~flexlease.store.base.Kind` lives on a Kubernetes API server.

Pure data: API group/version, plural, scope and subresources, and the REST paths built from
them (``/api/v1/namespaces/{ns}/pods/{name}/status``,
``/apis/flexlease.io/v1alpha1/gpunodes/{name}``). Used by :mod:`flexlease.store.kube` and by
the test API server, so both agree on the URL layout of the Kubernetes API
(k8s.io/apiserver ``RequestInfoFactory``: ``/api/v1`` for the core group,
``/apis/{group}/{version}`` otherwise, ``namespaces/{ns}`` for namespaced resources).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import quote

from flexlease.api import keys
from flexlease.store.base import Kind


@dataclass(frozen=True, slots=True, kw_only=True)
class Resource:
    """One API resource. ``group`` is ``""`` for the core group (``/api/v1``)."""

    kind: Kind
    group: str
    version: str
    plural: str
    namespaced: bool
    status_subresource: bool

    @property
    def api_version(self) -> str:
        """``apiVersion`` as written in objects: ``v1`` or ``<group>/<version>``."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        """``/api/v1`` or ``/apis/<group>/<version>``."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def collection_path(self, namespace: str | None) -> str:
        """Path of the collection: all namespaces when ``namespace`` is None or the resource
        is cluster-scoped."""
        if self.namespaced and namespace is not None:
            return f"{self.prefix}/namespaces/{_seg(namespace)}/{self.plural}"
        return f"{self.prefix}/{self.plural}"

    def object_path(self, name: str, namespace: str | None, subresource: str | None = None) -> str:
        """Path of one object (and optionally one of its subresources). Namespaced
        resources need a namespace; it is ignored for cluster-scoped ones."""
        if self.namespaced:
            if not namespace:
                raise ValueError(f"{self.kind} is namespaced: a namespace is required")
            base = f"{self.prefix}/namespaces/{_seg(namespace)}/{self.plural}/{_seg(name)}"
        else:
            base = f"{self.prefix}/{self.plural}/{_seg(name)}"
        return f"{base}/{subresource}" if subresource else base


def _seg(value: str) -> str:
    """Escape one path segment (names are DNS subdomains, but never trust input)."""
    if not value or value in (".", ".."):
        raise ValueError(f"invalid path segment {value!r}")
    return quote(value, safe="")


RESOURCES: Final[dict[Kind, Resource]] = {
    r.kind: r
    for r in (
        Resource(
            kind=Kind.POD, group="", version="v1", plural="pods", namespaced=True, status_subresource=True
        ),
        Resource(
            kind=Kind.GPUNODE,
            group=keys.GROUP,
            version=keys.VERSION,
            plural=keys.GPUNODE_PLURAL,
            namespaced=False,
            status_subresource=True,
        ),
        Resource(
            kind=Kind.GPULEASE,
            group=keys.GROUP,
            version=keys.VERSION,
            plural=keys.GPULEASE_PLURAL,
            namespaced=True,
            status_subresource=True,
        ),
        Resource(
            kind=Kind.GPULEASEPOLICY,
            group=keys.GROUP,
            version=keys.VERSION,
            plural=keys.GPULEASEPOLICY_PLURAL,
            namespaced=True,
            status_subresource=True,
        ),
        Resource(
            kind=Kind.EVENT,
            group="",
            version="v1",
            plural="events",
            namespaced=True,
            status_subresource=False,
        ),
        Resource(
            kind=Kind.LEASE,
            group="coordination.k8s.io",
            version="v1",
            plural="leases",
            namespaced=True,
            status_subresource=False,
        ),
        Resource(
            kind=Kind.PDB,
            group="policy",
            version="v1",
            plural="poddisruptionbudgets",
            namespaced=True,
            status_subresource=True,
        ),
        Resource(
            kind=Kind.NODE, group="", version="v1", plural="nodes", namespaced=False, status_subresource=True
        ),
        Resource(
            kind=Kind.STATEFULSET,
            group="apps",
            version="v1",
            plural="statefulsets",
            namespaced=True,
            status_subresource=True,
        ),
        # custom resources of other operators, served by the same generic paths as flexlease's
        # own CRDs (plurals from kubeflow/training-operator pkg/apis/kubeflow.org/v1 and
        # ray-project/kuberay ray-operator/apis/ray/v1)
        Resource(
            kind=Kind.PYTORCHJOB,
            group="kubeflow.org",
            version="v1",
            plural="pytorchjobs",
            namespaced=True,
            status_subresource=True,
        ),
        Resource(
            kind=Kind.MPIJOB,
            group="kubeflow.org",
            version="v1",
            plural="mpijobs",
            namespaced=True,
            status_subresource=True,
        ),
        Resource(
            kind=Kind.RAYCLUSTER,
            group="ray.io",
            version="v1",
            plural="rayclusters",
            namespaced=True,
            status_subresource=True,
        ),
    )
}
"""Every kind a store serves, by :class:`Kind`."""
