"""One attempt's stop (agent.runner.Run) with a real process and real signals, without
an agent around it: a stop repeated while the first is under way sends no second
SIGTERM (the task's checkpoint window stays whole), and a later stop with a shorter grace
brings the SIGKILL forward (fencing must finish within the heartbeat TTL)."""

from __future__ import annotations

import asyncio
import os
import pwd
import signal
import sys
import time
from pathlib import Path

import pytest

from agent.runner import Run
from tests.factories import task
from tests.integration.conftest import group_frozen, group_running, group_states
from wire.messages import AttemptState

# Counts its SIGTERMs in a file and ignores them: only a SIGKILL ends it.
STUBBORN = """
import signal, sys, time
path = sys.argv[1]
def term(*_):
    with open(path, "a") as f:
        f.write("term\\n")
signal.signal(signal.SIGTERM, term)
open(path, "a").write("ready\\n")
while True:
    time.sleep(0.05)
"""


async def _started(run: Run, log: Path) -> None:
    deadline = time.monotonic() + 30
    while not (log.exists() and "ready" in log.read_text()):
        assert time.monotonic() < deadline, "the attempt did not start"
        await asyncio.sleep(0.05)


async def test_a_repeated_stop_sends_one_sigterm_and_a_shorter_grace_kills_sooner(tmp_path: Path) -> None:
    log = tmp_path / "signals"
    states: list[AttemptState] = []

    async def on_state(_task: object, state: AttemptState, *_: object) -> None:
        states.append(state)

    run = Run(task(command=[sys.executable, "-c", STUBBORN, str(log)]), on_state, kill_grace_s=600.0)
    run.start()
    await _started(run, log)
    first = asyncio.create_task(run.stop("cancelled", 600.0))
    while "term" not in log.read_text():
        await asyncio.sleep(0.05)
    again = asyncio.create_task(run.stop("cancelled", 600.0))  # the control plane repeats itself
    await asyncio.sleep(0.5)
    assert not first.done() and not again.done()
    # Fencing: what is left of the TTL is short. (Waited for at most 120 s: the first
    # stop alone would wait 600 s before its SIGKILL.)
    await asyncio.wait_for(run.stop("fenced: host cut off from the control plane", 0.5), timeout=120)
    await asyncio.wait_for(asyncio.gather(first, again), timeout=120)
    await run.wait()
    assert log.read_text().count("term") == 1
    assert run.stop_reason == "cancelled"
    assert AttemptState.RUNNING in states and states[-1] is AttemptState.KILLED


async def test_a_frozen_attempt_runs_nothing_until_continued_and_a_stop_reaches_its_handler(tmp_path: Path) -> None:
    """The fence's freeze stops every process of the attempt (a child included); thawed,
    they run on; a stop while frozen delivers the SIGTERM on continuing, so the task's
    handler runs."""
    log = tmp_path / "signals"
    states: list[AttemptState] = []

    async def on_state(_task: object, state: AttemptState, *_: object) -> None:
        states.append(state)

    code = STUBBORN.replace("open(path, \"a\").write(\"ready\\n\")",
                            "import subprocess; subprocess.Popen(['sleep', '600']); open(path, 'a').write('ready\\n')")
    run = Run(task(command=[sys.executable, "-c", code, str(log)]), on_state, kill_grace_s=600.0)
    run.start()
    await _started(run, log)
    assert run.proc is not None
    group = run.proc.pid
    while len(group_states(group)) < 2:  # the task and its child
        await asyncio.sleep(0.05)
    run.freeze()
    while not group_frozen(group):
        await asyncio.sleep(0.05)
    run.thaw()
    while not group_running(group):
        await asyncio.sleep(0.05)
    run.freeze()
    while not group_frozen(group):
        await asyncio.sleep(0.05)
    await asyncio.wait_for(run.stop("fenced: host cut off from the control plane", 3.0), timeout=120)
    await run.wait()
    assert log.read_text().count("term") == 1  # handled after continuing, before the SIGKILL
    assert states == [AttemptState.RUNNING, AttemptState.KILLED]
    assert not run.frozen


# Counts in a file, as fast as it runs: a frozen attempt's count stands still.
COUNTER = """
import sys, time
n = 0
while True:
    n += 1
    with open(sys.argv[1], "w") as f:
        f.write(str(n))
    time.sleep(0.01)
"""


