"""A token with a lifetime (`muster token create --expires`) is refused once it has passed,
whatever the replica's view still holds (its key expires then too, a moment later)."""

from __future__ import annotations

from server.api.auth import check_token, session_alive, session_hash, session_of, token_hash
from server.state.cluster import ClusterState, SessionInfo, TokenInfo


def test_an_expired_token_and_its_sessions_are_refused() -> None:
    state = ClusterState()
    state.tokens[token_hash("mst_old")] = TokenInfo(name="ci", role="viewer", created_at=1.0, expires_at=100.0)
    state.tokens[token_hash("mst_forever")] = TokenInfo(name="ops", role="operator", created_at=1.0)
    state.sessions[session_hash("s-old")] = SessionInfo(token=token_hash("mst_old"), expires_at=10**12)
    assert check_token(state, "mst_forever") is not None and check_token(state, "mst_old") is None
    assert TokenInfo(name="ci", expires_at=100.0).expired(99.0) is False
    assert session_of(state, "s-old", now=99.0) is not None and session_of(state, "s-old", now=100.0) is None
    assert not session_alive(state, session_hash("s-old"))
