"""manifests/ as an operator installs it: ``kubectl kustomize`` of the base and every overlay
builds, every built-in object validates against the Kubernetes 1.37 OpenAPI schemas
(``kubernetes-validate``, strict: unknown fields fail), and the pieces fit together — names,
selectors, ports, mounts, the scheduler's leader Lease and its extender stanza, the extender's
generated configuration."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError

from flexlease import config
from flexlease.api import keys
from flexlease.config import AgentSettings
from tests.manifests.render import (
    MANIFESTS,
    NAMESPACE,
    OVERLAYS,
    Obj,
    base,
    configmap_file,
    find,
    mount_path,
    pod_spec,
    render,
)

K8S_VERSION = "1.37.0"
# Groups served by kube-apiserver itself; anything else needs a CRD in the cluster.
BUILTIN_GROUPS = {
    "",
    "apps",
    "rbac.authorization.k8s.io",
    "networking.k8s.io",
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "coordination.k8s.io",
    "policy",
}
# ClusterRoles/Roles the API server bootstraps (kube-apiserver's RBAC defaults).
BOOTSTRAP_ROLES = {
    ("ClusterRole", "system:kube-scheduler"),
    ("ClusterRole", "system:volume-scheduler"),
    ("Role", "extension-apiserver-authentication-reader"),
}
OPTIONAL_CRDS = {
    "monitoring.coreos.com": "components/prometheus-operator",
    "cert-manager.io": "components/cert-manager",
}
TLS_SECRETS = {"flexlease-extender-tls", "flexlease-scheduler-tls"}


def group(obj: Obj) -> str:
    api = str(obj["apiVersion"])
    return api.split("/", maxsplit=1)[0] if "/" in api else ""


def crd_schemas(objs: tuple[Obj, ...]) -> dict[tuple[str, str], Any]:
    """(group, kind) → openAPIV3Schema of the CRDs in the rendering."""
    return {
        (o["spec"]["group"], o["spec"]["names"]["kind"]): o["spec"]["versions"][0]["schema"][
            "openAPIV3Schema"
        ]
        for o in objs
        if o["kind"] == "CustomResourceDefinition"
    }


overlays = pytest.mark.parametrize("overlay", sorted(OVERLAYS))


@overlays
def test_every_overlay_builds_into_named_unique_objects(overlay: str) -> None:
    objs = render(OVERLAYS[overlay])
    keys = [(o["apiVersion"], o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs]
    assert len(keys) == len(set(keys)), "duplicate objects"
    for o in objs:
        assert {"apiVersion", "kind", "metadata"} <= o.keys()
        namespaced = o["kind"] not in {
            "Namespace",
            "CustomResourceDefinition",
            "ClusterRole",
            "ClusterRoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        }
        assert (o["metadata"].get("namespace") is not None) == namespaced, o["metadata"]
        if namespaced and o["kind"] != "RoleBinding":
            assert o["metadata"]["namespace"] == NAMESPACE, o["metadata"]


@overlays
def test_built_in_objects_validate_against_the_kubernetes_openapi_schemas(overlay: str) -> None:
    objs = render(OVERLAYS[overlay])
    crds = crd_schemas(objs)
    for o in objs:
        if group(o) in BUILTIN_GROUPS:
            kubernetes_validate.validate(o, K8S_VERSION, strict=True)
        elif (group(o), o["kind"]) in crds:
            jsonschema.validate(o, crds[(group(o), o["kind"])])
        else:
            # A third-party CR: only from the component that needs that operator.
            assert group(o) in OPTIONAL_CRDS, o["kind"]


def test_validation_catches_a_wrong_field() -> None:
    deployment = copy.deepcopy(find(base(), "Deployment", "flexlease-extender", NAMESPACE))
    deployment["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError, match="volumeMount"):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    with pytest.raises(SchemaNotFoundError):
        kubernetes_validate.validate(
            {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": {"name": "x"}},
            K8S_VERSION,
            strict=True,
        )


def test_the_base_needs_no_operator() -> None:
    """`kubectl apply -k manifests/` on a cluster without prometheus-operator or cert-manager:
    every object is a built-in kind or a CRD the base installs itself."""
    objs = base()
    crds = crd_schemas(objs)
    for o in objs:
        assert group(o) in BUILTIN_GROUPS or (group(o), o["kind"]) in crds, o["kind"]


@pytest.mark.parametrize(("api_group", "component"), sorted(OPTIONAL_CRDS.items()))
def test_each_component_adds_only_its_operators_objects(api_group: str, component: str) -> None:
    combined = render(MANIFESTS / "overlays" / Path(component).name)
    added = {
        (o["kind"], o["metadata"]["name"]) for o in combined if o not in base()
    }  # objects the component adds
    assert added
    kinds_groups = {group(o) for o in combined if (o["kind"], o["metadata"]["name"]) in added}
    assert kinds_groups == {api_group}


@overlays
def test_references_resolve(overlay: str) -> None:
    """Bindings name existing roles and ServiceAccounts; pods name existing ServiceAccounts and
    ConfigMaps; Secrets mounted are the two TLS Secrets (issued by cert-manager when present)."""
    objs = render(OVERLAYS[overlay])
    names = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs}
    for b in (o for o in objs if o["kind"] in {"RoleBinding", "ClusterRoleBinding"}):
        ref = b["roleRef"]
        ns = b["metadata"].get("namespace") if ref["kind"] == "Role" else None
        assert (ref["kind"], ns, ref["name"]) in names or (ref["kind"], ref["name"]) in BOOTSTRAP_ROLES, ref
        for s in b["subjects"]:
            assert ("ServiceAccount", s["namespace"], s["name"]) in names, s
    issued = {o["spec"]["secretName"] for o in objs if o["kind"] == "Certificate"}
    for w in (o for o in objs if o["kind"] in {"Deployment", "DaemonSet"}):
        spec = w["spec"]["template"]["spec"]
        assert ("ServiceAccount", NAMESPACE, spec["serviceAccountName"]) in names
        assert (
            w["spec"]["selector"]["matchLabels"].items()
            <= w["spec"]["template"]["metadata"]["labels"].items()
        )
        for v in spec.get("volumes", []):
            if "configMap" in v:
                assert ("ConfigMap", NAMESPACE, v["configMap"]["name"]) in names, v
            if "secret" in v:
                assert v["secret"]["secretName"] in TLS_SECRETS, v
                if "cert-manager" in overlay or overlay == "overlays/full":
                    assert v["secret"]["secretName"] in issued, v
    if issued:
        assert issued >= TLS_SECRETS


def test_services_and_network_policies_select_the_pods_and_ports() -> None:
    objs = base()
    extender = find(objs, "Deployment", "flexlease-extender", NAMESPACE)["spec"]["template"]
    scheduler = find(objs, "Deployment", "flexlease-scheduler", NAMESPACE)["spec"]["template"]
    agent = find(objs, "DaemonSet", "flexlease-agent", NAMESPACE)["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for p in extender["spec"]["containers"][0]["ports"]}
    service = find(objs, "Service", "flexlease-extender", NAMESPACE)["spec"]
    assert service["selector"].items() <= extender["metadata"]["labels"].items()
    (svc_port,) = service["ports"]
    assert ports[svc_port["targetPort"]] == svc_port["port"]

    ext_policy = find(objs, "NetworkPolicy", "flexlease-extender", NAMESPACE)["spec"]
    assert ext_policy["podSelector"]["matchLabels"].items() <= extender["metadata"]["labels"].items()
    serving, scraping = ext_policy["ingress"]
    (peer,) = serving["from"]
    assert set(peer) == {"podSelector"}, "only pods of this namespace, no namespaceSelector"
    assert peer["podSelector"]["matchLabels"].items() <= scheduler["metadata"]["labels"].items()
    assert not peer["podSelector"]["matchLabels"].items() <= extender["metadata"]["labels"].items()
    assert [p["port"] for p in serving["ports"]] == [svc_port["port"]] == [ports["https"]]
    assert scraping["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert [p["port"] for p in scraping["ports"]] == [ports["metrics"]]

    agent_policy = find(objs, "NetworkPolicy", "flexlease-agent", NAMESPACE)["spec"]
    assert agent_policy["podSelector"]["matchLabels"].items() <= agent["metadata"]["labels"].items()
    (rule,) = agent_policy["ingress"]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    (metrics,) = agent["spec"]["containers"][0]["ports"]
    assert [p["port"] for p in rule["ports"]] == [metrics["containerPort"]]


def scheduler_config(objs: tuple[Obj, ...]) -> tuple[Obj, Obj]:
    """(KubeSchedulerConfiguration, the scheduler's pod spec)."""
    spec = pod_spec(objs, "Deployment", "flexlease-scheduler")
    (container,) = spec["containers"]
    key, text = configmap_file(objs, spec, "config")
    flag = next(a for a in container["command"] if a.startswith("--config="))
    assert Path(flag.removeprefix("--config=")) == mount_path(container, "config") / key
    return yaml.safe_load(text), spec


def test_the_scheduler_owns_its_leader_lease() -> None:
    """kube-scheduler's leader election gets/updates the Lease it is configured with; the
    bootstrap role system:kube-scheduler covers only the Lease "kube-scheduler"."""
    objs = base()
    cfg, spec = scheduler_config(objs)
    election = cfg["leaderElection"]
    assert election["leaderElect"] is True
    ns, name = election["resourceNamespace"], election["resourceName"]
    roles = [
        find(objs, "Role", b["roleRef"]["name"], ns)
        for b in objs
        if b["kind"] == "RoleBinding"
        and b["metadata"]["namespace"] == ns
        and {"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": NAMESPACE}
        in b["subjects"]
    ]
    granted = {
        verb
        for role in roles
        for rule in role["rules"]
        if "coordination.k8s.io" in rule["apiGroups"]
        and "leases" in rule["resources"]
        and name in rule.get("resourceNames", [name])
        for verb in rule["verbs"]
    }
    assert {"get", "update"} <= granted


def test_the_scheduler_calls_the_extender_over_mutual_tls() -> None:
    objs = base()
    cfg, spec = scheduler_config(objs)
    assert [p["schedulerName"] for p in cfg["profiles"]] == ["flexlease-scheduler"]
    (ext,) = cfg["extenders"]
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"], ext["preemptVerb"]) == (
        "filter",
        "prioritize",
        "bind",
        "preempt",
    )
    assert ext["nodeCacheCapable"] is True
    assert ext["ignorable"] is False
    assert ext["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}]
    # https://<service>.<namespace>.svc:<port> of the extender's Service
    service = find(objs, "Service", "flexlease-extender", NAMESPACE)
    (port,) = service["spec"]["ports"]
    assert ext["urlPrefix"] == f"https://flexlease-extender.{NAMESPACE}.svc:{port['port']}"
    assert ext["enableHTTPS"] is True
    tls_dir = mount_path(spec["containers"][0], "tls")
    assert ext["tlsConfig"] == {
        "certFile": str(tls_dir / "tls.crt"),
        "keyFile": str(tls_dir / "tls.key"),
        "caFile": str(tls_dir / "ca.crt"),
    }
    (tls,) = [v for v in spec["volumes"] if v["name"] == "tls"]
    assert tls["secret"]["secretName"] == "flexlease-scheduler-tls"


def test_the_scheduler_sends_the_extender_every_feasible_node() -> None:
    """kube-scheduler's ``numFeasibleNodesToFind``: with ``percentageOfNodesToScore`` unset
    (0: adaptive) it stops filtering at max(100, n × max(5, 50 − n/125) / 100) feasible
    nodes, so the extender would never see the rest (a reclaim pod's own lent GPUs among
    them). 100 makes it every node, whatever a profile sets (none may lower it)."""
    cfg, _ = scheduler_config(base())
    assert cfg["percentageOfNodesToScore"] == 100
    assert all(p.get("percentageOfNodesToScore", 100) == 100 for p in cfg["profiles"])


def test_the_scheduler_image_is_pinned_to_a_release() -> None:
    (container,) = pod_spec(base(), "Deployment", "flexlease-scheduler")["containers"]
    image, _, tag = container["image"].rpartition(":")
    assert image == "registry.k8s.io/kube-scheduler"
    major, minor, patch = tag.removeprefix("v").split(".")
    assert (int(major), int(minor)) >= (1, 36), "a current minor (match your cluster's)"
    assert patch.isdigit()


def extender_settings(objs: tuple[Obj, ...], tmp_path: Path) -> tuple[config.Settings, Obj]:
    spec = pod_spec(objs, "Deployment", "flexlease-extender")
    (container,) = spec["containers"]
    key, text = configmap_file(objs, spec, "config")
    assert container["args"] == ["--config", str(mount_path(container, "config") / key)]
    (tmp_path / key).write_text(text)
    return config.load(tmp_path / key), spec


def test_the_extender_configuration_loads_and_matches_the_deployment(tmp_path: Path) -> None:
    objs = base()
    settings, spec = extender_settings(objs, tmp_path)
    (container,) = spec["containers"]
    assert settings.store.kind == "kube"
    assert settings.extender.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"https": settings.extender.port, "metrics": settings.extender.metrics_port}
    # Kubelet presents no client certificate: probes go to the plain read-only listener.
    for probe in (container["readinessProbe"], container["livenessProbe"]):
        assert probe["httpGet"]["port"] == "metrics" and "scheme" not in probe["httpGet"]
    tls_dir = mount_path(container, "tls")
    ext = settings.extender
    assert (ext.tls_cert_file, ext.tls_key_file, ext.tls_client_ca_file) == (
        tls_dir / "tls.crt",
        tls_dir / "tls.key",
        tls_dir / "ca.crt",
    )
    assert ext.insecure_http is False
    # Only the bundled scheduler: its client certificate's CN and its profile name.
    scheduler_cfg, _ = scheduler_config(objs)
    assert ext.tls_client_names == ("flexlease-scheduler",)
    assert set(ext.scheduler_names) == {p["schedulerName"] for p in scheduler_cfg["profiles"]}
    (tls,) = [v for v in spec["volumes"] if v["name"] == "tls"]
    assert tls["secret"]["secretName"] == "flexlease-extender-tls"
    # Leader election on a Lease the extender's Role names.
    lease = settings.lease
    assert lease.leader_election is True
    role = find(objs, "Role", "flexlease-extender-leader-election", lease.leader_lease_namespace)
    assert any(lease.leader_lease_name in r.get("resourceNames", []) for r in role["rules"])
    assert spec["securityContext"]["runAsNonRoot"] is True


