"""hack/docgen/labels.py: every flexlease.io/ label and annotation key of flexlease/api/keys.py,
with its docstring, under the comment heading its block."""

from __future__ import annotations

from pathlib import Path

from flexlease.api import keys
from hack.docgen import labels

KEYS = Path(keys.__file__)


def test_every_key_constant_is_listed_with_its_docstring() -> None:
    parsed = labels.parse(KEYS.read_text(), vars(keys))
    constants = {
        name
        for name, value in vars(keys).items()
        if name.startswith(("LABEL_", "ANN_")) and isinstance(value, str) and value.startswith(keys.PREFIX)
    }
    assert {k.constant for k in parsed} == constants
    assert labels.missing_descriptions(parsed) == []
    owner = next(k for k in parsed if k.constant == "LABEL_OWNER")
    assert (owner.value, owner.kind, owner.section) == ("flexlease.io/owner", "label", "Pod labels")


SOURCE = '''
PREFIX = "x.io/"

# Pod labels
LABEL_A = PREFIX + "a"
"""A label."""
LABEL_B = PREFIX + "b"
# Things (a remark); more
# on a second line
ANN_C = PREFIX + "c"
"""An annotation."""
'''


def test_a_key_without_a_docstring_is_named_and_sections_come_from_comments() -> None:
    values = {"PREFIX": "x.io/", "LABEL_A": "x.io/a", "LABEL_B": "x.io/b", "ANN_C": "x.io/c"}
    parsed = labels.parse(SOURCE, values)
    assert [(k.constant, k.section) for k in parsed] == [
        ("LABEL_A", "Pod labels"),
        ("LABEL_B", "Pod labels"),
        ("ANN_C", "Things (a remark); more"),
    ]
    assert labels.missing_descriptions(parsed) == ["LABEL_B"]
    page = labels.render(parsed)
    assert "## Pod labels" in page and "## Things\n" in page
    assert "| `x.io/c` | annotation | An annotation. | `keys.ANN_C` |" in page
