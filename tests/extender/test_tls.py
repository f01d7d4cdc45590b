"""Mutual TLS between kube-scheduler and the extender (issue #18), over real TLS on loopback:
the production runner (:func:`extender.main.serve`), certificates made in the test."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa

from extender import main as extmain
from extender import tls
from flexlease.api import keys
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore
from tests.extender import payloads
from tests.extender.certs import Authority, Issued
from tests.extender.conftest import add_node, add_pod
from tests.extender.test_main import make_settings, serving, wait_ready


class Pki:
    """The cluster's CA with the extender's serving certificate and kube-scheduler's client
    certificate (CN ``flexlease-scheduler``), an intruder's certificate from the same CA, and
    one from another CA."""

    def __init__(self, directory: Path) -> None:
        self.ca = Authority(directory, "flexlease-ca")
        self.server = self.ca.issue(
            "extender", common_name="flexlease-extender", dns=("localhost",), ips=("127.0.0.1",), server=True
        )
        self.scheduler = self.ca.issue("scheduler", common_name="flexlease-scheduler")
        self.intruder = self.ca.issue("intruder", common_name="some-workload", dns=("attacker.ns.svc",))
        self.foreign = Authority(directory, "other-ca").issue("foreign", common_name="flexlease-scheduler")
        day = dt.timedelta(days=1)
        self.expired = self.ca.issue("expired", common_name="flexlease-scheduler", valid=(-2 * day, -day))
        self.early = self.ca.issue("early", common_name="flexlease-scheduler", valid=(day, 2 * day))
        self._other_ca = directory / "other-ca.crt"

    def settings(self, **extender: Any) -> Any:
        extender.setdefault("tls_client_ca_file", self.ca.ca_file)
        return make_settings(tls_cert_file=self.server.cert, tls_key_file=self.server.key, **extender)

    def distrusting(self) -> ssl.SSLContext:
        """A client with the scheduler's certificate that trusts another CA, not ours."""
        context = ssl.create_default_context(cafile=str(self._other_ca))
        context.load_cert_chain(self.scheduler.cert, self.scheduler.key)
        return context

    def client(self, issued: Issued | None, *, max_tls12: bool = False) -> ssl.SSLContext:
        """A client context trusting our CA, presenting ``issued`` (None: no certificate)."""
        context = ssl.create_default_context(cafile=str(self.ca.ca_file))
        if max_tls12:  # the server checks the client certificate inside the handshake
            context.maximum_version = ssl.TLSVersion.TLSv1_2
        if issued is not None:
            context.load_cert_chain(issued.cert, issued.key)
        return context


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


@pytest.fixture
async def store() -> Any:
    s = MemoryStore()
    await add_node(s, payloads.gpunode("n1", gpus=2))
    yield s
    await s.close()


