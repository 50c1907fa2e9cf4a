"""The agent in-process against a real nats-server: what it does with an assignment
whose end it already reported, with one that arrives while it is fenced, and with its
frozen attempts when heartbeats are stored again."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.agent import Agent, AgentConfig
from agent.gpu import GpuBackend, SimulatedBackend
from server.state.streams import ensure_streams
from tests.conftest import eventually
from tests.factories import host_alloc, task
from wire import subjects
from wire.kv import Store, connect
from wire.messages import AttemptState, Heartbeat, StatusReport, decode, encode

ME = pwd.getpwuid(os.geteuid()).pw_name  # the tasks write to the test's directory


# A short heartbeat, TTL and fence: what most of these tests run their agents with.
QUICK: dict[str, Any] = dict(heartbeat_interval_s=0.5, ttl_intervals=6, fence_after_s=2.5)


@pytest.fixture
async def store(nats_url: str) -> AsyncIterator[Store]:
    """The test's own connection's store, the control plane's streams made."""
    nc = await connect(nats_url, name="test-agent")
    try:
        kv = Store(nc)
        await ensure_streams(kv)
        yield kv
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def status_reports(nc: Any, host_id: str) -> AsyncIterator[list[StatusReport]]:
    """The status reports of `host_id` stored while the block runs, as they arrive."""
    delivered: list[StatusReport] = []

    async def on_status(msg: Any) -> None:
        delivered.append(decode(StatusReport, msg.data))

    sub = await nc.subscribe(subjects.status_subject(host_id), cb=on_status)
    try:
        yield delivered
    finally:
        await sub.unsubscribe()


@contextlib.asynccontextmanager
async def running_agent(nats_url: str, tmp_path: Path, host_id: str, gpus: GpuBackend | None = None,
                        **cfg: Any) -> AsyncIterator[Agent]:
    """An agent run in this process (one simulated GPU unless given `gpus`, tasks as the
    test's user) until the block ends; then its clean shutdown."""
    agent = Agent(AgentConfig(nats_url=nats_url, host_id=host_id, simulate_gpus="1xH100", state_dir=tmp_path / "agent",
                              cpus=4, memory_mb=4096, run_as=ME, **cfg), gpus=gpus)
    stop = asyncio.Event()
    run = asyncio.create_task(agent.run(stop))
    try:
        yield agent
    finally:
        stop.set()
        await asyncio.wait_for(run, timeout=30)


async def start_heartbeats_stored(agent: Agent) -> None:
    """Until both heartbeats of the agent's start are stored: the one claiming the host's
    key, then the heartbeat loop's first, which comes at once. (A test that fenced the
    agent between the two, on a loaded machine, saw the loop's first heartbeat end the
    fence and start the work: seen in clean clones beside other load.)"""
    await eventually(lambda: agent.hb_seq >= 2 and agent._hb_rev is not None and not agent._unacked,
                     timeout=60, what="the agent's first heartbeats")


async def test_an_attempt_still_assigned_after_its_end_was_reported_is_reported_again(
        nats_url: str, tmp_path: Path, store: Store) -> None:
    """Nobody applies the agent's SUCCEEDED report (as when a new leader whose view
    lagged dropped it as stale): the assignment keeps listing the attempt, so the agent
    reports its end again, and stops once the assignment no longer lists it. It never
    runs the attempt a second time."""
    marks = tmp_path / "runs"
    async with running_agent(nats_url, tmp_path, "ra-1", heartbeat_interval_s=0.5, ttl_intervals=6,
                             fence_after_s=2.5, resend_after_s=1.0) as agent:
        t = task("j-ra", command=["sh", "-c", f"echo ran >> {marks}"], cpus=1, memory_mb=64, term=1)
        await store.put(subjects.alloc_key("ra-1"), encode(host_alloc("ra-1", [t], term=1)))

        subject = subjects.status_subject("ra-1")

        async def reported() -> int:
            """Reports of the attempt in the STATUS stream (its RUNNING once, then ends)."""
            info = await store.js.stream_info(subjects.STATUS_STREAM, subjects_filter=subject)
            return int((info.state.subjects or {}).get(subject, 0))

        async def last() -> StatusReport:
            return decode(StatusReport, (await store.js.get_last_msg(subjects.STATUS_STREAM, subject)).data)

        for _ in range(200):
            if await reported() >= 3:
                break
            await asyncio.sleep(0.1)
        assert await reported() >= 3, f"{await reported()} reports"
        r = await last()
        assert (r.attempt_id, r.job_id, r.state) == ("j-ra.1", "j-ra", AttemptState.SUCCEEDED)
        assert r.instance == agent.instance  # which agent process sent it (ClusterState.heard_from)
        assert marks.read_text().splitlines() == ["ran"]  # reported again, never run again

        # The end is applied: the assignment drops the attempt; no more reports of it.
        await store.put(subjects.alloc_key("ra-1"), encode(host_alloc("ra-1", [], term=1)))
        for _ in range(100):
            if not agent._assigned:
                break
            await asyncio.sleep(0.05)
        assert not agent._assigned
        for _ in range(200):  # a report queued before the assignment changed lands first
            if not agent._reports:
                break
            await asyncio.sleep(0.05)
        assert not agent._reports
        before = await reported()
        await asyncio.sleep(2.5)  # more than resend_after_s
        assert await reported() == before
        assert marks.read_text().splitlines() == ["ran"]


async def test_the_watchdog_is_started_again_when_it_dies(nats_url: str, tmp_path: Path) -> None:
    """The agent's watchdog (agent.watchdog) runs beside it; killed, it is started again;
    the agent's clean shutdown ends it."""
    import os
    import signal

    async with running_agent(nats_url, tmp_path, "wd-1", heartbeat_interval_s=0.5, ttl_intervals=6,
                             fence_after_s=2.5) as agent:
        for _ in range(100):
            if agent._watchdog is not None:
                break
            await asyncio.sleep(0.05)
        first = agent._watchdog
        assert first is not None and first.poll() is None
        os.kill(first.pid, signal.SIGKILL)
        for _ in range(200):
            if agent._watchdog is not first and agent._watchdog is not None:
                break
            await asyncio.sleep(0.05)
        second = agent._watchdog
        assert second is not first and second is not None and second.poll() is None
        assert agent.watchdog_restarts == 1
    assert agent._watchdog is None and second.returncode == 0  # ended by the clean shutdown


async def test_the_watchdogs_directory_removed_is_made_again(nats_url: str, tmp_path: Path, store: Store) -> None:
    """Found by exploring: the watchdog's directory removed by hand was never made again,
    and the watchdog, reading no heartbeat, stopped every try of a healthy agent, new ones
    too. The agent makes it again at its next heartbeat."""
    import shutil

    async with running_agent(nats_url, tmp_path, "wd-2", heartbeat_interval_s=0.5, ttl_intervals=6,
                             fence_after_s=2.5) as agent:
        alive = agent._watch_dir / "alive"
        for _ in range(200):
            if alive.exists():
                break
            await asyncio.sleep(0.05)
        assert alive.exists()
        shutil.rmtree(agent._watch_dir)
        for _ in range(200):
            if alive.exists():
                break
            await asyncio.sleep(0.05)
        assert alive.exists() and alive.read_text().split()[0] == str(os.getpid())


async def test_an_assignment_that_arrives_while_fenced_runs_once_heartbeats_resume(
        nats_url: str, tmp_path: Path, store: Store) -> None:
    """A fenced agent (cut off from the control plane) starts nothing; the assignment
    that reached it meanwhile is not taken as applied, so the read of the record when
    heartbeats resume starts its work (it stayed PLACED for good when the record counted
    as applied: the leader's resends of the same revision were ignored too)."""
    marks = tmp_path / "runs"
    # One heartbeat at the start, seen before the test fences the agent, and none after
    # it: a heartbeat taken while the test holds the agent fenced would end the fence
    # (and start the work) by itself. Seen in clean-clone runs on a loaded machine with
    # a 5 s interval, and with a 30 s one when the first heartbeat came only after the
    # test had stopped waiting for it and fenced the agent.
    async with running_agent(nats_url, tmp_path, "fz-1", heartbeat_interval_s=300.0, ttl_intervals=3,
                             fence_after_s=600.0) as agent:
        await start_heartbeats_stored(agent)
        agent.fenced = True  # as _check_fence sets it when heartbeats fail
        t = task("j-fz", command=["sh", "-c", f"echo ran >> {marks}"], cpus=1, memory_mb=64, term=1)
        await store.put(subjects.alloc_key("fz-1"), encode(host_alloc("fz-1", [t], term=1)))
        for _ in range(200):
            if "j-fz.1" in agent._assigned:
                break
            await asyncio.sleep(0.05)
        assert "j-fz.1" in agent._assigned  # the record reached the agent ...
        assert "j-fz.1" not in agent.runs and not marks.exists()  # ... which started nothing
        # Heartbeats resume (what the heartbeat loop does then):
        agent.fenced = False
        await agent._refresh_assignments()
        # The shell's ">>" creates the file before echo writes to it: wait for the line.
        await eventually(lambda: marks.exists() and marks.read_text() != "", timeout=10, what="the task's mark")
        assert marks.read_text().splitlines() == ["ran"]


MARKER = """
import signal, sys, time
def stop(*_):
    open(sys.argv[1], "a").write("stop\\n"); sys.exit(143)
signal.signal(signal.SIGTERM, stop)
open(sys.argv[1], "a").write("start\\n")
while True:
    time.sleep(0.05)
"""


