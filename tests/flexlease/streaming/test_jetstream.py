"""The reader's stream sequence from a JetStream reply subject (both forms of ADR-15)."""

from __future__ import annotations

import pytest

from flexlease import errors
from flexlease.streaming.jetstream import stream_sequence


def test_stream_sequence_from_both_reply_subject_forms() -> None:
    assert stream_sequence("$JS.ACK.LIVE.reader.1.4711.12.1700000000000000000.3") == 4711
    assert stream_sequence("$JS.ACK.hub.ACCHASH.LIVE.reader.1.4711.12.1700000000000000000.3.tok") == 4711
    assert stream_sequence("$JS.ACK.hub.ACCHASH.LIVE.reader.1.4711.12.1700000000000000000.3") == 4711


@pytest.mark.parametrize("reply", ["", "_INBOX.abc", "$JS.ACK.LIVE.reader.1.2", "$JS.NAK.a.b.1.2.3.4.5"])
def test_stream_sequence_refuses_other_subjects(reply: str) -> None:
    with pytest.raises(errors.BrokerError, match="not a JetStream"):
        stream_sequence(reply)
