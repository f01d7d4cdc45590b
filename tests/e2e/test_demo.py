"""The main job, shortened: hack/demo.py on a real containerd with the real extender and agents.

Runs the accelerated day up to 10:00 (the lease autopilot's lend from a GPULeasePolicy, LP
usage, a GPU falling off the bus, the autopilot's reclaim with standby supplement, the in-place reconfiguration after the reclaim, hot restarts) and checks
the report it writes.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from tests.e2e.conftest import ContainerdTestbed

REPO = Path(__file__).resolve().parents[2]


async def test_demo_day_lends_reclaims_supplements_and_hot_restarts(
    containerd_testbed: ContainerdTestbed, tmp_path: Path
) -> None:
    tb = containerd_testbed
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXLEASE_")}
    env.update(
        FLEXLEASE_TESTBED_DIR=str(tb.dir),
        FLEXLEASE_CRI_ENDPOINT=tb.endpoint,
        FLEXLEASE_TESTBED_TRAINER_V1=tb.trainer_v1,
        FLEXLEASE_TESTBED_TRAINER_V2=tb.trainer_v2,
        FLEXLEASE_TESTBED_CGROUP_PARENT=tb.cgroup_parent,
        # the demo and the processes it starts import this checkout, not whatever the
        # environment's editable install points at
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
    )
    out = tmp_path / "demo"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(REPO / "hack" / "demo.py"), "--out", str(out), "--end-hour", "10",
        env=env, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), 300)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text[-4000:]
    report = json.loads((out / "report.json").read_text())

    assert report["lend"]["phase"] == "Done" and len(report["lend"]["gpus"]) == 8
    # the day's leases are the lease autopilot's, from the job's GPULeasePolicy: the Lend when the
    # 01:00 window opens (or as soon as the job runs, when starting it took longer on a busy
    # machine), the Reclaim one lead time (W + 45 s grace + 60 s resync) before 09:00
    autopilot = report["autopilot"]
    assert (autopilot["lend"], autopilot["reclaim"]) == ("ranker-lend-1", "ranker-reclaim-2")
    assert "00:59" <= autopilot["lendWrittenAt"] < "06:00", autopilot
    assert 105 <= autopilot["leadTimeSeconds"] < 600, autopilot
    assert "08:49" <= autopilot["reclaimWrittenAt"] < "09:00", autopilot
    assert autopilot["leadTimeSource"].startswith("auto: W="), autopilot
    assert "image size unknown" not in autopilot["leadTimeSource"], autopilot  # the agents published it
    assert report["lowPriority"]["onLentGPUs"], "LP pods should use the lent GPUs"
    assert report["failure"]["gpu"] == "gpu-1/3"
    reclaim = report["reclaim"]
    assert reclaim["phase"] == "Done", reclaim
    # right of return: the 7 healthy lent GPUs come back, the failed one from standby
    assert len(reclaim["sameGPUsBack"]) == 7 and "gpu-1/3" not in reclaim["sameGPUsBack"]
    assert reclaim["supplementedFromStandby"] == ["gpu-1/3 -> gpu-3/0"]
    assert sorted(reclaim["preemptedPods"]) == sorted(
        f"batch/{n}" for n in report["lowPriority"]["onLentGPUs"]
    )
    assert "gpu-3" in reclaim["podsPlacedOn"].values()
    # the extender's rollout controller restarted the 8 pods that stayed in place after the reclaim
    reconfigure = report["reconfigure"]
    assert (reconfigure["phase"], reconfigure["updated"], reconfigure["total"]) == ("Complete", 8, 8), (
        reconfigure
    )
    assert len(reconfigure["restartSeconds"]) == 8 and not reconfigure["skipped"]
    assert "reconfigure:   Complete, 8/8 pods restarted in place" in text
    hot = report["hotRestart"]
    assert len(hot) == 8
    assert all(h["phase"] == "Succeeded" and h["sameSandbox"] and h["samePodIP"] for h in hot.values()), hot
    assert report["haShare"]["min"] == 1.0
    assert not report["kubeletErrors"]
    # every pod the kubelet stand-in started got its GPUs through the agent's device plugin
    # (GetPreferredAllocation → Allocate over gRPC) and ran on exactly its assigned GPUs
    plugin = report["devicePlugin"]
    assert plugin["pods"] >= 16 + 8 and plugin["onAssignedGPUs"] == plugin["pods"], plugin["mismatched"]
    assert plugin["registrations"] == {"gpu-0": 1, "gpu-1": 1, "gpu-2": 1, "gpu-3": 1}
    assert "pods ran on exactly their assigned GPUs" in text
    assert all(v["errors"] == 0 for v in report["extenderCalls"].values())
    assert os.path.getsize(report["paths"]["plot"]) > 10_000
    assert "== flexlease demo report" in text
