"""How the agent keeps a task attempt away from the agent, the host and other attempts.

Each attempt:

- runs as the **task user** (`--run-as`; by default `muster-task`, created by the agent
  when missing, else `nobody`), never as the agent's user when the agent is root. With
  the default task user, each job's attempts run under a **uid of the job's own**
  (`job_uid`: the same on every host and for every try, from `--job-uids`, with a group of
  the same number), so that no task can read another job's environment, working
  directory or processes; only tasks using a GPU on a host where CUDA MPS runs (its
  server serves one uid at a time, and every CUDA program reaches it) run as the task
  user itself. A non-root agent cannot switch users:
  its tasks run as itself, and it says so;
- starts with a **clean environment**: `PATH` (a fixed default), `HOME`, `USER`,
  `LOGNAME`, the job's `env` (which may override those four), then the facts the agent
  sets (`task_facts`): nothing of the agent's own environment (its NATS credentials,
  tokens, settings) reaches it;
- works in a **directory of its own** (`<work root>/<attempt>`, owned by the task user,
  mode 0700, removed when the attempt ends) unless the job sets `cwd`, which the task
  user must be able to enter;
- lives in a **cgroup of its own** (agent.cgroups) with the job's CPU and memory, a pids
  limit and (cgroup v1) no access to the GPUs it was not given (a MIG task is given its
  instances' parent GPUs); the whole cgroup is
  killed when the attempt is stopped or its first process ends, so no descendant
  survives it; an attempt whose process the kernel killed for memory ends FAILED with
  the reason `oom-killed: ...`.

The agent's own files (state directory, runs, watchdog directory, launch specs) are
private to the agent's user (mode 0700), and the work root is only traversable (0711).
`describe()` is what the agent logs at start and sends in its heartbeats; a host where
attempts are not confined (no usable cgroup with a memory limit, or tasks running as the
agent's user or root) is shown "not isolated".
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from agent import cgroups
from agent.launch import END_WIDTH, NOT_ENDED
from agent.watchdog import run_record
from wire.errors import ConfigError
from wire.messages import Task
from wire.owndir import own_dir

log = logging.getLogger(__name__)

# A launcher's record of its task's end read at an agent's start is taken no longer than this
# after it was written (Isolation.ended_while_away): older, the try was long since replaced.
EXIT_KEPT_S = 7 * 86400.0

LAUNCHER = str(Path(__file__).with_name("launch.py"))
DEFAULT_TASK_USER = "muster-task"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_PIDS_MAX = 8192
# The least memory an attempt is limited to, whatever it asked for (a process needs some
# to start at all: a job asking for 1 MB would be killed before its first instruction).
MIN_MEMORY_LIMIT_MB = 32
OOM_REASON = "oom-killed"
CGROUP_MODES = ("auto", "v2", "v1", "off")
# The environment of the launcher itself (it may run as root before switching users).
LAUNCH_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
_GPU_DEVICE = re.compile(r"^nvidia(\d+)$")


# Each job's uid (and gid): START + a hash of its id modulo COUNT, far above the ids of
# users and of containers' subordinate ranges (`--job-uids START:COUNT`, or "off").
DEFAULT_JOB_UIDS = (3_000_000, 1_000_000)


def parse_job_uids(text: str | None) -> tuple[int, int] | None:
    """`--job-uids`: "START:COUNT", "off" (None), or None/"" for the default. Raises
    ConfigError."""
    if not text:
        return DEFAULT_JOB_UIDS
    if text == "off":
        return None
    start_s, _, count_s = text.partition(":")
    try:
        start, count = int(start_s), int(count_s)
    except ValueError:
        raise ConfigError(f"--job-uids must be START:COUNT or off, not {text!r}") from None
    if start < 1000 or count < 1 or start + count > 2**31 - 2:
        raise ConfigError("--job-uids: START at least 1000, COUNT at least 1, START+COUNT below 2**31")
    return start, count


def job_uid(key: str, uids: tuple[int, int]) -> int:
    """The uid a job's attempts run as, from its uid key (Task.uid_key: a secret the control
    plane drew for the job; its id for a job stored before uid keys): the same for the job
    wherever and whenever it runs (a checkpoint one try writes, the next can read), another
    job's with odds of one in COUNT that no client can steer."""
    start, count = uids
    return start + int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % count


