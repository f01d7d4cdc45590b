"""Dockerfile.extender and Dockerfile.agent, read as a builder reads them: public Python 3.11
slim bases by default, flexlease's wheel built from the source in a build stage and the final
stage only copying the built virtualenv (no package manager or compiler runs there), the
offline build (``hack/build-images.sh``) passing every build argument the Dockerfiles declare,
OCI labels, an unprivileged image user, each entrypoint the console script the manifests run,
and the agent's DaemonSet asking for root and nothing more.
(The images themselves are built by ``hack/build-images.sh``: minutes, so not in the suite.)"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import pytest

from flexlease.config import AgentSettings
from tests.manifests.render import ROOT, base, pod_spec

IMAGES = {"extender": ("Deployment", "flexlease-extender"), "agent": ("DaemonSet", "flexlease-agent")}
PUBLIC_BASE = "docker.io/library/python:3.11-slim-bookworm"
OCI_LABELS = ("title", "description", "version", "revision", "source", "licenses", "base.name")
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
names = pytest.mark.parametrize("name", sorted(IMAGES))

Instruction = tuple[str, str]


def instructions(dockerfile: Path) -> list[Instruction]:
    """Every instruction, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def stages(dockerfile: Path) -> list[list[Instruction]]:
    """The instructions of each ``FROM`` stage (global ``ARG``s before the first are left out)."""
    out: list[list[Instruction]] = []
    for op, rest in instructions(dockerfile):
        if op == "FROM":
            out.append([])
        if out:
            out[-1].append((op, rest))
    return out


def args(stage: list[Instruction]) -> dict[str, str | None]:
    """``ARG name[=default]`` of a stage or the global scope."""
    out: dict[str, str | None] = {}
    for op, rest in stage:
        if op == "ARG":
            name, eq, default = rest.partition("=")
            out[name] = default if eq else None
    return out


def labels(stage: list[Instruction]) -> dict[str, str]:
    out: dict[str, str] = {}
    for op, rest in stage:
        if op == "LABEL":
            out |= dict(re.findall(r'(\S+?)="([^"]*)"', rest))
    return out


@names
def test_the_default_bases_are_public_python_3_11_slim(name: str) -> None:
    everything = instructions(ROOT / f"Dockerfile.{name}")
    global_args = args(everything[: next(i for i, (op, _) in enumerate(everything) if op == "FROM")])
    assert global_args == {"PYTHON": PUBLIC_BASE, "PYTHON_BUILD": PUBLIC_BASE}
    build, final = stages(ROOT / f"Dockerfile.{name}")
    assert build[0] == ("FROM", "${PYTHON_BUILD} AS build")
    assert final[0] == ("FROM", "${PYTHON}")


@names
def test_the_build_stage_builds_flexlease_from_the_source(name: str) -> None:
    """From a clean checkout: no prebuilt wheel is copied in; pip builds flexlease (and takes
    its dependencies from PyPI, or from the offline wheels named by pip's own variables)."""
    build, _ = stages(ROOT / f"Dockerfile.{name}")
    assert args(build) == {"PIP_NO_INDEX": None, "PIP_FIND_LINKS": None}
    assert ("COPY", ". /src") in build
    (run,) = [arg for op, arg in build if op == "RUN"]
    assert "pip --python /opt/flexlease/bin/python install --no-compile /src" in run


@names
def test_the_final_stage_only_copies_the_build(name: str) -> None:
    _, final = stages(ROOT / f"Dockerfile.{name}")
    assert not [arg for op, arg in final if op in {"RUN", "ADD"}], "nothing runs in the final stage"
    assert [arg for op, arg in final if op == "COPY"] == ["--from=build /opt/flexlease /opt/flexlease"]


@names
def test_the_images_carry_oci_labels(name: str) -> None:
    _, final = stages(ROOT / f"Dockerfile.{name}")
    got = labels(final)
    assert {f"org.opencontainers.image.{k}" for k in OCI_LABELS} <= set(got)
    assert got["org.opencontainers.image.title"] == f"flexlease-{name}"
    assert got["org.opencontainers.image.version"] == "${VERSION}"
    assert args(final)["VERSION"] == PROJECT["project"]["version"]
    assert got["org.opencontainers.image.licenses"] == PROJECT["project"]["license"]["text"]
    assert got["org.opencontainers.image.base.name"] == "${PYTHON}"


