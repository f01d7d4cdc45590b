"""hack/bench_stream.py, small: both readers drain every record in order (the bench asserts
each number) on a real nats-server, and the table has a row per reader and message size."""

from __future__ import annotations

import pytest

from hack import bench_stream


def test_the_bench_drains_every_record_with_both_readers(capsys: pytest.CaptureFixture[str]) -> None:
    bench_stream.main(["--records", "3000", "--per-message", "10"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 1") and "|" in line[2:]]
    assert [r.split("|")[1:3] for r in rows] == [
        [" 1 ", " shipped "],
        [" 1 ", " baseline "],
        [" 10 ", " shipped "],
        [" 10 ", " baseline "],
    ]
