"""Pod annotations → StreamBinding, and the W_stage sizing (pure)."""

from __future__ import annotations

import pytest

from flexlease import errors
from flexlease.api import keys
from flexlease.streaming.config import (
    DEFAULT_MARGIN_SECONDS,
    MIN_STAGING_RECORDS,
    StagingLimits,
    StreamBinding,
    parse_binding,
    staging_limits,
)

FULL = {keys.ANN_STREAM: "LIVE", keys.ANN_STREAM_SUBJECT: "live.job", keys.ANN_STREAM_DURABLE: "job-1"}


def test_no_annotations_means_no_staging() -> None:
    assert parse_binding({}) is None


def test_a_full_binding_with_default_and_given_margin() -> None:
    assert parse_binding(FULL) == StreamBinding("LIVE", "live.job", "job-1", DEFAULT_MARGIN_SECONDS)
    b = parse_binding({**FULL, keys.ANN_STAGING_MARGIN: "12.5"})
    assert b is not None and b.margin_seconds == 12.5 and b.staging_stream == "FLEXLEASE_STAGE_job-1"


@pytest.mark.parametrize(
    ("annotations", "messages"),
    [
        (
            {keys.ANN_STREAM: "LIVE"},
            [f"{keys.ANN_STREAM_SUBJECT} is missing", f"{keys.ANN_STREAM_DURABLE} is missing"],
        ),
        ({keys.ANN_STAGING_MARGIN: "5"}, [f"{keys.ANN_STAGING_MARGIN} is set but"]),
        ({**FULL, keys.ANN_STREAM: "a.b"}, ["'a.b' must be letters, digits"]),
        ({**FULL, keys.ANN_STREAM_SUBJECT: "live.*"}, ["must be a literal subject"]),
        ({**FULL, keys.ANN_STREAM_DURABLE: "job/1"}, ["'job/1' must be letters"]),
        ({**FULL, keys.ANN_STAGING_MARGIN: "soon"}, ["must be a number of seconds >= 0, got 'soon'"]),
        ({**FULL, keys.ANN_STAGING_MARGIN: "nan"}, ["got 'nan'"]),
        ({**FULL, keys.ANN_STAGING_MARGIN: "-1"}, ["got '-1'"]),
    ],
)
def test_bad_configuration_names_every_problem(annotations: dict[str, str], messages: list[str]) -> None:
    with pytest.raises(errors.PodSpecError) as info:
        parse_binding(annotations)
    for m in messages:
        assert m in str(info.value)


def test_w_stage_is_w_plus_margin_at_the_measured_rate() -> None:
    limits = staging_limits(
        window_seconds=8, margin_seconds=30, records_per_second=20_000, bytes_per_second=2e6
    )
    assert limits == StagingLimits(window_seconds=38, max_msgs=760_000, max_bytes=76_000_000)
    idle = staging_limits(window_seconds=0, margin_seconds=1, records_per_second=0, bytes_per_second=0)
    assert idle.max_msgs == MIN_STAGING_RECORDS and idle.max_bytes == 1 << 20


@pytest.mark.parametrize(
    "field", ["window_seconds", "margin_seconds", "records_per_second", "bytes_per_second"]
)
@pytest.mark.parametrize("value", [-1.0, float("inf"), float("nan")])
def test_w_stage_refuses_bad_inputs(field: str, value: float) -> None:
    args = {"window_seconds": 1.0, "margin_seconds": 1.0, "records_per_second": 1.0, "bytes_per_second": 1.0}
    with pytest.raises(errors.RequestError, match=field):
        staging_limits(**{**args, field: value})
