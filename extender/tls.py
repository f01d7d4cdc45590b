"""TLS for the extender's listener: server certificate, mutual TLS, caller identity.

Role: only kube-scheduler may drive the extender (issue #18). :func:`server_context` builds
the listener's ``ssl.SSLContext`` from :class:`flexlease.config.ExtenderSettings`:

* ``tls_cert_file``/``tls_key_file``: HTTPS (kube-scheduler's extender ``enableHTTPS`` and
  ``tlsConfig.caFile`` trust this certificate);
* ``tls_client_ca_file``: mutual TLS, ``verify_mode = CERT_REQUIRED`` — a client without a
  certificate signed by that CA fails the TLS handshake, so no request reaches a handler
  (kube-scheduler presents ``tlsConfig.certFile``/``keyFile``);
* ``tls_client_names``: the certificate must also carry one of these names (subject CN, DNS
  or URI SAN); :func:`client_names` reads them and :mod:`extender.admission` refuses others
  with 403 before any handler runs (Python's ``ssl`` has no verify callback to do it inside
  the handshake);
* none of these and ``insecure_http`` false: :class:`InsecureListener` — the extender does
  not start on plain HTTP unless told so explicitly.

Neighbours: :mod:`extender.main` serves with the context; :mod:`extender.admission` names
callers with :func:`caller_identity`. Pure apart from reading the PEM files.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

from aiohttp import web

from flexlease.config import ExtenderSettings
from flexlease.errors import FlexleaseError

log = logging.getLogger(__name__)


class InsecureListener(FlexleaseError):
    """No server certificate is configured and ``extender.insecure_http`` is false."""


def server_context(ext: ExtenderSettings) -> ssl.SSLContext | None:
    """The listener's TLS context (TLS 1.2+), or None for plain HTTP when — and only when —
    ``ext.insecure_http`` is true and no certificate is configured (a warning is logged).

    Raises :class:`InsecureListener` when neither a certificate nor ``insecure_http`` is set,
    ``OSError``/``ssl.SSLError`` when a PEM file cannot be read or does not parse.
    """
    if ext.tls_cert_file is None or ext.tls_key_file is None:
        if not ext.insecure_http:
            raise InsecureListener(
                "no TLS certificate configured (extender.tls_cert_file and tls_key_file); "
                "the extender binds pods cluster-wide and must not serve plain HTTP in a cluster. "
                "Set extender.tls_cert_file, tls_key_file and tls_client_ca_file (mutual TLS with "
                "kube-scheduler), or extender.insecure_http: true for local use only"
            )
        log.warning(
            "serving PLAIN HTTP without TLS (extender.insecure_http: true): anyone who can reach "
            "this port can bind pods; use only for local demos and tests"
        )
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(ext.tls_cert_file, ext.tls_key_file)
    if ext.tls_client_ca_file is not None:
        context.load_verify_locations(cafile=ext.tls_client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    else:
        log.warning(
            "TLS without client certificates (extender.tls_client_ca_file unset): any caller "
            "that reaches this port can bind pods; configure mutual TLS with kube-scheduler"
        )
    return context


def client_names(peercert: dict[str, Any] | None) -> tuple[str, ...]:
    """Names of a verified peer certificate (``SSLSocket.getpeercert()`` shape): subject
    ``commonName`` values, then ``DNS`` and ``URI`` subjectAltNames. ``()`` for None/empty."""
    if not peercert:
        return ()
    names: list[str] = []
    for rdn in peercert.get("subject", ()):
        names.extend(str(value) for key, value in rdn if key == "commonName")
    names.extend(str(value) for key, value in peercert.get("subjectAltName", ()) if key in ("DNS", "URI"))
    return tuple(names)


def peer_certificate(request: web.Request) -> dict[str, Any] | None:
    """The verified client certificate of ``request``'s connection (mutual TLS), else None."""
    transport = request.transport
    if transport is None:
        return None
    cert = transport.get_extra_info("peercert")
    return cert if isinstance(cert, dict) and cert else None


def caller_identity(request: web.Request) -> str:
    """Who sent ``request``, for logs: ``CN=<name> from <peer address>`` under mutual TLS
    (the first certificate name), else the peer address (``-`` when unknown)."""
    names = client_names(peer_certificate(request))
    peer = request.remote or "-"
    return f"CN={names[0]} from {peer}" if names else peer
