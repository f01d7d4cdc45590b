"""hack/stream_restarts.py, small, with the trainer as a container on the real containerd
testbed: hot-restarted twice mid-stream by the node agent's hot-restart controller (``direct``
strategy, same sandbox) for longer than the live buffer holds — with staging nothing is lost or
taken twice, without it records are lost and reported to the job as gaps."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from tests.nodeagent.conftest import ContainerdTestbed

pytestmark = pytest.mark.containerd

REPO = Path(__file__).resolve().parents[2]


def row(output: str, name: str) -> list[str]:
    [line] = [ln for ln in output.splitlines() if ln.startswith(f"| {name} |")]
    return [cell.strip().replace(",", "") for cell in line.strip("|").split("|")[1:]]


async def test_a_trainer_container_hot_restarted_with_staging_loses_and_repeats_nothing(
    containerd_testbed: ContainerdTestbed, tmp_path: Path
) -> None:
    tb = containerd_testbed
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = ["--runtime", "containerd", "--cri-endpoint", tb.endpoint, "--log-root", str(tb.log_root)]
    args += ["--images", f"{tb.trainer_v1},{tb.trainer_v2}", "--cgroup-parent", tb.cgroup_parent]
    args += ["--rate", "2000", "--seconds", "6", "--restarts", "2", "--down", "1", "--buffer-seconds", "1"]
    # a wide staging margin: on a loaded 2-core VM the restart's process start alone can take
    # seconds (a 5.7 s outage overflowed a 5 s margin once); sizing is tested in test_staging
    args += ["--margin", "60"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(REPO / "hack" / "stream_restarts.py"), *args, "--plot", str(tmp_path / "p.png"),
        env=env, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 240)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    output = out.decode()
    assert proc.returncode == 0, output + err.decode()[-3000:]
    assert "trainer as a container (containerd, hot restart: direct)" in output
    assert row(output, "records produced") == ["12000", "12000"]
    assert row(output, "taken exactly once")[0] == "12000"
    lost, twice = row(output, "lost"), row(output, "taken twice")
    assert lost[0] == "0" and twice == ["0", "0"]
    assert int(lost[1]) > 0 and int(row(output, "gaps reported to the job")[1]) > 0
    assert len(row(output, "catch-up after restart (s)")[0].split()) == 2  # one per restart
    assert (tmp_path / "p.png").stat().st_size > 0
