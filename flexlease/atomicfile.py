"""Crash-safe replacement of a whole file: the one way the node agent writes the files it keeps
(the availability ledger, the checkpoint cache's metadata).

:meth:`AtomicFile.replace` writes the new content so that the file is always either the old
or the new version, whatever point a crash (``kill -9``, OOM kill, power loss) hits:

1. **one writer at a time**: a lock per path inside the process (threads), and ``flock`` on
   the directory across processes (two agents on one node during a DaemonSet rollout with
   surge). A write that waits for the lock runs after the one in flight, never beside it;
2. a **unique temp file** in the same directory, ``.<name>.tmp-<random>``, created
   exclusively (``open(…, "xb")``, O_CREAT|O_EXCL): no two writes ever share one, so no
   write can truncate or interleave with another's bytes;
3. the bytes written and **fsync**\\ ed;
4. **renamed** over the file (``os.replace``, atomic on POSIX);
5. the **directory fsync**\\ ed, so the rename itself survives a power loss.

A failure before the rename removes the temp file and leaves the old file whole; a crash
leaves at most a temp file, which :meth:`AtomicFile.remove_temps` deletes (under the lock, so
never one a live writer is filling). ``version`` (optional, any increasing number such as a
write's timestamp) makes late writes harmless: a write carrying a version lower than the
last one written through the same :class:`AtomicFile` is skipped, so a slow periodic write
that gets the lock after the final one cannot put older content back.

``on_step`` is told each step as it completes (:data:`STEPS`); tests use it to stop a writer
at every point (delays, ``kill -9``). Synchronous and blocking (fsync): call it from a worker
thread (``asyncio.to_thread``). No library offers the lock, the versions and the directory
fsync together (``atomicwrites`` is archived), hence this module; it uses only the standard
library (``fcntl``, ``os``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

STEP_LOCKED: Final = "locked"
STEP_OPENED: Final = "opened"
STEP_HALF_WRITTEN: Final = "half-written"
STEP_WRITTEN: Final = "written"
STEP_SYNCED: Final = "synced"
STEP_RENAMED: Final = "renamed"
STEP_DIR_SYNCED: Final = "dir-synced"
STEPS: Final = (
    STEP_LOCKED,
    STEP_OPENED,
    STEP_HALF_WRITTEN,
    STEP_WRITTEN,
    STEP_SYNCED,
    STEP_RENAMED,
    STEP_DIR_SYNCED,
)
"""The points of a write, in order: lock held, temp file created (empty), half the bytes
written (and flushed to the kernel), all written, fsynced, renamed over the file, directory
fsynced."""

TEMP_MARK: Final = ".tmp-"

StepHook = Callable[[str], None]
"""Told the name of each step of a write as it completes (tests)."""


def temp_prefix(name: str) -> str:
    """The prefix of the temp files of writes to the file called ``name``."""
    return f".{name}{TEMP_MARK}"


def is_temp(name: str) -> bool:
    """Whether a directory entry called ``name`` is the temp file of some write."""
    return name.startswith(".") and TEMP_MARK in name


@dataclass(eq=False)
class _PathLock:
    """The lock the process's writers of one path share."""

    lock: threading.Lock = field(default_factory=threading.Lock)


_locks: weakref.WeakValueDictionary[str, _PathLock] = weakref.WeakValueDictionary()
_locks_lock = threading.Lock()


def _path_lock(path: Path) -> _PathLock:
    key = os.path.abspath(path)
    with _locks_lock:
        found = _locks.get(key)
        if found is None:
            found = _PathLock()
            _locks[key] = found
        return found


class AtomicFile:
    """The file at ``path``, replaced whole (see the module docstring).

    ``on_step``: a hook told each completed step (tests). Instances for the same path share
    one lock within the process; each keeps the version of its own last write.
    """

    def __init__(self, path: Path, *, on_step: StepHook | None = None) -> None:
        self.path = path
        self.directory = path.parent
        self._on_step = on_step
        self._lock = _path_lock(path)
        self._version: float | None = None

    def _step(self, name: str) -> None:
        if self._on_step is not None:
            self._on_step(name)

    @contextlib.contextmanager
    def locked(self) -> Iterator[int]:
        """Hold the path's lock (in the process, then ``flock`` on the directory, which is
        created when missing); yields the directory's file descriptor. Raises ``OSError``."""
        with self._lock.lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(dir_fd, fcntl.LOCK_EX)
                yield dir_fd
            finally:
                os.close(dir_fd)  # releases the flock

    def replace(self, data: bytes, *, version: float | None = None) -> bool:
        """Replace the file's content with ``data`` (temp file, fsync, rename, directory
        fsync, one writer at a time). Returns False, writing nothing, when ``version`` is
        lower than the version of the last write through this instance. Raises
        ``OSError``: before the rename the old file is untouched and the temp file removed;
        after it (the directory fsync failed) the new content is in place but may not
        survive a power loss."""
        with self.locked() as dir_fd:
            last = self._version
            if version is not None and last is not None and version < last:
                return False
            self._step(STEP_LOCKED)
            tmp = self._write_temp(data)
            try:
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                raise
            if version is not None:
                self._version = version
            self._step(STEP_RENAMED)
            os.fsync(dir_fd)
            self._step(STEP_DIR_SYNCED)
        return True

    def _write_temp(self, data: bytes) -> Path:
        """A new temp file holding ``data``, fsynced. Removed again on any failure."""
        prefix = temp_prefix(self.path.name)
        while True:
            tmp = self.directory / f"{prefix}{secrets.token_hex(8)}"
            try:
                f = open(tmp, "xb")  # noqa: SIM115 (closed below) O_CREAT|O_EXCL: never another's
            except FileExistsError:
                continue
            break
        try:
            with f:
                self._step(STEP_OPENED)
                half = len(data) // 2
                f.write(data[:half])
                f.flush()
                self._step(STEP_HALF_WRITTEN)
                f.write(data[half:])
                f.flush()
                self._step(STEP_WRITTEN)
                os.fsync(f.fileno())
            self._step(STEP_SYNCED)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        return tmp

    def read(self) -> bytes | None:
        """The file's content; None when it does not exist. Raises ``OSError``."""
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    def remove_temps(self) -> list[Path]:
        """Delete the temp files that interrupted writes left (under the lock, so none of a
        live writer); returns them. Raises ``OSError``."""
        removed: list[Path] = []
        with self.locked():
            for tmp in self.directory.glob(f"{temp_prefix(self.path.name)}*"):
                tmp.unlink(missing_ok=True)
                removed.append(tmp)
        return removed
