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
  files changed and loads them into the listening context, so new connections get the renewed
  certificate without a restart (established ones keep theirs). A pair that does not load
  (half written, key and certificate not matching) is logged and the last good one stays.

Neighbours: :mod:`extender.main` serves with the context; :mod:`extender.admission` names
callers with :func:`caller_identity`. Pure apart from reading the PEM files.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import tempfile
from pathlib import Path
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


FileStamp = tuple[int, int, int] | None
"""A PEM file's (inode, size, mtime in ns) as ``os.stat`` reads it through symlinks (a
Secret volume swaps its ``..data`` link); None when it cannot be read."""


def _stamp(path: Path | None) -> FileStamp:
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class CertificateReloader:
    """Keeps the listening ``context`` (from :func:`server_context`) on the PEM files of
    ``ext``: :meth:`reload_if_changed` loads them again when any of them changed since the
    last load, for the connections accepted afterwards.

    The files are read once into a private temporary directory, checked by loading them into
    a scratch context, and only then loaded into ``context``, so a certificate without its
    key, half-written files or a pair that does not match never reach the listener (OpenSSL
    would otherwise replace the certificate before it finds the key does not match). A
    rotated client CA is *added* to the trusted ones (``load_verify_locations`` cannot
    remove): the old CA stays trusted until the extender restarts, as a CA rollover needs.
    Stamps that failed to load are not tried again until the files change once more."""

    def __init__(self, context: ssl.SSLContext, ext: ExtenderSettings) -> None:
        self._context = context
        self._files = (ext.tls_cert_file, ext.tls_key_file, ext.tls_client_ca_file)
        self._loaded = self._stamps()
        self._failed: tuple[FileStamp, ...] | None = None
        self.reloads = 0
        """Successful reloads so far."""

    def _stamps(self) -> tuple[FileStamp, ...]:
        return tuple(_stamp(p) for p in self._files)

    def reload_if_changed(self) -> bool:
        """Load the files again if they changed since the last load (or failed load).
        Returns True when the context now holds new ones. Never raises for bad files: the
        error is logged and the context keeps what it had."""
        stamps = self._stamps()
        if stamps in (self._loaded, self._failed):
            return False
        cert, key, ca = self._files
        assert cert is not None and key is not None
        try:
            with tempfile.TemporaryDirectory(prefix="flexlease-tls-") as tmp:
                cert_copy, key_copy = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
                cert_copy.write_bytes(cert.read_bytes())
                key_copy.write_bytes(key.read_bytes())
                ca_pem = ca.read_text() if ca is not None else None
                scratch = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                scratch.load_cert_chain(cert_copy, key_copy)
                if ca_pem is not None:
                    scratch.load_verify_locations(cadata=ca_pem)
                self._context.load_cert_chain(cert_copy, key_copy)
                if ca_pem is not None:
                    self._context.load_verify_locations(cadata=ca_pem)
        except (OSError, ssl.SSLError, ValueError) as exc:
            self._failed = stamps
            log.error(
                "TLS files changed but do not load; still serving the previous certificate",
                extra=ctx(cert=str(cert), key=str(key), client_ca=str(ca) if ca else None, error=str(exc)),
            )
            return False
        self._loaded = stamps
        self._failed = None
        self.reloads += 1
        log.info("reloaded the TLS certificate", extra=ctx(cert=str(cert), client_ca=str(ca) if ca else None))
        return True

    async def run(self, period_seconds: float) -> None:
        """Call :meth:`reload_if_changed` every ``period_seconds`` until cancelled."""
        while True:
            await asyncio.sleep(period_seconds)
            self.reload_if_changed()
