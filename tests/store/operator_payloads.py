"""Real-shaped JSON of other operators' custom resources, for the store contract and the
rollout tests: a PyTorchJob and an MPIJob (kubeflow.org/v1, kubeflow/training-operator
``pkg/apis/kubeflow.org/v1``: ``spec.pytorchReplicaSpecs`` / ``spec.mpiReplicaSpecs``, maps of
replica type → ``{replicas, restartPolicy, template}``), a RayCluster (ray.io/v1,
ray-project/kuberay ``ray-operator/apis/ray/v1``: ``spec.headGroupSpec.template``,
``spec.workerGroupSpecs[] {groupName, replicas, minReplicas, maxReplicas, template}``), and
their pods as those operators create them: owned (controller) by the job, labelled with
``training.kubeflow.org/{job-name,replica-type,replica-index}`` (replica type lower-cased)
or ``ray.io/{cluster,node-type,group}`` (``headgroup`` for the head)."""

from __future__ import annotations

from typing import Any

JsonObj = dict[str, Any]


def _template(container: str, image: str, *, labels: dict[str, str] | None = None) -> JsonObj:
    return {
        "metadata": {"labels": labels or {}},
        "spec": {
            "containers": [
                {
                    "name": container,
                    "image": image,
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ]
        },
    }


def pytorchjob(
    name: str, namespace: str, *, image: str, workers: int = 2, labels: dict[str, str] | None = None
) -> JsonObj:
    """A PyTorchJob with one Master and ``workers`` Workers, container ``pytorch`` (the
    operator's default container name)."""

    def replica(count: int) -> JsonObj:
        return {"replicas": count, "restartPolicy": "OnFailure", "template": _template("pytorch", image)}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "None"},
            "nprocPerNode": "auto",
            "pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(workers)},
        },
    }


def mpijob(
    name: str, namespace: str, *, image: str, workers: int = 2, labels: dict[str, str] | None = None
) -> JsonObj:
    """An MPIJob (kubeflow.org/v1) with a Launcher and ``workers`` Workers, container ``mpi``."""

    def replica(count: int) -> JsonObj:
        return {"replicas": count, "restartPolicy": "Never", "template": _template("mpi", image)}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "MPIJob",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "slotsPerWorker": 1,
            "runPolicy": {"cleanPodPolicy": "Running"},
            "mpiReplicaSpecs": {"Launcher": replica(1), "Worker": replica(workers)},
        },
    }


def raycluster(
    name: str,
    namespace: str,
    *,
    image: str,
    groups: dict[str, int] | None = None,
    labels: dict[str, str] | None = None,
) -> JsonObj:
    """A RayCluster (ray.io/v1): a head and one worker group per ``groups`` entry (name →
    replicas), containers ``ray-head`` / ``ray-worker``."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "rayVersion": "2.41.0",
            "headGroupSpec": {
                "rayStartParams": {"dashboard-host": "0.0.0.0"},
                "template": _template("ray-head", image),
            },
            "workerGroupSpecs": [
                {
                    "groupName": group,
                    "replicas": count,
                    "minReplicas": 0,
                    "maxReplicas": count,
                    "rayStartParams": {},
                    "template": _template("ray-worker", image),
                }
                for group, count in (groups or {"gpu-group": 2}).items()
            ],
        },
    }


def job_pod(job: JsonObj, name: str, *, labels: dict[str, str], container: str, image: str) -> JsonObj:
    """A pod the job's operator created: controller owner reference to ``job``, ``labels``."""
    meta = job["metadata"]
    return {
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": job["apiVersion"],
                    "kind": job["kind"],
                    "name": meta["name"],
                    "uid": meta.get("uid", "uid-" + meta["name"]),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"nodeName": "node-a", "containers": [{"name": container, "image": image}]},
    }


def kubeflow_labels(job: str, replica_type: str, index: int) -> dict[str, str]:
    """The training-operator's pod labels (``ReplicaTypeLabel`` value lower-cased)."""
    return {
        "training.kubeflow.org/job-name": job,
        "training.kubeflow.org/replica-type": replica_type.lower(),
        "training.kubeflow.org/replica-index": str(index),
    }


def ray_labels(cluster: str, node_type: str, group: str) -> dict[str, str]:
    """KubeRay's pod labels (``ray.io/group`` is ``headgroup`` on the head)."""
    return {
        "ray.io/cluster": cluster,
        "ray.io/node-type": node_type,
        "ray.io/group": group,
        "ray.io/is-ray-node": "yes",
    }
