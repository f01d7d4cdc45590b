"""flexlease.sim.extender_proc: environment, free ports, and start failures reported with the log."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from flexlease.sim import extender_proc


def test_env_points_the_extender_at_the_shared_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEXLEASE_CONFIG", "/nonexistent.yaml")
    env = extender_proc.extender_env(tmp_path / "s.db", port=1234, speedup=500, extra={"FLEXLEASE_X": "1"})
    assert env["FLEXLEASE_STORE__KIND"] == "sqlite"
    assert env["FLEXLEASE_STORE__SQLITE_PATH"] == str(tmp_path / "s.db")
    assert env["FLEXLEASE_EXTENDER__HOST"] == "127.0.0.1"
    assert env["FLEXLEASE_EXTENDER__PORT"] == "1234"
    assert env["FLEXLEASE_CLOCK_SPEEDUP"] == "500"
    assert env["FLEXLEASE_X"] == "1"
    assert "FLEXLEASE_CONFIG" not in env


def test_free_port_is_bindable() -> None:
    port = extender_proc.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


async def test_an_extender_that_cannot_start_is_reported_with_its_log(tmp_path: Path) -> None:
    with pytest.raises(extender_proc.ExtenderStartError, match="exited with status 2") as info:
        async with extender_proc.running_extender(
            tmp_path / "s.db",
            tmp_path / "extender.log",
            speedup=1.0,
            extra_env={"FLEXLEASE_EXTENDER__PORT": "not-a-port"},
        ):
            pass
    assert "bad configuration" in info.value.log_tail


async def test_the_real_extender_starts_and_stops(tmp_path: Path) -> None:
    async with extender_proc.running_extender(
        tmp_path / "s.db", tmp_path / "extender.log", speedup=1.0
    ) as ext:
        assert ext.url.startswith("http://127.0.0.1:")
        assert ext.process.returncode is None
    assert ext.process.returncode is not None
