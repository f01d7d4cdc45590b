"""kube-scheduler's side of the HTTP extender protocol (``k8s.io/kube-scheduler/extender/v1``).

The simulator calls the real extender exactly as kube-scheduler configured with
``nodeCacheCapable: true`` does: ``POST /filter`` and ``/prioritize`` with
``{"Pod": <v1.Pod JSON>, "Nodes": null, "NodeNames": [...]}``, ``/bind`` with
``{"PodName", "PodNamespace", "PodUID", "Node"}``, ``/preempt`` with
``{"Pod", "NodeNameToVictims": null, "NodeNameToMetaVictims": {node: {"Pods": [{"UID"}],
"NumPDBViolations"}}}``. Any non-200 status, a timeout (kube-scheduler's default 5 s), a
body that is not the expected type, or a filter reply naming a node outside the candidates
(the contract says replies are a subset) raises :class:`ExtenderCallError` and is counted.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from pydantic import TypeAdapter, ValidationError

from flexlease.api import keys, wire
from flexlease.errors import FlexleaseError
from flexlease.sim.http1 import Connect, Http1Client, HttpError

DEFAULT_TIMEOUT_SECONDS: Final = 5.0
"""kube-scheduler's default extender ``httpTimeout``."""


class ExtenderCallError(FlexleaseError):
    """A call to the extender failed: transport error, timeout, non-200, or a reply that
    breaks the protocol. ``verb`` names the call."""

    def __init__(self, verb: str, message: str) -> None:
        super().__init__(f"/{verb}: {message}")
        self.verb = verb


@dataclass(slots=True)
class CallStats:
    """Counts per verb: calls made, errors, and total seconds spent."""

    calls: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    seconds: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, dict[str, float]]:
        verbs = sorted(set(self.calls) | set(self.errors))
        return {
            v: {
                "calls": self.calls[v],
                "errors": self.errors[v],
                "mean_ms": round(1000 * self.seconds.get(v, 0.0) / self.calls[v], 3)
                if self.calls[v]
                else 0.0,
            }
            for v in verbs
        }


_HOST_PRIORITY_LIST: Final = TypeAdapter(list[wire.HostPriority])
_ARGS_KEYS: Final = tuple(
    wire.ExtenderArgs.model_fields[name].alias or name for name in ("pod", "nodes", "node_names")
)


def _extender_args(pod: dict[str, Any], node_names: list[str]) -> dict[str, Any]:
    """``ExtenderArgs`` as kube-scheduler sends it with ``nodeCacheCapable: true`` (the Pod,
    ``Nodes`` null, the candidates in ``NodeNames``), keyed by :class:`wire.ExtenderArgs`'
    Go field names; the pod goes as it is (it is already Kubernetes JSON)."""
    return dict(zip(_ARGS_KEYS, (pod, None, node_names), strict=True))


def _plain_scores(raw: list[Any]) -> dict[str, int] | None:
    """A ``HostPriorityList`` in the exact shape the extender writes (``{"Host": str,
    "Score": int}`` within 0–10) as host → score, checked without building models (about
    70 entries per call); None for anything else."""
    out: dict[str, int] = {}
    for item in raw:
        if type(item) is not dict or len(item) != 2:
            return None
        host, score = item.get("Host"), item.get("Score")
        if type(host) is not str or type(score) is not int:
            return None
        if not keys.MIN_EXTENDER_PRIORITY <= score <= keys.MAX_EXTENDER_PRIORITY:
            return None
        out[host] = score
    return out


_FILTER_KEYS: Final = frozenset(
    wire.ExtenderFilterResult.model_fields[name].alias or name
    for name in wire.ExtenderFilterResult.model_fields
)


def _str_map(value: Any) -> bool:
    return type(value) is dict and all(type(k) is str and type(v) is str for k, v in value.items())


def _plain_filter(raw: Any) -> wire.ExtenderFilterResult | None:
    """An ``ExtenderFilterResult`` in the exact shape the extender writes (every field under
    its Go name, ``Nodes`` null, the types right) as the model without validating it again
    (about 1,300 replies per simulated day); None for anything else."""
    if type(raw) is not dict or raw.keys() != _FILTER_KEYS or raw["Nodes"] is not None:
        return None
    names, failed, unresolvable, error = (
        raw["NodeNames"],
        raw["FailedNodes"],
        raw["FailedAndUnresolvableNodes"],
        raw["Error"],
    )
    if names is not None and (type(names) is not list or any(type(n) is not str for n in names)):
        return None
    if not (_str_map(failed) and _str_map(unresolvable) and type(error) is str):
        return None
    return wire.ExtenderFilterResult.model_construct(
        nodes=None,
        node_names=names,
        failed_nodes=failed,
        failed_and_unresolvable_nodes=unresolvable,
        error=error,
    )