def frozen_by_kernel(paths: list[str]) -> bool:
    """What the freezer says of the cgroup: v1 `freezer.state`, v2 `cgroup.events`."""
    for d in paths:
        if os.path.exists(f"{d}/freezer.state"):
            return Path(d, "freezer.state").read_text().strip() == "FROZEN"
        if os.path.exists(f"{d}/cgroup.events"):
            return "frozen 1" in Path(d, "cgroup.events").read_text().splitlines()
    return False


@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_a_frozen_attempt_in_a_cgroup_with_a_freezer_stays_frozen_whoever_continues_it(
        tmp_path: Path, version: str) -> None:
    """Where the attempt's cgroup has a freezer (v1 `freezer`, v2 `cgroup.freeze`), the
    fence freezes it there as well as with SIGSTOP: a SIGCONT from anyone else (another
    process of the task's user) does not make it run; the agent's thaw does."""
    from agent import cgroups
    from agent.isolation import Isolation

    name = f"muster-test-frz-{version}-{os.getpid()}"
    h, why = cgroups.detect(version, name)
    if h is not None:
        cgroups.remove_paths(h.bases.values())
    if h is None or (version == "v1" and "freezer" not in h.controllers):
        pytest.skip(f"no cgroup {version} freezer here: {why or h.describe()}")  # type: ignore[union-attr]
    # Tasks as the test's own user: they run the checkout's interpreter and write tmp_path.
    iso = Isolation("frz", run_as=pwd.getpwuid(os.geteuid()).pw_name, cgroup_mode=version,
                    private_dir=tmp_path / "private", cgroup_name=name)
    count = tmp_path / "count"

    async def on_state(*_: object) -> None:
        pass

    run = Run(task(command=[sys.executable, "-c", COUNTER, str(count)]), on_state, isolation=iso, host_id="frz")
    run.start()

    def counted() -> int:
        try:
            return int(count.read_text() or 0)
        except (OSError, ValueError):
            return 0

    async def counting_past(n: int) -> None:
        deadline = time.monotonic() + 60
        while counted() <= n:
            assert time.monotonic() < deadline, "the attempt does not run"
            await asyncio.sleep(0.05)

    try:
        await counting_past(0)
        assert run.proc is not None and run.cgroup_paths
        run.freeze()
        assert run.cgroup_frozen
        group = run.group_pid  # the task's (its launcher stays its parent)
        while not group_frozen(group):
            await asyncio.sleep(0.05)
        for pid in cgroups.Group("x", int(version[1]), run.cgroup_paths).pids():
            os.kill(pid, signal.SIGCONT)  # what any process of the task's user may do
        before = counted()
        await asyncio.sleep(1.0)
        assert counted() == before, "a SIGCONT from outside made the frozen attempt run"
        assert frozen_by_kernel(run.cgroup_paths)
        run.thaw()
        assert not run.cgroup_frozen
        await counting_past(before)
    finally:
        await asyncio.wait_for(run.stop("test over", 1.0), timeout=60)
        await run.wait()


@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_an_oom_kill_its_own_limit_did_not_cause_is_the_hosts_want(tmp_path: Path, version: str) -> None:
    """Found by exploring: a task within its own memory limit, killed because an enclosing
    cgroup (here the attempts' base, at 150 MB) ran out, ended FAILED "for using more than
    its memory limit of 500 MB", the job's fault. It ends KILLED as the host's want."""
    from agent import cgroups
    from agent.isolation import Isolation

    name = f"muster-test-oom-{version}-{os.getpid()}"
    h, why = cgroups.detect(version, name)
    if h is not None:
        cgroups.remove_paths(h.bases.values())
    if h is None or "memory" not in h.controllers:
        pytest.skip(f"no cgroup {version} memory controller here: {why or h.describe()}")  # type: ignore[union-attr]
    iso = Isolation("oom", run_as=pwd.getpwuid(os.geteuid()).pw_name, cgroup_mode=version,
                    private_dir=tmp_path / "private", cgroup_name=name)
    assert iso.hierarchy is not None
    base = iso.hierarchy.bases["memory" if version == "v1" else ""]
    limit = str(150 * 1024 * 1024)
    Path(base, "memory.limit_in_bytes" if version == "v1" else "memory.max").write_text(limit)
    if version == "v2" and Path(base, "memory.swap.max").exists():
        Path(base, "memory.swap.max").write_text("0")
    ends: list[tuple[AttemptState, str]] = []

    async def on_state(_task: object, state: AttemptState, _code: object, _tail: object, reason: str) -> None:
        ends.append((state, reason))

    grab = "x = bytearray(300 * 1024 * 1024); print('still here')"
    run = Run(task(command=[sys.executable, "-c", grab], memory_mb=500), on_state, isolation=iso, host_id="oom")
    try:
        run.start()
        await asyncio.wait_for(run.wait(), timeout=120)
    finally:
        iso.close()
    state, reason = ends[-1]
    assert state is AttemptState.KILLED and run.host_trouble, ends
    assert "for want of the host's memory" in reason and "not for its own limit of 500 MB" in reason, reason


