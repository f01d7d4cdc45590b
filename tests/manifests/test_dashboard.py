"""The Grafana dashboard (manifests/components/grafana): a real Prometheus (Debian's
``prometheus``) scrapes a running extender and two running node agents, and every panel's
PromQL query returns data once the dashboard's variables are substituted as Grafana does.

The processes are the demo's: ``python -m extender.main`` and ``python -m nodeagent.main``
(simulated NVML, each device plugin registered with a test kubelet) on one SQLite store, all
on 127.0.0.1. The test plays the operator and the online job so that every panel has
something to show: node gpu-0 in the general pool and gpu-1 in the standby pool, an XID 79
that takes gpu-0/3 off the bus and an application XID on gpu-0/2, a pod holding a standby
GPU, a Lend of two GPUs and a Reclaim of one of them (finished by an owner's pod on it),
scheduling calls and one malformed request to the extender.

Also checked without processes: the component puts the dashboard in a ConfigMap labelled
for Grafana's sidecar, and the dashboard's structure (rows, data-source variable, ids)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from flexlease.api import keys
from flexlease.api.resources import DeviceKey, LeaseAction, Pool
from flexlease.sim import objects
from flexlease.sim.extender_client import ExtenderClient
from flexlease.sim.extender_proc import free_port, running_extender
from flexlease.store.base import Kind
from flexlease.store.sqlite import SqliteStore
from standins.kubelet_devices import DeviceKubelet
from tests.manifests.render import MANIFESTS, NAMESPACE, OVERLAYS, find, render

COMPONENT = MANIFESTS / "components" / "grafana"
DASHBOARD: dict[str, Any] = json.loads((COMPONENT / "flexlease-dashboard.json").read_text())
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
MODEL = "NVIDIA H20"
NODES = {"gpu-0": Pool.GENERAL, "gpu-1": Pool.STANDBY}
OWNER_NAMESPACE = "ml"
OWNER = f"{OWNER_NAMESPACE}/online"
SCRAPE_SECONDS = 1
# Grafana's built-ins as a 5-minute view of this Prometheus would set them ($__rate_interval is
# at least 4 scrape intervals; 30 s keeps the whole scenario inside every rate window)
GRAFANA_BUILTINS = {"$__rate_interval": "30s", "$__interval": "1s", "$__range": "5m"}


# --------------------------------------------------------------------------- the dashboard


def panels() -> list[dict[str, Any]]:
    """Every panel that is not a row (rows may nest their panels when collapsed)."""
    out = []
    for p in DASHBOARD["panels"]:
        if p["type"] == "row":
            out.extend(p.get("panels", []))
        else:
            out.append(p)
    return out


def queries() -> Iterator[tuple[str, str]]:
    """(panel title / refId, PromQL) of every target."""
    for p in panels():
        for t in p["targets"]:
            yield f"{p['title']} / {t['refId']}", t["expr"]


def variables() -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in DASHBOARD["templating"]["list"]}


def test_the_component_puts_the_dashboard_in_a_configmap_for_grafanas_sidecar() -> None:
    cm = find(render(OVERLAYS["overlays/full"]), "ConfigMap", "flexlease-grafana-dashboard", NAMESPACE)
    assert cm["metadata"]["name"] == "flexlease-grafana-dashboard"  # no hash suffix: one copy only
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = cm["data"].values()
    assert json.loads(text) == DASHBOARD
    component = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"


def test_the_dashboard_is_well_formed() -> None:
    """Unique panel ids, every panel in a row, one Prometheus data-source variable that every
    panel and target uses, every variable used and every ``$variable`` defined."""
    ids = [p["id"] for p in DASHBOARD["panels"]] + [p["id"] for p in panels() if p not in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    assert DASHBOARD["panels"][0]["type"] == "row"
    assert variables()["datasource"]["type"] == "datasource"
    assert variables()["datasource"]["query"] == "prometheus"
    source = {"type": "prometheus", "uid": "${datasource}"}
    for p in panels():
        assert p["datasource"] == source, p["title"]
        assert p["targets"] and all(t["datasource"] == source for t in p["targets"]), p["title"]
        assert p.get("description"), f"{p['title']}: no description"
    text = json.dumps([expr for _, expr in queries()])
    used = set(re.findall(r"\$(\w+)", text)) - {b.removeprefix("$") for b in GRAFANA_BUILTINS}
    query_variables = {n for n, v in variables().items() if v["type"] == "query"}
    assert used == query_variables
    for name in query_variables:
        assert variables()[name]["datasource"] == source
    assert all(" or vector(" not in expr for _, expr in queries()), "a query that can never be empty"


# --------------------------------------------------------------------------- the processes


def node_config(name: str) -> dict[str, Any]:
    """Four simulated H20s; on gpu-0, an application XID (13: stays healthy) and XID 79 with
    the GPU falling off the bus, a second after start."""
    events: list[dict[str, Any]] = []
    if name == "gpu-0":
        events = [
            {"at": 1, "gpu": 2, "event": "xid", "xid": 13},
            {"at": 1, "gpu": 3, "event": "xid", "xid": 79},
            {"at": 1, "gpu": 3, "event": "lost"},
        ]
    return {"name": name, "gpus": {"count": 4, "model": MODEL, "memoryMiB": 97871}, "events": events}


@dataclass(frozen=True, slots=True)
class Agent:
    node: str
    port: int
    process: asyncio.subprocess.Process


@contextlib.asynccontextmanager
async def running_agents(db: Path, work: Path, sockets: Path) -> AsyncIterator[list[Agent]]:
    """One ``python -m nodeagent.main`` per node of :data:`NODES`, as hack/demo.py starts them,
    each registered with its own test kubelet."""
    agents: list[Agent] = []
    async with contextlib.AsyncExitStack() as stack:
        for name in NODES:
            kubelet = DeviceKubelet(sockets / name / "dp", sockets / name / "pr" / "kubelet.sock")
            await stack.enter_async_context(kubelet)
            config = work / f"{name}.yaml"
            config.write_text(yaml.safe_dump(node_config(name)))
            env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXLEASE_")}
            env.update(
                FLEXLEASE_LOG_FORMAT="json",
                FLEXLEASE_STORE__SQLITE_POLL_SECONDS="0.01",
                FLEXLEASE_AGENT__NODE_IP="127.0.0.1",
                FLEXLEASE_AGENT__CRI_ENDPOINT=f"unix://{sockets / 'no-containerd.sock'}",
                FLEXLEASE_AGENT__CHECKPOINT_DIR=str(work / name / "checkpoints"),
                FLEXLEASE_AGENT__DEVICE_PLUGIN_DIR=str(kubelet.plugin_dir),
                FLEXLEASE_AGENT__POD_RESOURCES_SOCKET=str(kubelet.pod_resources_socket),
                FLEXLEASE_AGENT__DEVICE_PLUGIN_POLL_SECONDS="0.2",
                PYTHONUNBUFFERED="1",
            )
            port = free_port()
            with (work / f"{name}.log").open("wb") as log:
                process = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "nodeagent.main", "--nvml=simulated", f"--node-config={config}",
                    f"--node-name={name}", "--store=sqlite", f"--sqlite-path={db}",
                    f"--state-dir={work / name}", "--metrics-host=127.0.0.1", f"--metrics-port={port}",
                    stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                )  # fmt: skip
            agents.append(Agent(name, port, process))
            stack.push_async_callback(_stop, process)
        yield agents


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 15)
        except TimeoutError:
            process.kill()
            await process.wait()


@contextlib.asynccontextmanager
async def running_prometheus(work: Path, targets: dict[str, list[str]]) -> AsyncIterator[str]:
    """Debian's Prometheus on 127.0.0.1 scraping ``targets`` (job → host:port) every second;
    yields its URL once ready."""
    config = {
        "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": f"{SCRAPE_SECONDS}s"},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": t}]} for job, t in targets.items()
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (work / "prometheus.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            PROMETHEUS, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
            stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
        )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as http:
            await until(lambda: _ok(http, f"{url}/-/ready"), "Prometheus ready", work / "prometheus.log")
        yield url
    finally:
        await _stop(process)


async def _ok(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url) as resp:
            return resp.status == 200
    except aiohttp.ClientError:
        return False


async def until(probe: Any, what: str, log: Path | None = None, *, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not await probe():
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise AssertionError(f"timed out waiting for {what}\n{tail}")
        await asyncio.sleep(0.2)


class Prometheus:
    """The HTTP API: ``/api/v1/query`` and label values."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self._http, self._url = http, url

    async def query(self, expr: str) -> list[dict[str, Any]]:
        async with self._http.get(f"{self._url}/api/v1/query", params={"query": expr}) as resp:
            body = await resp.json()
        assert body["status"] == "success", f"{expr}: {body}"
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    async def label_values(self, metric: str, label: str) -> list[str]:
        params = {"match[]": metric}
        async with self._http.get(f"{self._url}/api/v1/label/{label}/values", params=params) as resp:
            body = await resp.json()
        assert body["status"] == "success", body
        values: list[str] = body["data"]
        return values


