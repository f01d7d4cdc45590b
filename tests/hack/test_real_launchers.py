"""The real-launcher harness's pure parts: failure diagnosis, the table, delays, pod status,
and the check that its profiles keep the shipped profiles' structure."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from hack import real_launchers, table1
from hack.real_launchers import Pod, TrialResult


def test_reason_prefers_the_launchers_own_diagnosis() -> None:
    stderr = (
        b"ctr: no running task found\ncri-rsh: exec in pod x failed (exit 1)\n----\n"
        b"ORTE was unable to reliably start one or more daemons.\nThis usually is caused by:\n"
    )
    assert real_launchers.reason(stderr) == "ORTE was unable to reliably start one or more daemons."
    assert real_launchers.reason(b"boom\n  last words  \n\n") == "last words"
    assert real_launchers.reason(b"") == "no output"


def test_format_table_counts_failures_per_mode() -> None:
    results = [
        TrialResult("mpi", "naive", False, 1.0, 1, "ORTE was unable"),
        TrialResult("mpi", "naive", True, 3.0, 1, ""),
        TrialResult("mpi", "orchestrated", True, 5.0, 1, ""),
        TrialResult("mpi", "orchestrated", True, 7.0, 1, ""),
    ]
    table = real_launchers.format_table(results)
    row = table.splitlines()[1]
    assert row.split()[:2] == ["mpi", "mpirun"]
    assert "1/2 (50 %)" in row and "0/2 (0 %)" in row and "3.0 s" in row and "7.0 s" in row
    assert "ray" not in table.splitlines()[-1]


def test_start_delays_are_seeded_and_bounded() -> None:
    a = table1.boot_delays(random.Random(7), "ray", 2, 1.0, 4.0)
    b = table1.boot_delays(random.Random(7), "ray", 2, 1.0, 4.0)
    assert a == b and list(a) == ["head", "worker"] and len(a["worker"]) == 2
    assert all(1.0 <= d <= 4.0 for ds in a.values() for d in ds)


def test_pod_status_is_pending_until_the_container_runs() -> None:
    pod = Pod(name="p", role="head", ip="127.0.0.2", port=6379, delay=0.0, container_id="abc")
    pending = real_launchers.pod_status(pod, running=False, ready=False)
    assert pending["phase"] == "Pending" and "containerStatuses" not in pending
    assert pending["podIP"] == "127.0.0.2"
    running = real_launchers.pod_status(pod, running=True, ready=True)
    assert running["containerStatuses"][0]["containerID"] == "containerd://abc"
    assert running["conditions"] == [{"type": "Ready", "status": "True"}]


def test_profiles_keep_the_shipped_structure(tmp_path: Path) -> None:
    profs = real_launchers.profiles()
    assert set(profs) == {"mpi", "ray"}
    assert "{worker.names}" in profs["mpi"].command("mpirun").run
    text = (real_launchers.PROFILE_DIR / "ray.yaml").read_text()
    (tmp_path / "ray.yaml").write_text(text.replace("      - ready: head\n", ""))
    with pytest.raises(RuntimeError, match="differs from the shipped ray profile"):
        table1.twin_profiles(tmp_path, ["ray"])
    with pytest.raises(RuntimeError, match="differs from the shipped mpi profile"):
        table1.twin_profiles(tmp_path, ["mpi"])


def test_python_dirs_outside_usr_are_mounted() -> None:
    dirs = real_launchers.python_dirs()
    assert all(not d.is_relative_to("/usr") for d in dirs)
    assert len(dirs) == len(set(dirs))
