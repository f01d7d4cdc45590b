"""The node agent's alert rules: Debian's real ``promtool check rules`` and ``promtool test
rules``, the PrometheusRule equal to the plain rules file, and every metric the rules use
exposed by the agent."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from flexlease.clock import ManualClock
from flexlease.store.memory import MemoryStore
from nodeagent.deviceplugin.metrics import DevicePluginMetrics
from nodeagent.health.backend import DeviceSample
from nodeagent.staging import StagingMetrics
from tests.nodeagent.health.kit import START, make_context, make_settings, node_config

ALERTS = Path(__file__).resolve().parents[2] / "manifests" / "alerts"
RULES = ALERTS / "rules.yaml"
RULE_TESTS = ALERTS / "rules.test.yaml"
PROMETHEUS_RULE = ALERTS.parent / "components" / "prometheus-operator" / "prometheusrule.yaml"
PROMTOOL = "/usr/bin/promtool"
ALERT_NAMES = {
    "FlexleaseGPUUnhealthy",
    "FlexleaseGPUTierDowngraded",
    "FlexleaseGPUXidStorm",
    "FlexleaseAgentDown",
    "FlexleaseAgentHeartbeatStale",
    "FlexleaseNVMLInitFailure",
    "FlexleaseDevicePluginNotRegistered",
    "FlexleaseGPUAssignmentMismatch",
    "FlexleaseStagingOverflow",
}


def promtool(*args: str | Path, cwd: Path = ALERTS) -> subprocess.CompletedProcess[str]:
    assert shutil.which(PROMTOOL), f"{PROMTOOL} missing: apt-get install prometheus"
    return subprocess.run(
        [PROMTOOL, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERT_NAMES)} rules found" in result.stdout


def test_promtool_test_rules() -> None:
    result = promtool("test", "rules", RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_test_rules_fails_on_a_wrong_expectation(tmp_path: Path) -> None:
    """The unit tests can fail: a wrong expected annotation makes promtool exit non-zero."""
    shutil.copy(RULES, tmp_path / "rules.yaml")
    broken = RULE_TESTS.read_text().replace("12m 0s ago", "11m 0s ago")
    assert broken != RULE_TESTS.read_text()
    (tmp_path / "rules.test.yaml").write_text(broken)
    result = promtool("test", "rules", "rules.test.yaml", cwd=tmp_path)
    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr


def test_every_alert_has_a_unit_test() -> None:
    tested = {t["alertname"] for case in load(RULE_TESTS)["tests"] for t in case["alert_rule_test"]}
    names = {r["alert"] for g in load(RULES)["groups"] for r in g["rules"]}
    assert names == ALERT_NAMES == tested


RUNBOOKS = "https://flexlease.github.io/flexlease/operations/#"


def test_every_alert_links_its_runbook_section() -> None:
    """Each rule's ``runbook_url`` is its own section of the operations page (the anchor mkdocs
    makes of a heading that is exactly the alert's name; tests/docs/test_site.py checks that the
    built site has it)."""
    rules = [r for g in load(RULES)["groups"] for r in g["rules"]]
    assert rules
    for rule in rules:
        assert rule["annotations"].get("runbook_url") == RUNBOOKS + rule["alert"].lower(), rule["alert"]


def test_prometheus_rule_carries_the_same_groups(tmp_path: Path) -> None:
    doc = load(PROMETHEUS_RULE)
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert doc["kind"] == "PrometheusRule"
    assert doc["metadata"]["name"] == "flexlease-node-agent"
    assert doc["spec"] == load(RULES)
    # and promtool accepts the PrometheusRule's spec as a rules file
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc["spec"]))
    result = promtool("check", "rules", tmp_path / "spec.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


async def test_rules_use_only_metrics_the_agent_exposes(tmp_path: Path) -> None:
    clock = ManualClock(START)
    ctx, backend = await make_context(make_settings(tmp_path), MemoryStore(), clock, node_config(count=1))
    ctx.board.set_devices(await backend.start(), clock.now())
    ctx.board.apply_sample(DeviceSample(index=0, at=clock.now(), temperature_c=40))
    ctx.board.retier(clock.now())
    ctx.metrics.xid(gpu=0, uuid=ctx.board.devices[0].uuid, model="NVIDIA H20", xid=79)
    ctx.metrics.heartbeat.labels(node=ctx.node).set(clock.now())
    DevicePluginMetrics(ctx.registry, ctx.node)  # registered by the deviceplugin component
    StagingMetrics(ctx.registry, node=ctx.node)  # the hotrestart component's, with staging on
    exposed = {
        s.name
        for f in text_string_to_metric_families(generate_latest(ctx.registry).decode())
        for s in f.samples
    }
    used = {
        name
        for g in load(RULES)["groups"]
        for r in g["rules"]
        for name in re.findall(r"\bflexlease_[a-z_]+", r["expr"])
    }
    assert used, "no flexlease metric in the rules?"
    assert used <= exposed, used - exposed
