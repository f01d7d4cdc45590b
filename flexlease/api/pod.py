"""Reading a Pod (ordinary camelCase Kubernetes JSON) into a frozen :class:`GpuRequest`.

The pod is parsed once per scheduling cycle (kube-scheduler's PreFilter → CycleState
pattern): :class:`ParsedPods` remembers the last few pods parsed, so filter, prioritize
and bind of one cycle share one :class:`GpuRequest`. Pure; no I/O.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
from dataclasses import dataclass
from typing import Any, Final

import orjson

from flexlease.api import keys, quantity
from flexlease.api.resources import DeviceKey
from flexlease.api.tiers import Tier
from flexlease.errors import PodSpecError

_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class Priority(enum.StrEnum):
    """The paper's HP/LP classes (§3.5), from the ``flexlease.io/priority`` label."""

    HIGH = keys.PRIORITY_HIGH
    LOW = keys.PRIORITY_LOW


@dataclass(frozen=True, slots=True)
class Assignment:
    """The GPUs a pod holds: one node and device indices, from ``flexlease.io/assigned-gpus``.

    Wire format ``<node>:<idx>,<idx>`` (node names cannot contain ``:``), e.g. ``gpu-7:0,3``.
    ``devices`` is ``(node, index)`` for each index, in order (computed once).
    """

    node: str
    indices: tuple[int, ...]
    devices: tuple[DeviceKey, ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(DeviceKey(self.node, i) for i in self.indices))

    def format(self) -> str:
        return f"{self.node}:{','.join(map(str, self.indices))}"

    @staticmethod
    def parse(value: str) -> Assignment:
        """Parse ``<node>:<idx>[,<idx>...]``. Raises :class:`PodSpecError` when malformed.
        Memoised like :mod:`flexlease.api.quantity`'s parser (``functools.lru_cache``, the
        last 4,096 texts; errors are raised, not cached): the same text gives the same
        immutable object, and every watcher of a pod reads the same annotation."""
        return _parse_assignment(value)


