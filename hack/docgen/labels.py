"""The labels and annotations reference (``docs/reference/annotations.md``) from
``flexlease/api/keys.py``.

Every ``LABEL_*`` and ``ANN_*`` constant whose value is a ``flexlease.io/`` key, with the
docstring that follows it, grouped under the comment that heads its block in the module (``#
Pod labels``, ``# Pod annotations``…). The module is read as source (docstrings of constants do
not exist at run time) and its values are taken from the imported module, so a key is shown as
the code spells it. :func:`missing_descriptions` names the keys without a docstring. Pure.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from hack.docgen.text import GENERATED, cell, code, table

SOURCE: Final = "flexlease/api/keys.py"
KINDS: Final[Mapping[str, str]] = {"LABEL_": "label", "ANN_": "annotation"}
_REMARK: Final = re.compile(r"\s*[(;].*$")
"""A section comment's remark (from its first parenthesis or semicolon), left out of its heading."""


@dataclass(frozen=True)
class Key:
    """A key: its ``value`` (``flexlease.io/owner``), the ``constant`` naming it, ``kind``
    (label or annotation), the ``section`` it is declared in, its ``description``."""

    value: str
    constant: str
    kind: str
    section: str
    description: str


def _sections(lines: list[str]) -> list[tuple[int, str]]:
    """(line number, title) of each block comment at column 0: its first line, without the
    ``#`` and a trailing period (a comment's continuation lines are not titles)."""
    out: list[tuple[int, str]] = []
    previous_comment = False
    for number, line in enumerate(lines, start=1):
        is_comment = line.startswith("# ")
        if is_comment and not previous_comment:
            out.append((number, line[2:].strip().rstrip(".")))
        previous_comment = is_comment
    return out


def parse(source: str, values: Mapping[str, object]) -> list[Key]:
    """The keys declared in ``source`` (keys.py's text), in order; ``values``: the module's
    namespace, for the constants' values."""
    tree = ast.parse(source)
    sections = _sections(source.splitlines())
    out: list[Key] = []
    body = tree.body
    for i, node in enumerate(body):
        target: ast.expr | None = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if not isinstance(target, ast.Name):
            continue
        kind = next((k for prefix, k in KINDS.items() if target.id.startswith(prefix)), None)
        value = values.get(target.id)
        if kind is None or not isinstance(value, str) or "/" not in value:
            continue
        doc = ""
        following = body[i + 1] if i + 1 < len(body) else None
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            doc = following.value.value
        section = next((title for line, title in reversed(sections) if line < node.lineno), "")
        out.append(Key(value, target.id, kind, section, doc))
    return out


def missing_descriptions(keys: list[Key]) -> list[str]:
    """The constants without a docstring."""
    return [k.constant for k in keys if not k.description.strip()]


INTRO: Final = """\
# Labels and annotations

Everything flexlease reads from or writes to objects other than its own custom resources
([CRDs](crds.md)) is a label or an annotation under `flexlease.io/`. Labels are what you put on
your pods (and nodes) so that flexlease knows them; most annotations are written by flexlease
itself and are its record (which GPUs a pod holds, how a restart went). Each key is a constant in
`flexlease/api/keys.py`.
"""


def render(keys: list[Key]) -> str:
    """The whole page, one table per section in the module's order."""
    out = [GENERATED.format(source=SOURCE), "", INTRO]
    sections: dict[str, list[Key]] = {}
    for key in keys:
        sections.setdefault(key.section, []).append(key)
    for title, members in sections.items():
        heading = _REMARK.sub("", title) or "Other keys"
        out += ["", f"## {heading}", ""]
        rows = [(code(k.value), k.kind, cell(k.description), code(f"keys.{k.constant}")) for k in members]
        out += [table(("key", "kind", "meaning", "constant"), rows), ""]
    return "\n".join(out).rstrip("\n") + "\n"
