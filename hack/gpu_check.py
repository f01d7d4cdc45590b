"""The node agent on a real GPU host: ``python hack/gpu_check.py [--load-seconds S] [--out FILE]``.

Runs what only a machine with NVIDIA GPUs can show, and prints one JSON report (exit status 1
when a check fails, 2 when NVML cannot start):

1. **probe** — :func:`nodeagent.health.nvml.probe`: driver, devices (UUID, model, MiB, PCI bus
   ID, minor number), the health event mask registered on each GPU, one query, one event wait.
2. **query latency** — each GPU's health query (temperature, retired pages, remapped rows: three
   NVML calls) timed ``--queries`` times in a worker thread, as the agent runs it; p50/p99/max
   in ms, which bounds how small ``agent.poll_seconds`` can be on a node of many GPUs.
3. **device nodes** — ``/dev/nvidia<minor>`` for each GPU's NVML minor number is a character
   device with major 195 and that minor, and the control nodes exist: what ``Allocate`` returns
   with ``agent.device_plugin_device_specs`` (:mod:`nodeagent.deviceplugin.response`).
4. **agent** — the real agent process (``python -m nodeagent.main --nvml=real``, SQLite store,
   no containerd needed) with its device plugin registered to the stand-in kubelet
   (:mod:`standins.kubelet_devices`, real gRPC on unix sockets): the GPUNode status it writes
   names every GPU by its NVML UUID and Healthy; kubelet is sent every UUID Healthy;
   ``/metrics`` reports ``flexlease_nvml_up 1``.
5. **allocate** — a pod bound to GPU 0 as the extender's bind leaves it (``assigned-gpus``,
   ``assigned-uuids``) is admitted by the stand-in kubelet: ``Allocate`` answers
   ``NVIDIA_VISIBLE_DEVICES=<GPU 0's UUID>`` and that GPU's device nodes.
6. **cuda** — a CUDA process started with ``CUDA_VISIBLE_DEVICES`` set to that UUID (the
   variable the NVIDIA container runtime derives from ``NVIDIA_VISIBLE_DEVICES``) sees exactly
   one device with that UUID and runs bf16 matrix products for ``--load-seconds`` (PyTorch;
   the check is reported as not run where PyTorch is absent). During and after it the agent
   keeps the GPU Healthy, with no XID, and its temperature gauge moves.

The report's ``checks`` list each check's name, ``ok`` and detail. Nothing here writes to the
GPU beyond the matrix products; the store and sockets live in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import stat
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an installed copy

from flexlease.api import keys
from flexlease.clock import format_time
from flexlease.errors import NotFound, NvmlError
from flexlease.sim import objects
from flexlease.sim.extender_proc import free_port
from flexlease.store.base import JsonObj, Kind
from flexlease.store.sqlite import SqliteStore
from hack.waiting import poll
from nodeagent.deviceplugin.response import CONTROL_DEVICES, ENV_VISIBLE_DEVICES
from nodeagent.health import nvml
from standins.kubelet_devices import DeviceKubelet

NVIDIA_MAJOR: Final = 195
"""The character-device major number of ``/dev/nvidia<minor>`` (NVIDIA driver, ``/proc/devices``)."""
NODE: Final = "gpu-check-0"
RESOURCE: Final = keys.DEFAULT_GPU_RESOURCE
POD: Final = "gpu-check-pod"
NAMESPACE: Final = "default"

CUDA_SCRIPT: Final = """
import json, sys, time
import torch
n = torch.cuda.device_count()
props = torch.cuda.get_device_properties(0)
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
deadline = time.monotonic() + float(sys.argv[1])
products = 0
start = time.monotonic()
while time.monotonic() < deadline:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    products += 20
elapsed = time.monotonic() - start
print(json.dumps({"deviceCount": n, "name": props.name, "uuid": str(props.uuid),
                  "products": products, "tflops": round(products * 2 * 8192**3 / elapsed / 1e12, 1)}))
