"""manifests/base/crds: CRDs generated from the models and current; the API server's schema checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from flexlease.api.resources import GPULease, GPUNode, summarize
from hack import gen_crds
from tests.flexlease.test_resources import _node

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"


def test_committed_crds_are_generated_from_the_models() -> None:
    for name, text in gen_crds.render().items():
        assert (MANIFESTS / "base" / "crds" / name).read_text() == text, (
            f"run: python hack/gen_crds.py ({name})"
        )


def _jsonschema(node: Any) -> Any:
    """Structural schema → JSON Schema (``nullable: true`` → ``type: [T, "null"]``,
    ``minimum`` + ``exclusiveMinimum: true`` → ``exclusiveMinimum``)."""
    if isinstance(node, list):
        return [_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _jsonschema(v) for k, v in node.items() if k != "nullable"}
    if node.get("exclusiveMinimum") is True:  # OpenAPI v3.0's boolean → JSON Schema's number
        out["exclusiveMinimum"] = out.pop("minimum")
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def _schema(file: str) -> dict[str, Any]:
    crd = yaml.safe_load((MANIFESTS / "base" / "crds" / file).read_text())
    schema = _jsonschema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    assert isinstance(schema, dict)
    return schema


def test_objects_written_by_flexlease_pass_the_crd_schema() -> None:
    node = _node()
    node = node.model_copy(
        update={
            "status": node.status.model_copy(update={"summary": summarize(node.spec, node.status.devices)})
        }
    )
    jsonschema.validate(node.to_json_obj(), _schema("gpunodes.yaml"))
    lease = GPULease.model_validate(
        {
            "metadata": {"name": "scale-up", "namespace": "recsys"},
            "spec": {
                "owner": "recsys/ranker",
                "action": "Reclaim",
                "devices": [{"node": "gpu-7", "index": 1}],
            },
            "status": {"phase": "InProgress", "reclaimed": [{"node": "gpu-7", "index": 1}]},
        }
    )
    jsonschema.validate(lease.to_json_obj(), _schema("gpuleases.yaml"))


@pytest.mark.parametrize(
    ("file", "bad"),
    [
        ("gpunodes.yaml", {"spec": {"pool": "spare"}}),
        ("gpunodes.yaml", {"spec": {"devices": {"0": {"tierOverride": "XA"}}}}),
        ("gpuleases.yaml", {"spec": {"owner": "recsys/ranker", "action": "Lend", "count": 0}}),
        ("gpuleases.yaml", {"spec": {"owner": "recsys/ranker", "action": "Lend", "gracePeriodSeconds": 5}}),
        ("gpuleases.yaml", {"spec": {"owner": "no-namespace", "action": "Lend", "count": 1}}),
    ],
)
def test_the_api_server_would_reject_bad_objects(file: str, bad: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"metadata": {"name": "x"}, **bad}, _schema(file))


def test_summary_counts_effective_tiers_and_tags() -> None:
    node = _node()
    s = summarize(node.spec, node.status.devices)
    assert (s.gpus, s.healthy, s.ha, s.ma, s.la, s.lent) == (2, 2, 1, 0, 1, 1)
    assert GPUNode.model_validate(node.to_json_obj()) == node
