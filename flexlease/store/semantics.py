"""What the Kubernetes API server does to an object on each verb, as pure functions.

Shared by :mod:`flexlease.store.memory` and :mod:`flexlease.store.sqlite`, so both give the
same answers as :mod:`flexlease.store.kube` does against a real API server. No I/O, no
asyncio; the stores own revisions, locking and persistence. Sources (kubernetes/kubernetes):
``staging/src/k8s.io/apiextensions-apiserver/pkg/registry/customresource/strategy.go``
(create drops ``status``; the ``status`` subresource), ``pkg/registry/core/pod/strategy.go``
(pods start ``Pending``), ``pkg/registry/core/pod/storage/storage.go`` (``BindingREST``),
``pkg/registry/core/pod/storage/eviction.go`` (``canIgnorePDB``, one PDB at most),
``staging/src/k8s.io/apiserver/pkg/registry/rest/delete.go`` (``BeforeDelete``: graceful
deletion) with the pod strategy's ``CheckGracefulDelete`` (``pkg/registry/core/pod/strategy.go``),
``staging/src/k8s.io/apiserver/pkg/storage/cacher`` (selector transitions in watches).
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import orjson

from flexlease.api import keys
from flexlease.clock import format_time
from flexlease.errors import Conflict, StoreError, TooManyRequests
from flexlease.store.base import EventType, JsonObj, Kind, Selector, WatchEvent
from flexlease.store.merge import merge_patch

API_VERSIONS: Final[Mapping[Kind, str]] = {
    Kind.POD: "v1",
    Kind.GPUNODE: keys.API_VERSION,
    Kind.GPULEASE: keys.API_VERSION,
    Kind.GPULEASEPOLICY: keys.API_VERSION,
    Kind.EVENT: "v1",
    Kind.LEASE: "coordination.k8s.io/v1",
    Kind.PDB: "policy/v1",
    Kind.NODE: "v1",
    Kind.STATEFULSET: "apps/v1",
    Kind.PYTORCHJOB: "kubeflow.org/v1",
    Kind.MPIJOB: "kubeflow.org/v1",
    Kind.RAYCLUSTER: "ray.io/v1",
}
"""``apiVersion`` of each kind, set on create."""

STATUS_SUBRESOURCE: Final = frozenset(
    {
        Kind.POD,
        Kind.GPUNODE,
        Kind.GPULEASE,
        Kind.GPULEASEPOLICY,
        Kind.NODE,
        Kind.STATEFULSET,
        Kind.PYTORCHJOB,  # +kubebuilder:subresource:status in training-operator's types
        Kind.MPIJOB,
        Kind.RAYCLUSTER,  # and in kuberay's
    }
)
"""Kinds whose ``status`` only the ``status`` subresource writes (create drops it)."""

FIRST_REVISION: Final = 1
"""A fresh store is at revision 1 (as etcd); the first write gets 2. ``"0"`` is never a
store's revision, so it keeps its Kubernetes meaning in ``watch`` ("any": start from now)."""

# metadata the server owns: restored after every patch
_SERVER_META: Final = (
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "resourceVersion",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)
# pkg/apis/core/validation ValidatePodUpdate: top-level spec fields an update may change
_POD_SPEC_MUTABLE: Final = frozenset({"activeDeadlineSeconds", "tolerations", "schedulingGates"})
# k8s.io/apiserver/pkg/storage/names: SimpleNameGenerator's alphabet and length
_NAME_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"
_NAME_SUFFIX_LEN: Final = 5

ObjectKey = tuple[str, str]
"""(namespace, name); namespace is ``""`` for cluster-scoped kinds."""


def encode(kind: Kind, obj: JsonObj) -> str:
    """Compact JSON text of ``obj``. Raises ``StoreError`` (400) when it is not JSON (a
    value of another type, NaN or infinity). See :func:`encode_copy`."""
    return encode_copy(kind, obj)[0]


