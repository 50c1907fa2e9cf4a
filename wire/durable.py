"""Files that outlive a crash of the machine, not only of the process: written whole
under a temporary name, synced, put in place by a rename, and the directory that names
them synced too. An fsync of a file makes its data durable, not its name: a rename (or a
new file) is a change of its directory, lost with the page cache until that directory is
synced (POSIX; ext4 and XFS alike)."""

from __future__ import annotations

import os
from pathlib import Path

TMP = ".tmp"  # what a file being written is named after its place: `<name>.tmp`


def sync_dir(path: Path | str) -> None:
    """fsync directory `path`: the names made, renamed or removed in it are durable once
    this returns. Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes) -> None:
    """Put `data` at `path` whole, or leave what was there: written to `<path>.tmp`, synced,
    renamed over `path`, and `path`'s directory synced. A temporary file left by a failure
    (a disk full) is removed. Raises OSError."""
    tmp = path.with_name(path.name + TMP)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    sync_dir(path.parent)
