"""hack/docgen/crds.py: every field of the committed CRDs, with the API server's validation and
a description taken from the schema or from the model the CRD is generated from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, Field

from flexlease.api import crd, resources
from hack.docgen import crds

CRD_DIR = Path(__file__).resolve().parents[3] / "manifests" / "base" / "crds"


def _committed() -> list[crds.Crd]:
    return crds.load([yaml.safe_load(p.read_text()) for p in sorted(CRD_DIR.glob("*.yaml"))])


def _paths(node: dict[str, Any], path: str = "") -> list[str]:
    """Every property path of a structural schema (object-valued items and entries too)."""
    out: list[str] = []
    for name, sub in node.get("properties", {}).items():
        out.append(f"{path}.{name}" if path else name)
        out += _paths(sub, out[-1])
    for key, mark in (("items", "[*]"), ("additionalProperties", ".*")):
        sub = node.get(key)
        if isinstance(sub, dict) and "properties" in sub:
            out.append(path + mark)
            out += _paths(sub, path + mark)
    return out


def test_every_field_of_every_crd_is_listed_with_a_description() -> None:
    loaded = _committed()
    assert {c.kind for c in loaded} == {"GPUNode", "GPULease", "GPULeasePolicy"}
    assert crds.missing_descriptions(loaded) == []
    for c in loaded:
        for version, fields in c.versions():
            assert [f.path for f in fields] == _paths(version["schema"]["openAPIV3Schema"])


def test_validation_is_read_from_the_schema() -> None:
    lease = next(c for c in _committed() if c.kind == "GPULease")
    fields = {f.path: f for _, fs in lease.versions() for f in fs}
    assert fields["spec.gracePeriodSeconds"].validation == "≥ 30, ≤ 60"
    assert fields["spec.action"].validation == "required, one of `Lend`, `Reclaim`"
    assert fields["spec.owner"].validation.startswith("required, matches `^[a-z0-9]")
    assert fields["spec.count"].validation == "≥ 1, may be null"
    assert fields["status.conditions[*].lastTransitionTime"].type == "string (date-time)"
    node = next(c for c in _committed() if c.kind == "GPUNode")
    assert {f.path: f.type for _, fs in node.versions() for f in fs}["spec.devices"] == "map of object"


def test_a_rule_a_default_and_the_schemas_own_description_are_shown() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "description": "From the schema.",
                "x-kubernetes-validations": [{"rule": "self.a <= self.b", "message": "a ≤ b"}],
                "properties": {"a": {"type": "integer", "default": 3}},
            }
        },
    }
    fields = crds.crd_fields(schema, {"spec": "From the model.", "spec.a": "A."})
    assert fields[0].description == "From the schema."
    assert fields[0].validation == "rule `self.a <= self.b`: a ≤ b"
    assert fields[1].validation == "default `3`"


class _Spec(BaseModel):
    documented: int = Field(default=0, description="Documented.")
    bare: int = 0


class Undocumented(BaseModel):
    """A kind whose model misses a description."""

    spec: _Spec


def test_a_field_without_a_description_is_named() -> None:
    doc = {
        "metadata": {"name": "undocumenteds.example.io"},
        "spec": {
            "group": "example.io",
            "scope": "Namespaced",
            "names": {"kind": "Undocumented", "plural": "undocumenteds", "singular": "undocumented"},
            "versions": [
                {
                    "name": "v1",
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": crd.structural_schema(_Spec)},
                        }
                    },
                }
            ],
        },
    }
    missing = crds.missing_descriptions([crds.Crd(doc, Undocumented)])
    assert missing == ["Undocumented: spec", "Undocumented: spec.bare"]
    assert "`spec.documented`" in crds.render([crds.Crd(doc, Undocumented)])


def test_the_model_is_found_by_kind_and_a_kind_without_one_is_refused() -> None:
    assert crds.find_model("GPULease") is resources.GPULease
    with pytest.raises(LookupError, match="NoSuchKind"):
        crds.find_model("NoSuchKind")