# Saves its state when asked to stop, then exits 0, as a job that checkpoints in its grace does.
CHECKPOINTS = """
import signal, sys, time
path = sys.argv[1]
def term(*_):
    with open(path, "a") as f:
        f.write("checkpoint\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
open(path, "a").write("ready\\n")
time.sleep(float(sys.argv[2]))
"""


async def test_a_try_that_exits_0_after_its_stop_signal_is_stopped_not_succeeded(tmp_path: Path) -> None:
    """Stopped for a preemption, a time limit or a GPU fault, a task that saves its state and
    exits 0 has not finished its work: it ends KILLED (the leader makes that PREEMPTED,
    TIMEOUT...), so a preempted job runs again. One that ends on its own exits SUCCEEDED."""
    reports: list[tuple[AttemptState, int | None]] = []

    async def on_state(_task: object, state: AttemptState, code: int | None, *_: object) -> None:
        reports.append((state, code))

    log = tmp_path / "signals"
    run = Run(task(command=[sys.executable, "-c", CHECKPOINTS, str(log), "600"]), on_state, kill_grace_s=60.0)
    run.start()
    await _started(run, log)
    await asyncio.wait_for(run.stop("preempted", 60.0), timeout=120)
    await run.wait()
    assert "checkpoint" in log.read_text()
    assert reports[-1] == (AttemptState.KILLED, 0) and run.stop_reason == "preempted"

    reports.clear()
    done = Run(task(command=[sys.executable, "-c", CHECKPOINTS, str(tmp_path / "other"), "0"]), on_state)
    done.start()
    await asyncio.wait_for(done.wait(), timeout=120)
    assert reports[-1] == (AttemptState.SUCCEEDED, 0)


async def test_a_try_the_watchdog_stops_that_exits_0_on_its_sigterm_is_killed(tmp_path: Path) -> None:
    """The agent's watchdog (in this process here) fences a try that saves its state on the
    SIGTERM and exits 0: it ends KILLED with the watchdog's reason, not SUCCEEDED (found by
    a review: the exit 0 was taken as the try's own end). A try that had ended by itself,
    whose leftovers alone the watchdog stopped, stays SUCCEEDED."""
    from agent import watchdog

    reports: list[tuple[AttemptState, int | None, str]] = []

    async def on_state(_task: object, state: AttemptState, code: int | None, _tail: str, reason: str) -> None:
        reports.append((state, code, reason))

    log, runs, fenced = tmp_path / "signals", tmp_path / "runs", tmp_path / "fenced"
    runs.mkdir()
    t = task(command=[sys.executable, "-c", CHECKPOINTS, str(log), "600"])
    run = Run(t, on_state, kill_grace_s=60.0, fenced_dir=fenced)
    run.start()
    await _started(run, log)
    assert run.proc is not None
    (runs / t.attempt_id).write_text(f"{run.proc.pid} {watchdog.start_time(run.proc.pid)}\n")  # as the agent's
    wd = watchdog.Watchdog(str(tmp_path), str(runs), os.getpid(), stale_after_s=1.0, grace_s=30.0)
    wd.fence(time.monotonic())
    await asyncio.wait_for(run.wait(), timeout=120)
    assert "checkpoint" in log.read_text()
    assert reports[-1][:2] == (AttemptState.KILLED, 0) and "watchdog" in reports[-1][2], reports
    # The mark stays until the STATUS stream took the report (the agent removes it then:
    # a restart before reads the stop from it).
    assert (fenced / t.attempt_id).exists()

    # A try whose process exited by itself but was not reaped (its agent frozen: a zombie)
    # is marked as ended by itself, its leftovers alone stopped (found by a review).
    import subprocess

    zombie = subprocess.Popen(["true"], start_new_session=True)
    (runs / "z.1").write_text(f"{zombie.pid} {watchdog.start_time(zombie.pid)}\n")
    deadline = time.monotonic() + 30
    while not watchdog.exited(zombie.pid):
        assert time.monotonic() < deadline, "the process did not exit"
        await asyncio.sleep(0.05)
    wd.fence(time.monotonic())
    assert (fenced / "z.1").read_text().split()[1:] == [watchdog.LEFTOVERS_ONLY]
    assert zombie.wait() == 0

    reports.clear()
    t = task(command=["true"])
    (fenced / t.attempt_id).write_text(f"3.0 {watchdog.LEFTOVERS_ONLY}\n")  # its leftovers alone were stopped
    done = Run(t, on_state, fenced_dir=fenced)
    done.start()
    await asyncio.wait_for(done.wait(), timeout=120)
    assert reports[-1] == (AttemptState.SUCCEEDED, 0, ""), reports