@names
def test_the_offline_build_passes_every_build_argument(name: str) -> None:
    """hack/build-images.sh: its own bases, its wheels (no index), the version and commit."""
    declared = set(args(instructions(ROOT / f"Dockerfile.{name}")))
    script = (ROOT / "hack" / "build-images.sh").read_text()
    passed = dict(re.findall(r"--build-arg (\w+)=(\S+)", script))
    assert set(passed) == declared
    assert passed["PIP_NO_INDEX"] == "1"
    assert passed["PIP_FIND_LINKS"] == "/src/dist/wheels"
    assert "--network none" in script


def test_the_build_context_holds_what_pip_needs_and_no_more() -> None:
    """.dockerignore (read as builders read it: last matching pattern wins) lets in the
    packages setuptools finds, pyproject.toml, the readme it names and the offline wheels;
    tests, data and docs stay out."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def ignored(path: str) -> bool:
        verdict = False
        for pattern in patterns:
            negate = pattern.startswith("!")
            body = pattern.removeprefix("!")
            parts = path.split("/")
            prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
            if any(fnmatch.fnmatchcase(p, body) for p in prefixes) or fnmatch.fnmatchcase(path, body):
                verdict = not negate
        return verdict

    packages = [p.rstrip("*") for p in PROJECT["tool"]["setuptools"]["packages"]["find"]["include"]]
    needed = ["pyproject.toml", PROJECT["project"]["readme"], "dist/wheels/x.whl"]
    needed += [f"{p}/__init__.py" for p in packages]
    assert [p for p in needed if ignored(p)] == []
    assert all(
        ignored(p) for p in ["tests/conftest.py", "data/jobs_philly.csv", "docs/index.md", ".git/HEAD"]
    )
    assert ignored("flexlease/__pycache__/config.cpython-311.pyc")


@names
def test_the_image_user_is_unprivileged(name: str) -> None:
    _, final = stages(ROOT / f"Dockerfile.{name}")
    (user,) = [arg for op, arg in final if op == "USER"]
    assert int(user.split(":")[0]) != 0


@names
def test_the_entrypoint_is_the_console_script(name: str) -> None:
    _, final = stages(ROOT / f"Dockerfile.{name}")
    (entry,) = [arg for op, arg in final if op == "ENTRYPOINT"]
    assert entry == f'["flexlease-{name}"]'
    assert f"flexlease-{name}" in PROJECT["project"]["scripts"]


def test_the_extender_runs_as_the_image_user_and_the_manifests_agree() -> None:
    _, final = stages(ROOT / "Dockerfile.extender")
    (user,) = [arg for op, arg in final if op == "USER"]
    spec = pod_spec(base(), *IMAGES["extender"])
    assert spec["securityContext"]["runAsUser"] == int(user.split(":")[0])
    (container,) = spec["containers"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_the_agent_runs_as_root_with_no_privilege_and_only_its_host_paths() -> None:
    """The DaemonSet overrides the image's user with root, which it needs for the node's
    root-owned sockets and directories, and asks for nothing more: not privileged, every
    capability dropped, no escalation, a read-only root; its host paths are exactly the ones
    its settings name."""
    spec = pod_spec(base(), *IMAGES["agent"])
    (container,) = spec["containers"]
    ctx = container["securityContext"]
    assert (ctx["runAsUser"], ctx["runAsNonRoot"]) == (0, False)
    assert "privileged" not in ctx and ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["readOnlyRootFilesystem"] is True
    assert not spec.get("hostPID") and not spec.get("hostNetwork")
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert all(mounts[n] == p for n, p in host.items()), "host paths are mounted where they are"
    settings = AgentSettings(node_name="n")
    assert set(host.values()) == {
        str(settings.state_dir),
        settings.cri_endpoint.removeprefix("unix://"),
        str(settings.device_plugin_dir),
        str(settings.pod_resources_socket.parent),
    }


def test_the_extender_runs_numpy_without_a_blas_thread_pool() -> None:
    """extender.fitarrays does element-wise work only: OpenBLAS's worker threads would only
    spin on the pod's CPU quota."""
    _, final = stages(ROOT / "Dockerfile.extender")
    assert ("ENV", "OPENBLAS_NUM_THREADS=1") in final
