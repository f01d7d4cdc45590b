"""Defence in depth behind mutual TLS: which callers and which pods the extender serves.

Role (issue #18): even a caller that got past TLS may only drive pods of flexlease's own
kube-scheduler profiles onto real nodes.

* ``/bind`` refuses a pod whose ``spec.schedulerName`` is not in ``extender.scheduler_names``
  (unset means ``default-scheduler``, as the API server defaults it), a GPU pod on a node
  without a GPUNode, and a node that does not exist — a node with a GPUNode exists as far as
  the inventory knows; any other node is read from the store (``Kind.NODE``: the extender
  watches GPUNodes, not Nodes, so this costs one GET, only for pods without managed GPUs on
  nodes without a GPUNode). The Binding subresource itself does not check the node.
* ``/filter``, ``/prioritize``, ``/preempt`` answer pods of other schedulers as pods without
  managed GPUs (every candidate passes, scores 0, victims unchanged), reading no inventory.
* with ``extender.tls_client_names``, a client certificate carrying none of those names is
  answered 403 before any handler runs (:meth:`Admission.middleware`).

Every refusal is logged at warning with the caller (:func:`extender.tls.caller_identity`)
and counted in ``flexlease_extender_refusals_total{verb, reason}``.

Neighbours: built by :func:`extender.server.create_app`; :class:`extender.binder.Binder`
calls the bind check after reading the pod once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry, Counter

from extender import tls
from extender.metrics import VERBS
from extender.state import Inventory
from flexlease.api import keys
from flexlease.api.pod import GpuRequest
from flexlease.config import ExtenderSettings
from flexlease.errors import NotFound, StoreError
from flexlease.logging import ctx
from flexlease.store.base import JsonObj, Kind, Store

log = logging.getLogger(__name__)

REFUSALS: Final = "flexlease_extender_refusals"
FOREIGN_SCHEDULER: Final = "foreign_scheduler"
NO_GPUNODE: Final = "no_gpunode"
NO_NODE: Final = "no_node"
NODE_UNKNOWN: Final = "node_unknown"
CLIENT_NAME: Final = "client_name"
REASONS: Final = (FOREIGN_SCHEDULER, NO_GPUNODE, NO_NODE, NODE_UNKNOWN, CLIENT_NAME)
"""Bounded ``reason`` label values: other scheduler's pod, GPU pod on a node without a
GPUNode, node that does not exist, node existence unknown (store error), client certificate
name not allowed."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: ``reason`` (one of :data:`REASONS`) and the message the
    caller receives (``Error`` of the reply)."""

    reason: str
    message: str


BindCheck = Callable[[JsonObj, GpuRequest, str], Awaitable[Refusal | None]]
"""``(stored pod, its parsed request, node) -> refusal or None``, run by the binder."""


def scheduler_name(pod: JsonObj) -> str:
    """``spec.schedulerName`` of ``pod``; ``default-scheduler`` when unset or not a string."""
    spec = pod.get("spec")
    name = spec.get("schedulerName") if isinstance(spec, dict) else None
    return name if isinstance(name, str) and name else keys.KUBE_DEFAULT_SCHEDULER_NAME


def foreign_scheduler(pod: JsonObj, scheduler_names: tuple[str, ...]) -> Refusal | None:
    """A refusal when ``pod`` belongs to a scheduler outside ``scheduler_names``, else None."""
    name = scheduler_name(pod)
    if name in scheduler_names:
        return None
    return Refusal(
        FOREIGN_SCHEDULER,
        f"pod has spec.schedulerName {name!r}; this extender serves only "
        f"{', '.join(scheduler_names)} (extender.scheduler_names)",
    )


class Admission:
    """The checks of one extender app over ``store`` and ``inventory``; ``registry`` gets
    the refusal counter."""

    def __init__(
        self, settings: ExtenderSettings, store: Store, inventory: Inventory, *, registry: CollectorRegistry
    ) -> None:
        self._settings = settings
        self._store = store
        self._inventory = inventory
        self.refusals = Counter(
            REFUSALS,
            "Requests refused or passed through by the extender's admission checks, by verb and "
            "reason (other scheduler's pod, missing GPUNode or Node, client name not allowed).",
            ["verb", "reason"],
            registry=registry,
        )
        for reason in REASONS:
            self.refusals.labels("bind", reason)

    def refuse(
        self,
        request: web.Request,
        verb: str,
        refusal: Refusal,
        *,
        pod: str | None = None,
        node: str | None = None,
    ) -> None:
        """Log ``refusal`` at warning with the caller's identity (and the pod ``<ns>/<name>``
        and node when known) and count it."""
        self.refusals.labels(verb, refusal.reason).inc()
        log.warning(
            "refused: %s",
            refusal.message,
            extra=ctx(
                verb=verb, reason=refusal.reason, caller=tls.caller_identity(request), pod=pod, node=node
            ),
        )

    def passes_through(self, request: web.Request, verb: str, pod: JsonObj) -> bool:
        """True (logged and counted) when ``pod`` belongs to another scheduler: the verb must
        answer it as a pod without managed GPUs, touching no state."""
        refusal = foreign_scheduler(pod, self._settings.scheduler_names)
        if refusal is None:
            return False
        meta = pod.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        self.refuse(request, verb, refusal, pod=f"{meta.get('namespace') or ''}/{meta.get('name') or ''}")
        return True

    def bind_check(self, request: web.Request) -> BindCheck:
        """The check :meth:`extender.binder.Binder.bind` runs for ``request``'s pod."""

        async def check(pod: JsonObj, req: GpuRequest, node: str) -> Refusal | None:
            refusal = await self.check_bind(pod, req, node)
            if refusal is not None:
                self.refuse(request, "bind", refusal, pod=req.key, node=node)
            return refusal

        return check

    async def check_bind(self, pod: JsonObj, req: GpuRequest, node: str) -> Refusal | None:
        """Refuse binding ``pod`` (parsed as ``req``) to ``node``: another scheduler's pod, a
        GPU pod on a node without a GPUNode, a node the store does not know. None: allowed."""
        refusal = foreign_scheduler(pod, self._settings.scheduler_names)
        if refusal is not None:
            return Refusal(refusal.reason, f"pod {req.key}: {refusal.message}")
        if self._inventory.snapshot().get(node) is not None:
            return None  # a node with a GPUNode
        if req.count > 0:
            return Refusal(
                NO_GPUNODE, f"pod {req.key} requests GPUs; node {node} has no GPUNode (not a flexlease node)"
            )
        try:
            await self._store.get(Kind.NODE, node)
        except NotFound:
            return Refusal(NO_NODE, f"node {node} does not exist")
        except StoreError as exc:
            return Refusal(NODE_UNKNOWN, f"cannot check that node {node} exists: {exc}")
        return None

    def middleware(self) -> Middleware | None:
        """With ``extender.tls_client_names``: a middleware answering 403 unless the verified
        client certificate carries one of them (subject CN, DNS or URI SAN); without, None
        (every request passes: no layer to go through)."""
        allowed = frozenset(self._settings.tls_client_names)
        if not allowed:
            return None

        @web.middleware
        async def client_names(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            names = tls.client_names(tls.peer_certificate(request))
            if allowed.intersection(names):
                return await handler(request)
            verb = request.path.lstrip("/")
            message = (
                f"client certificate names {list(names)} are not in extender.tls_client_names"
                if names
                else "no client certificate (mutual TLS required)"
            )
            self.refuse(request, verb if verb in VERBS else "other", Refusal(CLIENT_NAME, message))
            return web.json_response({"Error": message}, status=403)

        return client_names
