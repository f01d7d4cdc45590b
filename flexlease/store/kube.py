"""``KubeStore``: the Store Protocol (:mod:`flexlease.store.base`) on a Kubernetes API server.

Built on kubernetes_asyncio's ``ApiClient`` raw call path (``call_api`` with the
``object`` response type): it brings authentication, TLS and the connection pool, while
request and response bodies stay plain Kubernetes JSON, byte-faithful, for every kind
including the flexlease CRDs. Resource coordinates: :mod:`flexlease.store.kube_resources`;
credentials: :mod:`flexlease.store.kube_auth`.

Verbs and their Kubernetes API calls (k8s.io/apiserver REST semantics):

* ``list``: ``GET`` collection with ``limit``/``continue`` pages (500 per page; a page token
  that expired, 410, restarts as one unpaged list, as client-go's pager does); the first
  page's ``metadata.resourceVersion`` is the list's. ``apiVersion``/``kind`` are filled in
  on items (the API server leaves them out of list items for built-in kinds).
* ``watch``: ``GET ...?watch=1&resourceVersion=R&allowWatchBookmarks=true&timeoutSeconds=T``;
  one JSON ``WatchEvent`` per line (``R`` = ``"0"``/``""``: a list delivered as ADDED, then a
  watch from the list's version). When the server ends the stream (``timeoutSeconds``) or
  the connection drops, or a 429/5xx answers, the watch resumes from the last version it
  saw (bookmarks included) after an exponential back-off; ``410 Gone`` — as the HTTP status
  or as an ``ERROR`` event carrying a ``Status`` with code 410 — raises
  :class:`~flexlease.errors.Gone` (list again). Other errors (401, 403, 404, ...) raise.
* ``patch``: ``PATCH`` with ``Content-Type: application/merge-patch+json`` (RFC 7386); a
  ``resource_version`` precondition travels as the patch's ``metadata.resourceVersion``,
  which the API server compares and answers 409 when it differs.
* ``bind``: ``POST pods/{name}/binding`` with a ``v1.Binding`` (``metadata.uid`` is the
  UID precondition). ``evict``: ``POST pods/{name}/eviction`` with a ``policy/v1``
  ``Eviction``; 429 (a PodDisruptionBudget says no) raises
  :class:`~flexlease.errors.TooManyRequests` with ``Retry-After`` (or the Status'
  ``details.retryAfterSeconds``).

Every call has a deadline: ``StoreSettings.request_timeout_seconds`` for each request, and
for watches ``watch_timeout_seconds`` sent as ``timeoutSeconds`` plus a client-side read
deadline of that plus the request timeout (a silent, half-dead connection is noticed).
HTTP failures map to :mod:`flexlease.errors` (404 ``NotFound``, 409 ``Conflict``, 410
``Gone``, 429 ``TooManyRequests``, anything else ``StoreError`` with ``status``), with
kubernetes_asyncio's ``ApiException`` (status, headers, the ``Status`` body) chained;
transport failures and timeouts raise ``StoreError`` with the aiohttp error chained.
Responses and watch lines are decoded by :func:`flexlease.jsontext.loads`: what ``json.loads``
reads, through orjson where the two agree (docs/results/benchmarks.md, round 12).

The proxy environment (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``) is read once, when the
store is built, as client-go reads it once per process, and by client-go's rules
(:mod:`flexlease.store.kube_proxy`: CIDR ranges in ``NO_PROXY``, loopback never proxied);
``~/.netrc`` is not read (client-go never does). kubernetes_asyncio's own session looks both
up again for every request, in worker threads (:func:`_environment_read_once`).

Pod scoping (``pod_filter``): a client-side predicate over Pod JSON (see
:class:`flexlease.store.kube_filter.ManagedPods`), applied here, in the store, to ``list``
and ``watch`` of ``Kind.POD`` (``get`` and writes are not filtered). Watch events are
rewritten as an API server rewrites them for a selector: a pod that starts to match arrives
as ``ADDED``, one that stops matching as ``DELETED``, others that never matched are dropped.
Each watch tracks the keys it delivered, seeded from the keys that passed earlier lists and
watches of this store, so an informer that lists then watches stays exact.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException
from yarl import URL

from flexlease import jsontext, tasks
from flexlease.config import StoreSettings
from flexlease.errors import Conflict, Gone, NotFound, StoreError, TooManyRequests
from flexlease.logging import ctx
from flexlease.store.base import EVERYTHING, EventType, JsonObj, Kind, ObjectList, Selector, WatchEvent
from flexlease.store.kube_auth import load_configuration
from flexlease.store.kube_proxy import ProxyEnvironment
from flexlease.store.kube_resources import RESOURCES, Resource

log = logging.getLogger(__name__)

PodFilter = Callable[[JsonObj], bool]
"""Predicate over Pod JSON: True to keep the pod (see the module docstring)."""

LIST_PAGE_SIZE: Final = 500
"""Items per list page (client-go's pager default)."""
FIELD_MANAGER: Final = "flexlease"
"""``fieldManager`` recorded in ``metadata.managedFields`` for flexlease's writes."""
USER_AGENT: Final = "flexlease/0.1 (kubernetes_asyncio)"

_Query = list[tuple[str, str]]
_Items = list[JsonObj]

_TRANSIENT_STATUS: Final = frozenset({429, 500, 502, 503, 504})
_OK: Final = frozenset({200, 201, 202})
"""The statuses of a successful call, with a JSON object (``Status`` or the object)."""
_MERGE_PATCH: Final = "application/merge-patch+json"


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """Exponential back-off for watch reconnects, in seconds: ``initial``, times ``factor``
    per failure up to ``maximum``, each delay stretched by up to ``jitter`` (ratio 0–1)."""

    initial: float = 0.5
    maximum: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2

    def delays(self) -> _Delays:
        return _Delays(self)


class _Delays:
    def __init__(self, backoff: Backoff) -> None:
        self._backoff = backoff
        self._next = backoff.initial

    def reset(self) -> None:
        self._next = self._backoff.initial

    def next(self) -> float:
        delay = self._next
        self._next = min(self._backoff.maximum, self._next * self._backoff.factor)
        return delay * (1.0 + self._backoff.jitter * random.random())


class _Retry(Exception):
    """Internal: the watch stream failed in a way worth resuming (never leaves this module)."""


class KubeStore:
    """The Store Protocol over the Kubernetes API (module docstring has the details).

    Build with :meth:`connect` (config from ``StoreSettings``) or from an ``ApiClient``
    whose configuration points at the API server; the store owns the client and closes it
    in :meth:`close`.
    """

    def __init__(
        self,
        api: ApiClient,
        settings: StoreSettings,
        *,
        pod_filter: PodFilter | None = None,
        reconnect: Backoff = Backoff(),
        list_page_size: int = LIST_PAGE_SIZE,
    ) -> None:
        self._api = api
        self._api.user_agent = USER_AGENT
        _environment_read_once(api)
        self._timeout = settings.request_timeout_seconds
        self._watch_timeout = settings.watch_timeout_seconds
        self._pod_filter = pod_filter
        self._reconnect = reconnect
        self._page = list_page_size
        self._passed_pods: set[str] = set()
        self._streams: set[aiohttp.ClientResponse] = set()
        self._watches: set[_Watch] = set()
        self._closing = asyncio.Event()

    @classmethod
    async def connect(
        cls,
        settings: StoreSettings,
        *,
        pod_filter: PodFilter | None = None,
        reconnect: Backoff = Backoff(),
    ) -> KubeStore:
        """A store for the cluster found by :func:`flexlease.store.kube_auth.load_configuration`
        (``settings.kubeconfig``, else in-cluster, else ``$KUBECONFIG``/``~/.kube/config``).
        Raises ``StoreError`` when no usable configuration exists. No request is made."""
        configuration = await load_configuration(settings.kubeconfig)
        return cls(ApiClient(configuration), settings, pod_filter=pod_filter, reconnect=reconnect)

    @classmethod
    def for_host(
        cls,
        host: str,
        settings: StoreSettings,
        *,
        token: str | None = None,
        pod_filter: PodFilter | None = None,
        reconnect: Backoff = Backoff(),
        list_page_size: int = LIST_PAGE_SIZE,
    ) -> KubeStore:
        """A store for ``host`` (``http(s)://addr:port``) with an optional bearer token,
        without a kubeconfig (local tools, tests against a stand-in API server)."""
        configuration = Configuration(host=host.rstrip("/"))
        if token is not None:
            configuration.api_key["BearerToken"] = f"Bearer {token}"
        return cls(
            ApiClient(configuration),
            settings,
            pod_filter=pod_filter,
            reconnect=reconnect,
            list_page_size=list_page_size,
        )

    @property
    def closed(self) -> bool:
        return self._closing.is_set()

    # -- reads -------------------------------------------------------------------------------

    async def list(
        self, kind: Kind, *, namespace: str | None = None, selector: Selector = EVERYTHING
    ) -> ObjectList:
        """All objects of ``kind`` (in ``namespace``, or all) matching ``selector``, read in
        pages, and the list's resourceVersion. Raises ``StoreError`` (``NotFound`` when the
        resource is not served, e.g. the CRD is not installed)."""
        res = RESOURCES[kind]
        path = res.collection_path(namespace)
        base = _selector_query(selector)
        try:
            items, rv = await self._list_pages(res, path, base, limit=self._page)
        except Gone:  # a continue token expired between pages: one consistent unpaged list
            items, rv = await self._list_pages(res, path, base, limit=None)
        if kind is Kind.POD and self._pod_filter is not None:
            kept = [p for p in items if self._pod_passes(p)]
            keys = {_key(p) for p in kept}
            if namespace is None and not selector.labels and not selector.fields:
                self._passed_pods = keys
            else:
                self._passed_pods |= keys
            items = kept
        return ObjectList(items=items, resource_version=rv)

    async def _list_pages(
        self, res: Resource, path: str, base: _Query, *, limit: int | None
    ) -> tuple[_Items, str]:
        items: _Items = []
        rv = ""
        token = ""
        while True:
            query = list(base)
            if limit is not None:
                query.append(("limit", str(limit)))
            if token:
                query.append(("continue", token))
            body = await self._call("GET", path, query=query)
            for item in body.get("items") or []:
                items.append(_with_type(res, item))
            meta = body.get("metadata") or {}
            rv = rv or str(meta.get("resourceVersion") or "")
            token = str(meta.get("continue") or "")
            if not token:
                return items, rv

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> JsonObj:
        """One object. Raises ``NotFound``."""
        res = RESOURCES[kind]
        return _with_type(res, await self._call("GET", _object_path(res, name, namespace)))

    def watch(
        self,
        kind: Kind,
        *,
        resource_version: str,
        namespace: str | None = None,
        selector: Selector = EVERYTHING,
    ) -> AsyncIterator[WatchEvent]:
        """Changes after ``resource_version`` until the caller stops (``aclose``) or the store
        closes; resumes by itself across stream ends and dropped connections. Raises
        ``Gone``. A cancelled ``__anext__`` (``asyncio.timeout`` around it) loses nothing:
        the stream is read by a task named ``kube-watch/<kind>`` started at the first
        ``__anext__``, which hands events over one at a time."""
        return _Watch(
            self, self._watch(kind, resource_version, namespace, selector), f"kube-watch/{kind.value}"
        )

    async def _watch(
        self, kind: Kind, resource_version: str, namespace: str | None, selector: Selector
    ) -> AsyncGenerator[WatchEvent, None]:
        res = RESOURCES[kind]
        path = res.collection_path(namespace)
        rv = resource_version
        if rv in ("", "0"):
            # "from now": a consistent list delivered as ADDED, then a watch from its version.
            # (Watching from "0" directly would give the same events, but a stream broken in
            # the middle of its initial ADDED burst could not be resumed.)
            listed = await self.list(kind, namespace=namespace, selector=selector)
            for item in listed.items:
                yield WatchEvent(EventType.ADDED, item)
            rv = listed.resource_version
        delays = self._reconnect.delays()
        gate = _PodGate(self) if kind is Kind.POD and self._pod_filter is not None else None
        while not self.closed:
            try:
                resp = await self._open_watch(path, rv, selector)
            except _Retry as exc:
                if not self.closed:
                    log.warning("watch reconnect", extra=ctx(kind=kind.value, rv=rv, error=str(exc)))
                if await self._pause(delays.next()):
                    return
                continue
            self._streams.add(resp)
            lines = 0
            try:
                while True:
                    try:
                        line = await resp.content.readline()
                    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                        raise _Retry(str(exc)) from exc
                    if not line:  # the server ended the stream (timeoutSeconds): resume from rv
                        if not lines and await self._pause(delays.next()):
                            return  # (an empty stream, e.g. a proxy hanging up: do not spin)
                        break
                    lines += 1
                    event = _decode_event(res, line, rv)
                    delays.reset()
                    rv = event.resource_version or rv
                    out = gate.rewrite(event) if gate is not None else event
                    if out is not None:
                        yield out
            except _Retry as exc:
                if self.closed:
                    return
                log.warning("watch stream broke", extra=ctx(kind=kind.value, rv=rv, error=str(exc)))
                if await self._pause(delays.next()):
                    return
            finally:
                self._streams.discard(resp)
                resp.close()

    async def _open_watch(self, path: str, rv: str, selector: Selector) -> aiohttp.ClientResponse:
        query = [
            *_selector_query(selector),
            ("watch", "1"),
            ("resourceVersion", rv),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(max(1, int(self._watch_timeout)))),
        ]
        timeout = aiohttp.ClientTimeout(
            total=self._watch_timeout + self._timeout,
            sock_connect=self._timeout,
            sock_read=self._watch_timeout + self._timeout,
        )
        try:
            resp: aiohttp.ClientResponse = await self._api.call_api(
                path,
                "GET",
                query_params=query,
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            if self.closed:
                raise _Retry("store closed") from exc
            raise _Retry(str(exc)) from exc
        if resp.status == 200:
            return resp
        try:
            data = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _Retry(str(exc)) from exc
        finally:
            resp.close()
        api_exc = _api_exception(resp.status, resp.reason or "", data, resp.headers)
        if resp.status in _TRANSIENT_STATUS:
            raise _Retry(f"{resp.status} {resp.reason}") from api_exc
        raise _map_error(api_exc, f"watch {path}") from api_exc

    async def _pause(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless the store closes first; True when it closed."""
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)
        except TimeoutError:
            return False
        return True

    # -- writes ------------------------------------------------------------------------------

    async def create(self, kind: Kind, obj: JsonObj) -> JsonObj:
        """``POST`` the object (``apiVersion``/``kind`` filled in when absent). Raises
        ``Conflict`` (exists), ``StoreError`` (status 400) when a namespaced object has no
        ``metadata.namespace``, (422) when the API server finds it invalid."""
        res = RESOURCES[kind]
        body = _with_type(res, dict(obj))
        namespace = None
        if res.namespaced:
            meta = body.get("metadata")
            namespace = meta.get("namespace") if isinstance(meta, dict) else None
            if not namespace:
                raise StoreError(f"{kind}: metadata.namespace is required to create it", status=400)
        created = await self._call(
            "POST", res.collection_path(namespace), query=[("fieldManager", FIELD_MANAGER)], body=body
        )
        return _with_type(res, created)

    async def patch(
        self,
        kind: Kind,
        name: str,
        patch: JsonObj,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        resource_version: str | None = None,
    ) -> JsonObj:
        """JSON merge patch (``application/merge-patch+json``); ``resource_version`` goes in
        as ``metadata.resourceVersion`` (409 → ``Conflict``). Raises ``NotFound``."""
        res = RESOURCES[kind]
        body = dict(patch)
        if resource_version is not None:
            meta = body.get("metadata")
            body["metadata"] = {
                **(meta if isinstance(meta, dict) else {}),
                "resourceVersion": resource_version,
            }
        updated = await self._call(
            "PATCH",
            _object_path(res, name, namespace, subresource),
            query=[("fieldManager", FIELD_MANAGER)],
            body=body,
            content_type=_MERGE_PATCH,
        )
        return _with_type(res, updated)

    async def delete(
        self, kind: Kind, name: str, *, namespace: str | None = None, grace_period_seconds: int | None = None
    ) -> None:
        """``DELETE`` with ``DeleteOptions.gracePeriodSeconds`` (the server's default when
        None; 0 = now). Raises ``NotFound``."""
        body: JsonObj | None = None
        if grace_period_seconds is not None:
            body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": grace_period_seconds}
        await self._call("DELETE", _object_path(RESOURCES[kind], name, namespace), body=body)

    async def bind(
        self,
        namespace: str,
        name: str,
        *,
        uid: str | None,
        node: str,
        annotations: Mapping[str, str] | None = None,
        resource_version: str | None = None,
    ) -> None:
        """``POST pods/{name}/binding`` (``annotations`` in the Binding's metadata: the API
        server adds them to the pod's; ``uid`` and ``resource_version`` as its ``metadata.uid``
        and ``metadata.resourceVersion``, preconditions the API server checks). Raises
        ``NotFound``; ``Conflict`` when the pod is already bound or ``uid`` or
        ``resource_version`` differs from the pod's."""
        meta: JsonObj = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        if resource_version:
            meta["resourceVersion"] = resource_version
        if annotations:
            meta["annotations"] = dict(annotations)
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        path = RESOURCES[Kind.POD].object_path(name, namespace, "binding")
        await self._call("POST", path, query=[("fieldManager", FIELD_MANAGER)], body=binding)

    async def evict(self, namespace: str, name: str, *, grace_period_seconds: int | None = None) -> None:
        """``POST pods/{name}/eviction`` (policy/v1). Raises ``NotFound``;
        ``TooManyRequests`` (with ``retry_after`` seconds) when a PodDisruptionBudget
        forbids the eviction now."""
        eviction: JsonObj = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if grace_period_seconds is not None:
            eviction["deleteOptions"] = {"gracePeriodSeconds": grace_period_seconds}
        await self._call("POST", RESOURCES[Kind.POD].object_path(name, namespace, "eviction"), body=eviction)

    async def close(self) -> None:
        """End running watches (they stop iterating) and close the HTTP client."""
        if self.closed:
            return
        self._closing.set()
        for resp in list(self._streams):
            resp.close()
        for watch in list(self._watches):
            await watch.stop()
        await self._api.close()

    # -- plumbing ----------------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        path: str,
        *,
        query: _Query | None = None,
        body: JsonObj | None = None,
        content_type: str = "application/json",
    ) -> JsonObj:
        """One API call; its JSON object (a 200, 201 or 202). kubernetes_asyncio sends the
        request (auth, TLS, proxy, ``body`` encoded by its own rules); the response is read
        here and decoded by :func:`flexlease.jsontext.loads` (what ``json.loads`` reads,
        several times faster than the library's decoding), as for watch lines. Raises what
        :func:`_map_error` maps a non-2xx status to, ``StoreError`` on a timeout, a broken
        connection or a body that is not a JSON object."""
        if self.closed:
            raise StoreError(f"{method} {path}: the store is closed")
        try:
            resp: aiohttp.ClientResponse = await self._api.call_api(
                path,
                method,
                query_params=query or [],
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(total=self._timeout),
            )
            try:
                data = await resp.read()
            finally:
                resp.release()
        except ApiException as exc:  # the library refused to build the request
            raise _map_error(exc, f"{method} {path}") from exc
        except TimeoutError as exc:
            raise StoreError(f"{method} {path}: no answer within {self._timeout:g} s") from exc
        except aiohttp.ClientError as exc:
            raise StoreError(f"{method} {path}: {exc!r}") from exc
        if not 200 <= resp.status <= 299:
            refused = _api_exception(resp.status, resp.reason or "", data, resp.headers)
            raise _map_error(refused, f"{method} {path}") from refused
        if resp.status not in _OK:
            raise StoreError(f"{method} {path}: {resp.status} {resp.reason or ''}; expected a JSON object")
        try:
            result = jsontext.loads(data)
        except ValueError as exc:
            raise StoreError(f"{method} {path}: the response is not JSON: {exc}") from exc
        if not isinstance(result, dict):
            raise StoreError(f"{method} {path}: expected a JSON object, got {type(result).__name__}")
        return result

    def _pod_passes(self, pod: JsonObj) -> bool:
        assert self._pod_filter is not None
        return self._pod_filter(pod)


_READ_BUFFER_BYTES: Final = 2**21
"""The session's read buffer, as kubernetes_asyncio sets it (watch events of large objects
outgrow aiohttp's default; etcd's default request limit is 1.5 MiB)."""


def _environment_read_once(api: ApiClient) -> None:
    """Make ``api`` read the proxy environment once, now, instead of on every request.

    kubernetes_asyncio (``rest.RESTClientObject``) opens its aiohttp session with
    ``trust_env=True``, and aiohttp then looks up ``~/.netrc`` (for any request without a
    ``BasicAuth``: bearer tokens travel as a header) and the proxy variables on every request,
    each in a worker thread: two thread hand-offs, a file read and the loop's wake-up per API
    call (docs/results/benchmarks.md, round 11). client-go reads the proxy variables once
    per process (``http.ProxyFromEnvironment``) and never reads ``.netrc``. So here a session
    with ``trust_env=False`` on the same connector, with the library session's timeout,
    headers, cookie jar and decompression, takes the library's place, and :func:`_env_proxy`
    for the API server's URL goes into the library's own ``proxy`` setting, unless the
    configuration names one (a kubeconfig's ``proxy-url``)."""
    rest = api.rest_client
    session: aiohttp.ClientSession = rest.pool_manager
    rest.pool_manager = aiohttp.ClientSession(
        connector=session.connector,
        trust_env=False,
        timeout=session.timeout,
        headers=session.headers,
        cookie_jar=session.cookie_jar,
        auto_decompress=session.auto_decompress,
        read_bufsize=_READ_BUFFER_BYTES,
    )
    session.detach()  # the old session gives up the connector without closing it
    host = URL(api.configuration.host or "")
    proxy = _env_proxy(host) if not rest.proxy and host.host else None
    if proxy is not None:
        rest.proxy = proxy


def _env_proxy(url: URL) -> str | None:
    """The proxy the environment names for ``url``, by client-go's rules
    (:mod:`flexlease.store.kube_proxy`: ``HTTPS_PROXY``/``HTTP_PROXY`` by its scheme, upper
    case first, unless ``NO_PROXY`` — names, suffixes, IP addresses, CIDR ranges, ``*`` —
    bypasses it; loopback and ``localhost`` always direct). Credentials stay in the proxy URL
    (aiohttp sends them as ``Proxy-Authorization``, on the ``CONNECT`` for an HTTPS API
    server). Only ``http://`` proxies, as aiohttp supports: another scheme is logged and the
    API server reached directly."""
    environment = ProxyEnvironment.read(os.environ)
    proxy = environment.proxy_for(url)
    if proxy is None:
        unparsable = environment.unparsable(url)
        if unparsable is not None:  # client-go would try it and fail; say why it is not used
            log.warning(
                "proxy from the environment does not parse as a URL with a host; connecting directly",
                extra=ctx(proxy=unparsable.rpartition("@")[2], host=url.host),
            )
        return None
    if proxy.scheme != "http":
        log.warning(
            "proxy from the environment not supported (aiohttp proxies over http:// only); "
            "connecting directly",
            extra=ctx(proxy=str(proxy.with_user(None)), host=url.host),
        )
        return None
    return str(proxy)


_END: Final = object()


class _Watch:
    """The iterator ``KubeStore.watch`` returns: a task pumps the stream generator into a
    one-slot queue, so cancelling ``__anext__`` never cuts a stream read in half."""

    def __init__(self, store: KubeStore, events: AsyncGenerator[WatchEvent, None], name: str) -> None:
        self._store = store
        self._events = events
        self._name = name
        self._queue: asyncio.Queue[WatchEvent | object] = asyncio.Queue(maxsize=1)
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._done = False

    def __aiter__(self) -> _Watch:
        return self

    async def __anext__(self) -> WatchEvent:
        if self._done:
            raise StopAsyncIteration
        if self._task is None:
            self._task = asyncio.create_task(self._pump(), name=self._name)
            self._store._watches.add(self)
        item = await self._queue.get()
        if isinstance(item, WatchEvent):
            return item
        self._done = True
        self._store._watches.discard(self)
        if self._error is not None:
            raise self._error
        raise StopAsyncIteration

    async def _pump(self) -> None:
        try:
            async for event in self._events:
                await self._queue.put(event)
        except Exception as exc:
            self._error = exc
        await self._queue.put(_END)

    async def aclose(self) -> None:
        """Stop reading and release the connection."""
        self._done = True
        await self.stop()

    async def stop(self) -> None:
        """End the pump and the stream; a consumer waiting in ``__anext__`` gets
        ``StopAsyncIteration`` (an event not yet taken is dropped)."""
        self._store._watches.discard(self)
        if self._task is not None and not self._task.done():
            await tasks.stop(self._task)
        await self._events.aclose()
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(_END)


class _PodGate:
    """One pod watch's view of which pods its consumer holds (module docstring)."""

    def __init__(self, store: KubeStore) -> None:
        self._store = store
        self._known = set(store._passed_pods)

    def rewrite(self, event: WatchEvent) -> WatchEvent | None:
        if event.type is EventType.BOOKMARK:
            return event
        key = _key(event.object)
        known = key in self._known
        registry = self._store._passed_pods
        if event.type is EventType.DELETED:
            self._known.discard(key)
            registry.discard(key)
            return event if known or self._store._pod_passes(event.object) else None
        if self._store._pod_passes(event.object):
            self._known.add(key)
            registry.add(key)
            return event if known else WatchEvent(EventType.ADDED, event.object)
        if known:
            self._known.discard(key)
            return WatchEvent(EventType.DELETED, event.object)
        return None


def _key(obj: JsonObj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def _object_path(res: Resource, name: str, namespace: str | None, subresource: str | None = None) -> str:
    try:
        return res.object_path(name, namespace if res.namespaced else None, subresource)
    except ValueError as exc:
        raise StoreError(f"{res.kind}: {exc}") from exc


def _with_type(res: Resource, obj: Any) -> JsonObj:
    if not isinstance(obj, dict):
        raise StoreError(f"{res.kind}: expected a JSON object, got {type(obj).__name__}")
    obj.setdefault("apiVersion", res.api_version)
    obj.setdefault("kind", res.kind.value)
    return obj


def _escape_field_value(value: str) -> str:
    """k8s.io/apimachinery/pkg/fields.EscapeValue: backslash, comma and equals escaped."""
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


def _selector_query(selector: Selector) -> _Query:
    query: _Query = []
    if selector.labels:
        query.append(("labelSelector", ",".join(f"{k}={v}" for k, v in sorted(selector.labels.items()))))
    if selector.fields:
        query.append(
            (
                "fieldSelector",
                ",".join(f"{k}={_escape_field_value(v)}" for k, v in sorted(selector.fields.items())),
            )
        )
    return query


def _decode_event(res: Resource, line: bytes, rv: str) -> WatchEvent:
    """One watch line → WatchEvent. ``ERROR`` events raise (410 → ``Gone``; 429/5xx →
    resume); a line that is not a WatchEvent breaks the stream (resume from ``rv``)."""
    try:
        raw = jsontext.loads(line)
        etype = raw["type"]
        obj = raw["object"]
        if not isinstance(obj, dict):
            raise TypeError("object is not a JSON object")
    except (ValueError, KeyError, TypeError) as exc:
        raise _Retry(f"undecodable watch event after resourceVersion {rv}: {line[:200]!r}") from exc
    if etype == "ERROR":
        code = int(obj.get("code") or 500)
        api_exc = _api_exception(code, str(obj.get("reason") or ""), json.dumps(obj).encode(), None)
        if code in _TRANSIENT_STATUS:
            raise _Retry(f"ERROR event {code}: {obj.get('message')}") from api_exc
        raise _map_error(api_exc, f"watch {res.plural} from resourceVersion {rv}") from api_exc
    try:
        event_type = EventType(etype)
    except ValueError as exc:
        raise _Retry(f"unknown watch event type {etype!r}") from exc
    return WatchEvent(event_type, _with_type(res, obj))


def _api_exception(status: int, reason: str, body: bytes, headers: Any) -> ApiException:
    """An ``ApiException`` as kubernetes_asyncio raises it (``headers``: the response's
    case-insensitive header mapping, or None), to chain as the cause."""
    exc = ApiException(status=status, reason=reason)
    exc.body = body
    exc.headers = headers
    return exc


def _status_of(exc: ApiException) -> JsonObj:
    body: Any = exc.body  # str once kubernetes_asyncio decoded it, bytes when built here
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _retry_after(exc: ApiException, status: JsonObj) -> float | None:
    headers: Any = exc.headers or {}
    value = next((v for k, v in headers.items() if str(k).lower() == "retry-after"), None)
    if value:
        try:
            return float(value)
        except ValueError:
            pass
    details = status.get("details") or {}
    seconds = details.get("retryAfterSeconds") if isinstance(details, dict) else None
    return float(seconds) if isinstance(seconds, int | float) and seconds > 0 else None


def _map_error(exc: ApiException, what: str) -> StoreError:
    """An ``ApiException`` (status + ``Status`` body) → the flexlease error for its code."""
    status = _status_of(exc)
    code = int(exc.status or status.get("code") or 0)
    detail = status.get("message") or exc.reason or "no message"
    message = f"{what}: {code} {status.get('reason') or exc.reason or ''}: {detail}"
    if code == 404:
        return NotFound(message)
    if code == 409:
        return Conflict(message)
    if code == 410:
        return Gone(message)
    if code == 429:
        return TooManyRequests(message, retry_after=_retry_after(exc, status))
    return StoreError(message, status=code or None)