def substitute(expr: str, values: dict[str, list[str]]) -> str:
    """Grafana's interpolation of a multi-value variable inside a regex matcher: one value
    as itself, several as ``(a|b)``, All as the variable's ``allValue``; then the built-ins."""
    for name, chosen in values.items():
        text = chosen[0] if len(chosen) == 1 else "(" + "|".join(re.escape(v) for v in chosen) + ")"
        expr = expr.replace(f"${name}", text)
    for builtin, value in GRAFANA_BUILTINS.items():
        expr = expr.replace(builtin, value)
    return expr


# --------------------------------------------------------------------------- the scenario


def held(name: str, node: str, index: int, *, namespace: str, owner: str, priority: str) -> dict[str, Any]:
    """A running pod holding ``node``/``index``, as the extender's bind leaves it."""
    pod = objects.pod(name, namespace, gpus=1, priority=priority, owner=owner)
    pod["metadata"]["annotations"] |= {
        keys.ANN_ASSIGNED_GPUS: f"{node}:{index}",
        keys.ANN_ASSIGNED_UUIDS: objects.gpu_uuid(node, index),
    }
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    return pod


async def lease_phase(store: SqliteStore, name: str) -> str:
    obj = await store.get(Kind.GPULEASE, name, namespace=OWNER_NAMESPACE)
    return str((obj.get("status") or {}).get("phase", ""))