async def test_frozen_attempts_go_on_only_when_the_stored_heartbeat_was_checked(nats_url: str, tmp_path: Path,
                                                                                store: Store) -> None:
    """The agent freezes its attempts at the fence. A heartbeat stored afterwards continues
    them only if it was checked against the last one stored before (the key held); stored
    without that check (the agent knew of none to check against), they are stopped: the
    key may have expired meanwhile."""
    import sys

    from agent.agent import FENCED_REASON
    from tests.integration.conftest import group_frozen, group_running

    # Heartbeats far apart and a fence far away: the test moves the agent's clock of the
    # last stored heartbeat back to fence it, and plays the heartbeat's outcome itself.
    async with running_agent(nats_url, tmp_path, "fr-1", heartbeat_interval_s=300.0, ttl_intervals=3,
                             fence_after_s=600.0) as agent:
        await start_heartbeats_stored(agent)
        logs = {k: tmp_path / f"{k}.log" for k in ("a", "b")}
        tasks = [task(f"j-{k}", command=[sys.executable, "-c", MARKER, str(logs[k])], cpus=1, memory_mb=64,
                      term=1) for k in logs]
        await store.put(subjects.alloc_key("fr-1"), encode(host_alloc("fr-1", tasks, term=1)))
        await eventually(lambda: all(f.exists() and "start" in f.read_text() for f in logs.values()),
                         timeout=60, what="both attempts running")
        groups = [agent.runs[t.attempt_id].group_pid for t in tasks]

        async def fence() -> None:
            # No heartbeat stored for 100 s longer than fence_after: the agent notices late
            # (as one frozen with SIGSTOP does), and its fence began those 100 s ago.
            agent.last_heartbeat_ok -= 700.0
            await agent._check_fence()
            assert agent.fenced and set(agent._frozen) == {t.attempt_id for t in tasks}
            await eventually(lambda: all(group_frozen(g) for g in groups), timeout=30,
                             what="the attempts frozen")
            agent.last_heartbeat_ok += 700.0

        await fence()
        agent._end_fence(key_intact=True)  # a heartbeat stored over the last one before
        assert agent.last_fence_s >= 100.0  # it told the time it saw the fence (~0 s) before
        await eventually(lambda: all(group_running(g) for g in groups), timeout=30,
                         what="the attempts continued")
        assert agent.fence_continued == 2 and all(f.read_text().split() == ["start"] for f in logs.values())

        await fence()
        agent._end_fence(key_intact=False)  # a heartbeat stored without the check
        # Both attempts stopped (SIGTERM, their handlers ran), reported KILLED as fenced.
        await eventually(lambda: not agent.runs, timeout=60, what="the attempts stopped")
        assert all(f.read_text().split() == ["start", "stop"] for f in logs.values())
        # An attempt leaves `runs` when it ends and enters `_ended` once the STATUS
        # stream has taken its report: wait for both reports, then check them.
        await eventually(lambda: len(agent._ended) == 2, timeout=60, what="both ends reported")
        assert {r.attempt_id: (r.state, r.reason) for r, _ in agent._ended.values()} == {
            f"j-{k}.1": (AttemptState.KILLED, FENCED_REASON) for k in logs}
        # The heartbeat tells the control plane of both fences and what they did.
        hb = agent.heartbeat()
        assert (hb.fences, hb.fence_continued, hb.fence_stopped) == (2, 2, 2) and hb.last_fence_s > 0


async def test_a_refused_heartbeat_reads_the_key_to_tell_a_lost_acknowledgement_from_a_change(
        nats_url: str, tmp_path: Path, store: Store) -> None:
    """After a checked heartbeat is refused the agent reads its key: its own heartbeat,
    sent with the check and never acknowledged, there byte for byte, is adopted (the chain
    goes on from it); the very heartbeat the refused one was checked against (a replica
    behind) tells nothing; anything else is a change."""
    key = subjects.kv_subject(subjects.HOSTS_BUCKET, "ak-1")
    # Heartbeats far apart: the test plays them itself.
    async with running_agent(nats_url, tmp_path, "ak-1", heartbeat_interval_s=300.0, ttl_intervals=3,
                             fence_after_s=600.0) as agent:
        await start_heartbeats_stored(agent)
        probe = agent._hb_rev
        assert probe is not None
        assert await agent._adopt_unacknowledged(probe) == "unknown"  # the key shows the probe itself
        # A heartbeat of the agent's, sent with the check, whose acknowledgement was lost.
        hb = agent.heartbeat()
        data = encode(hb)
        agent._unacked[hb.seq] = (data, 1.0)
        ack = await store.js.publish(key, data, headers={"Nats-TTL": "900s",
                                                         "Nats-Expected-Last-Subject-Sequence": str(probe)})
        assert await agent._adopt_unacknowledged(probe) == "adopted"
        assert agent._hb_rev == ack.seq and agent.adopted == 1 and not agent._unacked
        # A heartbeat for this host the agent did not send (another process, by hand),
        # while one of its own is still unacknowledged: a change.
        agent._unacked[hb.seq + 1] = (encode(agent.heartbeat()), 2.0)
        forged = hb.model_copy(update={"seq": hb.seq + 100})
        await store.js.publish(key, encode(forged), headers={"Nats-TTL": "900s"})
        assert await agent._adopt_unacknowledged(ack.seq) == "changed"


async def test_a_task_that_fails_with_its_gpu_is_reported_with_the_fault_after_a_heartbeat_shows_it(
        nats_url: str, tmp_path: Path, store: Store) -> None:
    """The task exits 1 just after its GPU faulted. The agent's FAILED report names the
    fault, and is sent only once a heartbeat showing the fault is stored: with a 60 s
    heartbeat interval, the fault itself wakes the heartbeat (else the report would wait
    two intervals)."""
    crash = tmp_path / "crash"
    async with running_agent(nats_url, tmp_path, "gf-1", heartbeat_interval_s=60.0) as agent:
        t = task("j-gf", command=["sh", "-c", f"while [ ! -e {crash} ]; do sleep 0.05; done; exit 1"],
                 gpu_indices=[0], cpus=1, memory_mb=64, term=1)
        await store.put(subjects.alloc_key("gf-1"), encode(host_alloc("gf-1", [t], term=1)))
        subject = subjects.status_subject("gf-1")

        async def last() -> StatusReport | None:
            try:
                msg = await store.js.get_last_msg(subjects.STATUS_STREAM, subject)
            except Exception:  # noqa: BLE001 - nothing reported yet
                return None
            return decode(StatusReport, msg.data)

        await eventually(lambda: agent.runs.get("j-gf.1") is not None and agent.runs["j-gf.1"].proc is not None)
        agent.gpus.inject_fault(0)  # type: ignore[attr-defined]  # the simulated backend
        crash.write_text("now")
        r = None
        for _ in range(300):
            r = await last()
            if r is not None and r.state is AttemptState.FAILED:
                break
            await asyncio.sleep(0.1)
        assert r is not None and r.state is AttemptState.FAILED and r.exit_code == 1, r
        assert r.gpu_fault.startswith("GPU 0 faulted (xid 79"), r.gpu_fault
        hb = decode(Heartbeat, (await store.get("gf-1", bucket=subjects.HOSTS_BUCKET)).value)
        assert [u.healthy for u in hb.gpu_usage] == [False]
        assert agent.gpu_faults == {0: "xid 79: GPU has fallen off the bus"}


class _ReadLikeNvml(SimulatedBackend):
    """Simulated GPUs the agent reads as it reads NVML: on its GPU watch's thread."""

    blocking = True


