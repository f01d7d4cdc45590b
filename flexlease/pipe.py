"""An in-process connection between two asyncio protocols: bytes written on one end reach
the other end's ``data_received`` on the next turn of the event loop, as over a socket, but
without the kernel.

The simulator (:mod:`flexlease.sim`) connects its HTTP/1.1 client to the hosted extender's
aiohttp server this way (:func:`extender.simhost.hosted`): the same app, middlewares and
HTTP bytes as over loopback TCP, without two ``send``/``recv`` pairs and an ``epoll`` wake-up
per call: a minimal aiohttp round trip costs ≈ 61 µs of CPU through a pipe against ≈ 100 µs
over loopback TCP; an 8-day right-of-return run (64 nodes) saves ≈ 3 % pinned to one CPU, more
when runs share the CPUs (docs/results/simulator.md, "Running time").

What a socket does and these transports do too:

* delivery is asynchronous and in order: :meth:`PipeTransport.write` schedules the peer's
  ``data_received`` with ``loop.call_soon``, so a write never re-enters the peer's protocol;
* :meth:`PipeTransport.close` (and :meth:`~PipeTransport.abort`) delivers what was written
  before it, then the peer's ``eof_received``; unless that returns true (half-open), the
  peer's end closes too, and each protocol gets ``connection_lost(None)`` once;
* :meth:`~PipeTransport.pause_reading` holds incoming bytes (and end of file) until
  :meth:`~PipeTransport.resume_reading`, then delivers them in order;
* once an end is closed it reads nothing more; an exception raised by a protocol's
  ``data_received`` or ``eof_received`` goes to the loop's exception handler and closes that
  end (``connection_lost(exc)``), the other end getting end of file, as asyncio's socket
  transports treat it;
* a write after close is dropped (the bytes have nowhere to go), as asyncio's socket
  transports drop them after the connection is lost.

Not modelled: write-buffer back-pressure (the peer receives every write at once, so the write
buffer is always empty), half-close by ``write_eof``, TLS, and socket options
(``get_extra_info("socket")`` is None, so aiohttp sets no ``TCP_NODELAY``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Final, TypeVar

PEERNAME: Final = ("127.0.0.1", 0)
"""What ``get_extra_info("peername")`` and ``("sockname")`` answer: loopback, no port."""

_P = TypeVar("_P", bound=asyncio.Protocol)
_Q = TypeVar("_Q", bound=asyncio.Protocol)


class PipeTransport(asyncio.Transport):
    """One end of a pipe (:func:`connect`): ``protocol`` receives what the other end writes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self._loop = loop
        self._protocol = protocol
        self._peer: PipeTransport | None = None
        self._closing = False
        self._lost = False
        self._eof = False
        self._paused = False
        self._held: list[bytes] = []
        """Bytes received while reading was paused (and after, until delivered), in order."""
        self._flushing = False
        """A delivery of the held bytes is scheduled."""

    # -- what the protocol on this end calls -------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """``peername`` and ``sockname``: :data:`PEERNAME`; anything else: ``default``."""
        return PEERNAME if name in ("peername", "sockname") else default

    def is_closing(self) -> bool:
        return self._closing

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        assert isinstance(protocol, asyncio.Protocol)
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data`` to the other end (copied now: the caller may reuse its buffer)."""
        if self._closing or not data:
            return
        peer = self._peer
        if peer is not None:
            self._loop.call_soon(peer._receive, bytes(data))

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        """Send the chunks as one write."""
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (0, 0)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """Accepted and ignored: nothing is ever buffered for writing."""

    def is_reading(self) -> bool:
        return not self._paused and not self._closing

    def pause_reading(self) -> None:
        self._paused = True

    def resume_reading(self) -> None:
        if not self._paused:
            return
        self._paused = False
        if (self._held or self._eof) and not self._flushing:
            self._flushing = True
            self._loop.call_soon(self._flush)

    def close(self) -> None:
        """Close this end: the other end gets what was written so far, then its end of file."""
        self._close(None)

    def abort(self) -> None:
        """As :meth:`close`: nothing is ever buffered, so nothing is discarded."""
        self._close(None)

    # -- what the other end calls ------------------------------------------------------------

    def _receive(self, data: bytes) -> None:
        if self._closing:
            return  # closed here: nothing more is read, as a socket transport stops reading
        if self._paused or self._held:  # behind what is held, in order
            self._held.append(data)
            return
        self._deliver(data)

    def _receive_eof(self) -> None:
        if self._closing:
            return
        if self._paused or self._held:
            self._eof = True  # after the held bytes, once reading resumes
            return
        self._deliver_eof()

    # -- this end ------------------------------------------------------------------------------

    def _flush(self) -> None:
        """Deliver the bytes held while reading was paused, then a held end of file, unless
        reading is paused again or the end closes meanwhile (the rest waits)."""
        self._flushing = False
        while self._held and not self._paused and not self._closing:
            self._deliver(self._held.pop(0))
        if self._eof and not self._held and not self._paused and not self._closing:
            self._deliver_eof()

    def _deliver(self, data: bytes) -> None:
        try:
            self._protocol.data_received(data)
        except Exception as exc:  # as asyncio's socket transports: fatal for the connection
            self._fatal(exc, "data_received")

    def _deliver_eof(self) -> None:
        self._eof = False
        try:
            keep_open = self._protocol.eof_received()
        except Exception as exc:
            self._fatal(exc, "eof_received")
            return
        if not keep_open:
            self.close()

    def _fatal(self, exc: Exception, where: str) -> None:
        self._loop.call_exception_handler(
            {"message": f"pipe transport: {where} raised", "exception": exc, "transport": self}
        )
        self._close(exc)

    def _close(self, exc: Exception | None) -> None:
        if self._closing:
            return
        self._closing = True
        self._held.clear()
        peer = self._peer
        if peer is not None:
            self._loop.call_soon(peer._receive_eof)
        self._loop.call_soon(self._connection_lost, exc)

    def _connection_lost(self, exc: Exception | None) -> None:
        if not self._lost:
            self._lost = True
            self._protocol.connection_lost(exc)


def connect(
    loop: asyncio.AbstractEventLoop, client: Callable[[], _P], server: Callable[[], _Q]
) -> tuple[PipeTransport, _P, _Q]:
    """Make one protocol from each factory and connect them by a pipe; each gets
    ``connection_made`` with its end before this returns. Returns the client's end and both
    protocols."""
    client_protocol, server_protocol = client(), server()
    client_end = PipeTransport(loop, client_protocol)
    server_end = PipeTransport(loop, server_protocol)
    client_end._peer, server_end._peer = server_end, client_end
    server_protocol.connection_made(server_end)
    client_protocol.connection_made(client_end)
    return client_end, client_protocol, server_protocol