async def devices_reported(store: SqliteStore) -> bool:
    """Both agents reported every GPU with a tier, and gpu-0/3 is down."""
    for name in NODES:
        devices = ((await store.get(Kind.GPUNODE, name)).get("status") or {}).get("devices") or {}
        if len(devices) != 4 or not all(d.get("tier") for d in devices.values()):
            return False
    gpu0 = (await store.get(Kind.GPUNODE, "gpu-0"))["status"]["devices"]
    return bool(gpu0["3"]["health"] == "Unhealthy")


async def drive(store: SqliteStore, client: ExtenderClient, extender_url: str) -> None:
    """What an operator, kube-scheduler and the online job do while Prometheus scrapes."""
    await until(lambda: devices_reported(store), "both agents' GPU status", limit_s=60)
    # a pod on a standby GPU (a supplement), and a low-priority pod on gpu-0/2
    await store.create(
        Kind.POD, held("replacement", "gpu-1", 0, namespace="ml", owner="online", priority="high")
    )
    await store.create(Kind.POD, held("lp-a", "gpu-0", 2, namespace="batch", owner="etl", priority="low"))
    lend = [DeviceKey("gpu-0", 0), DeviceKey("gpu-0", 1)]
    # the online job lends two GPUs, then reclaims one; its pod comes back on the GPU named
    await store.create(Kind.GPULEASE, objects.gpulease("lend", OWNER, action=LeaseAction.LEND, devices=lend))
    await until(lambda: _phase_is(store, "lend", "Done"), "the Lend to finish", limit_s=30)
    await store.create(Kind.GPULEASE, objects.gpulease("reclaim", OWNER, action=LeaseAction.RECLAIM, count=1))
    await until(lambda: _reclaiming(store), "the Reclaim to pick its GPU", limit_s=30)
    (target,) = (await store.get(Kind.GPULEASE, "reclaim", namespace=OWNER_NAMESPACE))["status"]["lent"]
    await store.create(
        Kind.POD,
        held("online-0", target["node"], target["index"], namespace="ml", owner="online", priority="high"),
    )
    await until(lambda: _phase_is(store, "reclaim", "Done"), "the Reclaim to finish", limit_s=30)
    # kube-scheduler's calls, and one request that is not JSON
    pod = objects.pod("lp-b", "batch", gpus=1, priority="low", owner="etl")
    await store.create(Kind.POD, pod)
    for _ in range(5):
        await client.filter(pod, list(NODES))
        await client.prioritize(pod, list(NODES))
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{extender_url}/filter", data=b"{not json") as resp,
    ):
        assert resp.status == 400


