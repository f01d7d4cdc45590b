"""``kubectl apply -k`` twice reports every object ``unchanged``: no atomic list in the
manifests lacks a value the API server fills in by default.

Why: ``kubectl apply`` (client-side) sends a strategic merge patch computed from the
last-applied copy, the file and the live object. A list without a patch merge key is
*atomic*: it is replaced whole whenever the file's list differs from the live one. The API
server defaults fields inside the elements it stores (a ValidatingAdmissionPolicy rule's
``scope: "*"``), so a file that leaves such a field out never equals the live list, the list
is sent again on every apply, and kubectl reports ``configured`` forever. Outside atomic
lists a defaulted field is harmless (the three-way merge leaves fields that neither the file
nor the last-applied copy name alone).

The atomic lists are found from the Kubernetes 1.37 OpenAPI schemas (``kubernetes-validate``:
``x-kubernetes-patch-strategy``); the defaults are the API server's defaulting functions that
can reach an element of such a list, listed in :data:`DEFAULTS` with their source."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.manifests.render import OVERLAYS, Obj, render

SCHEMAS = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / "v1.37.0-local-strict"
DEFS: dict[str, Any] = json.loads((SCHEMAS / "_definitions.json").read_text())["$defs"]

Defaults = Callable[[Obj], dict[str, object]]


def _scope(_: Obj) -> dict[str, object]:
    # k8s.io/kubernetes pkg/apis/admissionregistration/v1/defaults.go, SetDefaults_Rule (a
    # rule's scope defaults to AllScopes, "*"); RuleWithOperations and NamedRuleWithOperations
    # embed Rule, so webhook rules and admission-policy resourceRules get it too.
    return {"scope": "*"}


def _subject_group(subject: Obj) -> dict[str, object]:
    # pkg/apis/rbac/v1/defaults.go, SetDefaults_Subject: a User or Group subject without an
    # apiGroup gets rbac.authorization.k8s.io (a ServiceAccount gets "", which is not written).
    return {"apiGroup": "rbac.authorization.k8s.io"} if subject.get("kind") in {"User", "Group"} else {}


DEFAULTS: dict[str, Defaults] = {
    **{
        f"io.k8s.api.admissionregistration.{v}.{t}": _scope
        for v, t in [
            ("v1", "RuleWithOperations"),  # webhook configurations' rules
            ("v1", "NamedRuleWithOperations"),  # admission policies' and bindings' resourceRules
            ("v1beta1", "NamedRuleWithOperations"),
            ("v1alpha1", "NamedRuleWithOperations"),
        ]
    },
    # pkg/apis/networking/v1/defaults.go, SetDefaults_NetworkPolicyPort
    "io.k8s.api.networking.v1.NetworkPolicyPort": lambda _: {"protocol": "TCP"},
    "io.k8s.api.rbac.v1.Subject": _subject_group,
    # pkg/apis/core/v1/defaults.go, SetDefaults_ObjectFieldSelector (downwardAPI items)
    "io.k8s.api.core.v1.ObjectFieldSelector": lambda _: {"apiVersion": "v1"},
    # pkg/apis/core/v1/defaults.go, SetDefaults_ServiceAccountTokenProjection (projected sources)
    "io.k8s.api.core.v1.ServiceAccountTokenProjection": lambda _: {"expirationSeconds": 3600},
}


def _definition(obj: Obj) -> str | None:
    """The OpenAPI definition of a built-in kind (None for custom resources)."""
    group, _, version = str(obj["apiVersion"]).rpartition("/")
    for name, schema in DEFS.items():
        for gvk in schema.get("x-kubernetes-group-version-kind", ()):
            if (gvk["group"], gvk["version"], gvk["kind"]) == (group, version, obj["kind"]):
                return name
    return None


def _ref(schema: Any) -> str | None:
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    return ref.rsplit("/", 1)[-1] if ref else None


def _walk(value: Any, definition: str | None, path: str, *, atomic: bool) -> Iterator[tuple[str, str, Obj]]:
    """(path, definition, element) for each object typed ``definition`` at or below an
    element of an atomic list."""
    if definition is None or not isinstance(value, dict):
        return
    if atomic:
        yield path, definition, value
    properties = DEFS[definition].get("properties", {})
    for key, child in value.items():
        prop = properties.get(key)
        if prop is None:
            continue
        if "items" in prop and isinstance(child, list):
            merged = "merge" in prop.get("x-kubernetes-patch-strategy", "")
            for i, item in enumerate(child):
                yield from _walk(item, _ref(prop["items"]), f"{path}.{key}[{i}]", atomic=atomic or not merged)
        else:
            yield from _walk(child, _ref(prop), f"{path}.{key}", atomic=atomic)


def missing_defaults(obj: Obj) -> list[str]:
    """Fields the API server would fill in inside ``obj``'s atomic lists, as
    ``<kind>/<name><path>.<field>: <default>``."""
    out = []
    where = f"{obj['kind']}/{obj['metadata']['name']}"
    for path, definition, element in _walk(obj, _definition(obj), "", atomic=False):
        defaults = DEFAULTS.get(definition)
        for field, default in (defaults(element) if defaults else {}).items():
            if field not in element:
                out.append(f"{where}{path}.{field}: {default!r}")
    return out


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_atomic_lists_carry_the_api_servers_defaults(overlay: str) -> None:
    """Fails on a ValidatingAdmissionPolicy rule without ``scope`` (the issue's report)."""
    missing = [m for obj in render(OVERLAYS[overlay]) for m in missing_defaults(obj)]
    assert not missing, (
        "write these defaults out (kubectl apply would report 'configured' forever):\n" + "\n".join(missing)
    )


def test_every_default_names_a_type_of_the_schemas() -> None:
    assert [name for name in DEFAULTS if name not in DEFS] == []


def test_the_check_finds_what_kubectl_would_resend() -> None:
    """The walk reaches each kind of atomic list it claims to: admission rules, network
    policy ports (two atomic lists deep), role binding subjects and downward-API items inside
    a pod template; and it leaves merge-keyed lists alone (a container's env)."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "p"},
        "spec": {"matchConstraints": {"resourceRules": [{"resources": ["pods"]}, {"scope": "*"}]}},
    }
    netpol = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "n"},
        "spec": {"ingress": [{"ports": [{"port": 80}, {"port": 81, "protocol": "UDP"}]}]},
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "b"},
        "subjects": [
            {"kind": "Group", "name": "g"},
            {"kind": "ServiceAccount", "name": "s", "namespace": "x"},
        ],
    }
    field = {"fieldRef": {"fieldPath": "metadata.name"}}
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "d"},
        "spec": {
            "template": {
                "spec": {
                    "containers": [{"name": "c", "env": [{"name": "N", "valueFrom": field}]}],
                    "volumes": [{"name": "v", "downwardAPI": {"items": [{"path": "n", **field}]}}],
                }
            }
        },
    }
    assert missing_defaults(policy) == [
        "ValidatingAdmissionPolicy/p.spec.matchConstraints.resourceRules[0].scope: '*'"
    ]
    assert missing_defaults(netpol) == ["NetworkPolicy/n.spec.ingress[0].ports[0].protocol: 'TCP'"]
    assert missing_defaults(binding) == [
        "ClusterRoleBinding/b.subjects[0].apiGroup: 'rbac.authorization.k8s.io'"
    ]
    assert missing_defaults(daemonset) == [
        "DaemonSet/d.spec.template.spec.volumes[0].downwardAPI.items[0].fieldRef.apiVersion: 'v1'"
    ]
