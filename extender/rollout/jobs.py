"""Training-operator jobs as rollout workloads: where a job's pod templates live and which
template a pod was made from. Pure: reads JSON, no I/O, no dependency on the operators' code.

Kinds, their schemas and their pods' labels (checked against the operators' Go types and
constants: kubeflow/training-operator ``pkg/apis/kubeflow.org/v1`` and kubeflow/common
``constants.go``; ray-project/kuberay ``ray-operator/apis/ray/v1`` and ``utils/constant.go``):

=============  ========================================  =============================================
kind           templates                                 pod → template
=============  ========================================  =============================================
PyTorchJob     ``spec.pytorchReplicaSpecs.{Master,       ``training.kubeflow.org/replica-type``
(kubeflow.org  Worker}.template``                        (the replica type lower-cased: ``master``,
/v1)                                                     ``worker``), ``…/replica-index``
MPIJob         ``spec.mpiReplicaSpecs.{Launcher,         the same labels (``launcher``, ``worker``)
(kubeflow.org  Worker}.template``
/v1)
RayCluster     ``spec.headGroupSpec.template``,          ``ray.io/node-type`` (``head``/``worker``)
(ray.io/v1)    ``spec.workerGroupSpecs[].template``      and ``ray.io/group`` (the worker group's
               (each with its ``groupName``)             ``groupName``; ``headgroup`` on the head)
=============  ========================================  =============================================

A *replica* key names one template: the lower-cased replica type (``master``, ``worker``,
``launcher``) or ``head`` / ``worker/<groupName>``. Each kind maps its replicas to a role of
the framework profile the orchestrator ships (``pytorch``: master, worker; ``mpi``:
coordinator = the launcher, worker; ``ray``: head, worker), so the restart order and whether
the job restarts together come from the profile (:mod:`extender.rollout.order`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from extender.rollout.plan import template_images
from flexlease.store.base import Kind

LABEL_REPLICA_TYPE: Final = "training.kubeflow.org/replica-type"
LABEL_REPLICA_INDEX: Final = "training.kubeflow.org/replica-index"
LABEL_RAY_NODE_TYPE: Final = "ray.io/node-type"
LABEL_RAY_GROUP: Final = "ray.io/group"
RAY_HEAD: Final = "head"
RAY_WORKER: Final = "worker"

Images = tuple[tuple[str, str], ...]
"""(container, image) of a template, in order."""


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _replica_specs(field: str) -> Callable[[Mapping[str, Any]], dict[str, Images]]:
    def templates(job: Mapping[str, Any]) -> dict[str, Images]:
        specs = _dict(_dict(job.get("spec")).get(field))
        return {
            str(rtype).lower(): template_images(_dict(_dict(spec).get("template")))
            for rtype, spec in specs.items()
        }

    return templates


def _ray_templates(job: Mapping[str, Any]) -> dict[str, Images]:
    spec = _dict(job.get("spec"))
    out: dict[str, Images] = {}
    head = _dict(spec.get("headGroupSpec"))
    if head:
        out[RAY_HEAD] = template_images(_dict(head.get("template")))
    groups = spec.get("workerGroupSpecs")
    for group in groups if isinstance(groups, list) else ():
        name = _dict(group).get("groupName")
        if isinstance(name, str) and name:
            out[f"{RAY_WORKER}/{name}"] = template_images(_dict(_dict(group).get("template")))
    return out


def _kubeflow_replica(labels: Mapping[str, str]) -> str | None:
    value = labels.get(LABEL_REPLICA_TYPE)
    return value.lower() if value else None


def _ray_replica(labels: Mapping[str, str]) -> str | None:
    node_type = labels.get(LABEL_RAY_NODE_TYPE)
    if node_type == RAY_HEAD:
        return RAY_HEAD
    group = labels.get(LABEL_RAY_GROUP)
    if node_type == RAY_WORKER and group:
        return f"{RAY_WORKER}/{group}"
    return None


@dataclass(frozen=True, slots=True)
class JobKind:
    """One training-operator kind: its store :class:`Kind`, ``api_version``, the framework
    profile its pods follow, and how to read templates and replicas."""

    kind: Kind
    api_version: str
    framework: str
    templates: Callable[[Mapping[str, Any]], dict[str, Images]]
    """Job JSON → replica key → template images (missing or malformed parts read as absent)."""
    replica: Callable[[Mapping[str, str]], str | None]
    """Pod labels → replica key, or None when the labels name none."""
    roles: Mapping[str, str]
    """Replica key (or its part before ``/``) → role in the framework profile."""

    def role(self, replica: str) -> str | None:
        """The profile role of a replica key, or None when the profile has none for it."""
        return self.roles.get(replica.split("/", 1)[0])


JOB_KINDS: Final[Mapping[str, JobKind]] = {
    j.kind.value: j
    for j in (
        JobKind(
            kind=Kind.PYTORCHJOB,
            api_version="kubeflow.org/v1",
            framework="pytorch",
            templates=_replica_specs("pytorchReplicaSpecs"),
            replica=_kubeflow_replica,
            roles={"master": "master", "worker": "worker"},
        ),
        JobKind(
            kind=Kind.MPIJOB,
            api_version="kubeflow.org/v1",
            framework="mpi",
            templates=_replica_specs("mpiReplicaSpecs"),
            replica=_kubeflow_replica,
            roles={"launcher": "coordinator", "worker": "worker"},
        ),
        JobKind(
            kind=Kind.RAYCLUSTER,
            api_version="ray.io/v1",
            framework="ray",
            templates=_ray_templates,
            replica=_ray_replica,
            roles={RAY_HEAD: "head", RAY_WORKER: "worker"},
        ),
    )
}
"""The job kinds the rollout controller serves, by Kubernetes kind name."""


def job_revision_images(templates: Mapping[str, Images]) -> tuple[tuple[str, str], ...]:
    """Every (``<replica>/<container>``, image) of a job's templates, for
    :func:`extender.rollout.plan.revision_of`: an edit of any template is a new revision."""
    return tuple(
        (f"{replica}/{container}", image)
        for replica, images in sorted(templates.items())
        for container, image in images
    )
