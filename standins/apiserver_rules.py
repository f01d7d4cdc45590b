"""The API server's object rules that the stand-in in :mod:`standins.apiserver` applies.

Each function mirrors one piece of kube-apiserver or a controller, named in its docstring:
resource table, label/field selectors (k8s.io/apimachinery ``labels``/``fields``), JSON merge
patch (RFC 7386), Pod defaulting and the Pod update rule (pkg/apis/core/validation),
QoS class, managedFields bookkeeping, and the disruption controller's PodDisruptionBudget
status (pkg/controller/disruption). Pure functions over JSON dicts.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

JsonObj = dict[str, Any]


class ApiError(Exception):
    """An API error answered as a ``metav1.Status``."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: JsonObj | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.retry_after = retry_after

    def status(self) -> JsonObj:
        out: JsonObj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            out["details"] = self.details
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiResource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: frozenset[str]
    field_labels: frozenset[str]
    builtin: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``pods`` or ``gpunodes.flexlease.io`` — how errors name the resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


_META_FIELDS = frozenset({"metadata.name", "metadata.namespace"})
_POD_FIELDS = _META_FIELDS | {
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
}
_EVENT_FIELDS = _META_FIELDS | {
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
}

API_RESOURCES: tuple[ApiResource, ...] = (
    ApiResource(
        group="",
        version="v1",
        plural="pods",
        kind="Pod",
        namespaced=True,
        subresources=frozenset({"status", "binding", "eviction"}),
        field_labels=_POD_FIELDS,
        builtin=True,
    ),
    ApiResource(
        group="",
        version="v1",
        plural="events",
        kind="Event",
        namespaced=True,
        subresources=frozenset(),
        field_labels=_EVENT_FIELDS,
        builtin=True,
    ),
    ApiResource(
        group="coordination.k8s.io",
        version="v1",
        plural="leases",
        kind="Lease",
        namespaced=True,
        subresources=frozenset(),
        field_labels=_META_FIELDS,
        builtin=True,
    ),
    ApiResource(
        group="policy",
        version="v1",
        plural="poddisruptionbudgets",
        kind="PodDisruptionBudget",
        namespaced=True,
        subresources=frozenset({"status"}),
        field_labels=_META_FIELDS,
        builtin=True,
    ),
    ApiResource(
        group="",
        version="v1",
        plural="nodes",
        kind="Node",
        namespaced=False,
        subresources=frozenset({"status"}),
        field_labels=_META_FIELDS,
        builtin=True,
    ),
    ApiResource(
        group="apps",
        version="v1",
        plural="statefulsets",
        kind="StatefulSet",
        namespaced=True,
        subresources=frozenset({"status"}),
        field_labels=_META_FIELDS,
        builtin=True,
    ),
    # other operators' custom resources (no CRD schema here: stored as sent, as with
    # x-kubernetes-preserve-unknown-fields; items carry kind/apiVersion like every CR)
    ApiResource(
        group="kubeflow.org",
        version="v1",
        plural="pytorchjobs",
        kind="PyTorchJob",
        namespaced=True,
        subresources=frozenset({"status"}),
        field_labels=_META_FIELDS,
        builtin=False,
    ),
    ApiResource(
        group="kubeflow.org",
        version="v1",
        plural="mpijobs",
        kind="MPIJob",
        namespaced=True,
        subresources=frozenset({"status"}),
        field_labels=_META_FIELDS,
        builtin=False,
    ),
    ApiResource(
        group="ray.io",
        version="v1",
        plural="rayclusters",
        kind="RayCluster",
        namespaced=True,
        subresources=frozenset({"status"}),
        field_labels=_META_FIELDS,
        builtin=False,
    ),
    ApiResource(
        group="flexlease.io",
        version="v1alpha1",
        plural="gpunodes",
        kind="GPUNode",
        namespaced=False,
        subresources=frozenset({"status"}),
        field_labels=_META_FIELDS,
        builtin=False,
    ),
    ApiResource(
        group="flexlease.io",
        version="v1alpha1",
        plural="gpuleases",
        kind="GPULease",
        namespaced=True,
        subresources=frozenset({"status"}),
        field_labels=_META_FIELDS,
        builtin=False,
    ),
    ApiResource(
        group="flexlease.io",
        version="v1alpha1",
        plural="gpuleasepolicies",
        kind="GPULeasePolicy",
        namespaced=True,
        subresources=frozenset({"status"}),
        field_labels=_META_FIELDS,
        builtin=False,
    ),
)


