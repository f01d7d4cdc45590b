"""Wire types of ``k8s.io/kube-scheduler/extender/v1`` (types.go).

The Go structs have no JSON tags, so encoding/json writes the Go field names (PascalCase)
and decodes keys case-insensitively; these models do the same. Embedded ``v1.Pod`` and
``v1.NodeList`` values are ordinary camelCase Kubernetes JSON and are kept as raw dicts
(parse a pod with :func:`flexlease.api.pod.parse_pod`). Scores run
``MinExtenderPriority``..``MaxExtenderPriority`` = 0..10.

The request models (``ExtenderArgs``, ``ExtenderBindingArgs``, ``ExtenderPreemptionArgs``)
refuse what Kubernetes does not allow in what the extender reads (issue #37): node names
that are not DNS-1123 subdomains (:mod:`flexlease.api.names`), embedded pods whose read
fields break their rules (:mod:`flexlease.api.podfields`), UIDs, and PDB violation counts
outside int64. Their validation errors name the field.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Final, NotRequired

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

from flexlease.api import keys, names, podfields
from flexlease.errors import PodSpecError

INT64: Final = (-(2**63), 2**63 - 1)
"""Go's ``int64`` range (``NumPDBViolations``)."""


class WireModel(BaseModel):
    """Base: PascalCase aliases, case-insensitive keys on input, unknown keys ignored."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _fold_case(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        by_lower = _aliases_by_lower(cls)
        return {by_lower.get(k.lower(), k) if isinstance(k, str) else k: v for k, v in data.items()}

    def to_wire(self) -> dict[str, Any]:
        """JSON-ready dict with the Go field names, ``None`` as ``null`` (as Go writes nil)."""
        return self.model_dump(mode="json", by_alias=True)


@functools.cache
def _aliases_by_lower(cls: type[WireModel]) -> dict[str, str]:
    """``cls``'s Go field names by their lower-case form (encoding/json matches keys
    case-insensitively); computed once per model."""
    return {(field.alias or name).lower(): (field.alias or name) for name, field in cls.model_fields.items()}


def _pod_field(check: Any) -> Any:
    """An ``AfterValidator`` running ``check(pod, where="")`` (a :mod:`flexlease.api.podfields`
    check) and reporting its :class:`PodSpecError` as the field's validation error."""

    def validate(pod: dict[str, Any]) -> dict[str, Any]:
        try:
            check(pod, where="")
        except PodSpecError as exc:
            raise PydanticCustomError("pod_field", "{problem}", {"problem": str(exc)}) from None
        return pod

    return AfterValidator(validate)


_Pod = Annotated[dict[str, Any], _pod_field(podfields.check_pod)]
"""An embedded ``v1.Pod``, kept as a dict, whose read fields are checked."""
_VictimPod = Annotated[dict[str, Any], _pod_field(podfields.check_victim)]


class _NodeMeta(TypedDict):
    name: names.NodeNameField


class _NodeItem(TypedDict):
    metadata: _NodeMeta


class _NodeList(TypedDict):
    items: NotRequired[list[_NodeItem] | None]


_NODE_LIST: Final = TypeAdapter(_NodeList)


def _checked_nodes(nodes: dict[str, Any] | None) -> dict[str, Any] | None:
    """``Nodes`` (a ``v1.NodeList``, kept as a dict) when every item names a node as
    Kubernetes allows (``items[].metadata.name``, a DNS-1123 subdomain)."""
    if nodes is None:
        return None
    try:
        _NODE_LIST.validate_python(nodes)
    except ValidationError as exc:
        e = exc.errors(include_url=False, include_input=False)[0]
        problem = f"{podfields.location('', e['loc'])}: {names.explain(e['msg'])}"
        raise PydanticCustomError("node_list", "{problem}", {"problem": problem}) from None
    return nodes