def encode_copy(kind: Kind, obj: JsonObj) -> tuple[str, JsonObj]:
    """Compact JSON text of ``obj`` and a fresh copy decoded from it (what :func:`decode`
    of the text returns). Raises ``StoreError`` (400) when it is not JSON (a value of another
    type, NaN or infinity) or holds an integer beyond 64 bits.

    orjson encodes first (several times faster than :mod:`json`); an object it refuses or
    does not read back equal (NaN and infinity become ``null``, tuples lists, datetimes
    strings; non-``str`` keys are refused) goes through ``json.dumps(allow_nan=False)``, so
    what is accepted, and how, is :mod:`json`'s. Its text must read back the same through
    :func:`decode`: orjson reads an integer beyond 64 bits as a float, so such a number is
    refused (the Kubernetes API server does not keep it as an integer either)."""
    try:
        raw = orjson.dumps(obj)
    except TypeError:
        pass
    else:
        copy: JsonObj = orjson.loads(raw)
        if copy == obj:
            return raw.decode(), copy
    try:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise bad_request(f"{kind}: object is not JSON: {exc}") from exc
    copy = decode(text)
    if json.dumps(copy, separators=(",", ":")) != text:  # 2**64 == float(2**64): compare texts
        raise bad_request(f"{kind}: object holds an integer beyond 64 bits")
    return text, copy


def decode(text: str) -> JsonObj:
    """A fresh dict from stored JSON text (orjson; :mod:`json` for what orjson refuses, such
    as a lone surrogate escape)."""
    try:
        obj: JsonObj = orjson.loads(text)
    except orjson.JSONDecodeError:
        obj = json.loads(text)
    return obj


def now_rfc3339() -> str:
    """Current UTC time as Kubernetes writes ``metav1.Time``: ``2026-01-02T15:04:05Z``."""
    return format_time(datetime.now(UTC))


def bad_request(message: str) -> StoreError:
    """A 400 ``StoreError`` (invalid object or argument)."""
    return StoreError(message, status=400)


def parse_revision(resource_version: str) -> int:
    """A resourceVersion this family of stores wrote (decimal integer) → int.
    Raises ``StoreError`` (400) for anything else."""
    try:
        rev = int(resource_version)
    except (TypeError, ValueError) as exc:
        raise bad_request(f"invalid resourceVersion {resource_version!r}") from exc
    if rev < 0:
        raise bad_request(f"invalid resourceVersion {resource_version!r}")
    return rev


def object_key(kind: Kind, name: str, namespace: str | None) -> ObjectKey:
    """Key of an object: namespaced kinds need ``namespace``; cluster-scoped kinds ignore it.
    Raises ``StoreError`` (400) on an empty name or a missing namespace."""
    if not name:
        raise bad_request(f"{kind}: name is required")
    if not kind.namespaced:
        return ("", name)
    if not namespace:
        raise bad_request(f"{kind} {name}: namespace is required")
    return (namespace, name)


def namespace_filter(kind: Kind, namespace: str | None) -> str | None:
    """The namespace list/watch filter on: None = all (always None for cluster-scoped kinds)."""
    return namespace if kind.namespaced and namespace else None


def _generated_name(prefix: str) -> str:
    return prefix + "".join(secrets.choice(_NAME_ALPHABET) for _ in range(_NAME_SUFFIX_LEN))