def now_rfc3339() -> str:
    """metav1.Time: RFC 3339, seconds, UTC."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- selectors (k8s.io/apimachinery/pkg/labels and pkg/fields) ------------------------------


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            cur.append(text[i : i + 2])
            i += 2
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    if cur:
        parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


_SET_RE = re.compile(r"^([^\s!=()]+)\s+(in|notin)\s+\(([^)]*)\)$")


def parse_label_selector(text: str) -> list[tuple[str, str, frozenset[str]]]:
    """``labelSelector`` → requirements ``(key, op, values)``; ops ``=``, ``!=``, ``in``,
    ``notin``, ``exists``, ``!``. Raises ``ApiError`` 400 when malformed."""
    reqs: list[tuple[str, str, frozenset[str]]] = []
    for part in _split_top(text):
        m = _SET_RE.match(part)
        if m:
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append((m.group(1), m.group(2), values))
        elif "!=" in part:
            k, v = part.split("!=", 1)
            reqs.append((k.strip(), "!=", frozenset({v.strip()})))
        elif "=" in part:
            k, v = part.split("==", 1) if "==" in part else part.split("=", 1)
            reqs.append((k.strip(), "=", frozenset({v.strip()})))
        elif part.startswith("!"):
            reqs.append((part[1:].strip(), "!", frozenset()))
        elif re.fullmatch(r"[A-Za-z0-9./_-]+", part):
            reqs.append((part, "exists", frozenset()))
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {part!r}")
    return reqs


def labels_match(reqs: list[tuple[str, str, frozenset[str]]], labels: dict[str, str]) -> bool:
    for key, op, values in reqs:
        present = key in labels
        value = labels.get(key)
        if op in ("=", "in") and (not present or value not in values):
            return False
        if op in ("!=", "notin") and present and value in values:
            return False
        if op == "exists" and not present:
            return False
        if op == "!" and present:
            return False
    return True


def _unescape_field(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def parse_field_selector(text: str, res: ApiResource) -> list[tuple[str, bool, str]]:
    """``fieldSelector`` → ``(path, equal, value)``. Only the resource's field labels are
    accepted (400 ``field label not supported: <path>``), as the API server does."""
    out: list[tuple[str, bool, str]] = []
    for part in _split_top(text):
        m = re.match(r"^([^!=]+)(==|=|!=)(.*)$", part, re.S)
        if not m:
            raise ApiError(400, "BadRequest", f"invalid field selector: {part!r}")
        path = m.group(1).strip()
        if path not in res.field_labels:
            raise ApiError(400, "BadRequest", f'"{path}" is not a known field selector: only "{res.plural}"')
        out.append((path, m.group(2) != "!=", _unescape_field(m.group(3))))
    return out


def fields_match(reqs: list[tuple[str, bool, str]], obj: JsonObj) -> bool:
    for path, equal, want in reqs:
        cur: Any = obj
        for part in path.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        have = "" if cur is None else (str(cur).lower() if isinstance(cur, bool) else str(cur))
        if (have == want) != equal:
            return False
    return True


def label_selector_object_matches(selector: JsonObj | None, labels: dict[str, str]) -> bool:
    """metav1.LabelSelector (``matchLabels`` + ``matchExpressions``); an empty selector
    matches everything (policy/v1 PodDisruptionBudget semantics)."""
    if not selector:
        return True
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), set(expr.get("values") or [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


# -- JSON merge patch (RFC 7386) ----------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# -- metadata --------------------------------------------------------------------------------

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def validate_meta(kind: str, meta: JsonObj) -> None:
    """Decoding and validation of ObjectMeta: name is a DNS-1123 subdomain; labels and
    annotations are string maps (a non-string is a decode error, 400)."""
    for section in ("labels", "annotations"):
        values = meta.get(section)
        if values is None:
            continue
        if not isinstance(values, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in values.items()
        ):
            raise ApiError(
                400,
                "BadRequest",
                f"json: cannot unmarshal into Go struct field ObjectMeta.metadata.{section} "
                "of type map[string]string",
            )
    name = meta.get("name") or ""
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise ApiError(
            422,
            "Invalid",
            f'{kind} "{name}" is invalid: metadata.name: Invalid value: "{name}": a lowercase RFC 1123 '
            "subdomain must consist of lower case alphanumeric characters, '-' or '.'",
            details={
                "name": name,
                "kind": kind,
                "causes": [{"reason": "FieldValueInvalid", "field": "metadata.name"}],
            },
        )


def fields_v1(body: Any) -> Any:
    """A FieldsV1 set (``f:<field>`` keys) naming the fields ``body`` sets — the shape
    kube-apiserver records in ``managedFields``; lists are recorded as whole fields."""
    if not isinstance(body, dict):
        return {}
    return {
        f"f:{k}": fields_v1(v) for k, v in body.items() if k not in ("apiVersion", "kind") and v is not None
    }


def record_manager(
    obj: JsonObj, *, manager: str, operation: str, api_version: str, body: JsonObj, subresource: str | None
) -> None:
    """Add or refresh ``body``'s fields in the manager's ``managedFields`` entry."""
    meta = obj.setdefault("metadata", {})
    entries: list[JsonObj] = meta.setdefault("managedFields", [])
    owned = fields_v1({k: v for k, v in body.items() if k != "metadata"} | {"metadata": _owned_meta(body)})
    for entry in entries:
        if (
            entry.get("manager") == manager
            and entry.get("operation") == operation
            and entry.get("subresource") == subresource
        ):
            entry["time"] = now_rfc3339()
            entry["fieldsV1"] = merge_patch(entry.get("fieldsV1") or {}, owned)
            return
    entry = {
        "manager": manager,
        "operation": operation,
        "apiVersion": api_version,
        "time": now_rfc3339(),
        "fieldsType": "FieldsV1",
        "fieldsV1": owned,
    }
    if subresource:
        entry["subresource"] = subresource
    entries.append(entry)


def _owned_meta(body: JsonObj) -> JsonObj:
    meta = body.get("metadata") or {}
    return {k: v for k, v in meta.items() if k in ("labels", "annotations", "ownerReferences", "finalizers")}


# -- Pods ----------------------------------------------------------------------------------


def _image_pull_policy(image: str) -> str:
    last = image.rsplit("/", 1)[-1]
    if "@" in last:
        return "IfNotPresent"
    tag = last.split(":", 1)[1] if ":" in last else "latest"
    return "Always" if tag == "latest" else "IfNotPresent"


def _default_container(c: JsonObj) -> None:
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    if c.get("image"):
        c.setdefault("imagePullPolicy", _image_pull_policy(str(c["image"])))
    resources = c.setdefault("resources", {})
    limits = resources.get("limits") or {}
    if limits:  # pkg/apis/core/v1/defaults.go: requests default to limits
        requests = resources.setdefault("requests", {})
        for name, qty in limits.items():
            requests.setdefault(name, qty)


def default_pod(pod: JsonObj) -> None:
    """SetDefaults_Pod/PodSpec/Container, DefaultTolerationSeconds and ServiceAccount
    admission, as a Pod POSTed to a stock cluster comes back."""
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("priority", 0)
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    tolerations = spec.setdefault("tolerations", [])
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(t.get("key") == key for t in tolerations):
            tolerations.append(
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            )
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        if isinstance(c, dict):
            _default_container(c)


def validate_pod(pod: JsonObj) -> None:
    name = pod["metadata"].get("name", "")
    containers = (pod.get("spec") or {}).get("containers")
    if not isinstance(containers, list) or not containers:
        raise ApiError(
            422,
            "Invalid",
            f'Pod "{name}" is invalid: spec.containers: Required value',
            details={
                "name": name,
                "kind": "Pod",
                "causes": [{"reason": "FieldValueRequired", "field": "spec.containers"}],
            },
        )
    for i, c in enumerate(containers):
        if not isinstance(c, dict) or not c.get("name") or not c.get("image"):
            raise ApiError(
                422, "Invalid", f'Pod "{name}" is invalid: spec.containers[{i}]: name and image are required'
            )


def qos_class(pod: JsonObj) -> str:
    """pkg/apis/core/helper/qos.GetPodQOS over cpu and memory."""
    containers = (pod.get("spec") or {}).get("containers") or []
    requests_any = False
    guaranteed = True
    for c in containers:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        for r in ("cpu", "memory"):
            if r in req or r in lim:
                requests_any = True
            if r not in lim or (r in req and req[r] != lim[r]):
                guaranteed = False
    if not requests_any:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _mask_pod_spec(spec: JsonObj) -> JsonObj:
    masked = copy.deepcopy(spec)
    for field in ("activeDeadlineSeconds", "tolerations", "schedulingGates", "terminationGracePeriodSeconds"):
        masked.pop(field, None)
    for group in ("containers", "initContainers"):
        for c in masked.get(group) or []:
            if isinstance(c, dict):
                c.pop("image", None)
    return masked


def check_pod_update(old: JsonObj, new: JsonObj) -> None:
    """ValidatePodUpdate: only images, activeDeadlineSeconds, tolerations (additions),
    schedulingGates and terminationGracePeriodSeconds may change in a Pod's spec."""
    if _mask_pod_spec(old.get("spec") or {}) != _mask_pod_spec(new.get("spec") or {}):
        name = old["metadata"]["name"]
        raise ApiError(
            422,
            "Invalid",
            f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not change fields other than '
            "`spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
            "`spec.tolerations` (only additions to existing tolerations),"
            "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
            details={
                "name": name,
                "kind": "Pod",
                "causes": [{"reason": "FieldValueForbidden", "field": "spec"}],
            },
        )


