"""Instructions per scheduling cycle of the extender, counted by cachegrind: a figure that
does not move with the VM's speed.

Usage: ``python hack/bench_instructions.py [--short 100] [--long 600] [--cpu 0] [--keep DIR]
[-- BENCH-ARGS...]``

Wall-clock and CPU times on the shared 2-core VM this project is developed on move by a
factor of two between one half hour and the next (the same code measured 0.87 and 2.26 ms of
handler CPU per cycle on one day), so a change of 10 % cannot be read from them alone.
``valgrind --tool=cachegrind`` counts the instructions each process executes, and its cache
simulation the first-level and last-level misses; these repeat within about 1 % run to run.

Runs ``hack/bench_extender.py --sync-bind --warmup 0`` (binds awaited, so requests come in
one order) twice under cachegrind with ``PYTHONHASHSEED=0``, for ``--short`` and ``--long``
cycles, and prints per cycle ``(count at long − count at short) / (long − short)`` for the
server process (the extender) and the client (the kube-scheduler stand-in): start-up and
loading cancel out. Both bench processes are pinned to ``--cpu``. Needs valgrind (Debian
``valgrind``); about 4 minutes at the defaults on the 2-core VM.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an installed copy

from hack import interpreter

BENCH = Path(__file__).resolve().parent / "bench_extender.py"
EVENTS = ("Ir", "D1mr", "D1mw", "I1mr", "DLmr", "ILmr")
"""Instructions; first-level data read/write and instruction misses; last-level misses."""


def summary(path: Path) -> dict[str, int]:
    """The ``summary:`` line of a cachegrind output file, by event name."""
    events: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("summary:"):
            return dict(zip(events, map(int, line.split()[1:]), strict=True))
    raise ValueError(f"{path}: no summary line (did cachegrind finish?)")


def count(cycles: int, out: Path, args: argparse.Namespace) -> tuple[dict[str, int], dict[str, int]]:
    """(client, server) event counts of one bench run of ``cycles`` cycles."""
    run_dir = out / str(cycles)
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=yes",
        f"--cachegrind-out-file={run_dir}/cg.%p",
        sys.executable,
        str(BENCH),
        "--sync-bind",
        "--warmup",
        "0",
        "--cycles",
        str(cycles),
        "--server-cpu",
        str(args.cpu),
        "--client-cpu",
        str(args.cpu),
        *args.bench_args,
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    with (run_dir / "bench.txt").open("w") as stdout, (run_dir / "valgrind.txt").open("w") as stderr:
        subprocess.run(cmd, check=True, env=env, stdout=stdout, stderr=stderr)
    files = sorted(run_dir.glob("cg.*"), key=lambda p: int(p.suffix[1:]))
    if len(files) != 2:
        raise RuntimeError(f"expected two cachegrind files (client, server) in {run_dir}, got {len(files)}")
    client, server = (summary(f) for f in files)  # the client is the parent: the lower pid
    return client, server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=100, help="cycles of the shorter run")
    parser.add_argument("--long", type=int, default=600, help="cycles of the longer run")
    parser.add_argument("--cpu", type=int, default=0, help="the CPU both bench processes are pinned to")
    parser.add_argument("--keep", type=Path, help="keep cachegrind's files in this directory")
    parser.add_argument("bench_args", nargs="*", help="more arguments for bench_extender.py (after --)")
    args = parser.parse_args()
    if args.long <= args.short:
        parser.error("--long must be more than --short")
    if shutil.which("valgrind") is None:
        sys.exit("valgrind not found: apt-get install valgrind")
    out = args.keep or Path(tempfile.mkdtemp(prefix="bench-instructions-"))
    try:
        short = count(args.short, out, args)
        long = count(args.long, out, args)
    finally:
        if args.keep is None:
            shutil.rmtree(out, ignore_errors=True)
    cycles = args.long - args.short
    # the interpreter moves the counts (pyenv's shared build: 12 % more than Debian's python3.11)
    print(f"interpreter: {interpreter.describe()}")
    print(f"per cycle, (count at {args.long} cycles - count at {args.short}) / {cycles}:")
    for name, (a, b) in (
        ("server (extender)", (short[1], long[1])),
        ("client (scheduler)", (short[0], long[0])),
    ):
        figures = ", ".join(f"{e} {(b[e] - a[e]) / cycles / 1000:.1f} k" for e in EVENTS if e in a)
        print(f"  {name}: {figures}")


if __name__ == "__main__":
    main()