@functools.lru_cache(maxsize=4096)
def _parse_assignment(value: str) -> Assignment:
    node, sep, rest = value.partition(":")
    if not sep or not node or not rest:
        raise PodSpecError(f"{keys.ANN_ASSIGNED_GPUS}={value!r}: expected '<node>:<idx>,<idx>'")
    try:
        indices = tuple(int(part) for part in rest.split(","))
    except ValueError as exc:
        raise PodSpecError(f"{keys.ANN_ASSIGNED_GPUS}={value!r}: indices must be integers") from exc
    if any(i < 0 for i in indices) or len(set(indices)) != len(indices):
        raise PodSpecError(f"{keys.ANN_ASSIGNED_GPUS}={value!r}: indices must be distinct and >= 0")
    return Assignment(node, indices)


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What one pod asks of flexlease, parsed once from its JSON.

    ``count`` is the number of managed GPUs (0 = not a GPU pod: it passes every filter;
    absurd requests are clamped to ``2**63`` and fit nowhere). ``owner`` is ``<ns>/<job>``
    or None when the pod has neither the owner label nor a controller. ``assignment`` is the
    pod's recorded ``assigned-gpus`` (None when it has none) — a claim, not a fact: whoever
    reads it checks it against the inventory. ``priority_value`` is ``spec.priority`` (0
    when unset) and ``preempts`` whether ``spec.preemptionPolicy`` lets the pod preempt
    (kube-scheduler only evicts pods of lower ``priority_value``). ``created`` is
    ``metadata.creationTimestamp`` (RFC 3339, empty when unset).
    """

    namespace: str
    name: str
    uid: str
    count: int
    priority: Priority
    owner: str | None
    required_tier: Tier
    gpu_type: str | None
    reclaim: bool
    checkpoint: str | None
    images: tuple[str, ...]
    node_name: str | None
    assignment: Assignment | None
    terminated: bool
    priority_value: int = 0
    preempts: bool = True
    created: str = ""

    @property
    def key(self) -> str:
        """``<namespace>/<name>``."""
        return f"{self.namespace}/{self.name}"


def _int_quantity(value: Any, where: str) -> int:
    """An extended-resource quantity (Kubernetes grammar, whole and non-negative; see
    :mod:`flexlease.api.quantity`), e.g. ``"2"``, ``"2k"`` (2,000) or ``"1000m"`` (1)."""
    try:
        return quantity.integer_quantity(value)
    except quantity.QuantityError as exc:
        raise PodSpecError(f"{where}: {exc}") from exc


def _container_gpus(container: Any, resource: str, where: str) -> int:
    if not isinstance(container, dict):
        raise PodSpecError(f"{where}: container must be an object")
    resources = container.get("resources") or {}
    if not isinstance(resources, dict):
        raise PodSpecError(f"{where}.resources must be an object")
    for field in ("limits", "requests"):  # limits win; requests alone also count
        values = resources.get(field) or {}
        if not isinstance(values, dict):
            raise PodSpecError(f"{where}.resources.{field} must be an object")
        if resource in values:
            return _int_quantity(values[resource], f"{where}.resources.{field}[{resource}]")
    return 0


def pod_gpu_count(pod: dict[str, Any], resource: str = keys.DEFAULT_GPU_RESOURCE) -> int:
    """Managed GPUs the pod needs, counted as kube-scheduler counts pod requests.

    ``max(largest regular init container + sidecars started before it,
    sum of app containers + sum of sidecars)`` where sidecars are init containers with
    ``restartPolicy: Always`` (k8s.io/component-helpers/resource PodRequests).
    Raises :class:`PodSpecError` on malformed containers or quantities.
    """
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise PodSpecError("pod.spec must be an object")
    containers = spec.get("containers") or []
    inits = spec.get("initContainers") or []
    if not isinstance(containers, list) or not isinstance(inits, list):
        raise PodSpecError("pod.spec.containers and initContainers must be lists")
    app = sum(_container_gpus(c, resource, f"spec.containers[{i}]") for i, c in enumerate(containers))
    sidecars = 0
    init_peak = 0
    for i, c in enumerate(inits):
        n = _container_gpus(c, resource, f"spec.initContainers[{i}]")
        if isinstance(c, dict) and c.get("restartPolicy") == "Always":
            sidecars += n
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, sidecars + n)
    return max(init_peak, app + sidecars)


def is_terminated(pod: dict[str, Any]) -> bool:
    """True when the pod's phase is Succeeded or Failed (it holds no devices any more)."""
    status = pod.get("status") or {}
    phase = status.get("phase") if isinstance(status, dict) else None
    return isinstance(phase, str) and phase in _TERMINAL_PHASES


_LABEL_VALUE: Final = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
"""A Kubernetes label value (``IsValidLabelValue``, apimachinery validation.go): at most 63
characters, alphanumerics, ``-``, ``_`` and ``.``, beginning and ending with an alphanumeric."""


def owner_from_label(value: str, namespace: str) -> str:
    """The job identity ``<ns>/<job>`` from a ``flexlease.io/owner`` label value ``<job>`` on a
    pod in ``namespace``. The label holds only the job name: a label value cannot hold ``/``
    (a real API server rejects the pod), and the pod's own namespace completes the identity,
    so a pod can never name another namespace's job (and claim its tagged GPUs).

    Raises :class:`PodSpecError` when ``value`` is not a valid Kubernetes label value
    (e.g. a hand-made ``other-ns/job`` written to a store that does not validate labels)."""
    if not value or not _LABEL_VALUE.fullmatch(value):
        raise PodSpecError(
            f"label {keys.LABEL_OWNER}={value!r}: expected the job's name, a valid label value "
            "(<= 63 characters of [A-Za-z0-9-_.], alphanumeric at both ends); the pod's namespace "
            "completes the owner"
        )
    return f"{namespace}/{value}"


def owner_label_value(owner: str) -> str:
    """The ``flexlease.io/owner`` label value (``<job>``) for the job identity ``<ns>/<job>``
    (a bare ``<job>`` is returned as is)."""
    return owner.rpartition("/")[2]


def default_owner(meta: dict[str, Any], namespace: str) -> str | None:
    """``<ns>/<controller name>`` from the controller ownerReference, or None. Raises
    :class:`PodSpecError` when ``ownerReferences`` is not a list of objects or a
    controller reference has no string name."""
    refs = meta.get("ownerReferences") or []
    if not isinstance(refs, list):
        raise PodSpecError("pod.metadata.ownerReferences must be a list")
    for i, ref in enumerate(refs):
        if not isinstance(ref, dict):
            raise PodSpecError(f"pod.metadata.ownerReferences[{i}] must be an object")
        if ref.get("controller") is True:
            name = ref.get("name")
            if not isinstance(name, str) or not name:
                raise PodSpecError(f"pod.metadata.ownerReferences[{i}].name must be a non-empty string")
            return f"{namespace}/{name}"
    return None