def pod_ready(pod: JsonObj) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def pod_ignores_pdb(pod: JsonObj) -> bool:
    """pkg/registry/core/pod/storage/eviction.go canIgnorePDB: terminal, pending or
    already-terminating pods are evicted without consulting budgets."""
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed", "Pending") or bool(pod["metadata"].get("deletionTimestamp"))


# -- PodDisruptionBudget (pkg/controller/disruption) ---------------------------------------


def _scaled(value: Any, total: int, *, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        share = total * int(value[:-1]) / 100
        return math.ceil(share) if round_up else math.floor(share)
    return int(value)


def pdb_status(pdb: JsonObj, pods: list[JsonObj]) -> JsonObj:
    """The disruption controller's status for ``pdb`` over its (non-terminating) pods:
    expectedPods, currentHealthy (Ready), desiredHealthy from minAvailable or
    maxUnavailable (percentages against expectedPods), disruptionsAllowed."""
    spec = pdb.get("spec") or {}
    expected = len(pods)
    healthy = sum(1 for p in pods if pod_ready(p))
    if "minAvailable" in spec:
        desired = _scaled(spec["minAvailable"], expected, round_up=True)
    elif "maxUnavailable" in spec:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected, round_up=True))
    else:
        desired = expected
    old = pdb.get("status") or {}
    allowed = healthy > desired
    old_cond = (old.get("conditions") or [{}])[0]
    status: JsonObj = {
        "observedGeneration": pdb["metadata"].get("generation", 1),
        "disruptionsAllowed": max(0, healthy - desired),
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": [
            {
                "type": "DisruptionAllowed",
                "status": "True" if allowed else "False",
                "reason": "SufficientPods" if allowed else "InsufficientPods",
                "message": "",
                "observedGeneration": pdb["metadata"].get("generation", 1),
                "lastTransitionTime": (
                    old_cond.get("lastTransitionTime")
                    if old_cond.get("status") == ("True" if allowed else "False")
                    else now_rfc3339()
                ),
            }
        ],
    }
    if old.get("disruptedPods"):
        status["disruptedPods"] = old["disruptedPods"]
    return status
