"""The first process of every task attempt: joins the attempt's cgroups, becomes the task
user, enters the working directory as that user, and execs the job's command.

    python -I -S agent/launch.py SPEC STATUS_FD

The agent (agent.runner) starts it with an empty environment (so nothing the job chose,
such as LD_PRELOAD, reaches a process that may still be root) and SPEC, a JSON file in
the agent's private directory that it reads and removes at once:

    {"cgroup_procs": [...], "uid": 1001, "gid": 1001, "groups": [1001], "user": "muster-task",
     "cwd": "/path", "umask": 18, "command": ["python", "train.py"], "env": {...}}

`uid`, `gid` and `groups` are absent when the task runs as the agent's own user. Joining
the cgroups before anything of the job runs puts every descendant in them (a double fork
or `setsid` cannot leave). The working directory is entered after the switch of user, so
a directory the task user may not use is refused here. The command is looked up on the
job's PATH and exec'd in place of this process, which keeps its pid.

On any failure before the exec it writes one line to STATUS_FD (closed on exec, so the
agent reads nothing when the exec succeeded) and exits 127. A failure that is the host's
want, not the job's fault (its spec unreadable, a cgroup it cannot join, a user it cannot
become, an exec refused for want of memory, processes or file handles), begins with
`host: ` (agent.runner.HOST_FAILURE).

Standard library only; no import of the rest of Muster.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import warnings  # noqa: F401  # os.execvpe imports it: loaded before the switch of user

HOST_FAILURE = "host: "  # begins a failure that is the host's, not the job's
# An exec refused for one of these is the host's want.
HOST_ERRNOS = frozenset({errno.ENOMEM, errno.EAGAIN, errno.ENFILE, errno.EMFILE, errno.ENOSPC, errno.EIO})


def fail(status_fd: int, message: str, host: bool = False) -> None:
    try:
        os.write(status_fd, ((HOST_FAILURE if host else "") + message).encode(errors="replace")[:2000])
    except OSError:
        pass
    os._exit(127)


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        sys.stderr.write("usage: launch.py SPEC STATUS_FD\n")
        os._exit(2)
    status_fd = int(argv[1])
    os.set_inheritable(status_fd, False)  # closed by the exec: nothing read means it worked
    try:
        with open(argv[0]) as f:
            spec = json.load(f)
        os.unlink(argv[0])
    except (OSError, ValueError) as exc:
        fail(status_fd, f"cannot read the launch spec: {exc}", host=True)
        return
    pid = str(os.getpid())
    for procs in spec.get("cgroup_procs", []):
        try:
            with open(procs, "w") as f:
                f.write(pid)
        except OSError as exc:
            fail(status_fd, f"cannot join cgroup {os.path.dirname(procs)}: {exc}", host=True)
    # Nothing of the agent's from here on: `/proc/self/cwd` as the job's `cwd` started the
    # task in the agent's own working directory (found by exploring).
    os.chdir("/")
    user = spec.get("user", "")
    if spec.get("uid") is not None:
        try:
            os.setgroups(spec.get("groups") or [spec["gid"]])
            os.setgid(spec["gid"])
            os.setuid(spec["uid"])
        except (OSError, KeyError) as exc:
            fail(status_fd, f"cannot run as user {user!r}: {exc}", host=True)
    os.umask(int(spec.get("umask", 0o022)))
    cwd = spec.get("cwd")
    if cwd:
        try:
            os.chdir(cwd)
        except OSError as exc:
            fail(status_fd, f"cannot use working directory {cwd!r} as user {user!r}: {exc.strerror}")
    command = spec["command"]
    try:
        os.execvpe(command[0], command, spec.get("env", {}))
    except Exception as exc:  # noqa: BLE001 - whatever it is, the attempt did not start
        fail(status_fd, f"cannot start {command[0]!r}: {exc}",
             host=isinstance(exc, OSError) and exc.errno in HOST_ERRNOS)


if __name__ == "__main__":
    main(sys.argv[1:])
