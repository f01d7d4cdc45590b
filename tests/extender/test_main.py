"""The extender process (extender.main): real TCP listeners, HTTPS, config, SIGTERM."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from extender import main as extmain
from flexlease.api import keys
from flexlease.config import ExtenderSettings, LeaseSettings, Settings, StoreSettings
from flexlease.store.base import Kind
from flexlease.store.leader import ElectionConfig, LeaderElector
from flexlease.store.memory import MemoryStore
from flexlease.store.sqlite import SqliteStore
from tests.extender import payloads
from tests.extender.conftest import add_node, add_pod


@asynccontextmanager
async def serving(
    settings: Settings, store: MemoryStore, *, elector: LeaderElector | None = None
) -> AsyncIterator[str]:
    """Run :func:`extender.main.serve` (the production runner) and yield its URL; with
    ``elector``, as one leader-elected replica (the elector runs in the app)."""
    stop = asyncio.Event()
    urls: list[str] = []
    listening = asyncio.Event()

    def on_listening(u: list[str]) -> None:
        urls.extend(u)
        listening.set()

    task = asyncio.create_task(
        extmain.serve(
            settings,
            store,
            stop=stop,
            on_listening=on_listening,
            extra_contexts=[extmain.election_ctx(elector)] if elector else (),
            leader=extmain.leader_check(elector) if elector else None,
        ),
        name="test-serve",
    )
    try:
        await asyncio.wait_for(listening.wait(), 5)
        yield urls[0]
    finally:
        stop.set()
        await task


async def wait_ready(session: aiohttp.ClientSession, url: str, **kw: Any) -> None:
    for _ in range(200):
        async with session.get(f"{url}/readyz", **kw) as resp:
            if resp.status == 200:
                return
        await asyncio.sleep(0.01)
    raise AssertionError("extender never became ready")


def make_settings(**extender: Any) -> Settings:
    """Memory store, a free port; plain HTTP (explicitly) unless a certificate is given."""
    extender.setdefault("insecure_http", "tls_cert_file" not in extender)
    return Settings(store=StoreSettings(kind="memory"), extender=ExtenderSettings(port=0, **extender))


async def test_serves_over_tcp_and_bind_commits_when_the_scheduler_hangs_up() -> None:
    store = MemoryStore()
    await add_node(store, payloads.gpunode("n1", gpus=2))
    pod = await add_pod(store, payloads.pod("p", gpus=1))
    real_bind = store.bind

    async def slow_bind(namespace: str, name: str, *, uid: str | None, node: str, **kw: Any) -> None:
        await asyncio.sleep(0.3)
        await real_bind(namespace, name, uid=uid, node=node, **kw)

    store.bind = slow_bind  # type: ignore[method-assign]
    try:
        async with serving(make_settings(), store) as url, aiohttp.ClientSession() as session:
            assert url.startswith("http://127.0.0.1:")
            await wait_ready(session, url)
            async with session.post(
                f"{url}/filter", json=payloads.extender_args(payloads.pod("q", gpus=2), ["n1", "n2"])
            ) as resp:
                reply = await resp.json()
            assert reply["NodeNames"] == ["n1"]
            with pytest.raises(asyncio.TimeoutError):
                await session.post(
                    f"{url}/bind",
                    json=payloads.binding_args(pod, "n1"),
                    timeout=aiohttp.ClientTimeout(total=0.05),
                )
            for _ in range(100):  # the handler is not cancelled: the bind completes
                stored = await store.get(Kind.POD, "p", namespace="ml")
                if stored["spec"].get("nodeName"):
                    break
                await asyncio.sleep(0.02)
            assert stored["spec"]["nodeName"] == "n1"
            assert stored["metadata"]["annotations"][keys.ANN_ASSIGNED_GPUS] == "n1:0"
    finally:
        await store.close()


@pytest.mark.parametrize("access_log", [False, True])
async def test_the_verbs_are_access_logged_only_when_asked(
    access_log: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Off by default: three lines per scheduling cycle would be the process's largest log."""
    store = MemoryStore()
    await add_node(store, payloads.gpunode("n1", gpus=2))
    settings = make_settings(access_log=access_log) if access_log else make_settings()
    try:
        # at INFO before the first connection: aiohttp decides per connection whether to log
        with caplog.at_level(logging.INFO, logger="aiohttp.access"):
            async with serving(settings, store) as url, aiohttp.ClientSession() as session:
                await wait_ready(session, url)
                for _ in range(3):
                    async with session.post(
                        f"{url}/filter", json=payloads.extender_args(payloads.pod("q", gpus=1), ["n1"])
                    ) as resp:
                        assert (await resp.json())["NodeNames"] == ["n1"]
    finally:
        await store.close()
    logged = [r for r in caplog.records if r.name == "aiohttp.access" and "/filter" in r.getMessage()]
    assert len(logged) == (3 if access_log else 0)


