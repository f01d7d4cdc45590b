"""``python -m flexlease.sim``: argument handling, and one short run writing report, plots and table."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexlease.sim import __main__ as cli


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        cli.parse_args(["--out", str(tmp_path), "--tick", "7"])
    assert info.value.code == 2


def test_scenario_from_arguments(tmp_path: Path) -> None:
    _, s = cli.parse_args(
        [
            "--out",
            str(tmp_path),
            "--nodes",
            "8",
            "--days",
            "2",
            "--data",
            str(tmp_path),
            "--seed",
            "9",
            "--online-reliability",
            "MA",
        ]
    )
    assert (s.nodes, s.days, s.seed, s.data_dir, s.online_reliability.value) == (8, 2.0, 9, tmp_path, "MA")
    assert s.warmup == 0.5 * 86400


@pytest.fixture
def _root_logger() -> Iterator[None]:
    """main() configures the root logger, as a composition root does; put it back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("_root_logger")
def test_short_plain_run_writes_everything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = cli.main(
        [
            "--nodes",
            "4",
            "--standby-nodes",
            "1",
            "--days",
            "1",
            "--out",
            str(out),
            "--data",
            str(tmp_path / "none"),
            "--policy",
            "plain",
            "--log-level",
            "WARNING",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert (
        (out / "report.json").exists()
        and (out / "ha_share.png").exists()
        and (out / "lp_fulfilment.png").exists()
    )
    assert "| | plain leasing |" in printed
    assert "LP arrivals: synthetic (MISSING" in printed
