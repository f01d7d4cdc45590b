"""The extender started with exactly what the manifests give its pod — the generated ConfigMap,
the container's args, the TLS Secret from ``hack/make-certs.sh``, in-cluster ServiceAccount
credentials — against the stand-in API server, in private mount and network namespaces
(``tests/manifests/incluster.py``). It must become ready, answer kube-scheduler's filter over
HTTPS to the scheduler's certificate and to no other caller, win its leader Lease, and call
the API only within its RBAC grants."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import yaml

from hack.api_calls import Grant
from tests.manifests.render import ROOT, base, configmap_file, mount_path, pod_spec
from tests.manifests.test_rbac import ACCOUNTS, granted


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    assert os.geteuid() == 0, "runs as root (mount and network namespaces), as hack/test.sh does"
    work = tmp_path_factory.mktemp("incluster")
    for pki in ("certs", "other-certs"):
        made = subprocess.run(
            ["bash", str(ROOT / "hack" / "make-certs.sh"), str(work / pki)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert made.returncode == 0, made.stderr
    objs = base()
    spec = pod_spec(objs, "Deployment", "flexlease-extender")
    (container,) = spec["containers"]
    key, text = configmap_file(objs, spec, "config")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    pod = {
        "args": container["args"],
        "config_mount": str(mount_path(container, "config")),
        "config_key": key,
        "config_text": text,
        "tls_mount": str(mount_path(container, "tls")),
        "port": ports["https"],
        "metrics_port": ports["metrics"],
    }
    (work / "pod.json").write_text(json.dumps(pod))
    done = subprocess.run(
        ["unshare", "--mount", "--net", "--uts", "--propagation", "private", "--",
         sys.executable, "-m", "tests.manifests.incluster", str(work)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["config"] = yaml.safe_load(text)
    return result


def test_the_extender_becomes_ready_with_the_generated_configuration(run: dict[str, Any]) -> None:
    assert run["ready"], run["stderr_tail"]


def test_it_answers_kube_scheduler_over_https(run: dict[str, Any]) -> None:
    assert run["filter_status"] == 200
    assert run["filter"]["NodeNames"] == ["gpu-1"]
    assert set(run["filter"]["FailedAndUnresolvableNodes"]) == {"cpu-1"}  # no GPUNode there


def test_only_the_scheduler_certificate_gets_in(run: dict[str, Any]) -> None:
    """Mutual TLS: no client certificate, or one from another CA, fails the handshake."""
    assert run["config"]["extender"]["tls_client_ca_file"]
    assert str(run["anonymous"]).startswith("refused"), run["anonymous"]
    assert str(run["other_ca"]).startswith("refused"), run["other_ca"]


def test_it_leads_with_its_pod_name_and_stops_cleanly(run: dict[str, Any]) -> None:
    assert run["lease_holder"] == "flexlease-extender-7d9f8-abcde"
    assert run["rc"] == 0, run["stderr_tail"]


def test_its_api_calls_stay_within_its_rbac(run: dict[str, Any]) -> None:
    assert run["unauthorized"] == 0
    made = {Grant(*call) for call in run["calls"]}
    assert Grant("coordination.k8s.io", "leases", "create") in made
    assert made <= set(granted(base(), ACCOUNTS["extender"]))
