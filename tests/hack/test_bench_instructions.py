"""hack/bench_instructions.py: reading cachegrind's summary line (the counting itself runs
valgrind for minutes and is not part of the suite)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hack import bench_instructions


def test_the_summary_line_is_read_by_event_name(tmp_path: Path) -> None:
    out = tmp_path / "cg.123"
    out.write_text(
        "desc: I1 cache: 32768 B, 64 B, 8-way associative\n"
        "cmd: python bench\n"
        "events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw\n"
        "fl=x.c\nfn=main\n1 5 0 0 2 0 0 1 0 0\n"
        "summary: 1000 20 3 400 50 6 200 10 1\n"
    )
    got = bench_instructions.summary(out)
    assert got == {
        "Ir": 1000, "I1mr": 20, "ILmr": 3, "Dr": 400, "D1mr": 50, "DLmr": 6, "Dw": 200, "D1mw": 10, "DLmw": 1,
    }  # fmt: skip


def test_an_unfinished_file_is_an_error(tmp_path: Path) -> None:
    out = tmp_path / "cg.1"
    out.write_text("events: Ir\n")
    with pytest.raises(ValueError, match="no summary line"):
        bench_instructions.summary(out)
