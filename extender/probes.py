"""The extender's read-only listener for Prometheus and kubelet probes.

Role: under mutual TLS (:mod:`extender.tls`) every connection to the verbs' port must present
kube-scheduler's client certificate, which neither Prometheus nor the kubelet's ``httpGet``
probes have. With ``extender.metrics_port`` set, :func:`create_probe_app` builds a second
application serving only ``GET /metrics``, ``/healthz`` and ``/readyz`` over plain HTTP,
reading the state of the main application (same registry, watch states and ready checks);
it has no route that changes anything, so a NetworkPolicy can open it to the monitoring
namespace without opening the verbs.

Neighbours: :mod:`extender.main` serves it beside :func:`extender.server.create_app`.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from extender import server


def create_probe_app(app: web.Application) -> web.Application:
    """An application answering ``GET /metrics``, ``/healthz`` and ``/readyz`` from the state
    of ``app`` (built by :func:`extender.server.create_app`); everything else is 404/405."""
    probes = web.Application()
    probes[server.METRICS] = app[server.METRICS]
    probes[server.INVENTORY] = app[server.INVENTORY]
    probes[server.WATCHES] = app[server.WATCHES]
    probes[server.READY_CHECKS] = app[server.READY_CHECKS]
    metrics_handler = make_aiohttp_handler(app[server.METRICS].registry)

    async def serve_metrics(request: web.Request) -> web.StreamResponse:
        return await metrics_handler(request)

    probes.router.add_get("/metrics", serve_metrics)
    probes.router.add_get("/healthz", server.healthz)
    probes.router.add_get("/readyz", server.readyz)
    return probes