def test_agents_run_on_gpu_nodes_only() -> None:
    spec = pod_spec(base(), "DaemonSet", "flexlease-agent")
    # GPU nodes moved off NVIDIA's device plugin: the agent's plugin serves nvidia.com/gpu there
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true", keys.LABEL_NODE_DEVICE_PLUGIN: "true"}
    # the kubelet sockets the device plugin and the PodResources read-back use
    settings = AgentSettings()
    (container,) = spec["containers"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v.get("hostPath", {}).get("path") for v in spec["volumes"]}
    for path in (settings.device_plugin_dir, settings.pod_resources_socket.parent):
        assert volumes[mounts[str(path)]] == str(path)
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_pod_monitors_scrape_ports_the_network_policies_open_to_monitoring() -> None:
    objs = render(OVERLAYS["overlays/prometheus-operator"])
    monitors = [o for o in objs if o["kind"] == "PodMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {"flexlease-agent", "flexlease-extender"}
    workloads = [o for o in objs if o["kind"] in {"Deployment", "DaemonSet"}]
    for monitor in monitors:
        (workload,) = [
            w
            for w in workloads
            if monitor["spec"]["selector"]["matchLabels"].items()
            <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        policy = find(objs, "NetworkPolicy", workload["metadata"]["name"], NAMESPACE)["spec"]
        monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        opened = {
            p["port"] for rule in policy["ingress"] if monitoring in rule["from"] for p in rule["ports"]
        }
        assert ports[endpoint["port"]] in opened


def test_scrape_annotations_name_the_metrics_ports() -> None:
    """For Prometheus without the operator (kubernetes_sd pod role and these annotations)."""
    objs = base()
    for kind, name in (("Deployment", "flexlease-extender"), ("DaemonSet", "flexlease-agent")):
        template = find(objs, kind, name, NAMESPACE)["spec"]["template"]
        (container,) = template["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        annotations = template["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert int(annotations["prometheus.io/port"]) == ports["metrics"]
