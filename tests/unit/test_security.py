"""The credentials Muster generates, as files: private modes, seeds where they belong,
only public keys in the nats-server config. No server runs (tests/integration/test_security.py
checks what NATS itself refuses)."""

from __future__ import annotations

from server.broker.natsauth import AuthDir
from tests.conftest import A


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