class ExtenderArgs(WireModel):
    """Body of ``/filter`` and ``/prioritize``. With ``nodeCacheCapable: true``, ``Nodes`` is
    null and ``NodeNames`` holds the candidates."""

    pod: _Pod = Field(alias="Pod")
    nodes: Annotated[dict[str, Any] | None, AfterValidator(_checked_nodes)] = Field(
        default=None, alias="Nodes"
    )
    node_names: list[names.NodeNameField] | None = Field(default=None, alias="NodeNames")

    def candidate_names(self) -> list[str]:
        """Candidate node names: ``NodeNames`` or, when not cache-capable,
        ``Nodes.items[].metadata.name`` (checked when the model was validated)."""
        if self.node_names is not None:
            return list(self.node_names)
        return [node["metadata"]["name"] for node in (self.nodes or {}).get("items") or []]


class ExtenderFilterResult(WireModel):
    """Reply of ``/filter``. ``FailedNodes``: preemption may help; ``FailedAndUnresolvableNodes``:
    it cannot. ``Error`` fails the whole scheduling cycle."""

    nodes: dict[str, Any] | None = Field(default=None, alias="Nodes")
    node_names: list[str] | None = Field(default=None, alias="NodeNames")
    failed_nodes: dict[str, str] = Field(default_factory=dict, alias="FailedNodes")
    failed_and_unresolvable_nodes: dict[str, str] = Field(
        default_factory=dict, alias="FailedAndUnresolvableNodes"
    )
    error: str = Field(default="", alias="Error")


class HostPriority(WireModel):
    """One entry of the ``/prioritize`` reply (a ``HostPriorityList``)."""

    host: str = Field(alias="Host")
    score: int = Field(ge=keys.MIN_EXTENDER_PRIORITY, le=keys.MAX_EXTENDER_PRIORITY, alias="Score")


class ExtenderBindingArgs(WireModel):
    """Body of ``/bind``."""

    pod_name: names.SubdomainField = Field(alias="PodName")
    pod_namespace: names.NamespaceField = Field(alias="PodNamespace")
    pod_uid: names.UidOrEmptyField = Field(alias="PodUID")
    node: names.NodeNameField = Field(alias="Node")


class ExtenderBindingResult(WireModel):
    error: str = Field(default="", alias="Error")


class MetaPod(WireModel):
    uid: names.UidField = Field(alias="UID")


class MetaVictims(WireModel):
    pods: list[MetaPod] = Field(default_factory=list, alias="Pods")
    num_pdb_violations: int = Field(default=0, ge=INT64[0], le=INT64[1], alias="NumPDBViolations")


class Victims(WireModel):
    pods: list[_VictimPod] = Field(default_factory=list, alias="Pods")
    num_pdb_violations: int = Field(default=0, ge=INT64[0], le=INT64[1], alias="NumPDBViolations")


class ExtenderPreemptionArgs(WireModel):
    """Body of ``/preempt``. With ``nodeCacheCapable: true`` the scheduler fills
    ``NodeNameToMetaVictims``; otherwise ``NodeNameToVictims`` with full pods."""

    pod: _Pod = Field(alias="Pod")
    node_name_to_victims: dict[names.NodeNameField, Victims] | None = Field(
        default=None, alias="NodeNameToVictims"
    )
    node_name_to_meta_victims: dict[names.NodeNameField, MetaVictims] | None = Field(
        default=None, alias="NodeNameToMetaVictims"
    )

    def victims_by_node(self) -> dict[str, MetaVictims]:
        """The scheduler's proposal as ``{node: MetaVictims}``, whichever form was sent (full
        victim pods carry ``metadata.uid``: checked when the model was validated)."""
        if self.node_name_to_meta_victims is not None:
            return dict(self.node_name_to_meta_victims)
        return {
            node: MetaVictims(
                pods=[MetaPod(uid=pod["metadata"]["uid"]) for pod in victims.pods],
                num_pdb_violations=victims.num_pdb_violations,
            )
            for node, victims in (self.node_name_to_victims or {}).items()
        }


class ExtenderPreemptionResult(WireModel):
    node_name_to_meta_victims: dict[str, MetaVictims] = Field(
        default_factory=dict, alias="NodeNameToMetaVictims"
    )
