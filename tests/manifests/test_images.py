"""The manifests take their images from one kustomize ``images:`` list (in
``manifests/base/kustomization.yaml``): the workloads name each image without a tag, the list
gives the version (flexlease's own = the project's), and an overlay of one's own moves the
images to another registry with an ``images:`` entry of its own and changes nothing else."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.manifests.render import MANIFESTS, OVERLAYS, ROOT, Obj, render

BASE = MANIFESTS / "base"
FLEXLEASE_IMAGES = ("ghcr.io/flexlease/extender", "ghcr.io/flexlease/agent")


def containers(objs: tuple[Obj, ...] | list[Obj]) -> Iterator[tuple[str, Obj]]:
    """(``<kind>/<name>``, container) for every container of every workload."""
    for obj in objs:
        pod = obj.get("spec", {}).get("template", {}).get("spec")
        if isinstance(pod, dict):
            for c in pod.get("containers", []) + pod.get("initContainers", []):
                yield f"{obj['kind']}/{obj['metadata']['name']}", c


def images_list() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    entries: list[dict[str, Any]] = kustomization["images"]
    return entries


def test_the_workload_files_name_images_without_a_tag() -> None:
    """The version lives in one place: a tag in a workload file would win over nobody's
    intent (kustomize replaces it) and drift from the list."""
    named = {e["name"] for e in images_list()}
    files = [p for p in BASE.rglob("*.yaml") if p.name != "kustomization.yaml"]
    raw = [d for p in files for d in yaml.safe_load_all(p.read_text()) if isinstance(d, dict)]
    found = {where: c["image"] for where, c in containers(raw)}
    assert found, "no workload found"
    for where, image in found.items():
        assert ":" not in image.rsplit("/", 1)[-1] and "@" not in image, f"{where}: {image} carries a tag"
        assert image in named, f"{where}: {image} has no entry in base/kustomization.yaml images"
    assert named == set(found.values()), "an images entry no workload uses"


def test_flexlease_images_are_tagged_with_the_project_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    tags = {e["name"]: e.get("newTag") for e in images_list()}
    assert {name: tags[name] for name in FLEXLEASE_IMAGES} == dict.fromkeys(FLEXLEASE_IMAGES, version)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_every_overlay_runs_the_listed_images(overlay: str) -> None:
    listed = {f"{e['name']}:{e['newTag']}" for e in images_list()}
    assert {c["image"] for _, c in containers(render(OVERLAYS[overlay]))} == listed


def test_an_overlay_points_the_images_at_ones_own_registry(tmp_path: Path) -> None:
    """What docs/getting-started/images.md tells an operator to write (or
    ``kustomize edit set image`` writes): one entry per image, the name as the base renders it."""
    entries = [
        {"name": name, "newName": name.replace("ghcr.io/", "registry.example.com/"), "newTag": "0.1.0-rc1"}
        for name in FLEXLEASE_IMAGES
    ]
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": [os.path.relpath(BASE, tmp_path)], "images": entries})
    )
    ours, theirs = render(tmp_path), render(BASE)
    images = {where: c["image"] for where, c in containers(ours)}
    assert images == {
        "Deployment/flexlease-extender": "registry.example.com/flexlease/extender:0.1.0-rc1",
        "DaemonSet/flexlease-agent": "registry.example.com/flexlease/agent:0.1.0-rc1",
        "Deployment/flexlease-scheduler": next(
            c["image"] for where, c in containers(theirs) if where == "Deployment/flexlease-scheduler"
        ),
    }

    def without_images(objs: tuple[Obj, ...]) -> str:
        text = yaml.safe_dump(list(objs))
        return "\n".join(line for line in text.splitlines() if "image:" not in line)

    assert without_images(ours) == without_images(theirs)
