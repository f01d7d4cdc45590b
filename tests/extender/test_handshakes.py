"""Refused TLS handshakes are logged and counted (extender.handshakes, issue #37), over real
TLS on loopback: the production runner (:func:`extender.main.serve`), the certificates of
``tests/extender/test_tls.py``'s PKI, on asyncio's event loop and on uvloop."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest
import uvloop
from prometheus_client import CollectorRegistry, Counter

from extender import handshakes
from flexlease.store.memory import MemoryStore
from tests.extender import payloads
from tests.extender.conftest import add_node
from tests.extender.test_main import serving, wait_ready
from tests.extender.test_tls import Pki, handshake


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    s = MemoryStore()
    await add_node(s, payloads.gpunode("n1", gpus=2))
    yield s
    await s.close()


def failures_of(text: str) -> dict[str, float]:
    """``flexlease_extender_tls_handshake_failures_total`` by reason, from a scrape."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("flexlease_extender_tls_handshake_failures_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('reason="', 1)[1].split('"', 1)[0]] = float(value)
    return out


async def scrape(url: str, context: ssl.SSLContext) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics", ssl=context) as resp:
        return failures_of(await resp.text())


async def plain_http(url: str) -> None:
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    await reader.read()
    writer.close()


async def hang_up(url: str) -> None:
    """Connect and close without a byte (a TCP probe, a port scanner)."""
    parts = urlsplit(url)
    _, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.close()
    await writer.wait_closed()


async def say_nothing(url: str) -> None:
    """Connect and send nothing until the server gives up."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    await asyncio.wait_for(reader.read(), 5)
    writer.close()


def blocking_handshake(url: str, context: ssl.SSLContext) -> None:
    """A TLS handshake from a blocking socket, as a Go client does it: a certificate it does
    not trust is answered with an alert before it closes."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    with (
        socket.create_connection((parts.hostname, parts.port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=parts.hostname),
    ):
        pass


async def refused(url: str, pki: Pki, case: str) -> None:
    """One client of the kind ``case`` names, whose handshake the extender refuses."""
    if case == "plain_http":
        await plain_http(url)
    elif case == "hang_up":
        await hang_up(url)
    elif case == "say_nothing":
        await say_nothing(url)
    elif case == "distrusts_us":  # a blocking socket sends its alert (asyncio's client does not)
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.to_thread(blocking_handshake, url, pki.distrusting())
    else:
        context = {
            "no_cert_tls12": lambda: pki.client(None, max_tls12=True),
            "no_cert_tls13": lambda: pki.client(None),
            "other_ca": lambda: pki.client(pki.foreign),
            "expired": lambda: pki.client(pki.expired),
            "not_yet_valid": lambda: pki.client(pki.early),
        }[case]()
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await handshake(url, context)


