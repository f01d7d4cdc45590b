"""hack/demo.py starts every run from a fresh day: no store and no agent state of the last run."""

from __future__ import annotations

from pathlib import Path

from hack import demo


def test_a_rerun_inherits_no_store_and_no_agent_state(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    (out / "agents" / "gpu-1" / "checkpoints").mkdir(parents=True)
    # the last run left GPU 3 of gpu-1 unhealthy in its ledger, and its store
    (out / "agents" / "gpu-1" / "ledger.json").write_text('{"devices": {"3": {"healthy": false}}}')
    (out / "agents" / "gpu-1.log").write_text("{}\n")
    for name in ("state.db", "state.db-wal", "state.db-shm", "report.json"):
        (out / name).write_text("x")
    demo.fresh_out(out)
    assert sorted(p.name for p in out.iterdir()) == ["report.json"]  # overwritten at the end
    demo.fresh_out(tmp_path / "new" / "out")  # a first run: nothing to remove
    assert (tmp_path / "new" / "out").is_dir()