def prepare_create(
    kind: Kind, obj: JsonObj, *, uid: str | None = None, created: str | None = None
) -> tuple[ObjectKey, JsonObj]:
    """Validate ``obj`` for create and return its key and the object to store, without a
    resourceVersion (see :func:`stamp`).

    Sets ``apiVersion``, ``kind``, ``metadata.uid`` (``uid``, default a random UUID),
    ``creationTimestamp`` (``created``, default now), ``generation`` (1),
    a name from ``metadata.generateName`` when ``name`` is empty, and clears ``namespace`` for
    cluster-scoped kinds. For kinds in :data:`STATUS_SUBRESOURCE` ``status`` is dropped (Pods
    start with ``{"phase": "Pending"}``). Raises ``StoreError`` (400) on a non-object, a
    kind mismatch, a missing name/namespace, or a ``resourceVersion`` already set.
    """
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata", {}), dict):
        raise bad_request(f"{kind}: object and metadata must be JSON objects")
    if obj.get("kind", kind.value) != kind.value:
        raise bad_request(f"object of kind {obj.get('kind')!r} sent as {kind}")
    meta = dict(obj.get("metadata") or {})
    if meta.get("resourceVersion"):
        raise bad_request(f"{kind}: resourceVersion should not be set on objects to be created")
    name = meta.get("name") or ""
    if not name and meta.get("generateName"):
        name = _generated_name(str(meta["generateName"]))
    key = object_key(kind, str(name), meta.get("namespace"))
    meta["name"] = key[1]
    if kind.namespaced:
        meta["namespace"] = key[0]
    else:
        meta.pop("namespace", None)
    meta["uid"] = uid or str(uuid.uuid4())
    meta["creationTimestamp"] = created or now_rfc3339()
    meta["generation"] = 1
    out: JsonObj = {"apiVersion": API_VERSIONS[kind], "kind": kind.value}
    out.update((k, v) for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata"))
    out["metadata"] = meta
    if kind in STATUS_SUBRESOURCE:
        out.pop("status", None)
        if kind is Kind.POD:
            out["status"] = {"phase": "Pending"}
    return key, out


def stamp(obj: JsonObj, revision: int) -> JsonObj:
    """A copy of ``obj`` (top level and ``metadata`` only) with ``resourceVersion`` = revision."""
    out = dict(obj)
    meta = dict(out.get("metadata") or {})
    meta["resourceVersion"] = str(revision)
    out["metadata"] = meta
    return out


def check_precondition(current: JsonObj, patch: JsonObj, *, resource_version: str | None) -> None:
    """Optimistic-concurrency preconditions of a patch: the ``resource_version`` argument and,
    as the API server also honours them, ``metadata.resourceVersion``/``metadata.uid`` inside
    the patch. Raises ``Conflict`` when the object has moved on."""
    meta = current.get("metadata") or {}
    have_rv = str(meta.get("resourceVersion", ""))
    patch_meta = patch.get("metadata")
    if not isinstance(patch_meta, dict):
        patch_meta = {}
    for want in (resource_version, patch_meta.get("resourceVersion")):
        if want is not None and str(want) != have_rv:
            raise Conflict(
                f"the object has been modified (resourceVersion {have_rv}, precondition {want}); "
                "read it again and retry"
            )
    want_uid = patch_meta.get("uid")
    if want_uid is not None and want_uid != meta.get("uid"):
        raise Conflict(f"precondition failed: uid {want_uid}, object has {meta.get('uid')}")


def apply_patch(kind: Kind, current: JsonObj, patch: JsonObj, *, subresource: str | None) -> JsonObj:
    """The object after a JSON merge ``patch`` (without a new resourceVersion; equal to
    ``current`` when the patch changes nothing, in which case stores write nothing).

    ``subresource="status"`` applies only the patch's ``status``; otherwise a ``status`` in
    the patch is ignored for kinds in :data:`STATUS_SUBRESOURCE`. Server-owned metadata
    (name, namespace, uid, creationTimestamp, resourceVersion, generation), ``apiVersion``
    and ``kind`` cannot be changed; ``generation`` grows when anything outside ``metadata``
    and ``status`` changes. Raises ``StoreError`` (400) on a non-object patch or a name
    mismatch, (404) on an unknown subresource, (422) on a forbidden Pod spec change (see
    :func:`check_pod_update`). Call :func:`check_precondition` first.
    """
    if not isinstance(patch, dict):
        raise bad_request(f"{kind}: a merge patch must be a JSON object")
    meta = current.get("metadata") or {}
    patch_meta = patch.get("metadata")
    if isinstance(patch_meta, dict):
        for field in ("name", "namespace"):
            if patch_meta.get(field) not in (None, meta.get(field)):
                raise bad_request(f"{kind} {meta.get('name')}: metadata.{field} cannot be changed")
    if subresource == "status":
        effective: JsonObj = {"status": patch["status"]} if "status" in patch else {}
    elif subresource is None:
        effective = patch
        if kind in STATUS_SUBRESOURCE and "status" in patch:
            effective = {k: v for k, v in patch.items() if k != "status"}
    else:
        raise StoreError(f"{kind} has no subresource {subresource!r}", status=404)
    new: JsonObj = merge_patch(current, effective)
    new_meta = dict(new.get("metadata") or {})
    for field in _SERVER_META:
        if field in meta:
            new_meta[field] = meta[field]
        else:
            new_meta.pop(field, None)
    new["metadata"] = new_meta
    new["apiVersion"] = current.get("apiVersion", API_VERSIONS[kind])
    new["kind"] = current.get("kind", kind.value)
    if kind is Kind.POD:
        check_pod_update(current.get("spec"), new.get("spec"))
    if "generation" in meta and _body(new) != _body(current):
        new_meta["generation"] = int(meta["generation"]) + 1
    return new


def check_pod_update(old_spec: Any, new_spec: Any) -> None:
    """Pod spec immutability (``ValidatePodUpdate``): an update may change only container and
    init-container images, ``activeDeadlineSeconds``, ``schedulingGates`` and add
    tolerations; ``spec.nodeName`` is set only by a Binding. Raises ``StoreError`` (422)."""
    old_spec, new_spec = old_spec or {}, new_spec or {}
    if old_spec is new_spec or old_spec == new_spec:
        return
    if _pod_spec_fixed(old_spec) == _pod_spec_fixed(new_spec):
        old_tolerations = old_spec.get("tolerations") or []
        new_tolerations = new_spec.get("tolerations") or []
        if all(t in new_tolerations for t in old_tolerations):
            return
    raise StoreError(
        "Pod spec is invalid: Forbidden: pod updates may not change fields other than "
        "`spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, "
        "`spec.tolerations` (only additions to existing tolerations), `spec.schedulingGates`",
        status=422,
    )


def _pod_spec_fixed(spec: JsonObj) -> JsonObj:
    fixed = {
        k: v for k, v in spec.items() if k not in ("activeDeadlineSeconds", "tolerations", "schedulingGates")
    }
    for field in ("containers", "initContainers"):
        containers = fixed.get(field)
        if isinstance(containers, list):
            fixed[field] = [
                {k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c for c in containers
            ]
    return fixed


def _body(obj: JsonObj) -> JsonObj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def apply_bind(
    pod: JsonObj,
    *,
    uid: str | None,
    node: str,
    annotations: Mapping[str, str] | None = None,
    resource_version: str | None = None,
) -> JsonObj:
    """The pod after its Binding to ``node`` (without a new resourceVersion), as the API
    server's ``BindingREST`` writes it (``pkg/registry/core/pod/storage``): ``spec.nodeName``
    set, the Binding's ``annotations`` added to the pod's, ``status.nominatedNodeName``
    cleared (``ClearingNominatedNodeNameAfterBinding``, on by default since v1.34) and a
    ``PodScheduled=True`` condition. Raises ``Conflict`` when ``uid`` or ``resource_version``
    (the Binding's preconditions, checked before anything else) is given and differs, and,
    in the API server's order and words, when the pod is being deleted, is already assigned
    (to any node) or still has scheduling gates; ``StoreError`` (400) on an empty node name."""
    meta = pod.get("metadata") or {}
    name = meta.get("name")
    where = f"{meta.get('namespace')}/{name}"
    if not node:
        raise bad_request(f"binding of pod {where}: node name is required")
    if uid is not None and uid != meta.get("uid"):
        raise Conflict(f"binding of pod {where}: uid {uid} does not match the pod's {meta.get('uid')}")
    if resource_version and resource_version != meta.get("resourceVersion"):
        raise Conflict(
            f"Operation cannot be fulfilled on pods {name!r}: Precondition failed: ResourceVersion in "
            f"precondition: {resource_version}, ResourceVersion in object meta: {meta.get('resourceVersion')}"
        )
    spec = pod.get("spec") or {}
    if meta.get("deletionTimestamp"):
        raise Conflict(f"pod {name} is being deleted, cannot be assigned to a host")
    if spec.get("nodeName"):
        raise Conflict(f"pod {where} is already assigned to node {spec['nodeName']!r}")
    if spec.get("schedulingGates"):
        raise Conflict(f"pod {name} has non-empty .spec.schedulingGates")
    status = dict(pod.get("status") or {})
    status.pop("nominatedNodeName", None)
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
    conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()})
    status["conditions"] = conditions
    out = dict(pod)
    out["spec"] = {**spec, "nodeName": node}
    out["status"] = status
    if annotations:
        out["metadata"] = {**meta, "annotations": {**(meta.get("annotations") or {}), **annotations}}
    return out