"""


@dataclass(slots=True)
class Report:
    """The printed report: what each step saw, and the checks."""

    facts: dict[str, Any] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)

    def check(self, name: str, ok: bool | None, detail: Any = None) -> None:
        """Record check ``name``: ``ok`` True/False, or None for "not run" (with the reason)."""
        self.checks.append({"name": name, "ok": ok, "detail": detail})

    @property
    def failed(self) -> list[str]:
        return [c["name"] for c in self.checks if c["ok"] is False]


async def query_latency(report: Report, devices: list[dict[str, Any]], queries: int) -> None:
    """Step 2: time ``queries`` health queries per GPU through the backend (ms)."""
    backend = nvml.NvmlBackend()
    await backend.start()
    try:
        per_gpu: dict[str, dict[str, float]] = {}
        for d in devices:
            times: list[float] = []
            for _ in range(queries):
                started = time.perf_counter()
                await backend.query(d["index"])
                times.append((time.perf_counter() - started) * 1000)
            per_gpu[str(d["index"])] = {
                "p50Ms": round(statistics.median(times), 3),
                "p99Ms": round(statistics.quantiles(times, n=100, method="inclusive")[98], 3),
                "maxMs": round(max(times), 3),
            }
    finally:
        await backend.stop()
    report.facts["queryLatency"] = {"queries": queries, "gpus": per_gpu}
    report.check("query latency measured", bool(per_gpu), per_gpu)


def device_nodes(report: Report, devices: list[dict[str, Any]]) -> None:
    """Step 3: each GPU's ``/dev/nvidia<minor>`` and the control nodes."""
    seen: dict[str, str] = {}
    ok = True
    for d in devices:
        minor = d.get("minor_number")
        if minor is None:
            seen[str(d["index"])] = "no minor number from NVML"
            ok = False
            continue
        path = f"/dev/nvidia{minor}"
        try:
            st = os.stat(path)
        except OSError as exc:
            seen[path] = f"missing: {exc.strerror}"
            ok = False
            continue
        major_minor = (os.major(st.st_rdev), os.minor(st.st_rdev))
        kind = "char" if stat.S_ISCHR(st.st_mode) else "not a char device"
        seen[path] = f"{kind} {major_minor[0]}:{major_minor[1]}"
        ok = ok and stat.S_ISCHR(st.st_mode) and major_minor == (NVIDIA_MAJOR, minor)
    for path in CONTROL_DEVICES:
        present = os.path.exists(path)
        seen[path] = "present" if present else "missing"
        ok = ok and present
    report.check("device nodes match NVML minor numbers", ok, seen)


def agent_command(base: Path, kubelet: DeviceKubelet, metrics_port: int) -> tuple[list[str], dict[str, str]]:
    """The agent's command line and environment: real NVML, SQLite store, fast polls."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXLEASE_")}
    env.update(
        FLEXLEASE_LOG_FORMAT="json",
        FLEXLEASE_STORE__SQLITE_POLL_SECONDS="0.05",
        FLEXLEASE_AGENT__NODE_IP="127.0.0.1",
        FLEXLEASE_AGENT__POLL_SECONDS="1",
        FLEXLEASE_AGENT__HEARTBEAT_SECONDS="2",
        FLEXLEASE_AGENT__CRI_ENDPOINT=f"unix://{base / 'no-containerd.sock'}",
        FLEXLEASE_AGENT__CHECKPOINT_DIR=str(base / "checkpoints"),
        FLEXLEASE_AGENT__DEVICE_PLUGIN_DIR=str(kubelet.plugin_dir),
        FLEXLEASE_AGENT__POD_RESOURCES_SOCKET=str(kubelet.pod_resources_socket),
        FLEXLEASE_AGENT__DEVICE_PLUGIN_POLL_SECONDS="0.2",
        FLEXLEASE_AGENT__DEVICE_PLUGIN_DEVICE_SPECS="true",
        FLEXLEASE_AGENT__POD_RESOURCES_SECONDS="1",
        PYTHONUNBUFFERED="1",
    )
    cmd = [
        sys.executable, "-m", "nodeagent.main", "--nvml=real", f"--node-name={NODE}",
        "--store=sqlite", f"--sqlite-path={base / 'state.db'}", f"--state-dir={base / 'agent'}",
        "--metrics-host=127.0.0.1", f"--metrics-port={metrics_port}",
    ]  # fmt: skip
    return cmd, env


def warnings(lines: list[str]) -> list[str]:
    """The lines of a JSON log (``FLEXLEASE_LOG_FORMAT=json``) at level warning or above, as
    written; a line that is not a JSON object (a traceback Python printed itself) is skipped."""
    out: list[str] = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("level") in ("warning", "error", "critical"):
            out.append(line)
    return out


async def scrape(port: int) -> list[Sample]:
    """The ``flexlease_*`` samples of the agent's ``/metrics`` (Prometheus text format, read by
    ``prometheus_client``'s parser)."""
    timeout = aiohttp.ClientTimeout(total=5)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        response.raise_for_status()
        text = await response.text()
    families = text_string_to_metric_families(text)
    return [s for f in families if f.name.startswith("flexlease_") for s in f.samples]


