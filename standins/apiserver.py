"""A local stand-in for kube-apiserver, speaking real Kubernetes API JSON over aiohttp.

What it serves (the subset flexlease uses, with the API server's own semantics):

* Kinds: Pods, Events (core/v1), Leases (coordination.k8s.io/v1), PodDisruptionBudgets
  (policy/v1), StatefulSets (apps/v1), GPUNodes (cluster-scoped) and GPULeases
  (flexlease.io/v1alpha1 CRDs with the status subresource), and other operators' custom
  resources with the status subresource: PyTorchJobs and MPIJobs (kubeflow.org/v1),
  RayClusters (ray.io/v1). URL layout as kube-apiserver's (``/api/v1/namespaces/{ns}/pods``,
  ``/apis/flexlease.io/v1alpha1/gpunodes/{name}/status``).
* ``GET`` list: ``{"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion",
  "continue", "remainingItemCount"}, "items": [...]}``; built-in kinds' items carry no
  ``kind``/``apiVersion`` (as the real server sends them), CR items do. ``limit``/
  ``continue`` pages over a consistent snapshot; an expired token answers 410 Expired.
  ``labelSelector`` (=, ==, !=, in, notin, exists, !) and ``fieldSelector`` restricted to
  each resource's field labels (others: 400).
* ``GET ?watch=1``: a chunked stream of one ``WatchEvent`` JSON object per line — ADDED,
  MODIFIED, DELETED, BOOKMARK (with ``allowWatchBookmarks``), and ``ERROR`` carrying a
  ``Status`` (410 Expired when ``resourceVersion`` is older than the retained history, or
  the HTTP status 410 itself when ``gone_as_http_status``). ``resourceVersion`` "" or "0"
  starts with synthetic ADDED events for the current state. Objects that stop (start)
  matching a selector arrive as DELETED (ADDED). ``timeoutSeconds`` ends the stream.
* ``POST`` create (defaulting, ``status`` reset, 409 AlreadyExists, ``generateName``),
  ``PATCH`` with ``application/merge-patch+json`` only (others 415) and a
  ``metadata.resourceVersion`` precondition (409 Conflict), no-op patches change nothing,
  ``status`` subresource semantics (main resource ignores ``status``; ``/status`` changes
  only ``status``), Pod spec immutability (422), ``DELETE`` with graceful Pod deletion
  (``deletionTimestamp``; a stand-in kubelet confirms at once unless told not to),
  ``pods/binding`` (201 Status; 409 when the pod is Terminating, already bound or still
  scheduling-gated, or the Binding's UID or resourceVersion precondition fails; clears
  ``status.nominatedNodeName``) and
  ``pods/eviction`` (201; 429 TooManyRequests when a PodDisruptionBudget allows no
  disruption; PDB status kept by a stand-in disruption controller).
* Every error is a ``metav1.Status`` with the real reason and message shapes. Every object
  carries ``uid``, ``resourceVersion``, ``creationTimestamp`` and ``managedFields``.
* Bearer-token authentication (401 Unauthorized) and TLS (optionally client certificates)
  through the ``ssl.SSLContext`` given.

Test controls: :meth:`FakeApiServer.put` (write an object as a controller/kubelet would,
status included), :meth:`kubelet_start`, :meth:`remove`, :meth:`compact` (drop watch
history: resumes get 410), :meth:`drop_watches` (cut every watch connection),
:meth:`restart` (the server goes away and comes back on the same port), ``unserved`` (custom
resources whose CRD is not installed: 404), :meth:`fail` and
:meth:`stall` (inject answers and delays), ``latency`` (a delay on every request),
``requests`` (what came in).

* Custom resources (GPUNode, GPULease) are pruned to their CRD's structural schema from
  ``manifests/base/crds/`` (unknown fields dropped, recorded in ``pruned``) and validated against
  it on every create, patch and :meth:`FakeApiServer.put`: 422 Invalid with per-field
  causes, as kube-apiserver answers (see :mod:`standins.crd_schema` for the sources).

Not modelled: namespaces as objects (every namespace exists), admission webhooks, finalizers,
strategic merge and JSON patches (415), server-side apply, ``format`` and CEL checks in CRD
schemas, the watch cache's own bookmark cadence (bookmarks here come every
``bookmark_interval`` seconds).
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import contextlib
import copy
import json
import random
import ssl
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from standins.apiserver_rules import (
    API_RESOURCES,
    ApiError,
    ApiResource,
    JsonObj,
    check_pod_update,
    default_pod,
    fields_match,
    label_selector_object_matches,
    labels_match,
    merge_patch,
    now_rfc3339,
    parse_field_selector,
    parse_label_selector,
    pdb_status,
    pod_ignores_pdb,
    qos_class,
    record_manager,
    validate_meta,
    validate_pod,
)
from standins.crd_schema import SchemaError, is_custom_kind, prune_and_validate

_BY_PATH = {(r.group, r.version, r.plural): r for r in API_RESOURCES}
_BY_KIND = {r.kind: r for r in API_RESOURCES}
_GENERATED = {"Lease", "Event"}  # kinds whose objects carry no metadata.generation
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apiserver names.SimpleNameGenerator


@dataclass(frozen=True, slots=True)
class Change:
    rv: int
    type: str
    res: ApiResource
    old: JsonObj | None
    obj: JsonObj


@dataclass(frozen=True, slots=True)
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass(slots=True)
class _Fault:
    method: str | None
    path_contains: str | None
    times: int
    status: int | None = None
    reason: str = ""
    retry_after: int | None = None
    stall_seconds: float = 0.0

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and (
            self.path_contains is None or self.path_contains in path
        )


@dataclass(slots=True, eq=False)
class _WatchConn:
    request: web.Request
    stopped: bool = False


_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class FakeApiServer:
    """See the module docstring. Use as ``async with FakeApiServer() as api: api.url``."""

    def __init__(
        self,
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        history: int = 10_000,
        bookmark_interval: float = 0.5,
        kubelet_confirms_deletion: bool = True,
        gone_as_http_status: bool = False,
        first_resource_version: int = 1000,
        unserved: frozenset[str] = frozenset(),
    ) -> None:
        self.token = token
        self.unserved = set(unserved)
        """Plurals (``rayclusters``) of custom resources whose CRD is not installed: their
        paths answer 404 as for any unknown resource. Clear to "install" them."""
        self.ssl_context = ssl_context
        self.history = history
        self.bookmark_interval = bookmark_interval
        self.kubelet_confirms_deletion = kubelet_confirms_deletion
        self.gone_as_http_status = gone_as_http_status
        self.requests: list[Recorded] = []
        self.pruned: list[str] = []
        """Paths of unknown custom-resource fields dropped by structural pruning."""
        self.latency = 0.0
        """Seconds every request other than a watch waits before it is served (etcd and
        admission time), to widen races in end-to-end tests."""
        self.url = ""
        self._rv = first_resource_version
        self._compacted = first_resource_version
        self._objects: dict[str, dict[tuple[str, str], JsonObj]] = {r.plural: {} for r in API_RESOURCES}
        self._log: list[Change] = []
        self._changed = asyncio.Event()
        self._watches: set[_WatchConn] = set()
        self._snapshots: OrderedDict[int, dict[str, list[JsonObj]]] = OrderedDict()
        self._faults: list[_Fault] = []
        self._runner: web.AppRunner | None = None
        self._closing = False
        self._stopping = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> FakeApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, port: int = 0) -> str:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port, ssl_context=self.ssl_context)
        await site.start()
        host, bound = self._runner.addresses[0][:2]
        scheme = "https" if self.ssl_context is not None else "http"
        self.url = f"{scheme}://{host}:{bound}"
        return self.url

    async def stop(self) -> None:
        self._closing = True
        self._stopping.set()
        self._stop_watches(abort=False)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def restart(self, *, down_seconds: float = 0.0, during: Callable[[], None] | None = None) -> None:
        """Stop serving (every connection cut; connections refused for ``down_seconds``),
        call ``during()`` (writes clients cannot see happen), and serve again on the same
        port with the same objects, as an API server restart looks to clients."""
        port = int(self.url.rsplit(":", 1)[1])
        self._stopping.set()
        self._stop_watches(abort=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if during is not None:
            during()
        await asyncio.sleep(down_seconds)
        self._closing = False
        self._stopping = asyncio.Event()
        await self.start(port)

    # -- test controls ---------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The latest resourceVersion (etcd revision) handed out."""
        return self._rv

    def objects(self, kind: str) -> list[JsonObj]:
        """Current objects of ``kind`` (deep copies, in etcd key order)."""
        res = _BY_KIND[kind]
        return [copy.deepcopy(o) for _, o in sorted(self._objects[res.plural].items())]

    def lookup(self, kind: str, name: str, namespace: str = "") -> JsonObj | None:
        obj = self._objects[_BY_KIND[kind].plural].get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def put(self, obj: JsonObj, *, manager: str = "kube-controller-manager") -> JsonObj:
        """Write ``obj`` as a controller or kubelet would (status included, no defaulting):
        creates it (ADDED) or replaces it (MODIFIED). Returns the stored object."""
        res = _BY_KIND[obj["kind"]]
        body = copy.deepcopy(obj)
        meta = body.setdefault("metadata", {})
        ns = meta.get("namespace", "") if res.namespaced else ""
        key = (ns, meta["name"])
        old = self._objects[res.plural].get(key)
        if old is None:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", now_rfc3339())
            if res.kind not in _GENERATED and not res.builtin:
                meta.setdefault("generation", 1)
        else:
            meta["uid"] = old["metadata"]["uid"]
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
        body = self._admit(res, body)
        if "managedFields" not in meta:
            record_manager(
                body,
                manager=manager,
                operation="Update",
                api_version=res.api_version,
                body=obj,
                subresource=None,
            )
        self._commit(res, "ADDED" if old is None else "MODIFIED", old, body)
        self._after_write(res, ns)
        return copy.deepcopy(body)

    def kubelet_start(
        self, namespace: str, name: str, *, ready: bool = True, pod_ip: str = "10.244.1.17"
    ) -> JsonObj:
        """What kubelet writes once a bound pod's containers run: phase Running, the
        PodReadyToStartContainers/Initialized/Ready/ContainersReady conditions, IPs,
        containerStatuses. Returns the pod."""
        pod = self._objects["pods"][(namespace, name)]
        node = pod["spec"].get("nodeName")
        if not node:
            raise AssertionError(f"pod {namespace}/{name} is not bound")
        t = now_rfc3339()
        flag = "True" if ready else "False"
        status = copy.deepcopy(pod.get("status") or {})
        conds = [c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"]
        conds = [
            {
                "type": "PodReadyToStartContainers",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": t,
            },
            {"type": "Initialized", "status": "True", "lastProbeTime": None, "lastTransitionTime": t},
            {"type": "Ready", "status": flag, "lastProbeTime": None, "lastTransitionTime": t},
            {"type": "ContainersReady", "status": flag, "lastProbeTime": None, "lastTransitionTime": t},
            *conds,
        ]
        status.update(
            {
                "phase": "Running",
                "conditions": conds,
                "hostIP": "172.18.0.3",
                "hostIPs": [{"ip": "172.18.0.3"}],
                "podIP": pod_ip,
                "podIPs": [{"ip": pod_ip}],
                "startTime": t,
                "containerStatuses": [
                    {
                        "name": c["name"],
                        "state": {"running": {"startedAt": t}},
                        "lastState": {},
                        "ready": ready,
                        "restartCount": 0,
                        "image": c["image"],
                        "imageID": f"{c['image'].split(':')[0]}@sha256:{'ab' * 32}",
                        "containerID": f"containerd://{uuid.uuid4().hex}{uuid.uuid4().hex}",
                        "started": True,
                    }
                    for c in pod["spec"]["containers"]
                ],
            }
        )
        new = copy.deepcopy(pod)
        new["status"] = status
        record_manager(
            new,
            manager="kubelet",
            operation="Update",
            api_version="v1",
            body={"status": status},
            subresource="status",
        )
        self._commit(_BY_KIND["Pod"], "MODIFIED", pod, new)
        self._after_write(_BY_KIND["Pod"], namespace)
        return copy.deepcopy(new)

    def remove(self, kind: str, name: str, namespace: str = "") -> None:
        """Delete at once (as a finalizer-free object disappears); emits DELETED."""
        res = _BY_KIND[kind]
        old = self._objects[res.plural][(namespace, name)]
        self._commit(res, "DELETED", old, copy.deepcopy(old))
        self._after_write(res, namespace)

    def compact(self) -> None:
        """Forget the watch history (as etcd compaction does): watches resuming from any
        version before now get 410 Expired."""
        self._log.clear()
        self._compacted = self._rv
        self._snapshots.clear()

    def drop_watches(self) -> int:
        """Cut every open watch connection (no clean end of stream). Returns how many."""
        return self._stop_watches(abort=True)

    @property
    def open_watches(self) -> int:
        return len(self._watches)

    def fail(
        self,
        status: int,
        *,
        method: str | None = None,
        path_contains: str | None = None,
        times: int = 1,
        retry_after: int | None = None,
    ) -> None:
        """Answer the next ``times`` matching requests with a ``Status`` of ``status``."""
        self._faults.append(
            _Fault(
                method,
                path_contains,
                times,
                status=status,
                reason=_REASONS.get(status, ""),
                retry_after=retry_after,
            )
        )

    def stall(
        self, seconds: float, *, method: str | None = None, path_contains: str | None = None, times: int = 1
    ) -> None:
        """Hold the next ``times`` matching requests for ``seconds`` before serving them."""
        self._faults.append(_Fault(method, path_contains, times, stall_seconds=seconds))

    # -- storage ---------------------------------------------------------------------------

    def _commit(self, res: ApiResource, etype: str, old: JsonObj | None, obj: JsonObj) -> JsonObj:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        ns = obj["metadata"].get("namespace", "") if res.namespaced else ""
        key = (ns, obj["metadata"]["name"])
        if etype == "DELETED":
            self._objects[res.plural].pop(key, None)
        else:
            self._objects[res.plural][key] = obj
        self._log.append(Change(self._rv, etype, res, copy.deepcopy(old), copy.deepcopy(obj)))
        if len(self._log) > self.history:
            drop = len(self._log) - self.history
            self._compacted = self._log[drop - 1].rv
            del self._log[:drop]
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return obj

    def _after_write(self, res: ApiResource, namespace: str) -> None:
        if res.kind in ("Pod", "PodDisruptionBudget"):
            self._reconcile_pdbs(namespace)

    def _reconcile_pdbs(self, namespace: str) -> None:
        """The disruption controller: keep each PDB's status in step with its pods."""
        res = _BY_KIND["PodDisruptionBudget"]
        for (ns, _), pdb in list(self._objects[res.plural].items()):
            if ns != namespace:
                continue
            selector = (pdb.get("spec") or {}).get("selector")
            pods = [
                p
                for (pns, _), p in self._objects["pods"].items()
                if pns == ns
                and not p["metadata"].get("deletionTimestamp")
                and label_selector_object_matches(selector, p["metadata"].get("labels") or {})
            ]
            status = pdb_status(pdb, pods)
            if status != pdb.get("status"):
                new = copy.deepcopy(pdb)
                new["status"] = status
                record_manager(
                    new,
                    manager="kube-controller-manager",
                    operation="Update",
                    api_version="policy/v1",
                    body={"status": status},
                    subresource="status",
                )
                self._commit(res, "MODIFIED", pdb, new)

    def _stop_watches(self, *, abort: bool) -> int:
        conns = list(self._watches)
        for conn in conns:
            conn.stopped = True
            if abort and conn.request.transport is not None:
                conn.request.transport.abort()
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return len(conns)

    # -- HTTP ------------------------------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(
            Recorded(request.method, request.path, dict(request.query), dict(request.headers), body)
        )
        try:
            await self._apply_faults(request)
            self._authenticate(request)
            if self.latency and request.query.get("watch") not in ("1", "true"):
                await asyncio.sleep(self.latency)
            res, ns, name, sub = self._route(request.path)
            return await self._serve(request, res, ns=ns, name=name, sub=sub, body=body)
        except ApiError as err:
            headers = {"Retry-After": str(err.retry_after)} if err.retry_after else None
            return web.json_response(err.status(), status=err.code, headers=headers)

    async def _apply_faults(self, request: web.Request) -> None:
        for fault in list(self._faults):
            if fault.times <= 0 or not fault.matches(request.method, request.path_qs):
                continue
            fault.times -= 1
            if fault.stall_seconds:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), fault.stall_seconds)
            if fault.status is not None:
                details: JsonObj | None = None
                if fault.retry_after:
                    details = {"retryAfterSeconds": fault.retry_after}
                raise ApiError(
                    fault.status,
                    fault.reason,
                    f"injected {fault.status} for {request.method} {request.path}",
                    details=details,
                    retry_after=fault.retry_after,
                )
        self._faults = [f for f in self._faults if f.times > 0]

    def _authenticate(self, request: web.Request) -> None:
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            raise ApiError(401, "Unauthorized", "Unauthorized")

    def _route(self, path: str) -> tuple[ApiResource, str, str, str]:
        parts = [p for p in path.split("/") if p]
        if len(parts) >= 2 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        res = _BY_PATH.get((group, version, rest[0]))
        if res is not None and not res.builtin and res.plural in self.unserved:
            res = None  # its CRD is not installed
        if res is None or (ns and not res.namespaced):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
        if (name and res.namespaced and not ns) or (sub and sub not in res.subresources):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return res, ns, name, sub

    async def _serve(
        self, request: web.Request, res: ApiResource, *, ns: str, name: str, sub: str, body: bytes
    ) -> web.StreamResponse:
        method = request.method
        q = request.query
        manager = q.get("fieldManager") or request.headers.get("User-Agent", "unknown").split("/", 1)[0]
        if not name:
            if method == "GET" and q.get("watch") in ("1", "true"):
                return await self._watch(request, res, ns)
            if method == "GET":
                return web.json_response(self._list(res, ns, q))
            if method == "POST":
                return web.json_response(self._create(res, ns, _json(body), manager), status=201)
        elif not sub or sub == "status":
            if method == "GET":
                return web.json_response(self._get(res, ns, name))
            if method == "PATCH":
                ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
                if ctype != "application/merge-patch+json":
                    raise ApiError(
                        415,
                        "UnsupportedMediaType",
                        f"the body of the request was in an unknown format - accepted media types include: "
                        f"application/json-patch+json, application/merge-patch+json, "
                        f"application/apply-patch+yaml "
                        f"(got {ctype!r}; this stand-in serves merge patches only)",
                    )
                patched = self._patch(res, ns, name, sub=sub, patch=_json(body), manager=manager)
                return web.json_response(patched)
            if method == "DELETE" and not sub:
                return web.json_response(self._delete(res, ns, name, body, q))
        elif sub == "binding" and method == "POST":
            return web.json_response(self._bind(ns, name, _json(body)), status=201)
        elif sub == "eviction" and method == "POST":
            return web.json_response(self._evict(ns, name, _json(body)), status=201)
        raise ApiError(
            405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
        )

    # -- verbs -----------------------------------------------------------------------------

    def _not_found(self, res: ApiResource, name: str) -> ApiError:
        details = {"name": name, "kind": res.plural}
        if res.group:
            details["group"] = res.group
        return ApiError(404, "NotFound", f'{res.qualified} "{name}" not found', details=details)

    def _conflict(self, res: ApiResource, name: str, why: str) -> ApiError:
        details = {"name": name, "kind": res.plural}
        if res.group:
            details["group"] = res.group
        return ApiError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {res.qualified} "{name}": {why}',
            details=details,
        )

    def _current(self, res: ApiResource, ns: str, name: str) -> JsonObj:
        obj = self._objects[res.plural].get((ns if res.namespaced else "", name))
        if obj is None:
            raise self._not_found(res, name)
        return obj

    def _get(self, res: ApiResource, ns: str, name: str) -> JsonObj:
        return _typed(res, self._current(res, ns, name))

    def _list(self, res: ApiResource, ns: str, q: Any) -> JsonObj:
        labels = parse_label_selector(q.get("labelSelector", ""))
        fields = parse_field_selector(q.get("fieldSelector", ""), res)
        token = q.get("continue", "")
        if token:
            try:
                decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
                rv, start = int(decoded["rv"]), str(decoded["start"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ApiError(400, "BadRequest", f"continue key is not valid: {exc}") from exc
            snap = self._snapshots.get(rv)
            if snap is None or rv < self._compacted:
                raise ApiError(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list result. "
                    "You can start a new list without the continue parameter.",
                )
            items = snap[res.plural]
        else:
            rv = self._rv
            snap = {
                p: [copy.deepcopy(o) for _, o in sorted(objs.items())] for p, objs in self._objects.items()
            }
            self._snapshots[rv] = snap
            while len(self._snapshots) > 16:
                self._snapshots.popitem(last=False)
            items = snap[res.plural]
            start = ""
        matching = [
            o
            for o in items
            if (not ns or o["metadata"].get("namespace") == ns)
            and _key_str(o) > start
            and labels_match(labels, o["metadata"].get("labels") or {})
            and fields_match(fields, o)
        ]
        limit = int(q.get("limit", "0") or 0)
        meta: JsonObj = {"resourceVersion": str(rv)}
        if limit and len(matching) > limit:
            page, rest = matching[:limit], matching[limit:]
            meta["continue"] = base64.urlsafe_b64encode(
                json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": _key_str(page[-1])}).encode()
            ).decode()
            meta["remainingItemCount"] = len(rest)
            matching = page
        out_items = [copy.deepcopy(o) if not res.builtin else _untyped(o) for o in matching]
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.api_version,
            "metadata": meta,
            "items": out_items,
        }

    def _create(self, res: ApiResource, ns: str, body: Any, manager: str) -> JsonObj:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of the request must be a JSON object")
        if not body.get("kind"):
            raise ApiError(400, "BadRequest", f"Object 'Kind' is missing in '{json.dumps(body)[:200]}'")
        if body.get("kind") != res.kind or body.get("apiVersion") != res.api_version:
            raise ApiError(
                400,
                "BadRequest",
                f"the API version in the data ({body.get('apiVersion')}) does not match the expected API "
                f"version ({res.api_version}) or the kind ({body.get('kind')}) is not {res.kind}",
            )
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        if res.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(_NAME_CHARS, k=5))
        if meta.get("resourceVersion"):
            raise ApiError(400, "BadRequest", "resourceVersion should not be set on objects to be created")
        validate_meta(res.kind, meta)
        if (ns, meta["name"]) in self._objects[res.plural]:
            details = {"name": meta["name"], "kind": res.plural}
            if res.group:
                details["group"] = res.group
            raise ApiError(
                409, "AlreadyExists", f'{res.qualified} "{meta["name"]}" already exists', details=details
            )
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        for server_owned in (
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
            "generation",
        ):
            meta.pop(server_owned, None)
        if res.kind not in _GENERATED and res.kind != "Pod":
            meta["generation"] = 1
        if res.kind == "Event":
            involved_ns = (obj.get("involvedObject") or {}).get("namespace") or ""
            if involved_ns and involved_ns != ns:
                raise ApiError(
                    422,
                    "Invalid",
                    f'Event "{meta["name"]}" is invalid: involvedObject.namespace: Invalid value: '
                    f'"{involved_ns}": does not match event.namespace',
                )
        if res.kind == "Pod":
            default_pod(obj)
            validate_pod(obj)
            obj["status"] = {"phase": "Pending", "qosClass": qos_class(obj)}
        elif res.kind == "PodDisruptionBudget":
            obj["status"] = {
                "disruptionsAllowed": 0,
                "currentHealthy": 0,
                "desiredHealthy": 0,
                "expectedPods": 0,
            }
        elif "status" in res.subresources:
            obj.pop("status", None)
        obj = self._admit(res, obj)
        record_manager(
            obj, manager=manager, operation="Update", api_version=res.api_version, body=body, subresource=None
        )
        self._commit(res, "ADDED", None, obj)
        self._after_write(res, ns)
        return _typed(res, self._current(res, ns, meta["name"]))

    def _patch(self, res: ApiResource, ns: str, name: str, *, sub: str, patch: Any, manager: str) -> JsonObj:
        if not isinstance(patch, dict):
            raise ApiError(400, "BadRequest", "a merge patch must be a JSON object here")
        old = self._current(res, ns, name)
        patched = merge_patch(copy.deepcopy(old), patch)
        meta = patched.get("metadata")
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        want = meta.get("resourceVersion")
        if want is not None and str(want) != old["metadata"]["resourceVersion"]:
            raise self._conflict(
                res,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            )
        if meta.get("name") != name:
            raise ApiError(
                400,
                "BadRequest",
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})",
            )
        validate_meta(res.kind, meta)
        for immutable in (
            "uid",
            "creationTimestamp",
            "namespace",
            "generation",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
            "resourceVersion",
        ):
            if immutable in old["metadata"]:
                meta[immutable] = copy.deepcopy(old["metadata"][immutable])
            else:
                meta.pop(immutable, None)
        patched["apiVersion"], patched["kind"] = (
            old.get("apiVersion", res.api_version),
            old.get("kind", res.kind),
        )
        if sub == "status":
            new = copy.deepcopy(old)
            if "status" in patched:
                new["status"] = patched["status"]
            else:
                new.pop("status", None)
        else:
            new = patched
            if "status" in res.subresources:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            if res.kind == "Pod":
                check_pod_update(old, new)
        new = self._admit(res, new)
        if sub != "status" and "generation" in old["metadata"] and _spec_of(old) != _spec_of(new):
            new["metadata"]["generation"] = int(old["metadata"]["generation"]) + 1
        if new == old:
            return _typed(res, old)  # a no-op update writes nothing and bumps no version
        record_manager(
            new,
            manager=manager,
            operation="Update",
            api_version=res.api_version,
            body=patch,
            subresource=sub or None,
        )
        self._commit(res, "MODIFIED", old, new)
        if not (res.kind == "PodDisruptionBudget" and sub == "status"):
            # the stand-in disruption controller resyncs on pod changes and budget specs, so a
            # status written by a client stands until then (the real one runs a moment later)
            self._after_write(res, ns)
        return _typed(res, new)

    def _admit(self, res: ApiResource, obj: JsonObj) -> JsonObj:
        """A custom resource pruned to its CRD's structural schema and validated against it
        (see :mod:`standins.crd_schema`); other kinds as they are. Pruned field paths go
        to ``pruned``. Raises ``ApiError`` 422 Invalid with one cause per invalid field."""
        if not is_custom_kind(res.kind):
            return obj
        try:
            return prune_and_validate(obj, dropped=self.pruned)
        except SchemaError as exc:
            causes = [{"reason": "FieldValueInvalid", "message": msg, "field": f} for f, msg in exc.causes]
            details = {
                "name": (obj.get("metadata") or {}).get("name", ""),
                "group": res.group,
                "kind": res.kind,
                "causes": causes,
            }
            raise ApiError(422, "Invalid", str(exc), details=details) from exc

    def _delete(self, res: ApiResource, ns: str, name: str, body: bytes, q: Any) -> JsonObj:
        old = self._current(res, ns, name)
        options = _json(body) if body else {}
        grace = options.get("gracePeriodSeconds") if isinstance(options, dict) else None
        if grace is None and "gracePeriodSeconds" in q:
            grace = int(q["gracePeriodSeconds"])
        return self._remove_object(res, old, grace)

    def _remove_object(self, res: ApiResource, old: JsonObj, grace: int | None) -> JsonObj:
        """Delete ``old``; a bound Pod goes graceful (``rest.BeforeDelete`` and the pod
        strategy's ``CheckGracefulDelete``): the grace period defaults to
        ``spec.terminationGracePeriodSeconds`` (30), an unscheduled or terminal pod goes at
        once, a positive grace sets ``deletionTimestamp`` + ``deletionGracePeriodSeconds``
        and the pod stays until a delete with grace 0 (the kubelet's confirmation, sent
        here at once when ``kubelet_confirms_deletion``). A repeated delete of a Terminating
        pod only shortens its grace period, never lengthens it."""
        ns = old["metadata"].get("namespace", "")
        if res.kind == "Pod":
            if grace is None:
                grace = int(old["spec"].get("terminationGracePeriodSeconds", 30))
            terminal = (old.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            if not old["spec"].get("nodeName") or terminal:
                grace = 0
            if grace < 0:
                grace = 1  # CheckGracefulDelete: a negative period becomes 1
            current = old["metadata"].get("deletionGracePeriodSeconds")
            if grace > 0 and (current is None or grace < int(current)):
                new = copy.deepcopy(old)
                when = datetime.now(UTC) + timedelta(seconds=grace)
                new["metadata"]["deletionTimestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
                new["metadata"]["deletionGracePeriodSeconds"] = grace
                self._commit(res, "MODIFIED", old, new)
                self._after_write(res, ns)
                if not self.kubelet_confirms_deletion:
                    return _typed(res, new)
                old = new  # kubelet saw the containers stop and confirms with grace 0
            elif grace > 0:
                return _typed(res, old)  # already Terminating with a grace period no longer
        final = copy.deepcopy(old)
        self._commit(res, "DELETED", old, final)
        self._after_write(res, ns)
        return _typed(res, final)

    def _bind(self, ns: str, name: str, binding: Any) -> JsonObj:
        res = _BY_KIND["Pod"]
        if not isinstance(binding, dict) or binding.get("kind") != "Binding":
            raise ApiError(400, "BadRequest", "expected a v1 Binding")
        bmeta = binding.get("metadata") or {}
        if bmeta.get("name") != name:
            raise ApiError(400, "BadRequest", "name in URL does not match name in Binding object")
        target = (binding.get("target") or {}).get("name")
        if not target:
            raise ApiError(422, "Invalid", f'Binding "{name}" is invalid: target.name: Required value')
        pod = self._current(res, ns, name)
        uid = bmeta.get("uid")
        if uid and uid != pod["metadata"]["uid"]:
            raise self._conflict(
                res,
                name,
                f"Precondition failed: UID in precondition: {uid}, "
                f"UID in object meta: {pod['metadata']['uid']}",
            )
        version = bmeta.get("resourceVersion")
        if version and version != pod["metadata"]["resourceVersion"]:
            raise self._conflict(
                res,
                name,
                f"Precondition failed: ResourceVersion in precondition: {version}, "
                f"ResourceVersion in object meta: {pod['metadata']['resourceVersion']}",
            )
        binding_res = ApiResource(
            group="",
            version="v1",
            plural="pods/binding",
            kind="Binding",
            namespaced=True,
            subresources=frozenset(),
            field_labels=frozenset(),
            builtin=True,
        )
        if pod["metadata"].get("deletionTimestamp"):
            raise self._conflict(
                binding_res, name, f"pod {name} is being deleted, cannot be assigned to a host"
            )
        if pod["spec"].get("nodeName"):
            raise self._conflict(
                binding_res, name, f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"'
            )
        if pod["spec"].get("schedulingGates"):  # "Reject binding to a scheduling un-ready Pod."
            raise self._conflict(binding_res, name, f"pod {name} has non-empty .spec.schedulingGates")
        new = copy.deepcopy(pod)
        new["spec"]["nodeName"] = target
        (new.get("status") or {}).pop("nominatedNodeName", None)  # ClearingNominatedNodeNameAfterBinding
        if bmeta.get("annotations"):
            new["metadata"].setdefault("annotations", {}).update(bmeta["annotations"])
        status = new.setdefault("status", {})
        conds = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conds.append(
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": now_rfc3339(),
            }
        )
        status["conditions"] = conds
        record_manager(
            new,
            manager="kube-scheduler",
            operation="Update",
            api_version="v1",
            body={"status": {"conditions": conds}},
            subresource="status",
        )
        self._commit(res, "MODIFIED", pod, new)
        return _success(201)

    def _evict(self, ns: str, name: str, eviction: Any) -> JsonObj:
        res = _BY_KIND["Pod"]
        if not isinstance(eviction, dict) or eviction.get("kind") != "Eviction":
            raise ApiError(400, "BadRequest", "expected a policy/v1 Eviction")
        if (eviction.get("metadata") or {}).get("name") != name:
            raise ApiError(400, "BadRequest", "name in URL does not match name in Eviction object")
        pod = self._current(res, ns, name)
        grace = (eviction.get("deleteOptions") or {}).get("gracePeriodSeconds")
        if not pod_ignores_pdb(pod):
            pdb_res = _BY_KIND["PodDisruptionBudget"]
            labels = pod["metadata"].get("labels") or {}
            pdbs = [
                p
                for (pns, _), p in self._objects[pdb_res.plural].items()
                if pns == ns and label_selector_object_matches((p.get("spec") or {}).get("selector"), labels)
            ]
            if len(pdbs) > 1:
                raise ApiError(
                    500,
                    "InternalError",
                    "This pod has more than one PodDisruptionBudget, "
                    "which the eviction subresource does not support.",
                )
            if pdbs:
                pdb = pdbs[0]
                status = pdb.get("status") or {}
                if status.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
                    raise ApiError(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        details={"retryAfterSeconds": 10},
                        retry_after=10,
                    )
                if int(status.get("disruptionsAllowed", 0)) <= 0:
                    raise ApiError(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        details={
                            "causes": [
                                {
                                    "reason": "DisruptionBudget",
                                    "message": (
                                        f"The disruption budget {pdb['metadata']['name']} needs "
                                        f"{status.get('desiredHealthy', 0)} healthy pods and has "
                                        f"{status.get('currentHealthy', 0)} currently"
                                    ),
                                }
                            ]
                        },
                    )
                new_pdb = copy.deepcopy(pdb)
                new_pdb["status"]["disruptionsAllowed"] = int(status["disruptionsAllowed"]) - 1
                new_pdb["status"].setdefault("disruptedPods", {})[name] = now_rfc3339()
                self._commit(pdb_res, "MODIFIED", pdb, new_pdb)
        self._remove_object(res, pod, grace)
        return _success(201)

    # -- watch -----------------------------------------------------------------------------

    async def _watch(self, request: web.Request, res: ApiResource, ns: str) -> web.StreamResponse:
        q = request.query
        labels = parse_label_selector(q.get("labelSelector", ""))
        fields = parse_field_selector(q.get("fieldSelector", ""), res)
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        timeout = float(q.get("timeoutSeconds") or 1800)
        rv_param = q.get("resourceVersion", "")

        def matches(obj: JsonObj | None) -> bool:
            if obj is None:
                return False
            meta = obj["metadata"]
            return (
                (not ns or meta.get("namespace") == ns)
                and labels_match(labels, meta.get("labels") or {})
                and fields_match(fields, obj)
            )

        start = 0
        if rv_param not in ("", "0"):
            try:
                start = int(rv_param)
            except ValueError as exc:
                raise ApiError(400, "BadRequest", f"invalid resource version: {rv_param}") from exc
            if start < self._compacted and self.gone_as_http_status:
                raise ApiError(410, "Expired", f"too old resource version: {start} ({self._compacted})")
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        conn = _WatchConn(request)
        self._watches.add(conn)
        loop = asyncio.get_running_loop()
        try:
            if rv_param in ("", "0"):
                for _, obj in sorted(self._objects[res.plural].items()):
                    if matches(obj):
                        await _send(resp, "ADDED", _typed(res, obj))
                last = self._rv
            else:
                last = start
            deadline = loop.time() + timeout
            next_bookmark = loop.time() + self.bookmark_interval
            while not conn.stopped and not self._closing:
                changed = self._changed
                if last < self._compacted:
                    await _send(
                        resp,
                        "ERROR",
                        ApiError(
                            410, "Expired", f"too old resource version: {last} ({self._compacted})"
                        ).status(),
                    )
                    break
                index = bisect.bisect_right(self._log, last, key=lambda c: c.rv)
                for change in self._log[index:]:
                    if change.res is not res:
                        continue
                    event = _event_for(change, matches)
                    if event is not None:
                        await _send(resp, event[0], _typed(res, event[1]))
                last = self._rv
                now = loop.time()
                if now >= deadline:
                    break
                if bookmarks and now >= next_bookmark:
                    await _send(resp, "BOOKMARK", _bookmark(res, last))
                    next_bookmark = now + self.bookmark_interval
                wake = min(deadline, next_bookmark) if bookmarks else deadline
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), max(0.0, wake - now))
            await resp.write_eof()
        except (ConnectionResetError, RuntimeError):
            pass  # the client went away (or drop_watches cut the connection)
        finally:
            self._watches.discard(conn)
        return resp


