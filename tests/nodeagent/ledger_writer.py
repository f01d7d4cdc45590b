"""A ledger writer to kill (the crash-point test in ``test_ledger.py``).

``python -m tests.nodeagent.ledger_writer STATE_DIR STEP`` writes :func:`versions`' new
ledger over the old one in ``STATE_DIR`` with :class:`nodeagent.ledger.LedgerFile`; when the
write reaches ``STEP`` (one of :data:`flexlease.atomicfile.STEPS`; ``none``: never) it prints
``at STEP`` and sleeps until it is killed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from flexlease.api.resources import Health
from nodeagent.ledger import Identity, Ledger, LedgerFile, Thresholds

NODE = "crash-node"
T0 = 1_700_000_000.0
OLD_AT = T0 + 3000.0
NEW_AT = T0 + 4000.0


def versions() -> tuple[bytes, bytes]:
    """``(old, new)`` file contents: eight GPUs' histories written at ``OLD_AT``, and the same
    histories extended to ``NEW_AT`` with one more failure (the new one is a superset)."""
    book = Ledger(NODE, Thresholds())
    book.adopt(
        [(i, Identity(uuid=f"GPU-{i:04d}", model="NVIDIA H20", memory_mib=97871)) for i in range(8)], T0
    )
    for i in range(8):
        for k in range(40):  # a flapping GPU: a few KiB of intervals each
            at = T0 + 10 + k * 70 + i
            book.record(i, Health.HEALTHY if k % 2 == 0 else Health.UNHEALTHY, at=at)
    old = book.encode(OLD_AT)
    book.record(3, Health.UNHEALTHY, at=OLD_AT + 500)
    return old, book.encode(NEW_AT)


def main() -> None:
    state, stop_at = Path(sys.argv[1]), sys.argv[2]

    def on_step(step: str) -> None:
        if step == stop_at:
            print(f"at {step}", flush=True)
            time.sleep(120)

    _, new = versions()
    LedgerFile(state, on_step=on_step).save(new, written_at=NEW_AT)
    print("done", flush=True)


if __name__ == "__main__":
    main()
