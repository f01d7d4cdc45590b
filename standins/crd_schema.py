"""Structural-schema validation and pruning of custom resources, as kube-apiserver applies
them, from the CRDs in ``manifests/base/crds/``.

What the real server does on every create and update of a custom resource
(``staging/src/k8s.io/apiextensions-apiserver``: ``pkg/apiserver/schema/pruning/algorithm.go``,
``pkg/apiserver/validation/validation.go``, ``pkg/registry/customresource/validator.go``;
Kubernetes docs, "Extend the Kubernetes API with CustomResourceDefinitions", sections
"Specifying a structural schema" and "Field pruning"):

* **Pruning**: fields not described by the schema are dropped before validation and
  storage, at any depth (``properties`` name the known fields; an ``additionalProperties``
  schema applies to every key; ``x-kubernetes-preserve-unknown-fields: true`` keeps unknown
  fields). ``apiVersion``, ``kind`` and ``metadata`` at the root are never pruned here.
* **Validation**: the pruned object is checked against the OpenAPI v3 schema (types,
  ``enum``, ``pattern``, ``minimum``/``maximum``, ``required``, ...); ``nullable: true``
  admits ``null``. A failure answers 422 ``Invalid`` with a ``metav1.Status`` whose
  ``details.causes`` name each field, and the message
  ``<Kind>.<group> "<name>" is invalid: <field>: Invalid value: ...``.

* **Validation rules**: each ``x-kubernetes-validations`` CEL rule is evaluated with ``self``
  bound to the value at its node (for every item under a list's ``items``), and a false rule
  answers 422 with its ``message``:
  ``<Kind>.<group> "<name>" is invalid: spec.demand: Invalid value: "object": <message>``
  (paths as the API server writes them, ``windows[0]``). As the API server, rules are
  evaluated only where the value is present, and only once the OpenAPI checks pass.

The validator is the ``jsonschema`` library on the CRD's ``openAPIV3Schema`` (``nullable``
rewritten to ``anyOf: [null, ...]``, OpenAPI's form of the same rule; OpenAPI v3.0's boolean
``exclusiveMinimum`` back to JSON Schema's number); the CEL interpreter is the
``common-expression-language`` package. Not modelled: ``format`` checks (``date-time``),
``oldSelf`` (transition rules), rule cost limits and ratcheting (the CRDs use none of them).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cel
import jsonschema
import yaml

JsonObj = dict[str, Any]

CRD_DIR = Path(__file__).resolve().parents[1] / "manifests" / "base" / "crds"
_ROOT_KEPT = ("apiVersion", "kind", "metadata")


class SchemaError(Exception):
    """The object is invalid against its CRD. ``causes``: ``(field path, message)``."""

    def __init__(self, kind: str, group: str, name: str, causes: list[tuple[str, str]]) -> None:
        self.causes = causes
        detail = ", ".join(f"{field}: {msg}" for field, msg in causes)
        super().__init__(f'{kind}.{group} "{name}" is invalid: {detail}')


@functools.cache
def crd_schemas() -> dict[str, tuple[str, JsonObj]]:
    """Kind → (group, ``openAPIV3Schema`` of its served storage version) for every CRD in
    ``manifests/base/crds``."""
    out: dict[str, tuple[str, JsonObj]] = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
        out[crd["spec"]["names"]["kind"]] = (crd["spec"]["group"], version["schema"]["openAPIV3Schema"])
    if set(out) != {"GPUNode", "GPULease", "GPULeasePolicy"}:  # never check against nothing
        raise RuntimeError(
            f"expected the GPUNode, GPULease and GPULeasePolicy CRDs in {CRD_DIR}, found {sorted(out)}"
        )
    return out


def _to_jsonschema(node: Any) -> Any:
    """OpenAPI v3 structural schema → JSON Schema: ``nullable: true`` becomes
    ``anyOf: [{type: null}, <the rest>]`` (so ``enum`` and ``pattern`` still hold for
    non-null values); ``x-kubernetes-*`` keys are dropped."""
    if isinstance(node, list):
        return [_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: (v if k in ("enum", "required") else _to_jsonschema(v))
        for k, v in node.items()
        if k != "nullable" and not k.startswith("x-kubernetes-")
    }
    if isinstance(node.get("properties"), dict):  # property names are not schema keywords
        out["properties"] = {name: _to_jsonschema(sub) for name, sub in node["properties"].items()}
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if node.get(exclusive) is True and bound in node:  # OpenAPI v3.0's form → JSON Schema's
            out[exclusive] = node[bound]
            del out[bound]
    if node.get("nullable"):
        return {"anyOf": [{"type": "null"}, out]}
    return out


@functools.cache
def _validator(kind: str) -> jsonschema.protocols.Validator:
    _group, schema = crd_schemas()[kind]
    converted = _to_jsonschema(schema)
    cls = jsonschema.validators.validator_for(converted, default=jsonschema.Draft7Validator)
    return cls(converted)


def prune(schema: JsonObj, value: Any, *, path: str = "", dropped: list[str] | None = None) -> Any:
    """A copy of ``value`` without the fields ``schema`` does not describe; the paths of
    what was dropped are appended to ``dropped`` (``spec.devices.0.extra``)."""
    if isinstance(value, dict) and schema.get("type", "object") == "object":
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            props = schema.get("properties") or {}
            return {
                k: prune(props[k], v, path=f"{path}{k}.", dropped=dropped) if k in props else copy.deepcopy(v)
                for k, v in value.items()
            }
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out: JsonObj = {}
        for k, v in value.items():
            if props is not None and k in props:
                out[k] = prune(props[k], v, path=f"{path}{k}.", dropped=dropped)
            elif isinstance(extra, dict):
                out[k] = prune(extra, v, path=f"{path}{k}.", dropped=dropped)
            elif extra is True:
                out[k] = copy.deepcopy(v)
            elif dropped is not None:
                dropped.append(f"{path}{k}")
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(schema["items"], v, path=f"{path}{i}.", dropped=dropped) for i, v in enumerate(value)]
    return copy.deepcopy(value)


def prune_and_validate(obj: JsonObj, *, dropped: list[str] | None = None) -> JsonObj:
    """``obj`` (a custom resource of a kind in :func:`crd_schemas`) pruned to its schema, then
    validated. Returns the pruned copy; raises :class:`SchemaError` listing every invalid
    field. ``dropped`` collects the pruned field paths."""
    kind = str(obj.get("kind"))
    group, schema = crd_schemas()[kind]
    body = {k: v for k, v in obj.items() if k not in _ROOT_KEPT}
    pruned = prune(schema, body, dropped=dropped)
    out = {k: copy.deepcopy(obj[k]) for k in _ROOT_KEPT if k in obj}
    out.update(pruned)
    causes = [
        (
            ".".join(str(p) for p in err.absolute_path) or "<root>",
            f"Invalid value: {err.instance!r}: {err.message}",
        )
        for err in sorted(
            (leaf for top in _validator(kind).iter_errors(out) for leaf in _leaves(top)),
            key=lambda e: list(map(str, e.absolute_path)),
        )
    ]
    if not causes:
        causes = list(_rule_failures(schema, out, path=""))
    if causes:
        name = str((obj.get("metadata") or {}).get("name", ""))
        raise SchemaError(kind, group, name, causes)
    return out


def _leaves(err: jsonschema.ValidationError) -> Iterator[jsonschema.ValidationError]:
    """The errors to report for ``err``: a nullable field's (``anyOf: [null, T]``) are those of
    its ``T`` branch, as the API server names the field that broke ``T``'s rule."""
    if err.validator == "anyOf" and err.context:
        inner = [e for e in err.context if not (e.validator == "type" and e.validator_value == "null")]
        if inner:
            for sub in inner:
                yield from _leaves(sub)
            return
    yield err


