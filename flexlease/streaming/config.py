"""A job's streaming configuration from its pod annotations, and the staging window
W_stage (WeFlex §3.3, "Short-Duration Streaming-Data Staging"). Pure; no I/O.

A pod opts in with three annotations that go together (:mod:`flexlease.api.keys`):
``flexlease.io/stream`` (the stream holding its live input), ``flexlease.io/stream-subject``
(the subject its records are published on) and ``flexlease.io/stream-durable`` (the job's
durable name, which keys its committed offset and its staging stream), plus an optional
``flexlease.io/staging-margin-seconds`` (default :data:`DEFAULT_MARGIN_SECONDS`).

W_stage = W + margin, where W is the prelaunch window (formulas 1–3,
:func:`flexlease.prelaunch.prelaunch_window`); the staging stream holds W_stage seconds of the
job's measured input rate, in records and in bytes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from flexlease import errors
from flexlease.api import keys

DEFAULT_MARGIN_SECONDS: Final = 30.0
MIN_STAGING_RECORDS: Final = 1000
"""Lower bound of a staging stream's record limit, whatever the measured rate."""
STAGING_PREFIX: Final = "FLEXLEASE_STAGE_"
OFFSETS_BUCKET: Final = "flexlease_offsets"
"""The key-value bucket (JetStream) holding each durable name's committed offset."""

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,200}$")
_SUBJECT_TOKEN = re.compile(r"^[^\s.*>]+$")


@dataclass(frozen=True, slots=True)
class StreamBinding:
    """Where a job reads its input: ``stream`` (live stream name), ``subject``, ``durable``
    (the job's durable name), ``margin_seconds`` (≥ 0, added to W)."""

    stream: str
    subject: str
    durable: str
    margin_seconds: float = DEFAULT_MARGIN_SECONDS

    @property
    def staging_stream(self) -> str:
        """The job's staging stream: ``FLEXLEASE_STAGE_<durable>``."""
        return STAGING_PREFIX + self.durable


def parse_binding(annotations: Mapping[str, str]) -> StreamBinding | None:
    """The job's binding from its pod annotations; ``None`` when the pod sets none of
    stream, stream-subject, stream-durable. Raises :class:`flexlease.errors.PodSpecError`
    naming every missing or malformed field when only some are set or one is invalid."""
    stream = annotations.get(keys.ANN_STREAM, "").strip()
    subject = annotations.get(keys.ANN_STREAM_SUBJECT, "").strip()
    durable = annotations.get(keys.ANN_STREAM_DURABLE, "").strip()
    margin_raw = annotations.get(keys.ANN_STAGING_MARGIN)
    if not (stream or subject or durable):
        if margin_raw is not None:
            raise errors.PodSpecError(
                f"{keys.ANN_STAGING_MARGIN} is set but {keys.ANN_STREAM}, {keys.ANN_STREAM_SUBJECT} "
                f"and {keys.ANN_STREAM_DURABLE} are missing"
            )
        return None
    problems: list[str] = []
    for key, value in (
        (keys.ANN_STREAM, stream),
        (keys.ANN_STREAM_SUBJECT, subject),
        (keys.ANN_STREAM_DURABLE, durable),
    ):
        if not value:
            problems.append(f"{key} is missing")
    if stream and not _NAME.match(stream):
        problems.append(f"{keys.ANN_STREAM} {stream!r} must be letters, digits, '-' or '_'")
    if durable and not _NAME.match(durable):
        problems.append(f"{keys.ANN_STREAM_DURABLE} {durable!r} must be letters, digits, '-' or '_'")
    if subject and not all(_SUBJECT_TOKEN.match(t) for t in subject.split(".")):
        problems.append(f"{keys.ANN_STREAM_SUBJECT} {subject!r} must be a literal subject (no wildcards)")
    margin = DEFAULT_MARGIN_SECONDS
    if margin_raw is not None:
        try:
            margin = float(margin_raw)
        except ValueError:
            margin = math.nan
        if not math.isfinite(margin) or margin < 0:
            problems.append(f"{keys.ANN_STAGING_MARGIN} must be a number of seconds >= 0, got {margin_raw!r}")
    if problems:
        raise errors.PodSpecError("streaming configuration: " + "; ".join(problems))
    return StreamBinding(stream=stream, subject=subject, durable=durable, margin_seconds=margin)


@dataclass(frozen=True, slots=True)
class StagingLimits:
    """A staging stream's size: ``window_seconds`` W_stage, ``max_msgs`` records,
    ``max_bytes`` bytes."""

    window_seconds: float
    max_msgs: int
    max_bytes: int


def staging_limits(
    *,
    window_seconds: float,
    margin_seconds: float,
    records_per_second: float,
    bytes_per_second: float,
) -> StagingLimits:
    """W_stage = ``window_seconds`` (W, formulas 1–3) + ``margin_seconds``, and the records
    and bytes the job's input brings in W_stage at the measured rates (records/s, bytes/s;
    at least :data:`MIN_STAGING_RECORDS` records and 1 MiB). Raises
    :class:`flexlease.errors.RequestError` on a negative or non-finite input."""
    for name, value in (
        ("window_seconds", window_seconds),
        ("margin_seconds", margin_seconds),
        ("records_per_second", records_per_second),
        ("bytes_per_second", bytes_per_second),
    ):
        if not math.isfinite(value) or value < 0:
            raise errors.RequestError(f"staging window: {name} must be a finite number >= 0, got {value}")
    w_stage = window_seconds + margin_seconds
    return StagingLimits(
        window_seconds=w_stage,
        max_msgs=max(MIN_STAGING_RECORDS, math.ceil(w_stage * records_per_second)),
        max_bytes=max(1 << 20, math.ceil(w_stage * bytes_per_second)),
    )
