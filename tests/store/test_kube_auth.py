"""How KubeStore finds the API server: kubeconfig (token, TLS with a client certificate),
in-cluster service account, the proxy environment (read once), and clear errors when
neither is usable. Certificates are made
with openssl for each test module; the stand-in API server checks them for real."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
import yaml
from kubernetes_asyncio.client import ApiClient
from yarl import URL

from flexlease.config import StoreSettings
from flexlease.errors import StoreError
from flexlease.store import kube
from flexlease.store.base import Kind
from flexlease.store.kube import KubeStore
from flexlease.store.kube_auth import load_configuration
from standins.apiserver import FakeApiServer


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


API_NAME = "kubernetes.default.svc"
"""The API server's name in a cluster (in kube-apiserver's certificate), resolved to 127.0.0.1
by :func:`cluster_dns` and by :func:`forward_proxy`: a *name* to the proxy rules, which never
proxy ``localhost`` or a loopback address, as client-go's do not."""


@pytest.fixture
def cluster_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    """:data:`API_NAME` resolves to 127.0.0.1 for aiohttp's resolver (a cluster's DNS, for
    this process; no query leaves it); every other name as before."""
    resolve = aiohttp.resolver.DefaultResolver.resolve

    async def resolve_api_name(
        self: Any, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> Any:
        return await resolve(self, "127.0.0.1" if host == API_NAME else host, port, family)

    monkeypatch.setattr(aiohttp.resolver.DefaultResolver, "resolve", resolve_api_name)


def _resolve(host: str) -> str:
    """The proxy's own resolution: :data:`API_NAME` is 127.0.0.1 (the proxy sits where the
    cluster's names resolve)."""
    return "127.0.0.1" if host == API_NAME else host


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, a server certificate for 127.0.0.1 (and for the name :data:`API_NAME`) and a
    client certificate (CN=flexlease, O=system:masters, as kubeadm issues admin
    credentials), all EC P-256."""
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=kubernetes-ca",
        cwd=d,
    )
    for name, subj, ext in (
        (
            "server",
            "/CN=kube-apiserver",
            f"subjectAltName=IP:127.0.0.1,DNS:{API_NAME}\nextendedKeyUsage=serverAuth",
        ),
        ("client", "/O=system:masters/CN=flexlease", "extendedKeyUsage=clientAuth"),
    ):
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subj, cwd=d)
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext", cwd=d,
        )  # fmt: skip
    return Pki(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key")


def server_tls(pki: Pki, *, client_certs: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    if client_certs:
        context.load_verify_locations(pki.ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(
    path: Path, server: str, user: Mapping[str, object], cluster: Mapping[str, object] | None = None
) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "test", "cluster": {"server": server, **(cluster or {})}}],
                "users": [{"name": "flexlease", "user": dict(user)}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "flexlease"}}],
                "current-context": "test",
            }
        )
    )
    return path


async def list_pods(store: KubeStore) -> int:
    try:
        return len((await store.list(Kind.POD)).items)
    finally:
        await store.close()


@pytest.fixture
async def token_api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(token="kubeconfig-token") as api:
        yield api


async def test_kubeconfig_with_a_bearer_token(tmp_path: Path, token_api: FakeApiServer) -> None:
    path = write_kubeconfig(tmp_path / "config", token_api.url, {"token": "kubeconfig-token"})
    store = await KubeStore.connect(StoreSettings(kind="kube", kubeconfig=path))
    assert await list_pods(store) == 0
    assert token_api.requests[-1].headers["Authorization"] == "Bearer kubeconfig-token"


async def test_kubeconfig_with_a_wrong_token_is_refused(tmp_path: Path, token_api: FakeApiServer) -> None:
    path = write_kubeconfig(tmp_path / "config", token_api.url, {"token": "stale"})
    store = await KubeStore.connect(StoreSettings(kind="kube", kubeconfig=path))
    with pytest.raises(StoreError) as denied:
        await list_pods(store)
    assert denied.value.status == 401


async def test_kubeconfig_with_tls_and_a_client_certificate(tmp_path: Path, pki: Pki) -> None:
    async with FakeApiServer(ssl_context=server_tls(pki, client_certs=True)) as api:
        assert api.url.startswith("https://")
        user = {"client-certificate-data": b64(pki.client_cert), "client-key-data": b64(pki.client_key)}
        cluster = {"certificate-authority-data": b64(pki.ca)}
        path = write_kubeconfig(tmp_path / "config", api.url, user, cluster)
        store = await KubeStore.connect(StoreSettings(kind="kube", kubeconfig=path))
        assert await list_pods(store) == 0

        # the same server refuses a client without a certificate, and one that does not trust it
        no_cert = write_kubeconfig(tmp_path / "no-cert", api.url, {"token": "x"}, cluster)
        with pytest.raises(StoreError):
            await list_pods(await KubeStore.connect(StoreSettings(kind="kube", kubeconfig=no_cert)))
        untrusted = write_kubeconfig(tmp_path / "untrusted", api.url, user)
        with pytest.raises(StoreError):
            await list_pods(await KubeStore.connect(StoreSettings(kind="kube", kubeconfig=untrusted)))


async def test_in_cluster_service_account(tmp_path: Path, pki: Pki) -> None:
    async with FakeApiServer(token="sa-token", ssl_context=server_tls(pki, client_certs=False)) as api:
        sa = tmp_path / "serviceaccount"
        sa.mkdir()
        (sa / "token").write_text("sa-token")
        (sa / "ca.crt").write_bytes(pki.ca.read_bytes())
        port = api.url.rsplit(":", 1)[1]
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
        configuration = await load_configuration(None, environ=env, service_account_dir=sa)
        assert configuration.host == f"https://127.0.0.1:{port}"
        store = KubeStore(ApiClient(configuration), StoreSettings(kind="kube"))
        assert await list_pods(store) == 0
        assert api.requests[-1].headers["Authorization"] == "Bearer sa-token"


async def test_an_explicit_kubeconfig_wins_over_in_cluster(tmp_path: Path, token_api: FakeApiServer) -> None:
    path = write_kubeconfig(tmp_path / "config", token_api.url, {"token": "kubeconfig-token"})
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    configuration = await load_configuration(path, environ=env, service_account_dir=tmp_path / "absent")
    assert configuration.host == token_api.url


async def test_kubeconfig_environment_variable(tmp_path: Path, token_api: FakeApiServer) -> None:
    path = write_kubeconfig(tmp_path / "config", token_api.url, {"token": "kubeconfig-token"})
    env = {"KUBECONFIG": f"{tmp_path / 'missing'}:{path}"}
    configuration = await load_configuration(None, environ=env)
    assert configuration.host == token_api.url


async def test_no_usable_configuration_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no Kubernetes config"):
        await load_configuration(None, environ={"KUBECONFIG": str(tmp_path / "missing")})
    with pytest.raises(StoreError, match=r"StoreSettings\.kubeconfig"):
        await KubeStore.connect(StoreSettings(kind="kube", kubeconfig=tmp_path / "missing"))
    broken = tmp_path / "broken"
    broken.write_text("apiVersion: v1\nkind: Config\ncurrent-context: nowhere\n")
    with pytest.raises(StoreError, match="kubeconfig"):
        await load_configuration(broken, environ={})
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}
    with pytest.raises(StoreError, match="in-cluster"):
        await load_configuration(None, environ=env, service_account_dir=tmp_path / "absent")


@contextlib.asynccontextmanager
async def forward_proxy() -> AsyncIterator[tuple[str, list[str]]]:
    """An HTTP forward proxy on 127.0.0.1, as squid or tinyproxy behave for one client: it
    tunnels ``CONNECT host:port`` (RFC 9110 §9.3.6: ``200``, then bytes both ways, as for any
    HTTPS target) and relays an absolute-form request (``GET http://host:port/path``, RFC 9112
    §3.2.2) to its origin, one request per connection. Records each request line with its
    ``Proxy-Authorization`` (``-`` when none)."""
    seen: list[str] = []

    async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        finally:
            sink.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        method, target, version = head[0].split(" ", 2)
        fields = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in head[1:] if line)}
        seen.append(f"{method} {target} {fields.get('proxy-authorization', '-')}")
        if method == "CONNECT":
            host, port = target.rsplit(":", 1)
            upstream_reader, upstream_writer = await asyncio.open_connection(_resolve(host), int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:  # absolute-form: to the origin in origin-form, without the proxy's own fields
            url = urlsplit(target)
            assert url.hostname is not None and url.port is not None
            upstream_reader, upstream_writer = await asyncio.open_connection(_resolve(url.hostname), url.port)
            path = url.path + (f"?{url.query}" if url.query else "")
            kept = [
                line for line in head[1:] if line and not line.lower().startswith(("proxy-", "connection"))
            ]
            upstream_writer.write(
                "\r\n".join([f"{method} {path} {version}", *kept, "Connection: close", "", ""]).encode(
                    "latin-1"
                )
            )
            upstream_writer.write(await reader.readexactly(int(fields.get("content-length", "0"))))
        await asyncio.gather(
            pipe(reader, upstream_writer), pipe(upstream_reader, writer), return_exceptions=True
        )

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        server.close()


def clear_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


async def in_cluster_store(
    api: FakeApiServer, pki: Pki, tmp_path: Path, *, host: str = API_NAME
) -> KubeStore:
    """A store configured as in a pod, for ``api`` over TLS with a service-account token, the
    API server named ``host`` (``KUBERNETES_SERVICE_HOST``)."""
    sa = tmp_path / "serviceaccount"
    sa.mkdir(exist_ok=True)
    (sa / "token").write_text("sa-token")
    (sa / "ca.crt").write_bytes(pki.ca.read_bytes())
    env = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": api.url.rsplit(":", 1)[1]}
    configuration = await load_configuration(None, environ=env, service_account_dir=sa)
    return KubeStore(ApiClient(configuration), StoreSettings(kind="kube"))


@pytest.mark.usefixtures("cluster_dns")  # should the proxy be skipped, no real DNS query
async def test_https_proxy_from_the_environment_is_read_once(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``HTTPS_PROXY`` with credentials, set when the store is built, tunnels its requests
    (one ``CONNECT`` with ``Proxy-Authorization`` for the pooled connection), also after the
    variable is gone: read once per store, as client-go reads it once per process, not on
    every request."""
    clear_proxy_environment(monkeypatch)
    async with (
        FakeApiServer(token="sa-token", ssl_context=server_tls(pki, client_certs=False)) as api,
        forward_proxy() as (proxy, seen),
    ):
        monkeypatch.setenv("HTTPS_PROXY", proxy.replace("http://", "http://ops:s3cret@"))
        store = await in_cluster_store(api, pki, tmp_path)
        monkeypatch.delenv("HTTPS_PROXY")
        try:
            assert (await store.list(Kind.POD)).items == []
            assert (await store.list(Kind.POD)).items == []
        finally:
            await store.close()
    basic = "Basic " + base64.b64encode(b"ops:s3cret").decode()
    assert seen == [f"CONNECT {API_NAME}:{api.url.rsplit(':', 1)[1]} {basic}"]
    assert [r.headers["Authorization"] for r in api.requests] == ["Bearer sa-token"] * 2


@pytest.mark.usefixtures("cluster_dns")
async def test_no_proxy_naming_the_api_server_goes_direct(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``NO_PROXY`` read as client-go reads it (:mod:`flexlease.store.kube_proxy`): the lower-case
    variable only when the upper-case one is unset; a range that does not hold the API server
    does not bypass the proxy; a loopback API server is never proxied."""
    clear_proxy_environment(monkeypatch)
    async with (
        FakeApiServer(token="sa-token", ssl_context=server_tls(pki, client_certs=False)) as api,
        forward_proxy() as (proxy, seen),
    ):
        port = api.url.rsplit(":", 1)[1]
        monkeypatch.setenv("HTTPS_PROXY", proxy)
        monkeypatch.setenv("NO_PROXY", f"10.0.0.0/8,{API_NAME}")
        monkeypatch.setenv("no_proxy", "10.0.0.0/8")  # the upper-case one wins
        assert await list_pods(await in_cluster_store(api, pki, tmp_path)) == 0
        assert seen == []
        monkeypatch.delenv("NO_PROXY")
        assert await list_pods(await in_cluster_store(api, pki, tmp_path)) == 0  # now through it
        assert seen == [f"CONNECT {API_NAME}:{port} -"]
        assert await list_pods(await in_cluster_store(api, pki, tmp_path, host="127.0.0.1")) == 0
    assert seen == [f"CONNECT {API_NAME}:{port} -"]  # 127.0.0.1: direct, whatever NO_PROXY says


@pytest.mark.usefixtures("cluster_dns")  # should the proxy be skipped, no real DNS query
async def test_http_proxy_credentials_reach_the_proxy_for_a_plain_http_api_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plain-HTTP API server behind ``HTTP_PROXY`` with credentials: each request goes to the
    proxy in absolute form, carrying ``Proxy-Authorization``."""
    clear_proxy_environment(monkeypatch)
    async with FakeApiServer() as api, forward_proxy() as (proxy, seen):
        monkeypatch.setenv("HTTP_PROXY", proxy.replace("http://", "http://ops:s3cret@"))
        url = api.url.replace("127.0.0.1", API_NAME)
        store = KubeStore.for_host(url, StoreSettings(kind="kube"))
        monkeypatch.delenv("HTTP_PROXY")
        assert await list_pods(store) == 0
    basic = "Basic " + base64.b64encode(b"ops:s3cret").decode()
    assert seen == [f"GET {url}/api/v1/pods?limit=500 {basic}"]


@pytest.mark.usefixtures("cluster_dns")
async def test_a_kubeconfig_proxy_url_wins_over_the_environment(
    tmp_path: Path, token_api: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API server by name (127.0.0.1 would never be proxied, by either): the
    kubeconfig's ``proxy-url`` carries the request, the environment's proxy sees nothing."""
    clear_proxy_environment(monkeypatch)
    url = token_api.url.replace("127.0.0.1", API_NAME)
    async with forward_proxy() as (proxy, seen), forward_proxy() as (other, unused):
        monkeypatch.setenv("HTTP_PROXY", other)
        path = write_kubeconfig(tmp_path / "config", url, {"token": "kubeconfig-token"}, {"proxy-url": proxy})
        assert await list_pods(await KubeStore.connect(StoreSettings(kind="kube", kubeconfig=path))) == 0
    assert len(seen) == 1 and seen[0].startswith(f"GET {url}/api/v1/pods") and unused == []


def test_a_proxy_variable_that_does_not_parse_is_logged_and_not_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """client-go would try such a proxy and fail; here the store connects directly and says
    why, naming the proxy without its credentials."""
    clear_proxy_environment(monkeypatch)
    monkeypatch.setenv("HTTPS_PROXY", "http://ops:s3cret@proxy.xn--zz:3128")  # not a valid IDNA label
    with caplog.at_level(logging.WARNING, logger="flexlease.store.kube"):
        assert kube._env_proxy(URL(f"https://{API_NAME}:443")) is None
    (record,) = [r for r in caplog.records if r.name == "flexlease.store.kube"]
    assert "does not parse" in record.getMessage()
    assert record.__dict__["proxy"] == "proxy.xn--zz:3128" and "s3cret" not in str(record.__dict__)