def attempts_pids_cap(pid_max_path: str = "/proc/sys/kernel/pid_max") -> int:
    """How many processes and threads all attempts may have together: the kernel's
    `pid_max` less a quarter of it (at least 1,024) kept for the agent and the system
    (an exploration's reckoning, not run: four fork bombs, each within its attempt's limit,
    could take every process id of a host whose pid_max is 32,768); 0 when it cannot be
    read."""
    try:
        with open(pid_max_path) as f:
            pid_max = int(f.read().strip())
    except (OSError, ValueError):
        return 0
    return max(1, pid_max - max(1024, pid_max // 4))


def remove_tree(path: Path | str) -> None:
    """Remove a directory tree, errors ignored, however deep. Python's `shutil.rmtree`
    recurses a level a directory, holding a file handle for each: past about a thousand
    levels it raises RecursionError, which `ignore_errors` does not catch (found by
    exploring: a task's deep directory left its try never reported, its GPUs held, and the
    agent unable to start again), or runs out of file handles first and leaves the tree (a
    review). Whatever it leaves is removed by `rm -rf` (no depth limit; it follows no
    link and stays on one file system). Blocking."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        pass
    if not os.path.lexists(path):
        return
    log.warning("%s was not removed whole: removing the rest with rm -rf", path)
    rm = "/bin/rm" if os.path.exists("/bin/rm") else "rm"
    try:
        subprocess.run([rm, "-rf", "--one-file-system", "--", str(path)], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("cannot remove %s: %s", path, exc)

@dataclass(frozen=True)
class TaskUser:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    @property
    def switches(self) -> bool:
        """Whether tasks run as another user than the agent's."""
        return self.uid != os.geteuid()


def _lookup(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"--run-as: no user {name!r} on this host") from exc


def _user(pw: pwd.struct_passwd) -> TaskUser:
    try:
        groups = tuple(sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid))))
    except OSError:
        groups = (pw.pw_gid,)
    return TaskUser(pw.pw_name, pw.pw_uid, pw.pw_gid, groups)


