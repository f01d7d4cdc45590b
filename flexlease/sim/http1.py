"""A small keep-alive HTTP/1.1 client for the simulator's calls to the hosted extender.

kube-scheduler calls its extenders over Go's ``net/http``: one POST per verb on a kept-alive
connection. The simulator does the same about 200,000 times per policy over 60 simulated
days, one call at a time, to a server on loopback; ``aiohttp.ClientSession`` spends about as
much CPU per call as the extender's whole server side (timeouts, tracing, cookies, headers
merging), so this client does only what those calls need (RFC 9112): a request line, ``Host``,
``Content-Type`` and ``Content-Length`` headers, and a response read by its
``Content-Length``, chunked, or until the server closes. A connection the server closed
while idle is replaced before the next request. Everything else (redirects, TLS, proxies,
``Expect``, upgrades) is not there.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Final, cast
from urllib.parse import urlsplit

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
    """One connection; one request at a time (``begin``, then await ``waiter``)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.waiter: asyncio.Future[Response] | None = None
        self._buf = bytearray()
        self._head: tuple[int, dict[str, str]] | None = None
        self._body = bytearray()
        self._chunk_left: int | None = None  # chunked: bytes left in the current chunk
        self._in_trailers = False
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
        self._buf += data
        try:
            self._advance()
        except HttpError as exc:
            self._fail(exc)

    def eof_received(self) -> bool | None:
        self._finish_at_close()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._finish_at_close()
        self._fail(HttpError(f"connection closed: {exc or 'by the server'}"))

    # -- requests ---------------------------------------------------------------------------

    def begin(self, request: bytes) -> asyncio.Future[Response]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self._buf.clear()
        self._head = None
        self._body.clear()
        self._chunk_left = None
        self._in_trailers = False
        self.silent = True
        self.transport.write(request)
        return self.waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: HttpError) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.close()

    def _finish_at_close(self) -> None:
        """A response without a length ends when the server closes."""
        if self._head is not None and self._chunk_left is None and "content-length" not in self._head[1]:
            self._done(bytes(self._body) + bytes(self._buf), keep=False)

    def _done(self, body: bytes, *, keep: bool) -> None:
        assert self._head is not None and self.waiter is not None
        status, headers = self._head
        if not keep or headers.get("connection", "").lower() == "close":
            self.close()
        if not self.waiter.done():
            self.waiter.set_result(Response(status, headers, body))

    def _advance(self) -> None:
        buf = self._buf
        if self._head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise HttpError("response head too long")
                return
            self._head = _parse_head(bytes(buf[:end]))
            del buf[: end + 4]
            headers = self._head[1]
            if "chunked" in headers.get("transfer-encoding", "").lower():
                self._chunk_left = 0
            elif self._head[0] in (204, 304) or 100 <= self._head[0] < 200:
                self._done(b"", keep=True)
                return
        headers = self._head[1]
        if self._chunk_left is not None:
            self._advance_chunked()
            return
        length = headers.get("content-length")
        if length is None:
            self._body += buf  # read until the server closes
            buf.clear()
            return
        try:
            size = int(length)
        except ValueError:
            raise HttpError(f"bad Content-Length: {length!r}") from None
        if size < 0:
            raise HttpError(f"bad Content-Length: {length!r}")
        if len(buf) >= size:
            body = bytes(buf[:size])
            extra = len(buf) > size
            del buf[:size]
            if extra:
                raise HttpError("more data than the Content-Length")
            self._done(body, keep=True)

    def _advance_chunked(self) -> None:
        buf = self._buf
        while True:
            if self._in_trailers:  # trailer lines until an empty one
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                line = bytes(buf[:end])
                del buf[: end + 2]
                if not line:
                    self._done(bytes(self._body), keep=True)
                    return
                continue
            left = self._chunk_left or 0
            if left:
                if len(buf) < left + 2:
                    return
                if buf[left : left + 2] != b"\r\n":
                    raise HttpError("chunk not followed by CRLF")
                self._body += buf[:left]
                del buf[: left + 2]
                self._chunk_left = 0
                continue
            end = buf.find(b"\r\n")
            if end < 0:
                return
            size_text = bytes(buf[:end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise HttpError(f"bad chunk size: {size_text!r}") from None
            del buf[: end + 2]
            if size == 0:
                self._in_trailers = True
            else:
                self._chunk_left = size


def _parse_head(raw: bytes) -> tuple[int, dict[str, str]]:
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise HttpError(f"bad status line: {lines[0][:100]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(f"bad header line: {line[:100]!r}")
        headers[name.lower()] = value.strip()
    return int(parts[1]), headers


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
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self._authority.decode()}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1")
        request = head + body
        conn: _Connection | None = None
        try:
            async with asyncio.timeout(limit_s):
                conn, reused = await self._connection()
                try:
                    response = await conn.begin(request)
                except HttpError:
                    if not (reused and conn.silent):
                        raise
                    # The server closed the kept-alive connection before it answered (Go's
                    # net/http sends such a request once more, on a new connection).
                    conn, _ = await self._connection(fresh=True)
                    response = await conn.begin(request)
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
