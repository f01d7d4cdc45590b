"""The CRD reference (``docs/reference/crds.md``) from the CRD schemas.

Structure, types and validation come from the committed CustomResourceDefinitions
(``manifests/base/crds/*.yaml``: what the API server enforces). Their schemas carry no
descriptions (``flexlease.api.crd`` drops them), so each field's description is the schema's own
when it has one, else the ``Field(description=...)`` of the pydantic model the CRD is generated
from (the class in ``flexlease.api`` named after the CRD's kind), found at the same path.
:func:`missing_descriptions` names the fields without either. Pure apart from importing
``flexlease.api``.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel

import flexlease.api
from hack.docgen.text import GENERATED, cell, code, literal, prose, table

SOURCE: Final = "manifests/base/crds/ and the models in flexlease/api/"

STANDARD: Final[Mapping[str, str]] = {
    "apiVersion": "The versioned schema of this object: `flexlease.io/v1alpha1`.",
    "kind": "The REST resource this object represents.",
    "metadata": "Standard Kubernetes object metadata (`metav1.ObjectMeta`).",
}
"""Descriptions of the fields every Kubernetes object has."""


@dataclass(frozen=True)
class CrdField:
    """One field: its ``path`` (``spec.devices[*].node``; a map's entries are ``.*``), its
    ``type`` and ``validation`` in words, and its ``description``."""

    path: str
    type: str
    validation: str
    description: str


def find_model(kind: str) -> type[BaseModel]:
    """The pydantic model named ``kind`` in a module of ``flexlease.api``. Raises
    ``LookupError`` when none is."""
    for info in pkgutil.iter_modules(flexlease.api.__path__, "flexlease.api."):
        module = importlib.import_module(info.name)
        found = getattr(module, kind, None)
        if isinstance(found, type) and issubclass(found, BaseModel) and found.__module__ == info.name:
            return found
    raise LookupError(f"no pydantic model named {kind!r} in flexlease.api: the CRD's fields have no source")


def _resolve(node: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    """``node`` with ``$ref``, a single ``allOf`` and ``anyOf [T, null]`` followed to ``T``."""
    while True:
        if "$ref" in node:
            node = defs[str(node["$ref"]).rsplit("/", 1)[-1]]
        elif len(node.get("allOf", ())) == 1:
            node = node["allOf"][0]
        elif "anyOf" in node:
            options = [o for o in node["anyOf"] if o.get("type") != "null"]
            if len(options) != 1:
                return node
            node = options[0]
        else:
            return node


def model_descriptions(model: type[BaseModel]) -> dict[str, str]:
    """Path → description over ``model``'s JSON schema (by alias, as the CRD is): a field's own
    ``description``, else that of the model or enum it refers to."""
    schema = model.model_json_schema(by_alias=True, mode="serialization")
    defs: Mapping[str, Any] = schema.get("$defs", {})
    out: dict[str, str] = {}

    def visit(node: Mapping[str, Any], path: str, depth: int) -> None:
        if depth > 32:
            raise ValueError(f"{model.__name__}: schema nested deeper than 32 at {path}")
        target = _resolve(node, defs)
        text = node.get("description") or target.get("description")
        if path and text:
            out[path] = str(text)
        for name, sub in target.get("properties", {}).items():
            visit(sub, f"{path}.{name}" if path else name, depth + 1)
        if isinstance(target.get("items"), dict):
            visit(target["items"], f"{path}[*]", depth + 1)
        if isinstance(target.get("additionalProperties"), dict):
            visit(target["additionalProperties"], f"{path}.*", depth + 1)

    visit(schema, "", 0)
    return out


def type_of(node: Mapping[str, Any]) -> str:
    """A structural schema's type in words (``array of object``, ``map of string``,
    ``string (date-time)``)."""
    if "anyOf" in node:
        return " or ".join(type_of(o) for o in node["anyOf"])
    kind = str(node.get("type", "any"))
    if kind == "array" and isinstance(node.get("items"), dict):
        return f"array of {type_of(node['items'])}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map of {type_of(node['additionalProperties'])}"
    fmt = node.get("format")
    return f"{kind} ({fmt})" if fmt and fmt not in ("int64", "int32") else kind


def validation(node: Mapping[str, Any], *, required: bool) -> str:
    """What the API server checks on this field, in words."""
    words = ["required"] if required else []
    if "enum" in node:
        words.append("one of " + ", ".join(code(literal(v)) for v in node["enum"]))
    bounds = {
        "minimum": "≥",
        "exclusiveMinimum": ">",
        "maximum": "≤",
        "exclusiveMaximum": "<",
        "minLength": "length ≥",
        "maxLength": "length ≤",
        "minItems": "items ≥",
        "maxItems": "items ≤",
        "minProperties": "entries ≥",
        "maxProperties": "entries ≤",
    }
    words += [f"{word} {literal(node[key])}" for key, word in bounds.items() if key in node]
    if "pattern" in node:
        words.append("matches " + code(str(node["pattern"])))
    if "default" in node:
        words.append("default " + code(literal(node["default"])))
    if node.get("nullable"):
        words.append("may be null")
    for rule in node.get("x-kubernetes-validations", ()):
        words.append(
            "rule " + code(str(rule["rule"])) + (f": {rule['message']}" if "message" in rule else "")
        )
    return ", ".join(words)


def crd_fields(schema: Mapping[str, Any], descriptions: Mapping[str, str]) -> list[CrdField]:
    """Every field of an ``openAPIV3Schema``, depth first in the schema's order."""
    out: list[CrdField] = []

    def visit(node: Mapping[str, Any], path: str, required: bool, *, item: bool = False) -> None:
        if item and "properties" not in node:
            return  # an array's or a map's scalar values: its own row says it all
        if path:
            text = node.get("description") or STANDARD.get(path) or descriptions.get(path, "")
            out.append(CrdField(path, type_of(node), validation(node, required=required), prose(str(text))))
        needed = set(node.get("required", ()))
        for name, sub in node.get("properties", {}).items():
            visit(sub, f"{path}.{name}" if path else name, name in needed)
        if isinstance(node.get("items"), dict):
            visit(node["items"], f"{path}[*]", False, item=True)
        if isinstance(node.get("additionalProperties"), dict):
            visit(node["additionalProperties"], f"{path}.*", False, item=True)

    visit(schema, "", False)
    return out


