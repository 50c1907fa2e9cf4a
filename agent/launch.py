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
job's PATH and exec'd.

With `"exit_file": PATH` in the spec (the agent's own attempts), this process forks first
(and with `"run_record": {"path": ..., "line": ...}` writes the try's record for the
agent's watchdog before the task goes on: agent.watchdog.run_record)
and stays, as root and outside the attempt's cgroups, the parent of the task: it makes
PATH first ("running", fsync'd), waits for the task, writes its wait status over it in
place (fsync'd: no new room needed on a disk filled meanwhile) and ends as it did (its exit
code, or killed by the same signal). The task's exit is then known also when it comes
while the agent is dead: its next start reports the try's real end, not LOST (found by
exploring: a try that succeeded while its agent was down was run again, and a job with
one attempt ended FAILED). The task leads a session and process group of its own, as when
this process exec'd it (`kill -- -$$` in a task's script is its own group); this process
writes `pid: <task pid>` to STATUS_FD first, so that the agent signals the task's group,
and ignores every signal it can (a task of the agent's own user may signal its parent).

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
import resource
import signal
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


TASK_PID = "pid: "  # begins the line that names the task's pid (agent.runner reads it)
GO = b"g"  # what the supervisor tells the task's process to go on with
# What the supervisor ignores: every signal it may (a handler, not SIG_IGN, which an exec
# would pass on to the task).
CAUGHT = tuple(s for s in signal.valid_signals()
               if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGCONT,
                            signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE))  # (its own faults kill it)


def _ignore(signum: int, frame: object) -> None:
    """A signal sent to the supervisor: the task's business, not its."""


def _handle(handler: object) -> None:
    for sig in CAUGHT:
        try:
            signal.signal(sig, handler)  # type: ignore[arg-type]
        except (OSError, ValueError):
            pass


def _start_time(pid: int) -> str:
    """Field 22 of /proc/<pid>/stat, "" when there is no such process (as
    agent.watchdog.start_time reads it: this file imports nothing of Muster)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2:].decode("ascii", errors="replace").split()[19]
    except (OSError, ValueError, IndexError):
        return ""


def _record(record: dict[str, str], pid: int) -> None:
    """Write the try's record for the agent's watchdog and a restarted agent (`record`:
    its path, and its line with the task's and this process's pids and start times to
    fill in: agent.watchdog.run_record). Raises OSError."""
    me = os.getpid()
    line = (record["line"].replace("%PID%", str(pid)).replace("%START%", _start_time(pid) or "-")
            .replace("%SUPSTART%", _start_time(me) or "-").replace("%SUP%", str(me)))
    with open(record["path"], "w") as f:
        f.write(line)


END_WIDTH = 16  # the bytes of the record of a task's end, its newline included
NOT_ENDED = "running"  # that record until the task ends: no wait status


def _write_end(path: str, text: str, fresh: bool = False) -> None:
    """Write the record of the task's end (`text` padded to END_WIDTH), fsync'd: over the
    record made before, in place (no new room needed), or `fresh`, a new file put in its
    place. Raises OSError."""
    data = text.encode().ljust(END_WIDTH - 1)[:END_WIDTH - 1] + b"\n"
    if not fresh:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        return
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def supervise(exit_file: str, status_fd: int, record: dict[str, str] | None = None) -> None:
    """Fork; return in the child, which goes on to become the task, in a session of its
    own. The parent writes the try's `record` (when given), names the child on
    `status_fd`, lets it go on, waits for it, writes its wait status to `exit_file` and
    ends as it did; it never returns. The child goes on only when told to: a parent that
    died or could not record it ends it before anything of the job's runs."""
    _handle(_ignore)
    try:
        go_r, go_w = os.pipe()  # the child waits for the pid line to be written first (a review)
        pid = os.fork()
    except OSError as exc:
        fail(status_fd, f"cannot fork: {exc}", host=True)
        return
    if pid == 0:
        _handle(signal.SIG_DFL)
        os.setsid()
        os.close(go_w)
        go = os.read(go_r, 1)  # once the parent has recorded and named this process
        os.close(go_r)
        if go != GO:
            os._exit(127)
        return
    os.close(go_r)
    try:
        # The record of the task's end made now, its room taken: at the end it is written
        # over in place, which a disk filled meanwhile does not refuse (found by exploring:
        # with the disk full the end went unwritten, and a try that succeeded was taken
        # for one whose launcher was killed, and ran again).
        _write_end(exit_file, NOT_ENDED, fresh=True)
    except OSError as exc:
        os.close(go_w)
        os.waitpid(pid, 0)
        fail(status_fd, f"cannot make the record of the task's end: {exc}", host=True)
        return
    if record is not None:
        # Recorded before the task runs: were the agent to die or freeze before its own
        # record of the running try (found by exploring: an agent killed in that moment
        # left its task running unknown to its watchdog and to the next agent, beside its
        # replacement), the watchdog and the next agent find it.
        try:
            _record(record, pid)
        except OSError as exc:
            os.close(go_w)
            os.waitpid(pid, 0)
            fail(status_fd, f"cannot record the try for the agent's watchdog: {exc}", host=True)
            return
    try:
        os.write(status_fd, f"{TASK_PID}{pid}\n".encode())
    except OSError:
        pass
    try:
        os.write(go_w, GO)
    except OSError:
        pass  # (the child is gone already: its end is waited for below, as any other)
    os.close(go_w)
    os.close(status_fd)  # the child's copy says whether the exec worked
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the output pipe is the task's alone: it closes when the task's side does
        os.dup2(null, fd)
    _, status = os.waitpid(pid, 0)
    try:
        _write_end(exit_file, str(status))
    except OSError:
        try:  # (its record gone, or a directory now: a new one)
            _write_end(exit_file, str(status), fresh=True)
        except OSError:
            pass  # the agent, if alive, has the status from this process's own end
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else signal.SIGKILL
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # (the task's core, if any, is the task's)
        if sig != signal.SIGKILL:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    finally:
        os._exit(128 + sig)


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        sys.stderr.write("usage: launch.py SPEC STATUS_FD\n")
        os._exit(2)
    status_fd = int(argv[1])
    os.set_inheritable(status_fd, False)  # closed by the exec: nothing read means it worked
    try:
        # The agent's own file only (not a link, nor one another user put in its place):
        # what it says runs as root until the switch of user.
        fd = os.open(argv[0], os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                raise OSError(f"{argv[0]} is not the agent's (owner uid {st.st_uid}, mode {st.st_mode & 0o777:o})")
            spec = json.load(f)
        os.unlink(argv[0])
    except (OSError, ValueError) as exc:
        fail(status_fd, f"cannot read the launch spec: {exc}", host=True)
        return
    if spec.get("exit_file"):
        supervise(spec["exit_file"], status_fd, spec.get("run_record"))
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
    # Python ignores these; an exec would pass that on (`producer | head` ran on).
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    env = spec.get("env", {})
    try:
        os.execvpe(command[0], command, env)
    except Exception as exc:  # noqa: BLE001 - whatever it is, the attempt did not start
        fail(status_fd, f"cannot start {command[0]!r}: {_why_not(command[0], exc, env.get('PATH', os.defpath))}",
             host=isinstance(exc, OSError) and exc.errno in HOST_ERRNOS)


def _why_not(program: str, exc: BaseException, path: str) -> str:
    """Why `program` could not be exec'd, in words (found by exploring: a program not on
    PATH was "No such file or directory: b'/bin/x'", the last directory tried, and a script
    whose #! interpreter is missing was said to be missing itself)."""
    if isinstance(exc, FileNotFoundError):
        found = program if "/" in program else next(
            (p for d in path.split(":") if os.path.isfile(p := os.path.join(d or ".", program))), None)
        if found is None or not os.path.exists(found):
            return "no such program" + ("" if "/" in program else f" on its PATH ({path[:300]})")
        try:
            with open(found, "rb") as f:
                head = f.read(256)
        except OSError:
            head = b""
        if head.startswith(b"#!"):
            interpreter = head[2:].split(b"\n", 1)[0].strip().split(b" ", 1)[0].decode(errors="replace")
            return f"its interpreter {interpreter!r} (its #! line) was not found"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


if __name__ == "__main__":
    main(sys.argv[1:])
