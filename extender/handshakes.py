"""TLS for the verbs' listener, one handshake per connection, so that refused ones are seen.

Role (issue #37): with mutual TLS, a kube-scheduler holding a wrong, expired or missing
client certificate only sees ``EOF`` or ``connection reset by peer``, and the extender saw
nothing at all: asyncio (and uvloop) run a listener's TLS handshakes themselves and drop a
failed one silently (``SSLProtocol._fatal_error`` logs an ``OSError`` — which
``ssl.SSLError`` is — only in the loop's debug mode; a server's protocol never hears of a
connection whose handshake failed). :class:`TLSSite` is an aiohttp site that accepts
connections itself (``loop.sock_accept``) and hands each to the event loop with
``loop.connect_accepted_socket(..., ssl=context)`` (public API of asyncio and uvloop): the
loop runs the handshake as it would have, and a failure is raised to the site as the
exception it is, with the connection's peer address at hand:

* :func:`classify` maps the exception to one of :data:`REASONS` (bounded label values),
  from OpenSSL's reason code and, for a client certificate that does not verify, its
  X.509 verify code (expired, not yet valid, unknown issuer...);
* :class:`HandshakeFailures` counts it in ``flexlease_extender_tls_handshake_failures_total
  {reason}`` and logs it — the peer, the reason and OpenSSL's words — at most once per
  ``extender.tls_handshake_log_interval_seconds`` per reason, the next line telling how many
  were not logged in between, so a flood of bad clients does not flood the log. Client
  hang-ups and handshake timeouts (``eof``, ``timeout``: load-balancer probes, port
  scanners) are logged at INFO, certificate and protocol failures at WARNING.

A connection whose handshake succeeds is exactly what ``loop.create_server(...,
ssl=context)`` makes: aiohttp's protocol on the loop's TLS transport, with the same
``peercert``, ``sslcontext`` and ``peername``. The listening context's ``sni_callback``
(certificate rotation, :class:`extender.tls.CertificateReloader`) runs in every handshake as
before. The cost is a task per connection, none per request (kube-scheduler keeps its
connections alive).

Neighbours: :func:`extender.main.serve` uses :class:`TLSSite` whenever a certificate is
configured; :mod:`extender.metrics` owns the counter.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web
from prometheus_client import Counter

from flexlease.logging import ctx

log = logging.getLogger(__name__)

NO_CLIENT_CERTIFICATE: Final = "no_client_certificate"
CLIENT_CERTIFICATE_EXPIRED: Final = "client_certificate_expired"
CLIENT_CERTIFICATE_NOT_YET_VALID: Final = "client_certificate_not_yet_valid"
CLIENT_CERTIFICATE_UNTRUSTED: Final = "client_certificate_untrusted"
CLIENT_CERTIFICATE_INVALID: Final = "client_certificate_invalid"
SERVER_CERTIFICATE_REJECTED: Final = "server_certificate_rejected"
PLAIN_HTTP: Final = "plain_http"
PROTOCOL: Final = "protocol"
TIMEOUT: Final = "timeout"
EOF: Final = "eof"
OTHER: Final = "other"
REASONS: Final = (
    NO_CLIENT_CERTIFICATE,
    CLIENT_CERTIFICATE_EXPIRED,
    CLIENT_CERTIFICATE_NOT_YET_VALID,
    CLIENT_CERTIFICATE_UNTRUSTED,
    CLIENT_CERTIFICATE_INVALID,
    SERVER_CERTIFICATE_REJECTED,
    PLAIN_HTTP,
    PROTOCOL,
    TIMEOUT,
    EOF,
    OTHER,
)
"""The ``reason`` label values of ``flexlease_extender_tls_handshake_failures_total``."""
QUIET: Final = frozenset({TIMEOUT, EOF})
"""Reasons that are the client's doing rather than a certificate or protocol problem:
logged at INFO."""

_VERIFY_CODES: Final = {
    9: CLIENT_CERTIFICATE_NOT_YET_VALID,  # X509_V_ERR_CERT_NOT_YET_VALID
    10: CLIENT_CERTIFICATE_EXPIRED,  # X509_V_ERR_CERT_HAS_EXPIRED
    2: CLIENT_CERTIFICATE_UNTRUSTED,  # X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT
    18: CLIENT_CERTIFICATE_UNTRUSTED,  # X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT
    19: CLIENT_CERTIFICATE_UNTRUSTED,  # X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN
    20: CLIENT_CERTIFICATE_UNTRUSTED,  # X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY
    21: CLIENT_CERTIFICATE_UNTRUSTED,  # X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE
}
"""OpenSSL's X.509 verify codes (``x509_vfy.h``) of a client certificate that fails."""


