"""The agent's state directory (`--state-dir`): what it keeps there outlives a crash of
the machine, and a restarted agent reads it right."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from agent.agent import Agent, AgentConfig
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
