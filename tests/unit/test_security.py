"""The credentials Muster generates, as files: private modes, seeds where they belong,
only public keys in the nats-server config. No server runs (tests/integration/test_security.py
checks what NATS itself refuses)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from server.broker.natsauth import AuthDir
from tests.conftest import A
from wire.errors import ConfigError


def test_credentials_files_are_private(auth: AuthDir) -> None:
    assert (auth.path.stat().st_mode & 0o777) == 0o700
    for f in [auth.server_creds, auth.agent_creds(A), auth.subscriber_creds("pager"), auth.users_file,
              auth.conf_file]:
        assert (f.stat().st_mode & 0o777) == 0o600, f
        assert f.read_text().strip()
    assert auth.server_creds.read_text().startswith("SU")
    conf = auth.conf_file.read_text()  # only public keys in the server config
    for f in [auth.server_creds, auth.agent_creds(A), auth.subscriber_creds("pager")]:
        assert f.read_text().strip() not in conf


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make another user's directory")


def _nobody() -> int:
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return 65534


def _planted(tmp_path: Path, name: str = "auth") -> tuple[Path, Path]:
    """A credentials directory another user (nobody) made before Muster ran, with a link
    `server.nk.tmp` to a file of theirs: where the control plane's seed was written."""
    d = tmp_path / name
    d.mkdir(mode=0o700)
    trap = tmp_path / "theirs"
    trap.write_text("")
    os.symlink(trap, d / "server.nk.tmp")
    for p in (trap, d / "server.nk.tmp", d):
        os.lchown(p, _nobody(), _nobody())
    return d, trap


@ROOT_ONLY
def test_a_credentials_directory_another_user_made_is_refused_and_its_links_never_followed(tmp_path: Path) -> None:
    """Found by exploring: `nobody` made the auth directory first, with `server.nk.tmp` a
    link to its own file; `AuthDir.ensure` (as root: `muster nats`, `muster up`, `muster
    creds`) made it 0700 and wrote the control plane's seed through the link into
    nobody's file. A directory another user made is refused, before anything is read from
    or written into it; in one of this user's, a temporary file left there (a link
    included) is removed and made afresh, never followed."""
    d, trap = _planted(tmp_path)
    with pytest.raises(ConfigError, match="not this user's directory"):
        AuthDir(d).ensure()
    assert trap.read_text() == "" and not (d / "server.nk").exists()
    assert d.stat().st_uid == _nobody()
    # The same through `muster creds` and `muster nats` (their --auth-dir), and a NATS data
    # directory another user made.
    from server.cli import build_parser
    from server.cli.creds import cmd_issue
    from server.cli.nats import cmd_nats

    with pytest.raises(ConfigError, match="not this user's directory"):
        cmd_issue(build_parser().parse_args(["creds", "issue-agent", "h1", "--auth-dir", str(d)]))
    with pytest.raises(ConfigError, match="not this user's directory"):
        cmd_nats(build_parser().parse_args(["nats", "--data-dir", str(tmp_path / "nats"), "--auth-dir", str(d)]))
    assert trap.read_text() == "" and not (d / "server.nk").exists() and not (d / "users.json").exists()
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, _nobody(), _nobody())
    with pytest.raises(ConfigError, match="NATS data directory .* not this user's directory"):
        cmd_nats(build_parser().parse_args(["nats", "--data-dir", str(data)]))
    assert os.listdir(data) == []
    # A directory of this user's with a link left in it: removed, not followed.
    mine = AuthDir(tmp_path / "mine")
    mine.ensure()
    (mine.path / "agents").mkdir(mode=0o700)
    for left in ("users.json.tmp", "auth.conf.tmp", "agents/h1.nk.tmp"):
        os.symlink(trap, mine.path / left)
    mine.issue_agent("h1")
    assert trap.read_text() == ""
    assert not mine.users_file.is_symlink() and "h1" in mine.users_file.read_text()
    assert (mine.users_file.stat().st_mode & 0o777) == 0o600