DEFAULT_TERMINATION_GRACE_SECONDS: Final = 30
"""``spec.terminationGracePeriodSeconds`` when a pod does not set it
(``DefaultTerminationGracePeriodSeconds``)."""


def delete_pod(
    pod: JsonObj, *, grace_period_seconds: int | None, now: datetime | None = None
) -> JsonObj | None:
    """What a DELETE (or an eviction) does to ``pod``, as the API server's graceful deletion
    decides it: None = the pod is removed now; otherwise the pod to store, Terminating
    (``metadata.deletionTimestamp`` = now + grace, ``deletionGracePeriodSeconds`` = grace),
    or ``pod`` itself (same object) when nothing changes.

    Rules (``rest.BeforeDelete`` + ``podStrategy.CheckGracefulDelete``): the grace period
    defaults to ``spec.terminationGracePeriodSeconds`` (30); a pod that is not scheduled
    (no ``spec.nodeName``) or is terminal (``Succeeded``/``Failed``) goes at once; grace 0
    removes (it is how the kubelet confirms that the containers are gone, and a force
    delete); a negative grace period counts as 1 s; a pod already Terminating only has its
    grace period shortened, never lengthened."""
    spec = pod.get("spec") or {}
    grace = grace_period_seconds
    if grace is None:
        default = spec.get("terminationGracePeriodSeconds")
        grace = (
            int(default) if isinstance(default, int) and default >= 0 else DEFAULT_TERMINATION_GRACE_SECONDS
        )
    phase = (pod.get("status") or {}).get("phase")
    if not spec.get("nodeName") or phase in ("Succeeded", "Failed") or grace == 0:
        return None
    grace = max(grace, 1)
    meta = pod.get("metadata") or {}
    current = meta.get("deletionGracePeriodSeconds")
    if meta.get("deletionTimestamp") and isinstance(current, int) and current <= grace:
        return pod
    when = (now or datetime.now(UTC)) + timedelta(seconds=grace)
    out = dict(pod)
    out["metadata"] = {
        **meta,
        "deletionTimestamp": format_time(when),
        "deletionGracePeriodSeconds": grace,
    }
    return out


