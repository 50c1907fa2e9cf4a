"""The agent's watchdog (agent/watchdog.py) with real processes and signals, the agent
played by a `sleep`: it stops the listed attempts (and what they started) once `alive`
stops changing, leaves KEEP_RUNNING attempts and reused pids alone, does nothing while
the agent is alive, and exits when its agent is gone."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from agent import cgroups, watchdog
from agent.agent import WATCHDOG
from agent.watchdog import run_record, start_time
from tests.conftest import wait_until
from tests.integration.conftest import group_states, process_gone

PY = sys.executable


class Setup:
    def __init__(self, tmp: Path) -> None:
        self.dir, self.runs = tmp / "watch", tmp / "runs"
        self.dir.mkdir()
        self.runs.mkdir()
        (self.dir / "alive").touch()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.agent = self.spawn(["sleep", "600"])
        self.watchdog: subprocess.Popen[bytes] | None = None

    def spawn(self, argv: list[str], **kw: object) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(argv, **kw)  # type: ignore[call-overload]
        self.procs.append(p)
        return p

    def attempt(self, name: str, argv: list[str], keep: bool = False) -> subprocess.Popen[bytes]:
        """Start an attempt in a session of its own and list it as the agent does."""
        p = self.spawn(argv, start_new_session=True)
        (self.runs / name).write_text(f"{p.pid} {start_time(p.pid)}{' keep' if keep else ''}\n")
        return p

    def start(self, stale_after: float = 1.0, grace: float = 1.0, deadline: float | None = None,
              bases: Iterable[str] = ()) -> subprocess.Popen[bytes]:
        """The watchdog (`bases`: the agent's cgroup bases; a deadline is needed with them)."""
        self.watchdog = subprocess.Popen(
            [PY, "-I", "-S", WATCHDOG, str(self.dir), str(self.runs), str(self.agent.pid), str(stale_after),
             str(grace), *([str(deadline)] if deadline is not None else []), *bases],
            stderr=subprocess.PIPE, start_new_session=True)
        return self.watchdog

    def close(self) -> None:
        for p in [*self.procs, *([self.watchdog] if self.watchdog else [])]:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    p.kill()
                p.wait()


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    s = Setup(tmp_path)
    yield s
    s.close()


def marker(log: Path, child_pid_file: Path | None = None) -> list[str]:
    """Notes 'start', and 'stop' on SIGTERM (then exits 143); optionally leaves a
    `sleep` child behind in its process group, whose pid it writes down."""
    code = f"""
import os, signal, subprocess, sys, time
def note(what):
    with open({str(log)!r}, 'a') as f:
        f.write(what + '\\n')
def stop(*_):
    note('stop'); sys.exit(143)
signal.signal(signal.SIGTERM, stop)
if {str(child_pid_file) if child_pid_file else None!r}:
    child = subprocess.Popen(['sleep', '600'])
    with open({str(child_pid_file)!r}, 'w') as f:
        f.write(str(child.pid))
note('start')
while True:
    time.sleep(0.05)
"""
    return [PY, "-c", code]


def stopped_once_the_agent_dies(setup: Setup, p: subprocess.Popen[bytes], log: Path) -> subprocess.Popen[bytes]:
    """Start the watchdog, kill the agent (-9, not restarted): the attempt `p` (a `marker`
    writing to `log`) gets its SIGTERM once `alive` has gone stale, and the watchdog then
    exits 0. The watchdog, for what it said."""
    wd = setup.start(stale_after=1.5, grace=0.5)
    setup.agent.kill()
    setup.agent.wait()
    p.wait(60)
    assert log.read_text().split() == ["start", "stop"]
    wd.wait(30)
    assert wd.returncode == 0, wd.stderr.read() if wd.stderr else ""
    return wd


@contextlib.contextmanager
def touching(path: Path, pid: int) -> Iterator[None]:
    """`path` written (the agent's pid) every 0.1 s by a thread, as an agent keeps
    `alive` or `awake` fresh, for the block."""
    stop = threading.Event()

    def touch() -> None:
        while not stop.is_set():
            path.write_text(f"{pid}\n")
            stop.wait(0.1)

    t = threading.Thread(target=touch, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(5)


def test_a_silent_agent_gets_its_attempts_stopped_but_keep_running_ones(setup: Setup, tmp_path: Path) -> None:
    log, child = tmp_path / "marks", tmp_path / "child"
    fenced = setup.attempt("j1.1", marker(log, child))
    kept = setup.attempt("j2.1", ["sleep", "600"], keep=True)
    wait_until(lambda: log.exists() and child.exists(), what="the attempt started")
    wd = setup.start(stale_after=1.0, grace=1.0)
    fenced.wait(60)
    assert fenced.returncode == 143  # its SIGTERM handler ran
    assert log.read_text().split() == ["start", "stop"]
    assert float((setup.dir / "fenced" / "j1.1").read_text()) >= 1.0
    # What the attempt left behind in its group got SIGKILL after the grace period.
    wait_until(lambda: process_gone(int(child.read_text())), timeout=30, what="the left-behind child killed")
    assert kept.poll() is None and not (setup.dir / "fenced" / "j2.1").exists()
    # The agent is gone and nothing it fenced is left: the watchdog exits.
    setup.agent.kill()
    setup.agent.wait()
    _, err = wd.communicate(timeout=30)
    assert wd.returncode == 0
    assert b"stopping attempt j1.1" in err


def test_a_killed_agents_attempts_are_stopped_once_it_is_stale(setup: Setup, tmp_path: Path) -> None:
    """The agent dies first (kill -9, not restarted); its attempts are still stopped once
    `alive` has gone stale, and then the watchdog exits."""
    log = tmp_path / "marks"
    p = setup.attempt("j1.1", marker(log))
    wait_until(lambda: log.exists(), what="the attempt started")
    stopped_once_the_agent_dies(setup, p, log)
    assert (setup.dir / "fenced" / "j1.1").exists()


def test_an_attempt_whose_process_name_is_not_text_is_recorded_and_stopped(setup: Setup, tmp_path: Path) -> None:
    """A task may name its process anything (prctl; a program name the kernel cuts in the
    middle of a character): its start time is read all the same, and the watchdog stops it
    (found by exploring: reading /proc/<pid>/stat as UTF-8 failed, the try's start went
    unrecorded, the watchdog died, and the job ran twice)."""
    log = tmp_path / "marks"
    code = marker(log)[2].replace("note('start')", "import ctypes; ctypes.CDLL(None).prctl(15, b'\\xff\\xfe', 0, 0, "
                                                     "0); note('start')")
    p = setup.spawn([PY, "-c", code], start_new_session=True)
    wait_until(lambda: log.exists(), what="the attempt started")
    assert Path(f"/proc/{p.pid}/comm").read_bytes() == b"\xff\xfe\n"
    started = start_time(p.pid)
    assert started.isdigit()
    (setup.runs / "j1.1").write_text(f"{p.pid} {started}\n")
    stopped_once_the_agent_dies(setup, p, log)


def test_an_attempt_its_dead_agent_froze_is_continued_to_run_its_sigterm_handler(setup: Setup,
                                                                                   tmp_path: Path) -> None:
    """The agent froze an attempt (its fence: SIGSTOP) and died: the watchdog's SIGTERM
    would stay pending in a stopped process until the SIGKILL; it continues the attempt
    after the SIGTERM, as the agent's own stop does, so the attempt's handler runs."""
    log = tmp_path / "marks"
    p = setup.attempt("j1.1", marker(log))
    wait_until(lambda: log.exists(), what="the attempt started")
    os.killpg(p.pid, signal.SIGSTOP)
    wait_until(lambda: group_states(p.pid) == ["T"], what="the attempt frozen")
    wd = setup.start(stale_after=1.0, grace=30.0)
    setup.agent.kill()
    setup.agent.wait()
    p.wait(60)  # well before the grace's SIGKILL
    assert p.returncode == 143 and log.read_text().split() == ["start", "stop"]
    wd.wait(60)


def test_an_attempt_that_ignores_sigterm_is_killed_after_the_grace_period(setup: Setup) -> None:
    ready = setup.dir / "ignoring"
    p = setup.attempt("j1.1", [PY, "-c", "import pathlib, signal, sys, time\n"
                                         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                         "pathlib.Path(sys.argv[1]).touch()\nwhile True: time.sleep(0.05)", str(ready)])
    wait_until(ready.exists, timeout=60, what="the attempt ignoring SIGTERM")
    setup.start(stale_after=1.0, grace=0.5)
    p.wait(60)
    assert p.returncode == -signal.SIGKILL
    assert (setup.dir / "fenced" / "j1.1").exists()


def test_a_reused_pid_is_left_alone(setup: Setup) -> None:
    """A run file whose start time is not the process's (the pid was reused)."""
    other = setup.spawn(["sleep", "600"], start_new_session=True)
    (setup.runs / "j1.1").write_text(f"{other.pid} 1\n")
    wd = setup.start(stale_after=0.5, grace=0.2)
    time.sleep(3)  # well past stale-after plus grace
    assert other.poll() is None
    assert not (setup.dir / "fenced").exists()
    wd.terminate()  # the agent's clean shutdown
    wd.wait(30)
    assert wd.returncode == 0


def test_a_live_agent_keeps_its_attempts(setup: Setup) -> None:
    """While `alive` keeps changing nothing is stopped, long past the stale delay."""
    p = setup.attempt("j1.1", ["sleep", "600"])
    with touching(setup.dir / "alive", setup.agent.pid):
        # Stale after 2.5 s, touched every 0.1 s: also on a filesystem whose timestamps
        # have whole seconds the file changes well within the delay.
        wd = setup.start(stale_after=2.5, grace=0.5)
        time.sleep(6)
        assert p.poll() is None and wd.poll() is None
        assert not (setup.dir / "fenced").exists()


def test_an_awake_agent_fences_by_itself_and_what_it_leaves_is_killed_at_the_deadline(
        setup: Setup, tmp_path: Path) -> None:
    """No heartbeat stored (`alive` unchanged) but the agent awake (`awake` touched): the
    agent freezes and continues its attempts itself, so the watchdog sends no SIGTERM at
    the stale delay (that would end an attempt the agent may continue); at the deadline
    it SIGKILLs whatever is still there."""
    log = tmp_path / "marks"
    fenced = setup.attempt("j1.1", marker(log))
    kept = setup.attempt("j2.1", ["sleep", "600"], keep=True)
    wait_until(lambda: log.exists() and "start" in log.read_text(), what="the attempt started")
    with touching(setup.dir / "awake", setup.agent.pid):
        setup.start(stale_after=0.5, grace=0.5, deadline=2.0)
        fenced.wait(60)
        assert fenced.returncode == -signal.SIGKILL  # no SIGTERM: its handler would exit 143
        assert log.read_text().split() == ["start"]
        assert (setup.dir / "fenced" / "j1.1").exists()  # the agent's report gives the watchdog as the reason
        assert kept.poll() is None


def test_an_agent_that_stops_being_awake_gets_the_sigterm(setup: Setup, tmp_path: Path) -> None:
    """Awake once, then no more (the agent frozen or hung after its last touch): the
    watchdog takes it for asleep and stops its attempts with SIGTERM as before."""
    log = tmp_path / "marks"
    fenced = setup.attempt("j1.1", marker(log))
    wait_until(lambda: log.exists() and "start" in log.read_text(), what="the attempt started")
    (setup.dir / "awake").write_text(f"{setup.agent.pid}\n")
    setup.start(stale_after=0.5, grace=5.0, deadline=60.0)
    fenced.wait(60)
    assert fenced.returncode == 143
    assert log.read_text().split() == ["start", "stop"]


def test_it_exits_when_another_agent_takes_over(setup: Setup) -> None:
    """Its agent died and a new one writes its pid to `alive` (and kills the leftovers
    itself)."""
    p = setup.attempt("j1.1", ["sleep", "600"])
    wd = setup.start(stale_after=5.0, grace=0.5)
    setup.agent.kill()
    setup.agent.wait()
    time.sleep(0.6)
    # Its own last touch, seen after it died, is not a takeover: the watchdog stays.
    (setup.dir / "alive").write_text(f"{setup.agent.pid}\n")
    time.sleep(1.0)
    assert wd.poll() is None
    newcomer = setup.spawn(["sleep", "600"])
    (setup.dir / "alive").write_text(f"{newcomer.pid}\n")
    wd.wait(30)
    assert wd.returncode == 0
    assert p.poll() is None and not (setup.dir / "fenced").exists()


def _hierarchy() -> cgroups.Hierarchy | None:
    # A name of this process's own: tests of other workers (pytest-xdist) probe and remove theirs.
    h, _ = cgroups.detect("auto", f"muster-test-watchdog-{os.getpid()}")
    return h


def _no_cgroups() -> bool:
    h = _hierarchy()
    if h is not None:
        cgroups.remove_paths(h.bases.values())  # only a probe
    return h is None


@pytest.mark.skipif(_no_cgroups(), reason="no cgroup the test may create")
def test_a_daemon_that_left_the_attempts_process_group_is_killed_with_its_cgroup(
        setup: Setup, tmp_path: Path) -> None:
    """The attempt runs in a cgroup (as the agent starts it, agent.launch) and double-forks
    a child into a session of its own: the process group is not enough, the cgroup is
    (the run file lists it as `cg:<dir>`)."""
    h = _hierarchy()
    assert h is not None
    group = h.create(f"wd-{os.getpid()}", cgroups.Limits())
    try:
        daemon = tmp_path / "daemon"
        gate = tmp_path / "gate"
        # The cgroup is joined before anything runs (the launcher's way), here by a shell.
        joins = "; ".join(f"echo $$ > {f}" for f in group.procs_files())
        script = (f"{joins}; while [ ! -e {gate} ]; do sleep 0.05; done; "
                  f"(setsid sh -c 'echo $$ > {daemon}; exec sleep 600' < /dev/null > /dev/null 2>&1 &); exec sleep 600")
        p = setup.spawn(["sh", "-c", script], start_new_session=True)
        # (its `sleep` children come and go: the count of its processes is not steady)
        wait_until(lambda: p.pid in group.pids(), what="the attempt in its cgroup")
        gate.touch()
        wait_until(lambda: daemon.exists() and daemon.read_text().strip(), what="the daemon started")
        pid = int(daemon.read_text())
        assert os.getsid(pid) != os.getsid(p.pid) and pid in group.pids()
        line = " ".join([str(p.pid), start_time(p.pid)] + [f"cg:{d}" for d in group.paths])
        (setup.runs / "j1.1").write_text(line + "\n")
        setup.start(stale_after=1.0, grace=0.5, deadline=1.5, bases=h.bases.values())
        p.wait(60)
        wait_until(lambda: process_gone(pid), timeout=30, what="the daemon killed")
        assert group.pids() == []
    finally:
        group.kill()
        group.remove()
        cgroups.remove_paths(h.bases.values())


@pytest.mark.skipif(_no_cgroups(), reason="no cgroup the test may create")
def test_a_daemon_is_killed_with_its_cgroup_after_the_attempts_first_process_exited(
        setup: Setup, tmp_path: Path) -> None:
    """Found by exploring: the agent killed -9, the attempt's first process exits on its own
    (its pid no longer matches the run file), and a `setsid` daemon it left in its cgroup
    ran on for ever while the job ran again elsewhere. The watchdog stops what is left in
    the cgroup, and signals no process group (the pid may be another's by now)."""
    h = _hierarchy()
    assert h is not None
    group = h.create(f"wd2-{os.getpid()}", cgroups.Limits())
    try:
        daemon = tmp_path / "daemon"
        joins = "; ".join(f"echo $$ > {f}" for f in group.procs_files())
        script = (f"{joins}; (setsid sh -c 'echo $$ > {daemon}; exec sleep 600' < /dev/null > /dev/null 2>&1 &); "
                  f"while [ ! -s {daemon} ]; do sleep 0.05; done")
        p = setup.spawn(["sh", "-c", script], start_new_session=True)
        line = " ".join([str(p.pid), start_time(p.pid)] + [f"cg:{d}" for d in group.paths])
        (setup.runs / "j1.1").write_text(line + "\n")
        assert p.wait(60) == 0  # the first process is gone, its daemon is not
        pid = int(daemon.read_text())
        assert not process_gone(pid) and pid in group.pids()
        setup.agent.kill()  # the agent is gone too
        setup.agent.wait()
        wd = setup.start(stale_after=1.0, grace=0.5, deadline=1.5, bases=h.bases.values())
        wait_until(lambda: process_gone(pid), timeout=30, what="the daemon killed")
        assert group.pids() == [] and (setup.dir / "fenced" / "j1.1").exists()
        assert wd.wait(60) == 0  # then it is done
    finally:
        group.kill()
        group.remove()
        cgroups.remove_paths(h.bases.values())


@pytest.mark.skipif(_no_cgroups(), reason="no cgroup the test may create")
def test_a_run_record_naming_a_cgroup_that_is_not_an_attempts_has_that_one_left_alone(
        setup: Setup, tmp_path: Path) -> None:
    """A run record is a file: a cgroup it names is killed only when it is an attempt
    cgroup of the agent's bases (as a restarted agent's leftovers are). Here the record
    names the attempt's cgroup and one of another base, holding a process of its own: the
    attempt's daemon is killed, the other process is not."""
    h = _hierarchy()
    other, _ = cgroups.detect("auto", f"muster-test-other-{os.getpid()}")
    assert h is not None and other is not None
    group = h.create(f"wd3-{os.getpid()}", cgroups.Limits())
    bystander = other.create("bystander", cgroups.Limits())
    try:
        joins = "; ".join(f"echo $$ > {f}" for f in bystander.procs_files())
        innocent = setup.spawn(["sh", "-c", f"{joins}; exec sleep 600"], start_new_session=True)
        wait_until(lambda: bystander.pids() == [innocent.pid], what="the bystander in its cgroup")
        daemon = tmp_path / "daemon"
        joins = "; ".join(f"echo $$ > {f}" for f in group.procs_files())
        script = (f"{joins}; (setsid sh -c 'echo $$ > {daemon}; exec sleep 600' < /dev/null > /dev/null 2>&1 &); "
                  f"while [ ! -s {daemon} ]; do sleep 0.05; done")
        p = setup.spawn(["sh", "-c", script], start_new_session=True)
        cgs = [*group.paths, *bystander.paths]
        (setup.runs / "j1.1").write_text(run_record(p.pid, start_time(p.pid), False, cgroups=cgs))
        assert p.wait(60) == 0
        pid = int(daemon.read_text())
        setup.agent.kill()
        setup.agent.wait()
        wd = setup.start(stale_after=1.0, grace=0.5, deadline=1.5, bases=h.bases.values())
        wait_until(lambda: process_gone(pid), timeout=30, what="the daemon killed")
        assert wd.wait(60) == 0  # done: what it stopped is gone
        assert innocent.poll() is None and bystander.pids() == [innocent.pid]
        assert wd.stderr is not None and b"left alone" in wd.stderr.read()
    finally:
        for g in (group, bystander):
            g.kill()
            g.remove()
        cgroups.remove_paths([*h.bases.values(), *other.bases.values()])


@pytest.mark.skipif(_no_cgroups(), reason="no cgroup the test may create")
def test_an_attempt_in_its_cgroup_and_process_group_gets_one_sigterm(
        setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attempt's process is in its cgroup and leads its process group (as the agent
    starts it): the watchdog sends it one SIGTERM, not one per way of finding it (a task's
    handler would run twice), and SIGKILL both ways after the grace period. The watchdog
    runs in this process here, its signals recorded on their way out."""
    h = _hierarchy()
    assert h is not None
    group = h.create(f"wd1-{os.getpid()}", cgroups.Limits())
    try:
        joins = "; ".join(f"echo $$ > {f}" for f in group.procs_files())
        p = setup.spawn(["sh", "-c", f"{joins}; exec sleep 600"], start_new_session=True)
        wait_until(lambda: group.pids() == [p.pid], what="the attempt in its cgroup")
        line = " ".join([str(p.pid), start_time(p.pid)] + [f"cg:{d}" for d in group.paths])
        (setup.runs / "j1.1").write_text(line + "\n")
        sent: list[tuple[str, int, int]] = []
        real_kill, real_killpg = os.kill, os.killpg

        def kill(pid: int, sig: int) -> None:
            sent.append(("kill", pid, sig))
            real_kill(pid, sig)

        def killpg(pgid: int, sig: int) -> None:
            sent.append(("killpg", pgid, sig))
            real_killpg(pgid, sig)

        monkeypatch.setattr(os, "kill", kill)
        monkeypatch.setattr(os, "killpg", killpg)
        wd = watchdog.Watchdog(str(setup.dir), str(setup.runs), setup.agent.pid, stale_after_s=1.0, grace_s=5.0,
                               bases=h.bases.values())
        wd.fence(0.0)
        assert [s for s in sent if s[2] == signal.SIGTERM] == [("kill", p.pid, signal.SIGTERM)]
        p.wait(30)
        assert p.returncode == -signal.SIGTERM
        sent.clear()
        wd.finish(10.0)
        assert ("killpg", p.pid, signal.SIGKILL) in sent
    finally:
        group.kill()
        group.remove()
        cgroups.remove_paths(h.bases.values())


def test_an_attempt_is_stopped_even_when_its_fence_mark_cannot_be_written(setup: Setup, tmp_path: Path) -> None:
    """The mark (the state directory's disk full, here a file where its directory goes)
    is written as best it can be: the attempt is stopped all the same (a review: the error
    ended every look, and nothing was ever stopped)."""
    (setup.dir / "fenced").write_text("in the way")
    log = tmp_path / "marks"
    p = setup.attempt("j1.1", marker(log))
    wait_until(lambda: log.exists(), what="the attempt started")
    wd = stopped_once_the_agent_dies(setup, p, log)
    assert wd.stderr is not None and b"cannot write the fence mark of attempt j1.1" in wd.stderr.read()


def test_the_watchdog_looks_again_after_a_look_that_failed(setup: Setup, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """An error the watchdog did not foresee does not end it (found by exploring: one did,
    and a frozen agent's attempts ran on beside their replacements)."""
    wd = watchdog.Watchdog(str(setup.dir), str(setup.runs), setup.agent.pid, 1.0, 1.0, None)
    looks: list[float] = []

    def step(now: float) -> bool:
        looks.append(now)
        if len(looks) <= 2:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return len(looks) < 4

    monkeypatch.setattr(wd, "step", step)
    monkeypatch.setattr(watchdog, "POLL_S", 0.01)
    wd.run()
    assert len(looks) == 4
    assert capsys.readouterr().err.count("a look at the attempts failed") == 1  # said once, not every look


def test_a_cgroup_of_the_bases_name_elsewhere_in_the_hierarchy_is_left_alone(
        setup: Setup, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A review: only the base's name was compared, so a record naming
    `<anywhere>/<the base's name>/<x>` on a cgroup mount passed. The watchdog is given its
    agent's bases themselves: a cgroup right under one of them only. (The cgroups are not
    made here: what the watchdog would signal is recorded.)"""
    assert watchdog.cgroups is not None
    pids = cgroups.Mount("/sys/fs/cgroup/pids", "/", "cgroup", frozenset({"pids"}))
    monkeypatch.setattr(watchdog.cgroups, "mounts", lambda: [pids])
    signalled: list[list[str]] = []
    monkeypatch.setattr(watchdog.cgroups, "signal_attempt", lambda cgs, group, sig: signalled.append(list(cgs)))
    monkeypatch.setattr(watchdog.cgroups, "set_frozen", lambda cgs, frozen: False)
    p = setup.spawn(["sleep", "600"], start_new_session=True)
    ours, elsewhere = "/sys/fs/cgroup/pids/muster-h1/j1.1", "/sys/fs/cgroup/pids/other/muster-h1/j1.1"
    (setup.runs / "j1.1").write_text(run_record(p.pid, start_time(p.pid), False, cgroups=[ours, elsewhere]))
    wd = watchdog.Watchdog(str(setup.dir), str(setup.runs), setup.agent.pid, stale_after_s=1.0, grace_s=30.0,
                           bases=["/sys/fs/cgroup/pids/muster-h1"])
    wd.fence(time.monotonic())
    assert signalled and all(cgs == [ours] for cgs in signalled), signalled
    assert f"{elsewhere} left alone" in capsys.readouterr().err
