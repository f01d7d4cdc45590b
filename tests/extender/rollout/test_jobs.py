"""Reading training-operator jobs (:mod:`extender.rollout.jobs`): templates from each kind's
real schema, pods to templates by the operators' labels, malformed input read as absent."""

from __future__ import annotations

from extender.orchestrator import profile
from extender.rollout.jobs import JOB_KINDS, job_revision_images
from flexlease.store.base import Kind
from tests.store import operator_payloads as ops


def test_pytorchjob_and_mpijob_templates_by_lower_cased_replica_type() -> None:
    pt = JOB_KINDS["PyTorchJob"]
    assert pt.kind is Kind.PYTORCHJOB
    assert pt.templates(ops.pytorchjob("j", "ns", image="reg/pt:v1")) == {
        "master": (("pytorch", "reg/pt:v1"),),
        "worker": (("pytorch", "reg/pt:v1"),),
    }
    assert pt.replica(ops.kubeflow_labels("j", "Worker", 1)) == "worker"
    assert (pt.role("master"), pt.role("worker")) == ("master", "worker")
    mpi = JOB_KINDS["MPIJob"]
    assert set(mpi.templates(ops.mpijob("j", "ns", image="reg/mpi:v1"))) == {"launcher", "worker"}
    assert mpi.replica(ops.kubeflow_labels("j", "Launcher", 0)) == "launcher"
    assert mpi.role("launcher") == "coordinator"  # the mpi profile's mpirun role


def test_raycluster_templates_by_node_type_and_group() -> None:
    ray = JOB_KINDS["RayCluster"]
    obj = ops.raycluster("rc", "ns", image="reg/ray:v1", groups={"gpu": 2, "cpu": 1})
    assert ray.templates(obj) == {
        "head": (("ray-head", "reg/ray:v1"),),
        "worker/gpu": (("ray-worker", "reg/ray:v1"),),
        "worker/cpu": (("ray-worker", "reg/ray:v1"),),
    }
    assert ray.replica(ops.ray_labels("rc", "head", "headgroup")) == "head"
    assert ray.replica(ops.ray_labels("rc", "worker", "gpu")) == "worker/gpu"
    assert ray.replica({"ray.io/node-type": "worker"}) is None  # no group
    assert ray.replica({}) is None
    assert (ray.role("head"), ray.role("worker/gpu"), ray.role("other")) == ("head", "worker", None)


def test_malformed_jobs_read_as_having_no_templates() -> None:
    for kind in JOB_KINDS.values():
        assert kind.templates({}) == {}
        assert kind.templates({"spec": "x"}) == {}
    assert JOB_KINDS["PyTorchJob"].templates({"spec": {"pytorchReplicaSpecs": {"Worker": None}}}) == {
        "worker": ()
    }
    ray = {"spec": {"workerGroupSpecs": [{"groupName": ""}, "x", {"groupName": "g", "template": 3}]}}
    assert JOB_KINDS["RayCluster"].templates(ray) == {"worker/g": ()}


def test_an_edit_of_any_template_is_a_new_revision() -> None:
    base = {"master": (("pytorch", "a:1"),), "worker": (("pytorch", "a:1"),)}
    edited = {**base, "worker": (("pytorch", "a:2"),)}
    assert job_revision_images(base) != job_revision_images(edited)
    assert job_revision_images(base) == job_revision_images(dict(reversed(list(base.items()))))


def test_profiles_say_which_jobs_restart_together() -> None:
    shipped = profile.builtin()
    assert {name: p.restart_together for name, p in shipped.items()} == {
        "mpi": True,
        "pytorch": True,
        "ray": False,
        "tensorflow": True,
    }
    text = shipped["ray"].model_dump_json(by_alias=True)
    assert '"restartTogether":false' in text