def _json(body: bytes) -> Any:
    try:
        return json.loads(body) if body else None
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"the body of the request is not JSON: {exc}") from exc


def _key_str(obj: JsonObj) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


def _typed(res: ApiResource, obj: JsonObj) -> JsonObj:
    out = copy.deepcopy(obj)
    out["apiVersion"], out["kind"] = res.api_version, res.kind
    return {"kind": out.pop("kind"), "apiVersion": out.pop("apiVersion"), **out}


def _untyped(obj: JsonObj) -> JsonObj:
    out = copy.deepcopy(obj)
    out.pop("kind", None)
    out.pop("apiVersion", None)
    return out


def _spec_of(obj: JsonObj) -> JsonObj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _success(code: int) -> JsonObj:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code}


def _bookmark(res: ApiResource, rv: int) -> JsonObj:
    obj: JsonObj = {
        "kind": res.kind,
        "apiVersion": res.api_version,
        "metadata": {"resourceVersion": str(rv), "creationTimestamp": None},
    }
    if res.kind == "Pod":  # what kube-apiserver really sends for a Pod bookmark
        obj["spec"] = {"containers": None}
        obj["status"] = {}
    return obj


def _event_for(change: Change, matches: Callable[[JsonObj | None], bool]) -> tuple[str, JsonObj] | None:
    """The event a selector-filtered watcher sees for ``change`` (cacheWatcher.convertToWatchEvent)."""
    now_ok = matches(change.obj)
    if change.type == "ADDED":
        return ("ADDED", change.obj) if now_ok else None
    if change.type == "DELETED":
        return ("DELETED", change.obj) if matches(change.old) or now_ok else None
    was_ok = matches(change.old)
    if now_ok and was_ok:
        return ("MODIFIED", change.obj)
    if now_ok:
        return ("ADDED", change.obj)
    if was_ok:
        old = copy.deepcopy(change.old) if change.old is not None else {}
        old["metadata"]["resourceVersion"] = str(change.rv)
        return ("DELETED", old)
    return None


async def _send(resp: web.StreamResponse, etype: str, obj: JsonObj) -> None:
    await resp.write(json.dumps({"type": etype, "object": obj}, separators=(",", ":")).encode() + b"\n")
