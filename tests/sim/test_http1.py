"""flexlease.sim.http1: the simulator's HTTP/1.1 client against real servers (aiohttp's, and
raw asyncio ones for what aiohttp would not send), and its response reader fed in pieces."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from flexlease.sim.http1 import Http1Client, HttpError, Response, _Connection, request_head

MakeServer = Callable[..., Awaitable[TestServer]]


async def _echo_app(aiohttp_server: MakeServer, **kwargs: Any) -> tuple[TestServer, list[Any]]:
    peers: list[Any] = []

    async def echo(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername"))
        body = await request.read()
        if request.path == "/chunked":
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for part in (b'{"a":', b" 1}"):
                await resp.write(part)
            await resp.write_eof()
            return resp
        if request.path == "/close":
            return web.Response(body=body, headers={"Connection": "close"})
        if request.path == "/slow":
            await asyncio.sleep(5)
        return web.json_response(
            {"method": request.method, "type": request.content_type, "body": body.decode()}, status=201
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    return await aiohttp_server(app, **kwargs), peers


async def test_requests_reuse_one_kept_alive_connection(aiohttp_server: MakeServer) -> None:
    server, peers = await _echo_app(aiohttp_server)
    async with Http1Client(str(server.make_url(""))) as client:
        first = await client.request("POST", "/filter", b'{"x":1}', limit_s=5)
        second = await client.request("GET", "/readyz", limit_s=5)
    assert first.status == 201 and first.headers["content-type"].startswith("application/json")
    assert first.body == b'{"method": "POST", "type": "application/json", "body": "{\\"x\\":1}"}'
    assert b'"GET"' in second.body
    assert len(peers) == 2 and peers[0] == peers[1]


async def test_chunked_and_connection_close_responses(aiohttp_server: MakeServer) -> None:
    server, peers = await _echo_app(aiohttp_server)
    async with Http1Client(str(server.make_url(""))) as client:
        chunked = await client.request("POST", "/chunked", b"", limit_s=5)
        assert (chunked.status, chunked.body) == (200, b'{"a": 1}')
        closing = await client.request("POST", "/close", b"bye", limit_s=5)
        assert closing.body == b"bye"
        again = await client.request("POST", "/x", b"", limit_s=5)
        assert again.status == 201
    assert peers[0] == peers[1] != peers[2]  # a new connection after "Connection: close"


async def test_a_connection_the_server_closed_while_idle_is_replaced(aiohttp_server: MakeServer) -> None:
    server, peers = await _echo_app(aiohttp_server, keepalive_timeout=0.05)
    async with Http1Client(str(server.make_url(""))) as client:
        assert (await client.request("POST", "/a", b"", limit_s=5)).status == 201
        await asyncio.sleep(0.3)  # the server drops the idle connection
        assert (await client.request("POST", "/b", b"", limit_s=5)).status == 201
    assert len(set(peers)) == 2


async def test_timeouts_refusals_and_a_closed_client_raise_http_error(aiohttp_server: MakeServer) -> None:
    server, _ = await _echo_app(aiohttp_server)
    async with Http1Client(str(server.make_url(""))) as client:
        with pytest.raises(HttpError, match=r"no response within 0\.2 s"):
            await client.request("POST", "/slow", b"", limit_s=0.2)
        assert (await client.request("POST", "/after", b"", limit_s=5)).status == 201
    with pytest.raises(HttpError, match="closed"):
        await client.request("POST", "/x", b"", limit_s=5)
    async with Http1Client("http://127.0.0.1:9") as refused:
        with pytest.raises(HttpError, match="Error"):
            await refused.request("POST", "/x", b"", limit_s=5)
    for bad in ("https://127.0.0.1:1", "http://127.0.0.1:1/path", "127.0.0.1:1"):
        with pytest.raises(ValueError, match="not an http"):
            Http1Client(bad)


@contextlib.asynccontextmanager
async def _raw_server(reply: bytes, *, close: bool) -> AsyncIterator[str]:
    handlers: set[asyncio.Task[Any]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        await reader.readuntil(b"\r\n\r\n")
        writer.write(reply)
        await writer.drain()
        if not close:
            await reader.read()  # until the client closes
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await asyncio.wait_for(asyncio.gather(*handlers), 5)


@pytest.mark.parametrize(
    ("reply", "close", "expected"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end", True, b"until the end"),
        (b"HTTP/1.1 204 No Content\r\n\r\n", False, b""),
        (b"garbage\r\n\r\n", False, "Expected HTTP/"),
        (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", False, "Invalid header token"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", False, "Invalid character in Content-Length"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nabc",
            False,
            b"ab",
        ),  # the rest: dropped with the connection
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            False,
            "Invalid character in chunk size",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc",
            False,
            "Expected LF after chunk data",
        ),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", False, b"ok"),
        (b"HTTP/1.1 100 Continue\r\n\r\n", True, "connection closed"),  # no final response
        (b"HTTP/1.1 200 OK\r\nContent-Length: 200000\r\n\r\n" + b"x" * 200_000, False, b"x" * 200_000),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n", True, "before the whole"),
        (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", False, "head longer than 65536 bytes"),
        (
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n",
            False,
            "upgrade was not asked for",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
            True,
            "closed by the server before the whole response",
        ),
    ],
)
async def test_what_a_raw_server_sends_is_read_or_refused_clearly(
    reply: bytes, close: bool, expected: bytes | str
) -> None:
    async with _raw_server(reply, close=close) as url, Http1Client(url) as client:
        if isinstance(expected, bytes):
            assert (await client.request("POST", "/x", b"{}", limit_s=5)).body == expected
        else:
            with pytest.raises(HttpError, match=expected):
                await client.request("POST", "/x", b"{}", limit_s=5)


class _FakeTransport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def writelines(self, parts: tuple[bytes, ...]) -> None:
        self.written += b"".join(parts)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


_RESPONSES = [
    (
        b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nX-A: b\r\n\r\nhello world",
        Response(200, {"content-length": "11", "x-a": "b"}, b"hello world"),
    ),
    (
        b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n",
        Response(500, {"transfer-encoding": "chunked"}, b"hello world"),
    ),
]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(_RESPONSES), st.lists(st.integers(1, 200), max_size=60))
def test_a_response_split_anywhere_reads_the_same(case: tuple[bytes, Response], cuts: list[int]) -> None:
    raw, expected = case

    async def play() -> Response:
        conn = _Connection()
        conn.connection_made(_FakeTransport())  # type: ignore[arg-type]
        waiter = conn.begin(request_head("POST", "/", "x", "application/json", 0), b"")
        at = 0
        for cut in cuts:
            if at >= len(raw):
                break
            conn.data_received(raw[at : at + cut])
            at += cut
        if at < len(raw):
            conn.data_received(raw[at:])
        return await waiter

    assert asyncio.run(play()) == expected


async def test_a_second_response_in_the_same_bytes_drops_the_connection(aiohttp_server: MakeServer) -> None:
    two = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\naHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb"
    async with _raw_server(two, close=False) as url, Http1Client(url) as client:
        first = await client.request("POST", "/x", b"{}", limit_s=5)
        assert (first.status, first.body) == (200, b"a")
        assert client._idle == []  # not reused: the server answered a request nobody sent


def test_request_heads_are_well_formed_or_refused() -> None:
    assert request_head("POST", "/filter", "127.0.0.1:8", "application/json", 12) == (
        b"POST /filter HTTP/1.1\r\nHost: 127.0.0.1:8\r\nContent-Type: application/json\r\n"
        b"Content-Length: 12\r\n\r\n"
    )
    for method, target, ctype in (
        ("PO ST", "/", "a/b"),
        ("", "/", "a/b"),
        ("GET", "/a b", "a/b"),
        ("GET", "/\r\nX-Evil: 1", "a/b"),
        ("GET", "/", "a/b\r\nX: y"),
    ):
        with pytest.raises(ValueError, match=r"not an HTTP method|bad request"):
            request_head(method, target, "h", ctype, 0)


@contextlib.asynccontextmanager
async def _hanging_up_server() -> AsyncIterator[tuple[str, list[bytes]]]:
    """Answers the first request on each connection and closes it on the second without a
    reply (a server that dropped a kept-alive connection just as the next request came)."""
    seen: list[bytes] = []
    handlers: set[asyncio.Task[Any]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head.split(b" ", 1)[0])
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            head = await reader.readuntil(b"\r\n\r\n")
            seen.append(head.split(b" ", 1)[0])
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        server.close()
        await asyncio.wait_for(asyncio.gather(*handlers, return_exceptions=True), 5)


@pytest.mark.parametrize(("method", "retried"), [("GET", True), ("POST", False)])
async def test_only_a_replayable_request_is_sent_again_after_a_hang_up(method: str, retried: bool) -> None:
    async with _hanging_up_server() as (url, seen), Http1Client(url) as client:
        assert (await client.request(method, "/first", limit_s=5)).body == b"ok"
        if retried:
            assert (await client.request(method, "/second", limit_s=5)).body == b"ok"
            assert seen == [method.encode()] * 3  # the second request went twice
        else:
            with pytest.raises(HttpError, match="connection closed"):
                await client.request(method, "/second", limit_s=5)
            assert seen == [method.encode()] * 2
