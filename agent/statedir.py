"""The agent's state directory, watched while the agent runs.

What the agent keeps there (docs/failures.md) is what a restarted agent goes by: its
lock (`<host>.lock`: one agent a directory), its instance (`<host>.instance`: a restart
recognises its own previous agent's heartbeat), the tries it started (`<host>.seen`),
the running tries' records (`<host>.runs/`: what a restart kills, what the watchdog
stops), the reports not yet delivered (`<host>.reports/`) and the launchers' directory
(`<host>.launch/`, the launch specs and the records of the tasks' ends). Removed under a
running agent (an operator's `rm -rf`, a temporary files' cleaner), it was made again
empty, piece by piece as the agent next wrote each; the launchers' directory never was
(every later try failed to start), and a restart after a kill -9 found no record of the
tries still running, nor the instance, and took the stateless path while the old tasks
ran on (found by an exploration). `StateWatch` tells, at each heartbeat, whether any of
it is no longer what the agent made (gone, or another file or directory in its place:
its device and inode), and the agent then writes it all again (Agent._write_state_again).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable
from pathlib import Path

Identity = tuple[int, int]  # (device, inode)


def identity(path: Path) -> Identity | None:
    """What `path` is (not following a link), None when there is nothing there."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def take_lock(path: Path) -> int:
    """Open `path` (made 0600 when missing) and hold an exclusive lock on it for as long as
    the returned descriptor is open. Raises OSError (BlockingIOError: another process
    holds it)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


class StateWatch:
    """The directories and files the agent made in its state directory, as they were when
    it made them (`mark`), and the lock file the agent holds."""

    def __init__(self, paths: Iterable[Path], lock: Path) -> None:
        self.paths = list(paths)
        self.lock = lock
        self._known: dict[Path, Identity] = {}

    def mark(self) -> None:
        """Take what is at each path now as the agent's (a path with nothing there is not
        looked at until it has something)."""
        self._known = {p: i for p in self.paths if (i := identity(p)) is not None}

    def lock_held(self, fd: int | None) -> bool:
        """Whether the lock file at its path is the one the agent holds the lock of (`fd`)."""
        if fd is None:
            return False
        st = os.fstat(fd)
        return identity(self.lock) == (st.st_dev, st.st_ino)

    def lost(self, lock_fd: int | None, needed: Iterable[Path] = ()) -> list[str]:
        """What is no longer what the agent made, in words ([] when nothing is): a path gone
        or replaced, the lock file not the one held, a `needed` file missing."""
        out = []
        for p, known in self._known.items():
            now = identity(p)
            if now != known:
                out.append(f"{p.name} {'removed' if now is None else 'replaced'}")
        if lock_fd is not None and not self.lock_held(lock_fd):
            out.append(f"{self.lock.name} {'removed' if identity(self.lock) is None else 'replaced'}")
        out += [f"{p.name} removed" for p in needed if identity(p) is None]
        return out