async def test_an_agent_reads_a_blocking_gpu_backend_on_a_thread_of_its_own(
        nats_url: str, tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """A backend whose calls may block (NVML's) is read on the agent's GPU watch thread:
    the stored heartbeats carry its telemetry, a fault it finds reaches them (and the
    agent's log once), and the clean shutdown stops the thread."""
    gpus = _ReadLikeNvml("2xH100", seed=3)

    async def stored() -> Heartbeat:
        return decode(Heartbeat, (await store.get("gt-1", bucket=subjects.HOSTS_BUCKET)).value)

    async with running_agent(nats_url, tmp_path, "gt-1", gpus=gpus, **QUICK) as agent:
        await start_heartbeats_stored(agent)
        assert agent.gpu_watch.threaded and agent.gpu_watch.alive
        hb = await stored()
        assert [u.index for u in hb.gpu_usage] == [0, 1] and all(u.temp_c > 0 for u in hb.gpu_usage)
        assert hb.pressure == "" and len(hb.gpus) == 2
        gpus.inject_fault(1)

        async def faulted() -> bool:
            return [u.healthy for u in (await stored()).gpu_usage] == [True, False]

        await eventually(faulted, timeout=30, what="the fault in a stored heartbeat")
        assert agent.gpu_faults == {1: "xid 79: GPU has fallen off the bus"}
    assert not agent.gpu_watch.alive
    assert sum(1 for r in caplog.records if r.getMessage().startswith("GPU 1 fault:")) == 1


HOLD_ON_STOP = """
import os, signal, sys, time
def stop(*_):
    open(sys.argv[1], "a").write("stop\\n")
    while not os.path.exists(sys.argv[2]):  # the test says when to exit
        time.sleep(0.05)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
open(sys.argv[1], "a").write("start\\n")
while True:
    time.sleep(0.05)
"""


async def test_an_agent_shutting_down_says_it_is_leaving_and_starts_nothing_new(
        nats_url: str, tmp_path: Path, store: Store) -> None:
    """A clean shutdown first stores a heartbeat saying the host is leaving (the leader
    places nothing more on it), then stops the running attempts. An assignment that
    arrives meanwhile (the leader placed it before it read that heartbeat) is not started
    (it would outlive the agent with nobody to stop or report it) but given back: reported
    KILLED by the shutdown, which the leader requeues without counting a try. The agent's
    next start does not run it."""
    import sys

    logs = {k: tmp_path / f"{k}.log" for k in ("a", "b")}
    release = tmp_path / "release"
    a = task("j-a", command=[sys.executable, "-c", HOLD_ON_STOP, str(logs["a"]), str(release)], cpus=1,
             memory_mb=64, term=1)
    b = task("j-b", command=[sys.executable, "-c", HOLD_ON_STOP, str(logs["b"]), str(release)], cpus=1,
             memory_mb=64, term=1)
    cfg = dict(nats_url=nats_url, host_id="lv-1", simulate_gpus="1xH100", state_dir=tmp_path / "agent", cpus=4,
               memory_mb=4096, run_as=ME, heartbeat_interval_s=0.5, ttl_intervals=6, fence_after_s=2.5,
               kill_grace_s=120.0)

    async def stored_heartbeat() -> Heartbeat | None:
        try:
            rec = await store.get("lv-1", bucket=subjects.HOSTS_BUCKET)
        except Exception:  # noqa: BLE001 - not stored yet
            return None
        return decode(Heartbeat, rec.value) if rec.value else None

    agent = Agent(AgentConfig(**cfg))  # type: ignore[arg-type]
    stop = asyncio.Event()
    run = asyncio.create_task(agent.run(stop))
    await store.put(subjects.alloc_key("lv-1"), encode(host_alloc("lv-1", [a], term=1)))
    await eventually(lambda: logs["a"].exists() and "start" in logs["a"].read_text(), timeout=60,
                     what="attempt a running")
    hb = await stored_heartbeat()
    assert hb is not None and not hb.leaving

    stop.set()  # the agent's clean shutdown begins
    for _ in range(600):
        hb = await stored_heartbeat()
        if hb is not None and hb.leaving:
            break
        await asyncio.sleep(0.05)
    assert hb is not None and hb.leaving, "no heartbeat saying the host is leaving"
    await eventually(lambda: "stop" in logs["a"].read_text(), timeout=60, what="attempt a told to stop")
    # a is in its grace (held by the test); a placement made before the leader read
    # the heartbeat arrives now.
    await store.put(subjects.alloc_key("lv-1"), encode(host_alloc("lv-1", [a, b], term=1)))
    await eventually(lambda: b.attempt_id in agent._assigned, timeout=60, what="the assignment of b read")
    # The grace goes on for several heartbeat intervals: the agent keeps heartbeating
    # (the host must not expire and be LOST while its attempts stop: found by hand,
    # an attempt whose grace outlasted the key ended LOST and was counted as a try).
    first = await stored_heartbeat()
    await asyncio.sleep(4 * cfg["heartbeat_interval_s"])  # type: ignore[operator]
    later = await stored_heartbeat()
    assert first is not None and later is not None and later.leaving and later.seq > first.seq
    release.touch()
    await asyncio.wait_for(run, timeout=60)
    assert not logs["b"].exists() and b.attempt_id in agent.seen  # never started
    assert logs["a"].read_text().split() == ["start", "stop"]
    # a's end and b's refusal were reported as the agent's shutdown (not counted as
    # tries), and delivered before the agent exited (none left on disk for its next start).
    for t in (a, b):
        ended, _at = agent._ended[t.attempt_id]
        assert ended.state is AttemptState.KILLED and ended.shutdown, ended
    assert "shutting down" in agent._ended[b.attempt_id][0].reason
    assert not any((tmp_path / "agent").glob("*.reports/*"))

    # The agent's next start does not run b either (the leader has requeued it as a new try).
    release.unlink()
    await store.put(subjects.alloc_key("lv-1"), encode(host_alloc("lv-1", [b], term=1)))
    again = Agent(AgentConfig(**cfg))  # type: ignore[arg-type]
    stop2 = asyncio.Event()
    run2 = asyncio.create_task(again.run(stop2))
    try:
        await eventually(lambda: again.applied_seq > 0 and again.last_heartbeat_ok > 0, timeout=60,
                         what="the next agent read its assignment")
        assert b.attempt_id not in again.runs and b.attempt_id in again.seen
    finally:
        release.touch()
        stop2.set()
        await asyncio.wait_for(run2, timeout=60)
    assert not logs["b"].exists()


async def test_an_agent_stopped_while_nats_is_gone_still_cleans_up(tmp_path: Path) -> None:
    """Its NATS killed, then the agent stopped: the drain fails and the close may raise
    too; the shutdown still ends cleanly, stopping its watchdog and removing its work root
    (found by exploring: it ended with a traceback and left its work root behind)."""
    from server.broker.natsd import start_nats

    proc = start_nats(tmp_path / "nats", port=0)
    try:
        nc = await connect(proc.url, name="test-agent")
        await ensure_streams(Store(nc))
        await nc.close()
        agent = Agent(AgentConfig(nats_url=proc.url, host_id="ng-1", simulate_gpus="1xH100",
                                  state_dir=tmp_path / "agent", cpus=4, memory_mb=4096, run_as=ME,
                                  heartbeat_interval_s=0.5, ttl_intervals=6, fence_after_s=2.5))
        stop = asyncio.Event()
        run = asyncio.create_task(agent.run(stop))
        await eventually(lambda: agent._watchdog is not None and agent.store is not None, timeout=60,
                         what="the agent running")
        watchdog, root = agent._watchdog, agent.isolation.work_root
        assert watchdog is not None and root.exists()
        proc.proc.kill()
        proc.proc.wait()
        stop.set()
        await asyncio.wait_for(run, timeout=60)  # raised before, from the connection's close
        assert agent._watchdog is None and watchdog.poll() is not None and not root.exists()
    finally:
        proc.stop()


async def test_a_second_agent_of_a_running_host_refuses_to_start(nats_url: str, tmp_path: Path, store: Store) -> None:
    """Found by exploring: a second agent started with a running host's id (another state
    directory, another machine) started every attempt of that host again: each ran twice.
    It finds the first one's heartbeats in the key and refuses to start, starting nothing;
    one on the same state directory finds it locked. Once the first has stopped, an agent
    of the host starts (after a heartbeat interval and a second without one)."""
    from wire.errors import ConfigError

    marks = tmp_path / "runs"
    cfg = dict(heartbeat_interval_s=0.5, ttl_intervals=6, fence_after_s=2.5)
    async with running_agent(nats_url, tmp_path, "dup-1", **cfg) as first:
        t = task("j-dup", command=["sh", "-c", f"echo $$ >> {marks}; exec sleep 600"], cpus=1, memory_mb=64,
                 term=1)
        await store.put(subjects.alloc_key("dup-1"), encode(host_alloc("dup-1", [t], term=1)))
        await eventually(lambda: marks.exists() and marks.read_text().strip(), timeout=60, what="the task runs")
        for state_dir in (tmp_path / "elsewhere", tmp_path / "agent"):
            second = Agent(AgentConfig(nats_url=nats_url, host_id="dup-1", simulate_gpus="1xH100",
                                       state_dir=state_dir, cpus=4, memory_mb=4096, run_as=ME, **cfg))
            try:
                await asyncio.wait_for(second.run(asyncio.Event()), timeout=60)
                raise AssertionError("the second agent started")
            except ConfigError as exc:
                assert ("another agent" in str(exc) and first.instance in str(exc)
                        if state_dir.name == "elsewhere" else "state directory" in str(exc)), exc
        assert len(marks.read_text().split()) == 1 and "j-dup.1" in first.runs  # ran once, still runs
    third = Agent(AgentConfig(nats_url=nats_url, host_id="dup-1", simulate_gpus="1xH100",
                              state_dir=tmp_path / "elsewhere", cpus=4, memory_mb=4096, run_as=ME, **cfg))
    stop = asyncio.Event()
    run = asyncio.create_task(third.run(stop))
    await eventually(lambda: third._hb_stored.is_set(), timeout=60, what="the next agent of the host heartbeats")
    stop.set()
    await asyncio.wait_for(run, timeout=30)


async def test_an_agent_that_waited_for_another_does_not_fence_what_it_is_given(nats_url: str, tmp_path: Path,
                                                                                store: Store) -> None:
    """A restart within the key's TTL: the key holds another agent's heartbeat (not the last
    one of this state directory), and the new agent waits a heartbeat interval and a second
    to see whether it still runs. That wait, as long as its fence delay, does not make it
    freeze and stop the work it is then given (found by a review: it was stopped as 'cut
    off'). (What its first assignment lists the other may have started: reported LOST,
    test_failures.py; the work here is given after it.)"""
    from tests.factories import heartbeat

    marks = tmp_path / "runs"
    before = heartbeat("rw-1", instance="0123456789abcdef", ts=0.0)
    await store.js.publish(subjects.kv_subject(subjects.HOSTS_BUCKET, "rw-1"), encode(before),
                           headers={"Nats-TTL": "30s"})
    t = task("j-rw", command=["sh", "-c", f"echo run >> {marks}; exec sleep 600"], cpus=1, memory_mb=64, term=1)
    async with running_agent(nats_url, tmp_path, "rw-1", heartbeat_interval_s=1.0, ttl_intervals=6,
                             fence_after_s=1.5) as agent:
        await eventually(lambda: agent._hb_stored.is_set() and agent._applied_once, timeout=60,
                         what="a heartbeat stored and the first assignment read")
        assert agent._stateless_after == "0123456789abcdef"
        # What the other started is reported LOST once its key would have expired by the TTL
        # it was stored with, not this agent's 6 s (found by exploring: after a change of
        # settings, LOST came before the other's watchdog had stopped its tries).
        assert agent._stateless_until == before.ts + 30.0
        await store.put(subjects.alloc_key("rw-1"), encode(host_alloc("rw-1", [t], term=1)))
        await eventually(lambda: marks.exists(), timeout=60, what="the task runs")
        await eventually(lambda: len(agent._ended) == 0 and t.attempt_id in agent.runs
                         and agent.runs[t.attempt_id].stop_reason is None and agent.fences == 0, timeout=5,
                         what="the task running, unfenced")
        assert agent.fences == 0 and agent.runs[t.attempt_id].stop_reason is None


async def test_a_host_short_of_disk_or_unable_to_start_a_try_asks_for_no_new_work(
        nats_url: str, tmp_path: Path, monkeypatch: Any, store: Store) -> None:
    """Found by exploring: with its disk full, every try sent to a host FAILED as its job's
    own failure (not retried) and the host went on being given work. Now the agent says in
    its heartbeat that the host takes no new work (`Heartbeat.pressure`): its free disk below
    `--min-free-disk-mb`, or a try it could not start for want of the host's resources,
    which ends KILLED (the infrastructure's: retried), not FAILED."""
    import errno
    import sys

    from agent.isolation import Isolation

    cfg = dict(nats_url=nats_url, host_id="pr-1", simulate_gpus="1xH100", state_dir=tmp_path / "agent", cpus=4,
               memory_mb=4096, run_as=ME, heartbeat_interval_s=0.5, ttl_intervals=6, fence_after_s=2.5)

    async def pressure() -> str:
        try:
            rec = await store.get("pr-1", bucket=subjects.HOSTS_BUCKET)
        except Exception:  # noqa: BLE001 - not stored yet
            return ""
        return decode(Heartbeat, rec.value).pressure if rec.value else ""

    # Less free disk than it asks for.
    agent = Agent(AgentConfig(**cfg, min_free_disk_mb=10**9))  # type: ignore[arg-type]
    stop = asyncio.Event()
    run = asyncio.create_task(agent.run(stop))
    got = await eventually(pressure, timeout=60, what="a heartbeat with pressure")
    assert got == ("disk: less than 1000000000 MB free in its directory for attempts; disk: less than "
                   "1000000000 MB free in its state directory")
    stop.set()
    await asyncio.wait_for(run, timeout=60)

    # A try that cannot start for want of space: KILLED, and the host asks for no new work.
    def no_space(*_a: object, **_k: object) -> object:
        raise OSError(errno.ENOSPC, "No space left on device")

    agent = Agent(AgentConfig(**cfg, min_free_disk_mb=0))  # type: ignore[arg-type]
    monkeypatch.setattr(agent.isolation, "prepare", no_space)
    assert isinstance(agent.isolation, Isolation)
    stop = asyncio.Event()
    run = asyncio.create_task(agent.run(stop))
    async def unpressed() -> bool:
        return await pressure() == ""

    await eventually(unpressed, timeout=60, what="a heartbeat of the agent with room")
    t = task("j-ns", command=[sys.executable, "-c", "pass"], cpus=1, memory_mb=64, term=1)
    await store.put(subjects.alloc_key("pr-1"), encode(host_alloc("pr-1", [t], term=1)))
    await eventually(lambda: t.attempt_id in agent._ended, timeout=60, what="the try's end")
    ended, _at = agent._ended[t.attempt_id]
    assert ended.state is AttemptState.KILLED and ended.exit_code is None and ended.host_trouble, ended
    assert ended.reason == "the host could not start it: [Errno 28] No space left on device"
    got = await eventually(pressure, timeout=60, what="the pressure in a heartbeat")
    assert got == "could not start a try: [Errno 28] No space left on device"
    # A try placed here before the leader read that is handed back unstarted (a review:
    # the retry came straight back and used up the job's attempts).
    calls: list[str] = []
    monkeypatch.setattr(agent.isolation, "prepare", lambda *a, **k: calls.append("prepare"))
    again = task("j-ns2", command=[sys.executable, "-c", "pass"], cpus=1, memory_mb=64, term=1)
    await store.put(subjects.alloc_key("pr-1"), encode(host_alloc("pr-1", [again], term=1)))
    await eventually(lambda: again.attempt_id in agent._ended, timeout=60, what="the second try handed back")
    back, _at = agent._ended[again.attempt_id]
    assert back.state is AttemptState.KILLED and back.host_trouble and not calls, back
    assert back.reason.startswith("not started: the host could not start a try a moment ago")
    stop.set()
    await asyncio.wait_for(run, timeout=60)

    # An attempt the agent cannot note as seen (its state directory's disk full: a
    # restart could start it again) is handed back too, the reading of its assignment
    # going on (found by exploring: the error ended it, and the try stayed PLACED for good).
    agent = Agent(AgentConfig(**cfg, min_free_disk_mb=0))  # type: ignore[arg-type]
    stop = asyncio.Event()
    run = asyncio.create_task(agent.run(stop))
    await eventually(unpressed, timeout=60, what="a heartbeat of the third agent")
    seen_file = agent._seen_file
    assert seen_file is not None
    seen_file.unlink(missing_ok=True)
    seen_file.mkdir()  # appending to it fails
    third = task("j-ns3", command=[sys.executable, "-c", "pass"], cpus=1, memory_mb=64, term=1)
    fourth = task("j-ns4", command=[sys.executable, "-c", "pass"], cpus=1, memory_mb=64, term=1)
    await store.put(subjects.alloc_key("pr-1"), encode(host_alloc("pr-1", [third, fourth], term=1)))
    await eventually(lambda: {third.attempt_id, fourth.attempt_id} <= agent._ended.keys(), timeout=60,
                     what="both handed back")
    for t in (third, fourth):
        ended, _at = agent._ended[t.attempt_id]
        assert ended.state is AttemptState.KILLED and ended.host_trouble, ended
        assert ended.reason.startswith("not started: the agent could not note it") or \
            ended.reason.startswith("not started: the host could not start a try a moment ago"), ended
    seen_file.rmdir()
    stop.set()
    await asyncio.wait_for(run, timeout=60)


def test_the_disk_pressure_clears_only_well_above_its_floor(tmp_path: Path, monkeypatch: Any) -> None:
    """Its words do not change with each megabyte (a heartbeat's shape, decoded at each
    change), and a host hovering at the floor does not flap in and out of pressure."""
    import types

    import agent.agent as agent_module

    free = {"mb": 300}
    monkeypatch.setattr(agent_module.os, "statvfs",
                        lambda _p: types.SimpleNamespace(f_bavail=free["mb"] * 1024, f_frsize=1024))
    agent = Agent(AgentConfig(nats_url="nats://127.0.0.1:1", host_id="dk-1", simulate_gpus="1xH100",
                              state_dir=tmp_path / "agent", run_as=ME, min_free_disk_mb=256))
    seen = []
    for mb in (300, 250, 200, 300, 319, 321, 250):
        free["mb"] = mb
        agent._disk_trouble = agent._check_disk()
        seen.append(agent._disk_trouble)
    words = ("disk: less than 256 MB free in its directory for attempts; disk: less than 256 MB free in its state "
             "directory")
    assert seen == ["", words, words, words, words, "", words]


async def test_of_two_agents_of_a_host_started_at_the_same_instant_one_starts(nats_url: str, tmp_path: Path,
                                                                            monkeypatch: Any, store: Store) -> None:
    """Two agents given the same host id (each its own state directory) that both read the
    empty heartbeat key before either stored a heartbeat both started, and ran every
    attempt of the host twice. Each now stores its first heartbeat only over what it read:
    one is refused, looks again, finds the other heartbeating and refuses to start."""
    from wire.errors import ConfigError

    looked = asyncio.Barrier(2)
    first_looks: set[int] = set()
    original = Agent._another_agent

    async def look_together(self: Agent, stop: asyncio.Event) -> Any:
        found = await original(self, stop)
        if id(self) not in first_looks:  # both have read the key before either goes on
            first_looks.add(id(self))
            await asyncio.wait_for(looked.wait(), timeout=30)
        return found

    monkeypatch.setattr(Agent, "_another_agent", look_together)
    agents = [Agent(AgentConfig(nats_url=nats_url, host_id="twin-1", simulate_gpus="1xH100",
                                state_dir=tmp_path / name, cpus=4, memory_mb=4096, run_as=ME, **QUICK))
              for name in ("a", "b")]
    stops = [asyncio.Event(), asyncio.Event()]
    runs = [asyncio.create_task(a.run(s)) for a, s in zip(agents, stops, strict=True)]
    try:
        done, _ = await asyncio.wait(runs, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1, "neither agent refused to start"
        refused = runs.index(next(iter(done)))
        with contextlib.suppress(ConfigError):
            runs[refused].result()
            raise AssertionError("an agent stopped without refusing to start")
        starter = agents[1 - refused]
        assert starter.instance in str(runs[refused].exception())
        await eventually(lambda: starter._hb_stored.is_set(), timeout=30, what="the other heartbeats")
        assert not runs[1 - refused].done()
    finally:
        for s in stops:
            s.set()
        await asyncio.wait_for(asyncio.gather(*runs, return_exceptions=True), timeout=30)


async def test_a_try_whose_end_is_kept_unsent_is_not_started_by_the_next_agent(nats_url: str, tmp_path: Path,
                                                                               store: Store) -> None:
    """A try handed back unstarted (its agent leaving, its host in trouble) whose note as
    seen could not be written but whose report was kept on disk, the agent then restarted
    before the leader dropped the try from the assignment: the next agent started it, though
    its report (delivered by that agent) ended it. The kept report now counts as seen."""
    nc = store.nc
    marks = tmp_path / "runs"
    t = task("j-kept", command=["sh", "-c", f"echo run >> {marks}; exec sleep 600"], cpus=1, memory_mb=64,
             term=1)
    await store.put(subjects.alloc_key("kept-1"), encode(host_alloc("kept-1", [t], term=1)))
    unsent = tmp_path / "agent" / "kept-1.reports"
    unsent.mkdir(parents=True)
    r = StatusReport(host_id="kept-1", attempt_id=t.attempt_id, job_id=t.job_id, state=AttemptState.KILLED,
                     ts=1.0, term=1, reason="not started: its agent was shutting down", shutdown=True)
    (unsent / t.attempt_id).write_bytes(f"{t.attempt_id}:killed\n".encode() + encode(r))
    async with status_reports(nc, "kept-1") as delivered, \
            running_agent(nats_url, tmp_path, "kept-1", **QUICK) as agent:
        await eventually(lambda: any(d.attempt_id == t.attempt_id for d in delivered), timeout=60,
                         what="the kept report delivered")
        await eventually(lambda: agent.applied_seq > 0, timeout=30, what="the assignment read")
        assert t.attempt_id not in agent.runs and not marks.exists()
        assert [d.state for d in delivered] == [AttemptState.KILLED]


def test_a_try_handed_back_that_cannot_be_noted_as_seen_puts_the_host_in_trouble(tmp_path: Path) -> None:
    """A try handed back unstarted (its agent leaving, its host in trouble) whose note as seen
    cannot be written: the host asks for no new work, as when a try to be started cannot be
    noted (a review: the failure was ignored)."""
    agent = Agent(AgentConfig(nats_url="nats://127.0.0.1:1", host_id="hb-1", simulate_gpus="1xH100",
                              state_dir=tmp_path / "agent", cpus=4, memory_mb=4096, run_as=ME))
    try:
        assert agent._seen_file is not None
        agent._note_handed_back("j-a.1")
        assert agent._start_troubled() == "" and "j-a.1" in agent._seen_file.read_text().split()
        agent._seen_file.unlink()
        agent._seen_file.mkdir()  # appending to it fails
        agent._note_handed_back("j-b.1")
        assert "Is a directory" in agent._start_troubled()
    finally:
        agent.gpus.close()
        agent.isolation.close()


def test_a_host_whose_trouble_keeps_coming_back_asks_for_no_new_work_longer_each_time(tmp_path: Path) -> None:
    """A fault that stays (a read-only work root, a broken mount) made the host take a batch
    again each minute, each try handed back and an alert each time (a review): a trouble
    that comes back once its hold has passed, no try having started meanwhile, holds the
    host out twice as long, up to 16 minutes; a try that starts ends the streak."""
    from agent.agent import START_TROUBLE_MAX_S, START_TROUBLE_S

    agent = Agent(AgentConfig(nats_url="nats://127.0.0.1:1", host_id="tb-1", simulate_gpus="1xH100",
                              state_dir=tmp_path / "agent", cpus=4, memory_mb=4096, run_as=ME))
    try:
        t = 1000.0
        agent._troubled("read-only file system", now=t)
        assert agent._start_troubled(now=t + START_TROUBLE_S - 1) == "read-only file system"
        assert agent._start_troubled(now=t + START_TROUBLE_S) == ""
        holds = []
        for _ in range(6):  # each time its hold has passed, the next batch fails alike
            t += 1 + (agent._start_trouble[2] if agent._start_trouble else 0)
            agent._troubled("read-only file system", now=t)
            holds.append(agent._start_trouble[2])  # type: ignore[index]
        assert holds == [120.0, 240.0, 480.0, 960.0, START_TROUBLE_MAX_S, START_TROUBLE_MAX_S]
        assert agent._start_troubled(now=t + 900) == "read-only file system (again: no new work for 960 s)"
        # Again within its hold: the same hold, counted from the latest.
        agent._troubled("read-only file system", now=t + 10)
        assert agent._start_trouble[2] == START_TROUBLE_MAX_S  # type: ignore[index]
        # Back only long after its hold: a minute again.
        at, held = agent._start_trouble[1], agent._start_trouble[2]  # type: ignore[index]
        agent._troubled("read-only file system", now=at + held + START_TROUBLE_MAX_S + 1)
        assert agent._start_trouble[2] == START_TROUBLE_S  # type: ignore[index]
        agent._troubled("read-only file system", now=at + held + START_TROUBLE_MAX_S + 2)  # (within it: the same)
        assert agent._start_trouble[2] == START_TROUBLE_S  # type: ignore[index]
        # A try started since: the next trouble holds the host out for a minute again.
        for _ in range(3):
            at, held = agent._start_trouble[1], agent._start_trouble[2]  # type: ignore[index]
            agent._troubled("read-only file system", now=at + held + 1)
        assert agent._start_trouble[2] == 8 * START_TROUBLE_S  # type: ignore[index]
        t = agent._start_trouble[1]  # type: ignore[index]
        agent._started_since_trouble = True
        agent._troubled("no space left on device", now=t + 8 * START_TROUBLE_S + 1)
        assert agent._start_trouble[2] == START_TROUBLE_S  # type: ignore[index]
        assert agent._start_troubled(now=t + 8 * START_TROUBLE_S + 2) == "no space left on device"
    finally:
        agent.gpus.close()
        agent.isolation.close()


def test_a_try_asked_to_stop_that_ended_while_its_agent_was_down_is_reported_stopped() -> None:
    """A review: a try being stopped (a preemption, a cancel, a time limit) whose agent died
    in its grace, and which saved its state and exited 0 (or 143) meanwhile, was reported
    SUCCEEDED (or FAILED): it has not finished, and ends as its stop says, as a live
    agent's run reports it. One not asked to stop is reported as it ended."""
    t = task("j-st", command=["x"], cpus=1, memory_mb=64, term=1)
    stopped = t.model_copy(update={"stop": True, "stop_reason": "preempted for job k"})
    for status in (0, 143 << 8, 15):
        state, _code, _out, reason = Agent._ended_while_away(stopped, status)
        assert state is AttemptState.KILLED and reason.startswith("preempted for job k"), (status, state)
    assert Agent._ended_while_away(t, 0)[:2] == (AttemptState.SUCCEEDED, 0)
    assert Agent._ended_while_away(t, 3 << 8)[:2] == (AttemptState.FAILED, 3)
    assert Agent._ended_while_away(t, 9)[:2] == (AttemptState.FAILED, -9)


async def test_assignments_queued_behind_one_another_are_read_newest_only(nats_url: str, tmp_path: Path,
                                                                           monkeypatch: Any, store: Store) -> None:
    """Found by exploring: an agent continued after a SIGSTOP read every assignment queued
    meanwhile in order, and started a cancelled gang task from an older one before the
    newer one stopped it. Each assignment is the host's whole list: one with a newer one
    queued behind it is passed over."""
    nc = store.nc
    marks = tmp_path / "runs"
    async with running_agent(nats_url, tmp_path, "co-1", **QUICK) as agent:
        await eventually(lambda: agent._hb_stored.is_set() and agent._assign_sub is not None, timeout=60,
                         what="the agent up")
        original = agent.reconcile
        held = asyncio.Event()
        entered = asyncio.Event()

        async def slow(alloc: Any, seq: int) -> None:
            if alloc.tasks and alloc.tasks[0].job_id == "j-hold" and not held.is_set():
                entered.set()
                await held.wait()  # as an agent stopped while the next ones queue up
            await original(alloc, seq)

        monkeypatch.setattr(agent, "reconcile", slow)
        first = task("j-hold", command=["true"], cpus=1, memory_mb=64, term=1)
        await store.put(subjects.alloc_key("co-1"), encode(host_alloc("co-1", [first], term=1)))
        await asyncio.wait_for(entered.wait(), timeout=30)
        t = task("j-co", command=["sh", "-c", f"echo ran >> {marks}; exec sleep 600"], cpus=1, memory_mb=64,
                 term=1)
        await store.put(subjects.alloc_key("co-1"), encode(host_alloc("co-1", [t], term=1)))
        stopped = t.model_copy(update={"stop": True, "stop_reason": "cancelled by op"})
        await store.put(subjects.alloc_key("co-1"), encode(host_alloc("co-1", [stopped], term=1)))
        await eventually(lambda: agent._assign_sub.pending_msgs == 2, timeout=30,  # type: ignore[union-attr]
                         what="both queued")
        held.set()
        await eventually(lambda: t.attempt_id in agent._ended, timeout=60, what="the try handed back")
        ended, _at = agent._ended[t.attempt_id]
        assert ended.state is AttemptState.KILLED and ended.reason == "cancelled before it started", ended
        assert not marks.exists() and agent.coalesced == 1
        # The newest is read also when an older revision sent again is queued behind it (a
        # review: the newest was passed over, and the older one started the task it stopped).
        held.clear()
        entered.clear()
        await store.put(subjects.alloc_key("co-1"), encode(host_alloc("co-1", [first], term=1)))
        await asyncio.wait_for(entered.wait(), timeout=30)
        u = task("j-co2", command=["sh", "-c", f"echo ran >> {marks}; exec sleep 600"], cpus=1, memory_mb=64,
                 term=1)
        older = await store.put(subjects.alloc_key("co-1"), encode(host_alloc("co-1", [u], term=1)))
        u_stopped = u.model_copy(update={"stop": True, "stop_reason": "cancelled by op"})
        await store.put(subjects.alloc_key("co-1"), encode(host_alloc("co-1", [u_stopped], term=1)))
        await nc.publish(subjects.assign_subject("co-1"), encode(host_alloc("co-1", [u], term=1)),
                         headers={"Nats-Sequence": str(older)})  # as the leader's resend of an older one
        await eventually(lambda: agent._assign_sub.pending_msgs == 3, timeout=30,  # type: ignore[union-attr]
                         what="all three queued")
        held.set()
        await eventually(lambda: u.attempt_id in agent._ended, timeout=60, what="the second try handed back")
        ended, _at = agent._ended[u.attempt_id]
        assert ended.reason == "cancelled before it started" and not marks.exists(), ended


async def test_a_task_that_ends_while_the_next_agent_kills_what_is_left_is_reported_as_it_ended(
        nats_url: str, tmp_path: Path, monkeypatch: Any, store: Store) -> None:
    """A task whose launcher wrote its end just after the next agent read the launchers'
    records, and before it killed what was left, was reported LOST (its record left on disk
    for a later start): the records are read again once the kill is done (the launcher of
    every task that start kills is killed first, and writes nothing)."""
    nc = store.nc
    t = task("j-late", command=["true"], cpus=1, memory_mb=64, term=1)
    (tmp_path / "agent").mkdir(parents=True)
    (tmp_path / "agent" / "late-1.seen").write_text(t.attempt_id + "\n")  # a previous agent started it
    await store.put(subjects.alloc_key("late-1"), encode(host_alloc("late-1", [t], term=1)))
    original = Agent._kill_leftovers

    def kill_leftovers(self: Agent) -> list[str]:
        (self.isolation.exits_dir / t.attempt_id).write_text("0\n")  # it ended just now, by itself
        return original(self)

    monkeypatch.setattr(Agent, "_kill_leftovers", kill_leftovers)
    async with status_reports(nc, "late-1") as delivered, \
            running_agent(nats_url, tmp_path, "late-1", **QUICK) as agent:
        await eventually(lambda: delivered, timeout=60, what="its end reported")
        assert [(d.state, d.exit_code) for d in delivered] == [(AttemptState.SUCCEEDED, 0)], delivered
        await eventually(lambda: not list(agent.isolation.exits_dir.iterdir()), timeout=30,
                         what="the records gone once the reports were taken")



async def test_the_ends_read_at_the_start_are_kept_on_disk_until_reported(
        nats_url: str, tmp_path: Path, monkeypatch: Any, store: Store) -> None:
    """Found by exploring: the next agent removed the launchers' records of the ends of
    tasks that ended while no agent ran as soon as it read them, holding them in memory
    until it could report them; killed before it did (NATS still down), it left the one
    after nothing to go by, and a task that had succeeded was reported LOST and run again.
    The records stay until the reports made from them are kept."""
    t = task("j-kept", command=["true"], cpus=1, memory_mb=64, term=1)
    (tmp_path / "agent").mkdir(parents=True)
    (tmp_path / "agent" / "kept-1.seen").write_text(t.attempt_id + "\n")  # a previous agent started it
    await store.put(subjects.alloc_key("kept-1"), encode(host_alloc("kept-1", [t], term=1)))
    original = Agent._kill_leftovers
    after_read: list[bool] = []

    def kill_leftovers(self: Agent) -> list[str]:
        after_read.append(self.isolation.exit_file(t.attempt_id).exists())  # read by now
        return original(self)

    monkeypatch.setattr(Agent, "_kill_leftovers", kill_leftovers)
    exits = tmp_path / "agent" / "kept-1.launch" / "exits"
    exits.mkdir(parents=True)
    (exits / t.attempt_id).write_text("0\n")  # it ended while no agent ran
    async with status_reports(store.nc, "kept-1") as delivered, \
            running_agent(nats_url, tmp_path, "kept-1", **QUICK) as agent:
        assert agent.isolation.exits_dir == exits
        await eventually(lambda: delivered, timeout=60, what="its end reported")
        assert [(d.state, d.exit_code) for d in delivered] == [(AttemptState.SUCCEEDED, 0)], delivered
        assert after_read == [True]
        await eventually(lambda: not agent.isolation.exit_file(t.attempt_id).exists(), timeout=30,
                         what="the record gone once its report was taken")


async def test_an_end_read_at_the_start_is_reported_when_a_later_assignment_lists_its_try(
        nats_url: str, tmp_path: Path, store: Store) -> None:
    """Found by a review: the ends read at the start whose tries the first assignment did
    not list were dropped, and when a later one listed the try (its record missing or
    behind at the start, as after a NATS restart that lost the bucket) it was reported LOST
    and run again, though it had succeeded."""
    t = task("j-late2", command=["true"], cpus=1, memory_mb=64, term=1)
    (tmp_path / "agent").mkdir(parents=True)
    (tmp_path / "agent" / "lt-1.seen").write_text(t.attempt_id + "\n")  # a previous agent started it
    exits = tmp_path / "agent" / "lt-1.launch" / "exits"
    exits.mkdir(parents=True)
    (exits / t.attempt_id).write_text("0\n")  # it ended while no agent ran
    async with status_reports(store.nc, "lt-1") as delivered, \
            running_agent(nats_url, tmp_path, "lt-1", **QUICK) as agent:
        await eventually(lambda: agent._applied_once, timeout=60, what="the first assignment (none) applied")
        await store.put(subjects.alloc_key("lt-1"), encode(host_alloc("lt-1", [t], term=1)))
        await eventually(lambda: delivered, timeout=60, what="its end reported")
        assert [(d.state, d.exit_code) for d in delivered] == [(AttemptState.SUCCEEDED, 0)], delivered


async def test_an_end_whose_report_could_not_be_kept_stays_on_disk_until_the_stream_takes_it(
        nats_url: str, tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a review: a try's end was removed from its launcher's record once its report
    was written, or failed to be (a full disk): an agent killed before delivering it left
    the next one nothing to go by. It goes once the STATUS stream took the report."""
    async with status_reports(store.nc, "nk-1") as delivered, \
            running_agent(nats_url, tmp_path, "nk-1", **QUICK) as agent:
        await start_heartbeats_stored(agent)
        assert agent.store is not None
        js = agent.store.js
        real = js.publish
        cut = [True]

        async def publish(subject: str, *args: Any, **kw: Any) -> Any:
            if cut[0] and subject == subjects.status_subject("nk-1"):
                raise RuntimeError("no route to NATS")  # as a link cut for reports
            return await real(subject, *args, **kw)

        def no_space(self: Agent, *_: Any) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(js, "publish", publish)
        monkeypatch.setattr(Agent, "_persist_unsent", no_space)
        t = task("j-nk", command=["true"], cpus=1, memory_mb=64, term=1)
        await store.put(subjects.alloc_key("nk-1"), encode(host_alloc("nk-1", [t], term=1)))
        exit_file = agent.isolation.exit_file(t.attempt_id)
        # The try may start and end between two looks at `agent.runs`: its launcher's record of
        # its end is what shows it ran.
        await eventually(lambda: exit_file.exists() and exit_file.read_text().strip() == "0", timeout=60,
                         what="the try ended")
        await eventually(lambda: t.attempt_id not in agent.runs, timeout=60, what="the try no longer running")
        assert exit_file.read_text().strip() == "0"
        cut[0] = False
        await eventually(lambda: any(d.state.terminal for d in delivered), timeout=60, what="its end delivered")
        await eventually(lambda: not agent.isolation.exit_file(t.attempt_id).exists(), timeout=30,
                         what="the record gone once the stream took the report")


async def test_a_tries_end_is_kept_by_its_launchers_record_until_its_report_is(
        nats_url: str, tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by exploring: a try's end was removed from its launcher's record (with its
    cgroup and directory) before its report was written to disk; an agent killed while that
    report's fsync was under way left the next one a run record and no end, and a try that
    had succeeded was reported LOST and run again."""
    async with status_reports(store.nc, "keep-1") as delivered, \
            running_agent(nats_url, tmp_path, "keep-1", **QUICK) as agent:
        await start_heartbeats_stored(agent)
        t = task("j-keep", command=["true"], cpus=1, memory_mb=64, term=1)
        with fsync_held(monkeypatch, ".reports") as (syncing, go):
            await store.put(subjects.alloc_key("keep-1"), encode(host_alloc("keep-1", [t], term=1)))
            await eventually(syncing.is_set, timeout=60, what="its report being kept")
            kept = agent.isolation.exit_file(t.attempt_id).read_text().strip()
            go.set()
        assert kept == "0"
        await eventually(lambda: any(d.state.terminal for d in delivered), timeout=60, what="its end reported")
        await eventually(lambda: not agent.isolation.exit_file(t.attempt_id).exists(), timeout=30,
                         what="the record removed once the report was kept")


async def test_a_note_of_tries_seen_cut_short_spoils_no_other(nats_url: str, tmp_path: Path, store: Store) -> None:
    """Found by exploring: a `seen` file whose last line was cut short (a crash, a full
    disk) ran into the next note, `j9.1j1.1`, and after a restart j1.1 was started again;
    one byte that is not UTF-8 kept the agent from starting at all."""
    (tmp_path / "agent").mkdir(parents=True)
    seen = tmp_path / "agent" / "torn-1.seen"
    seen.write_bytes(b"j0.1\nj9.1")  # no newline at its end
    async with status_reports(store.nc, "torn-1") as delivered, \
            running_agent(nats_url, tmp_path, "torn-1", **QUICK) as agent:
        await start_heartbeats_stored(agent)
        t = task("j1", command=["true"], cpus=1, memory_mb=64, term=1)
        await store.put(subjects.alloc_key("torn-1"), encode(host_alloc("torn-1", [t], term=1)))
        await eventually(lambda: any(d.state.terminal for d in delivered), timeout=60, what="the try ended")
    assert {"j0.1", "j9.1", t.attempt_id} <= set(seen.read_text().split())
    (tmp_path / "agent" / "torn-2.seen").write_bytes(b"j0.1\n\xffj8.1\n")
    other = Agent(AgentConfig(nats_url=nats_url, host_id="torn-2", simulate_gpus="1xH100", state_dir=tmp_path / "agent",
                              cpus=4, memory_mb=4096, run_as=ME, **QUICK))
    assert "j0.1" in other.seen
    other.isolation.close()


async def test_a_relative_work_dir_is_where_the_agent_started(nats_url: str, tmp_path: Path, store: Store,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by exploring: `--work-dir a/work` (relative) was taken, and every task failed
    (exit 127): its launcher leaves the agent's working directory before anything of the
    job's, and could not enter `a/work/<attempt>`. The agent takes it from where it started."""
    monkeypatch.chdir(tmp_path)
    marks = tmp_path / "where"
    async with running_agent(nats_url, tmp_path, "rw-1", work_dir=Path("a/work")) as agent:
        assert agent.isolation.work_root == tmp_path / "a" / "work"
        async with status_reports(store.nc, "rw-1") as reports:
            t = task("j-rw", command=["sh", "-c", f"pwd > {marks}"], cpus=1, memory_mb=64, term=1)
            await store.put(subjects.alloc_key("rw-1"), encode(host_alloc("rw-1", [t], term=1)))
            await eventually(lambda: any(r.state.terminal for r in reports), timeout=60, what="the task ended")
        assert [r.state for r in reports if r.state.terminal] == [AttemptState.SUCCEEDED], reports
        assert marks.read_text().strip() == str(tmp_path / "a" / "work" / "j-rw.1")


@contextlib.contextmanager
def fsync_held(monkeypatch: pytest.MonkeyPatch, part: str) -> Any:
    """Any fsync of a file whose path holds `part` (".seen": the agent's note of tries as
    seen; ".reports": a try's end kept until delivered) held until the test lets it go, as
    a disk that takes seconds to sync would: (syncing, go), two events."""
    import threading

    real_fsync = os.fsync
    syncing, go = threading.Event(), threading.Event()

    def fsync(fd: int) -> None:
        if part in os.readlink(f"/proc/self/fd/{fd}"):
            syncing.set()
            go.wait(120)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    try:
        yield syncing, go
    finally:
        go.set()


async def resumed_and_ran(agent: Agent, marks: Path) -> None:
    """Heartbeats resume (what the heartbeat loop does then: the fence ends, the assignment
    is read again) and the try held writes its one mark, "ran"."""
    agent.fenced = False
    await agent._refresh_assignments()
    await eventually(lambda: marks.exists() and marks.read_text() != "", timeout=30, what="the task's mark")
    assert marks.read_text().splitlines() == ["ran"]


async def held_by_a_fence(agent: Agent, store: Store, monkeypatch: pytest.MonkeyPatch, *tasks: Any) -> None:
    """Assign `tasks` to the agent's host and let the fence begin while their note as seen
    is being written: the agent holds them unstarted (`_unstarted`)."""
    host = agent.config.host_id
    with fsync_held(monkeypatch, ".seen") as (noting, go):
        await store.put(subjects.alloc_key(host), encode(host_alloc(host, list(tasks), term=1)))
        await eventually(noting.is_set, timeout=30, what="the note being written")
        agent.fenced = True  # as _check_fence sets it when heartbeats fail
        go.set()
        await eventually(lambda: agent._unstarted.keys() == {t.attempt_id for t in tasks}, timeout=30,
                         what="the tries held")


async def test_a_disk_slow_to_sync_the_note_of_a_try_does_not_stop_the_agents_loop(
        nats_url: str, tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a CI run: the agent noted each try as seen with an fsync on its event loop;
    a disk slow to sync (there, three NATS nodes and PostgreSQL syncing every write; on a
    GPU host, a task writing its checkpoint) stopped the loop, its heartbeats and its
    fence, and its watchdog took it for asleep and stopped its tries. The note is written
    in a thread now: heartbeats go on while it is, and the try starts once it is written."""
    import threading

    marks = tmp_path / "runs"
    async with running_agent(nats_url, tmp_path, "slow-1", **QUICK) as agent:
        await start_heartbeats_stored(agent)
        with fsync_held(monkeypatch, ".seen") as (noting, go):
            beats: list[int] = []

            def watch() -> None:  # a thread: it sees the agent's heartbeats even if its loop is stopped
                noting.wait(120)
                first = agent.hb_seq
                for _ in range(400):
                    if agent.hb_seq >= first + 2:
                        beats.append(agent.hb_seq - first)
                        break
                    threading.Event().wait(0.05)
                go.set()

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            t = task("j-slow", command=["sh", "-c", f"echo ran >> {marks}"], cpus=1, memory_mb=64, term=1)
            await store.put(subjects.alloc_key("slow-1"), encode(host_alloc("slow-1", [t], term=1)))
            await eventually(lambda: not watcher.is_alive(), timeout=60, what="the note written")
        assert beats, "no heartbeat was sent while the note of the try was being written"
        await eventually(lambda: marks.exists() and marks.read_text() != "", timeout=30, what="the task's mark")
        assert marks.read_text().splitlines() == ["ran"]
        assert "j-slow.1" in (tmp_path / "agent" / "slow-1.seen").read_text().split()


async def test_a_fence_that_begins_while_a_try_is_being_noted_holds_it_until_heartbeats_resume(
        nats_url: str, tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The note of a try as seen is written off the agent's loop, so the fence may begin
    meanwhile: the try is then not started (nothing starts while cut off), and the read of
    the assignment when heartbeats resume starts it, though that record was applied."""
    marks = tmp_path / "runs"
    async with running_agent(nats_url, tmp_path, "fnote-1", heartbeat_interval_s=300.0, ttl_intervals=3,
                             fence_after_s=600.0) as agent:
        await start_heartbeats_stored(agent)
        t = task("j-fnote", command=["sh", "-c", f"echo ran >> {marks}"], cpus=1, memory_mb=64, term=1)
        await held_by_a_fence(agent, store, monkeypatch, t)
        assert "j-fnote.1" not in agent.runs and not marks.exists()
        # Heartbeats resume (what the heartbeat loop does then): the same record again.
        await resumed_and_ran(agent, marks)
        assert not agent._unstarted


async def test_a_shutdown_that_begins_while_a_try_is_being_noted_hands_it_back(
        nats_url: str, tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """... and a shutdown that begins meanwhile hands the try back unstarted (KILLED, not
    counted), as it does what comes after it."""
    marks = tmp_path / "runs"
    async with status_reports(store.nc, "snote-1") as delivered, \
            running_agent(nats_url, tmp_path, "snote-1", **QUICK) as agent:
        await start_heartbeats_stored(agent)
        with fsync_held(monkeypatch, ".seen") as (noting, go):
            t = task("j-snote", command=["sh", "-c", f"echo ran >> {marks}"], cpus=1, memory_mb=64, term=1)
            await store.put(subjects.alloc_key("snote-1"), encode(host_alloc("snote-1", [t], term=1)))
            await eventually(noting.is_set, timeout=30, what="the note being written")
            agent.leaving = True  # as the shutdown sets it
            go.set()
            await eventually(lambda: any(d.attempt_id == "j-snote.1" for d in delivered), timeout=30,
                             what="the try handed back")
        assert "j-snote.1" not in agent.runs and not marks.exists()
        assert [(d.state, d.reason) for d in delivered] == [
            (AttemptState.KILLED, "not started: its agent was shutting down")]


async def test_a_held_try_is_not_started_by_a_reconcile_during_which_the_fence_began_again(
        nats_url: str, tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a review: the tries a fence held unstarted were started as the reconcile
    that came when heartbeats resumed reached them, without looking at the fence again; a
    report before them (kept on a slow disk) gave the fence time to begin again, and the
    try ran while cut off, unfrozen. They are started last, each right after a look."""
    marks = tmp_path / "runs"
    async with running_agent(nats_url, tmp_path, "uf-1", heartbeat_interval_s=300.0, ttl_intervals=3,
                             fence_after_s=600.0) as agent:
        await start_heartbeats_stored(agent)
        c = task("j-c", command=["sleep", "30"], cpus=1, memory_mb=64, term=1)
        x = task("j-x", command=["sh", "-c", f"echo ran >> {marks}; sleep 30"], cpus=1, memory_mb=64, term=1)
        await held_by_a_fence(agent, store, monkeypatch, c, x)
        # While fenced, j-c is cancelled (a record not applied: fenced).
        c_stop = task("j-c", command=["sleep", "30"], cpus=1, memory_mb=64, term=1, stop=True, stop_reason="cancel")
        await store.put(subjects.alloc_key("uf-1"), encode(host_alloc("uf-1", [c_stop, x], term=1)))
        # Heartbeats resume; j-c's report is kept on a slow disk, and the fence begins again meanwhile.
        with fsync_held(monkeypatch, ".reports") as (keeping, go):
            agent.fenced = False
            refresh = asyncio.create_task(agent._refresh_assignments())
            await eventually(keeping.is_set, timeout=30, what="j-c's report being kept")
            agent.fenced = True
            go.set()
            await asyncio.wait_for(refresh, 30)
        assert "j-x.1" not in agent.runs and "j-x.1" in agent._unstarted and not marks.exists()
        await resumed_and_ran(agent, marks)
        assert not agent._unstarted


async def test_an_older_record_is_not_applied_again_for_a_held_try_once_a_newer_one_came(
        nats_url: str, tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a review: the record applied may be applied again for the tries a fence
    held, but once a newer one came (it cancelled the try, while fenced), the older one
    (a read of it that waited its turn) started the cancelled try."""
    marks = tmp_path / "runs"
    async with running_agent(nats_url, tmp_path, "or-1", heartbeat_interval_s=300.0, ttl_intervals=3,
                             fence_after_s=600.0) as agent:
        await start_heartbeats_stored(agent)
        x = task("j-or", command=["sh", "-c", f"echo ran >> {marks}; sleep 30"], cpus=1, memory_mb=64, term=1)
        await held_by_a_fence(agent, store, monkeypatch, x)
        old = agent.applied_seq
        x_stop = task("j-or", command=["true"], cpus=1, memory_mb=64, term=1, stop=True, stop_reason="cancelled")
        await store.put(subjects.alloc_key("or-1"), encode(host_alloc("or-1", [x_stop], term=1)))
        await eventually(lambda: agent._newest_seq > old, timeout=30, what="the newer record read (fenced)")
        agent.fenced = False
        await agent.reconcile(host_alloc("or-1", [x], term=1), old)  # the older record again
        assert "j-or.1" not in agent.runs
        await agent._refresh_assignments()  # the newest: the try was cancelled before it started
        await eventually(lambda: not agent._unstarted, timeout=30, what="the held try let go")
        assert "j-or.1" not in agent.runs and not marks.exists()


async def test_after_a_fence_whose_end_could_not_check_the_key_nothing_placed_before_is_started(
        nats_url: str, tmp_path: Path, store: Store) -> None:
    """Found by a review: a fence that ended with a heartbeat stored without the check
    (the key may have expired, and the leader replaced the host's tries) stopped the
    frozen attempts, but the read of the assignment that followed started what it listed
    unstarted: a record written before the leader took the expiry lists tries it has
    placed again elsewhere. They are handed back unstarted now (KILLED as the host's, not
    counted), a record pushed before that read included; what is placed after it starts."""
    from agent.agent import UNCHECKED_REASON

    marks = tmp_path / "runs"
    async with status_reports(store.nc, "uk-1") as delivered, \
            running_agent(nats_url, tmp_path, "uk-1", heartbeat_interval_s=300.0, ttl_intervals=3,
                          fence_after_s=600.0) as agent:
        await start_heartbeats_stored(agent)
        agent.last_heartbeat_ok -= 700.0  # no heartbeat stored for longer than fence_after
        await agent._check_fence()
        agent.last_heartbeat_ok += 700.0
        assert agent.fenced
        a = task("j-uka", command=["sh", "-c", f"echo a >> {marks}"], cpus=1, memory_mb=64, term=1)
        await store.put(subjects.alloc_key("uk-1"), encode(host_alloc("uk-1", [a], term=1)))
        await eventually(lambda: "j-uka.1" in agent._assigned, timeout=30, what="the record read (fenced)")
        agent._end_fence(key_intact=False)  # a heartbeat stored without the check
        # A record pushed before the read of the assignment (written before the leader took
        # the expiry): its new try is handed back too.
        b = task("j-ukb", command=["sh", "-c", f"echo b >> {marks}"], cpus=1, memory_mb=64, term=1)
        await store.put(subjects.alloc_key("uk-1"), encode(host_alloc("uk-1", [a, b], term=1)))
        await eventually(lambda: {"j-uka.1", "j-ukb.1"} <= {d.attempt_id for d in delivered if d.state.terminal},
                         timeout=30, what="both tries ended")
        assert {(d.attempt_id, d.state, d.reason, d.host_trouble) for d in delivered} == {
            (f"j-uk{k}.1", AttemptState.KILLED, UNCHECKED_REASON, True) for k in "ab"}
        assert agent._key_unchecked  # no read of the assignment since the fence's end yet
        await agent._refresh_assignments()  # what the heartbeat loop does when the fence ends
        assert not agent._key_unchecked
        assert not agent.runs and not marks.exists() and len(delivered) == 2
        # Placed after the read: started.
        c = task("j-ukc", command=["sh", "-c", f"echo c >> {marks}"], cpus=1, memory_mb=64, term=1)
        await store.put(subjects.alloc_key("uk-1"), encode(host_alloc("uk-1", [a, b, c], term=1)))
        await eventually(lambda: marks.exists() and marks.read_text() != "", timeout=30, what="the new try's mark")
        assert marks.read_text().splitlines() == ["c"]


async def test_a_try_a_fence_held_is_handed_back_when_the_fences_end_could_not_check_the_key(
        nats_url: str, tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """... and so is a try the fence held unstarted (its note was being written when the
    fence began), which a checked end would start."""
    from agent.agent import UNCHECKED_REASON

    marks = tmp_path / "runs"
    async with status_reports(store.nc, "ukh-1") as delivered, \
            running_agent(nats_url, tmp_path, "ukh-1", heartbeat_interval_s=300.0, ttl_intervals=3,
                          fence_after_s=600.0) as agent:
        await start_heartbeats_stored(agent)
        t = task("j-ukh", command=["sh", "-c", f"echo ran >> {marks}"], cpus=1, memory_mb=64, term=1)
        await held_by_a_fence(agent, store, monkeypatch, t)
        agent._end_fence(key_intact=False)
        await agent._refresh_assignments()
        await eventually(lambda: any(d.attempt_id == "j-ukh.1" for d in delivered), timeout=30,
                         what="the held try handed back")
        assert [(d.state, d.reason, d.host_trouble) for d in delivered] == [
            (AttemptState.KILLED, UNCHECKED_REASON, True)]
        assert not agent._unstarted and "j-ukh.1" not in agent.runs and not marks.exists()
        assert not agent._key_unchecked


async def test_a_shutdown_waits_for_the_note_under_way_and_hands_the_try_back(
        nats_url: str, tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a review: the shutdown did not wait for a reconcile whose note was being
    written; the connection's close cut it short, and the next agent reported the try LOST
    (counted) though it never ran. The shutdown waits for it (bounded), and the try is
    handed back (KILLED by the shutdown, not counted)."""
    marks = tmp_path / "runs"
    async with status_reports(store.nc, "sd2-1") as delivered:
        with fsync_held(monkeypatch, ".seen") as (noting, go):
            agent = Agent(AgentConfig(nats_url=nats_url, host_id="sd2-1", simulate_gpus="1xH100",
                                      state_dir=tmp_path / "agent", cpus=4, memory_mb=4096, run_as=ME, **QUICK))
            stop = asyncio.Event()
            run = asyncio.create_task(agent.run(stop))
            await start_heartbeats_stored(agent)
            t = task("j-sd2", command=["sh", "-c", f"echo ran >> {marks}"], cpus=1, memory_mb=64, term=1)
            await store.put(subjects.alloc_key("sd2-1"), encode(host_alloc("sd2-1", [t], term=1)))
            await eventually(noting.is_set, timeout=30, what="the note being written")
            stop.set()
            # The shutdown waits for the reconcile (before, it went on, and ended).
            await eventually(lambda: run.done() or bool(agent._reconcile_lock._waiters), timeout=60,
                             what="the shutdown waiting, or ended")
            assert not run.done()
            go.set()
            await asyncio.wait_for(run, 60)
        await eventually(lambda: any(d.attempt_id == "j-sd2.1" for d in delivered), timeout=30, what="the report")
        assert [(d.state, d.reason, d.shutdown) for d in delivered if d.attempt_id == "j-sd2.1"] == [
            (AttemptState.KILLED, "not started: its agent was shutting down", True)]
        assert not marks.exists()


async def test_a_shutdown_while_fenced_hands_back_the_tries_the_fence_held(
        nats_url: str, tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a review: a try held unstarted by a fence was never handed back by the
    shutdown (only a reconcile after it would have): the next agent reported it LOST, as
    one whose outcome is unknown, though it never ran. The shutdown hands it back (the
    report kept on disk until delivered: by the next agent, if not by this one)."""
    marks = tmp_path / "runs"
    t = task("j-sf", command=["sh", "-c", f"echo ran >> {marks}"], cpus=1, memory_mb=64, term=1)
    async with status_reports(store.nc, "sf-1") as delivered:
        async with running_agent(nats_url, tmp_path, "sf-1", **QUICK) as agent:
            await start_heartbeats_stored(agent)
            with fsync_held(monkeypatch, ".seen") as (noting, go):
                await store.put(subjects.alloc_key("sf-1"), encode(host_alloc("sf-1", [t], term=1)))
                await eventually(noting.is_set, timeout=30, what="the note being written")
                assert agent.store is not None
                real = agent.store.js.publish
                hb_subject = subjects.kv_subject(subjects.HOSTS_BUCKET, "sf-1")

                async def publish(subject: str, *a: Any, **kw: Any) -> Any:
                    if subject == hb_subject:
                        raise TimeoutError("heartbeats cut off (test)")
                    return await real(subject, *a, **kw)

                agent.store.js.publish = publish  # type: ignore[method-assign]
                await eventually(lambda: agent.fenced, timeout=30, what="fenced")
                go.set()
                await eventually(lambda: "j-sf.1" in agent._unstarted, timeout=30, what="held unstarted")
        assert not agent._unstarted
        if not any(d.attempt_id == "j-sf.1" for d in delivered):
            assert (tmp_path / "agent" / "sf-1.reports" / "j-sf.1").exists()  # kept for the next agent
            async with running_agent(nats_url, tmp_path, "sf-1", **QUICK):
                await eventually(lambda: any(d.attempt_id == "j-sf.1" for d in delivered), timeout=30,
                                 what="the kept report delivered by the next agent")
        assert [(d.state, d.reason) for d in delivered if d.attempt_id == "j-sf.1"] == [
            (AttemptState.KILLED, "not started: its agent was shutting down")]
    assert not marks.exists()


async def test_a_held_try_is_handed_back_when_the_host_got_into_trouble_meanwhile(
        nats_url: str, tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a review: a try a fence held unstarted was started when heartbeats resumed
    without the look every other try gets, whether the host could start a try a moment
    ago; in trouble since (its disk full, say), it is handed back as the host's (KILLED,
    not counted), as the others are."""
    marks = tmp_path / "runs"
    async with status_reports(store.nc, "tr-1") as delivered, \
            running_agent(nats_url, tmp_path, "tr-1", heartbeat_interval_s=300.0, ttl_intervals=3,
                          fence_after_s=600.0) as agent:
        await start_heartbeats_stored(agent)
        t = task("j-tr", command=["sh", "-c", f"echo ran >> {marks}"], cpus=1, memory_mb=64, term=1)
        await held_by_a_fence(agent, store, monkeypatch, t)
        agent._troubled("[Errno 28] No space left on device")
        agent.fenced = False
        await agent._refresh_assignments()
        await eventually(lambda: any(d.attempt_id == "j-tr.1" for d in delivered), timeout=30, what="handed back")
        mine = [d for d in delivered if d.attempt_id == "j-tr.1"]
        assert [(d.state, d.host_trouble) for d in mine] == [(AttemptState.KILLED, True)], mine
        assert "No space left" in mine[0].reason
        assert "j-tr.1" not in agent.runs and not marks.exists()
