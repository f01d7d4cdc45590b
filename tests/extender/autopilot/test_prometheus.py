"""The prometheus demand source against a REAL Prometheus server (Debian's ``prometheus``,
started on 127.0.0.1 with a temporary config) scraping metrics this test serves with
prometheus-client: the client's answers and errors, and the controller's mapping
``ceil(value / perGPU)`` and reactive fallback end to end."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from prometheus_client.exposition import ThreadingWSGIServer

from extender.autopilot.controller import AutopilotController
from extender.autopilot.prometheus import PrometheusSource
from flexlease.api import keys
from flexlease.api.policy import DecisionAction, GPULeasePolicy
from flexlease.clock import ManualClock
from flexlease.config import AutopilotSettings, Settings
from flexlease.errors import MetricsError
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore
from tests.extender.autopilot.test_controller import (
    NS,
    START,
    create_with_status,
    eventually,
    gpunode,
    job_pod,
    leases,
)

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
"""Debian's prometheus, installed by hack/test.sh (hack/lib/deps.sh): missing, these tests fail."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Exporter:
    """The job's metrics, served over HTTP for Prometheus to scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.rate = Gauge("ranker_requests_per_second", "Input rate of the ranker.", registry=self.registry)
        self.lag = Gauge("ranker_consumer_lag", "Consumer lag.", ["partition"], registry=self.registry)
        self.port = _free_port()
        self.server: ThreadingWSGIServer | None = None

    def __enter__(self) -> Exporter:
        self.server, _thread = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def exporter() -> Iterator[Exporter]:
    with Exporter() as exp:
        exp.rate.set(1000)
        exp.lag.labels(partition="0").set(10)
        exp.lag.labels(partition="1").set(20)
        yield exp


@pytest.fixture(scope="module")
def prometheus(exporter: Exporter, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prometheus scraping ``exporter`` every second; its URL once it has a sample."""
    root: Path = tmp_path_factory.mktemp("prometheus")
    (root / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: ranker\n    static_configs: [{{targets: ['127.0.0.1:{exporter.port}']}}]\n"
    )
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = (root / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                query = f"{url}/api/v1/query?query=ranker_requests_per_second"
                with urllib.request.urlopen(query, timeout=2) as reply:
                    if b'"value"' in reply.read():
                        break
            if time.monotonic() > deadline or proc.poll() is not None:
                log.flush()
                pytest.fail(f"Prometheus did not come up: {(root / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


async def eventually_value(source: PrometheusSource, query: str, want: float) -> None:
    """Prometheus sees a new value at its next scrape (1 s)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + 15
    while (value := await source.instant(query)) != want:
        if loop.time() > end:
            pytest.fail(f"{query} stayed {value}, wanted {want}")
        await asyncio.sleep(0.2)


@pytest.fixture
def source(prometheus: str) -> Iterator[PrometheusSource]:
    s = PrometheusSource(prometheus, timeout_seconds=5)
    yield s
    s.close()


async def test_instant_and_range_readings(source: PrometheusSource, exporter: Exporter) -> None:
    exporter.rate.set(1234.5)
    await eventually_value(source, "ranker_requests_per_second", 1234.5)
    assert await source.instant("sum(ranker_consumer_lag)") == 30  # an aggregation: one series
    assert await source.instant("scalar(ranker_requests_per_second) * 2") == 2469  # a scalar
    await asyncio.sleep(2.5)
    samples = await source.series("ranker_requests_per_second", seconds=10, step=1)
    assert samples and all(abs(t - time.time()) < 15 for t, _ in samples)
    assert samples[-1][1] == 1234.5
    assert [t for t, _ in samples] == sorted(t for t, _ in samples)


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ("ranker_consumer_lag", "returned 2 series, need one"),
        ("no_such_metric", "returned no series"),
        ("sum(rate(", "refused query"),
        ("ranker_requests_per_second / 0", "not a finite number"),
    ],
)
async def test_answers_that_are_not_one_finite_sample_are_errors(
    source: PrometheusSource, query: str, error: str
) -> None:
    with pytest.raises(MetricsError, match=error.replace("(", r"\(")):
        await source.instant(query)


async def test_an_unreachable_server_is_an_error() -> None:
    source = PrometheusSource(f"http://127.0.0.1:{_free_port()}", timeout_seconds=2)
    try:
        with pytest.raises(MetricsError, match="unreachable"):
            await source.instant("up")
    finally:
        source.close()


@contextlib.asynccontextmanager
async def autopilot(prometheus: str, spec: dict[str, Any]) -> AsyncIterator[MemoryStore]:
    store = MemoryStore()
    for node in ("gpu-0", "gpu-1"):
        await create_with_status(store, Kind.GPUNODE, gpunode(node, count=4))
    for i in range(8):
        await create_with_status(store, Kind.POD, job_pod(i))
    body = {
        "owner": "online/rec",
        "minGPUs": 1,
        "maxGPUs": 8,
        "leadTime": 0,
        "stabilization": {"tauSeconds": 0},
    }
    await store.create(
        Kind.GPULEASEPOLICY,
        {
            "apiVersion": keys.API_VERSION,
            "kind": keys.GPULEASEPOLICY_KIND,
            "metadata": {"name": "rec", "namespace": NS},
            "spec": {**body, **spec},
        },
    )
    settings = Settings(autopilot=AutopilotSettings(prometheus_url=prometheus, resync_seconds=600))
    controller = AutopilotController(
        settings, store, registry=CollectorRegistry(), clock=ManualClock(START), instance="test"
    )
    task = asyncio.create_task(controller.run(), name="autopilot-under-test")
    try:
        yield store
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await store.close()


async def policy(store: MemoryStore) -> GPULeasePolicy:
    return GPULeasePolicy.model_validate(await store.get(Kind.GPULEASEPOLICY, "rec", namespace=NS))


async def test_the_controller_maps_a_reading_to_gpus_and_lends_the_rest(
    prometheus: str, exporter: Exporter, source: PrometheusSource
) -> None:
    """1000 requests/s at 300 per GPU: ceil(3.33) = 4 GPUs of the 8 the job holds → Lend 4."""
    exporter.rate.set(1000)
    await eventually_value(source, "ranker_requests_per_second", 1000)
    spec = {"demand": {"prometheus": {"query": "ranker_requests_per_second", "perGPU": 300}}}
    async with autopilot(prometheus, spec) as store:

        async def lent() -> bool:
            d = (await policy(store)).status.last_decision
            return d is not None and d.action is DecisionAction.LEND

        await eventually(lent, within=20)
        status = (await policy(store)).status
        assert status.demand is not None
        assert (status.demand.gpus, status.demand.value, status.demand.source) == (4, 1000, "prometheus")
        assert status.last_decision is not None and status.last_decision.count == 4
        assert [lease["spec"]["count"] for lease in (await leases(store)).values()] == [4]


async def test_a_failing_query_hands_over_to_the_reactive_fallback(
    prometheus: str, exporter: Exporter
) -> None:
    """The demand query names no series; the fallback's lag (30 > 25) adds a step of 2 GPUs to
    the 8 the job holds (capped at maxGPUs = 8 by the plan: nothing lent, so a hold)."""
    spec = {
        "maxGPUs": 8,
        "demand": {
            "prometheus": {
                "query": "ranker_requests_gone",
                "perGPU": 300,
                "fallback": {"query": "sum(ranker_consumer_lag)", "scaleUpAbove": 25, "stepGPUs": 2},
            }
        },
    }
    async with autopilot(prometheus, spec) as store:

        async def fell_back() -> bool:
            demand = (await policy(store)).status.demand
            return demand is not None and demand.source == "fallback"

        await eventually(fell_back, within=20)
        status = (await policy(store)).status
        assert status.demand is not None and status.demand.gpus == 10
        assert "returned no series" in status.demand.message and "step up" in status.demand.message
        assert status.plan is not None and status.plan.target_gpus == 8  # clamped to maxGPUs
        events = [e["reason"] for e in (await store.list(Kind.EVENT, namespace=NS)).items]
        assert "DemandFallback" in events
