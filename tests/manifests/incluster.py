"""The extender as its pod runs it, with exactly the files the manifests give it.

Run by ``tests/manifests/test_incluster.py`` as root inside fresh mount and network namespaces
(``unshare --mount --net``), so nothing here touches the host:

    python -m tests.manifests.incluster WORK

``WORK/pod.json`` (written by the test from ``kubectl kustomize manifests/``) holds the
extender container's ``args``, the generated ConfigMap's file and mount path, and the TLS
Secret's mount path; ``WORK/certs`` is ``hack/make-certs.sh``'s output (``WORK/other-certs``
another run of it: a foreign CA). This script plays the kubelet and the cluster:

* an API server (the stand-in ``FakeApiServer``) over HTTPS with a ServiceAccount token, at
  ``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT`` as kubelet sets them;
* the pod's files: an overlay over ``/etc`` holding the ConfigMap and the Secret
  ``flexlease-extender-tls`` at their mount paths, and the projected ServiceAccount token,
  CA and namespace under ``/var/run/secrets/kubernetes.io/serviceaccount``;
* ``python -m extender.main`` with the container's args; kubelet's readiness probe on the
  container's ``metrics`` port (plain HTTP, as the probe is declared), then kube-scheduler:
  HTTPS calls with the scheduler's client certificate (Secret ``flexlease-scheduler-tls``),
  checking the extender's certificate for ``flexlease-extender.flexlease-system.svc`` against
  ``ca.crt``; then callers without a certificate and with one from a foreign CA.

It prints one JSON object: readiness, the filter answer, the leader Lease, the API calls the
extender made (group, resource, verb) and its exit status after SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from flexlease.api.resources import Availability, GPUNodeSpec, Pool
from flexlease.api.tiers import Tier
from flexlease.sim import objects
from standins.apiserver import FakeApiServer, Recorded

REPO = Path(__file__).resolve().parents[2]
TOKEN = "flexlease-extender-sa-token"
SERVICE = "flexlease-extender.flexlease-system.svc"
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
NODE = "gpu-1"
HOSTNAME = "flexlease-extender-7d9f8-abcde"


def sh(*args: str | Path) -> None:
    subprocess.run([str(a) for a in args], check=True, capture_output=True)


def api_server_pki(work: Path) -> ssl.SSLContext:
    """The API server's CA and serving certificate for 127.0.0.1 (as kubeadm's are for the
    Service IP); the CA goes into the pod as the ServiceAccount's ca.crt."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    d = work / "apiserver"
    d.mkdir()
    sh("openssl", "req", "-x509", *ec, "-keyout", d / "ca.key", "-out", d / "ca.crt", "-days", "1",
       "-subj", "/CN=kubernetes-ca")  # fmt: skip
    sh("openssl", "req", *ec, "-keyout", d / "tls.key", "-out", d / "tls.csr", "-subj", "/CN=kube-apiserver")
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    sh("openssl", "x509", "-req", "-in", d / "tls.csr", "-CA", d / "ca.crt", "-CAkey", d / "ca.key",
       "-CAcreateserial", "-days", "1", "-out", d / "tls.crt", "-extfile", d / "ext")  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(d / "tls.crt", d / "tls.key")
    return context


def overlay(target: Path, work: Path) -> None:
    """A writable overlay over ``target``, seen only in this mount namespace."""
    upper, scratch = work / f"{target.name}-upper", work / f"{target.name}-work"
    upper.mkdir()
    scratch.mkdir()
    sh(
        "mount",
        "-t",
        "overlay",
        "overlay",
        "-o",
        f"lowerdir={target},upperdir={upper},workdir={scratch}",
        target,
    )


def install_pod_files(pod: dict[str, Any], work: Path, api_port: int) -> None:
    overlay(Path("/etc"), work)
    config_dir = Path(pod["config_mount"])
    config_dir.mkdir(parents=True)
    (config_dir / pod["config_key"]).write_text(pod["config_text"])
    tls_dir = Path(pod["tls_mount"])
    tls_dir.mkdir(parents=True)
    for name in ("tls.crt", "tls.key", "ca.crt"):
        shutil.copy(work / "certs" / "extender" / name, tls_dir / name)
    run = Path("/run")
    overlay(run, work)
    SA_DIR.mkdir(parents=True, exist_ok=True)
    (SA_DIR / "token").write_text(TOKEN)
    (SA_DIR / "namespace").write_text("flexlease-system")
    shutil.copy(work / "apiserver" / "ca.crt", SA_DIR / "ca.crt")
    del api_port


