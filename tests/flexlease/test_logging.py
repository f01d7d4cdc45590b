from __future__ import annotations

import io
import json
import logging

import pytest

from flexlease import logging as flog


def test_ctx_drops_none_and_never_collides_with_record_attributes() -> None:
    fields = flog.ctx(pod="ns/p", node=None, message="m", name="n", gpu="0,3")
    assert fields == {"pod": "ns/p", "message_": "m", "name_": "n", "gpu": "0,3"}
    logger = logging.getLogger("tests.flexlease.logging")
    record = logger.makeRecord(logger.name, logging.INFO, __file__, 1, "bound", (), None, extra=fields)
    out = json.loads(flog.JsonFormatter().format(record))
    assert out["msg"] == "bound" and out["pod"] == "ns/p" and out["message_"] == "m"
    assert "node" not in out


def test_text_format_is_key_value(caplog: pytest.LogCaptureFixture) -> None:
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "evicted %s", ("p",), None)
    record.__dict__.update(flog.ctx(pod="ns/p", gpu=3))
    line = flog.TextFormatter().format(record)
    assert line.endswith("warning x: evicted p pod=ns/p gpu=3")


def test_setup_writes_json_lines_without_thread_and_process_lookups() -> None:
    root = logging.getLogger()
    saved = (
        root.handlers[:],
        root.level,
        logging.logThreads,
        logging.logProcesses,
        logging.logMultiprocessing,
    )
    stream = io.StringIO()
    try:
        flog.setup("INFO", "json", stream=stream)
        logger = logging.getLogger("tests.flexlease.logging.setup")
        logger.info("bound pod", extra=flog.ctx(pod="ns/p", node="n1", gpu="0,1"))
        record = logger.makeRecord(logger.name, logging.INFO, __file__, 1, "m", (), None)
    finally:
        root.handlers[:], level, logging.logThreads, logging.logProcesses, logging.logMultiprocessing = saved
        root.setLevel(level)
    line = json.loads(stream.getvalue())
    assert (line["level"], line["msg"], line["pod"], line["gpu"]) == ("info", "bound pod", "ns/p", "0,1")
    assert (record.thread, record.process, record.processName) == (None, None, None)
