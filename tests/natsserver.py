"""A real ``nats-server`` with JetStream on 127.0.0.1 for the tests (Debian's ``nats-server``,
installed by hack/lib/deps.sh). It never skips: when the server cannot start, the test fails
with the server's own output.

:class:`NatsServer` starts the binary on a free port with its own store directory, and can
stop and start it again on the same store (a broker restart keeps the file-stored streams
and offsets). ``nats_server`` (function) is the fixture; conftests import it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

NATS_SERVER = shutil.which("nats-server") or "/usr/sbin/nats-server"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsServer:
    """One nats-server process: ``url``, ``store`` (JetStream store dir), ``log``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.store = directory / "jetstream"
        self.log = directory / "nats-server.log"
        self.port = _free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout: float = 15.0) -> None:
        """Start and wait until it accepts connections; raises RuntimeError with the log."""
        if not Path(NATS_SERVER).exists():
            raise RuntimeError(f"{NATS_SERVER} missing: apt-get install nats-server (hack/lib/deps.sh)")
        with self.log.open("ab") as out:
            self._proc = subprocess.Popen(
                [NATS_SERVER, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.store)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nats-server did not start on {self.url}:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        """Stop (SIGTERM, then SIGKILL after 10 s); the store stays."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path)
    try:
        server.start()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()
