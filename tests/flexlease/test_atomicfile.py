"""flexlease.atomicfile: whole-file replacement — a failure at every step before the rename
leaves the old file, concurrent writers never mix their bytes, one writer at a time within the
process and across processes, older versions skipped, and leftover temp files removed only
when no writer owns them."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flexlease import atomicfile
from flexlease.atomicfile import AtomicFile

BEFORE_RENAME = atomicfile.STEPS[: atomicfile.STEPS.index(atomicfile.STEP_RENAMED)]


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_replace_writes_the_whole_file_and_leaves_nothing_else(tmp_path: Path) -> None:
    seen: list[str] = []
    f = AtomicFile(tmp_path / "sub" / "state.json", on_step=seen.append)
    assert f.read() is None
    assert f.replace(b'{"a": 1}')
    assert f.replace(b'{"a": 2}')
    assert f.read() == b'{"a": 2}'
    assert _names(tmp_path / "sub") == ["state.json"]
    assert seen == [*atomicfile.STEPS, *atomicfile.STEPS]


@pytest.mark.parametrize("step", atomicfile.STEPS)
def test_a_failure_at_each_step_leaves_the_old_or_the_new_file_and_no_temp(tmp_path: Path, step: str) -> None:
    f = AtomicFile(tmp_path / "state.json")
    f.replace(b"old content")

    def fail(at: str) -> None:
        if at == step:
            raise OSError(5, f"Input/output error at {at}")

    with pytest.raises(OSError, match=f"at {step}"):
        AtomicFile(f.path, on_step=fail).replace(b"new content, longer than the old")
    assert f.read() == (b"old content" if step in BEFORE_RENAME else b"new content, longer than the old")
    assert _names(tmp_path) == ["state.json"]


def test_concurrent_writers_never_mix_their_bytes(tmp_path: Path) -> None:
    """Eight threads replace the file 25 times each with their own 64 KiB pattern while a
    reader reads it: every read is one writer's whole content."""
    path = tmp_path / "state.bin"
    contents = [bytes([i]) * 65536 for i in range(8)]
    AtomicFile(path).replace(contents[0])
    stop = threading.Event()
    bad: list[bytes] = []

    def read() -> None:
        while not stop.is_set():
            data = path.read_bytes()
            if data not in contents:
                bad.append(data[:16] + b"..." + data[-16:])

    def write(i: int) -> None:
        f = AtomicFile(path)
        for _ in range(25):
            f.replace(contents[i])

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    reader.join()
    assert not bad
    assert path.read_bytes() in contents
    assert _names(tmp_path) == ["state.bin"]


def test_one_writer_at_a_time_and_an_older_version_is_skipped(tmp_path: Path) -> None:
    """A write that starts while another is stopped mid-way waits for it (then wins, being
    newer); a write older than the last one is skipped."""
    path = tmp_path / "ledger.json"
    order: list[str] = []
    paused, go = threading.Event(), threading.Event()

    def hold(step: str) -> None:
        if step == atomicfile.STEP_HALF_WRITTEN and not paused.is_set():
            paused.set()
            assert go.wait(10)

    f = AtomicFile(path, on_step=hold)
    slow = threading.Thread(target=lambda: (f.replace(b"periodic", version=1.0), order.append("slow")))
    slow.start()
    assert paused.wait(10)
    final = threading.Thread(target=lambda: (f.replace(b"final", version=2.0), order.append("final")))
    final.start()
    time.sleep(0.1)
    assert order == []  # the final write waits for the one in flight
    go.set()
    slow.join()
    final.join()
    assert order == ["slow", "final"]
    assert path.read_bytes() == b"final"
    assert not f.replace(b"periodic again", version=1.5)
    assert path.read_bytes() == b"final"
    assert f.replace(b"unversioned")  # no version: always written


def test_another_process_holding_the_lock_is_waited_for(tmp_path: Path) -> None:
    """``flock`` on the directory: a process that holds it and writes the file later does not
    overwrite a write that started while it held the lock."""
    path = tmp_path / "ledger.json"
    script = (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(tmp_path)!r}, os.O_RDONLY | os.O_DIRECTORY)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('locked', flush=True)\n"
        "time.sleep(0.3)\n"
        f"open({str(path)!r}, 'wb').write(b'other process')\n"
    )
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stdout.readline() == b"locked\n"
        AtomicFile(path).replace(b"this process")
        assert proc.wait(10) == 0
    assert path.read_bytes() == b"this process"


def test_remove_temps_spares_a_live_writer(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    (tmp_path / ".ledger.json.tmp-deadbeef").write_bytes(b'{"half": ')  # a killed writer's
    (tmp_path / ".other.json.tmp-cafe").write_bytes(b"")  # another file's: not ours to remove
    paused, go = threading.Event(), threading.Event()

    def hold(step: str) -> None:
        if step == atomicfile.STEP_SYNCED:
            paused.set()
            assert go.wait(10)

    writer = threading.Thread(target=lambda: AtomicFile(path, on_step=hold).replace(b"whole"))
    writer.start()
    assert paused.wait(10)
    removed: list[Path] = []
    cleaner = threading.Thread(target=lambda: removed.extend(AtomicFile(path).remove_temps()))
    cleaner.start()
    time.sleep(0.1)
    assert cleaner.is_alive()  # waits for the writer
    go.set()
    writer.join()
    cleaner.join()
    assert [p.name for p in removed] == [".ledger.json.tmp-deadbeef"]
    assert path.read_bytes() == b"whole"
    assert _names(tmp_path) == [".other.json.tmp-cafe", "ledger.json"]
    assert atomicfile.is_temp(".other.json.tmp-cafe") and not atomicfile.is_temp("ledger.json")