def samples(scraped: list[Sample], name: str, **labels: str) -> dict[str, float]:
    """The values of sample ``name`` whose labels include ``labels``, by their label values
    (JSON-ready: ``"node=…,gpu=…"`` → value)."""
    return {
        ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())): s.value
        for s in scraped
        if s.name == name and labels.items() <= s.labels.items()
    }


async def gpunode_status(store: SqliteStore) -> JsonObj | None:
    try:
        node = await store.get(Kind.GPUNODE, NODE)
    except NotFound:
        return None
    status = node.get("status") or {}
    return status if status.get("devices") else None


async def bound_pod(store: SqliteStore, uuids: list[str]) -> JsonObj:
    """A one-GPU pod on GPU 0 as the extender's bind leaves it."""
    pod = objects.pod(POD, NAMESPACE, gpus=1, priority=keys.PRIORITY_LOW, owner=POD)
    pod["spec"]["nodeName"] = NODE
    pod["metadata"]["annotations"].update(
        {
            keys.ANN_ASSIGNED_GPUS: f"{NODE}:0",
            keys.ANN_ASSIGNED_UUIDS: uuids[0],
            keys.ANN_ASSIGNED_AT: format_time(datetime.now(UTC)),
        }
    )
    return await store.create(Kind.POD, pod)


async def python3(*args: str, env: dict[str, str] | None = None, limit_s: float) -> tuple[int, str, str]:
    """Run ``python3 args`` (the first ``python3`` on PATH, where a GPU host keeps PyTorch);
    returns (exit status, stdout, stderr). Raises ``TimeoutError`` after ``limit_s`` seconds."""
    proc = await asyncio.create_subprocess_exec(
        shutil.which("python3") or sys.executable,
        *args,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), limit_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


async def run_cuda(report: Report, uuid: str, seconds: float) -> tuple[int, str, str] | None:
    """Step 6's process; None (check reported as not run) when PyTorch is absent."""
    if (await python3("-c", "import torch", limit_s=60))[0] != 0:
        report.check("CUDA sees the allocated GPU", None, "not run: no PyTorch for python3")
        return None
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=uuid)
    return await python3("-c", CUDA_SCRIPT, str(seconds), env=env, limit_s=seconds + 120)


