"""hack/gen_docs.py: the committed reference pages are what the code renders, a stale page or a
missing description fails ``--check``, and writing brings a stale page back."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pydantic_settings import BaseSettings

from hack import gen_docs

ROOT = gen_docs.ROOT


def test_the_committed_reference_pages_are_current() -> None:
    assert gen_docs.stale() == [], "run: python hack/gen_docs.py"
    assert gen_docs.missing_descriptions() == []


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of what the pages are made from (sources linked, the pages copied)."""
    for name in ("extender", "nodeagent", "flexlease", "manifests"):
        (tmp_path / name).symlink_to(ROOT / name)
    shutil.copytree(ROOT / gen_docs.REFERENCE, tmp_path / gen_docs.REFERENCE)
    return tmp_path


def test_a_stale_page_fails_the_check_and_is_written_again(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tree / gen_docs.REFERENCE / "settings.md"
    page.write_text(page.read_text().replace("FLEXLEASE_EXTENDER__PORT", "FLEXLEASE_EXTENDER_PORT"))
    assert gen_docs.main(["--check"], root=tree) == 1
    assert "docs/reference/settings.md is stale" in capsys.readouterr().err
    (tree / gen_docs.REFERENCE / "metrics.md").unlink()
    assert gen_docs.main([], root=tree) == 0
    assert "wrote docs/reference/metrics.md" in capsys.readouterr().out
    assert gen_docs.main(["--check"], root=tree) == 0


class _Bare(BaseSettings):
    undocumented: int = 1


def test_a_setting_without_a_description_fails(
    tree: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(gen_docs.config, "Settings", _Bare)
    assert gen_docs.main([], root=tree) == 1
    assert "no description: setting undocumented" in capsys.readouterr().err
