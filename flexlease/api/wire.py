"""Wire types of ``k8s.io/kube-scheduler/extender/v1`` (types.go).

The Go structs have no JSON tags, so encoding/json writes the Go field names (PascalCase)
and decodes keys case-insensitively; these models do the same. Embedded ``v1.Pod`` and
``v1.NodeList`` values are ordinary camelCase Kubernetes JSON and are kept as raw dicts
(parse a pod with :func:`flexlease.api.pod.parse_pod`). Scores run
``MinExtenderPriority``..``MaxExtenderPriority`` = 0..10.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flexlease.api import keys
from flexlease.errors import RequestError


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


class ExtenderArgs(WireModel):
    """Body of ``/filter`` and ``/prioritize``. With ``nodeCacheCapable: true``, ``Nodes`` is
    null and ``NodeNames`` holds the candidates."""

    pod: dict[str, Any] = Field(alias="Pod")
    nodes: dict[str, Any] | None = Field(default=None, alias="Nodes")
    node_names: list[str] | None = Field(default=None, alias="NodeNames")

    def candidate_names(self) -> list[str]:
        """Candidate node names: ``NodeNames`` or, when not cache-capable,
        ``Nodes.items[].metadata.name``. Raises :class:`RequestError` on a malformed NodeList."""
        if self.node_names is not None:
            return list(self.node_names)
        items = (self.nodes or {}).get("items") or []
        if not isinstance(items, list):
            raise RequestError("Nodes.items must be a list")
        names: list[str] = []
        for node in items:
            meta = node.get("metadata") if isinstance(node, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            if not isinstance(name, str) or not name:
                raise RequestError("every Nodes.items[] needs metadata.name")
            names.append(name)
        return names


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

    pod_name: str = Field(alias="PodName", min_length=1)
    pod_namespace: str = Field(alias="PodNamespace", min_length=1)
    pod_uid: str = Field(alias="PodUID")
    node: str = Field(alias="Node", min_length=1)


class ExtenderBindingResult(WireModel):
    error: str = Field(default="", alias="Error")


class MetaPod(WireModel):
    uid: str = Field(alias="UID")


class MetaVictims(WireModel):
    pods: list[MetaPod] = Field(default_factory=list, alias="Pods")
    num_pdb_violations: int = Field(default=0, alias="NumPDBViolations")


class Victims(WireModel):
    pods: list[dict[str, Any]] = Field(default_factory=list, alias="Pods")
    num_pdb_violations: int = Field(default=0, alias="NumPDBViolations")


class ExtenderPreemptionArgs(WireModel):
    """Body of ``/preempt``. With ``nodeCacheCapable: true`` the scheduler fills
    ``NodeNameToMetaVictims``; otherwise ``NodeNameToVictims`` with full pods."""

    pod: dict[str, Any] = Field(alias="Pod")
    node_name_to_victims: dict[str, Victims] | None = Field(default=None, alias="NodeNameToVictims")
    node_name_to_meta_victims: dict[str, MetaVictims] | None = Field(
        default=None, alias="NodeNameToMetaVictims"
    )

    def victims_by_node(self) -> dict[str, MetaVictims]:
        """The scheduler's proposal as ``{node: MetaVictims}``, whichever form was sent.
        Raises :class:`RequestError` when a full victim pod has no ``metadata.uid``."""
        if self.node_name_to_meta_victims is not None:
            return dict(self.node_name_to_meta_victims)
        out: dict[str, MetaVictims] = {}
        for node, victims in (self.node_name_to_victims or {}).items():
            uids: list[MetaPod] = []
            for pod in victims.pods:
                meta = pod.get("metadata")
                if not isinstance(meta, dict) or not isinstance(meta.get("uid"), str):
                    raise RequestError(f"NodeNameToVictims[{node}].Pods[] needs metadata.uid")
                uids.append(MetaPod(uid=meta["uid"]))
            out[node] = MetaVictims(pods=uids, num_pdb_violations=victims.num_pdb_violations)
        return out


class ExtenderPreemptionResult(WireModel):
    node_name_to_meta_victims: dict[str, MetaVictims] = Field(
        default_factory=dict, alias="NodeNameToMetaVictims"
    )
