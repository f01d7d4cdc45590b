"""Least privilege: the Roles that ``manifests/`` binds to the extender's and the agent's
ServiceAccounts grant exactly the API calls their code makes (``hack/api_calls.py`` reads the
store calls from the source) — a missing grant is a 403 on a cluster, an unused one is
privilege nobody needs."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from flexlease.config import LeaseSettings
from hack.api_calls import Grant, ScanError, scan
from tests.manifests.render import NAMESPACE, ROOT, Obj, base, find

ACCOUNTS = {"extender": "flexlease-extender", "nodeagent": "flexlease-agent"}


def granted(objs: tuple[Obj, ...], account: str) -> dict[Grant, list[Obj]]:
    """Each (group, resource, verb) the ServiceAccount holds → the roles granting it."""
    subject = {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    out: dict[Grant, list[Obj]] = {}
    for binding in objs:
        if binding["kind"] not in {"RoleBinding", "ClusterRoleBinding"} or subject not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"]["namespace"] if ref["kind"] == "Role" else None
        role = find(objs, ref["kind"], ref["name"], namespace)
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert "*" not in (group, resource, verb), f"wildcard in {ref['name']}"
                        out.setdefault(Grant(group, resource, verb), []).append(role)
    return out


def difference(needed: set[Grant], grants: set[Grant]) -> str:
    missing = "\n".join(f"  missing: {g}" for g in sorted(needed - grants))
    unused = "\n".join(f"  unused:  {g}" for g in sorted(grants - needed))
    return "\n".join(x for x in (missing, unused) if x)


@pytest.mark.parametrize("package", sorted(ACCOUNTS))
def test_grants_equal_the_code_s_api_calls(package: str) -> None:
    needed = scan(package)
    assert Grant("", "pods", "get") in needed, "the scan found nothing?"
    grants = set(granted(base(), ACCOUNTS[package]))
    assert needed == grants, f"{ACCOUNTS[package]}:\n{difference(needed, grants)}"


# Modules that reach the API server around the store, and why their calls need no grant yet.
STORE_BYPASSES = {
    # pods/exec for the orchestrator's KubeExecutor, used only with orchestrator.executor:
    # kubernetes (off in the shipped manifests; docs/components/orchestrator.md says to grant pods/exec get, create).
    "extender/orchestrator/executors.py",
}


def test_api_calls_go_through_the_store() -> None:
    """The scan sees store calls only; a module talking to the API server directly
    (kubernetes_asyncio) would escape it."""
    direct = {
        str(path.relative_to(ROOT))
        for package in ACCOUNTS
        for path in (ROOT / package).rglob("*.py")
        if "kubernetes_asyncio" in path.read_text()
    }
    assert direct == STORE_BYPASSES


def test_the_comparison_names_a_missing_and_an_unused_grant() -> None:
    needed = {Grant("", "pods", "get"), Grant("", "pods", "patch")}
    grants = {Grant("", "pods", "get"), Grant("", "pods", "delete")}
    assert difference(needed, grants) == "  missing: core pods patch\n  unused:  core pods delete"


def test_leader_election_is_granted_only_in_its_namespace_for_its_lease() -> None:
    lease = LeaseSettings()
    grants = granted(base(), ACCOUNTS["extender"])
    lease_grants = {g: roles for g, roles in grants.items() if g.group == "coordination.k8s.io"}
    assert lease_grants
    for grant, roles in lease_grants.items():
        for role in roles:
            assert role["kind"] == "Role" and role["metadata"]["namespace"] == lease.leader_lease_namespace
            if grant.verb != "create":  # create cannot be limited to a name
                (rule,) = [
                    r for r in role["rules"] if grant.verb in r["verbs"] and "leases" in r["resources"]
                ]
                assert rule["resourceNames"] == [lease.leader_lease_name]


def test_agent_writes_are_pinned_to_its_node_by_admission() -> None:
    objs = base()
    policy = find(objs, "ValidatingAdmissionPolicy", "flexlease-agent-own-node")["spec"]
    assert policy["failurePolicy"] == "Fail"
    (condition,) = policy["matchConditions"]
    assert f"system:serviceaccount:{NAMESPACE}:flexlease-agent" in condition["expression"]
    written = {g.resource.split("/")[0] for g in scan("nodeagent") if g.verb in {"create", "patch"}}
    matched = {r for rule in policy["matchConstraints"]["resourceRules"] for r in rule["resources"]}
    assert written <= matched, "every resource the agent writes is checked"
    binding = find(objs, "ValidatingAdmissionPolicyBinding", "flexlease-agent-own-node")["spec"]
    assert binding == {"policyName": "flexlease-agent-own-node", "validationActions": ["Deny"]}


# The scanner itself, on code written for the test.


def _package(tmp_path: Path, source: str) -> Path:
    (tmp_path / "deployable").mkdir()
    (tmp_path / "deployable" / "__init__.py").write_text("")
    (tmp_path / "deployable" / "mod.py").write_text(textwrap.dedent(source))
    return tmp_path


def test_scan_reads_literal_calls_status_binding_and_eviction(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        """
        async def f(self, store):
            await self._store.delete(Kind.POD, "p", namespace="n")
            await store.patch(Kind.GPULEASE, "l", {}, namespace="n", subresource="status")
            await store.bind("n", "p", uid=None, node="x")
            await ctx.store.evict("n", "p")
            cache.get(Kind.GPUNODE)  # not a store: ignored
        """,
    )
    assert scan("deployable", root) == {
        Grant("", "pods", "delete"),
        Grant("flexlease.io", "gpuleases/status", "patch"),
        Grant("", "pods/binding", "create"),
        Grant("", "pods/eviction", "create"),
    }


def test_scan_binds_kind_templates_where_they_are_called(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        """
        class Reader:
            def __init__(self, store, kind):
                self._store, self._kind = store, kind
            async def run(self):
                await self._store.list(self._kind)
                self._store.watch(self._kind, resource_version="1")

        class Cache:
            def __init__(self, store, kind):
                self._reader = Reader(store, kind)

        def start(store):
            return Cache(store, Kind.GPULEASE)
        """,
    )
    assert scan("deployable", root) == {
        Grant("flexlease.io", "gpuleases", "list"),
        Grant("flexlease.io", "gpuleases", "watch"),
    }


def test_scan_refuses_a_kind_it_cannot_resolve(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        """
        async def anything(store, which):
            await store.get(which, "x")
        """,
    )
    with pytest.raises(ScanError, match="anything"):
        scan("deployable", root)
