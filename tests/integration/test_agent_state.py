"""The agent's state directory (`--state-dir`): what it keeps there outlives a crash of
the machine, and a restarted agent reads it right."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.agent import Agent, AgentConfig
from agent.watchdog import Watchdog, read_run, run_record, start_time, this_boot
from tests.integration.test_agent import ME
from wire.messages import AttemptState, StatusReport


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
