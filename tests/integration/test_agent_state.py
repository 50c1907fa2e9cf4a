"""The agent's state directory (`--state-dir`): what it keeps there outlives a crash of
the machine, and a restarted agent reads it right."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.agent import Agent, AgentConfig
from agent.watchdog import RunRecord, Watchdog, read_run, run_record, start_time, this_boot
from server.state.streams import ensure_streams
from tests.conftest import ROOT, eventually
from tests.factories import host_alloc, task
from tests.integration.conftest import process_gone
from tests.integration.test_agent import ME, QUICK, running_agent, start_heartbeats_stored, status_reports
from wire import subjects
from wire.kv import Store, connect
from wire.messages import AttemptState, StatusReport, encode

PY = sys.executable


@pytest.fixture
async def kv(nats_url: str) -> AsyncIterator[Store]:
    """The test's own connection's store, the control plane's streams made."""
    nc = await connect(nats_url, name="test-agent-state")
    try:
        store = Store(nc)
        await ensure_streams(store)
        yield store
    finally:
        await nc.close()


def agent_process(nats_url: str, tmp_path: Path, host_id: str, **cfg: Any) -> subprocess.Popen[bytes]:
    """`muster agent` as a process of its own (to be killed -9), on the state directory
    `running_agent` gives an agent of this process: `tmp_path/agent`."""
    argv = [PY, "-m", "agent", "--nats", nats_url, "--host-id", host_id, "--state-dir", str(tmp_path / "agent"),
            "--simulate-gpus", "1xH100", "--cpus", "4", "--memory-mb", "4096", "--run-as", ME]
    for k, v in cfg.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    log = open(tmp_path / f"agent-{host_id}.log", "ab")
    try:
        return subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    finally:
        log.close()


def quiet_agent(tmp_path: Path, host_id: str, **cfg: Any) -> Agent:
    """An agent made and not run (no NATS): its state directory `tmp_path/agent`."""
    return Agent(AgentConfig(nats_url="nats://127.0.0.1:1", host_id=host_id, simulate_gpus="1xH100",
                             state_dir=tmp_path / "agent", cpus=4, memory_mb=4096, run_as=ME, **cfg))


