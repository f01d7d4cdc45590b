from __future__ import annotations

import io
import json
import logging
import math
from pathlib import Path

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


def test_json_lines_are_compact_and_whatever_orjson_refuses_json_writes() -> None:
    logger = logging.getLogger("tests.flexlease.logging")

    def line(**extra: object) -> str:
        record = logger.makeRecord(logger.name, logging.INFO, __file__, 1, "bound", (), None, extra=extra)
        return flog.JsonFormatter().format(record)

    plain = line(pod="ns/p", gpu="0,1", node="gpu-ä", ratio=0.5, obj=Path("/x"))
    assert '"level":"info"' in plain and '"node":"gpu-ä"' in plain  # orjson: compact, UTF-8
    assert json.loads(plain) | {"ts": None} == {
        "ts": None, "level": "info", "logger": logger.name, "msg": "bound", "pod": "ns/p", "gpu": "0,1",
        "node": "gpu-ä", "ratio": 0.5, "obj": "/x",
    }  # fmt: skip
    assert json.loads(line(ratio=math.inf))["ratio"] is None  # a line stays JSON
    big = line(n=2**70, node="gpu-ä")  # beyond 64 bits: json.dumps writes it, as compactly
    assert '"n":1180591620717411303424' in big and '"node":"gpu-\\u00e4"' in big
    assert json.loads(line(by_index={1: "a"}))["by_index"] == {"1": "a"}  # a key that is not a string
    assert json.loads(line(bad="\ud800"))["bad"] == "\ud800"  # not UTF-8: escaped, never a failed write


def test_setup_writes_json_lines_without_thread_process_and_caller_lookups() -> None:
    # the suite's _logging_restored fixture undoes setup()
    stream = io.StringIO()
    records: list[logging.LogRecord] = []
    flog.setup("INFO", "json", stream=stream)

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logging.getLogger().addHandler(Capture())
    logger = logging.getLogger("tests.flexlease.logging.setup")
    logger.info("bound pod", extra=flog.ctx(pod="ns/p", node="n1", gpu="0,1"))
    line = json.loads(stream.getvalue())
    assert (line["level"], line["msg"], line["pod"], line["gpu"]) == ("info", "bound pod", "ns/p", "0,1")
    (record,) = records
    assert (record.thread, record.process, record.processName) == (None, None, None)
    assert (record.funcName, record.lineno) == ("(unknown function)", 0)  # no frame walked
