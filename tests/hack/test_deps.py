"""hack/lib/deps.sh and the extras in pyproject.toml: the demo installs flexlease with its
``demo`` extra only (not the test toolchain), that extra plus the core dependencies cover every
third-party module the demo and the processes it starts import, and the ``test`` extra takes in
``demo`` and ``sim``."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
FIRST_PARTY = {"flexlease", "extender", "nodeagent", "standins", "hack"}
# What the demo runs: its driver, and the extender and agents it starts as processes.
DEMO_ENTRY_POINTS = ("hack.demo", "extender.main", "nodeagent.main")


def run_deps(function: str, tmp_path: Path) -> tuple[list[str], list[str]]:
    """Run a deps.sh function with ``PYTHON`` and ``apt-get`` replaced by recorders; returns
    (python command lines, apt-get command lines)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("python", "apt-get"):
        recorder = bin_dir / name
        recorder.write_text(f'#!/bin/sh\necho "$*" >> "{tmp_path / name}.calls"\n')
        recorder.chmod(0o755)
    env = {**os.environ, "PYTHON": str(bin_dir / "python"), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run(
        ["bash", "-c", f". hack/lib/deps.sh && {function}"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )

    def calls(name: str) -> list[str]:
        path = tmp_path / f"{name}.calls"
        return path.read_text().splitlines() if path.exists() else []

    return calls("python"), calls("apt-get")


def test_the_demo_installs_its_extra_only(tmp_path: Path) -> None:
    python, apt = run_deps("install_demo_deps", tmp_path)
    assert python == ["-m pip install -q --disable-pip-version-check -e .[demo]"]
    assert apt == []  # its system tools come with hack/containerd-testbed.sh


def test_the_tests_install_the_test_extra(tmp_path: Path) -> None:
    python, _ = run_deps("install_test_deps", tmp_path)
    assert python == ["-m pip install -q --disable-pip-version-check -e .[test]"]


def test_apt_installs_only_what_is_missing(tmp_path: Path) -> None:
    _, apt = run_deps(
        "apt_install_missing sh:dash flexlease-no-such-tool:pkg-a /no/such/path:pkg-b", tmp_path
    )
    if os.geteuid() == 0:
        assert apt == ["update -qq", "install -y -qq --no-install-recommends pkg-a pkg-b"]
    else:
        assert apt == []  # apt-get runs only as root


def test_the_scripts_call_their_own_installer() -> None:
    local_up = (ROOT / "hack" / "local-up.sh").read_text()
    test_sh = (ROOT / "hack" / "test.sh").read_text()
    assert re.search(r"^install_demo_deps$", local_up, re.MULTILINE) and "install_test_deps" not in local_up
    assert re.search(r"^install_test_deps$", test_sh, re.MULTILINE)


def third_party_imports(roots: tuple[str, ...]) -> dict[str, str]:
    """Top-level third-party module → the first first-party module that imports it, over
    every module reachable from ``roots`` by import statements (in functions too)."""
    seen: set[str] = set()
    found: dict[str, str] = {}
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        spec = importlib.util.find_spec(module)
        if spec is None or not (spec.origin or "").endswith(".py"):
            continue
        assert spec.origin is not None
        package = module if spec.origin.endswith("__init__.py") else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(Path(spec.origin).read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                parts = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                base = ".".join([*parts, node.module] if node.module else parts)
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            for name in names:
                top = name.split(".")[0]
                if top in FIRST_PARTY:
                    try:
                        if importlib.util.find_spec(name) is not None:
                            todo.append(name)
                    except (ImportError, AttributeError, ValueError):
                        pass  # ``from package import function``: not a module
                elif top not in sys.stdlib_module_names and top != "__future__":
                    found.setdefault(top, module)
    return found


def test_the_demo_extra_and_the_core_cover_what_the_demo_imports() -> None:
    declared = {canonicalize_name(Requirement(r).name) for r in PROJECT["dependencies"]}
    declared |= {canonicalize_name(Requirement(r).name) for r in PROJECT["optional-dependencies"]["demo"]}
    providers = importlib.metadata.packages_distributions()
    missing = {
        module: importer
        for module, importer in third_party_imports(DEMO_ENTRY_POINTS).items()
        if not {canonicalize_name(d) for d in providers.get(module, [module])} & declared
    }
    assert missing == {}, "imported by the demo, in neither the core dependencies nor the demo extra"


def test_the_test_extra_takes_in_the_demo_and_the_simulator() -> None:
    (own,) = [
        Requirement(r) for r in PROJECT["optional-dependencies"]["test"] if r.startswith(PROJECT["name"])
    ]
    assert own.extras == {"demo", "sim"}