async def handshake(url: str, context: ssl.SSLContext) -> None:
    """Open a TLS connection to ``url`` and send one request; raises on a refused handshake."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port, ssl=context)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await writer.drain()
        answer = await reader.read()
        if not answer:  # TLS 1.3: the server's alert may end the stream after the handshake
            raise ConnectionResetError("connection closed without a reply")
    finally:
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await writer.wait_closed()


async def test_the_schedulers_certificate_is_served_and_drives_the_verbs(
    pki: Pki, store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    pod = await add_pod(store, payloads.pod("p", gpus=1))
    scheduler = pki.client(pki.scheduler)
    async with serving(pki.settings(), store) as url, aiohttp.ClientSession() as session:
        assert url.startswith("https://127.0.0.1:")
        await wait_ready(session, url, ssl=scheduler)
        async with session.post(
            f"{url}/filter", json=payloads.extender_args(pod, ["n1", "n2"]), ssl=scheduler
        ) as resp:
            assert (await resp.json())["NodeNames"] == ["n1"]
        async with session.post(f"{url}/bind", json=payloads.binding_args(pod, "n1"), ssl=scheduler) as resp:
            assert await resp.json() == {"Error": ""}
        # a refusal names the caller by its certificate
        victim = payloads.pod("victim", gpus=0)
        victim["spec"]["schedulerName"] = "default-scheduler"
        other = await add_pod(store, victim)
        with caplog.at_level(logging.WARNING, logger="extender.admission"):
            async with session.post(
                f"{url}/bind", json=payloads.binding_args(other, "n1"), ssl=scheduler
            ) as resp:
                error = (await resp.json())["Error"]
    assert "spec.schedulerName 'default-scheduler'" in error
    assert (await store.get(Kind.POD, "p", namespace="ml"))["spec"]["nodeName"] == "n1"
    assert not (await store.get(Kind.POD, "victim", namespace="ml"))["spec"].get("nodeName")
    [record] = [r for r in caplog.records if r.name == "extender.admission"]
    assert record.__dict__["caller"].startswith("CN=flexlease-scheduler from 127.0.0.1")


@pytest.mark.parametrize("max_tls12", [True, False], ids=["tls1.2", "tls1.3"])
async def test_no_client_certificate_fails_the_handshake(
    pki: Pki, store: MemoryStore, max_tls12: bool
) -> None:
    pod = await add_pod(store, payloads.pod("p", gpus=1))
    async with serving(pki.settings(), store) as url, aiohttp.ClientSession() as session:
        await wait_ready(session, url, ssl=pki.client(pki.scheduler))
        await handshake(url, pki.client(pki.scheduler, max_tls12=max_tls12))  # the control
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await handshake(url, pki.client(None, max_tls12=max_tls12))
        with pytest.raises(aiohttp.ClientError):
            await session.post(
                f"{url}/bind",
                json=payloads.binding_args(pod, "n1"),
                ssl=pki.client(None, max_tls12=max_tls12),
            )
    assert not (await store.get(Kind.POD, "p", namespace="ml"))["spec"].get("nodeName")


async def test_a_certificate_from_another_ca_fails_the_handshake(pki: Pki, store: MemoryStore) -> None:
    pod = await add_pod(store, payloads.pod("p", gpus=1))
    async with serving(pki.settings(), store) as url, aiohttp.ClientSession() as session:
        await wait_ready(session, url, ssl=pki.client(pki.scheduler))
        with pytest.raises((ssl.SSLError, ConnectionError)):  # the server's alert ends the handshake
            await handshake(url, pki.client(pki.foreign, max_tls12=True))
        with pytest.raises(aiohttp.ClientError):
            await session.post(
                f"{url}/bind", json=payloads.binding_args(pod, "n1"), ssl=pki.client(pki.foreign)
            )
    assert not (await store.get(Kind.POD, "p", namespace="ml"))["spec"].get("nodeName")


async def test_a_name_outside_the_allow_list_is_refused_before_any_handler(
    pki: Pki, store: MemoryStore
) -> None:
    pod = await add_pod(store, payloads.pod("p", gpus=1))
    settings = pki.settings(tls_client_names=("flexlease-scheduler",))
    async with serving(settings, store) as url, aiohttp.ClientSession() as session:
        await wait_ready(session, url, ssl=pki.client(pki.scheduler))
        intruder = pki.client(pki.intruder)
        async with session.post(f"{url}/bind", json=payloads.binding_args(pod, "n1"), ssl=intruder) as resp:
            assert resp.status == 403
            error = (await resp.json())["Error"]
        assert "['some-workload', 'attacker.ns.svc'] are not in extender.tls_client_names" in error
        async with session.post(
            f"{url}/filter", json=payloads.extender_args(pod, ["n1"]), ssl=intruder
        ) as resp:
            assert resp.status == 403  # no cluster layout for it either
        async with session.get(f"{url}/metrics", ssl=pki.client(pki.scheduler)) as resp:
            text = await resp.text()
        assert 'flexlease_extender_refusals_total{reason="client_name",verb="bind"} 1.0' in text
        assert 'flexlease_extender_refusals_total{reason="client_name",verb="filter"} 1.0' in text
    assert not (await store.get(Kind.POD, "p", namespace="ml"))["spec"].get("nodeName")


async def test_probes_and_metrics_have_their_own_read_only_listener(pki: Pki, store: MemoryStore) -> None:
    """kubelet probes and Prometheus present no client certificate: with ``metrics_port`` they
    get a plain-HTTP listener that serves only GET /metrics, /healthz and /readyz."""
    pod = await add_pod(store, payloads.pod("p", gpus=1))
    stop = asyncio.Event()
    urls: list[str] = []
    listening = asyncio.Event()

    def on_listening(u: list[str]) -> None:
        urls.extend(u)
        listening.set()

    task = asyncio.create_task(
        extmain.serve(pki.settings(metrics_port=0), store, stop=stop, on_listening=on_listening),
        name="test-serve",
    )
    try:
        await asyncio.wait_for(listening.wait(), 5)
        verbs_url, probe_url = urls
        assert verbs_url.startswith("https://") and probe_url.startswith("http://")
        async with aiohttp.ClientSession() as session:
            await wait_ready(session, probe_url)
            async with session.get(f"{probe_url}/healthz") as resp:
                assert resp.status == 200
            async with session.get(f"{probe_url}/metrics") as resp:
                assert "flexlease_extender_refusals_total" in await resp.text()
            async with session.post(f"{probe_url}/bind", json=payloads.binding_args(pod, "n1")) as resp:
                assert resp.status == 404
            async with session.post(f"{probe_url}/metrics", data=b"") as resp:
                assert resp.status == 405
    finally:
        stop.set()
        await task
    assert not (await store.get(Kind.POD, "p", namespace="ml"))["spec"].get("nodeName")


async def test_plain_http_only_when_explicitly_configured(
    store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(insecure_http=False)
    with pytest.raises(tls.InsecureListener, match=r"extender\.insecure_http: true for local use only"):
        await extmain.serve(settings, store, stop=asyncio.Event())
    with caplog.at_level(logging.WARNING, logger="extender.tls"):
        async with serving(make_settings(insecure_http=True), store) as url:
            assert url.startswith("http://")
    assert any("PLAIN HTTP" in r.getMessage() for r in caplog.records)


def test_client_names_reads_cn_and_dns_and_uri_sans() -> None:
    cert = {
        "subject": ((("organizationName", "flexlease"),), (("commonName", "flexlease-scheduler"),)),
        "subjectAltName": (
            ("DNS", "sched.flexlease-system.svc"),
            ("IP Address", "10.0.0.1"),
            ("URI", "spiffe://c/s"),
        ),
    }
    assert tls.client_names(cert) == ("flexlease-scheduler", "sched.flexlease-system.svc", "spiffe://c/s")
    assert tls.client_names(None) == ()
    assert keys.DEFAULT_SCHEDULER_NAME == "flexlease-scheduler"


async def served_serial(url: str, context: ssl.SSLContext) -> int:
    """The serial number of the certificate a new TLS connection to ``url`` is served."""
    parts = urlsplit(url)
    _, writer = await asyncio.open_connection(parts.hostname, parts.port, ssl=context)
    try:
        peer = writer.get_extra_info("ssl_object").getpeercert()
        return int(peer["serialNumber"], 16)
    finally:
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await writer.wait_closed()


def serial_of(issued: Issued) -> int:
    return x509.load_pem_x509_certificate(issued.cert.read_bytes()).serial_number


async def test_a_renewed_certificate_reaches_new_connections_and_a_broken_one_never_does(
    pki: Pki, store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = pki.client(pki.scheduler)
    first = serial_of(pki.server)
    async with serving(pki.settings(tls_reload_seconds=0.05), store) as url:
        assert await served_serial(url, scheduler) == first
        renewed = pki.ca.issue("renewed", common_name="flexlease-extender", ips=("127.0.0.1",), server=True)
        # written in place, key first: for a moment the old certificate sits with the new key
        pki.server.key.write_bytes(renewed.key.read_bytes())
        pki.server.cert.write_bytes(renewed.cert.read_bytes())
        for _ in range(100):
            if await served_serial(url, scheduler) == serial_of(renewed):
                break
            await asyncio.sleep(0.05)
        assert await served_serial(url, scheduler) == serial_of(renewed)
        # a certificate whose key does not match: logged, the renewed one stays
        with caplog.at_level(logging.ERROR, logger="extender.tls"):
            pki.server.cert.write_bytes(pki.intruder.cert.read_bytes())
            for _ in range(100):
                if any("do not load" in r.getMessage() for r in caplog.records):
                    break
                await asyncio.sleep(0.05)
        assert any("do not load" in r.getMessage() for r in caplog.records)
        assert await served_serial(url, scheduler) == serial_of(renewed)


def test_the_reloader_loads_only_what_changed_and_loads(pki: Pki) -> None:
    settings = pki.settings().extender
    digests = tls.file_digests(settings)
    context = tls.server_context(settings)
    assert context is not None
    reloader = tls.CertificateReloader(context, settings, loaded=digests)
    assert not reloader.reload_if_changed() and reloader.current is context  # nothing changed
    pki.server.cert.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64\n")
    assert not reloader.reload_if_changed() and reloader.reloads == 0
    assert not reloader.reload_if_changed()  # the same broken files are not tried again
    renewed = pki.ca.issue("renewed", common_name="flexlease-extender", server=True)
    pki.server.cert.write_bytes(renewed.cert.read_bytes())
    pki.server.key.write_bytes(renewed.key.read_bytes())
    assert reloader.reload_if_changed() and reloader.reloads == 1 and reloader.current is not context
    pki.ca.ca_file.unlink()  # a vanished CA file: an error, not a crash
    assert not reloader.reload_if_changed() and reloader.reloads == 1


async def test_a_rotated_client_ca_replaces_the_old_one(pki: Pki, store: MemoryStore) -> None:
    other = Authority(pki.ca.directory, "next-ca")
    next_scheduler = other.issue("next-scheduler", common_name="flexlease-scheduler")
    client_ca = pki.ca.directory / "client-ca.crt"  # the extender's copy; clients keep trusting pki.ca
    client_ca.write_bytes(pki.ca.ca_file.read_bytes())
    async with serving(pki.settings(tls_reload_seconds=0.05, tls_client_ca_file=client_ca), store) as url:
        await handshake(url, pki.client(pki.scheduler))
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await handshake(url, pki.client(next_scheduler))
        client_ca.write_bytes(other.ca_file.read_bytes())  # the client CA rotated
        for _ in range(100):
            with contextlib.suppress(ssl.SSLError, ConnectionError):
                await handshake(url, pki.client(next_scheduler))
                break
            await asyncio.sleep(0.05)
        await handshake(url, pki.client(next_scheduler))
        with pytest.raises((ssl.SSLError, ConnectionError)):  # the old CA is no longer trusted
            await handshake(url, pki.client(pki.scheduler, max_tls12=True))


async def test_a_certificate_of_another_key_type_replaces_the_old_one(pki: Pki, store: MemoryStore) -> None:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    async with serving(pki.settings(tls_reload_seconds=0.05), store) as url:
        first = await served_serial(url, pki.client(pki.scheduler))
        renewed = pki.ca.issue(
            "renewed-rsa", common_name="flexlease-extender", ips=("127.0.0.1",), server=True, key=rsa_key
        )
        pki.server.cert.write_bytes(renewed.cert.read_bytes())
        pki.server.key.write_bytes(renewed.key.read_bytes())
        for _ in range(100):
            if await served_serial(url, pki.client(pki.scheduler)) != first:
                break
            await asyncio.sleep(0.05)
        assert await served_serial(url, pki.client(pki.scheduler)) == serial_of(renewed)
