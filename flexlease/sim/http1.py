"""A keep-alive HTTP/1.1 client for the simulator's calls to the hosted extender.

kube-scheduler calls its extenders over Go's ``net/http``: one POST per verb on a kept-alive
connection. The simulator does the same about 200,000 times per policy over 60 simulated
days, one call at a time, to a server on loopback; ``aiohttp.ClientSession`` spends about as
much CPU per call as the extender's whole server side (timeouts, tracing, cookies, headers
merging), so this client sends only what those calls need — a request line and ``Host``,
``Content-Type`` and ``Content-Length`` headers — over asyncio, and leaves the protocol
(RFC 9112: framing by length, chunked or until close, keep-alive, malformed responses) to
``h11``, the sans-I/O HTTP/1.1 library. A connection the server closed while idle is
replaced before the next request, as Go's ``net/http`` does. No redirects, TLS, proxies.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Final, cast
from urllib.parse import urlsplit

import h11

from flexlease.errors import FlexleaseError

MAX_HEAD_BYTES: Final = 64 * 1024
"""A response head (status line and headers) longer than this is refused."""


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


class _Connection(asyncio.Protocol):
    """One connection; one request at a time (``begin``, then await the future it returns).
    The HTTP/1.1 protocol itself (framing, keep-alive, chunked bodies, errors) is h11's."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.waiter: asyncio.Future[Response] | None = None
        self._h11 = h11.Connection(our_role=h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self._head: h11.Response | None = None
        self._body: list[bytes | bytearray] = []
        self.silent = True
        """No byte of the current request's response has arrived."""

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self._fail(HttpError("data from the server without a request"))
            return
        self.silent = False
        self._h11.receive_data(data)
        self._advance()

    def eof_received(self) -> bool | None:
        self._h11.receive_data(b"")  # a response without a length ends here
        self._advance()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(HttpError(f"connection closed: {exc or 'by the server'}"))

    # -- requests ---------------------------------------------------------------------------

    def begin(self, request: h11.Request, body: bytes) -> asyncio.Future[Response]:
        """Send ``request`` with ``body``; the future gets the whole response."""
        assert self.transport is not None
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()  # keep-alive: the next request on this connection
        self.waiter = asyncio.get_running_loop().create_future()
        self._head = None
        self._body = []
        self.silent = True
        head = self._h11.send(request)
        data = self._h11.send(h11.Data(data=body))
        self._h11.send(h11.EndOfMessage())  # Content-Length framing: nothing to send
        assert head is not None and data is not None
        self.transport.writelines((head, data))
        return self.waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: HttpError) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.close()

    def _advance(self) -> None:
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                self._fail(HttpError(f"bad response: {exc}"))
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                self._head = event
            elif isinstance(event, h11.Data):
                self._body.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._done()
                return
            elif isinstance(event, h11.ConnectionClosed):
                self._fail(HttpError("connection closed by the server before the whole response"))
                return

    def _done(self) -> None:
        assert self._head is not None and self.waiter is not None
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1") for name, value in self._head.headers
        }
        reusable = self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE
        if not reusable or self._h11.trailing_data[0]:
            self.close()  # h11 says it cannot carry another request, or the server sent more
        if not self.waiter.done():
            self.waiter.set_result(Response(self._head.status_code, headers, b"".join(self._body)))


class Http1Client:
    """Requests to one ``http://host:port`` server over kept-alive connections (one per
    request under way; idle ones are reused). Use as an async context manager or call
    :meth:`close`. Raises ``ValueError`` for a URL that is not ``http://host[:port]``."""

    def __init__(self, base_url: str) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http" or not url.hostname or url.path.strip("/") or url.query:
            raise ValueError(f"not an http://host[:port] URL: {base_url!r}")
        self._host = url.hostname
        self._port = url.port or 80
        self._authority = url.netloc.encode("idna")
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
        seconds pass first (the connection is then dropped)."""
        if self._closed:
            raise HttpError("the client is closed")
        request = h11.Request(
            method=method,
            target=path,
            headers=[
                ("Host", self._authority.decode()),
                ("Content-Type", content_type),
                ("Content-Length", str(len(body))),
            ],
        )
        conn: _Connection | None = None
        try:
            async with asyncio.timeout(limit_s):
                conn, reused = await self._connection()
                try:
                    response = await conn.begin(request, body)
                except HttpError:
                    if not (reused and conn.silent):
                        raise
                    # The server closed the kept-alive connection before it answered (Go's
                    # net/http sends such a request once more, on a new connection).
                    conn, _ = await self._connection(fresh=True)
                    response = await conn.begin(request, body)
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
        loop = asyncio.get_running_loop()
        transport, conn = await loop.create_connection(_Connection, self._host, self._port)
        conn.transport = transport  # uvloop may call connection_made only later
        return conn, False
