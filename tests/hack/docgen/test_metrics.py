"""hack/docgen/metrics.py: the metrics read from the source include everything the real registries
of the extender and the node agent expose, with the same types and labels."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from extender.lease.metrics import LeaseMetrics
from extender.orchestrator.relaunch import OrchestrationMetrics
from extender.rollout.controller import RolloutMetrics
from extender.server import create_app
from flexlease.clock import ManualClock
from flexlease.config import Settings
from flexlease.store.memory import MemoryStore
from hack.docgen import metrics
from nodeagent.cache.component import NodeRuntime
from nodeagent.deviceplugin.metrics import DevicePluginMetrics
from nodeagent.health.backend import DeviceSample
from nodeagent.hotrestart.controller import HotRestartMetrics
from nodeagent.staging import StagingMetrics
from tests.nodeagent.health.kit import START, make_context, make_settings, node_config

ROOT = Path(__file__).resolve().parents[3]


def _exposed(families: Iterable[Metric]) -> dict[str, tuple[str, set[str]]]:
    """flexlease_ families as exposed: name → (type, label names seen in samples)."""
    out: dict[str, tuple[str, set[str]]] = {}
    for f in families:
        if not f.name.startswith("flexlease_"):
            continue
        name = f.name + "_total" if f.type == "counter" else f.name
        labels = {label for s in f.samples for label in s.labels} - {"le"}
        out[name] = (f.type, labels)
    return out


def _documented(deployable: str) -> dict[str, metrics.MetricDoc]:
    return {m.name: m for m in metrics.collect(ROOT) if m.deployable == deployable}


def _agree(exposed: dict[str, tuple[str, set[str]]], documented: dict[str, metrics.MetricDoc]) -> None:
    """Everything the real registry exposes is documented, with its type and labels. (Not the
    reverse: a metric of a component this test does not build is documented all the same.)"""
    assert exposed and set(exposed) <= set(documented), set(exposed) - set(documented)
    for name, (kind, labels) in exposed.items():
        assert kind == documented[name].type, name
        assert labels <= set(documented[name].labels), (name, labels)


async def test_every_metric_the_extender_exposes_is_documented() -> None:
    registry = CollectorRegistry()
    create_app(Settings(), MemoryStore(), registry=registry)
    LeaseMetrics(registry)
    RolloutMetrics(registry)
    OrchestrationMetrics(registry)
    _agree(_exposed(registry.collect()), _documented("extender"))


async def test_every_metric_the_agent_exposes_is_documented(tmp_path: Path) -> None:
    clock = ManualClock(START)
    settings = make_settings(tmp_path)
    ctx, backend = await make_context(settings, MemoryStore(), clock, node_config(count=1))
    ctx.board.set_devices(await backend.start(), clock.now())
    ctx.board.apply_sample(DeviceSample(index=0, at=clock.now(), temperature_c=40))
    ctx.board.retier(clock.now())
    ctx.metrics.xid(gpu=0, uuid=ctx.board.devices[0].uuid, model="NVIDIA H20", xid=79)
    DevicePluginMetrics(ctx.registry, ctx.node)
    StagingMetrics(ctx.registry, node=ctx.node)
    HotRestartMetrics(ctx.registry)
    NodeRuntime(settings.agent, ctx.registry)  # image and checkpoint metrics, flexlease_cri_up
    _agree(_exposed(ctx.registry.collect()), _documented("nodeagent"))


SOURCE = """
from collections import Counter as Tally
from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
import prometheus_client as pc

PREFIX = "flexlease_x_"
LABELS = ("node", "gpu")

def build(registry):
    Tally("not a metric")
    Counter(PREFIX + "things_total", "Things.", [*LABELS, "kind"], registry=registry)
    Histogram(name="flexlease_x_seconds", documentation="Time.", registry=registry)
    GaugeMetricFamily("flexlease_x_level", "Level.", labels=["node"])
    pc.Gauge("flexlease_x_up", "Up.")
"""


def test_names_help_and_labels_are_resolved_from_module_constants() -> None:
    found = {m.name: m for m in metrics.scan(SOURCE, "extender.x")}
    assert set(found) == {
        "flexlease_x_things_total",
        "flexlease_x_seconds",
        "flexlease_x_level",
        "flexlease_x_up",
    }
    assert found["flexlease_x_things_total"].labels == ("node", "gpu", "kind")
    assert found["flexlease_x_things_total"].type == "counter"
    assert found["flexlease_x_seconds"].help == "Time."
    assert found["flexlease_x_level"].labels == ("node",)
    assert found["flexlease_x_up"].type == "gauge"


def test_a_metric_that_cannot_be_read_stops_the_generator() -> None:
    source = "from prometheus_client import Gauge\ndef f(name):\n    Gauge(name, 'Help.')\n"
    with pytest.raises(metrics.Unresolved, match=r"extender\.y:3: Gauge name"):
        metrics.scan(source, "extender.y")


def test_one_name_defined_twice_differently_is_refused(tmp_path: Path) -> None:
    package = tmp_path / "extender"
    package.mkdir()
    (package / "a.py").write_text("from prometheus_client import Gauge\nGauge('flexlease_z', 'Z.')\n")
    (package / "b.py").write_text(
        "from prometheus_client import Gauge\nGauge('flexlease_z', 'Z.', ['node'])\n"
    )
    with pytest.raises(ValueError, match="defined twice"):
        metrics.collect(tmp_path, ["extender"])