async def test_a_stop_made_while_a_try_is_being_started_keeps_its_grace(tmp_path: Path) -> None:
    """A stop that comes before the try's process exists (the control plane's, with the
    queue's grace) is made once it does, with that grace, not the agent's default (found
    by a review: a 20 s grace became 1 s)."""
    async def on_state(*_: object) -> None:
        pass

    run = Run(task(command=[sys.executable, "-c", "import time; time.sleep(600)"]), on_state, kill_grace_s=1.0)
    run.start()
    await run.stop("preempted", 300.0)  # at once: no process yet
    deadline = time.monotonic() + 60
    while run._kill_at is None:
        assert time.monotonic() < deadline, "the stop was never made"
        await asyncio.sleep(0.01)
    assert run._kill_at - time.monotonic() > 200, run._kill_at - time.monotonic()
    await asyncio.wait_for(run.stop("done", 0.0), timeout=60)
    await asyncio.wait_for(run.wait(), timeout=60)


async def test_a_try_whose_start_could_not_be_reported_is_still_reported_ended(tmp_path: Path) -> None:
    """What the agent does on the try's start raises (its runs file could not be written):
    the try's end is still waited for and reported (found by a review: it never was, and
    its GPUs stayed held)."""
    got: list[AttemptState] = []

    async def on_state(_t: object, state: AttemptState, *_: object) -> None:
        got.append(state)
        if state is AttemptState.RUNNING:
            raise OSError(28, "No space left on device")

    run = Run(task(command=[sys.executable, "-c", "pass"]), on_state)
    run.start()
    await asyncio.wait_for(run.done.wait(), timeout=60)
    assert got == [AttemptState.RUNNING, AttemptState.SUCCEEDED], got


