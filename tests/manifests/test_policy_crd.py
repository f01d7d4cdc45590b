"""manifests/base/crds/gpuleasepolicies.yaml: the API server refuses an invalid GPULeasePolicy
with a message naming the field — OpenAPI checks and the CEL rules (``x-kubernetes-validations``,
evaluated by a real CEL interpreter, ``common-expression-language``), through the stand-in API
server and KubeStore as a client sees them — and accepts what the autopilot's models accept."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import cel
import pydantic
import pytest
import yaml

from flexlease.api.policy import GPULeasePolicy, parse_policy
from flexlease.config import StoreSettings
from flexlease.errors import StoreError
from flexlease.store.base import Kind
from flexlease.store.kube import Backoff, KubeStore
from standins.apiserver import FakeApiServer
from standins.crd_schema import SchemaError, prune_and_validate

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "manifests" / "base" / "crds" / "gpuleasepolicies.yaml"


def policy(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "owner": "recsys/ranker",
        "minGPUs": 8,
        "maxGPUs": 16,
        "demand": {
            "schedule": {
                "timeZone": "Europe/Berlin",
                "windows": [{"start": "01:00", "end": "09:00", "gpus": 8}],
            }
        },
    }
    body.update(spec)
    return {
        "apiVersion": "flexlease.io/v1alpha1",
        "kind": "GPULeasePolicy",
        "metadata": {"name": "ranker", "namespace": "recsys"},
        "spec": body,
    }


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(obj: dict[str, Any]) -> None:
        node = obj["spec"]
        parts = path.split(".")
        for part in parts[:-1]:
            node = node[int(part)] if part.isdigit() else node[part]
        node[parts[-1]] = value

    return apply


BAD = [
    (_set("minGPUs", 20), "spec", "spec.minGPUs must not exceed spec.maxGPUs"),
    (
        _set("demand.prometheus", {"query": "sum(rate(requests_total[5m]))", "perGPU": 100}),
        "spec.demand",
        "exactly one of demand.schedule, demand.prometheus and demand.forecast must be set",
    ),
    (
        _set("demand", {}),
        "spec.demand",
        "exactly one of demand.schedule, demand.prometheus and demand.forecast must be set",
    ),
    (_set("leadTime", "soon"), "spec", "spec.leadTime must be auto or seconds in [0, 86400]"),
    (_set("leadTime", -5), "spec", "spec.leadTime must be auto or seconds in [0, 86400]"),
    (
        _set("demand.schedule.windows.0.end", "01:00"),
        "spec.demand.schedule.windows[0]",
        "a window's start and end must differ",
    ),
    (
        _set("demand.schedule.windows.0.start", "25:00"),
        "spec.demand.schedule.windows.0.start",
        "does not match",
    ),
    (_set("owner", "ranker"), "spec.owner", "does not match"),
    (_set("maxGPUs", 0), "spec.maxGPUs", "less than the minimum of 1"),
    (
        _set("demand", {"prometheus": {"query": "q", "perGPU": 0}}),
        "spec.demand.prometheus.perGPU",
        "less than or equal to the minimum of 0",
    ),
    (
        _set(
            "demand",
            {"prometheus": {"query": "q", "perGPU": 1, "fallback": {"scaleUpAbove": 5, "scaleDownBelow": 9}}},
        ),
        "spec.demand.prometheus.fallback",
        "fallback.scaleDownBelow must be below fallback.scaleUpAbove",
    ),
    (_set("stabilization", {"rho": 0}), "spec.stabilization.rho", "less than the minimum of 1"),
    (_set("gracePeriodSeconds", 5), "spec.gracePeriodSeconds", "less than the minimum of 30"),
]


@pytest.mark.parametrize(("mutate", "field", "message"), BAD)
def test_invalid_policies_are_refused_with_the_field_named(
    mutate: Callable[[dict[str, Any]], None], field: str, message: str
) -> None:
    obj = policy()
    mutate(obj)
    with pytest.raises(SchemaError) as refused:
        prune_and_validate(obj)
    assert any(f == field and message in m for f, m in refused.value.causes), refused.value.causes
    # the autopilot's own models refuse the same object (a store without an API server)
    with pytest.raises(pydantic.ValidationError):
        parse_policy(obj)


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"leadTime": 900, "dryRun": True, "stabilization": {"rho": 2, "tauSeconds": 900}},
        {"leadTime": 0},
        {
            "demand": {
                "prometheus": {"query": "sum(rate(x[5m]))", "perGPU": 2.5, "fallback": {"scaleUpAbove": 100}}
            }
        },
        {
            "demand": {
                "forecast": {
                    "query": "sum(rate(x[5m]))",
                    "perGPU": 100,
                    "fallbackSchedule": {
                        "windows": [{"start": "22:00", "end": "06:00", "gpus": 4, "days": ["Sat", "Sun"]}]
                    },
                }
            }
        },
    ],
)
def test_valid_policies_pass_schema_rules_and_models_alike(spec: dict[str, Any]) -> None:
    obj = policy(**spec)
    stored = prune_and_validate(copy.deepcopy(obj))
    assert stored["spec"] == obj["spec"]  # nothing pruned
    parsed = parse_policy(stored)
    assert parse_policy(parsed.to_json_obj()) == parsed


def test_an_unknown_time_zone_is_refused_by_the_model() -> None:
    """CEL cannot know the IANA database: the autopilot's model refuses it (its controller then
    reports the policy Invalid with this message)."""
    with pytest.raises(pydantic.ValidationError, match="unknown time zone 'Mars/Olympus'"):
        parse_policy(
            policy(
                demand={
                    "schedule": {
                        "timeZone": "Mars/Olympus",
                        "windows": [{"start": "01:00", "end": "02:00", "gpus": 1}],
                    }
                }
            )
        )


def test_every_rule_compiles_and_bounds_what_it_reads() -> None:
    """Each CEL rule runs on a valid object (a typo would be a runtime error there), and the
    lists and strings a rule iterates or compares carry maxItems/maxLength, which the API
    server's cost estimate needs."""
    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    assert [r["rule"] for r in spec["x-kubernetes-validations"]]
    windows = spec["properties"]["demand"]["properties"]["schedule"]["properties"]["windows"]
    assert windows["maxItems"] == 64
    assert windows["items"]["properties"]["start"]["maxLength"] == 5
    value = policy()["spec"]
    for rule in spec["x-kubernetes-validations"]:
        assert cel.evaluate(rule["rule"], {"self": value}) is True
    assert spec["properties"]["leadTime"] == {"x-kubernetes-int-or-string": True}
    per_gpu = spec["properties"]["demand"]["properties"]["prometheus"]["properties"]["perGPU"]
    assert per_gpu == {"minimum": 0, "exclusiveMinimum": True, "type": "number"}  # OpenAPI v3.0's form


