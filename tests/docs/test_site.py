"""The documentation site (``mkdocs.yml``, ``docs/``) builds with ``mkdocs build --strict``, the
real mkdocs-material build the site is published with: a broken link or anchor, or a page left out
of the nav, fails it (and so the test command); and every alert's runbook section exists in the
built operations page, under the anchor its ``runbook_url`` names."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "manifests" / "alerts" / "rules.yaml"


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``project`` (a directory holding mkdocs.yml) into ``site``."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's notice, not a warning of ours
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = build(ROOT, out)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_the_site_builds_strictly_with_every_nav_page(site: Path) -> None:
    assert (site / "index.html").exists()
    for page in ("reference/settings", "reference/crds", "reference/annotations", "reference/metrics"):
        assert (site / page / "index.html").exists(), page
    assert (site / "img" / "demo-gpu-timeline.png").exists()


def _copy(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", project / "docs")
    return project


def test_a_broken_link_a_broken_anchor_and_a_page_left_out_of_the_nav_fail_the_build(tmp_path: Path) -> None:
    """Each is a warning, which ``--strict`` turns into a failed build; all three are reported."""
    project = _copy(tmp_path)
    with (project / "docs" / "limits.md").open("a") as page:
        page.write("\n[a page](no-such-page.md) and [a section](operations.md#no-such-section)\n")
    (project / "docs" / "orphan.md").write_text("# Orphan\n")
    result = build(project, tmp_path / "site")
    assert result.returncode != 0
    output = result.stdout + result.stderr
    for complaint in ("'no-such-page.md'", "'#no-such-section'", "orphan.md"):
        assert complaint in output, complaint


class _Headings(HTMLParser):
    """``id`` → text of every ``h2``–``h4`` of a page (the permalink's ``¶`` left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, str] = {}
        self._open: str | None = None
        self._text: list[str] = []
        self._in_link = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("h2", "h3", "h4"):
            self._open, self._text = dict(attrs).get("id") or "", []
        elif tag == "a" and self._open is not None:
            self._in_link = "headerlink" in (dict(attrs).get("class") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._in_link = False
        elif tag in ("h2", "h3", "h4") and self._open is not None:
            self.found[self._open] = "".join(self._text).strip()
            self._open = None

    def handle_data(self, data: str) -> None:
        if self._open is not None and not self._in_link:
            self._text.append(data)


def test_every_alert_has_a_runbook_section_where_its_url_points(site: Path) -> None:
    parser = _Headings()
    parser.feed((site / "operations" / "index.html").read_text())
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert rules
    for rule in rules:
        url = rule["annotations"]["runbook_url"]
        page, _, anchor = url.removeprefix("https://flexlease.github.io/flexlease/").partition("#")
        assert page == "operations/", url
        assert parser.found.get(anchor) == rule["alert"], (rule["alert"], anchor)