def is_terminating(obj: JsonObj) -> bool:
    """True when the object carries a ``metadata.deletionTimestamp`` (deletion requested,
    waiting for its grace period or the kubelet's confirmation)."""
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def label_selector_matches(selector: Any, labels: Mapping[str, str]) -> bool:
    """``metav1.LabelSelector`` semantics (``matchLabels`` and ``matchExpressions`` with In,
    NotIn, Exists, DoesNotExist). A missing (None) selector matches nothing; an empty one
    matches everything. Raises ``StoreError`` (400) on a malformed selector."""
    if selector is None:
        return False
    if not isinstance(selector, dict):
        raise bad_request(f"label selector must be an object, got {selector!r}")
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In":
            ok = key in labels and labels[key] in values
        elif op == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif op == "Exists":
            ok = key in labels
        elif op == "DoesNotExist":
            ok = key not in labels
        else:
            raise bad_request(f"label selector operator {op!r} is not one of In, NotIn, Exists, DoesNotExist")
        if not ok:
            return False
    return True


def eviction_budget(pod: JsonObj, pdbs: Iterable[JsonObj]) -> JsonObj | None:
    """The PodDisruptionBudget an eviction of ``pod`` must spend, or None when no budget
    applies (no PDB selects the pod, or the pod is Pending/Succeeded/Failed/being deleted,
    which the Eviction API lets go without a budget). ``pdbs``: the PDBs of the pod's
    namespace. Raises ``TooManyRequests`` when the budget has ``status.disruptionsAllowed``
    ≤ 0 (missing counts as 0), ``StoreError`` (500) when more than one PDB selects the pod
    (the Eviction API refuses that too)."""
    meta = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Pending", "Succeeded", "Failed") or meta.get("deletionTimestamp"):
        return None
    labels = meta.get("labels") or {}
    matching = [p for p in pdbs if label_selector_matches((p.get("spec") or {}).get("selector"), labels)]
    if not matching:
        return None
    if len(matching) > 1:
        raise StoreError(
            "This pod has more than one PodDisruptionBudget, "
            "which the eviction subresource does not support.",
            status=500,
        )
    pdb = matching[0]
    if int((pdb.get("status") or {}).get("disruptionsAllowed") or 0) <= 0:
        pdb_name = (pdb.get("metadata") or {}).get("name")
        raise TooManyRequests(
            f"Cannot evict pod {meta.get('namespace')}/{meta.get('name')} as it would violate "
            f"the pod's disruption budget {pdb_name}."
        )
    return pdb