async def _phase_is(store: SqliteStore, name: str, phase: str) -> bool:
    return await lease_phase(store, name) == phase


async def _reclaiming(store: SqliteStore) -> bool:
    return bool(
        ((await store.get(Kind.GPULEASE, "reclaim", namespace=OWNER_NAMESPACE)).get("status") or {}).get(
            "lent"
        )
    )


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """Unix socket paths are limited to 107 bytes: the kubelets' sockets live under /tmp."""
    path = Path(tempfile.mkdtemp(prefix="flexlease-dash-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_every_panel_query_returns_data_from_a_real_prometheus(tmp_path: Path, short_tmp: Path) -> None:
    db = tmp_path / "state.db"
    store = SqliteStore(db, poll_seconds=0.01)
    await store.open()
    try:
        for name, pool in NODES.items():  # operators set the pool; agents fill the status
            await store.create(Kind.GPUNODE, objects.gpunode(name, pool=pool))
        async with (
            running_extender(db, tmp_path / "extender.log", speedup=1.0) as extender,
            ExtenderClient(extender.url) as client,
            running_agents(db, tmp_path, short_tmp) as agents,
            running_prometheus(
                tmp_path,
                {
                    "flexlease-extender": [extender.url.removeprefix("http://")],
                    "flexlease-agent": [f"127.0.0.1:{a.port}" for a in agents],
                },
            ) as url,
            aiohttp.ClientSession() as http,
        ):
            prom = Prometheus(http, url)
            # Prometheus hands its first targets to the scrapers a few seconds after start:
            # everything happens while it scrapes, then a few more scrapes see the end state
            await until(
                lambda: _all_up(prom, 1 + len(agents)), "every target up", tmp_path / "prometheus.log"
            )
            await drive(store, client, extender.url)
            await asyncio.sleep(3 * SCRAPE_SECONDS)
            await check_panels(prom)
    finally:
        await store.close()


async def _all_up(prom: Prometheus, n: int) -> bool:
    up = await prom.query("up == 1")
    return len(up) == n


async def check_panels(prom: Prometheus) -> None:
    """Each variable's own query lists values; each panel query returns data with every
    variable at All and at its first value alone (the selections an operator starts from)."""
    chosen: dict[str, list[str]] = {}
    for name, var in variables().items():
        if var["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((\w+), (\w+)\)", var["query"]["query"])
        assert match, f"${name}: not label_values(metric, label)"
        metric, label = match.groups()
        values = await prom.label_values(metric, label)
        assert values, f"${name}: {var['query']['query']} lists nothing"
        chosen[name] = values
    assert sorted(chosen["pool"]) == ["general", "standby"] and chosen["node"] == sorted(NODES)
    empty: list[str] = []
    for selection in ({n: [".*"] for n in chosen}, {n: v[:1] for n, v in chosen.items()}):
        for where, expr in queries():
            promql = substitute(expr, selection)
            result = await prom.query(promql)
            # a number, not only NaN (a quantile of nothing observed): what the panel would draw
            if not any(math.isfinite(float(r["value"][1])) for r in result):
                empty.append(f"{where} with {selection}: {promql} -> {result}")
    assert empty == [], "panels without data:\n" + "\n".join(empty)