def test_the_instance_and_the_kept_reports_are_put_in_place_durably(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A file put in place by a rename keeps its name through a crash of the machine only
    once its directory is synced: the agent's instance file (without it a restart takes
    the stateless path) and a try's kept report (without it a restart reports the try LOST,
    and it runs again) are synced, then renamed, then their directory synced; the instance
    was written over in place, unsynced."""
    agent = quiet_agent(tmp_path, "du-1")
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        events.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    try:
        agent._take_instance()
        r = StatusReport(host_id="du-1", attempt_id="j.1", job_id="j", state=AttemptState.SUCCEEDED, ts=1.0)
        agent._persist_unsent(r, "j.1:SUCCEEDED")
    finally:
        agent.gpus.close()
        agent.isolation.close()
    state = tmp_path / "agent"
    for path in (state / "du-1.instance", state / "du-1.reports" / "j.1"):
        assert ("fsync", f"{path}.tmp") in events and ("replace", str(path)) in events, events
        synced, renamed = events.index(("fsync", f"{path}.tmp")), events.index(("replace", str(path)))
        dir_synced = [i for i, e in enumerate(events) if e == ("fsync", str(path.parent)) and i > renamed]
        assert synced < renamed and dir_synced, (path, events)
    assert (state / "du-1.instance").read_text() == agent.instance + "\n"


@contextlib.contextmanager
def sleepers(n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`n` processes, each in a session of its own as a try's task is, killed at the end."""
    procs = [subprocess.Popen(["sleep", "600"], start_new_session=True) for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_a_run_record_reads_back_as_written() -> None:
    """A run record's fields, the boot that wrote it and a stop's end among them, read back
    as written; an older record without them reads with none."""
    line = run_record(12, "345", True, 11, "340", ["/sys/fs/cgroup/memory/m/a b.1"], "/w/a b.1", kill_at=987.25)
    r = read_run(line)
    assert r == RunRecord(12, "345", True, (11, "340"), ["/sys/fs/cgroup/memory/m/a b.1"], "/w/a b.1", this_boot(),
                          987.25)
    assert r.line() == line and read_run(r._replace(kill_at=None).line()).kill_at is None
    assert read_run("12 345 keep sup:11:340\n") == RunRecord(12, "345", True, (11, "340"), [], None, "", None)


def test_a_run_record_of_another_boot_has_no_process_signalled(tmp_path: Path) -> None:
    """Found by an exploration: run records carried no boot id, and a pid and start tick
    that come again after a reboot would have had an unrelated process killed by the next
    agent (or its watchdog). A record says which boot wrote it; one from another boot is
    a try whose processes are certainly gone: nothing is signalled, the record goes. A
    record of this boot, and an older one without a boot, are read as before."""
    agent = quiet_agent(tmp_path, "bo-1")
    try:
        with sleepers(3) as (other, now, old):
            runs = agent._runs_dir
            assert read_run(run_record(now.pid, start_time(now.pid), False)).boot == this_boot() != ""
            (runs / "j-other.1").write_text(f"{other.pid} {start_time(other.pid)} boot:{uuid.uuid4()}\n")
            (runs / "j-now.1").write_text(run_record(now.pid, start_time(now.pid), False))
            (runs / "j-old.1").write_text(f"{old.pid} {start_time(old.pid)}\n")  # an older agent's record
            assert read_run((runs / "j-old.1").read_text()).boot == ""
            # The watchdog, too, leaves another boot's record alone.
            watch = tmp_path / "watch"
            watch.mkdir()
            dog = Watchdog(str(watch), str(runs), 2**22 + 1, 1.0, 60.0)  # (no such agent)
            dog.fence(time.monotonic())
            assert sorted(dog.fenced) == ["j-now.1", "j-old.1"]
            assert sorted(agent._kill_leftovers()) == ["j-now.1", "j-old.1"]
            assert now.wait(10) < 0 and old.wait(10) < 0  # (the watchdog's SIGTERM, or the SIGKILL)
            assert other.poll() is None
            assert not list(runs.iterdir())
    finally:
        agent.gpus.close()
        agent.isolation.close()


# A try's task: notes "start"; on SIGTERM notes "term", and then the saver checkpoints
# (waits for the gate, notes "saved" and exits 0), the stubborn one goes on (only a
# SIGKILL ends it).
GRACEFUL = """
import signal, sys, time
from pathlib import Path
marks, gate, name = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
def note(what):
    with open(marks, "a") as f:
        f.write(f"{name} {what}\\n")
def on_term(*_):
    note("term")
    if name == "saver":
        while not gate.exists():
            time.sleep(0.05)
        note("saved")
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
note("start")
while True:
    time.sleep(0.1)
"""


async def test_an_agent_restarted_in_a_stops_grace_lets_the_grace_run_to_its_end(
        nats_url: str, tmp_path: Path, kv: Store) -> None:
    """Found by an exploration: an agent killed (-9) while it stopped a try (SIGTERM sent,
    its grace running: a preemption's checkpoint window, MUSTER_PREEMPT_DEADLINE) and
    started again killed the task at once, at its start, as any leftover: the checkpoint
    was cut short. The stop's SIGKILL time is in the try's run record; the next agent lets
    the task run to it (one that ends in its grace ends as it did), kills it then, and only
    then reports the stop done."""
    host = "gr-1"
    cfg = dict(heartbeat_interval=1, ttl_intervals=60, fence_after=30,  # (no fence nor watchdog in the way)
               cgroup_name=f"muster-{host}-{zlib.crc32(str(tmp_path).encode()):08x}")
    marks, gate = tmp_path / "marks", tmp_path / "gate"
    saver, stubborn = (task(f"j-{name}", command=[PY, "-c", GRACEFUL, str(marks), str(gate), name], cpus=1,
                            memory_mb=64, term=1) for name in ("saver", "stubborn"))

    def noted(*lines: str) -> bool:
        return marks.exists() and set(lines) <= set(marks.read_text().splitlines())

    first = agent_process(nats_url, tmp_path, host, **cfg)
    try:
        await kv.put(subjects.alloc_key(host), encode(host_alloc(host, [saver, stubborn], term=1)))
        await eventually(lambda: noted("saver start", "stubborn start"), timeout=60, what="both tasks started")
        stops = [t.model_copy(update={"stop": True, "stop_reason": "preempted for job k", "grace_s": grace})
                 for t, grace in ((saver, 300.0), (stubborn, 8.0))]
        stopped_at = time.monotonic()
        await kv.put(subjects.alloc_key(host), encode(host_alloc(host, stops, term=1)))
        await eventually(lambda: noted("saver term", "stubborn term"), timeout=60, what="both tasks told to stop")
        runs = tmp_path / "agent" / f"{host}.runs"
        pids = {t.attempt_id: read_run((runs / t.attempt_id).read_text()).pid for t in (saver, stubborn)}
    finally:
        first.kill()
        first.wait()
    async with status_reports(kv.nc, host) as delivered, \
            running_agent(nats_url, tmp_path, host, heartbeat_interval_s=1.0, ttl_intervals=60, fence_after_s=30.0,
                          cgroup_name=cfg["cgroup_name"]) as agent:
        await start_heartbeats_stored(agent)
        assert not process_gone(pids[saver.attempt_id]), "the saver was killed in its grace"

        def ended(t: Any) -> list[StatusReport]:
            return [d for d in delivered if d.attempt_id == t.attempt_id and d.state.terminal]

        await eventually(lambda: process_gone(pids[stubborn.attempt_id]), timeout=90, what="the stubborn one killed")
        assert time.monotonic() >= stopped_at + 8.0  # not before the end of its grace
        await eventually(lambda: ended(stubborn), timeout=60, what="the stubborn one's stop reported")
        assert not process_gone(pids[saver.attempt_id]) and not ended(saver)
        gate.write_text("go")
        await eventually(lambda: ended(saver), timeout=60, what="the saver's stop reported")
        assert noted("saver saved")
        for t, how in ((saver, "ended in its grace"), (stubborn, "killed at the end of its grace")):
            [r] = ended(t)
            assert r.state is AttemptState.KILLED and r.reason.startswith("preempted for job k"), r
            assert how in r.reason, r
        await eventually(lambda: not list(runs.iterdir()), timeout=30, what="the run records removed")


async def test_a_try_its_agent_stopped_itself_before_a_restart_ends_killed_not_by_its_exit(
        nats_url: str, tmp_path: Path, kv: Store) -> None:
    """Found by a review: an agent's own stop (its orderly shutdown, SIGTERM to it) puts the
    grace's end in the try's run record too; killed (-9) in that grace and started again,
    the next agent let the task run on, and reported it by its exit: a task that saved its
    state and exited 0 on SIGTERM was SUCCEEDED (its job ended for good, unfinished). A
    stop begun by the agent itself ends KILLED, as a live agent's run says, and as the
    host's doing (requeued, not counted against the job)."""
    import signal

    host = "gs-1"
    cfg = dict(heartbeat_interval=1, ttl_intervals=60, fence_after=30, kill_grace=300,
               cgroup_name=f"muster-{host}-{zlib.crc32(str(tmp_path).encode()):08x}")
    marks, gate = tmp_path / "marks", tmp_path / "gate"
    saver = task("j-saver", command=[PY, "-c", GRACEFUL, str(marks), str(gate), "saver"], cpus=1, memory_mb=64,
                 term=1)

    def noted(*lines: str) -> bool:
        return marks.exists() and set(lines) <= set(marks.read_text().splitlines())

    first = agent_process(nats_url, tmp_path, host, **cfg)
    try:
        await kv.put(subjects.alloc_key(host), encode(host_alloc(host, [saver], term=1)))
        await eventually(lambda: noted("saver start"), timeout=60, what="the task started")
        first.send_signal(signal.SIGTERM)  # its orderly shutdown stops the try: SIGTERM, its grace
        await eventually(lambda: noted("saver term"), timeout=60, what="the task told to stop")
        runs = tmp_path / "agent" / f"{host}.runs"
        await eventually(lambda: read_run((runs / saver.attempt_id).read_text()).kill_at is not None, timeout=30,
                         what="the grace's end recorded")
    finally:
        first.kill()
        first.wait()
    async with status_reports(kv.nc, host) as delivered, \
            running_agent(nats_url, tmp_path, host, heartbeat_interval_s=1.0, ttl_intervals=60, fence_after_s=30.0,
                          cgroup_name=cfg["cgroup_name"]) as agent:
        await start_heartbeats_stored(agent)
        gate.write_text("go")  # it saves its state and exits 0, in its grace

        def ended() -> list[StatusReport]:
            return [d for d in delivered if d.attempt_id == saver.attempt_id and d.state.terminal]

        await eventually(ended, timeout=60, what="the try's end reported")
        assert noted("saver saved")
        [r] = ended()
        assert r.state is AttemptState.KILLED and r.host_trouble, r
        assert "stopped by its agent" in r.reason, r


def test_a_try_left_in_its_grace_dies_before_the_previous_agents_key_could_expire(tmp_path: Path) -> None:
    """Found by a review: a try a previous agent was stopping, left to run to its grace's
    end (minutes away) by the next agent, was not bounded by the heartbeat key while that
    agent could not store a heartbeat of its own (NATS unreachable at its start): the key,
    the previous agent's, expired a TTL after its last heartbeat, the leader freed the try's
    place, and the task ran on. Until the new agent's first heartbeat is stored in time, the
    try is killed by the previous one's fence deadline."""
    agent = quiet_agent(tmp_path, "gb-1", heartbeat_interval_s=1.0, ttl_intervals=15, fence_after_s=5.0)
    try:
        now = time.monotonic()
        r = RunRecord(pid=1, start="1", keep=False, launcher=None, cgroups=[], work_dir=None, kill_at=now + 600)
        deadline = agent.fence_timing()[1]
        assert agent._grace_ends(r) == now + 600  # no previous agent's heartbeat known: its grace's end
        agent._previous_heard = now - 3
        assert agent._grace_ends(r) == pytest.approx(now - 3 + deadline)  # none of this one's stored yet
        agent._first_stored = now - 2  # stored in time: the key is this agent's, alive
        assert agent._grace_ends(r) == now + 600
        agent._first_stored = now - 3 + deadline + 1  # stored too late: the key may have expired before
        assert agent._grace_ends(r) == pytest.approx(now - 3 + deadline)
    finally:
        agent.isolation.close()


async def test_a_state_directory_removed_under_a_running_agent_is_written_again(
        nats_url: str, tmp_path: Path, kv: Store) -> None:
    """Found by an exploration: the state directory removed under a running agent (an
    operator's `rm -rf`, a temporary files' cleaner) was made again empty, without its
    launchers' directory (every later try was KILLED, "the host could not start it"), and
    without the running tries' records, the instance file and the lock: killed (-9) and
    started again, the agent took the stateless path and never killed the old task, which
    ran on unknown to everything. The agent notices the loss at its next heartbeat and
    writes it all again: a later try runs, and the next agent kills the old task and
    reports it as a restart does."""
    host = "sd-1"
    cfg = dict(heartbeat_interval=0.5, ttl_intervals=120, fence_after=30,  # (no fence nor watchdog in the way)
               cgroup_name=f"muster-{host}-{zlib.crc32(str(tmp_path).encode()):08x}")
    marks = tmp_path / "marks"
    long, later = (task(f"j-{name}", command=["sh", "-c", f"echo {name} >> {marks}; exec sleep 600"], cpus=1,
                        memory_mb=64, term=1) for name in ("long", "later"))

    def noted(*names: str) -> bool:
        return marks.exists() and set(names) <= set(marks.read_text().split())

    state = tmp_path / "agent"
    runs, instance, lock = state / f"{host}.runs", state / f"{host}.instance", state / f"{host}.lock"
    first = agent_process(nats_url, tmp_path, host, **cfg)
    try:
        await kv.put(subjects.alloc_key(host), encode(host_alloc(host, [long], term=1)))
        await eventually(lambda: noted("long") and (runs / long.attempt_id).exists(), timeout=60,
                         what="the try running")
        pid = read_run((runs / long.attempt_id).read_text()).pid
        written = instance.read_text()
        shutil.rmtree(state)
        await eventually(lambda: (runs / long.attempt_id).exists() and instance.exists() and lock.exists(),
                         timeout=30, what="the state written again")
        assert instance.read_text() == written and read_run((runs / long.attempt_id).read_text()).pid == pid
        assert long.attempt_id in (state / f"{host}.seen").read_text().split()
        with open(lock) as f:  # held again by the agent
            with pytest.raises(BlockingIOError):
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        await kv.put(subjects.alloc_key(host), encode(host_alloc(host, [long, later], term=1)))
        await eventually(lambda: noted("later"), timeout=60, what="a later try started")
        assert "state directory" in (tmp_path / f"agent-{host}.log").read_text()
    finally:
        first.kill()
        first.wait()
    assert not process_gone(pid)
    async with status_reports(kv.nc, host) as delivered, \
            running_agent(nats_url, tmp_path, host, heartbeat_interval_s=0.5, ttl_intervals=120, fence_after_s=30.0,
                          cgroup_name=cfg["cgroup_name"]) as agent:
        await eventually(lambda: process_gone(pid), timeout=60, what="the old task killed by the next agent")
        assert not agent._stateless_after  # (the last agent's state found: not the stateless path)
        await eventually(lambda: any(d.attempt_id == long.attempt_id for d in delivered), timeout=60,
                         what="the old try reported")
        [r] = [d for d in delivered if d.attempt_id == long.attempt_id]
        assert r.state is AttemptState.LOST and "agent restarted" in r.reason, r


def test_a_state_directory_made_again_by_a_note_since_is_written_again_whole(tmp_path: Path) -> None:
    """The state directory lost, a note of a try seen written before the next heartbeat's
    look made it again with a seen file of that try alone: the look writes again every try
    seen, the instance, the launchers' directories, and takes the lock of the new lock file."""
    agent = quiet_agent(tmp_path, "sd-3")
    state = tmp_path / "agent"
    try:
        agent._lock_state_dir()
        agent._take_instance()
        agent._state_watch.mark()
        agent._mark_seen("j-a.1")
        agent._look_at_state_dir()  # nothing lost: nothing written
        shutil.rmtree(state)
        agent._mark_seen("j-b.1")
        assert (state / "sd-3.seen").read_text().split() == ["j-b.1"]
        agent._look_at_state_dir()
        assert sorted((state / "sd-3.seen").read_text().split()) == ["j-a.1", "j-b.1"]
        assert (state / "sd-3.instance").read_text() == agent.instance + "\n"
        assert agent.isolation.exits_dir.is_dir() and agent.pressure() == ""
        with open(state / "sd-3.lock") as f, pytest.raises(BlockingIOError):
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        agent._unlock_state_dir()
        agent.gpus.close()
        agent.isolation.close()


async def test_a_state_directory_that_cannot_be_written_again_keeps_new_work_away(
        nats_url: str, tmp_path: Path, kv: Store) -> None:
    """A state directory lost that cannot be written again (here a file took its place)
    leaves the agent unable to note what it starts or record it for its watchdog: the host
    asks for no new work (`Heartbeat.pressure`) until a later heartbeat's try writes it
    again."""
    state = tmp_path / "agent"
    async with running_agent(nats_url, tmp_path, "sd-2", **QUICK) as agent:
        await start_heartbeats_stored(agent)
        assert agent.pressure() == ""
        shutil.rmtree(state)
        state.write_text("not a directory")
        await eventually(lambda: "state directory lost" in agent.pressure(), timeout=30, what="the host in trouble")
        state.unlink()
        await eventually(lambda: agent.pressure() == "", timeout=30, what="the trouble over")
        assert (state / "sd-2.instance").read_text() == agent.instance + "\n"
        assert (state / "sd-2.launch" / "exits").is_dir()
