"""A keep-alive HTTP/1.1 client for the simulator's calls to the hosted extender.

kube-scheduler calls its extenders over Go's ``net/http``: one POST per verb on a kept-alive
connection. The simulator does the same about 200,000 times per policy over 60 simulated
days, one call at a time, to a server on loopback; ``aiohttp.ClientSession`` spends about as
much CPU per call as the extender's whole server side (timeouts, tracing, cookies, headers
merging), so this client sends only what those calls need — a request line and ``Host``,
``Content-Type`` and ``Content-Length`` headers — over asyncio, and leaves reading the
response (RFC 9112: framing by length, chunked or until close, keep-alive, malformed
responses) to ``httptools``, MagicStack's binding of llhttp, the HTTP parser of Node.js (the
pure-Python ``h11`` it replaced cost ≈ 9 % of a simulation's CPU). A connection the server
closed while idle is replaced before the next request, and a replayable request whose kept-alive
connection closed before any answer is sent once more (:data:`REPLAYABLE_METHODS`), as Go's
``net/http`` does. No redirects, TLS, proxies.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, cast
from urllib.parse import urlsplit

import httptools

from flexlease.errors import FlexleaseError

REPLAYABLE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
"""Requests sent once more when a kept-alive connection closed before any byte of the answer
(Go's ``net/http``: ``Request.isReplayable``). A POST is not: the server may have acted on it
(a ``/bind``), so its caller gets :class:`HttpError`, as kube-scheduler's extender client does."""
MAX_HEAD_BYTES: Final = 64 * 1024
"""A response head (status line and headers) longer than this is refused."""
_TOKEN_CHARS: Final = frozenset(
    b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
)
"""The characters of an RFC 9110 §5.6.2 token (a method is one)."""


Connect = Callable[[Callable[[], asyncio.Protocol]], Awaitable[asyncio.BaseTransport]]
"""Opens one connection for a protocol factory and returns its transport, the protocol made
(``loop.create_connection`` to the client's host and port by default, or an in-process
:mod:`flexlease.pipe` to a server in the same event loop)."""


class HttpError(FlexleaseError):
    """A request got no (well-formed) response: the connection failed or closed, the
    response broke HTTP/1.1, or the time ran out."""


@dataclass(frozen=True, slots=True)
class Response:
    """A response: ``status`` code, ``headers`` (names lower-cased; a repeated one keeps its
    last value) and the whole ``body``."""

    status: int
    headers: dict[str, str]
    body: bytes


def request_head(method: str, target: str, authority: str, content_type: str, length: int) -> bytes:
    """The head of an HTTP/1.1 request with a ``length``-byte body (RFC 9112 §3: request line,
    then ``Host``, ``Content-Type`` and ``Content-Length``). Raises ``ValueError`` for a method
    that is not a token, or a target, authority or content type holding a control character or
    space (where one is not allowed), which would let a value split the head."""
    return _head_start(method, target, authority, content_type) + b"%d\r\n\r\n" % length


_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")


@functools.lru_cache(maxsize=64)
def _head_start(method: str, target: str, authority: str, content_type: str) -> bytes:
    """The head up to the ``Content-Length`` value, checked once per distinct request line and
    fields (a client sends the same few again and again)."""
    if not method or not set(method.encode("ascii", "replace")) <= _TOKEN_CHARS:
        raise ValueError(f"not an HTTP method: {method!r}")
    for what, value in (("target", target), ("authority", authority), ("content type", content_type)):
        if not value or _CONTROL.search(value) or (what != "content type" and " " in value):
            raise ValueError(f"bad request {what}: {value!r}")
    return (
        f"{method} {target} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: {content_type}\r\nContent-Length: "
    ).encode("latin-1")


class _Connection(asyncio.Protocol):
    """One connection; one request at a time (``begin``, then await the future it returns).
    Reading the response (framing, keep-alive, chunked bodies, errors) is llhttp's, through
    ``httptools``; the callbacks below (``on_*``) are the parser's."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.waiter: asyncio.Future[Response] | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._head_bytes = 0
        """Bytes received while the head is incomplete (the head's size, for the limit)."""
        self._header_bytes = 0
        """Header fields' bytes so far (the limit inside one read)."""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._headers_done = False
        self._by_close = False
        """The response's body ends when the connection does (no length, not chunked)."""
        self._status = 0
        self._complete = False
        self._extra = False
        self._keep_alive = False
        self.silent = True
        """No byte of the current request's response has arrived."""

    def _new_response(self) -> None:
        """Forget the head and body read so far: a new request, a new response begins, or an
        interim (1xx) response ended and the final one follows."""
        self._head_bytes = self._header_bytes = 0
        self._headers = {}
        self._body = []
        self._headers_done = False
        self._by_close = False
        self._status = 0

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self._fail(HttpError("data from the server without a request"))
            return
        self.silent = False
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if self._complete:  # bytes after the response: it stands, the connection goes
                self._done(reusable=False)
            elif self._head_bytes > MAX_HEAD_BYTES:  # on_header's refusal
                self._fail(HttpError(f"bad response: head longer than {MAX_HEAD_BYTES} bytes"))
            elif isinstance(exc, httptools.HttpParserUpgrade):
                self._fail(HttpError("bad response: a protocol upgrade was not asked for"))
            else:
                self._fail(HttpError(f"bad response: {exc}"))
            return
        if self._complete:
            self._done(reusable=self._keep_alive and not self._extra)
            return
        if not self._headers_done:  # every byte so far belongs to a head still incomplete
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._fail(HttpError(f"bad response: head longer than {MAX_HEAD_BYTES} bytes"))

    def eof_received(self) -> bool | None:
        if self._headers_done and self._by_close and not self._complete:
            self._complete = True  # RFC 9112 §6.3 (8): the body ends with the connection
            self._done(reusable=False)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._headers_done and not self._complete:
            self._fail(HttpError("connection closed by the server before the whole response"))
        else:
            self._fail(HttpError(f"connection closed: {exc or 'by the server'}"))

    # -- parser callbacks (httptools) --------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._complete:
            self._extra = True  # the server sent more than one response
            return
        self._new_response()

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._headers_done or self._complete:
            return  # a chunked body's trailer fields, or the head of a response not asked for
        self._header_bytes += len(name) + len(value) + 4  # "name: value\r\n"
        if self._header_bytes > MAX_HEAD_BYTES:
            self._head_bytes = self._header_bytes
            raise ValueError("head too long")  # httptools stops parsing and raises
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self._complete:
            return
        self._status = self._parser.get_status_code()
        self._headers_done = True
        # RFC 9112 §6.3: with Transfer-Encoding, the body is chunked only when chunked is the
        # last coding (else it ends with the connection); without, Content-Length frames it.
        codings = self._headers.get("transfer-encoding", "").lower()
        if codings:
            self._by_close = codings.rsplit(",", 1)[-1].strip() != "chunked"
        else:
            self._by_close = "content-length" not in self._headers

    def on_body(self, body: bytes) -> None:
        if not self._complete:
            self._body.append(body)

    def on_message_complete(self) -> None:
        if self._complete:
            return
        if self._status < 200:  # an interim (1xx) response: the final one follows
            self._new_response()
            return
        self._complete = True
        self._keep_alive = self._parser.should_keep_alive()

    # -- requests ---------------------------------------------------------------------------

    def begin(self, head: bytes, body: bytes) -> asyncio.Future[Response]:
        """Send the request ``head`` (:func:`request_head`) with ``body``; the future gets the
        whole response."""
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self._new_response()
        self._complete = False
        self._extra = False
        self.silent = True
        self.transport.writelines((head, body))
        return self.waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: HttpError) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.close()

    def _done(self, *, reusable: bool = True) -> None:
        assert self.waiter is not None
        if not reusable:
            self.close()  # the server ends the connection after this response, or sent more
        if not self.waiter.done():
            self.waiter.set_result(Response(self._status, self._headers, b"".join(self._body)))


class Http1Client:
    """Requests to one ``http://host:port`` server over kept-alive connections (one per
    request under way; idle ones are reused). ``connect`` opens a connection (default: TCP to
    that host and port); the URL still names the server in each request's ``Host``. Use as an
    async context manager or call :meth:`close`. Raises ``ValueError`` for a URL that is not
    ``http://host[:port]``."""

    def __init__(self, base_url: str, *, connect: Connect | None = None) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http" or not url.hostname or url.path.strip("/") or url.query:
            raise ValueError(f"not an http://host[:port] URL: {base_url!r}")
        self._host = url.hostname
        self._port = url.port or 80
        self._connect = connect or self._connect_tcp
        self._authority = url.netloc.encode("idna").decode("ascii")
        self._idle: list[_Connection] = []
        self._closed = False

    async def __aenter__(self) -> Http1Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every idle connection; later requests raise :class:`HttpError`."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        *,
        content_type: str = "application/json",
        limit_s: float,
    ) -> Response:
        """Send ``method path`` with ``body`` and return the response once it is complete.
        Raises :class:`HttpError` on a connection or protocol failure, or when ``limit_s``
        seconds pass first (the connection is then dropped); ``ValueError`` for a method,
        path or content type that cannot go into a request head."""
        if self._closed:
            raise HttpError("the client is closed")
        head = request_head(method, path, self._authority, content_type, len(body))
        conn: _Connection | None = None
        try:
            async with asyncio.timeout(limit_s):
                conn, reused = await self._connection()
                try:
                    response = await conn.begin(head, body)
                except HttpError:
                    if not (reused and conn.silent and method in REPLAYABLE_METHODS):
                        raise
                    # The server closed the kept-alive connection before it answered: Go's
                    # net/http sends a replayable request once more, on a new connection.
                    conn, _ = await self._connection(fresh=True)
                    response = await conn.begin(head, body)
        except BaseException as exc:
            if conn is not None:
                conn.close()
            if isinstance(exc, TimeoutError):
                raise HttpError(f"no response within {limit_s:g} s") from None
            if isinstance(exc, OSError):
                raise HttpError(f"{type(exc).__name__}: {exc}") from exc
            raise
        if not conn.closed and not self._closed:
            self._idle.append(conn)
        return response

    async def _connection(self, *, fresh: bool = False) -> tuple[_Connection, bool]:
        """An idle connection still open (and True), or a new one (and False)."""
        while self._idle and not fresh:
            conn = self._idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn, True
        conn = _Connection()
        transport = await self._connect(lambda: conn)
        conn.transport = cast(asyncio.Transport, transport)  # uvloop may call connection_made only later
        return conn, False

    async def _connect_tcp(self, protocol: Callable[[], asyncio.Protocol]) -> asyncio.BaseTransport:
        transport, _ = await asyncio.get_running_loop().create_connection(protocol, self._host, self._port)
        return transport
