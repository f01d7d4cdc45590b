"""``hack/gpu_check.py`` without a GPU: the script and the real agent process it starts run on
the pynvml fake of ``tests/nodeagent/health/test_nvml.py``, installed in both processes by a
``sitecustomize`` module on ``PYTHONPATH``. The device-node and CUDA checks need an NVIDIA host
and are asserted as failing / not run here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
UUIDS = ("GPU-5d2b3c1e-0000-4000-8000-000000000000", "GPU-5d2b3c1e-0000-4000-8000-000000000001")

SITECUSTOMIZE = """
import json, os
import pynvml
from tests.nodeagent.health.test_nvml import PATCHED, FakeGpu, FakeNvml
_fake = FakeNvml([FakeGpu(**g) for g in json.loads(os.environ["FAKE_NVML_GPUS"])])
for _name in PATCHED:
    setattr(pynvml, _name, getattr(_fake, _name))
"""


def run_check(tmp_path: Path, gpus: list[dict[str, Any]]) -> tuple[int, dict[str, dict[str, Any]]]:
    """Run the script on fake GPUs ``gpus`` (FakeGpu fields); returns its exit status and its
    checks by name."""
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXLEASE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    env["FAKE_NVML_GPUS"] = json.dumps(gpus)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    out = tmp_path / "report.json"
    cmd = [sys.executable, str(ROOT / "hack" / "gpu_check.py"), "--wait=0.1", "--queries=5",
           "--load-seconds=1", f"--out={out}"]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert out.exists(), done.stdout + done.stderr
    report = json.loads(out.read_text())
    return done.returncode, {c["name"]: c for c in report["checks"]}


def test_healthy_gpus_pass_every_check_an_nvidia_host_is_not_needed_for(tmp_path: Path) -> None:
    code, checks = run_check(tmp_path, [{"uuid": UUIDS[0], "minor": 0}, {"uuid": UUIDS[1], "minor": 1}])
    for name in (
        "NVML sees GPUs with UUIDs, no NVML errors",
        "query latency measured",
        "GPUNode status names each GPU by UUID, Healthy",
        "kubelet is sent every UUID Healthy",
        "flexlease_nvml_up is 1",
        "Allocate answers the bound GPU's UUID and device nodes",
        "the agent stops cleanly on SIGTERM",
    ):
        assert checks[name]["ok"] is True, checks[name]
    allocate = checks["Allocate answers the bound GPU's UUID and device nodes"]["detail"]
    assert allocate["envs"] == {"NVIDIA_VISIBLE_DEVICES": UUIDS[0]}
    assert "/dev/nvidia0" in allocate["deviceSpecs"] and "/dev/nvidia1" not in allocate["deviceSpecs"]
    nodes = checks["device nodes match NVML minor numbers"]
    assert set(nodes["detail"]) >= {"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"}
    if not Path("/dev/nvidiactl").exists():
        assert nodes["ok"] is False and code == 1
    cuda = checks["CUDA sees the allocated GPU"]
    if cuda["ok"] is None:
        assert cuda["detail"].startswith("not run")


@pytest.mark.parametrize(
    ("gpu", "failing"),
    [
        ({"lost": True}, "NVML sees GPUs with UUIDs, no NVML errors"),
        ({"remapped": [0, 0, 0, 1]}, "GPUNode status names each GPU by UUID, Healthy"),
    ],
    ids=["lost", "row-remapping-failure"],
)
def test_an_unhealthy_gpu_fails_the_check(tmp_path: Path, gpu: dict[str, Any], failing: str) -> None:
    code, checks = run_check(
        tmp_path, [{"uuid": UUIDS[0], "minor": 0}, {"uuid": UUIDS[1], "minor": 1, **gpu}]
    )
    assert code == 1
    assert checks[failing]["ok"] is False, checks[failing]


def test_warnings_are_read_from_json_log_lines() -> None:
    from hack.gpu_check import warnings  # noqa: PLC0415 - imports pynvml; only this test needs it

    lines = [
        '{"ts":"t","level":"info","msg":"a"}',
        '{"ts":"t","level":"warning","msg":"b"}',
        '{"ts": "t", "level": "error", "msg": "c"}',
        "Traceback (most recent call last):",
        '["level", "warning"]',
        '{"level":"critical","msg":"d"}',
    ]
    assert warnings(lines) == [lines[1], lines[2], lines[5]]
