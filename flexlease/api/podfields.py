"""The fields of a Pod that flexlease reads from a request, with what Kubernetes allows in each.

Role: kube-scheduler embeds the whole ``v1.Pod`` in ``ExtenderArgs`` and
``ExtenderPreemptionArgs`` (and full victim pods in ``NodeNameToVictims``). The extender
reads a few of its fields (:func:`flexlease.api.pod.parse_pod`, the admission checks, the
critical-role check); :data:`RequestPod` and :data:`VictimPod` declare exactly those, each
constrained as the API server validates it (``ValidateObjectMeta``, ``ValidatePodSpec``):
the pod's name, namespace and UID, its owners' names, the ``flexlease.io/`` label values the
extender reads, the node and scheduler names (DNS-1123 subdomains), ``spec.priority``
(int32), ``spec.preemptionPolicy``, container images (no surrounding white space),
``creationTimestamp`` (RFC 3339) and the ``assigned-gpus`` claim (``<node>:<index>,...``).
:func:`check_pod` and :func:`check_victim` validate a decoded pod against them with a
pydantic ``TypeAdapter`` over ``TypedDict`` schemas, which looks up only these fields (the
rest of the pod is not walked) and matches patterns in pydantic-core's Rust regex engine
(≈ 2.5 µs a pod; ``msgspec.convert`` over the same fields took 6). They raise
:class:`flexlease.errors.PodSpecError` naming the field. Strings elsewhere in a request are
checked by the body decoder (valid Unicode: no lone surrogates), :mod:`extender.body`.

A pod that passes is not yet a valid flexlease request: :func:`flexlease.api.pod.parse_pod`
still checks the label and annotation values' meanings (``high``/``low``, tiers...).

Pure; no I/O. Neighbours: :mod:`flexlease.api.wire` (the request models' ``Pod`` fields) and
``extender.body`` (its fast decoder checks a pod before keeping it).
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, NotRequired

from pydantic import Field, StringConstraints, TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

from flexlease.api import keys, names
from flexlease.errors import PodSpecError

ANNOTATION_VALUE_MAX: Final = 256 * 1024
"""Characters in one annotation value, at most: the API server's limit on all of a pod's
annotations together (``TotalAnnotationSizeLimitB``, 256 KiB)."""

IMAGE: Final = names.Rule(
    r"\S(?:[\s\S]*\S)?",
    4096,
    "a container image name without leading or trailing white space",
    empty=True,
)
"""``ValidatePodSpec``: a container image has no leading or trailing white space."""
ASSIGNED_GPUS: Final = names.Rule(
    rf"(?:{names.DNS1123_SUBDOMAIN.pattern}):[0-9]{{1,9}}(?:,[0-9]{{1,9}})*",
    4096,
    f"'<node>:<index>[,<index>...]' ({keys.ANN_ASSIGNED_GPUS}), the node a lowercase RFC 1123 subdomain",
)
"""``flexlease.io/assigned-gpus``: a node name, then device indices."""
_RULES: Final = (*names.RULES, IMAGE, ASSIGNED_GPUS)

_AnnotationValue = Annotated[str, StringConstraints(max_length=ANNOTATION_VALUE_MAX)]
_Image = Annotated[str, StringConstraints(pattern=IMAGE.rust, max_length=IMAGE.max_length)]
_Assigned = Annotated[str, StringConstraints(pattern=ASSIGNED_GPUS.rust, max_length=ASSIGNED_GPUS.max_length)]
_Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
_LabelValue = names.LabelValueField

# The keys are spelled out (a TypedDict's keys must be literals for mypy); a test checks
# that they are flexlease.api.keys' constants.
Labels = TypedDict(
    "Labels",
    {
        "flexlease.io/priority": NotRequired[_LabelValue | None],
        "flexlease.io/owner": NotRequired[_LabelValue | None],
        "flexlease.io/role": NotRequired[_LabelValue | None],
        "flexlease.io/framework": NotRequired[_LabelValue | None],
    },
)
"""The ``flexlease.io/`` labels the extender reads (:data:`flexlease.api.keys.LABEL_PRIORITY`,
``LABEL_OWNER``, ``LABEL_ROLE``, ``LABEL_FRAMEWORK``): label values (their meanings are
checked by :func:`flexlease.api.pod.parse_pod`)."""

Annotations = TypedDict(
    "Annotations",
    {
        "flexlease.io/reliability": NotRequired[_AnnotationValue | None],
        "flexlease.io/gpu-type": NotRequired[_AnnotationValue | None],
        "flexlease.io/reclaim": NotRequired[_AnnotationValue | None],
        "flexlease.io/checkpoint": NotRequired[_AnnotationValue | None],
        "flexlease.io/assigned-gpus": NotRequired[_Assigned | None],
    },
)
"""The ``flexlease.io/`` annotations a request's pod brings to the extender
(:data:`flexlease.api.keys.ANN_RELIABILITY`, ``ANN_GPU_TYPE``, ``ANN_RECLAIM``,
``ANN_CHECKPOINT``, ``ANN_ASSIGNED_GPUS``)."""


class OwnerReference(TypedDict):
    """``metadata.ownerReferences[]``: the owning object's name (required, a DNS-1123
    subdomain) and whether it is the controller."""

    name: names.SubdomainField
    controller: NotRequired[bool | None]


class ObjectMeta(TypedDict):
    name: names.SubdomainField
    namespace: NotRequired[names.NamespaceField | None]
    uid: NotRequired[names.UidOrEmptyField | None]
    resourceVersion: NotRequired[Annotated[str, StringConstraints(max_length=128)] | None]
    creationTimestamp: NotRequired[names.TimestampField | None]
    labels: NotRequired[Labels | None]
    annotations: NotRequired[Annotations | None]
    ownerReferences: NotRequired[list[OwnerReference] | None]


class Container(TypedDict):
    image: NotRequired[_Image | None]


class PodSpec(TypedDict):
    nodeName: NotRequired[names.SubdomainOrEmptyField | None]
    schedulerName: NotRequired[names.SubdomainOrEmptyField | None]
    priority: NotRequired[_Int32 | None]
    preemptionPolicy: NotRequired[Literal["Never", "PreemptLowerPriority", ""] | None]
    containers: NotRequired[list[Container] | None]
    initContainers: NotRequired[list[Container] | None]


class RequestPod(TypedDict):
    """A pod in ``ExtenderArgs.Pod`` or ``ExtenderPreemptionArgs.Pod``: the fields read."""

    metadata: ObjectMeta
    spec: NotRequired[PodSpec | None]


class VictimMeta(TypedDict):
    uid: names.UidField
    labels: NotRequired[Labels | None]


class VictimPod(TypedDict):
    """A full victim pod (``NodeNameToVictims[].Pods[]``): its UID and role labels are read."""

    metadata: VictimMeta


_POD: Final = TypeAdapter(RequestPod)
_VICTIM: Final = TypeAdapter(VictimPod)


def _check(adapter: TypeAdapter[Any], pod: Any, where: str) -> None:
    try:
        adapter.validate_python(pod)
    except ValidationError as exc:
        problems = "; ".join(
            f"{location(where, e['loc'])}: {names.explain(e['msg'], _RULES)}"
            for e in exc.errors(include_url=False, include_input=False)[:3]
        )
        raise PodSpecError(problems) from exc


def location(root: str, loc: tuple[int | str, ...]) -> str:
    """A field's path for messages: ``root`` then each step, ``.name`` for a field,
    ``[3]`` for a list position, ``["flexlease.io/owner"]`` for a map key that is not a plain
    name (as ``kubectl`` shows label keys). ``root`` empty: the path starts at the first step."""
    out = root
    for step in loc:
        if isinstance(step, int):
            out += f"[{step}]"
        elif step.isidentifier():
            out += f".{step}" if out else step
        else:
            out += f"[{step!a}]".replace("'", '"')
    return out


def check_pod(pod: Any, *, where: str = "Pod") -> None:
    """Raise :class:`PodSpecError` naming the field (under ``where``) unless ``pod`` has the
    shape of :class:`RequestPod`, within Kubernetes' limits."""
    _check(_POD, pod, where)


def check_victim(pod: Any, *, where: str) -> None:
    """Raise :class:`PodSpecError` naming the field (under ``where``) unless ``pod`` has the
    shape of :class:`VictimPod`, within Kubernetes' limits."""
    _check(_VICTIM, pod, where)
