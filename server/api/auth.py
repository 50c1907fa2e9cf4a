"""API tokens: stored only as SHA-256 hashes in the `state` bucket, so every replica
accepts them; the operator token is created at the cluster's first start.

Console sessions: a random id in the browser's cookie, its SHA-256 hash as the key
`auth.session.<hash>` with the hash of the token it was opened with and when it ends (the
key expires then too). Every replica knows every session; signing out deletes it, and a
session whose token was revoked is no longer valid."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import time
from pathlib import Path

from server.state.cluster import ClusterState, SessionInfo, TokenInfo
from wire import subjects
from wire.errors import ConflictError, Forbidden, StoreError
from wire.kv import Store
from wire.records import Record

log = logging.getLogger(__name__)

ROLES = ("viewer", "operator", "admin")
SESSION_PREFIX = "auth.session."


def allows(info: TokenInfo | None, needed: str) -> bool:
    """Roles are ordered: admin can do what an operator can, who can do what a viewer can."""
    if info is None or info.role not in ROLES:
        return False
    return ROLES.index(info.role) >= ROLES.index(needed)


def require_cluster_wide(info: TokenInfo | None) -> None:
    """Raise Forbidden unless the token may act on the cluster itself (hosts): an
    operator's or admin's token bound to no queue. A team's token (bound to queues) acts
    only on its queues' jobs."""
    if not allows(info, "operator"):
        raise Forbidden("this needs the operator role")
    assert info is not None
    if not info.cluster_wide:
        raise Forbidden(f"this token is bound to queues ({', '.join(info.queues or ())}) and acts only on their "
                        "jobs; acting on hosts needs a token bound to no queue")


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_token(state: ClusterState, token: str | None) -> TokenInfo | None:
    """The token's record, or None when it is missing, unknown, revoked or expired."""
    if not token:
        return None
    h = token_hash(token)
    for known, info in state.tokens.items():
        if hmac.compare_digest(known, h):
            return None if info.expired() else info
    return None


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


async def bootstrap_token(store: Store, state: ClusterState, data_dir: Path) -> str | None:
    """Create the operator token on the cluster's first start.

    Returns the new token (to print once), or None when the cluster already has one.
    The value is MUSTER_TOKEN when set, else random; it is written to <data-dir>/token."""
    if state.tokens:
        return None
    rec = await store.get("auth.bootstrap")
    if rec.value is not None:
        return None
    token = os.environ.get("MUSTER_TOKEN") or "mst_" + secrets.token_urlsafe(24)
    info = TokenInfo(name="operator", role="admin", created_at=time.time())
    try:
        await store.put("auth.bootstrap", b"1", expected=0)
    except ConflictError:
        return None  # another replica is bootstrapping
    await store.put(f"auth.token.{token_hash(token)}", info.model_dump_json().encode())
    state.tokens[token_hash(token)] = info
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def session_hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


async def open_session(store: Store, state: ClusterState, token: str, ttl_s: float) -> str:
    """A new console session for `token` (already checked), valid `ttl_s` seconds: its id."""
    session_id = secrets.token_urlsafe(32)
    key = SESSION_PREFIX + session_hash(session_id)
    now = time.time()
    value = SessionInfo(token=token_hash(token), created_at=now, expires_at=now + ttl_s).model_dump_json().encode()
    revision = await store.put(key, value, ttl=f"{max(1, int(ttl_s))}s")
    state.apply_state_record(Record(key, revision, value))  # usable at once on this replica
    return session_id


def session_of(state: ClusterState, session_id: str, now: float | None = None) -> tuple[str, TokenInfo] | None:
    """(session hash, its token) of a live session: known, not expired, its token not revoked."""
    if not session_id or len(session_id) > 128:
        return None
    h = session_hash(session_id)
    info = state.sessions.get(h)
    if info is None or (time.time() if now is None else now) >= info.expires_at:
        return None
    token = state.tokens.get(info.token)
    return (h, token) if token is not None and not token.expired(now) else None


def session_alive(state: ClusterState, h: str) -> bool:
    """The session (by hash) is still there and its token too."""
    info = state.sessions.get(h)
    token = state.tokens.get(info.token) if info is not None else None
    return info is not None and time.time() < info.expires_at and token is not None and not token.expired()


async def close_session(store: Store, state: ClusterState, h: str) -> None:
    """End the session (by hash) on every replica."""
    key = SESSION_PREFIX + h
    try:
        await store.js.publish(subjects.kv_subject(subjects.STATE_BUCKET, key), b"",
                               headers={"KV-Operation": "DEL"}, timeout=store.timeout)
    except Exception as exc:  # noqa: BLE001
        raise StoreError(f"sign out: {exc}") from exc
    state.sessions.pop(h, None)
