"""A directory that is this process's user's alone: the agent's state directory (the
launch specs its root launcher runs, the run records its restarts kill and remove by) and
the server's data directory (the admin token, the SQLite history with every job's env).

Found by exploring: a job that made an agent's state directory in /tmp before the agent
ran its own command as root through a launch spec it put there, and had a root-owned
directory removed through a run record; a server's data directory made first by another
user took the admin token into that user's file through a link. Such a directory is made,
or taken only when it is this user's and no one else can change it or what leads to it.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
from pathlib import Path


class NotOwnDir(PermissionError):
    """What is wrong with a directory own_dir refused, said in words (no errno prefix)."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EPERM, message)

    def __str__(self) -> str:
        return str(self.strerror)


def _private_group(gid: int, uid: int) -> bool:
    """Whether group `gid` is user `uid`'s own (the user private group a umask of 002
    writes for: its primary group, of its name, no other member)."""
    try:
        g, u = grp.getgrgid(gid), pwd.getpwuid(uid)
    except KeyError:
        return False
    return g.gr_gid == u.pw_gid and g.gr_name == u.pw_name and not g.gr_mem


def _others_write(st: os.stat_result) -> bool:
    """Whether users other than its owner may write to it: others, or a group that is not
    the owner's own."""
    return bool(st.st_mode & 0o002) or (bool(st.st_mode & 0o020) and not _private_group(st.st_gid, st.st_uid))


def _safe(st: os.stat_result, me: int) -> bool:
    """A directory or link on the way that no other user can change: owned by root or this
    user, and not writable by others unless sticky (as /tmp: others cannot move what is
    this user's in it)."""
    if st.st_uid not in (0, me):
        return False
    if stat.S_ISLNK(st.st_mode):
        return True
    return not _others_write(st) or bool(st.st_mode & stat.S_ISVTX)


def _check_chain(path: Path, me: int) -> None:
    for above in reversed(path.parents):
        st = os.lstat(above)
        if not _safe(st, me):
            raise NotOwnDir(f"{above}, on the way to {path}, may be changed by another user "
                                               f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")


# Directories own_dir took, by path: (device, inode, owner, mode) as they were then. The
# agent asks again at each try (a directory removed under it is made again only as its
# own); while one is the very directory taken, unchanged, that is one lstat, not the walk.
_taken: dict[Path, tuple[int, int, int, int]] = {}


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_uid, st.st_mode


def _make(path: Path) -> None:
    """Make `path`'s missing directories: those above it 0755 and itself 0700, whatever
    the umask (one of 002 would leave them writable by the group)."""
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for p in reversed(missing):
        mode = 0o700 if p == path else 0o755
        try:
            os.mkdir(p, mode)
        except FileExistsError:
            continue
        os.chmod(p, mode)


def own_dir(path: Path, what: str = "directory", mode: int = 0o700) -> Path:
    """Make `path` (the directories above it too) or take it as it is, once it is sure to
    be this process's user's alone: a directory (or a link to one, of root or this user)
    owned by this user, no other user able to write to it, to the directories above it or
    to those its links lead through (a group that is the user's own private group, as a
    umask of 002 leaves, is the user). It is then given `mode` (private by default; the
    work root lets tasks enter their own directories, 0711). Raises NotOwnDir (a
    PermissionError) naming what is wrong, before anything is read from or written into it."""
    path = Path(os.path.abspath(path))
    try:
        if _taken.get(path) == _identity(os.lstat(path)):
            return path
    except OSError:
        pass
    me = os.geteuid()
    _make(path)
    _check_chain(path, me)  # as named: no link or directory on the way another user can change
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, me):
        raise NotOwnDir(f"{what} {path} is a link of another user (uid {st.st_uid})")
    real = Path(os.path.realpath(path))
    if real != path:
        _check_chain(real, me)  # and where its links lead
    st = os.stat(real)
    if not stat.S_ISDIR(st.st_mode):
        raise NotOwnDir(f"{what} {path} is not a directory")
    if st.st_uid != me:
        raise NotOwnDir(f"{what} {path} is not this user's directory (owner uid {st.st_uid}, "
                                           f"this user {me}): someone else made it; remove it, or choose another")
    if _others_write(st):
        raise NotOwnDir(f"{what} {path} may be written by other users (mode "
                                           f"{stat.S_IMODE(st.st_mode):o}): what is in it cannot be trusted; check "
                                           "what it holds, make it 0700, and start again")
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(real, mode)
    _taken[path] = _identity(os.lstat(path))
    return path