async def test_a_try_the_agent_cannot_record_for_its_watchdog_is_stopped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent cannot write the runs file its watchdog reads (a full disk): the try is
    stopped, saying why, and reported ended; unrecorded, no watchdog could stop it were the
    agent frozen while the control plane replaced it."""
    from agent.agent import Agent, AgentConfig

    agent = Agent(AgentConfig(nats_url="nats://127.0.0.1:4222", host_id="h1", state_dir=tmp_path / "agent"))
    reported: list[tuple[AttemptState, str]] = []

    async def report(_t: object, state: AttemptState, _code: object, _tail: str, reason: str, **_: object) -> None:
        reported.append((state, reason))

    def full(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(agent, "_report", report)
    monkeypatch.setattr(agent, "_record_run", full)
    log = tmp_path / "signals"
    t = task(command=[sys.executable, "-c", STUBBORN, str(log)])
    run = Run(t, agent._on_run_state, kill_grace_s=0.5)
    agent.runs[t.attempt_id] = run
    run.start()
    await asyncio.wait_for(run.done.wait(), timeout=120)
    assert [s for s, _ in reported] == [AttemptState.RUNNING, AttemptState.KILLED], reported
    assert "could not record it for its watchdog" in reported[-1][1], reported


async def test_a_stop_or_freeze_before_the_launcher_names_the_task_reaches_the_task(tmp_path: Path) -> None:
    """A review: between the launcher's start and its word of which process is the task
    (it stays the task's parent, in another process group), a freeze stopped the launcher
    alone, for good (the try never ended), and a stop's SIGTERM went to the launcher, which
    ignores it: the task got no checkpoint window, only the SIGKILL. Both wait now until
    the task is known. (The task is held there by a FIFO in place of its cgroup's
    `cgroup.procs`; `sleep` ends at its SIGTERM.)"""
    import json

    from agent.isolation import LAUNCHER, Isolation, Launch

    fifo, exit_file = tmp_path / "procs", tmp_path / "exit"
    os.mkfifo(fifo)
    iso = Isolation("early", run_as=pwd.getpwuid(os.geteuid()).pw_name, cgroup_mode="off",
                    private_dir=tmp_path / "private")

    def prepare(t: object, env: dict[str, str], shared_user: bool = False) -> Launch:
        spec = tmp_path / "spec.json"
        spec.write_text(json.dumps({"cgroup_procs": [str(fifo)], "cwd": "/", "env": env, "exit_file": str(exit_file),
                                    "command": ["sleep", "600"]}))
        return Launch([sys.executable, "-I", "-S", LAUNCHER, str(spec)], None, None, spec, exit_file)

    iso.prepare = prepare  # type: ignore[method-assign]
    ends: list[tuple[AttemptState, int | None]] = []

    async def on_state(_task: object, state: AttemptState, code: int | None, *_: object) -> None:
        ends.append((state, code))

    run = Run(task(command=["unused"]), on_state, kill_grace_s=600.0, isolation=iso, host_id="early")
    run.start()
    deadline = time.monotonic() + 30
    while run.proc is None:
        assert time.monotonic() < deadline, "the launcher did not start"
        await asyncio.sleep(0.01)
    run.freeze()
    stop = asyncio.create_task(run.stop("preempted", 30.0))
    await asyncio.sleep(0.2)
    with open(fifo) as f:  # the task's side goes on: it "joins its cgroup" and runs
        f.read()
    await asyncio.wait_for(stop, timeout=25)  # (its SIGTERM ends it: well within the 30 s grace)
    await asyncio.wait_for(run.wait(), timeout=60)
    assert ends[-1] == (AttemptState.KILLED, -signal.SIGTERM), ends
    iso.close()


async def test_a_try_whose_launcher_is_killed_alone_ends_as_the_hosts_want(tmp_path: Path) -> None:
    """A review: the launcher that stays the task's parent, killed alone (the OOM killer,
    an operator), ended the try FAILED -9 as the job's own failure, the task swept. It ends
    KILLED as the host's want (requeued, not counted), and the task does not run on."""
    from agent.isolation import Isolation

    iso = Isolation("orph", run_as=pwd.getpwuid(os.geteuid()).pw_name, cgroup_mode="off",
                    private_dir=tmp_path / "private", work_root=tmp_path / "work")
    log = tmp_path / "signals"
    ends: list[tuple[AttemptState, str]] = []

    async def on_state(_task: object, state: AttemptState, _code: object, _tail: object, reason: str) -> None:
        ends.append((state, reason))

    run = Run(task(command=[sys.executable, "-c", STUBBORN, str(log)]), on_state, kill_grace_s=1.0, isolation=iso,
              host_id="orph")
    run.start()
    await _started(run, log)
    assert run.proc is not None and run.task_pid and run.task_pid != run.proc.pid
    task_pid = run.task_pid
    os.kill(run.proc.pid, signal.SIGKILL)
    await asyncio.wait_for(run.wait(), timeout=60)
    assert ends[-1] == (AttemptState.KILLED, "its launcher was killed, and the task with it"), ends
    assert run.host_trouble
    def gone() -> bool:
        try:
            with open(f"/proc/{task_pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True

    deadline = time.monotonic() + 30
    while not gone():
        assert time.monotonic() < deadline, "the task runs on"
        await asyncio.sleep(0.05)
    iso.close()


WAIT_FOR_FILE = """
import os, sys, time
open(sys.argv[1] + ".ready", "w").close()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
"""


async def test_a_task_that_ended_before_its_stop_ends_as_it_ended(tmp_path: Path) -> None:
    """Found by exploring: a stop (a requeue, a preemption, a time limit) that came after
    the task had exited by itself, before its launcher was seen to end (the launcher's
    fsync of its record, the loop's delay), made a finished try KILLED, and it ran again.
    (The launcher is held with SIGSTOP to hold that moment open: the task a zombie.)"""
    from agent.isolation import Isolation
    from agent.watchdog import exited

    iso = Isolation("late", run_as=pwd.getpwuid(os.geteuid()).pw_name, cgroup_mode="off",
                    private_dir=tmp_path / "private", work_root=tmp_path / "work")
    go = tmp_path / "go"
    ends: list[tuple[AttemptState, int | None]] = []

    async def on_state(_task: object, state: AttemptState, code: int | None, *_: object) -> None:
        ends.append((state, code))

    run = Run(task(command=[sys.executable, "-c", WAIT_FOR_FILE, str(go)]), on_state, kill_grace_s=30.0,
              isolation=iso, host_id="late")
    run.start()
    deadline = time.monotonic() + 30
    while not (run.task_pid and Path(f"{go}.ready").exists()):
        assert time.monotonic() < deadline, "the task did not start"
        await asyncio.sleep(0.02)
    assert run.proc is not None
    os.kill(run.proc.pid, signal.SIGSTOP)
    try:
        go.touch()  # the task ends by itself, its launcher not waiting for it
        while not exited(run.task_pid):
            assert time.monotonic() < deadline, "the task did not end"
            await asyncio.sleep(0.02)
        stop = asyncio.create_task(run.stop("requeued by operator", 30.0))
        await asyncio.sleep(0.3)
        assert not run.signaled
    finally:
        os.kill(run.proc.pid, signal.SIGCONT)
    await asyncio.wait_for(stop, timeout=25)
    await asyncio.wait_for(run.wait(), timeout=60)
    assert ends[-1] == (AttemptState.SUCCEEDED, 0), ends
    iso.close()


async def test_a_launcher_that_could_not_write_the_tasks_end_ends_the_try_as_the_task_did(tmp_path: Path) -> None:
    """Found by exploring: with the state directory's disk full the launcher could not
    write the task's end; the try that succeeded was taken for one whose launcher was
    killed (KILLED, the host's trouble) and ran again. The record is made when the task
    starts and written over in place at its end; and a launcher that exited (not killed
    by a signal) without writing it (here the task put a directory in its place) ends the
    try as its task did."""
    import json

    from agent.isolation import LAUNCHER, Isolation, Launch

    exit_file = tmp_path / "exit"
    iso = Isolation("full", run_as=pwd.getpwuid(os.geteuid()).pw_name, cgroup_mode="off",
                    private_dir=tmp_path / "private")
    ends: list[tuple[AttemptState, int | None, str]] = []

    def prepare(_t: object, env: dict[str, str], shared_user: bool = False) -> Launch:
        spec = tmp_path / "spec.json"
        spec.write_text(json.dumps({"cwd": "/", "env": env, "exit_file": str(exit_file), "command": [
            "sh", "-c", 'grep -q running "$1" && rm "$1" && mkdir "$1" && exit $0', code, str(exit_file)]}))
        return Launch([sys.executable, "-I", "-S", LAUNCHER, str(spec)], None, None, spec, exit_file)

    iso.prepare = prepare  # type: ignore[method-assign]

    async def on_state(_task: object, state: AttemptState, c: int | None, _tail: object, reason: str) -> None:
        ends.append((state, c, reason))

    for code, state in (("0", AttemptState.SUCCEEDED), ("3", AttemptState.FAILED)):
        run = Run(task(command=["unused"]), on_state, kill_grace_s=5.0, isolation=iso, host_id="full")
        run.start()
        await asyncio.wait_for(run.wait(), timeout=60)
        assert run.task_pid and ends[-1][:2] == (state, int(code)) and not run.host_trouble, ends
        exit_file.rmdir()
    iso.close()