def classify(exc: BaseException) -> str:
    """The :data:`REASONS` value for a failed server-side handshake's exception: the
    verify code of a client certificate that does not verify
    (``ssl.SSLCertVerificationError``), else OpenSSL's reason code (``SSLError.reason``:
    ``PEER_DID_NOT_RETURN_A_CERTIFICATE``, a ``…_ALERT_…`` the client sent about our
    certificate, ``HTTP_REQUEST``…); a ``ConnectionAbortedError`` is the handshake timeout
    (the event loop's only use of it there), other connection errors and EOF the client
    hanging up."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return _VERIFY_CODES.get(getattr(exc, "verify_code", 0), CLIENT_CERTIFICATE_INVALID)
    if isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError):
        return EOF
    if isinstance(exc, ssl.SSLError):
        reason = getattr(exc, "reason", None) or ""
        if reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
            return NO_CLIENT_CERTIFICATE
        if reason in ("HTTP_REQUEST", "HTTPS_PROXY_REQUEST"):
            return PLAIN_HTTP
        if "_ALERT_" in reason:  # the client refused: what it says of our certificate, or else
            return SERVER_CERTIFICATE_REJECTED if "CERTIFICATE" in reason or "_CA" in reason else PROTOCOL
        return PROTOCOL if reason else OTHER
    if isinstance(exc, ConnectionAbortedError | TimeoutError):
        return TIMEOUT
    if isinstance(exc, ConnectionError | EOFError):
        return EOF
    return OTHER


def describe(exc: BaseException) -> str:
    """OpenSSL's words for ``exc`` (its verify message for a certificate that does not
    verify), else the exception's own message."""
    reason = getattr(exc, "reason", None) if isinstance(exc, ssl.SSLError) else None
    message = getattr(exc, "verify_message", None) if isinstance(exc, ssl.SSLCertVerificationError) else None
    if message:
        return f"{reason or 'CERTIFICATE_VERIFY_FAILED'}: {message}"
    if reason:
        return str(reason)
    return str(exc) or type(exc).__name__


@dataclass(slots=True)
class _Tally:
    logged_at: float
    suppressed: int = 0


@dataclass(slots=True)
class HandshakeFailures:
    """Counts failed handshakes in ``counter`` (labelled by reason, every reason made at
    once) and logs them, at most one line per reason every ``interval`` seconds of
    ``clock`` (monotonic seconds)."""

    counter: Counter
    interval: float
    clock: Callable[[], float] = time.monotonic
    _tallies: dict[str, _Tally] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for reason in REASONS:
            self.counter.labels(reason)

    def report(self, exc: BaseException, peer: Any) -> str:
        """Count and (rate-limited) log the failed handshake with ``peer`` (an address as
        ``get_extra_info("peername")`` gives it). Returns the reason."""
        reason = classify(exc)
        self.counter.labels(reason).inc()
        now = self.clock()
        tally = self._tallies.get(reason)
        if tally is not None and now - tally.logged_at < self.interval:
            tally.suppressed += 1
            return reason
        suppressed = tally.suppressed if tally is not None else 0
        self._tallies[reason] = _Tally(now)
        log.log(
            logging.INFO if reason in QUIET else logging.WARNING,
            "refused a TLS handshake: %s",
            describe(exc),
            extra=ctx(
                peer=_address(peer),
                reason=reason,
                detail=describe(exc),
                not_logged=suppressed,
                log_interval_seconds=self.interval,
            ),
        )
        return reason