def spend_budget(pdb: JsonObj, pod_name: str) -> JsonObj:
    """The PDB after one eviction (without a new resourceVersion): ``disruptionsAllowed``
    minus one and the pod recorded in ``status.disruptedPods`` (name → RFC 3339 time)."""
    status = dict(pdb.get("status") or {})
    status["disruptionsAllowed"] = int(status.get("disruptionsAllowed") or 0) - 1
    status["disruptedPods"] = {**(status.get("disruptedPods") or {}), pod_name: now_rfc3339()}
    return {**pdb, "status": status}


def with_revision(obj: JsonObj, revision: int) -> JsonObj:
    """``obj`` with ``metadata.resourceVersion`` = revision, modified in place (for freshly
    decoded copies only) and returned."""
    obj.setdefault("metadata", {})["resourceVersion"] = str(revision)
    return obj


def watch_transition(
    selector: Selector, change: EventType, *, obj: JsonObj, prev: JsonObj | None
) -> tuple[EventType, bool] | None:
    """What a watcher with ``selector`` sees of one stored change, as the API server's watch
    cache decides it: ``(type, use_prev)`` or None (nothing). ``change`` is ADDED, MODIFIED
    or DELETED (``obj`` = last state); ``prev`` is the state before a MODIFIED. An object
    that starts matching arrives ADDED; one that stops matching arrives DELETED carrying its
    previous state (``use_prev``; give it the change's resourceVersion)."""
    if not selector.labels and not selector.fields:
        return change, False
    now = selector.matches(obj)
    if change is not EventType.MODIFIED or prev is None:
        return (change, False) if now else None
    before = selector.matches(prev)
    if now:
        return (EventType.MODIFIED if before else EventType.ADDED), False
    return (EventType.DELETED, True) if before else None


def bookmark(kind: Kind, revision: int) -> WatchEvent:
    """A BOOKMARK event: only ``metadata.resourceVersion`` (as the API server sends it)."""
    return WatchEvent(
        EventType.BOOKMARK,
        {
            "apiVersion": API_VERSIONS[kind],
            "kind": kind.value,
            "metadata": {"resourceVersion": str(revision)},
        },
    )