def scheduler_tls(work: Path, pki: str = "certs") -> ssl.SSLContext:
    """kube-scheduler's side of the extender stanza's tlsConfig (trusting the real CA, with the
    client certificate of ``pki``)."""
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cafile=work / "certs" / "scheduler" / "ca.crt"
    )
    client = work / pki / "scheduler"
    context.load_cert_chain(client / "tls.crt", client / "tls.key")
    return context


def api_call(r: Recorded) -> tuple[str, str, str]:
    """(group, resource[/subresource], verb) of one request, as kube-apiserver's RequestInfo."""
    parts = r.path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        group, rest = parts[1], parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    verb = {
        "GET": "watch" if r.query.get("watch") in {"1", "true"} else ("get" if named else "list"),
        "POST": "create",
        "PATCH": "patch",
        "PUT": "update",
        "DELETE": "delete",
    }[r.method]
    return group, resource, verb


def gpu_pod() -> dict[str, Any]:
    pod = objects.pod("trainer-0", "team-a", gpus=1, priority="low", owner="trainer")
    pod["metadata"]["uid"] = "0b6f-trainer-0"
    pod["spec"]["schedulerName"] = "flexlease-scheduler"
    return pod


async def wait_ready(session: aiohttp.ClientSession, url: str, proc: asyncio.subprocess.Process) -> bool:
    for _ in range(600):
        if proc.returncode is not None:
            return False
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with session.get(f"{url}/readyz") as resp:
                if resp.status == 200:
                    return True
        await asyncio.sleep(0.1)
    return False


async def main(work: Path) -> dict[str, Any]:
    pod = json.loads((work / "pod.json").read_text())
    sh("ip", "link", "set", "lo", "up")
    result: dict[str, Any] = {}
    async with FakeApiServer(token=TOKEN, ssl_context=api_server_pki(work), bookmark_interval=0.2) as api:
        port = int(api.url.rsplit(":", 1)[1])
        now = datetime.now(UTC)
        avail = Availability(window_seconds=86400, observed_seconds=86400, unavailable_seconds=0, ratio=1.0)
        devices = {
            str(i): objects.device_status(
                NODE, i, healthy=True, tier=Tier.HA, availability=avail, computed_at=now
            )
            for i in range(2)
        }
        api.put(objects.gpunode(NODE, pool=Pool.GENERAL) | {
            "status": objects.gpunode_status("10.0.0.1", devices, spec=GPUNodeSpec(pool=Pool.GENERAL))
        })  # fmt: skip
        install_pod_files(pod, work, port)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": "/tmp",
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(port),
            "HOSTNAME": HOSTNAME,
        }
        sh("hostname", HOSTNAME)  # the pod name, the extender's leader-election identity
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "extender.main", *pod["args"],
            cwd=REPO, env=env, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        url = f"https://127.0.0.1:{pod['port']}"
        try:
            connector = aiohttp.TCPConnector(ssl=scheduler_tls(work))
            async with aiohttp.ClientSession(connector=connector) as session:
                probe = f"http://127.0.0.1:{pod['metrics_port']}"  # kubelet: httpGet, no TLS
                result["ready"] = await wait_ready(session, probe, proc)
                if result["ready"]:
                    args = {"Pod": gpu_pod(), "Nodes": None, "NodeNames": [NODE, "cpu-1"]}
                    async with session.post(f"{url}/filter", json=args, server_hostname=SERVICE) as resp:
                        result["filter_status"] = resp.status
                        result["filter"] = await resp.json()
            # Callers without the scheduler's certificate (trusting the server's CA), and with a
            # certificate from a foreign CA.
            plain = ssl.create_default_context(cafile=work / "certs" / "scheduler" / "ca.crt")
            for who, context in (("anonymous", plain), ("other_ca", scheduler_tls(work, "other-certs"))):
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
                    try:
                        async with session.post(f"{url}/filter", json={}, server_hostname=SERVICE) as resp:
                            result[who] = resp.status
                    except (aiohttp.ClientError, OSError) as exc:
                        result[who] = f"refused: {type(exc).__name__}"
            for _ in range(100):
                lease = api.lookup("Lease", "flexlease-extender", "flexlease-system")
                if lease is not None:
                    result["lease_holder"] = lease["spec"].get("holderIdentity")
                    break
                await asyncio.sleep(0.1)
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            try:
                _, err = await asyncio.wait_for(proc.communicate(), timeout=30)
            except TimeoutError:
                proc.kill()
                _, err = await proc.communicate()
            result["rc"] = proc.returncode
            result["stderr_tail"] = err.decode(errors="replace")[-3000:]
        result["calls"] = sorted({api_call(r) for r in api.requests})
        result["unauthorized"] = sum(
            1 for r in api.requests if r.headers.get("Authorization") != f"Bearer {TOKEN}"
        )
    return result


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1])))))
