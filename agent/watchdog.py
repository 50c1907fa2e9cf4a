"""The agent's watchdog: stops the agent's attempts once the agent has stopped
heartbeating, whatever became of the agent.

A live agent cut off from NATS stops its own attempts (self-fencing, agent.agent). An
agent that was killed (kill -9, the OOM killer) and not restarted, or frozen (SIGSTOP, a
hung machine), cannot, and its attempts would run on while the control plane, seeing the
heartbeat key expire, runs them again elsewhere. So each agent starts one watchdog, in a
session of its own so that it outlives the agent:

    python -I -S agent/watchdog.py DIR RUNS AGENT_PID STALE_AFTER GRACE [DEADLINE [BASE]...]

The agent writes to DIR/alive, after every heartbeat the store took, its pid and when that
heartbeat was sent (its monotonic clock, which is the system's and so this process's
too); it touches DIR/awake twice a second while its fence loop runs; and it keeps in RUNS
one file per running attempt: `<process group> <process start time> [keep]
[sup:<launcher pid>:<its start time>] [cg:<dir>]... [wd:<dir>] [boot:<boot id>]
[kill:<when>]` (`run_record`, paths quoted; a record of another boot of the machine is
left alone: its processes are gone; `kill:`, a stop's end, is for a restarted agent), the
directories being the attempt's cgroups (agent.cgroups: each right under one
of the agent's cgroup bases, the BASE arguments; a record naming any other cgroup has
that one left alone) and the one made for it. The attempt's launcher writes it before the
task runs, the agent again once it runs.
Four times a second the watchdog looks at both. The agent is silent for as long as no
heartbeat was stored since (from the time in DIR/alive, or when the watchdog saw the file
change; a step of the wall clock changes nothing). Once it has been silent for
STALE_AFTER seconds and is not awake (DIR/awake unchanged for AWAKE_S, or the agent
gone), the watchdog writes DIR/fenced/<attempt> and sends one SIGTERM to every process in
the cgroups of every listed attempt, or to its process group when its cgroups hold none
(but `keep` ones: KEEP_RUNNING jobs opt out of fencing), continued (thawed and SIGCONT, so
that an attempt the agent froze runs its handler), and SIGKILL to the group and the
whole of its cgroups GRACE seconds later (so a double fork or `setsid` does not escape).
An awake agent fences by itself (it freezes its attempts, and continues them if its key
held): the watchdog leaves it alone until DEADLINE seconds of silence, then SIGKILLs
whatever it left. A group whose leader's start time
does not match may have been reused by something else and is not signalled; what the
attempt left in its cgroups (its own, made for it alone) is stopped all the same. The agent chooses
STALE_AFTER just over its own fence delay, and GRACE and DEADLINE so that the attempts
are dead before the heartbeat key can expire.

The watchdog exits when the agent process is gone and either another agent has taken
over DIR (DIR/alive holds another pid) or, once DIR/alive is stale, every attempt it
fenced is gone; and on SIGTERM (the agent's clean shutdown). Standard library only: it runs with -I -S, one small
process per agent.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time
from collections.abc import Iterable
from types import ModuleType
from typing import NamedTuple
from urllib.parse import quote, unquote

POLL_S = 0.25
# An agent that has not touched DIR/awake for this long is taken for frozen or hung.
AWAKE_S = 2.0
NO_GROUP = 0  # a fenced attempt whose first process was gone: only its cgroups are signalled
# A fence mark (fenced/<attempt>: the seconds without a heartbeat) ends with this word when
# only what an attempt left behind was stopped (its first process had exited by itself).
LEFTOVERS_ONLY = "leftovers"


def _load_cgroups() -> ModuleType | None:
    """agent/cgroups.py, loaded by its path (this script runs with -I -S, outside the package)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cgroups.py")
    spec = importlib.util.spec_from_file_location("muster_agent_cgroups", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - without it, process groups are still stopped
        log(f"cannot load {path}: {exc}; attempts' cgroups will not be killed")
        return None
    return module


cgroups = _load_cgroups()


def log(text: str) -> None:
    try:
        sys.stderr.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} WARNING agent.watchdog: {text}\n")
        sys.stderr.flush()
    except OSError:
        pass


def mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def written(path: str) -> tuple[int | None, float | None]:
    """(pid, when the heartbeat was sent) the agent wrote to `alive`; None for what is
    unreadable (half written, or an older agent's file with the pid alone)."""
    try:
        with open(path) as f:
            fields = f.read().split()
    except OSError:
        return None, None
    pid: int | None = None
    sent: float | None = None
    try:
        pid = int(fields[0])
        sent = float(fields[1])
    except (IndexError, ValueError):
        pass
    return pid, sent


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the process's name (field 3 on), or None when
    there is no such process. Read as bytes: the name is whatever the task made it (a
    program name cut in the middle of a character, one set by prctl), and decoding it as
    text failed: the start of a try went unrecorded, and the watchdog died (found by
    exploring: a job then ran twice)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    try:
        return stat[stat.rindex(b")") + 2:].decode("ascii", errors="replace").split()
    except ValueError:
        return None


