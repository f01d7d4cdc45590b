"""Dockerfile.extender and Dockerfile.agent, read as buildah reads them: multi-stage, the final
stage only copies the built virtualenv (no package manager or compiler runs there), the
extender runs unprivileged, and each entrypoint is the console script the manifests run.
(The images themselves are built by ``hack/build-images.sh``: minutes, so not in the suite.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.manifests.render import ROOT, base, pod_spec

IMAGES = {"extender": ("Deployment", "flexlease-extender"), "agent": ("DaemonSet", "flexlease-agent")}


def stages(dockerfile: Path) -> list[list[tuple[str, str]]]:
    """The instructions of each ``FROM`` stage, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out: list[list[tuple[str, str]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        if op.upper() == "FROM":
            out.append([])
        if out:
            out[-1].append((op.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_the_final_stage_only_copies_the_build(name: str) -> None:
    build, final = stages(ROOT / f"Dockerfile.{name}")
    assert build[0][1].endswith(" AS build")
    assert any(op == "RUN" and "pip" in arg and "--no-index" in arg for op, arg in build)
    assert not [arg for op, arg in final if op in {"RUN", "ADD"}], "nothing runs in the final stage"
    assert ("COPY", "--from=build /opt/flexlease /opt/flexlease") in final


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_the_entrypoint_is_the_console_script(name: str) -> None:
    *_, final = stages(ROOT / f"Dockerfile.{name}")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    (entry,) = [arg for op, arg in final if op == "ENTRYPOINT"]
    assert entry == f'["flexlease-{name}"]'
    assert f"flexlease-{name}" in scripts


def test_the_extender_runs_unprivileged_and_the_manifests_agree() -> None:
    *_, final = stages(ROOT / "Dockerfile.extender")
    (user,) = [arg for op, arg in final if op == "USER"]
    uid = int(user.split(":")[0])
    assert uid != 0
    spec = pod_spec(base(), *IMAGES["extender"])
    assert spec["securityContext"]["runAsUser"] == uid
    (container,) = spec["containers"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_the_extender_runs_numpy_without_a_blas_thread_pool() -> None:
    """extender.fitarrays does element-wise work only: OpenBLAS's worker threads would only
    spin on the pod's CPU quota."""
    *_, final = stages(ROOT / "Dockerfile.extender")
    assert ("ENV", "OPENBLAS_NUM_THREADS=1") in final