def _rule_failures(schema: JsonObj, value: Any, *, path: str) -> Iterator[tuple[str, str]]:
    """(field path, message) of each ``x-kubernetes-validations`` rule ``value`` breaks, at
    any depth below ``schema`` (``path``: where ``value`` sits, ``spec.demand``)."""
    if value is None:
        return
    for rule in schema.get("x-kubernetes-validations") or ():
        try:
            holds = cel.evaluate(rule["rule"], {"self": value})
        except Exception as exc:  # the API server reports a rule that cannot run as invalid
            yield path or "<root>", f"Invalid value: {_kind_of(value)}: rule evaluation error: {exc}"
            continue
        if holds is not True:
            message = rule.get("message") or f"failed rule: {rule['rule']}"
            yield path or "<root>", f"Invalid value: {_kind_of(value)}: {message}"
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, sub in value.items():
            child = props.get(key) if key in props else schema.get("additionalProperties")
            if isinstance(child, dict):
                yield from _rule_failures(child, sub, path=f"{path}.{key}" if path else key)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from _rule_failures(schema["items"], item, path=f"{path}[{i}]")


def _kind_of(value: Any) -> str:
    """How the API server names a value in ``Invalid value:`` (``"object"`` for objects)."""
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    return repr(value)


def is_custom_kind(kind: str) -> bool:
    """True for kinds defined by a CRD in ``manifests/base/crds``."""
    return kind in crd_schemas()