@dataclass(frozen=True)
class Crd:
    """One CustomResourceDefinition and the model its fields are described by."""

    doc: Mapping[str, Any]
    model: type[BaseModel]

    @property
    def kind(self) -> str:
        return str(self.doc["spec"]["names"]["kind"])

    def versions(self) -> Iterator[tuple[Mapping[str, Any], list[CrdField]]]:
        """Each version and its fields."""
        descriptions = model_descriptions(self.model)
        for version in self.doc["spec"]["versions"]:
            yield version, crd_fields(version["schema"]["openAPIV3Schema"], descriptions)


def load(docs: Sequence[Mapping[str, Any]]) -> list[Crd]:
    """The CRDs of ``docs`` (parsed YAML documents), ordered by kind, each with its model."""
    crds = [Crd(d, find_model(str(d["spec"]["names"]["kind"]))) for d in docs]
    return sorted(crds, key=lambda c: c.kind)


def missing_descriptions(crds: Sequence[Crd]) -> list[str]:
    """``Kind: path`` of every field with no description."""
    return [
        f"{c.kind}: {f.path}" for c in crds for _, fields in c.versions() for f in fields if not f.description
    ]


INTRO: Final = """\
# Custom resources

flexlease's state lives in two custom resources of the group `flexlease.io`, besides the pods'
own labels and annotations ([annotations](annotations.md)): one `GPUNode` per GPU node and
`GPULease` directives. Their CustomResourceDefinitions are generated from the pydantic models in
`flexlease/api/` by `hack/gen_crds.py` (`manifests/base/crds/`); the API server checks every
write against the schemas below, and the types and validation here are read from those files.
Paths use `[*]` for the items of an array and `.*` for the entries of a map.
"""


def render(crds: Sequence[Crd]) -> str:
    """The whole page."""
    out = [GENERATED.format(source=SOURCE), "", INTRO]
    for crd in crds:
        spec = crd.doc["spec"]
        names = spec["names"]
        out += ["", f"## {crd.kind}", ""]
        if crd.model.__doc__:
            out += [prose(crd.model.__doc__), ""]
        facts = [
            ("name", code(str(crd.doc["metadata"]["name"]))),
            ("group", code(str(spec["group"]))),
            ("scope", str(spec["scope"])),
            ("plural, singular", f"{code(str(names['plural']))}, {code(str(names['singular']))}"),
            ("short names", ", ".join(code(str(n)) for n in names.get("shortNames", ())) or "none"),
        ]
        out += [table(("", ""), facts), ""]
        for version, fields in crd.versions():
            subresources = ", ".join(sorted(version.get("subresources", {}))) or "none"
            out += [f"### {crd.kind} {version['name']}", ""]
            out += [
                f"Served: {literal(version.get('served'))}, storage: {literal(version.get('storage'))}, "
                f"subresources: {subresources}.",
                "",
            ]
            columns = version.get("additionalPrinterColumns", ())
            if columns:
                out += ["`kubectl get` columns:", ""]
                printer = [(str(c["name"]), code(str(c["jsonPath"])), str(c["type"])) for c in columns]
                out += [table(("column", "JSONPath", "type"), printer), ""]
            rows = [(code(f.path), cell(f.type), cell(f.validation), cell(f.description)) for f in fields]
            out += [table(("field", "type", "validation", "description"), rows), ""]
    return "\n".join(out).rstrip("\n") + "\n"
