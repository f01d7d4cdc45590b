"""CustomResourceDefinitions for ``GPUNode``, ``GPULease`` and ``GPULeasePolicy``, from the pydantic models.

One source of truth: ``hack/gen_crds.py`` writes ``manifests/base/crds/*.yaml`` from here and a test
checks the committed files are current. The pydantic JSON schema is turned into a Kubernetes
*structural* schema (apiextensions.k8s.io/v1): ``$ref`` inlined, ``anyOf [T, null]`` →
``T`` + ``nullable: true``, ``dict[str, T]`` → ``additionalProperties``, no titles/defaults,
JSON Schema's numeric ``exclusiveMinimum``/``exclusiveMaximum`` → OpenAPI v3.0's
``minimum``/``maximum`` + ``exclusiveMinimum: true`` (``JSONSchemaProps`` holds a bool).
``GPULeasePolicy`` adds ``x-kubernetes-validations`` (CEL rules the API server evaluates at
admission, with the messages a refused ``kubectl apply`` prints) for what a structural schema
cannot say. Pure; no I/O.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel

from flexlease.api import keys
from flexlease.api.policy import MAX_LEAD_SECONDS, GPULeasePolicySpec, GPULeasePolicyStatus
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
        for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if isinstance(out.get(exclusive), int | float) and not isinstance(out[exclusive], bool):
                out[bound] = out[exclusive]
                out[exclusive] = True
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
    spec_schema: dict[str, Any] | None = None,
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
                                "spec": spec_schema if spec_schema is not None else structural_schema(spec),
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


POLICY_RULES: Final[dict[str, list[dict[str, str]]]] = {
    "": [
        {"rule": "self.minGPUs <= self.maxGPUs", "message": "spec.minGPUs must not exceed spec.maxGPUs"},
        {
            "rule": "!has(self.leadTime) || (type(self.leadTime) == string ? self.leadTime == 'auto' "
            f": (self.leadTime >= 0 && self.leadTime <= {MAX_LEAD_SECONDS}))",
            "message": f"spec.leadTime must be auto or seconds in [0, {MAX_LEAD_SECONDS}]",
        },
    ],
    "demand": [
        {
            "rule": "[has(self.schedule), has(self.prometheus), has(self.forecast)].filter(x, x).size() == 1",
            "message": "exactly one of demand.schedule, demand.prometheus and demand.forecast must be set",
        }
    ],
    "demand.schedule.windows.*": [
        {"rule": "self.start != self.end", "message": "a window's start and end must differ"}
    ],
    "demand.forecast.fallbackSchedule.windows.*": [
        {"rule": "self.start != self.end", "message": "a window's start and end must differ"}
    ],
    "demand.prometheus.fallback": [
        {
            "rule": "!has(self.scaleDownBelow) || self.scaleDownBelow < self.scaleUpAbove",
            "message": "fallback.scaleDownBelow must be below fallback.scaleUpAbove",
        }
    ],
}
"""CEL rules of ``GPULeasePolicy.spec`` by the path of the schema node they sit on (``""``: spec
itself, ``*``: a list's items); each repeats a pydantic validator of :mod:`flexlease.api.policy`."""


def _node_at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for part in filter(None, path.split(".")):
        node = node["items"] if part == "*" else node["properties"][part]
    return node


def policy_spec_schema() -> dict[str, Any]:
    """The structural schema of ``GPULeasePolicy.spec``: ``leadTime`` as
    ``x-kubernetes-int-or-string`` (``auto`` or seconds) and :data:`POLICY_RULES` added."""
    schema = structural_schema(GPULeasePolicySpec)
    schema["properties"]["leadTime"] = {"x-kubernetes-int-or-string": True}
    for path, rules in POLICY_RULES.items():
        _node_at(schema, path)["x-kubernetes-validations"] = [dict(r) for r in rules]
    return schema


def gpuleasepolicy_crd() -> dict[str, Any]:
    """CRD of the namespaced ``GPULeasePolicy`` (the lease autopilot's policy, one per online job)."""
    return _crd(
        kind=keys.GPULEASEPOLICY_KIND,
        plural=keys.GPULEASEPOLICY_PLURAL,
        scope="Namespaced",
        short=["gpulp"],
        spec=GPULeasePolicySpec,
        status=GPULeasePolicyStatus,
        spec_schema=policy_spec_schema(),
        columns=[
            {"name": "Owner", "type": "string", "jsonPath": ".spec.owner"},
            {"name": "Source", "type": "string", "jsonPath": ".status.demand.source"},
            {"name": "Demand", "type": "integer", "jsonPath": ".status.demand.gpus"},
            {"name": "Target", "type": "integer", "jsonPath": ".status.plan.targetGPUs"},
            {"name": "Allocated", "type": "integer", "jsonPath": ".status.plan.allocatedGPUs"},
            {"name": "Decision", "type": "string", "jsonPath": ".status.lastDecision.action"},
            {"name": "DryRun", "type": "boolean", "jsonPath": ".spec.dryRun", "priority": 1},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    )