def _typed(obj: dict[str, Any], field: str, kind: type, where: str) -> Any:
    """``obj[field]`` when absent/null (None) or of JSON type ``kind`` (a bool is no
    ``int``); else :class:`PodSpecError` naming the field."""
    value = obj.get(field)
    if value is None or value.__class__ is kind:  # the usual case, decided without isinstance
        return value
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    raise PodSpecError(f"{where}.{field} must be {_JSON_NAMES.get(kind.__name__, kind.__name__)}")


_JSON_NAMES: Final = {"str": "a string", "int": "an integer", "dict": "an object", "list": "a list"}

_PRIORITIES: Final = {p.value: p for p in Priority}
_TIERS: Final = {t.value: t for t in Tier}


def _checked_values(where: str, values: dict[Any, Any]) -> None:
    """Raise :class:`PodSpecError` when a flexlease label/annotation value is not a string."""
    for k, v in values.items():
        if v.__class__ is not str and str(k).startswith(keys.PREFIX) and not isinstance(v, str):
            raise PodSpecError(f"{where} {k}: value must be a string, got {type(v).__name__}")


def parse_pod(pod: dict[str, Any], resource: str = keys.DEFAULT_GPU_RESOURCE) -> GpuRequest:
    """Parse a Pod JSON object into a :class:`GpuRequest`.

    Raises :class:`PodSpecError` (a :class:`RequestError`) when the pod is not an object,
    lacks ``metadata.name``, or carries a malformed flexlease label/annotation or GPU quantity.
    """
    if not isinstance(pod, dict):
        raise PodSpecError("pod must be a JSON object")
    meta = pod.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise PodSpecError("pod.metadata.name is required")
    namespace = _typed(meta, "namespace", str, "pod.metadata") or "default"
    uid = _typed(meta, "uid", str, "pod.metadata") or ""
    created = _typed(meta, "creationTimestamp", str, "pod.metadata") or ""
    labels = _typed(meta, "labels", dict, "pod.metadata") or {}
    annotations = _typed(meta, "annotations", dict, "pod.metadata") or {}
    _checked_values("label", labels)
    _checked_values("annotation", annotations)

    raw_priority = labels.get(keys.LABEL_PRIORITY, keys.PRIORITY_LOW)  # a string (checked above)
    priority = _PRIORITIES.get(raw_priority)
    if priority is None:
        raise PodSpecError(f"label {keys.LABEL_PRIORITY}={raw_priority!r}: expected 'high' or 'low'")

    raw_tier = annotations.get(keys.ANN_RELIABILITY, Tier.LA.value)
    tier = _TIERS.get(raw_tier)
    if tier is None:
        raise PodSpecError(f"annotation {keys.ANN_RELIABILITY}={raw_tier!r}: expected HA, MA or LA")

    raw_reclaim = annotations.get(keys.ANN_RECLAIM, "false")
    if raw_reclaim not in ("true", "false"):
        raise PodSpecError(f"annotation {keys.ANN_RECLAIM}={raw_reclaim!r}: expected 'true' or 'false'")

    raw_owner = labels.get(keys.LABEL_OWNER)
    if raw_owner is not None and not isinstance(raw_owner, str):
        raise PodSpecError(f"label {keys.LABEL_OWNER} must be a string")
    owner = owner_from_label(raw_owner, namespace) if raw_owner else default_owner(meta, namespace)

    assignment = None
    if keys.ANN_ASSIGNED_GPUS in annotations:
        assignment = Assignment.parse(annotations[keys.ANN_ASSIGNED_GPUS])

    spec = _typed(pod, "spec", dict, "pod") or {}
    _typed(pod, "status", dict, "pod")
    node_name = _typed(spec, "nodeName", str, "pod.spec")
    priority_value = _typed(spec, "priority", int, "pod.spec") or 0
    policy = _typed(spec, "preemptionPolicy", str, "pod.spec")
    count = pod_gpu_count(pod, resource)  # checks spec.containers / initContainers first
    images = tuple(
        c["image"]
        for i, c in enumerate(spec.get("containers") or [])
        if isinstance(c, dict) and _typed(c, "image", str, f"pod.spec.containers[{i}]")
    )
    return GpuRequest(
        namespace=namespace,
        name=meta["name"],
        uid=uid,
        count=count,
        priority=priority,
        owner=owner,
        required_tier=tier,
        gpu_type=annotations.get(keys.ANN_GPU_TYPE) or None,
        reclaim=raw_reclaim == "true",
        checkpoint=annotations.get(keys.ANN_CHECKPOINT) or None,
        images=images,
        node_name=node_name or None,
        assignment=assignment,
        terminated=is_terminated(pod),
        priority_value=priority_value,
        preempts=policy != "Never",
        created=created,
    )


