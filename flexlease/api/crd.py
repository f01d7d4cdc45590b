"""CustomResourceDefinitions for ``GPUNode`` and ``GPULease``, derived from the pydantic models.

One source of truth: ``hack/gen_crds.py`` writes ``manifests/base/crds/*.yaml`` from here and a test
checks the committed files are current. The pydantic JSON schema is turned into a Kubernetes
*structural* schema (apiextensions.k8s.io/v1): ``$ref`` inlined, ``anyOf [T, null]`` →
``T`` + ``nullable: true``, ``dict[str, T]`` → ``additionalProperties``, no titles/defaults.
Pure; no I/O.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from flexlease.api import keys
from flexlease.api.resources import GPULeaseSpec, GPULeaseStatus, GPUNodeSpec, GPUNodeStatus

_DROP = frozenset({"title", "default", "description"})


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of ``model`` (by alias, i.e. camelCase keys)."""
    raw = model.model_json_schema(by_alias=True, mode="serialization")
    defs: dict[str, Any] = raw.get("$defs", {})

    def conv(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            return conv(defs[node["$ref"].rsplit("/", 1)[-1]])
        if "anyOf" in node:
            options = [o for o in node["anyOf"] if o.get("type") != "null"]
            nullable = len(options) < len(node["anyOf"])
            if len(options) == 1:
                single: dict[str, Any] = conv(options[0])
                return {**single, "nullable": True} if nullable else single
            return {"anyOf": [conv(o) for o in options], **({"nullable": True} if nullable else {})}
        out: dict[str, Any] = {}
        for k, v in node.items():
            if k in _DROP or k == "$defs":
                continue
            if k == "properties":
                out[k] = {name: conv(sub) for name, sub in v.items()}
            elif k in ("items", "additionalProperties") and isinstance(v, dict):
                out[k] = conv(v)
            else:
                out[k] = v
        if out.get("type") == "integer" and "format" not in out:
            out["format"] = "int64"
        return out

    schema = conv(raw)
    assert isinstance(schema, dict)
    return schema


def _crd(
    *,
    kind: str,
    plural: str,
    scope: str,
    short: list[str],
    spec: type[BaseModel],
    status: type[BaseModel],
    columns: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{keys.GROUP}"},
        "spec": {
            "group": keys.GROUP,
            "scope": scope,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short,
            },
            "versions": [
                {
                    "name": keys.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": structural_schema(spec),
                                "status": structural_schema(status),
                            },
                            "required": ["spec"],
                        }
                    },
                }
            ],
        },
    }


def gpunode_crd() -> dict[str, Any]:
    """CRD of the cluster-scoped ``GPUNode`` (printer columns: pool, GPUs, HA/MA/LA, lent, healthy, age)."""

    def col(name: str, path: str, typ: str = "integer") -> dict[str, Any]:
        return {"name": name, "type": typ, "jsonPath": path}

    return _crd(
        kind=keys.GPUNODE_KIND,
        plural=keys.GPUNODE_PLURAL,
        scope="Cluster",
        short=["gpun"],
        spec=GPUNodeSpec,
        status=GPUNodeStatus,
        columns=[
            col("Pool", ".spec.pool", "string"),
            col("GPUs", ".status.summary.gpus"),
            col("HA", ".status.summary.ha"),
            col("MA", ".status.summary.ma"),
            col("LA", ".status.summary.la"),
            col("Lent", ".status.summary.lent"),
            col("Healthy", ".status.summary.healthy"),
            col("Age", ".metadata.creationTimestamp", "date"),
        ],
    )


def gpulease_crd() -> dict[str, Any]:
    """CRD of the namespaced ``GPULease``."""
    return _crd(
        kind=keys.GPULEASE_KIND,
        plural=keys.GPULEASE_PLURAL,
        scope="Namespaced",
        short=["gpul"],
        spec=GPULeaseSpec,
        status=GPULeaseStatus,
        columns=[
            {"name": "Owner", "type": "string", "jsonPath": ".spec.owner"},
            {"name": "Action", "type": "string", "jsonPath": ".spec.action"},
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    )
