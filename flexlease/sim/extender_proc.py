"""Start the real extender (``python -m extender.main``) as a subprocess on a SQLite store.

The simulator and the extender share one SQLite file (``FLEXLEASE_STORE__KIND=sqlite``,
``FLEXLEASE_STORE__SQLITE_PATH``), as the extender and the node agents do on one machine
(DESIGN §5). The extender listens on 127.0.0.1 on a free port chosen here
(``FLEXLEASE_EXTENDER__PORT``) over plain HTTP, explicitly (``FLEXLEASE_EXTENDER__INSECURE_HTTP``:
loopback only, no TLS); it is up once that port accepts connections. Its stdout and
stderr go to a log file (level WARNING by default, so the access log stays out of long runs).
``FLEXLEASE_CLOCK_SPEEDUP`` is passed through for the lease controller's clock. Only the
module name crosses the layering boundary: ``flexlease`` never imports ``extender``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from flexlease.errors import FlexleaseError

EXTENDER_MODULE: Final = "extender.main"
DEFAULT_START_TIMEOUT_SECONDS: Final = 60.0


class ExtenderStartError(FlexleaseError):
    """The extender subprocess exited or did not log its URL in time; ``log_tail`` holds the
    end of its stderr."""

    def __init__(self, message: str, *, log_tail: str) -> None:
        super().__init__(f"{message}\n--- extender log (tail) ---\n{log_tail}")
        self.log_tail = log_tail


@dataclass(frozen=True, slots=True)
class ExtenderProcess:
    """A running extender: its URL, process and log file."""

    url: str
    process: asyncio.subprocess.Process
    log_path: Path


def extender_env(
    db_path: Path,
    *,
    port: int,
    speedup: float,
    log_level: str = "WARNING",
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The subprocess environment: the current one plus the store, listen address, lease and
    clock settings. ``extra`` overrides."""
    env = dict(os.environ)
    env.update(
        {
            "FLEXLEASE_STORE__KIND": "sqlite",
            "FLEXLEASE_STORE__SQLITE_PATH": str(db_path),
            "FLEXLEASE_STORE__SQLITE_POLL_SECONDS": "0.005",
            "FLEXLEASE_EXTENDER__HOST": "127.0.0.1",
            "FLEXLEASE_EXTENDER__PORT": str(port),
            "FLEXLEASE_EXTENDER__INSECURE_HTTP": "true",  # loopback only: the demo and the simulator
            "FLEXLEASE_LOG_FORMAT": "json",
            "FLEXLEASE_LOG_LEVEL": log_level,
            "FLEXLEASE_CLOCK_SPEEDUP": f"{speedup:g}",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.pop("FLEXLEASE_CONFIG", None)
    env.update(extra or {})
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _accepts(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError as exc:
        return f"(cannot read {path}: {exc})"


@contextlib.asynccontextmanager
async def running_extender(
    db_path: Path,
    log_path: Path,
    *,
    speedup: float,
    log_level: str = "WARNING",
    start_timeout_s: float = DEFAULT_START_TIMEOUT_SECONDS,
    extra_env: Mapping[str, str] | None = None,
) -> AsyncIterator[ExtenderProcess]:
    """Start the extender on a free port, yield it once the port accepts connections, and
    stop it (SIGTERM, then SIGKILL after 10 s) on exit. Raises :class:`ExtenderStartError`
    when it exits early or does not listen within ``start_timeout_s`` seconds."""
    port = free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            EXTENDER_MODULE,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            env=extender_env(db_path, port=port, speedup=speedup, log_level=log_level, extra=extra_env),
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + start_timeout_s
        while not await _accepts(port):
            if process.returncode is not None:
                raise ExtenderStartError(
                    f"extender exited with status {process.returncode}", log_tail=_tail(log_path)
                )
            if time.monotonic() > deadline:
                raise ExtenderStartError(
                    f"extender did not listen on 127.0.0.1:{port} within {start_timeout_s:g} s",
                    log_tail=_tail(log_path),
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 0.05)
        yield ExtenderProcess(f"http://127.0.0.1:{port}", process, log_path)
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 10.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
