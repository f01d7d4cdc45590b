"""flexlease.pipe: two asyncio protocols connected in-process behave as over a socket (in-order
delivery on later loop turns, end of file after the data, connection_lost once each, held
bytes while reading is paused), and aiohttp's real server answers the simulator's HTTP/1.1
client through it (keep-alive, server-closed connections, chunked replies)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from flexlease import pipe
from flexlease.sim.http1 import Http1Client


class Recorder(asyncio.Protocol):
    """Records every callback in order; ``keep_open`` is what ``eof_received`` answers."""

    def __init__(self, *, keep_open: bool = False) -> None:
        self.events: list[tuple[str, Any]] = []
        self.keep_open = keep_open
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.events.append(("made", None))

    def data_received(self, data: bytes) -> None:
        self.events.append(("data", data))

    def eof_received(self) -> bool:
        self.events.append(("eof", None))
        return self.keep_open

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append(("lost", exc))


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_bytes_arrive_in_order_on_later_loop_turns_and_are_copied() -> None:
    loop = asyncio.get_running_loop()
    end, client, server = pipe.connect(loop, Recorder, Recorder)
    assert client.events == [("made", None)] and server.events == [("made", None)]
    buffer = bytearray(b"one")
    end.write(buffer)
    buffer[:] = b"XXX"  # the caller reuses its buffer: what was written is what arrives
    end.writelines([b"t", memoryview(b"wo")])
    end.write(b"")  # nothing to send, nothing delivered
    assert server.events == [("made", None)]  # never delivered inside write()
    await _turns()
    assert server.events[1:] == [("data", b"one"), ("data", b"two")]
    assert end.get_extra_info("peername") == pipe.PEERNAME and end.get_extra_info("socket") is None
    assert end.get_write_buffer_size() == 0 and not end.can_write_eof()
    assert end.get_protocol() is client


async def test_close_delivers_the_data_first_then_eof_and_closes_both_ends_once() -> None:
    loop = asyncio.get_running_loop()
    end, client, server = pipe.connect(loop, Recorder, Recorder)
    end.write(b"last words")
    end.close()
    end.close()  # twice: still one connection_lost
    end.write(b"dropped")  # after close: nowhere to go
    assert end.is_closing()
    await _turns()
    assert server.events == [("made", None), ("data", b"last words"), ("eof", None), ("lost", None)]
    assert client.events == [("made", None), ("lost", None)]
    assert server.transport is not None and server.transport.is_closing()


async def test_a_peer_that_keeps_its_end_open_after_eof_can_still_answer() -> None:
    loop = asyncio.get_running_loop()
    end, client, server = pipe.connect(loop, Recorder, lambda: Recorder(keep_open=True))
    end.close()
    await _turns()
    assert server.events == [("made", None), ("eof", None)]  # half-open: not lost yet
    assert isinstance(server.transport, pipe.PipeTransport)
    server.transport.write(b"too late")  # the client's end is gone: dropped
    server.transport.abort()
    await _turns()
    assert server.events[-1] == ("lost", None)
    assert ("data", b"too late") not in client.events


async def test_paused_reading_holds_bytes_and_eof_until_resumed() -> None:
    loop = asyncio.get_running_loop()
    end, _, server = pipe.connect(loop, Recorder, Recorder)
    assert isinstance(server.transport, pipe.PipeTransport)
    server.transport.pause_reading()
    assert not server.transport.is_reading()
    end.write(b"a")
    end.write(b"b")
    end.close()
    await _turns()
    assert server.events == [("made", None)]
    server.transport.resume_reading()
    server.transport.resume_reading()  # not paused: nothing more
    await _turns()
    assert server.events == [("made", None), ("data", b"a"), ("data", b"b"), ("eof", None), ("lost", None)]


async def test_bytes_written_while_held_bytes_wait_for_the_flush_stay_in_order() -> None:
    loop = asyncio.get_running_loop()
    end, _, server = pipe.connect(loop, Recorder, Recorder)
    assert isinstance(server.transport, pipe.PipeTransport)
    server.transport.pause_reading()
    end.write(b"A")
    await _turns()
    end.write(b"B")  # queued for delivery before the flush that resume schedules
    server.transport.resume_reading()
    end.write(b"C")
    await _turns()
    assert [d for kind, d in server.events if kind == "data"] == [b"A", b"B", b"C"]


async def test_end_of_file_is_delivered_once_across_pauses() -> None:
    loop = asyncio.get_running_loop()
    end, _, server = pipe.connect(loop, Recorder, lambda: Recorder(keep_open=True))
    assert isinstance(server.transport, pipe.PipeTransport)
    server.transport.pause_reading()
    end.close()
    await _turns()
    server.transport.resume_reading()
    server.transport.pause_reading()
    server.transport.resume_reading()
    await _turns()
    assert [kind for kind, _ in server.events].count("eof") == 1


class Exploding(Recorder):
    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        raise RuntimeError("protocol bug")


async def test_a_protocol_that_raises_loses_its_connection_and_the_peer_gets_eof() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        end, client, server = pipe.connect(loop, Recorder, Exploding)
        end.write(b"boom")
        end.write(b"never read")  # the server's end is closed by then: nothing more is read
        await _turns()
    finally:
        loop.set_exception_handler(None)
    assert [kind for kind, _ in server.events] == ["made", "data", "lost"]
    assert isinstance(server.events[-1][1], RuntimeError)
    assert client.events == [("made", None), ("eof", None), ("lost", None)]
    assert len(reported) == 1 and isinstance(reported[0]["exception"], RuntimeError)


async def test_aiohttp_serves_the_http1_client_through_a_pipe() -> None:
    peers: list[Any] = []

    async def echo(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        peers.append(request.transport)
        body = await request.read()
        if request.path == "/close":
            return web.Response(body=body, headers={"Connection": "close"})
        if request.path == "/chunked":
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            await resp.write(b'{"a":')
            await resp.write(b" 1}")
            await resp.write_eof()
            return resp
        return web.json_response({"path": request.path, "body": body.decode(), "remote": request.remote})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    assert runner.server is not None
    server = runner.server
    opened: list[pipe.PipeTransport] = []

    async def connect(protocol: Any) -> asyncio.BaseTransport:
        end, _, _ = pipe.connect(asyncio.get_running_loop(), protocol, server)
        opened.append(end)
        return end

    try:
        async with Http1Client("http://extender.invalid:8888", connect=connect) as client:
            first = await client.request("POST", "/filter", b'{"x":1}', limit_s=5)
            second = await client.request("POST", "/bind", b"{}", limit_s=5)
            assert first.status == 200
            assert first.body == b'{"path": "/filter", "body": "{\\"x\\":1}", "remote": "127.0.0.1"}'
            assert second.status == 200 and len(opened) == 1 and peers[0] is peers[1]  # kept alive
            closing = await client.request("POST", "/close", b"bye", limit_s=5)
            assert closing.body == b"bye"
            chunked = await client.request("GET", "/chunked", limit_s=5)
            assert chunked.body == b'{"a": 1}'
            assert len(opened) == 2  # the server ended the first connection; a new one served this
            assert len(server.connections) == 1
        await _turns(20)
        assert not server.connections  # the client's close reached the server's handler
    finally:
        await runner.cleanup()