def _address(peer: Any) -> str:
    """``host:port`` of a peername tuple (``[host]:port`` for IPv6), else ``-``."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = peer[0], peer[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return "-"


class _Listener(asyncio.AbstractServer):
    """The listening sockets of a :class:`TLSSite`, as aiohttp's runner reads a site's server
    (``sockets`` for ``BaseRunner.addresses``, ``close`` when the site stops)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sockets: list[socket.socket]) -> None:
        self._loop = loop
        self._sockets = sockets
        self._closed = asyncio.Event()

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._sockets)

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()
        self._closed.set()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return not self._closed.is_set()

    async def start_serving(self) -> None:  # serving from the start
        return None

    async def serve_forever(self) -> None:
        await self._closed.wait()

    async def wait_closed(self) -> None:
        await self._closed.wait()


class TLSSite(web.BaseSite):
    """An aiohttp site on ``host``:``port`` serving ``runner``'s app over TLS with
    ``ssl_context``: it accepts connections itself (``loop.sock_accept``) and has the event
    loop run each one's handshake (``loop.connect_accepted_socket``, at most
    ``handshake_timeout`` seconds), which raises a failed handshake's error where the
    peer's address is known; every failure goes to ``failures``. (``loop.start_tls`` on a
    connection accepted by ``create_server`` would lose a ClientHello read before it takes
    over: uvloop reads a new connection at once.)"""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext,
        failures: HandshakeFailures,
        handshake_timeout: float,
        backlog: int = 128,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host_name = host
        self._port_number = port
        self._context = ssl_context
        self._failures = failures
        self._timeout = handshake_timeout
        self._tasks: set[asyncio.Task[None]] = set()
        """The accept loops and the handshakes in progress."""

    @property
    def name(self) -> str:
        port = self._port_number
        if isinstance(self._server, _Listener) and self._server.sockets:
            port = self._server.sockets[0].getsockname()[1]
        return f"https://{self._host_name}:{port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        sockets = await _listen(loop, self._host_name, self._port_number, self._backlog)
        self._server = _Listener(loop, sockets)
        for sock in sockets:
            self._spawn(self._accept(sock), "extender-tls-accept")

    async def stop(self) -> None:
        """Stop accepting, and abandon the handshakes in progress (their connections close)."""
        await super().stop()  # closes the listening sockets
        pending = list(self._tasks)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(listener)
            except OSError as exc:
                if listener.fileno() < 0:  # closed: the site stopped
                    return
                log.warning("accepting a connection failed; retrying in 0.1 s: %s", exc)
                await asyncio.sleep(0.1)  # out of file descriptors, say: let some close
                continue
            self._spawn(self._handshake(conn, peer), "extender-tls-handshake")

    async def _handshake(self, conn: socket.socket, peer: Any) -> None:
        server = self._runner.server
        if server is None:  # the runner is shutting down
            conn.close()
            return
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(
                server, conn, ssl=self._context, ssl_handshake_timeout=self._timeout
            )
        except asyncio.CancelledError:
            conn.close()
            raise
        except Exception as exc:  # ssl.SSLError (an OSError), a reset, the timeout, EOF
            conn.close()
            self._failures.report(exc, peer)


async def _listen(loop: asyncio.AbstractEventLoop, host: str, port: int, backlog: int) -> list[socket.socket]:
    """Non-blocking sockets listening on every address ``host`` resolves to, as
    ``loop.create_server`` makes them (``SO_REUSEADDR``; IPv6 sockets IPv6 only)."""
    infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
            if port == 0:  # one free port for every address, as the first one got
                port = sock.getsockname()[1]
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets
