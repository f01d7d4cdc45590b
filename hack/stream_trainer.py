#!/usr/bin/env python3
"""A streaming trainer for hack/stream_restarts.py: consumes numbered records through
:class:`flexlease.streaming.source.TrainingSource`, checkpoints, commits.

A message holds one or more records, a line each, starting with its number
(``b"<n>|...\\n"``; the offset counts messages). The trainer's state — the offset, the next
number it expects, records taken, records lost (a jump forward) and records seen twice (a
number below the expected one) — is its checkpoint: written atomically (temp file + rename)
after each step and before the offset is committed, and read back at start (``start_after`` =
the checkpoint's offset). SIGTERM ends it after the current step, as a container stop does (or
after 1 s when it is waiting for records). It first sleeps ``--load-seconds`` (loading the
model), then writes the time it starts reading to ``started``.
Every ``--tick`` seconds it appends ``<unix time> <records>`` to ``timeline.txt`` (records
consumed in that tick). It runs as a process or, in hack/stream_restarts.py's containerd mode,
as a container (the state directory a volume).

    python hack/stream_trainer.py --url nats://127.0.0.1:4222 --stream LIVE --subject live.job \\
        --durable job-1 --state DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

from flexlease.streaming.config import StreamBinding
from flexlease.streaming.jetstream import JetStreamBroker
from flexlease.streaming.source import Gap, TrainingSource


def load(path: Path) -> dict[str, Any]:
    if path.exists():
        state: dict[str, Any] = json.loads(path.read_text())
        return state
    return {"offset": None, "expect": 1, "taken": 0, "lost": 0, "dup": 0, "gaps": 0}


def save(path: Path, state: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


async def train(args: argparse.Namespace) -> int:
    state_file = args.state / "checkpoint.json"
    state = load(state_file)
    stop = asyncio.Event()
    main_task = asyncio.current_task()
    assert main_task is not None

    def on_term() -> None:
        # finish the current step; a trainer idle on an empty stream is cancelled (its last
        # step is checkpointed already, and a checkpoint ahead of the commit is resumed from)
        stop.set()
        asyncio.get_running_loop().call_later(1.0, main_task.cancel)

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_term)
    binding = StreamBinding(args.stream, args.subject, args.durable)

    def on_gap(gap: Gap) -> None:
        state["gaps"] += 1

    await asyncio.sleep(args.load_seconds)  # loading the model
    tick_start, tick_records = time.time(), 0
    with (args.state / "timeline.txt").open("a") as timeline:
        async with JetStreamBroker(args.url) as broker:
            source = TrainingSource(
                broker, binding, batch_size=args.batch, start_after=state["offset"], on_gap=on_gap
            )
            save(args.state / "started", time.time())
            async with aclosing(source.batches()) as batches:
                async for batch in batches:
                    taken = 0
                    for r in batch.records:  # the "training step"
                        for line in r.data.splitlines():
                            n = int(line.split(b"|", 1)[0])
                            if n < state["expect"]:
                                state["dup"] += 1
                                continue
                            state["lost"] += n - state["expect"]
                            state["expect"] = n + 1
                            taken += 1
                    state["taken"] += taken
                    state["offset"] = batch.last_seq
                    state["origin"] = batch.origin.value
                    save(state_file, state)  # checkpoint, then commit
                    await source.commit(batch)
                    tick_records += taken
                    now = time.time()
                    if now - tick_start >= args.tick:
                        timeline.write(f"{now:.3f} {tick_records}\n")
                        timeline.flush()
                        tick_start, tick_records = now, 0
                    if stop.is_set():
                        break
            if tick_records:
                timeline.write(f"{time.time():.3f} {tick_records}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hack/stream_trainer.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--stream", required=True)
    p.add_argument("--subject", required=True)
    p.add_argument("--durable", required=True)
    p.add_argument("--state", type=Path, required=True, help="directory: checkpoint.json, timeline.txt")
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--tick", type=float, default=0.25)
    p.add_argument("--load-seconds", type=float, default=0.0, help="model load before the first read")
    args = p.parse_args(argv)
    args.state.mkdir(parents=True, exist_ok=True)
    try:
        return asyncio.run(train(args))
    except asyncio.CancelledError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
