"""Which historian writes a database that several server replicas share.

Every replica starts a historian. With SQLite each writes its own file; with a shared
database (PostgreSQL) one at a time is enough, so the others would only repeat every
write. The writer holds a key in the state bucket, `history.writer.<database digest>`,
with a TTL; it renews it every `renew_every_s`, gives it up when it stops, and the others
try to take it every `retry_every_s`. There is no fencing: history writes are idempotent
(a row is only replaced by a newer revision), so a moment with two writers costs work,
never correctness. For the same reason a writer whose renewal fails (NATS slow or out of
reach) keeps writing, and stops only once it sees another holder: stopping on a timeout
made a loaded cluster hand the lease back and forth, and each new writer reads every job
record again; a writer that finds the key expired (no renewal landed within its TTL) takes
it again. The price of the long TTL: after a writer's crash (not a stop, which gives
the key up) history waits up to `ttl_s` for the next.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from wire.errors import ConflictError, StoreError
from wire.kv import Store

log = logging.getLogger(__name__)


def shared_database(url: str) -> bool:
    """A database other replicas may write too (anything but a SQLite file of one's own)."""
    return not url.startswith("sqlite")


def lease_key(url: str) -> str:
    return "history.writer." + hashlib.sha256(url.encode()).hexdigest()[:12]


@dataclass
class WriterLease:
    store: Store
    key: str
    holder: str
    # A writer that died unannounced (SIGKILL) holds history up for this long; a renewal
    # that times out does not end the writer (see renew), so the TTL need not cover the
    # historian's slowest renewals on a saturated machine.
    ttl_s: int = 30
    renew_every_s: float = 5.0
    retry_every_s: float = 2.0
    revision: int = 0

    async def acquire(self) -> bool:
        """Take the key if nobody holds it (absent, expired, or given up), or find it ours
        (a write whose answer was lost)."""
        rec = await self.store.get(self.key)
        if rec.value == self.holder.encode():
            self.revision = rec.revision
            return True
        if rec.value:
            return False
        try:
            self.revision = await self._put(rec.revision)
        except ConflictError:
            return False
        return True

    async def renew(self) -> bool:
        """Keep the key. False once another holds it; a renewal that fails otherwise is
        tried again at the next one."""
        try:
            self.revision = await self._put(self.revision)
        except ConflictError:
            return await self._recover()
        except StoreError as exc:
            log.warning("history writer lease not renewed (still writing, trying again): %s", exc)
        return True

    async def _recover(self) -> bool:
        """The key moved on since our last known write: our own renewal whose answer timed
        out, the key's expiry (no renewal landed within its TTL, on a saturated machine),
        or another holder. Only the last ends this writer: an expired key is nobody's, and
        taking it again costs nothing, where giving it up would leave history unwritten
        until another replica's historian runs and takes it. In the first two cases the
        key is written again at once, from the revision just read."""
        try:
            rec = await self.store.get(self.key)
            if rec.value and rec.value != self.holder.encode():
                return False
            if not rec.value:
                log.warning("history writer lease expired while this historian was writing; taking it again")
            self.revision = await self._put(rec.revision)
        except ConflictError:
            pass  # written by someone meanwhile: the next renewal finds out by whom
        except StoreError as exc:
            log.warning("history writer lease not renewed (still writing, trying again): %s", exc)
        return True

    async def _put(self, expected: int) -> int:
        return await self.store.put(self.key, self.holder.encode(), expected=expected, ttl=f"{self.ttl_s}s")

    async def release(self) -> None:
        """Give the key up (an empty value), so another replica takes over at once. Once
        only: a second call (or one before any acquire) does nothing."""
        if not self.revision:
            return
        try:
            await self.store.put(self.key, b"", expected=self.revision, ttl=f"{self.ttl_s}s")
        except StoreError:
            pass  # lost already, or NATS gone: the TTL frees it
        finally:
            self.revision = 0
