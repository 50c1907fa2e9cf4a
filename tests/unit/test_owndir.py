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
    with pytest.raises(PermissionError, match="not a directory"):
        own_dir(tmp_path / "file")


def test_a_umask_of_002_and_the_users_own_group_are_the_user(tmp_path: Path) -> None:
    """Found by a review: under a umask of 002 (ordinary users' default on many systems)
    the directories own_dir made above its own came out group-writable and were then
    refused, as was a checkout's `.muster`. Those it makes are 0755 whatever the umask, and
    a group that is the user's own private group counts as the user."""
    import grp
    import pwd

    old = os.umask(0o002)
    try:
        made = own_dir(tmp_path / "x" / "y" / "state")
    finally:
        os.umask(old)
    assert (tmp_path / "x").stat().st_mode & 0o777 == 0o755 and made.stat().st_mode & 0o777 == 0o700
    me = pwd.getpwuid(os.geteuid())
    group = grp.getgrgid(me.pw_gid)
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    os.chmod(checkout, 0o775)
    if group.gr_name == me.pw_name and not group.gr_mem:  # a user private group
        assert own_dir(checkout / ".muster").is_dir()
    else:
        with pytest.raises(PermissionError, match="may be changed by another user"):
            own_dir(checkout / ".muster")


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
    # ... also when reached through a link of root's part-way (found by a review: only a
    # link at the end was followed and checked).
    (tmp_path / "through").symlink_to(theirs)
    with pytest.raises(PermissionError, match="may be changed by another user"):
        own_dir(tmp_path / "through" / "state")
    # A group-writable directory of a group that is not this user's own.
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, 0, OTHER)
    os.chmod(shared, 0o775)
    with pytest.raises(PermissionError, match="may be changed by another user"):
        own_dir(shared / "state")


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
