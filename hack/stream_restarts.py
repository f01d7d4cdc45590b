#!/usr/bin/env python3
"""End-to-end: a streaming trainer hot-restarted mid-stream, with and without
streaming-data staging (WeFlex §3.3, Fig. 4 and the input-rate figure of §4.5).

For each mode it starts a real ``nats-server -js`` (its own store), a live stream whose buffer
holds ``--buffer-seconds`` of input (discard old, as the input queue of Fig. 4), a producer
process publishing numbered records at ``--rate`` records/s (``Nats-Msg-Id`` = number) for
``--seconds``, and the trainer (``hack/stream_trainer.py``) as a real process. ``--restarts``
times, evenly spread, the trainer is restarted: SIGTERM (it finishes its step, checkpoints,
commits), ``--down`` seconds down (the restart: process start, model load), a fresh process.
With staging, the agent's :class:`nodeagent.staging.Stager` is called as the hot-restart
controller calls it — ``begin`` before the stop, ``restarted`` once the new trainer runs —
with W from formulas 1–3 (image and checkpoint cached) plus ``--margin``.

At the end it prints both runs side by side: records produced, taken once, lost, taken
twice, and the catch-up time after each restart (until the trainer's committed offset reached
the live stream's head at the restart's end), and draws the records consumed per second over
time with the restarts shaded (``--plot``; matplotlib).

    python hack/stream_restarts.py [--rate 20000] [--seconds 40] [--restarts 3] [--down 3] \\
        [--buffer-seconds 1] [--margin 5] [--plot docs/img/staging-restarts.png]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.figure import Figure
from prometheus_client import CollectorRegistry

from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore
from flexlease.streaming.config import StreamBinding
from flexlease.streaming.jetstream import JetStreamBroker, ensure_live_stream, publish
from nodeagent.prelaunch import PrelaunchInputs, prelaunch_window
from nodeagent.staging import Stager, StagingMetrics

SELF = Path(__file__).resolve()
REPO = SELF.parents[1]
BINDING = StreamBinding("LIVE", "live.job", "job-1")
MIB = 1 << 20


@dataclass
class Run:
    mode: str
    produced: int = 0
    taken: int = 0
    lost: int = 0
    dup: int = 0
    gaps: int = 0
    restarts: list[tuple[float, float]] = field(default_factory=list)
    catchup: list[float] = field(default_factory=list)
    stager_catchup: list[float] = field(default_factory=list)
    overflows: float = 0.0
    timeline: list[tuple[float, int]] = field(default_factory=list)
    t0: float = 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_nats(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
    port = free_port()
    log = (directory / "nats.log").open("wb")
    proc = subprocess.Popen(
        [binary, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(directory / "js")],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, f"nats://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"nats-server did not start: {(directory / 'nats.log').read_text()[-2000:]}")


def start_trainer(url: str, state: Path) -> subprocess.Popen[bytes]:
    (state / "started").unlink(missing_ok=True)
    cmd = [sys.executable, str(REPO / "hack" / "stream_trainer.py"), "--url", url, "--stream", BINDING.stream]
    cmd += ["--subject", BINDING.subject, "--durable", BINDING.durable, "--state", str(state)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(cmd, env=env, cwd=REPO)


async def wait_started(state: Path, proc: subprocess.Popen[bytes]) -> None:
    while not (state / "started").exists():
        if proc.poll() is not None:
            raise SystemExit(f"trainer exited with {proc.returncode}")
        await asyncio.sleep(0.02)


async def produce(url: str, rate: int, seconds: float) -> int:
    """Publish records 1..rate*seconds at ``rate``/s in 10 ms ticks; returns the count."""
    pad = b"x" * 64
    n = 0
    async with JetStreamBroker(url) as broker:
        start = time.monotonic()
        total = int(rate * seconds)
        while n < total:
            due = min(total, int((time.monotonic() - start) * rate))
            while n < due:
                n += 1
                await publish(broker, BINDING.subject, n, b"%d|" % n + pad)
            await broker.nc.flush()
            await asyncio.sleep(0.01)
    return n


def produce_main(args: argparse.Namespace) -> int:
    n = asyncio.run(produce(args.url, args.rate, args.seconds))
    print(n)
    return 0


async def committed_reaches(broker: JetStreamBroker, target: int, *, limit: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < limit:
        commit = await broker.committed(BINDING.durable)
        if commit is not None and commit.seq >= target:
            return time.monotonic() - start
        await asyncio.sleep(0.05)
    return None


async def one_run(mode: str, args: argparse.Namespace, work: Path) -> Run:
    run = Run(mode)
    directory = work / mode
    directory.mkdir()
    state = directory / "trainer"
    state.mkdir()
    nats, url = start_nats(directory)
    store = MemoryStore()
    registry = CollectorRegistry()
    trainer: subprocess.Popen[bytes] | None = None
    try:
        async with JetStreamBroker(url) as broker:
            buffer = int(args.rate * args.buffer_seconds)
            await ensure_live_stream(broker, BINDING.stream, subjects=[BINDING.subject], max_msgs=buffer)
            annotations = {
                "flexlease.io/stream": BINDING.stream,
                "flexlease.io/stream-subject": BINDING.subject,
                "flexlease.io/stream-durable": BINDING.durable,
                "flexlease.io/staging-margin-seconds": str(args.margin),
            }
            pod = await store.create(
                Kind.POD,
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "trainer-0", "namespace": "ml", "annotations": annotations},
                },
            )
            stager = Stager(broker, store, StagingMetrics(registry, node="node-1"), node="node-1")
            # hot restart: image prelaunched and checkpoint cached (η = 1): W = S_ckpt / B_gpu
            window = prelaunch_window(
                PrelaunchInputs(
                    image_bytes=256 * MIB,
                    checkpoint_bytes=256 * MIB,
                    net_bps=1.25e9,
                    registry_bps=1.25e9,
                    storage_bps=1.25e9,
                    gpu_bps=25e9,
                    image_hit_ratio=1.0,
                    checkpoint_hit_ratio=1.0,
                )
            ).window_seconds
            async with asyncio.TaskGroup() as tg:
                stager_task = tg.create_task(stager.run(), name="stager") if mode == "staging" else None
                trainer = start_trainer(url, state)
                await wait_started(state, trainer)
                run.t0 = time.time()
                env = {
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
                }
                producer = await asyncio.create_subprocess_exec(
                    sys.executable,
                    str(SELF),
                    "produce",
                    "--url",
                    url,
                    "--rate",
                    str(args.rate),
                    "--seconds",
                    str(args.seconds),
                    stdout=asyncio.subprocess.PIPE,
                    env=env,
                    cwd=REPO,
                )
                for i in range(args.restarts):
                    at = args.seconds * (i + 1) / (args.restarts + 1)
                    await asyncio.sleep(max(0.0, run.t0 + at - time.time()))
                    began = time.time()
                    staging = await stager.begin(pod, window_seconds=window) if mode == "staging" else None
                    trainer.send_signal(signal.SIGTERM)
                    await asyncio.to_thread(trainer.wait)
                    await asyncio.sleep(args.down)
                    trainer = start_trainer(url, state)
                    await wait_started(state, trainer)
                    if staging is not None:
                        staging.restarted()
                    ended = time.time()
                    run.restarts.append((began - run.t0, ended - run.t0))
                    print(f"{mode}: restart {i + 1} down {ended - began:.2f}s", file=sys.stderr, flush=True)
                    head = (await broker.stream_state(BINDING.stream)).last_seq
                    took = await committed_reaches(broker, head, limit=60)
                    run.catchup.append(took if took is not None else float("nan"))
                    if staging is not None:
                        await asyncio.wait_for(staging.done.wait(), 60)
                        run.stager_catchup.append(staging.catchup_seconds or float("nan"))
                print(f"{mode}: catch-up {run.catchup}", file=sys.stderr, flush=True)
                out, _ = await producer.communicate()
                run.produced = int(out.decode().split()[-1])
                await committed_reaches(broker, run.produced, limit=60)
                last = -1
                while True:  # until the trainer took everything it will get
                    ck = json.loads((state / "checkpoint.json").read_text())
                    if ck["expect"] > run.produced or ck["expect"] == last:
                        break
                    last = ck["expect"]
                    await asyncio.sleep(3.0)
                trainer.send_signal(signal.SIGTERM)
                await asyncio.to_thread(trainer.wait)
                trainer = None
                if stager_task is not None:
                    stager_task.cancel()
    finally:
        if trainer is not None and trainer.poll() is None:
            trainer.kill()
        await store.close()
        nats.terminate()
        nats.wait()
    ck = json.loads((state / "checkpoint.json").read_text())
    run.taken, run.dup, run.gaps = ck["taken"], ck["dup"], ck["gaps"]
    run.lost = run.produced - run.taken
    run.overflows = registry.get_sample_value("flexlease_staging_overflows_total", {"node": "node-1"}) or 0.0
    for line in (state / "timeline.txt").read_text().splitlines():
        t, n = line.split()
        run.timeline.append((float(t) - run.t0, int(n)))
    return run


def table(runs: list[Run]) -> str:
    rows: list[tuple[str, Callable[[Run], str]]] = [
        ("records produced", lambda r: f"{r.produced:,}"),
        ("taken exactly once", lambda r: f"{r.taken:,}"),
        ("lost", lambda r: f"{r.lost:,}"),
        ("taken twice", lambda r: f"{r.dup:,}"),
        ("gaps reported to the job", lambda r: f"{r.gaps}"),
        ("staging overflows reported", lambda r: f"{r.overflows:.0f}"),
        ("restart down time (s)", lambda r: ", ".join(f"{b - a:.2f}" for a, b in r.restarts)),
        ("catch-up after restart (s)", lambda r: ", ".join(f"{c:.2f}" for c in r.catchup)),
    ]
    head = "| | " + " | ".join(r.mode for r in runs) + " |"
    sep = "|---|" + "---:|" * len(runs)
    body = [f"| {name} | " + " | ".join(f(r) for r in runs) + " |" for name, f in rows]
    return "\n".join([head, sep, *body])


def plot(runs: list[Run], path: Path, rate: int) -> None:
    fig = Figure(figsize=(9, 2.6 * len(runs)))
    axes = fig.subplots(len(runs), 1, sharex=True)
    for ax, run in zip(axes, runs, strict=True):
        bins: dict[int, int] = {}
        for t, n in run.timeline:
            bins[int(t / 0.5)] = bins.get(int(t / 0.5), 0) + n
        xs = list(range(0, max(bins) + 1)) if bins else []  # no record in a bin: 0/s (the trainer was down)
        color = "tab:orange" if run.mode == "staging" else "tab:blue"
        ax.plot(
            [x * 0.5 for x in xs],
            [bins.get(x, 0) / 0.5 for x in xs],
            color=color,
            lw=1.2,
            label="consumed / s",
        )
        ax.axhline(rate, color="grey", ls="--", lw=0.8, label=f"input rate ({rate:,}/s)")
        for a, b in run.restarts:
            ax.axvspan(a, b, color="red", alpha=0.15)
        ax.set_ylabel("records / s")
        ax.set_title(f"{run.mode}: {run.lost:,} lost, {run.dup:,} twice of {run.produced:,}", fontsize=10)
        ax.legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("seconds (shaded: trainer restarting)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


async def main_async(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="flexlease-stream-"))
    runs = []
    try:
        for mode in ("staging", "no staging"):
            runs.append(await one_run(mode.replace(" ", "-"), args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"{args.rate:,} records/s for {args.seconds:g} s, {args.restarts} restarts of {args.down:g} s"
        f" + process start, live buffer {args.buffer_seconds:g} s of input, margin {args.margin:g} s; "
        f"{platform.machine()}, {os.cpu_count()} cores"
    )
    print(table(runs))
    if args.plot:
        plot(runs, args.plot, args.rate)
        print(f"plot: {args.plot}")
    return 0 if runs[0].lost == 0 and runs[0].dup == 0 else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "produce":
        p = argparse.ArgumentParser(prog="stream_restarts.py produce")
        p.add_argument("--url", required=True)
        p.add_argument("--rate", type=int, required=True)
        p.add_argument("--seconds", type=float, required=True)
        return produce_main(p.parse_args(argv[1:]))
    p = argparse.ArgumentParser(prog="hack/stream_restarts.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=int, default=20_000, help="records/s")
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--restarts", type=int, default=3)
    p.add_argument("--down", type=float, default=3.0, help="seconds the trainer is down per restart")
    p.add_argument("--buffer-seconds", type=float, default=1.0, help="live buffer, seconds of input")
    p.add_argument("--margin", type=float, default=5.0, help="staging margin, seconds")
    p.add_argument("--plot", type=Path, default=None)
    return asyncio.run(main_async(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
