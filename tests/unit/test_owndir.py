"""A directory of this user's alone (wire.owndir): the agent's state directory and the
server's data directory are made, or taken only when no other user made them or can change
them or what leads to them (found by exploring: a job that made an agent's state directory
in /tmp first ran its own command as root through a launch spec it put there)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.agent import Agent, AgentConfig
from server.replica import private_dir
from wire.errors import ConfigError
from wire.owndir import own_dir

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make another user's directory")
OTHER = 3_069_650  # a uid as a job's task gets


def test_a_directory_is_made_private_and_one_others_may_read_is_made_private(tmp_path: Path) -> None:
    made = own_dir(tmp_path / "a" / "b")
    assert made.is_dir() and made.stat().st_mode & 0o777 == 0o700
    readable = tmp_path / "readable"
    readable.mkdir()
    os.chmod(readable, 0o755)
    own_dir(readable)
    assert readable.stat().st_mode & 0o777 == 0o700


def test_a_directory_others_may_write_to_or_lead_through_is_refused(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(PermissionError, match="may be written by other users"):
        own_dir(open_dir)
    assert open_dir.stat().st_mode & 0o777 == 0o777  # left as it is: what is in it is not trusted
    # Inside a directory others may write to (and move things in: not sticky).
    with pytest.raises(PermissionError, match="may be changed by another user"):
        own_dir(open_dir / "state")
    # A sticky one, as /tmp: others cannot move what is this user's in it.
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    assert own_dir(sticky / "state").is_dir()
    # Not a directory.
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError):
        own_dir(tmp_path / "file")


def test_this_users_link_to_its_own_directory_is_taken(tmp_path: Path) -> None:
    real = own_dir(tmp_path / "real")
    (tmp_path / "link").symlink_to(real)
    assert own_dir(tmp_path / "link") == tmp_path / "link"


@ROOT_ONLY
def test_another_users_directory_or_link_is_refused(tmp_path: Path) -> None:
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    theirs = sticky / "state"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, OTHER, OTHER)
    with pytest.raises(PermissionError, match="not this user's directory"):
        own_dir(theirs)
    (sticky / "planted").symlink_to(own_dir(tmp_path / "mine"))
    os.lchown(sticky / "planted", OTHER, OTHER)
    with pytest.raises(PermissionError, match="a link of another user"):
        own_dir(sticky / "planted")
    # A directory of theirs on the way.
    with pytest.raises(PermissionError, match="may be changed by another user"):
        own_dir(theirs / "deeper")


@ROOT_ONLY
def test_an_agent_refuses_a_state_directory_a_job_made_first(tmp_path: Path) -> None:
    """A task (its own uid) made the state directory, and its launchers' directory in it,
    before the agent started: the agent refuses to start, having read and written
    nothing in it, and says why."""
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    state = sticky / "agent-state"
    (state / "h9.launch").mkdir(parents=True)
    (state / "h9.runs").mkdir()
    (state / "h9.runs" / "victim").write_text("1 - wd:" + str(tmp_path / "victim" / "victim") + "\n")
    (tmp_path / "victim" / "victim").mkdir(parents=True)
    for p in (state, state / "h9.launch", state / "h9.runs", state / "h9.runs" / "victim"):
        os.chown(p, OTHER, OTHER)
        os.chmod(p, 0o777)
    with pytest.raises(ConfigError, match="state directory"):
        Agent(AgentConfig(nats_url="nats://127.0.0.1:1", host_id="h9", simulate_gpus="1xH100", state_dir=state,
                          cgroups="off"))
    assert (tmp_path / "victim" / "victim").is_dir()
    assert state.stat().st_uid == OTHER and state.stat().st_mode & 0o777 == 0o777


@ROOT_ONLY
def test_a_server_refuses_a_data_directory_another_user_made_first(tmp_path: Path) -> None:
    """Another user's data directory with a `token` link in it: the server took the admin
    token into that user's file. It now refuses the directory."""
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    data = sticky / "data"
    data.mkdir()
    (data / "token").symlink_to(data / "leak")
    os.chown(data, OTHER, OTHER)
    with pytest.raises(ConfigError, match="data directory"):
        private_dir(data)