def make_cert(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=flexlease-extender", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


async def test_https_when_tls_files_are_set(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    store = MemoryStore()
    await add_node(store, payloads.gpunode("n1"))
    client_ctx = ssl.create_default_context(cafile=str(cert))
    try:
        settings = make_settings(tls_cert_file=cert, tls_key_file=key)
        async with serving(settings, store) as url, aiohttp.ClientSession() as session:
            assert url.startswith("https://")
            await wait_ready(session, url, ssl=client_ctx)
            async with session.post(
                f"{url}/filter", json=payloads.extender_args(payloads.pod("p"), ["n1"]), ssl=client_ctx
            ) as resp:
                assert (await resp.json())["NodeNames"] == ["n1"]
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await session.get(f"{url}/healthz")  # default trust store: not our CA
            with pytest.raises(aiohttp.ClientError):
                await session.get(url.replace("https", "http") + "/healthz")
    finally:
        await store.close()


def test_bad_configuration_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("extender:\n  port: -1\n")
    assert extmain.main(["--config", str(config)]) == 2
    assert "bad configuration" in capsys.readouterr().err


async def test_process_serves_sqlite_store_and_stops_on_sigterm(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    seed = SqliteStore(db)
    await seed.open()
    await add_node(seed, payloads.gpunode("n1", gpus=4))
    await seed.close()
    config = tmp_path / "extender.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "log_format": "json",
                "store": {"kind": "sqlite", "sqlite_path": str(db)},
                "extender": {"host": "127.0.0.1", "port": 0, "insecure_http": True},
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXLEASE_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "extender.main", "--config", str(config),
        stderr=asyncio.subprocess.PIPE, env=env, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        url = None
        lines: list[str] = []
        while url is None:
            raw = await asyncio.wait_for(proc.stderr.readline(), 20)
            assert raw, f"extender exited: {lines}"
            lines.append(raw.decode())
            record = json.loads(raw)
            if record["msg"] == "extender listening":
                url = record["urls"][0]
        async with aiohttp.ClientSession() as session:
            await wait_ready(session, url)
            async with session.post(
                f"{url}/filter", json=payloads.extender_args(payloads.pod("p", gpus=4), ["n1"])
            ) as resp:
                assert (await resp.json())["NodeNames"] == ["n1"]
        proc.send_signal(signal.SIGTERM)
        rest = await asyncio.wait_for(proc.stderr.read(), 20)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
        assert b"extender stopping" in rest
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_process_runs_the_lease_controller_on_an_accelerated_clock(tmp_path: Path) -> None:
    """The extender process runs the lease controller; with ``clock_speedup`` a 30 s grace
    period passes in milliseconds and the LP pod on the reclaimed GPU is evicted."""
    db = tmp_path / "state.db"
    seed = SqliteStore(db)
    await seed.open()
    await add_node(seed, payloads.gpunode("n1", gpus=2, owners={0: "ml/ranker"}))
    lp = payloads.pod(
        "lp-0", priority="low", node_name="n1", phase="Running", annotations=payloads.assigned("n1", 0)
    )
    await add_pod(seed, lp)
    await seed.create(
        Kind.GPULEASE,
        {
            "apiVersion": keys.API_VERSION,
            "kind": keys.GPULEASE_KIND,
            "metadata": {"name": "peak", "namespace": "ml"},
            "spec": {
                "owner": "ml/ranker",
                "action": "Reclaim",
                "devices": [{"node": "n1", "index": 0}],
                "gracePeriodSeconds": 30,
            },
        },
    )
    await seed.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXLEASE_")}
    env.update(
        FLEXLEASE_STORE__KIND="sqlite",
        FLEXLEASE_STORE__SQLITE_PATH=str(db),
        FLEXLEASE_EXTENDER__PORT="0",
        FLEXLEASE_EXTENDER__INSECURE_HTTP="true",
        FLEXLEASE_CLOCK_SPEEDUP="1000",
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "extender.main", stderr=asyncio.subprocess.DEVNULL, env=env,
        cwd=Path(__file__).parents[2],
    )  # fmt: skip
    store = SqliteStore(db)
    await store.open()
    try:
        lease: dict[str, Any] = {}
        terminating: list[str] = []
        for _ in range(300):  # 15 s real time at most; the grace period is 30 ms of it
            lease = await store.get(Kind.GPULEASE, "peak", namespace="ml")
            pods = (await store.list(Kind.POD, namespace="ml")).items
            terminating = [p["metadata"]["name"] for p in pods if p["metadata"].get("deletionTimestamp")]
            if terminating:
                break
            await asyncio.sleep(0.05)
        assert terminating == ["lp-0"], lease.get("status")  # evicted: Terminating until its kubelet confirms
        assert "ml/lp-0" in lease["status"]["preemptedPods"]
    finally:
        await store.close()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0


async def test_two_replicas_serve_filter_but_only_the_leader_binds() -> None:
    store = MemoryStore()
    await add_node(store, payloads.gpunode("n1", gpus=2))
    pod = await add_pod(store, payloads.pod("p", gpus=1))
    lease = LeaseSettings(leader_election=True, leader_lease_seconds=3)
    settings = make_settings().model_copy(update={"lease": lease})
    electors = {
        name: LeaderElector(store, ElectionConfig.from_settings(lease, identity=name)) for name in ("a", "b")
    }
    try:
        async with (
            serving(settings, store, elector=electors["a"]) as url_a,
            serving(settings, store, elector=electors["b"]) as url_b,
            aiohttp.ClientSession() as session,
        ):
            for _ in range(200):
                if any(e.is_leader for e in electors.values()):
                    break
                await asyncio.sleep(0.02)
            leader = "a" if electors["a"].is_leader else "b"
            urls = {"a": url_a, "b": url_b}
            follower = "b" if leader == "a" else "a"
            for url in urls.values():
                await wait_ready(session, url)
                async with session.post(f"{url}/filter", json=payloads.extender_args(pod, ["n1"])) as resp:
                    assert (await resp.json())["NodeNames"] == ["n1"]
            async with session.post(f"{urls[follower]}/bind", json=payloads.binding_args(pod, "n1")) as resp:
                error = (await resp.json())["Error"]
            assert f"not the leader (leader: {leader})" in error
            assert not (await store.get(Kind.POD, "p", namespace="ml"))["spec"].get("nodeName")
            async with session.post(f"{urls[leader]}/bind", json=payloads.binding_args(pod, "n1")) as resp:
                assert (await resp.json())["Error"] == ""
            assert (await store.get(Kind.POD, "p", namespace="ml"))["spec"]["nodeName"] == "n1"
    finally:
        await store.close()


def test_a_clock_pinned_to_an_origin_is_known_to_other_processes() -> None:
    """``clock_origin``: the accelerated clock reads origin + (now - origin) × speedup, whenever
    the process started (the demo writes its policy's windows on that clock)."""
    origin = time.time() - 10.0
    clock = extmain.scaled_clock(Settings(clock_speedup=100.0, clock_origin=origin))
    expected = origin + (time.time() - origin) * 100.0
    assert abs(clock.now() - expected) < 100.0 * 0.5  # half a real second of slack
    free = extmain.scaled_clock(Settings(clock_speedup=100.0))
    assert abs(free.now() - time.time()) < 100.0 * 0.5
