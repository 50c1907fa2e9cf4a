"""API tokens: stored only as SHA-256 hashes in the `state` bucket, so every replica
accepts them; the operator token is created at the cluster's first start."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import time
from pathlib import Path

from server.state.cluster import ClusterState, TokenInfo
from wire.errors import ConflictError
from wire.kv import Store

log = logging.getLogger(__name__)

ROLES = ("viewer", "operator", "admin")


def allows(info: TokenInfo | None, needed: str) -> bool:
    """Roles are ordered: admin can do what an operator can, who can do what a viewer can."""
    if info is None or info.role not in ROLES:
        return False
    return ROLES.index(info.role) >= ROLES.index(needed)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_token(state: ClusterState, token: str | None) -> TokenInfo | None:
    """The token's record, or None when it is missing, unknown or revoked."""
    if not token:
        return None
    h = token_hash(token)
    for known, info in state.tokens.items():
        if hmac.compare_digest(known, h):
            return info
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
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token