def _loads(raw: bytes) -> Any:
    """A JSON reply: orjson, or :mod:`json` for what orjson refuses (so a reply is refused
    only when neither reads it). Raises ``ValueError``."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def _text(raw: bytes) -> str:
    return raw[:300].decode(errors="replace")


class ExtenderClient:
    """Calls one extender at ``base_url`` (``http://127.0.0.1:<port>``) over kept-alive
    HTTP/1.1 connections (:class:`~flexlease.sim.http1.Http1Client`), opened by ``connect``
    (default: TCP to ``base_url``). Use as an async context manager, or call :meth:`close`."""

    def __init__(
        self, base_url: str, *, timeout: float = DEFAULT_TIMEOUT_SECONDS, connect: Connect | None = None
    ) -> None:
        self._http = Http1Client(base_url.rstrip("/"), connect=connect)
        self._timeout = timeout
        self.stats = CallStats()

    async def __aenter__(self) -> ExtenderClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections."""
        await self._http.close()

    async def _post(self, verb: str, body: dict[str, Any]) -> Any:
        self.stats.calls[verb] += 1
        started = time.perf_counter()
        try:
            try:
                resp = await self._http.request("POST", f"/{verb}", orjson.dumps(body), limit_s=self._timeout)
            except HttpError as exc:
                raise ExtenderCallError(verb, f"{type(exc).__name__}: {exc}") from exc
            if resp.status != 200:
                raise ExtenderCallError(verb, f"HTTP {resp.status}: {_text(resp.body)}")
            try:
                return _loads(resp.body)
            except ValueError as exc:
                raise ExtenderCallError(verb, f"reply is not JSON: {_text(resp.body)}") from exc
        except ExtenderCallError:
            self.stats.errors[verb] += 1
            raise
        finally:
            self.stats.seconds[verb] = self.stats.seconds.get(verb, 0.0) + time.perf_counter() - started

    def _protocol_error(self, verb: str, message: str) -> ExtenderCallError:
        self.stats.errors[verb] += 1
        return ExtenderCallError(verb, message)

    async def filter(self, pod: dict[str, Any], node_names: list[str]) -> wire.ExtenderFilterResult:
        """``/filter``. Raises :class:`ExtenderCallError` on failure, on a reply naming a node
        outside ``node_names``, or on a non-empty ``Error`` (which fails the cycle)."""
        raw = await self._post("filter", _extender_args(pod, node_names))
        result = _plain_filter(raw)
        if result is None:  # not the exact shape: validate as Go decodes it (keys in any case)
            try:
                result = wire.ExtenderFilterResult.model_validate(raw)
            except ValidationError as exc:
                raise self._protocol_error("filter", f"bad reply: {exc}") from exc
        if result.error:
            raise self._protocol_error("filter", f"Error: {result.error}")
        extra = set(result.node_names or []) - set(node_names)
        if extra or result.nodes is not None:
            raise self._protocol_error(
                "filter", f"reply outside the candidates or with Nodes: {sorted(extra)}"
            )
        return result

    async def prioritize(self, pod: dict[str, Any], node_names: list[str]) -> dict[str, int]:
        """``/prioritize``: the ``HostPriorityList`` reply as host → score (0–10; a host listed
        twice keeps its last score). Raises :class:`ExtenderCallError`."""
        raw = await self._post("prioritize", _extender_args(pod, node_names))
        if not isinstance(raw, list):
            raise self._protocol_error("prioritize", "reply is not a HostPriorityList")
        scores = _plain_scores(raw)
        if scores is None:  # not the exact shape: validate as Go decodes it (keys in any case)
            try:
                scores = {s.host: s.score for s in _HOST_PRIORITY_LIST.validate_python(raw)}
            except ValidationError as exc:
                raise self._protocol_error("prioritize", f"bad reply: {exc}") from exc
        if set(scores) - set(node_names):
            raise self._protocol_error("prioritize", "scores for nodes outside the candidates")
        return scores

    async def bind(self, namespace: str, name: str, *, uid: str, node: str) -> str:
        """``/bind``; returns the reply's ``Error`` ("" on success). Raises
        :class:`ExtenderCallError` on transport/protocol failures."""
        body = wire.ExtenderBindingArgs(
            pod_name=name, pod_namespace=namespace, pod_uid=uid, node=node
        ).to_wire()
        raw = await self._post("bind", body)
        if type(raw) is dict and raw.keys() == {"Error"} and type(raw["Error"]) is str:
            return raw["Error"]  # the exact shape the extender writes
        try:
            return wire.ExtenderBindingResult.model_validate(raw).error
        except ValidationError as exc:
            raise self._protocol_error("bind", f"bad reply: {exc}") from exc

    async def preempt(
        self, pod: dict[str, Any], victims: dict[str, list[str]]
    ) -> dict[str, wire.MetaVictims]:
        """``/preempt`` with ``NodeNameToMetaVictims`` (``victims``: node → pod UIDs). Returns
        the nodes the extender keeps with their victims. Raises :class:`ExtenderCallError`."""
        args = wire.ExtenderPreemptionArgs(
            pod=pod,
            node_name_to_victims=None,
            node_name_to_meta_victims={
                node: wire.MetaVictims(pods=[wire.MetaPod(uid=u) for u in uids], num_pdb_violations=0)
                for node, uids in victims.items()
            },
        )
        raw = await self._post("preempt", args.to_wire())
        try:
            result = wire.ExtenderPreemptionResult.model_validate(raw)
        except ValidationError as exc:
            raise self._protocol_error("preempt", f"bad reply: {exc}") from exc
        if set(result.node_name_to_meta_victims) - set(victims):
            raise self._protocol_error("preempt", "reply names nodes that were not proposed")
        return dict(result.node_name_to_meta_victims)

    async def ready(self) -> bool:
        """``GET /readyz`` → True on 200. Transport errors read as not ready."""
        try:
            resp = await self._http.request("GET", "/readyz", limit_s=self._timeout)
        except HttpError:
            return False
        return resp.status == 200
