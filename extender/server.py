"""The kube-scheduler HTTP extender: an aiohttp application (app factory, typed app keys).

Role: speak ``k8s.io/kube-scheduler/extender/v1`` (:mod:`flexlease.api.wire`, DESIGN §3)
on ``POST /filter``, ``/prioritize``, ``/bind``, ``/preempt``, and serve ``GET /healthz``,
``/readyz`` (true once Pods and GPUNodes are listed and every registered check passes) and
``/metrics``. The scheduler runs us with ``nodeCacheCapable: true``: ``Nodes`` is null,
candidates come in ``NodeNames`` and replies name only nodes from that list. A pod without
managed GPUs passes untouched. ``Error`` in a reply is only for faults; malformed input is
answered 400 with a message naming the field (not UTF-8 JSON, a lone surrogate, nested
deeper than :data:`extender.body.MAX_JSON_DEPTH`, integer literals longer than
:data:`extender.body.MAX_JSON_INT_DIGITS` or beyond 64 bits, a corrupt ``Content-Encoding``,
wrong types in any field the extender reads, a name or value Kubernetes would refuse: node
names that are not DNS-1123 subdomains, the embedded pod's read fields,
:mod:`flexlease.api.podfields`; a pod the Pod watch holds at the body's uid and
``resourceVersion`` is answered from the watch's parse, whatever the body says:
:meth:`extender.state.Inventory.pending_request`), an unknown verb 404, a body over
``extender.max_body_bytes`` 413, anything unexpected a logged 500 after which everything the
verbs keep between requests is dropped (:func:`forget_request_state`, issue #37); a client
that hangs up mid-body is logged at debug. Nothing a request brings is kept unless it passed
those checks. A pod's own GPU claim (an interrupted bind of it) counts as
free for that pod in every verb.

Lifetimes are aiohttp ``cleanup_ctx`` entries: one list+watch loop per kind (GPUNodes,
Pods) feeding :class:`extender.state.Inventory`, plus ``extra_contexts`` the caller adds
(the lease controller, leader election). Handlers are not cancelled when the scheduler
hangs up (aiohttp's default), so a bind always commits or rolls back.

Neighbours: :mod:`extender.main` builds the settings and store and serves this app;
:mod:`extender.scheduling` decides; :mod:`extender.binder` binds; :mod:`extender.metrics`
measures.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias, TypeVar

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from extender import body, scheduling, tasks
from extender.admission import Admission
from extender.binder import Binder
from extender.equivalence import FilterCache, PriorityCache
from extender.metrics import VERBS, ExtenderMetrics
from extender.orchestrator import profile as profiles
from extender.state import Inventory
from flexlease.api import names, podfields, wire
from flexlease.api import pod as podapi
from flexlease.config import Settings
from flexlease.errors import Gone, RequestError, StoreError
from flexlease.logging import ctx
from flexlease.store.base import JsonObj, Kind, Store, WatchEvent

log = logging.getLogger(__name__)

CleanupContext = Callable[[web.Application], AsyncIterator[None]]
ReadyCheck = Callable[[], bool]
LeaderCheck = Callable[[], tuple[bool, str]]
"""``() -> (this replica leads, the current holder's identity)``."""

WATCH_BACKOFF_SECONDS: Final = (0.2, 30.0)
"""First and largest delay (seconds) before a failed list/watch is retried."""


@dataclass(slots=True)
class WatchState:
    """Progress of one list+watch loop: ``listed`` once the first list was applied,
    ``failed`` set when the loop ended on an unexpected error (``/healthz`` turns 500)."""

    kind: Kind
    listed: bool = False
    failed: str | None = None
    resource_version: str = ""


SETTINGS: Final = web.AppKey("settings", Settings)
STORE: Final = web.AppKey("store", Store)
INVENTORY: Final = web.AppKey("inventory", Inventory)
BINDER: Final = web.AppKey("binder", Binder)
METRICS: Final = web.AppKey("metrics", ExtenderMetrics)
WATCHES: Final = web.AppKey("watches", dict[Kind, WatchState])
ARGS_DECODER: Final = web.AppKey("args_decoder", body.ExtenderArgsDecoder)
FILTER_CACHE: Final = web.AppKey("filter_cache", FilterCache)
PRIORITY_CACHE: Final = web.AppKey("priority_cache", PriorityCache)
READY_CHECKS: Final = web.AppKey("ready_checks", dict[str, ReadyCheck])
ADMISSION: Final = web.AppKey("admission", Admission)
PODS: Final = web.AppKey("pods", podapi.ParsedPods)
"""Pods parsed in this scheduling cycle (filter, prioritize, preempt and bind share one parse)."""
LEADER: Final[web.AppKey[LeaderCheck | None]] = web.AppKey("leader")
"""Named readiness checks; other components (leader election, lease controller) add theirs."""


class _Disconnected(Exception):
    """Internal: the client hung up before its request body arrived (nothing to answer)."""


class _Reject(Exception):
    """Internal: a 4xx/503 to answer, with a bounded ``reason`` label for metrics."""

    def __init__(self, status: int, reason: str, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.close = close
        """Close the connection after answering (its request stream is broken)."""


def create_app(
    settings: Settings,
    store: Store,
    *,
    registry: CollectorRegistry | None = None,
    extra_contexts: Sequence[CleanupContext] = (),
    inventory: Inventory | None = None,
    leader: LeaderCheck | None = None,
) -> web.Application:
    """Build the extender application over ``store``.

    ``registry``: where metrics are registered (a fresh ``CollectorRegistry`` when None).
    ``extra_contexts``: more ``cleanup_ctx`` entries, started after the watch loops.
    ``inventory``: an existing inventory to serve (default: a new one fed by the watches).
    ``leader``: with leader election (several replicas), tells whether this replica holds
    the Lease and who does; ``/bind`` is then answered only by the leader (issue: two replicas
    serve filter/prioritize, only the leader binds), others reply with ``Error`` naming it.
    The store is not closed by the app; its owner closes it.
    """
    ext = settings.extender
    inv = inventory or Inventory(
        gpu_resource=ext.gpu_resource,
        reservation_ttl_seconds=ext.reservation_ttl_seconds,
        right_of_return=ext.right_of_return,
        critical_roles=profiles.critical_for(settings.orchestrator.profile_dirs),
    )
    registry = registry if registry is not None else CollectorRegistry()
    admission = Admission(ext, store, inv, registry=registry)
    client_names = admission.middleware()
    app = web.Application(
        middlewares=[_verb_middleware] if client_names is None else [client_names, _verb_middleware],
        client_max_size=ext.max_body_bytes,
    )
    app[SETTINGS] = settings
    app[STORE] = store
    app[INVENTORY] = inv
    pods = podapi.ParsedPods(ext.gpu_resource)
    app[PODS] = pods
    app[BINDER] = Binder(store, inv, gpu_resource=ext.gpu_resource, pods=pods)
    app[ARGS_DECODER] = body.ExtenderArgsDecoder()
    app[FILTER_CACHE] = FilterCache()
    app[PRIORITY_CACHE] = PriorityCache()
    app[METRICS] = ExtenderMetrics(registry, inv)
    app[ADMISSION] = admission
    app[WATCHES] = {Kind.GPUNODE: WatchState(Kind.GPUNODE), Kind.POD: WatchState(Kind.POD)}
    app[READY_CHECKS] = {"inventory": lambda: inv.ready}
    app[LEADER] = leader
    metrics_handler = make_aiohttp_handler(app[METRICS].registry)

    async def serve_metrics(request: web.Request) -> web.StreamResponse:
        return await metrics_handler(request)

    app.router.add_post("/filter", filter_verb)
    app.router.add_post("/prioritize", prioritize_verb)
    app.router.add_post("/bind", bind_verb)
    app.router.add_post("/preempt", preempt_verb)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", serve_metrics)
    app.cleanup_ctx.append(_watch_context(Kind.GPUNODE))
    app.cleanup_ctx.append(_watch_context(Kind.POD))
    app.cleanup_ctx.extend(extra_contexts)
    return app


# --------------------------------------------------------------------------- middlewares


@web.middleware
async def _verb_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Map errors to replies: bad input → 400, unknown path → 404, wrong method → 405,
    body too large → 413 (each logged once at warning), anything else → logged 500; and
    observe the latency of the four verbs (seconds) by verb and the status replied. One
    layer for both: each middleware costs every request a coroutine call."""
    verb = request.path.lstrip("/")
    if verb not in VERBS:
        return await _replied(request, handler, verb)
    start = time.perf_counter()
    status = 500
    try:
        response = await _replied(request, handler, verb)
        status = response.status
        return response
    finally:
        request.app[METRICS].observe_request(verb, status, time.perf_counter() - start)


async def _replied(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]], verb: str
) -> web.StreamResponse:
    """``handler``'s response, or the error reply for what it raised."""
    try:
        return await handler(request)
    except _Reject as exc:
        response = _reject(request, exc.status, exc.reason, str(exc))
        if exc.close:
            response.force_close()
        return response
    except _Disconnected as exc:
        log.debug("client disconnected before sending its whole request: %s", exc, extra=ctx(verb=verb))
        return web.Response(status=400)
    except RequestError as exc:  # bad input found past the envelope (e.g. a NodeList entry)
        return _reject(request, 400, "invalid", str(exc))
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[SETTINGS].extender.max_body_bytes
        return _reject(request, 413, "too_large", f"request body exceeds {limit} bytes")
    except web.HTTPNotFound:
        return _reject(
            request, 404, "unknown_verb", f"unknown path {request.path!r}; verbs: {', '.join(VERBS)}"
        )
    except web.HTTPMethodNotAllowed as exc:
        allowed = ", ".join(sorted(exc.allowed_methods))
        return _reject(request, 405, "method", f"{request.method} {request.path}: allowed {allowed}")
    except web.HTTPException:
        raise
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("internal error; the request caches are dropped", extra=ctx(verb=verb))
        forget_request_state(request.app)
        body = {"Error": f"internal error in {verb}; see the extender's log"}
        return web.json_response(body, status=500)


def forget_request_state(app: web.Application) -> None:
    """Drop everything the verbs keep between requests — the body decoder's pods, node lists
    and interned names, the filter and prioritize caches, the parsed pods — and have the
    inventory build every node's view afresh, so that a handler that failed half-way through
    changing one of them leaves nothing behind: the next request is answered as a fresh
    extender over the same store answers it (issue #37). The inventory's own state (nodes,
    holdings, reservations) comes from the watches and the binder, which undoes its own
    reservations (:mod:`extender.binder`)."""
    app[ARGS_DECODER].clear()
    app[FILTER_CACHE].clear()
    app[PRIORITY_CACHE].clear()
    app[PODS].clear()
    app[INVENTORY].rebuild_views()


def _reject(request: web.Request, status: int, reason: str, message: str) -> web.Response:
    verb = request.path.lstrip("/")
    label = verb if verb in VERBS else "other"
    request.app[METRICS].bad_requests.labels(label, reason).inc()
    log.warning("rejected request: %s", message, extra=ctx(verb=verb, status=status))
    return web.json_response({"Error": message}, status=status)


# --------------------------------------------------------------------------- request parsing


async def _read_bytes(request: web.Request) -> bytes:
    """The request body. Raises :class:`_Reject` (400) when it cannot be read (corrupt
    ``Content-Encoding``), :class:`_Disconnected` when the client hangs up mid-body; lets
    aiohttp's 413 through."""
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise
    except web.RequestPayloadError as exc:
        # The connection cannot carry another request: close it after answering, and mark
        # the body consumed so that aiohttp does not read the broken stream again (and log).
        request.content.feed_eof()
        message = str(exc).strip().splitlines()[-1].strip()
        raise _Reject(400, "bad_encoding", f"cannot read the request body: {message}", close=True) from exc
    except ConnectionError as exc:
        raise _Disconnected(str(exc)) from exc


async def _read_json(request: web.Request) -> Any:
    """The request body as JSON (:func:`extender.body.decode`). Raises :class:`_Reject`
    (400) on a body that is not UTF-8 JSON, nests deeper than
    :data:`extender.body.MAX_JSON_DEPTH` or holds an integer literal longer than
    :data:`extender.body.MAX_JSON_INT_DIGITS`, and what :func:`_read_bytes` raises."""
    return _decode(await _read_bytes(request))


def _decode(raw: bytes) -> Any:
    """:func:`extender.body.decode`, its refusals as :class:`_Reject` (400)."""
    try:
        return body.decode(raw)
    except body.BodyError as exc:
        raise _Reject(400, exc.reason, str(exc)) from exc


_Args: TypeAlias = wire.ExtenderArgs | body.CandidateArgs
"""``ExtenderArgs``: the model, or the fast path's :class:`extender.body.CandidateArgs`."""


async def _read_args(request: web.Request) -> _Args:
    """The ``ExtenderArgs`` of ``/filter`` or ``/prioritize``: through the app's
    :class:`extender.body.ExtenderArgsDecoder` when the body has the exact shape
    kube-scheduler sends, else like any body (:func:`_read_json`, the model): same
    replies, same errors."""
    raw = await _read_bytes(request)
    args = request.app[ARGS_DECODER].decode(raw)
    if args is not None:
        return args
    return _model(wire.ExtenderArgs, _decode(raw))


_M = TypeVar("_M", bound=wire.WireModel)


def _model(cls: type[_M], body: Any) -> _M:
    if not isinstance(body, dict):
        raise _Reject(
            400, "bad_type", f"body must be a JSON object ({cls.__name__}), got {type(body).__name__}"
        )
    try:
        return cls.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(map(_problem, exc.errors(include_url=False, include_input=False)[:5]))
        raise _Reject(400, "bad_type", f"invalid {cls.__name__}: {problems}") from exc


def _problem(error: ErrorDetails) -> str:
    """One validation error as ``<field path>: <what it must be>``. The embedded pod's and
    node list's checks report the path below their field in the message itself."""
    where = podfields.location("", error["loc"]) or "<body>"
    message = names.explain(error["msg"])
    if error["type"] in ("pod_field", "node_list"):
        return f"{where}{'' if message.startswith('[') else '.'}{message}"
    return f"{where}: {message}"


def _request_of(request: web.Request, pod: dict[str, Any]) -> podapi.GpuRequest:
    """``pod``'s request: the inventory's parse when its Pod watch holds the pod at the same
    version (:meth:`extender.state.Inventory.pending_request`), else :func:`_parse_pod`."""
    known = request.app[INVENTORY].pending_request(pod)
    # (Admission.passes_through still reads the body's schedulerName: a body claiming another
    # scheduler only gets the answer for a pod without managed GPUs, and /bind checks the
    # watch's copy.)
    return known if known is not None else _parse_pod(request, pod)


def _parse_pod(request: web.Request, pod: dict[str, Any]) -> podapi.GpuRequest:
    """``pod`` parsed (:class:`flexlease.api.pod.ParsedPods`); 400 when it is malformed."""
    try:
        return request.app[PODS].parse(pod)
    except RequestError as exc:
        raise _Reject(400, "bad_pod", f"Pod: {exc}") from exc


def _json(obj: Any) -> web.Response:
    return web.Response(body=orjson.dumps(obj), content_type="application/json")


def _not_ready_error(request: web.Request) -> str | None:
    inv = request.app[INVENTORY]
    if inv.ready:
        return None
    nodes, pods = inv.listed
    missing = [k for k, done in (("GPUNodes", nodes), ("Pods", pods)) if not done]
    return f"extender not ready: {' and '.join(missing)} not listed yet"


# --------------------------------------------------------------------------- verbs


async def filter_verb(request: web.Request) -> web.Response:
    """``POST /filter``: ExtenderArgs → ExtenderFilterResult (Algorithm 1 per node)."""
    args = await _read_args(request)
    if request.app[ADMISSION].passes_through(request, "filter", args.pod):  # another scheduler's
        return _json(_filter_reply(args, args.candidate_names(), {}, {}))
    req = _request_of(request, args.pod)
    names = args.candidate_names()
    if req.count == 0:  # not ours: every candidate passes untouched
        return _json(_filter_reply(args, names, {}, {}))
    not_ready = _not_ready_error(request)
    if not_ready is not None:
        return _json(wire.ExtenderFilterResult(error=not_ready).to_wire())
    inv = request.app[INVENTORY]
    snap = inv.snapshot()
    cache = request.app[FILTER_CACHE]
    result = cache.filter(
        req, snap.nodes, names, version=snap.version, changed_since=inv.changed_since, tagged=snap.tagged
    )
    request.app[ARGS_DECODER].intern(cache.universe)  # later lists decode into its strings
    request.app[METRICS].count_verdicts("filter", result.counts)
    if log.isEnabledFor(logging.DEBUG):
        passed, failed, unresolvable = result.members()
        log.debug(
            "filter",
            extra=ctx(pod=req.key, passed=len(passed), failed=len(failed), unresolvable=len(unresolvable)),
        )
    own = _own_claims(req, snap.nodes, names, inv)
    if own:  # the pod's own claim (an interrupted bind of it) never stands in its way
        passed, failed, unresolvable = result.members()
        for name, view in own.items():
            if view.standby or scheduling.check_node(req, view) is not scheduling.PASS:
                continue
            if failed.pop(name, None) is not None or unresolvable.pop(name, None) is not None:
                passed.append(name)
        keep = set(passed)
        return _json(_filter_reply(args, [n for n in names if n in keep], failed, unresolvable))
    if args.node_names is None and args.nodes is not None:
        return _json(_filter_reply(args, *result.members()))
    reply = result.encode()
    request.app[ARGS_DECODER].announce(*result.node_names_json())  # prioritize's list, likely
    return web.Response(body=reply, content_type="application/json")


def _own_claims(
    req: podapi.GpuRequest, nodes: Mapping[str, scheduling.NodeView], names: Sequence[str], inv: Inventory
) -> dict[str, scheduling.NodeView]:
    """Candidate nodes where the pod itself holds or reserves devices, as the pod sees them
    (its devices free: :func:`extender.scheduling.release_own`). Usually empty."""
    claimed = inv.claimed_nodes(req.uid) if req.uid else set()
    if not claimed:
        return {}
    out: dict[str, scheduling.NodeView] = {}
    for name in claimed.intersection(names):
        view = nodes.get(name)
        if view is not None:
            out[name] = scheduling.release_own(view, req.uid)
    return out


def _filter_reply(
    args: _Args, passed: list[str], failed: dict[str, str], unresolvable: dict[str, str]
) -> dict[str, Any]:
    """The reply in the form the scheduler asked in: ``NodeNames`` (nodeCacheCapable) or a
    ``Nodes`` list holding the passed items."""
    nodes: dict[str, Any] | None = None
    node_names: list[str] | None = passed
    if args.node_names is None and args.nodes is not None:
        keep = set(passed)
        items = [
            n
            for n in (args.nodes.get("items") or [])
            if isinstance(n, dict) and (n.get("metadata") or {}).get("name") in keep
        ]
        nodes = {**args.nodes, "items": items}
        node_names = None
    return {
        "Nodes": nodes,
        "NodeNames": node_names,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": "",
    }


async def prioritize_verb(request: web.Request) -> web.Response:
    """``POST /prioritize``: ExtenderArgs → HostPriorityList, scores 0–10 for every candidate."""
    args = await _read_args(request)
    if request.app[ADMISSION].passes_through(request, "prioritize", args.pod):  # another scheduler's
        return _json([{"Host": n, "Score": 0} for n in args.candidate_names()])
    req = _request_of(request, args.pod)
    names = args.candidate_names()
    if req.count == 0 or not request.app[INVENTORY].ready:
        return _json([{"Host": n, "Score": 0} for n in names])
    inv = request.app[INVENTORY]
    snap = inv.snapshot()
    body = request.app[PRIORITY_CACHE].prioritize(
        req,
        snap.nodes,
        names,
        version=snap.version,
        changed_since=inv.changed_since,
        tagged=snap.tagged,
        cached=snap.cached,
    )
    own = _own_claims(req, snap.nodes, names, inv)
    if own:  # score the pod's own claim as free for it
        scores = [
            {"Host": n, "Score": scheduling.score_node(req, own[n]) if n in own else s["Score"]}
            for n, s in zip(names, orjson.loads(body), strict=True)
        ]
        return _json(scores)
    return web.Response(body=body, content_type="application/json")


async def bind_verb(request: web.Request) -> web.Response:
    """``POST /bind``: ExtenderBindingArgs → ExtenderBindingResult (``Error`` empty on success)."""
    raw = await _read_bytes(request)
    args: body.BindingArgs | wire.ExtenderBindingArgs | None = body.decode_binding_args(raw)
    if args is None:  # not in the exact shape kube-scheduler sends: the model decides
        args = _model(wire.ExtenderBindingArgs, _decode(raw))
    leader = request.app[LEADER]
    if leader is not None:
        leading, holder = leader()
        if not leading:
            request.app[METRICS].count_decisions("bind", {("error", "not-leader"): 1})
            error = f"this extender replica is not the leader (leader: {holder or 'none yet'}); retry"
            return _json(wire.ExtenderBindingResult(error=error).to_wire())
    outcome = await request.app[BINDER].bind(
        args.pod_namespace,
        args.pod_name,
        uid=args.pod_uid,
        node=args.node,
        check=request.app[ADMISSION].bind_check(request),
    )
    request.app[METRICS].count_decisions("bind", {(outcome.outcome, outcome.cause): 1})
    request.app[METRICS].count_bind_source(outcome.source)
    if not outcome.error:  # the usual reply, encoded once
        return web.Response(body=_BOUND, content_type="application/json")
    return _json(wire.ExtenderBindingResult(error=outcome.error).to_wire())


_BOUND: Final = orjson.dumps(wire.ExtenderBindingResult().to_wire())
"""The ``ExtenderBindingResult`` of a successful bind (``{"Error":""}``)."""


async def preempt_verb(request: web.Request) -> web.Response:
    """``POST /preempt``: ExtenderPreemptionArgs → ExtenderPreemptionResult.

    Per proposed node: keep it only if evicting low-priority pods that hold GPUs this pod
    could use makes it fit (:func:`extender.scheduling.select_victims`); pods without
    managed GPUs that the scheduler proposed are passed through. A pod whose
    ``flexlease.io/role`` its framework profile marks critical (coordinator, Ray head, rank 0;
    WeFlex §3.4) is never accepted: a critical GPU holder is replaced by other victims when
    others free enough GPUs, and a node where the scheduler needs a critical pod without
    GPUs gone is dropped. kube-scheduler treats a node missing from the reply as no longer a
    candidate (``callExtenders`` in ``pkg/scheduler/framework/preemption``), and rejects an
    empty victim list for a node it proposed victims on, so such a node is dropped too.
    """
    args = _model(wire.ExtenderPreemptionArgs, await _read_json(request))
    if request.app[ADMISSION].passes_through(request, "preempt", args.pod):  # another scheduler's
        return _json(
            wire.ExtenderPreemptionResult(node_name_to_meta_victims=args.victims_by_node()).to_wire()
        )
    req = _request_of(request, args.pod)
    proposal = args.victims_by_node()
    if req.count == 0:
        return _json(wire.ExtenderPreemptionResult(node_name_to_meta_victims=proposal).to_wire())
    not_ready = _not_ready_error(request)
    if not_ready is not None:  # the preemption reply has no Error field: a non-200 is the error
        raise _Reject(503, "not_ready", not_ready)
    inv = request.app[INVENTORY]
    protected = _Protected(inv, _critical_victims(args, inv.critical_roles))
    nodes = inv.snapshot().nodes
    out: dict[str, wire.MetaVictims] = {}
    for name, mv in proposal.items():
        view = nodes.get(name)
        if view is None or (view.standby and not req.reclaim) or not req.preempts:
            continue
        victims = scheduling.select_victims(
            req,
            scheduling.release_own(view, req.uid),
            proposed=[p.uid for p in mv.pods],
            preemptor_priority=req.priority_value,
            protected=protected,
        )
        if victims is None or (not victims.uids and mv.pods):
            continue
        out[name] = wire.MetaVictims(
            pods=[wire.MetaPod(uid=u) for u in victims.uids],
            num_pdb_violations=min(mv.num_pdb_violations, len(victims.uids)),
        )
    request.app[METRICS].count_decisions(
        "preempt", {("success", "kept"): len(out), ("unschedulable", "dropped"): len(proposal) - len(out)}
    )
    return _json(wire.ExtenderPreemptionResult(node_name_to_meta_victims=out).to_wire())


@dataclass(frozen=True, slots=True)
class _Protected:
    """Pod uids ``/preempt`` never accepts as victims: critical per the inventory (every live
    pod it watches) or per the labels of the full victim pods in the request."""

    inventory: Inventory
    extra: frozenset[str]

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, str) and (uid in self.extra or self.inventory.is_critical(uid))


def _critical_victims(
    args: wire.ExtenderPreemptionArgs, roles: Mapping[str, frozenset[str]]
) -> frozenset[str]:
    """uids of the full victim pods (``NodeNameToVictims``, sent when ``nodeCacheCapable`` is
    off) whose labels name a critical role; with ``NodeNameToMetaVictims`` only uids arrive."""
    out: set[str] = set()
    for victims in (args.node_name_to_victims or {}).values():
        for pod in victims.pods:
            meta = pod.get("metadata")
            if not isinstance(meta, dict):
                continue
            labels = meta.get("labels")
            if isinstance(labels, dict) and profiles.is_critical(labels, roles):
                out.add(str(meta.get("uid")))
    return frozenset(out)


async def healthz(request: web.Request) -> web.Response:
    """``GET /healthz``: 200 while every watch loop is alive, else 500 naming the dead one."""
    dead = {k.value: s.failed for k, s in request.app[WATCHES].items() if s.failed}
    if dead:
        return web.json_response({"ok": False, "failed": dead}, status=500)
    return web.json_response({"ok": True})


async def readyz(request: web.Request) -> web.Response:
    """``GET /readyz``: 200 once Pods and GPUNodes are listed and every named check passes, else 503."""
    checks = {name: bool(check()) for name, check in request.app[READY_CHECKS].items()}
    ready = all(checks.values())
    body = {"ready": ready, "checks": checks, **request.app[INVENTORY].summary()}
    return web.json_response(body, status=200 if ready else 503)


# --------------------------------------------------------------------------- watches


def _watch_context(kind: Kind) -> CleanupContext:
    """A cleanup context running the list+watch loop of ``kind`` as a named task."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        state = app[WATCHES][kind]
        loop = _guarded(list_and_watch(app[STORE], app[INVENTORY], state), state)
        async with tasks.running(loop, name=f"extender-watch-{kind.value}"):
            yield

    return context


async def _guarded(loop: Awaitable[None], state: WatchState) -> None:
    try:
        await loop
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        state.failed = f"{type(exc).__name__}: {exc}"
        log.exception("watch loop died", extra=ctx(kind=state.kind.value))


async def list_and_watch(store: Store, inventory: Inventory, state: WatchState) -> None:
    """Feed ``inventory`` from ``store``: list ``state.kind``, then watch from the list's
    resourceVersion; re-watch when a watch ends, re-list on ``410 Gone``, back off
    (0.2 s doubling to 30 s) on other store errors. Runs until cancelled."""
    kind = state.kind
    replace: Callable[[list[JsonObj]], None]
    apply: Callable[[WatchEvent], None]
    if kind is Kind.POD:
        replace, apply = inventory.replace_pods, inventory.apply_pod_event
    else:
        replace, apply = inventory.replace_nodes, inventory.apply_node_event
    delay = WATCH_BACKOFF_SECONDS[0]
    while True:
        try:
            listed = await store.list(kind)
            replace(listed.items)
            state.listed = True
            state.resource_version = listed.resource_version
            log.info(
                "listed", extra=ctx(kind=kind.value, count=len(listed.items), rv=listed.resource_version)
            )
            while True:
                seen = 0
                async for event in store.watch(kind, resource_version=state.resource_version):
                    apply(event)
                    seen += 1
                    if event.resource_version:
                        state.resource_version = event.resource_version
                    delay = WATCH_BACKOFF_SECONDS[0]
                if not seen:  # a watch that ends at once (store closing): do not spin
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, WATCH_BACKOFF_SECONDS[1])
        except Gone:
            log.info("watch too old; listing again", extra=ctx(kind=kind.value, rv=state.resource_version))
        except StoreError as exc:
            log.warning("list/watch failed; retrying in %.1f s: %s", delay, exc, extra=ctx(kind=kind.value))
            await asyncio.sleep(delay)
            delay = min(delay * 2, WATCH_BACKOFF_SECONDS[1])
