"""Managing API tokens straight in the `state` bucket (`muster token ...`, an admin path
that needs the control plane's NATS credentials).

A token is stored only as its SHA-256 hash: key `auth.token.<hash>`, value TokenInfo
JSON. Every replica watches these keys, so a new token works and a revoked one is
refused (401) on all of them within a moment."""

from __future__ import annotations

import asyncio
import secrets
import time

from server.api.auth import ROLES, token_hash
from server.broker.natsauth import NAME_RE
from server.state.cluster import TokenInfo
from wire import subjects
from wire.errors import ConfigError, ConflictError, DecodeError, StoreError
from wire.kv import Store
from wire.messages import decode
from wire.records import Record
from wire.validation import QUEUE_NAME_RE

PREFIX = "auth.token."
# A token's lifetime when it has one (`muster token create --expires`).
MIN_EXPIRY_S = 1
MAX_EXPIRY_S = 5 * 366 * 86400


async def list_tokens(store: Store, timeout: float = 10) -> dict[str, TokenInfo]:
    """Every live token: hash -> TokenInfo."""
    found: dict[str, TokenInfo] = {}

    def on_record(rec: Record) -> None:
        h = rec.key[len(PREFIX):]
        if rec.value is None:
            found.pop(h, None)
            return
        try:
            found[h] = decode(TokenInfo, rec.value)
        except DecodeError:
            pass

    w = await store.watch(PREFIX + ">", on_record)
    try:
        await asyncio.wait_for(w.synced.wait(), timeout=timeout)
    except TimeoutError as exc:
        raise StoreError("could not read the tokens in time") from exc
    finally:
        await w.stop()
    return found


async def create_token(store: Store, name: str, role: str, queues: list[str] | None = None,
                       expires_s: float | None = None) -> tuple[str, TokenInfo]:
    """A new random token for `name` with `role`, bound to `queues` (the queues it may
    submit jobs to; None: any), working for `expires_s` seconds (None: until revoked: its
    key then carries that TTL, and every replica drops it as it expires). Returns (token,
    info); only the hash is stored."""
    if expires_s is not None and not MIN_EXPIRY_S <= expires_s <= MAX_EXPIRY_S:
        raise ConfigError(f"a token's lifetime must be from {MIN_EXPIRY_S} s to {MAX_EXPIRY_S // 86400} days")
    if role not in ROLES:
        raise ConfigError(f"role must be one of {', '.join(ROLES)}")
    if role == "admin" and queues:
        # An admin acts on every queue and on hosts (TokenInfo.submit_queues): a binding
        # would be ignored, so it is refused rather than stored.
        raise ConfigError("an admin token acts on every queue and on hosts; bind an operator or viewer token to "
                          "queues instead")
    if queues is not None and not queues:
        # Bound to no queue: an empty list (a script's empty `$QUEUES`) must not read as
        # "not bound", a token for every queue and the hosts (found by exploring).
        raise ConfigError("a token bound to queues needs at least one (leave the queues out for every queue)")
    for q in queues or ():
        if not QUEUE_NAME_RE.fullmatch(q):
            raise ConfigError(f"invalid queue name {q!r}")
    if not NAME_RE.fullmatch(name):
        raise ConfigError(f"invalid token name {name!r}")
    if any(info.name == name for info in (await list_tokens(store)).values()):
        raise ConflictError(f"a token named {name!r} exists; revoke it first")
    token = "mst_" + secrets.token_urlsafe(24)
    now = time.time()
    info = TokenInfo(name=name, role=role, created_at=now, queues=sorted(set(queues)) if queues else None,
                     expires_at=now + int(expires_s) if expires_s is not None else 0.0)
    await store.put(PREFIX + token_hash(token), info.model_dump_json().encode(), expected=0,
                    ttl=f"{int(expires_s)}s" if expires_s is not None else None)
    return token, info


async def revoke_token(store: Store, name: str) -> int:
    """Delete every token named `name`. Returns how many."""
    n = 0
    for h, info in (await list_tokens(store)).items():
        if info.name != name:
            continue
        subject = subjects.kv_subject(subjects.STATE_BUCKET, PREFIX + h)
        try:
            await store.js.publish(subject, b"", headers={"KV-Operation": "DEL"}, timeout=store.timeout)
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"revoke {name}: {exc}") from exc
        n += 1
    return n
