"""Who may write a run directory: exactly one process at a time, and only a directory that is
new, empty or already a run.

:class:`RunLock` holds an OS file lock (``filelock``) on ``RUN_DIR/.lock`` for the whole run,
resume included; the holder records itself in ``RUN_DIR/.owner.json`` so that a second
writer is refused with one line naming it. The lock dies with its process (``kill -9``
included), so a crashed run never blocks the next one. :func:`check_out_dir` refuses a file,
a directory holding unrelated files, and a path that cannot be created, before anything is
written.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from filelock import FileLock, Timeout

from ..errors import RunDirectoryError
from ..files import atomic_write

LOCK_FILE = ".lock"
OWNER_FILE = ".owner.json"
CONFIG_FILE = "config.json"
OWN_FILES = frozenset({LOCK_FILE, OWNER_FILE})
"""Files a start that failed before writing its config may leave; such a directory is free
(as are the ``.NAME.*.tmp`` files of an atomic write in progress)."""


def check_out_dir(path: Path) -> None:
    """Refuse ``path`` as a run directory unless it is absent, empty, a run (it holds
    ``config.json``) or the remains of a start that never wrote its config."""
    if path.exists() and not path.is_dir():
        raise RunDirectoryError(f"--out {path}: is a file, not a directory")
    if not path.is_dir() or (path / CONFIG_FILE).exists():
        return
    try:
        others = sorted(p.name for p in path.iterdir() if p.name not in OWN_FILES
                        and not (p.name.startswith(".") and p.name.endswith(".tmp")))
    except OSError as e:
        raise RunDirectoryError(f"--out {path}: cannot be read ({e.strerror})") from None
    if others:
        shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        raise RunDirectoryError(f"--out {path}: holds other files ({shown}) and no run; "
                                "choose a new or empty directory")


class RunLock:
    """The exclusive right to write one run directory, held until :meth:`release`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = FileLock(str(path / LOCK_FILE), timeout=0)

    def acquire(self) -> RunLock:
        """Take the lock or raise :class:`RunDirectoryError` naming the holder; creates the
        directory if needed (an unwritable or impossible path is refused the same way)."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock.acquire()
        except Timeout:
            raise RunDirectoryError(f"{self.path} is in use by {self._holder()}; wait for it "
                                    "to finish or choose another --out") from None
        except OSError as e:
            raise RunDirectoryError(f"--out {self.path}: cannot be used as a run directory "
                                    f"({e.strerror or e})") from None
        owner = {"pid": os.getpid(), "host": socket.gethostname(),
                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        atomic_write(self.path / OWNER_FILE, json.dumps(owner).encode())
        return self

    def held_elsewhere(self) -> bool:
        """Whether another process holds the directory now (a probe: takes and drops the
        lock when it is free; never creates a lock file where there is none)."""
        if not (self.path / LOCK_FILE).exists():
            return False
        try:
            self._lock.acquire()
        except Timeout:
            return True
        self._lock.release()
        return False

    def release(self) -> None:
        """Give the directory up (idempotent)."""
        if self._lock.is_locked:
            (self.path / OWNER_FILE).unlink(missing_ok=True)
            self._lock.release(force=True)

    def _holder(self) -> str:
        """Who holds the lock, from its owner file; the holder writes that file just after
        taking the lock, so a contender that comes in between waits for it a moment."""
        deadline = time.monotonic() + 2.0
        while True:
            try:
                owner = json.loads((self.path / OWNER_FILE).read_text())
                return f"process {owner['pid']} on {owner['host']} (since {owner['since']})"
            except (OSError, ValueError, KeyError, TypeError):
                if time.monotonic() > deadline:
                    return "another process"
                time.sleep(0.05)


__all__ = ["LOCK_FILE", "OWNER_FILE", "RunLock", "check_out_dir"]