def _create_task_user() -> pwd.struct_passwd | None:
    """Make the dedicated task user (a system user without a home or login shell)."""
    useradd = shutil.which("useradd")
    if useradd is None:
        return None
    try:
        subprocess.run([useradd, "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell",
                        "/usr/sbin/nologin", "--user-group", DEFAULT_TASK_USER],
                       check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("cannot create the task user %s: %s", DEFAULT_TASK_USER, exc)
    try:
        return pwd.getpwnam(DEFAULT_TASK_USER)
    except KeyError:
        return None


def resolve_user(run_as: str | None) -> tuple[TaskUser, str]:
    """The user tasks run as, and a warning when it does not keep them from the agent."""
    me = pwd.getpwuid(os.geteuid())
    if os.geteuid() != 0:
        if run_as and _lookup(run_as).pw_uid != me.pw_uid:
            raise ConfigError(f"--run-as {run_as}: only an agent running as root can run tasks as another user")
        return (_user(me), f"tasks run as the agent's own user {me.pw_name!r} (the agent is not root): "
                           f"they can read and change everything that user can, the agent's credentials included")
    if run_as:
        pw = _lookup(run_as)
        warning = "tasks run as root: they can read the agent's credentials and do anything on this host" \
            if pw.pw_uid == 0 else ""
        return _user(pw), warning
    try:
        return _user(pwd.getpwnam(DEFAULT_TASK_USER)), ""
    except KeyError:
        pass
    pw_new = _create_task_user()
    if pw_new is not None:
        log.info("created the task user %s (uid %d)", pw_new.pw_name, pw_new.pw_uid)
        return _user(pw_new), ""
    return _user(pwd.getpwnam("nobody")), ""


def gpu_devices(dev_dir: str = "/dev") -> dict[int, tuple[int, int]]:
    """minor number N of /dev/nvidiaN -> (major, minor) of the device file."""
    out: dict[int, tuple[int, int]] = {}
    try:
        names = os.listdir(dev_dir)
    except OSError:
        return out
    for name in names:
        m = _GPU_DEVICE.match(name)
        if not m:
            continue
        try:
            st = os.stat(os.path.join(dev_dir, name))
        except OSError:
            continue
        if os.major(st.st_rdev) or os.minor(st.st_rdev):
            out[int(m.group(1))] = (os.major(st.st_rdev), os.minor(st.st_rdev))
    return out


def denied_devices(gpu_indices: list[int], devices: dict[int, tuple[int, int]],
                   minors: dict[int, int] | None = None) -> tuple[tuple[int, int], ...]:
    """The GPU device files an attempt given `gpu_indices` may not open: every
    /dev/nvidiaN but those of its GPUs (`minors`: GPU index -> N, the index itself when
    unknown). The control devices (nvidiactl, nvidia-uvm, ...) and the MIG capability
    files (/dev/nvidia-caps/*) stay open."""
    mine = {(minors or {}).get(i, i) for i in gpu_indices}
    return tuple(sorted(dev for n, dev in devices.items() if n not in mine))


def device_gpus(t: Task, mig_parents: dict[str, int]) -> list[int]:
    """The GPUs whose device files attempt `t` needs: its whole GPUs (or its share's) and
    the parent GPU of each of its MIG instances (CUDA opens an instance through its parent's
    /dev/nvidiaN and /dev/nvidia-caps). An instance of unknown parent opens none."""
    unknown = [u for u in t.mig if u not in mig_parents]
    if unknown:
        log.warning("attempt %s: no GPU of this host holds MIG instance(s) %s: their GPU's device file stays "
                    "closed", t.attempt_id, ", ".join(unknown))
    return sorted({*t.gpu_indices, *(mig_parents[u] for u in t.mig if u in mig_parents)})


def task_facts(t: Task, host_id: str) -> dict[str, str]:
    """The MUSTER_* variables every attempt gets (docs/configuration.md). A gang's
    MUSTER_GANG_TASK, MUSTER_GANG_SIZE and MUSTER_GANG_HOSTS come with the task's env
    from the scheduler."""
    return {
        "MUSTER_JOB_ID": t.job_id,
        "MUSTER_ATTEMPT_ID": t.attempt_id,
        "MUSTER_ATTEMPT": str(t.number),
        "MUSTER_TASK_INDEX": t.env.get("MUSTER_GANG_TASK", "0"),
        "MUSTER_GANG_SIZE": t.env.get("MUSTER_GANG_SIZE", "1"),
        "MUSTER_HOST_ID": host_id,
    }


def clean_env() -> dict[str, str]:
    """What an attempt's environment starts from, before the job's env."""
    return {"PATH": DEFAULT_PATH}


def task_end(path: Path) -> int | None:
    """The wait status a launcher wrote in its record of the task's end (agent/launch.py),
    or None: no record, or one made when the task started that was never written over
    (the task runs on, or its launcher was killed)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


@dataclass
class Launch:
    """One attempt made ready to start: the launcher's argv (the status fd is appended)
    and what to undo when it ends."""

    argv: list[str]
    group: cgroups.Group | None
    work_dir: Path | None  # made for this attempt, removed at its end
    spec: Path | None = None  # the launcher removes it once read
    exit_file: Path | None = None  # where the launcher writes the task's wait status (removed at its end)


class Isolation:
    """The agent's way of running attempts (see the module docstring)."""

    def __init__(self, host_id: str, *, run_as: str | None = None, cgroup_mode: str = "auto",
                 pids_max: int = DEFAULT_PIDS_MAX, work_root: Path | None = None, private_dir: Path,
                 dev_dir: str = "/dev", gpu_minors: dict[int, int] | None = None,
                 mig_parents: dict[str, int] | None = None, cgroup_name: str | None = None,
                 job_uids: str | None = None) -> None:
        if cgroup_mode not in CGROUP_MODES:
            raise ConfigError(f"--cgroups must be one of {', '.join(CGROUP_MODES)}")
        self.host_id = host_id
        self.user, user_warning = resolve_user(run_as)
        uids = parse_job_uids(job_uids)
        # A uid per job where the agent may switch users and runs tasks as the default task
        # user (a user named with --run-as is the operator's choice: its files, its access).
        self.job_uids = uids if (self.user.switches and self.user.uid != 0 and not run_as) else None
        self.hierarchy, cgroup_why = cgroups.detect(cgroup_mode, cgroup_name or f"muster-{host_id}")
        if self.hierarchy is not None and pids_max > 0:
            self.hierarchy.cap_pids(attempts_pids_cap())
        self.pids_max = pids_max
        self.dev_dir = dev_dir
        self.gpu_minors = gpu_minors
        # MIG instance uuid -> the index of its GPU (the GPU inventory's, read at the start as
        # the MIG layout is): a MIG task has no GPU index, only its instances.
        self.mig_parents = dict(mig_parents or {})
        self.private_dir = private_dir
        # The launchers' records of their tasks' ends (agent/launch.py: `exit_file`).
        self.exits_dir = private_dir / "exits"
        try:
            self.own_dirs()
        except OSError as exc:
            raise ConfigError(str(exc)) from exc
        self._own_root = work_root is None
        # Base names and cgroup mounts a run record's cgroups must be under (kill_leftover).
        self._leftover_bases: tuple[set[str], list[cgroups.Mount]] | None = None
        self.work_root = work_root or Path(tempfile.mkdtemp(prefix=f"muster-work-{host_id}-"))
        try:  # the task user may enter its own directory, not list; one another user made is refused
            own_dir(self.work_root, "the directory for attempts", mode=0o711)
        except OSError as exc:
            raise ConfigError(str(exc)) from exc
        self.warnings: list[str] = []
        if user_warning:
            self.warnings.append(user_warning)
        if self.hierarchy is None:
            self.warnings.append(f"no cgroups ({cgroup_why}): attempts have no CPU, memory or pids limit, "
                                 f"and a process that leaves its process group survives a stop")
        else:
            missing = self.hierarchy.limits_missing()
            if missing:
                self.warnings.append(f"{self.hierarchy.describe()}: no {', '.join(missing)} limit")
            self.warnings.extend(self.hierarchy.notes)
        confined = self.hierarchy is not None and "memory" in self.hierarchy.controllers
        self.isolated = confined and self.user.switches and self.user.uid != 0

    def own_dirs(self) -> None:
        """Make the launchers' directory and the one of their records of tasks' ends, if
        gone, only as the agent's own (wire.owndir). Raises OSError."""
        own_dir(self.private_dir, "the launchers' directory")
        own_dir(self.exits_dir)

    def describe(self) -> str:
        """One line for the heartbeat and the log."""
        cg = self.hierarchy.describe() if self.hierarchy is not None else "no cgroups"
        if self.job_uids is not None:
            start, count = self.job_uids
            who = f"tasks run as {self.user.name} with a uid per job ({start}-{start + count - 1})"
        elif self.user.switches:
            who = f"tasks run as {self.user.name}"
        else:
            who = f"tasks run as the agent's user {self.user.name}"
        return f"{cg}; {who}"

    def ids_for(self, t: Task, shared_user: bool = False) -> tuple[int, int, list[int]]:
        """(uid, gid, groups) attempt `t` runs as: its job's own uid and group, with the task
        user's other groups (device access); the task user's when uids per job are off or
        the task must share the task user (`shared_user`: a GPU task where CUDA MPS runs)."""
        if self.job_uids is None or shared_user:
            return self.user.uid, self.user.gid, list(self.user.groups)
        uid = job_uid(t.uid_key or t.job_id, self.job_uids)
        return uid, uid, [uid, *(g for g in self.user.groups if g != self.user.gid)]

    def log_start(self) -> None:
        if self.isolated:
            log.info("isolation: %s", self.describe())
        else:
            log.error("THIS HOST DOES NOT ISOLATE TASKS: %s", self.describe())
        for w in self.warnings:
            log.warning("isolation: %s", w)

    # ------------------------------------------------------------ one attempt

    def prepare(self, t: Task, env: dict[str, str], shared_user: bool = False, run_file: Path | None = None) -> Launch:
        """Make attempt `t` ready to start with `env`: its cgroup, its working directory and
        the launcher's spec, for the uid it runs as (`ids_for`), with `run_file`, where the
        launcher records the try before it runs (agent.watchdog.run_record). Raises OSError
        (the attempt fails to start)."""
        group = None
        work_dir = None
        uid, gid, groups = self.ids_for(t, shared_user)
        try:
            if self.hierarchy is not None:
                deny: tuple[tuple[int, int], ...] = ()
                if "devices" in self.hierarchy.controllers:
                    deny = denied_devices(device_gpus(t, self.mig_parents), gpu_devices(self.dev_dir),
                                          self.gpu_minors)
                limits = cgroups.Limits(cpus=t.cpus, memory_mb=max(t.memory_mb, MIN_MEMORY_LIMIT_MB),
                                        pids=self.pids_max, deny_devices=deny)
                group = self.hierarchy.create(t.attempt_id, limits)
            cwd = t.cwd
            if not cwd:
                work_dir = self._work_root() / t.attempt_id
                work_dir.mkdir(mode=0o700)
                os.chown(work_dir, uid, gid, follow_symlinks=False)
                cwd = str(work_dir)
            env = dict(env)
            # Under a uid of its job's own, a name of that uid's own: tools that key a cache by
            # the user's name (`/tmp/<tool>_<user>`) shared it, and what one job planted there
            # another ran (found by exploring).
            name = self.user.name if uid == self.user.uid else f"{self.user.name}-{uid}"
            for k, v in (("HOME", str(work_dir or cwd)), ("USER", name), ("LOGNAME", name)):
                env.setdefault(k, v)
            env["MUSTER_WORK_DIR"] = cwd
            exit_file = self.exit_file(t.attempt_id)
            exit_file.unlink(missing_ok=True)  # (an earlier start's, never this try's end)
            spec: dict[str, object] = {
                "cgroup_procs": group.procs_files() if group is not None else [],
                "user": name, "cwd": cwd, "command": list(t.command), "env": env,
                "exit_file": str(exit_file),
            }
            if run_file is not None:
                spec["run_record"] = {"path": str(run_file), "line": run_record(
                    "%PID%", "%START%", t.keep_running, "%SUP%", "%SUPSTART%",
                    group.paths if group is not None else (), str(work_dir) if work_dir is not None else None)}
            if self.user.switches:
                spec.update(uid=uid, gid=gid, groups=groups)
            fd, spec_path = tempfile.mkstemp(prefix=f"{t.attempt_id}.", suffix=".json", dir=self.private_dir)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(spec, f)
            except OSError:
                # (a disk full: the empty file was left behind for good, found by exploring)
                Path(spec_path).unlink(missing_ok=True)
                raise
        except OSError:
            self._undo(group, work_dir)
            raise
        return Launch([sys.executable, "-I", "-S", LAUNCHER, spec_path], group, work_dir, Path(spec_path),
                      exit_file)

    def exit_file(self, attempt_id: str) -> Path:
        """Where the launcher of `attempt_id` writes its task's wait status."""
        return self.exits_dir / attempt_id

    def ended_while_away(self) -> dict[str, int]:
        """The wait statuses the launchers wrote that no agent read (their tasks ended while
        no agent ran), by attempt (read at an agent's start, before it kills what is left:
        the end of a task that start kills is not one of these). The records stay until the
        STATUS stream took the report made from each (`forget_exit`): found by exploring, an
        agent killed between reading them and reporting left the next one nothing to go by,
        and a task that had finished was reported LOST and run again. Half-written ones,
        records of no task's end, and records a week old (a try long since replaced, whose
        end no assignment asks for) are removed."""
        out: dict[str, int] = {}
        old = time.time() - EXIT_KEPT_S
        for f in self.exits_dir.iterdir():
            status = None if f.name.endswith(".tmp") else task_end(f)
            try:
                stale = f.stat().st_mtime < old
            except OSError:
                stale = True
            if status is not None and not stale:
                out[f.name] = status
            else:
                f.unlink(missing_ok=True)
        return out

    def keep_end_record(self, attempt_id: str, status: int | None = None) -> None:
        """Make again, if gone, a launcher's record of its task's end: "running" (room made
        for the end, which the launcher writes over in place: a disk filled meanwhile does
        not refuse it), or the wait status `status` it wrote. Never over a record there (the
        task may have ended meanwhile, and its launcher written its end). Raises OSError."""
        text = (str(status) if status is not None else NOT_ENDED).encode()
        try:
            fd = os.open(self.exit_file(attempt_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return
        try:
            os.write(fd, text.ljust(END_WIDTH - 1)[:END_WIDTH - 1] + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)

    def forget_exit(self, attempt_id: str) -> None:
        """Remove a launcher's record of its task's end, once the STATUS stream took the
        report made from it (or the end is no task's own: a leftover the agent killed)."""
        self.exit_file(attempt_id).unlink(missing_ok=True)

    @staticmethod
    def unconfined(t: Task, env: dict[str, str]) -> Launch:
        """A launch without isolation (a Run made without an agent's Isolation): the
        agent's user, the job's cwd or the current directory, no cgroup."""
        spec = {"cwd": t.cwd or os.getcwd(), "command": list(t.command), "env": env}
        fd, spec_path = tempfile.mkstemp(prefix="muster-launch-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(spec, f)
        return Launch([sys.executable, "-I", "-S", LAUNCHER, spec_path], None, None, Path(spec_path))

    @staticmethod
    def _undo(group: cgroups.Group | None, work_dir: Path | None) -> None:
        if group is not None:
            group.kill(wait_s=1.0)
            group.remove()
        if work_dir is not None:
            remove_tree(work_dir)

    @staticmethod
    def sweep(launch: Launch) -> None:
        """Kill whatever of the attempt is still running (blocking: call in a thread)."""
        if launch.group is not None and not launch.group.kill():
            log.warning("processes of attempt cgroup %s survive SIGKILL", launch.group.name)

    @staticmethod
    def release(launch: Launch) -> None:
        """Remove the attempt's cgroup and working directory (blocking). Its launcher's
        record of the task's end stays until the STATUS stream took the report of that end
        (the agent removes it then, `forget_exit`): a restart in between reads the end from it."""
        if launch.spec is not None:
            launch.spec.unlink(missing_ok=True)
        if launch.group is not None and not launch.group.remove():
            log.warning("cannot remove cgroup %s: %s", launch.group.name, launch.group.paths)
        if launch.work_dir is not None:
            remove_tree(launch.work_dir)

    def _work_root(self) -> Path:
        """The directory attempts' directories are made in, the agent's own: a directory
        owned by the agent's user that no one else may write to. One removed under the agent
        (a temporary directory's cleaner: found by exploring, every try failed) is made
        again, but never taken over: its path is in every task's environment, and a job
        that made it there in the meantime (open to all) moved other users' attempt
        directories aside and put its own in their place (found by exploring: another
        user's job ran in it). The agent's own temporary root is replaced by a new one of
        a name no one knows; a root named by the operator (`--work-dir`) is made again only
        where nothing is at its path, and one that is not the agent's fails the try (the
        host's trouble)."""
        root = self.work_root
        try:
            st = os.lstat(root)
            if stat.S_ISLNK(st.st_mode) and not self._own_root and st.st_uid == os.geteuid():
                st = os.stat(root)  # the operator's own link (a review: one a job planted is not taken)
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
                return root
            if not self._own_root:
                raise OSError(errno.EPERM, f"the directory for attempts {root} is not the agent's (owner uid "
                                           f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): no attempt's "
                                           f"directory is made in it")
        if self._own_root:
            self.work_root = Path(tempfile.mkdtemp(prefix=f"muster-work-{self.host_id}-"))
            os.chmod(self.work_root, 0o711)
            log.warning("the directory for attempts %s was removed or replaced: attempts' directories are made in "
                        "%s from now on", root, self.work_root)
            return self.work_root
        root.mkdir(parents=True)  # not exist_ok: one made by someone else meanwhile is not taken
        os.chmod(root, 0o711)
        log.warning("the directory for attempts %s was removed: made again", root)
        return root

    def remove_leftover_dir(self, work_dir: Path, attempt_id: str) -> None:
        """A previous agent's attempt directory (from its runs file): removed, and the work
        root it was made in too once empty, unless it is this agent's. Only a directory
        named for the attempt is touched, in this agent's work root or one of the host's
        earlier temporary ones."""
        if work_dir.name != attempt_id or not work_dir.is_absolute():
            return
        root = work_dir.parent
        if root != self.work_root and not (root.name.startswith(f"muster-work-{self.host_id}-")
                                           and root.parent == Path(tempfile.gettempdir())):
            log.warning("a run record names %s for attempt %s, not in a directory for attempts: left alone",
                        work_dir, attempt_id)
            return
        remove_tree(work_dir)
        if root != self.work_root:  # (an earlier temporary one, checked above)
            with contextlib.suppress(OSError):
                root.rmdir()  # (only if empty: another agent's attempts may still be there)

    def cgroup_bases(self) -> list[str]:
        """The directories the attempts' cgroups are made in (none without cgroups)."""
        return sorted(self.hierarchy.bases.values()) if self.hierarchy is not None else []

    def kill_leftover(self, paths: list[str]) -> None:
        """A previous agent's attempt cgroup (from its runs file): kill and remove it (only
        an attempt cgroup of a base named as this agent's, in a cgroup hierarchy: a previous
        agent started from another login session had its bases elsewhere)."""
        if self._leftover_bases is None:  # worked out once for every record of a restart
            names = {os.path.basename(b) for b in self.hierarchy.bases.values()} if self.hierarchy else set()
            self._leftover_bases = (names, cgroups.mounts())
        names, found = self._leftover_bases
        ours, others = cgroups.attempt_cgroups(paths, names, found)
        if others:
            log.warning("a run record names cgroups outside the agent's: %s left alone", sorted(set(others)))
        cgroups.kill_paths(ours)
        cgroups.remove_paths(ours)

    def remove_empty_leftovers(self) -> None:
        """Remove the empty attempt cgroups a killed agent left behind. Called once this
        agent holds its state directory: another agent of the host still running could have
        just made one of its own, not yet holding its task."""
        if self.hierarchy is not None:
            for g in self.hierarchy.leftovers():
                if not g.pids():
                    cgroups.remove_paths(g.paths)

    def close(self) -> None:
        """At the agent's clean shutdown: remove what it made (empty bases only)."""
        if self.hierarchy is not None:
            for g in self.hierarchy.leftovers():
                if not g.pids():
                    cgroups.remove_paths(g.paths)
            cgroups.remove_paths(self.hierarchy.bases.values())
        if self._own_root:
            remove_tree(self.work_root)
