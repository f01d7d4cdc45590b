from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from flexlease.api import keys
from flexlease.errors import PodSpecError
from nodeagent.hotrestart.model import HotRestartStatus, Phase, Strategy, parse_request, parse_status


def test_parse_request() -> None:
    r = parse_request('{"id": "r1", "container": "trainer", "image": "reg/trainer:v2"}')
    assert (r.id, r.container, r.image, r.strategy) == ("r1", "trainer", "reg/trainer:v2", None)
    r = parse_request('{"id": "r2", "container": "t", "image": "i", "strategy": "kubelet"}')
    assert r.strategy is Strategy.KUBELET
    r = parse_request(
        json.dumps(
            {
                "id": "r3",
                "container": "t",
                "image": "i",
                "checkpoint": {"id": "j/9", "url": "s3://b/k", "sha256": "a" * 64},
            }
        )
    )
    assert r.checkpoint is not None and (r.checkpoint.id, r.checkpoint.url) == ("j/9", "s3://b/k")


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("not json", "value"),
        ("[]", "value"),
        ('{"container": "trainer", "image": "i"}', "id"),
        ('{"id": "", "container": "trainer", "image": "i"}', "id"),
        ('{"id": "r", "container": "Trainer_1", "image": "i"}', "container"),
        ('{"id": "r", "container": "t", "image": "has space"}', "image"),
        ('{"id": "r", "container": "t", "image": "i", "strategy": "magic"}', "strategy"),
        ('{"id": "r", "container": "t", "image": "i", "checkpoint": {"id": "c", "url": "u"}}', "sha256"),
        (
            '{"id": "r", "container": "t", "image": "i", "checkpoint": {"id": "c", "url": "u", "sha256": "xyz"}}',
            "checkpoint.sha256",
        ),
    ],
)
def test_malformed_requests_say_what_is_wrong(value: str, needle: str) -> None:
    with pytest.raises(PodSpecError, match=keys.ANN_HOT_RESTART) as info:
        parse_request(value)
    assert needle in str(info.value)


def test_status_renders_camel_case_and_round_trips() -> None:
    status = HotRestartStatus(
        id="r1",
        phase=Phase.SUCCEEDED,
        strategy=Strategy.DIRECT,
        container="trainer",
        image="i:v2",
        sandbox_id="sb",
        pod_ip="10.0.0.2",
        container_id="c2",
        previous_container_id="c1",
        previous_attempt=0,
        attempt=1,
        pull_seconds=0.5,
        finished_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    doc = json.loads(status.render())
    assert doc["podIP"] == "10.0.0.2"
    assert doc["containerId"] == "c2" and doc["previousAttempt"] == 0 and doc["pullSeconds"] == 0.5
    assert "message" not in doc  # None fields are omitted
    assert parse_status(status.render()) == status
    assert parse_status(None) is None and parse_status("garbage") is None
    assert Phase.SUCCEEDED.final and Phase.FAILED.final and not Phase.IN_PROGRESS.final