@pytest.fixture
async def kube() -> AsyncIterator[KubeStore]:
    async with FakeApiServer() as api:
        store = KubeStore.for_host(
            api.url,
            StoreSettings(kind="kube", request_timeout_seconds=5.0, watch_timeout_seconds=30.0),
            reconnect=Backoff(initial=0.02, maximum=0.2, jitter=0.0),
        )
        try:
            yield store
        finally:
            await store.close()


async def test_kubectl_apply_of_an_invalid_policy_gets_the_rule_s_message(kube: KubeStore) -> None:
    with pytest.raises(
        StoreError, match=r"spec: Invalid value: \"object\": spec.minGPUs must not exceed spec.maxGPUs"
    ):
        await kube.create(Kind.GPULEASEPOLICY, policy(minGPUs=17))
    assert (await kube.list(Kind.GPULEASEPOLICY, namespace="recsys")).items == []
    created = await kube.create(Kind.GPULEASEPOLICY, policy())
    assert GPULeasePolicy.model_validate(created).spec.max_gpus == 16
    with pytest.raises(StoreError, match=r"exactly one of demand\.schedule"):
        await kube.patch(
            Kind.GPULEASEPOLICY,
            "ranker",
            {"spec": {"demand": {"prometheus": {"query": "q", "perGPU": 1}}}},
            namespace="recsys",
        )
    again = await kube.get(Kind.GPULEASEPOLICY, "ranker", namespace="recsys")
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