def start_time(pid: int) -> str:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot): tells a process apart from
    a later one with the same pid; "" when there is none."""
    fields = _stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else ""


def exited(pid: int) -> bool:
    """Whether process `pid` has exited but is not reaped yet (a zombie: what a try that
    ended by itself is while its agent, frozen, does not wait for it)."""
    fields = _stat(pid)
    return bool(fields) and fields[0] in ("Z", "X")  # type: ignore[index]


BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def kernel_boot_id(path: str = BOOT_ID_PATH) -> str:
    """The kernel's boot id (a new one at each boot), "" where it cannot be read."""
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()[:64]
    except (OSError, ValueError):
        return ""


_this_boot: str | None = None


def this_boot() -> str:
    """This machine's boot id, read once (it cannot change while a process lives)."""
    global _this_boot
    if _this_boot is None:
        _this_boot = kernel_boot_id()
    return _this_boot


RUN_TMP = ".tmp"  # a record being written, put in place under its attempt's name once whole


class RunRecord(NamedTuple):
    """One attempt's record in the agent's runs directory (a file named after it)."""

    pid: int  # the task's process group (its first process's pid)
    start: str  # that process's start time ("-": gone when recorded)
    keep: bool  # a KEEP_RUNNING attempt, which the watchdog leaves alone
    launcher: tuple[int, str] | None  # the launcher that stays the task's parent: pid, start time
    cgroups: list[str]  # the attempt's cgroup directories
    work_dir: str | None  # the directory made for it
    boot: str = ""  # the boot id of the machine's boot it was written in ("": unknown, an older record)
    # A stop under way (SIGTERM sent): when its grace ends and the SIGKILL comes, on the
    # system's monotonic clock (the same for every process of one boot). None: none is.
    kill_at: float | None = None

    def line(self) -> str:
        """The record as `run_record` writes it."""
        launcher, launcher_start = self.launcher or (None, "")
        return run_record(self.pid, self.start, self.keep, launcher, launcher_start, self.cgroups, self.work_dir,
                          kill_at=self.kill_at)

    def other_boot(self) -> bool:
        """Written in another boot of this machine: its processes are certainly gone, and a
        process of this boot with the same pid and start tick is another's. False where
        either boot is unknown."""
        return bool(self.boot) and bool(this_boot()) and self.boot != this_boot()


def run_record(pid: object, start: str, keep: bool, launcher: object = None, launcher_start: str = "",
               cgroups: Iterable[str] = (), work_dir: str | None = None, kill_at: float | None = None) -> str:
    """The line `read_run` reads: fields apart by spaces, paths quoted (found by exploring:
    a work directory with a space in its path was left out, and a restarted agent left a
    crashed try's data behind). A process already gone has no start time: "-" keeps the
    fields in their places. The agent writes it once a try runs, and its launcher before
    the task starts, with its own and the task's pid (agent/launch.py: placeholders).
    Stamped with this boot's id (`boot:`): a pid and start tick may come again after a
    reboot, and name an unrelated process. `kill:<t>`: the try is being stopped, and its
    grace ends at `t` (RunRecord.kill_at): an agent started again meanwhile lets it run
    to then."""
    fields = [str(pid), start or "-"] + (["keep"] if keep else [])
    if launcher is not None and str(launcher) != str(pid):
        fields.append(f"sup:{launcher}:{launcher_start or '-'}")
    fields += [f"cg:{quote(d)}" for d in cgroups]
    if work_dir is not None:
        fields.append(f"wd:{quote(work_dir)}")
    if this_boot():
        fields.append(f"boot:{quote(this_boot())}")
    if kill_at is not None:
        fields.append(f"kill:{kill_at:.3f}")
    return " ".join(fields) + "\n"


def put_run(path: str | os.PathLike[str], text: str) -> None:
    """Put a run record in place whole (written beside it first: one written over in place
    by an agent killed in the middle was left empty, and the try unknown to its watchdog).
    Raises OSError."""
    tmp = f"{os.fspath(path)}{RUN_TMP}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def read_run(text: str) -> RunRecord:
    """A line `run_record` wrote (an older one, without its boot, too). Raises ValueError
    (or IndexError) for one that is not."""
    fields = text.split()
    launcher = None
    for f in fields[2:]:
        if f.startswith("sup:"):
            _, pid, start = f.split(":", 2)
            launcher = (int(pid), start)
    work = [unquote(f[3:]) for f in fields[2:] if f.startswith("wd:")]
    boot = [unquote(f[5:]) for f in fields[2:] if f.startswith("boot:")]
    kill = [float(f[5:]) for f in fields[2:] if f.startswith("kill:")]
    return RunRecord(int(fields[0]), fields[1], "keep" in fields[2:], launcher,
                     [unquote(f[3:]) for f in fields[2:] if f.startswith("cg:")], work[0] if work else None,
                     boot[0] if boot else "", kill[0] if kill else None)