def salvage_assignment(pod: Any) -> Assignment | None:
    """The GPUs a pod holds even when its other flexlease fields are malformed: its
    ``assigned-gpus`` when well-formed and the pod is not terminated, else None. Never
    raises. Callers keep such a pod as a holder (conservatively: high priority, never a
    victim), so a typo in a label never frees GPUs that are in use."""
    if not isinstance(pod, dict):
        return None
    if is_terminated(pod):
        return None
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    raw = annotations.get(keys.ANN_ASSIGNED_GPUS) if isinstance(annotations, dict) else None
    if not isinstance(raw, str):
        return None
    try:
        return Assignment.parse(raw)
    except PodSpecError:
        return None


class ParsedPods:
    """:func:`parse_pod` for ``resource``, remembering the last ``size`` pods parsed.

    Kube-scheduler sends one pod to filter and prioritize, and the binder may read the same
    version back from the API server: each would parse it again. (The extender answers pods
    its Pod watch holds at the same version from the watch's parse instead:
    ``extender.state.Inventory.pending_request``; this cache serves the others and the reads.)
    An entry is keyed by the pod's ``metadata.uid`` and ``metadata.resourceVersion`` (which the
    API server changes on
    every write) and is used only when the pod is also the same JSON value, compared as
    its compact JSON encoding (so ``1``, ``1.0`` and ``true`` stay different): a pod that
    differs in anything gets its own parse, and errors are never cached (each bad pod is
    answered as :func:`parse_pod` answers it). Pods without uid or resourceVersion, or
    whose encoding would not read back equal (non-finite floats), are parsed every time.
    Pods must be decoded JSON (dicts, lists, strings, numbers, booleans, None), as every
    caller's are: request bodies, store reads and watch events.
    """

    def __init__(self, resource: str = keys.DEFAULT_GPU_RESOURCE, *, size: int = 64) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self.resource = resource
        self._size = size
        self._entries: dict[tuple[str, str], tuple[bytes, GpuRequest]] = {}
        self.hits = 0
        self.misses = 0

    def clear(self) -> None:
        """Forget every pod parsed (counters are kept)."""
        self._entries.clear()

    def parse(self, pod: dict[str, Any]) -> GpuRequest:
        """``parse_pod(pod, resource)``; raises what it raises."""
        key = _version_key(pod)
        if key is None:
            return parse_pod(pod, self.resource)
        try:
            encoded = orjson.dumps(pod)
        except TypeError:  # integers beyond 64 bits, non-string keys: parse as they come
            return parse_pod(pod, self.resource)
        entry = self._entries.get(key)
        if entry is not None and entry[0] == encoded:
            self.hits += 1
            return entry[1]
        self.misses += 1
        req = parse_pod(pod, self.resource)
        # NaN or infinity encode as null (then not cached); without a null, it reads back equal
        if b"null" not in encoded or orjson.loads(encoded) == pod:
            self._entries.pop(key, None)
            self._entries[key] = (encoded, req)
            if len(self._entries) > self._size:
                del self._entries[next(iter(self._entries))]
        return req


def _version_key(pod: Any) -> tuple[str, str] | None:
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    if not isinstance(meta, dict):
        return None
    uid, rv = meta.get("uid"), meta.get("resourceVersion")
    if isinstance(uid, str) and uid and isinstance(rv, str) and rv:
        return uid, rv
    return None
