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
  not start on plain HTTP unless told so explicitly;
* rotation: :class:`CertificateReloader` looks every ``tls_reload_seconds`` whether the PEM
  files' contents changed and builds a fresh context from them, which new connections get
  without a restart (established ones keep theirs). Files that do not load (half written, key
  and certificate not matching) are logged and the last good context stays.

Neighbours: :mod:`extender.main` serves with the context; :mod:`extender.admission` names
callers with :func:`caller_identity`. Pure apart from reading the PEM files.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from typing import Any

from aiohttp import web

from flexlease.config import ExtenderSettings
from flexlease.errors import FlexleaseError
from flexlease.logging import ctx

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


Digests = tuple[bytes | None, ...]
"""SHA-256 of each TLS file's contents (certificate, key, client CA); None for a file that is
not configured or cannot be read."""


def file_digests(ext: ExtenderSettings) -> Digests:
    """The contents' digests of ``ext``'s certificate, key and client CA files. Take them
    *before* :func:`server_context` loads the files, so that a change in between is seen."""
    out: list[bytes | None] = []
    for path in (ext.tls_cert_file, ext.tls_key_file, ext.tls_client_ca_file):
        try:
            out.append(hashlib.sha256(path.read_bytes()).digest() if path is not None else None)
        except OSError:
            out.append(None)
    return tuple(out)


class CertificateReloader:
    """Serves new connections from the newest good context built from ``ext``'s PEM files.

    ``context`` is the listening context (:func:`server_context`); ``loaded``: the
    :func:`file_digests` taken before it was built. The reloader sets its ``sni_callback``,
    which runs in every handshake (with or without SNI) and switches the connection to the
    current context. :meth:`reload_if_changed` builds a *fresh* context with
    :func:`server_context` when the files' contents changed, so a renewed certificate of
    another key type, a rotated client CA (the old one no longer trusted) and a changed
    chain all take effect; established connections keep theirs. Files that do not load (half
    written, a key that does not match) leave the current context in place, and the same
    contents are not tried again. Nothing is written to disk. A Secret mounted with
    ``subPath`` never changes in the pod: mount the whole Secret."""

    def __init__(self, context: ssl.SSLContext, ext: ExtenderSettings, *, loaded: Digests) -> None:
        self._ext = ext
        self._current = context
        self._loaded = loaded
        self._failed: Digests | None = None
        self.reloads = 0
        """Successful reloads so far."""
        context.sni_callback = self._select

    @property
    def current(self) -> ssl.SSLContext:
        """The context new connections get."""
        return self._current

    def _select(self, connection: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext) -> None:
        if context is not self._current:
            connection.context = self._current

    def reload_if_changed(self) -> bool:
        """Build a fresh context if the files' contents changed since the last load (or
        failed load). Returns True when new connections now get it. Never raises for bad
        files: the error is logged and the current context stays."""
        digests = file_digests(self._ext)
        if digests in (self._loaded, self._failed):
            return False
        ext = self._ext
        try:
            fresh = server_context(ext)
        except (OSError, ssl.SSLError, ValueError, InsecureListener) as exc:
            self._failed = digests
            log.error(
                "TLS files changed but do not load; still serving the previous certificate",
                extra=ctx(cert=str(ext.tls_cert_file), client_ca=str(ext.tls_client_ca_file), error=str(exc)),
            )
            return False
        if fresh is None:  # not reachable with a certificate configured
            return False
        self._current = fresh
        self._loaded = digests
        self._failed = None
        self.reloads += 1
        log.info(
            "reloaded the TLS certificate",
            extra=ctx(cert=str(ext.tls_cert_file), client_ca=str(ext.tls_client_ca_file)),
        )
        return True

    async def run(self, period_seconds: float) -> None:
        """Call :meth:`reload_if_changed` every ``period_seconds`` until cancelled."""
        while True:
            await asyncio.sleep(period_seconds)
            self.reload_if_changed()
