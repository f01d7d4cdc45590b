"""Write the generated reference pages of the documentation site (``docs/reference/``).

    python hack/gen_docs.py            # write settings.md, crds.md, annotations.md, metrics.md
    python hack/gen_docs.py --check    # write nothing; exit 1 if a page is stale or a
                                       # setting, CRD field or key has no description

Run it after changing ``flexlease/config.py``, a CRD model (after ``hack/gen_crds.py``),
``flexlease/api/keys.py`` or a metric definition; ``tests/hack/test_gen_docs.py`` fails while a
page differs from what this writes. The pages are rendered by :mod:`hack.docgen`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an installed copy

from flexlease import config
from flexlease.api import keys
from hack.docgen import crds, labels, metrics, settings

ROOT: Final = Path(__file__).resolve().parent.parent
REFERENCE: Final = Path("docs") / "reference"
CRD_DIR: Final = Path("manifests") / "base" / "crds"
KEYS: Final = Path("flexlease") / "api" / "keys.py"


def _crds(root: Path) -> list[crds.Crd]:
    docs = [yaml.safe_load(p.read_text(encoding="utf-8")) for p in sorted((root / CRD_DIR).glob("*.yaml"))]
    return crds.load(docs)


def _keys(root: Path) -> list[labels.Key]:
    return labels.parse((root / KEYS).read_text(encoding="utf-8"), vars(keys))


def pages(root: Path = ROOT) -> dict[Path, str]:
    """Page path (relative to ``root``) → its Markdown. Raises :class:`metrics.Unresolved`
    when a metric definition cannot be read."""
    return {
        REFERENCE / "settings.md": settings.render(config.Settings),
        REFERENCE / "crds.md": crds.render(_crds(root)),
        REFERENCE / "annotations.md": labels.render(_keys(root)),
        REFERENCE / "metrics.md": metrics.render(metrics.collect(root)),
    }


def missing_descriptions(root: Path = ROOT) -> list[str]:
    """Everything documented that has no description: settings, CRD fields, keys."""
    return [
        *(f"setting {s}" for s in settings.missing_descriptions(config.Settings)),
        *(f"CRD field {f}" for f in crds.missing_descriptions(_crds(root))),
        *(f"key {k}" for k in labels.missing_descriptions(_keys(root))),
    ]


def stale(root: Path = ROOT) -> list[Path]:
    """The pages whose file differs from what :func:`pages` renders (or is missing)."""
    out: list[Path] = []
    for path, text in pages(root).items():
        file = root / path
        if not file.exists() or file.read_text(encoding="utf-8") != text:
            out.append(path)
    return out


def main(argv: Sequence[str] | None = None, *, root: Path = ROOT) -> int:
    """Write (or with ``--check`` only compare) the pages; 1 when a description is missing or,
    with ``--check``, a page is stale; 0 otherwise."""
    parser = argparse.ArgumentParser(prog="gen_docs.py", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when a page is stale")
    args = parser.parse_args(argv)
    status = 0
    for item in missing_descriptions(root):
        print(f"gen_docs: no description: {item}", file=sys.stderr)
        status = 1
    if args.check:
        for path in stale(root):
            print(f"gen_docs: {path} is stale: run python hack/gen_docs.py", file=sys.stderr)
            status = 1
        return status
    for path, text in pages(root).items():
        file = root / path
        file.parent.mkdir(parents=True, exist_ok=True)
        if not file.exists() or file.read_text(encoding="utf-8") != text:
            file.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