async def agent_steps(report: Report, devices: list[dict[str, Any]], load_seconds: float) -> None:
    """Steps 4–6: the agent process, the stand-in kubelet, Allocate and a CUDA process."""
    uuids = [d["uuid"] for d in devices]
    base = Path(tempfile.mkdtemp(prefix="gpuchk-", dir="/tmp"))  # unix socket paths ≤ 107 bytes
    kubelet = DeviceKubelet(base / "dp", base / "pr" / "kubelet.sock")
    store = SqliteStore(base / "state.db", poll_seconds=0.05)
    metrics_port = free_port()
    log_path = base / "agent.log"
    proc: asyncio.subprocess.Process | None = None
    try:
        await kubelet.start()
        await store.open()
        cmd, env = agent_command(base, kubelet, metrics_port)
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                *cmd, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log
            )
        status = await poll(
            "the agent's GPUNode status", lambda: gpunode_status(store), limit_s=60, interval_s=0.2
        )
        seen = {i: (d.get("uuid"), d.get("health")) for i, d in sorted(status["devices"].items())}
        want = {str(d["index"]): (d["uuid"], "Healthy") for d in devices}
        report.facts["gpunodeStatus"] = status
        report.check("GPUNode status names each GPU by UUID, Healthy", seen == want, seen)

        await kubelet.wait_registered(RESOURCE, limit_s=30)
        advertised = await kubelet.wait_devices(RESOURCE, lambda d: len(d) == len(uuids), limit_s=30)
        report.check(
            "kubelet is sent every UUID Healthy",
            advertised == dict.fromkeys(uuids, "Healthy"),
            advertised,
        )
        before = await scrape(metrics_port)
        nvml_up = samples(before, "flexlease_nvml_up", node=NODE)
        report.check("flexlease_nvml_up is 1", list(nvml_up.values()) == [1.0], nvml_up)

        await bound_pod(store, uuids)
        got = await kubelet.admit(NAMESPACE, POD, [("main", 1)], resource=RESOURCE)
        response = got["main"].response
        envs = dict(response.envs)
        specs = sorted(s.host_path for s in response.devices)
        minor = devices[0].get("minor_number")
        want_specs = sorted([f"/dev/nvidia{minor}", *CONTROL_DEVICES])
        report.check(
            "Allocate answers the bound GPU's UUID and device nodes",
            list(got["main"].devices) == [uuids[0]] and envs.get(ENV_VISIBLE_DEVICES) == uuids[0]
            and specs == want_specs,
            {"devices": list(got["main"].devices), "envs": envs, "deviceSpecs": specs},
        )  # fmt: skip

        done = await run_cuda(report, envs.get(ENV_VISIBLE_DEVICES, ""), load_seconds)
        if done is not None:
            during = await scrape(metrics_port)
            code, out, err = done
            seen_cuda: dict[str, Any] = {"returncode": code, "stderr": err[-2000:]}
            if code == 0:
                seen_cuda = json.loads(out.strip().splitlines()[-1])
            want_uuid = uuids[0].removeprefix("GPU-")
            report.facts["cuda"] = seen_cuda
            report.check(
                "CUDA sees the allocated GPU",
                seen_cuda.get("deviceCount") == 1 and seen_cuda.get("uuid") == want_uuid,
                seen_cuda,
            )
            await asyncio.sleep(2.5)  # one more poll and heartbeat after the load
            after = await gpunode_status(store) or {}
            devs = sorted(after.get("devices", {}).items())
            health = {i: (d.get("health"), d.get("lastXid")) for i, d in devs}
            xids = samples(await scrape(metrics_port), "flexlease_gpu_xid_events_total")
            report.check(
                "the agent keeps the GPU Healthy under load, no XID",
                all(h == "Healthy" and x is None for h, x in health.values()) and not any(xids.values()),
                {"health": health, "xidCounters": xids},
            )
            report.facts["temperatureC"] = {
                "before": samples(before, "flexlease_gpu_temperature_celsius", gpu="0"),
                "afterLoad": samples(during, "flexlease_gpu_temperature_celsius", gpu="0"),
            }
        report.facts["metrics"] = [s._asdict() for s in await scrape(metrics_port)]
    finally:
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if proc is not None:
            report.check("the agent stops cleanly on SIGTERM", proc.returncode == 0, proc.returncode)
            lines = log_path.read_text(errors="replace").splitlines()
            report.facts["agentLogTail"] = lines[-15:]
            report.facts["agentWarnings"] = warnings(lines)[:20]
        with contextlib.suppress(Exception):
            await store.close()
        await kubelet.stop()
        shutil.rmtree(base, ignore_errors=True)


async def amain(args: argparse.Namespace) -> Report:
    report = Report()
    probe = await nvml.probe(wait_seconds=args.wait)
    report.facts["probe"] = probe
    devices: list[dict[str, Any]] = probe["devices"]
    report.check(
        "NVML sees GPUs with UUIDs, no NVML errors",
        bool(devices) and all(d["uuid"].startswith("GPU-") for d in devices) and not probe["nvmlErrors"],
        {"devices": len(devices), "nvmlErrors": probe["nvmlErrors"]},
    )
    if not devices:
        return report
    await query_latency(report, devices, args.queries)
    device_nodes(report, devices)
    try:
        await agent_steps(report, devices, args.load_seconds)
    except (TimeoutError, OSError) as exc:
        report.check("agent steps", False, f"{type(exc).__name__}: {exc}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--wait", type=float, default=3.0, help="probe: seconds to wait for one NVML event")
    parser.add_argument("--queries", type=int, default=200, help="health queries timed per GPU")
    parser.add_argument("--load-seconds", type=float, default=20.0, help="seconds of bf16 matrix products")
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    if args.queries < 2:
        parser.error("--queries must be at least 2 (a p99 needs two samples)")
    try:
        report = asyncio.run(amain(args))
    except NvmlError as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    text = json.dumps(asdict(report), indent=2, default=str)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(f"failed checks: {report.failed or 'none'}", file=sys.stderr)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