CASES = {
    "no_cert_tls12": ("no_client_certificate", "PEER_DID_NOT_RETURN_A_CERTIFICATE", logging.WARNING),
    "no_cert_tls13": ("no_client_certificate", "PEER_DID_NOT_RETURN_A_CERTIFICATE", logging.WARNING),
    "other_ca": ("client_certificate_untrusted", "unable to get local issuer certificate", logging.WARNING),
    "expired": ("client_certificate_expired", "certificate has expired", logging.WARNING),
    "not_yet_valid": ("client_certificate_not_yet_valid", "certificate is not yet valid", logging.WARNING),
    "distrusts_us": ("server_certificate_rejected", "TLSV1_ALERT_UNKNOWN_CA", logging.WARNING),
    "plain_http": ("plain_http", "HTTP_REQUEST", logging.WARNING),
    "hang_up": ("eof", "", logging.INFO),
    "say_nothing": ("timeout", "taking longer than 0.3 seconds", logging.INFO),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_refused_handshake_is_logged_with_the_peer_and_counted(
    pki: Pki, store: MemoryStore, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    """Issue #37: a scheduler with a wrong, expired or missing client certificate saw only
    EOF and the extender logged nothing. Each refused handshake is now logged (the peer's
    address, the reason, OpenSSL's words) and counted by reason; the good client is served
    on the same listener before and after."""
    reason, words, level = CASES[case]
    scheduler = pki.client(pki.scheduler)
    settings = pki.settings(tls_handshake_timeout_seconds=0.3)
    async with serving(settings, store) as url:
        await handshake(url, scheduler)
        before = await scrape(url, scheduler)
        assert set(before) == set(handshakes.REASONS) and not any(before.values())
        with caplog.at_level(logging.INFO, logger="extender.handshakes"):
            await refused(url, pki, case)
            for _ in range(100):  # the server may see the failure after the client gave up
                if any(r.name == "extender.handshakes" for r in caplog.records):
                    break
                await asyncio.sleep(0.01)
        after = await scrape(url, scheduler)
        await handshake(url, scheduler)
    assert after == {**before, reason: 1.0}
    [record] = [r for r in caplog.records if r.name == "extender.handshakes"]
    assert record.levelno == level and record.__dict__["reason"] == reason
    assert record.__dict__["peer"].startswith("127.0.0.1:")
    assert words in record.getMessage() and words in record.__dict__["detail"]


async def test_a_flood_of_refused_handshakes_is_counted_but_logged_once_per_interval(
    pki: Pki, store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = pki.client(pki.scheduler)
    settings = pki.settings(tls_handshake_log_interval_seconds=0.5)
    async with serving(settings, store) as url:
        with caplog.at_level(logging.INFO, logger="extender.handshakes"):
            for _ in range(20):
                await refused(url, pki, "other_ca")
            await asyncio.sleep(0.6)
            await refused(url, pki, "other_ca")  # the next interval: one line, telling of 19
            for _ in range(50):
                if (await scrape(url, scheduler)).get("client_certificate_untrusted") == 21:
                    break
                await asyncio.sleep(0.01)
        assert (await scrape(url, scheduler))["client_certificate_untrusted"] == 21
    lines = [r for r in caplog.records if r.name == "extender.handshakes"]
    assert [r.__dict__["not_logged"] for r in lines] == [0, 19]


async def test_requests_sent_with_the_handshake_reach_the_app(pki: Pki, store: MemoryStore) -> None:
    """A connection the site accepted is served as before: requests written at once after
    the handshake (pipelined, one with a 300 KiB body) are all answered."""
    await add_node(store, payloads.gpunode("n2", gpus=2))
    pod = payloads.pod("p", gpus=1)
    body = json.dumps(
        payloads.extender_args(pod, ["n1", "n2", *(f"cpu-{i}" for i in range(20_000))])
    ).encode()
    parts = None
    async with serving(pki.settings(), store) as url:
        parts = urlsplit(url)
        reader, writer = await asyncio.open_connection(
            parts.hostname, parts.port, ssl=pki.client(pki.scheduler)
        )
        request = (
            b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        writer.write(request + request + b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    assert answer.count(b"HTTP/1.1 200 OK") == 3
    assert answer.count(b'"NodeNames":["n1","n2"]') == 2


def test_refused_handshakes_are_seen_on_uvloop_too(pki: Pki) -> None:
    """The production event loop (uvloop) runs the same handshakes; it reads a new
    connection at once (the reason the site accepts connections itself)."""

    async def scenario() -> tuple[dict[str, float], str]:
        s = MemoryStore()
        await add_node(s, payloads.gpunode("n1", gpus=2))
        try:
            async with serving(pki.settings(), s) as url:
                async with aiohttp.ClientSession() as session:
                    await wait_ready(session, url, ssl=pki.client(pki.scheduler))
                    async with session.post(
                        f"{url}/filter",
                        json=payloads.extender_args(payloads.pod("p", gpus=1), ["n1"]),
                        ssl=pki.client(pki.scheduler),
                    ) as resp:
                        names = (await resp.json())["NodeNames"]
                await refused(url, pki, "no_cert_tls12")
                await refused(url, pki, "expired")
                await asyncio.sleep(0.05)
                return await scrape(url, pki.client(pki.scheduler)), ",".join(names)
        finally:
            await s.close()

    result: list[tuple[dict[str, float], str]] = []

    def run() -> None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            result.append(runner.run(scenario()))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    [(counts, names)] = result
    assert names == "n1"
    assert counts["no_client_certificate"] == 1 and counts["client_certificate_expired"] == 1


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (ConnectionAbortedError("SSL handshake is taking longer than 60.0 seconds"), "timeout"),
        (ConnectionResetError(), "eof"),
        (ssl.SSLEOFError(8, "EOF occurred in violation of protocol"), "eof"),
        (RuntimeError("something else"), "other"),
    ],
)
def test_classify_the_rest(exc: BaseException, reason: str) -> None:
    assert handshakes.classify(exc) == reason


def test_the_log_is_rate_limited_per_reason() -> None:
    """Pure: at most one line per reason per interval, the next one telling how many were
    not logged; every failure counted."""
    now = [0.0]
    counter = Counter("t_failures", "test", ["reason"], registry=CollectorRegistry())
    failures = handshakes.HandshakeFailures(counter, 10.0, clock=lambda: now[0])
    expired = ssl.SSLCertVerificationError(1, "certificate verify failed")
    expired.verify_code, expired.verify_message = 10, "certificate has expired"
    reasons = [failures.report(expired, ("10.0.0.7", 51234)) for _ in range(5)]
    assert reasons == ["client_certificate_expired"] * 5
    assert failures.report(ConnectionResetError(), ("::1", 1)) == "eof"  # its own reason, logged
    now[0] = 10.0
    failures.report(expired, ("10.0.0.7", 51235))
    assert counter.labels("client_certificate_expired")._value.get() == 6
    assert counter.labels("eof")._value.get() == 1
    assert handshakes._address(("::1", 1)) == "[::1]:1" and handshakes._address(None) == "-"