def runs(directory: str) -> dict[str, RunRecord]:
    """attempt -> its record."""
    out: dict[str, RunRecord] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        if name.endswith(RUN_TMP):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                out[name] = read_run(f.read())
        except (OSError, ValueError, IndexError):
            continue
    return out


class Watchdog:
    def __init__(self, directory: str, runs_dir: str, agent_pid: int, stale_after_s: float,
                 grace_s: float, deadline_s: float | None = None, bases: Iterable[str] = ()) -> None:
        self.alive = os.path.join(directory, "alive")
        self.awake = os.path.join(directory, "awake")
        self.fenced_dir = os.path.join(directory, "fenced")
        self.runs_dir = runs_dir
        self.agent_pid = agent_pid
        self.agent_started = start_time(agent_pid)
        self.stale_after_s = stale_after_s
        self.grace_s = grace_s
        self.deadline_s = stale_after_s + grace_s if deadline_s is None else deadline_s
        # The names of the agent's cgroup bases, and the machine's cgroup mounts: a run
        # record's cgroups are killed only under them (cgroups.attempt_cgroups).
        self.bases = {os.path.normpath(b) for b in bases}
        self.base_names = {os.path.basename(b) for b in self.bases}
        self.mounts = cgroups.mounts() if cgroups is not None else []
        # attempt -> (process group, its leader's start time, when to SIGKILL it (None: done),
        # its cgroup directories)
        self.fenced: dict[str, tuple[int, str, float | None, list[str]]] = {}
        self.last = mtime(self.alive)
        self.changed = time.monotonic()
        self.last_awake = mtime(self.awake)
        self.awake_changed = time.monotonic()

    def agent_gone(self) -> bool:
        return not self.agent_started or start_time(self.agent_pid) != self.agent_started

    def step(self, now: float) -> bool:
        """One look; False once the watchdog has nothing left to do."""
        seen = mtime(self.alive)
        if seen != self.last:
            other, sent = written(self.alive)
            self.last, self.changed = seen, (sent if sent is not None and sent <= now else now)
            # A change seen after the agent died may be its own last one: only another
            # pid in the file means another agent took over (it kills the leftovers).
            if other not in (None, self.agent_pid) and self.agent_gone():
                log(f"agent {self.agent_pid} gone and agent {other} took over: exiting")
                return False
        seen_awake = mtime(self.awake)
        if seen_awake != self.last_awake:
            self.last_awake, self.awake_changed = seen_awake, now
        silent = now - self.changed
        stale = silent >= self.stale_after_s
        if stale and not self.agent_awake(now):
            self.fence(now)
        elif silent >= self.deadline_s:
            self.fence(now, kill=True)  # the agent is awake but left attempts running
        self.finish(now)
        # A dead agent's attempts are fenced once it is stale, then the watchdog is done.
        return not (stale and self.agent_gone() and not self.live_fenced())

    def agent_awake(self, now: float) -> bool:
        """The agent runs its fence loop (and so fences itself)."""
        return (self.last_awake is not None and now - self.awake_changed < AWAKE_S
                and not self.agent_gone())

    def fence(self, now: float, kill: bool = False) -> None:
        """Stop every listed attempt not yet fenced: SIGTERM, SIGKILL after the grace;
        with `kill`, SIGKILL now."""
        kill_at = now if kill else now + self.grace_s
        for attempt, r in runs(self.runs_dir).items():
            if r.keep or attempt in self.fenced or r.other_boot():  # (another boot's: its processes are gone)
                continue
            cgs = r.cgroups
            if cgs and cgroups is not None:
                cgs, others = cgroups.attempt_cgroups(cgs, self.base_names, self.mounts, bases=self.bases)
                if others:
                    log(f"the record of attempt {attempt} names cgroups that are not the agent's attempts': "
                        f"{' '.join(others)} left alone")
            try:
                self._fence_one(attempt, r.pid, r.start, cgs, now, kill_at, kill)
            except Exception as exc:  # noqa: BLE001 - the others are stopped all the same
                log(f"stopping attempt {attempt} failed ({exc!r}): trying again")

    def _fence_one(self, attempt: str, group: int, started: str, cgs: list[str], now: float, kill_at: float,
                   kill: bool) -> None:
        """Stop one attempt: its fence mark, SIGTERM (and SIGCONT) now, SIGKILL at `kill_at`."""
        # A first process that has exited but is not reaped (its agent frozen) ended by
        # itself: what is left of it is stopped, the try's end stands (found by a review:
        # its exit 0 was taken for a stop, and the finished job ran again).
        ended = exited(group)
        if start_time(group) != started:
            # Its first process is gone (and its pid may be another's by now: its group
            # is not signalled), but what it left in the attempt's cgroups (a `setsid`
            # daemon, a double fork) is the attempt's all the same, and is stopped.
            if cgroups is None or not cgs or not cgroups.populated(cgs):
                return
            group = NO_GROUP
        silent = now - self.changed
        # Recorded as fenced first, the mark written as best it can be: a mark that cannot
        # be written (the state directory's disk full) must not keep the attempt running
        # (a review: the error ended every look, and nothing was ever stopped).
        self.fenced[attempt] = (group, started, kill_at, cgs)
        try:
            os.makedirs(self.fenced_dir, exist_ok=True)
            with open(os.path.join(self.fenced_dir, attempt), "w") as f:
                f.write(f"{silent:.1f}{' ' + LEFTOVERS_ONLY if group == NO_GROUP or ended else ''}\n")
        except OSError as exc:
            log(f"cannot write the fence mark of attempt {attempt}: {exc}")
        log(f"no heartbeat from the agent for {silent:.1f} s: stopping attempt {attempt} "
            f"(process group {group})")
        if kill:
            return  # finish(), in this same step
        # One SIGTERM a process, as the agent's own stop sends it (cgroups.signal_attempt:
        # a process found both in the cgroup and in the group would get two, and its
        # handler would run twice). SIGKILL, GRACE seconds later, goes to both.
        # Then continued, as the agent's own stop does: an attempt its agent froze (the
        # fence: SIGSTOP and the cgroup freezer) would otherwise keep the SIGTERM pending
        # and never run its handler before the SIGKILL.
        if cgroups is None:
            self.signal(group, signal.SIGTERM)
            self.signal(group, signal.SIGCONT)
        elif group == NO_GROUP:
            cgroups.signal_paths(cgs, signal.SIGTERM)
            cgroups.set_frozen(cgs, False)
            cgroups.signal_paths(cgs, signal.SIGCONT)
        else:
            try:
                cgroups.signal_attempt(cgs, group, signal.SIGTERM)
                cgroups.set_frozen(cgs, False)
                cgroups.signal_attempt(cgs, group, signal.SIGCONT)
            except OSError:
                pass

    def finish(self, now: float) -> None:
        """SIGKILL, once, what is left of each group fenced GRACE seconds ago (a process
        group id is not reused while any member is left), and everything in its cgroups."""
        for attempt, (group, started, kill_at, cgs) in list(self.fenced.items()):
            if kill_at is not None and now >= kill_at:
                self.signal(group, signal.SIGKILL)
                if cgroups is not None and cgs:
                    cgroups.kill_paths(cgs, wait_s=1.0)
                self.fenced[attempt] = (group, started, None, cgs)

    def live_fenced(self) -> bool:
        """Any fenced attempt whose group's leader is still there."""
        return any(start_time(g) == s or (cgroups is not None and cgroups.populated(cgs))
                   for g, s, _, cgs in self.fenced.values())

    @staticmethod
    def signal(group: int, sig: int) -> None:
        if group == NO_GROUP:
            return  # (killpg(0) would signal the watchdog's own group)
        try:
            os.killpg(group, sig)
        except OSError:
            pass

    def run(self) -> None:
        failed = ""
        while True:
            try:
                if not self.step(time.monotonic()):
                    break
                failed = ""
            except Exception as exc:  # noqa: BLE001 - the watchdog must not die: it looks again
                # (found by exploring: one error it did not foresee ended it, and the attempts of
                # a frozen agent then ran on beside their replacements.)
                if repr(exc) != failed:
                    failed = repr(exc)
                    log(f"a look at the attempts failed ({failed}): looking again")
            time.sleep(POLL_S)
        # What fenced attempts left behind in their groups dies with them, now.
        self.finish(float("inf"))


def main(argv: list[str]) -> None:
    if len(argv) < 5:
        sys.stderr.write("usage: watchdog.py DIR RUNS AGENT_PID STALE_AFTER GRACE [DEADLINE [BASE]...]\n")
        sys.exit(2)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    Watchdog(argv[0], argv[1], int(argv[2]), float(argv[3]), float(argv[4]),
             float(argv[5]) if len(argv) > 5 else None, argv[6:]).run()


if __name__ == "__main__":
    main(sys.argv[1:])
