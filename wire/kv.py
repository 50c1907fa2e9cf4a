"""The NATS JetStream adapter both sides use: connection, reads, watches and atomic commits.

Everything that touches NATS for durable state goes through here, and foreign
exceptions become `StoreError`, `ConflictError` or `FencedError`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as jsapi
from nats.js import errors as jserrors

from wire import natsclient, retrying, subjects
from wire.errors import ConfigError, ConflictError, FencedError, RejectedError, StoreError
from wire.records import Record, ack_position, is_tombstone
from wire.tls import client_context

log = logging.getLogger(__name__)

WRONG_LAST_SEQUENCE = 10071
# The same refusal without the current sequence in it (nats-server 2.12+ answers a batch
# this way, e.g. when the fence's check against the `term` key fails). Seen in the
# topology test: unrecognised, a deposed leader retried its stale commits for ever.
WRONG_LAST_SEQUENCE_CONSTANT = 10164
DUPLICATE_MSG_ID = 10201
# Refusals that say the cluster is not ready (no leader, no peers, offline): retried as
# any unknown outcome, never taken for a refusal of the batch's content.
NOT_READY = frozenset({10005, 10008, 10118})
WATCH_HEARTBEAT_S = 1.0
# How often a watch with `on_reset` looks whether its stream numbers its records afresh.
RESET_CHECK_S = 2.0
MAX_BATCH = 999  # messages per atomic batch, leaving room for the fence record


@dataclass
class Write:
    """One key write inside an atomic batch.

    `expected` is the revision the key must still have (0 = must not exist, or be
    expired); None means unchecked. `ttl` sets a per-message TTL ("15s"). `delete`
    writes the key's delete marker instead of a value."""

    key: str
    value: bytes
    expected: int | None = None
    ttl: str | None = None
    delete: bool = False


@dataclass
class Fence:
    """Check, inside the same commit, that the leader's fence key still has the revision
    it had when this leader took over: `term` itself (revision = the term) or one of
    the `term.<n>` slot keys written with it. A clustered stream lets only one batch at a
    time be in flight with a check on a given key (it refuses the others with err_code
    10164), so commits in flight together each check a slot of their own."""

    term: int
    holder: str = ""
    key: str = "term"
    revision: int | None = None  # of `key` (0: absent); None: the key `term` at revision `term`

    @property
    def expected(self) -> int:
        return self.term if self.revision is None else self.revision


@dataclass
class CommitResult:
    revisions: dict[str, int] = field(default_factory=dict)
    last_seq: int = 0
    # True when a retry found the batch already applied by an earlier try whose reply
    # was lost: the caller should re-read the keys rather than trust its own values.
    duplicate: bool = False


NATS_ERRORS_LOGGED_EVERY_S = 10.0  # one line per connection at most this often while NATS is away


def quiet_errors(url: str, name: str) -> Callable[[Exception], Any]:
    """A connection's error callback: one warning line, no traceback, at most every
    NATS_ERRORS_LOGGED_EVERY_S with how many were left out (nats-py's own logs each
    reconnection's failure with its traceback: about 150 in an 8-second NATS restart)."""
    last = -NATS_ERRORS_LOGGED_EVERY_S
    left_out = 0

    async def cb(exc: Exception) -> None:
        nonlocal last, left_out
        now = time.monotonic()
        if now - last < NATS_ERRORS_LOGGED_EVERY_S:
            left_out += 1
            return
        more = f" ({left_out} more since the last said)" if left_out else ""
        log.warning("NATS at %s (%s): %s%s", url, name, str(exc) or type(exc).__name__, more)
        last, left_out = now, 0

    return cb


async def connect(
    url: str,
    name: str,
    *,
    creds: str | None = None,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    **kw: object,
) -> NATS:
    """Connect with settings that notice a dead link quickly and never give up.

    `creds` is an nkey seed file (see server.broker.natsauth); `tls_ca` (and optionally a client
    `tls_cert`/`tls_key`) turn on TLS. Each falls back to MUSTER_NATS_CREDS,
    MUSTER_NATS_CA, MUSTER_NATS_CERT and MUSTER_NATS_KEY."""
    creds = creds or os.environ.get("MUSTER_NATS_CREDS") or None
    tls_ca = tls_ca or os.environ.get("MUSTER_NATS_CA") or None
    tls_cert = tls_cert or os.environ.get("MUSTER_NATS_CERT") or None
    tls_key = tls_key or os.environ.get("MUSTER_NATS_KEY") or None
    servers = [u.strip() for u in url.split(",") if u.strip()]
    opts: dict[str, object] = dict(
        name=name,
        ping_interval=2,
        max_outstanding_pings=3,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=3,
        allow_reconnect=True,
        error_cb=quiet_errors(url, name),
    )
    if creds:
        if not os.path.exists(creds):
            raise StoreError(f"NATS credentials file {creds} does not exist")
        opts["nkeys_seed"] = creds
    try:
        ctx = client_context(tls_ca, tls_cert, tls_key)
    except ConfigError as exc:
        raise StoreError(str(exc)) from exc
    if ctx is not None:
        opts["tls"] = ctx
    opts.update(kw)
    try:
        return await natsclient.connect(servers, **opts)
    except Exception as exc:  # noqa: BLE001 - foreign errors become ours
        raise StoreError(f"cannot connect to NATS at {url}: {exc}") from exc


async def connect_once(url: str, name: str, *, creds: str | None = None, tls_ca: str | None = None,
                       tls_cert: str | None = None, tls_key: str | None = None) -> NATS:
    """A connection for a short-lived command (`muster token`, `muster check`): each
    server in `url` tried twice, then StoreError (nats-py's `max_reconnect_attempts=0`
    means "for ever", so a wrong URL used to hang the command); no reconnect once
    connected, and no traceback logged for each failed try."""

    async def quiet(exc: Exception) -> None:
        log.debug("NATS at %s: %s", url, exc)

    return await connect(url, name, creds=creds, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
                         max_reconnect_attempts=1, allow_reconnect=False, error_cb=quiet)


class Store:
    """Reads, watches and revision-checked writes of Muster's KV buckets (the streams
    themselves are created by the control plane: server.state.streams)."""

    def __init__(
        self,
        nc: NATS,
        *,
        replicas: int = 1,
        timeout: float = 5.0,
    ) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=timeout)
        self.replicas = replicas
        self.timeout = timeout
        self.commit_retries = 3
        self.unknown_outcomes = 0

    # ------------------------------------------------------------ reads

    async def get(self, key: str, bucket: str = subjects.STATE_BUCKET, with_headers: bool = False) -> Record:
        """Latest value of a key, read from the stream (expiry markers count as absent);
        with `with_headers`, the headers it was stored with too (a heartbeat's `Nats-TTL`)."""
        stream = f"KV_{bucket}"
        try:
            msg = await self.js.get_last_msg(stream, subjects.kv_subject(bucket, key), direct=True)
        except jserrors.NotFoundError:
            return Record(key, 0, None)
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"cannot read {bucket}/{key}: {exc}") from exc
        seq = int(msg.seq or 0)
        if is_tombstone(msg.headers):
            return Record(key, seq, None)
        headers = dict(msg.headers) if with_headers and msg.headers else None
        return Record(key, seq, msg.data or b"", headers=headers)

    async def watch(
        self,
        pattern: str,
        on_record: Callable[[Record], None],
        bucket: str = subjects.STATE_BUCKET,
        after_seq: int = 0,
        on_reset: Callable[[], None] | None = None,
    ) -> Watch:
        """Watch keys matching `pattern` (the latest value of each, then every change;
        with `after_seq`, only the keys written after that stream sequence: a reader that
        has everything up to it). `on_record` runs synchronously in the subscription
        callback. With `on_reset`, the watch starts again from each key's latest when the
        bucket's stream numbers its records afresh (see Watch)."""
        w = Watch(self, bucket, pattern, on_record, after_seq=after_seq, on_reset=on_reset)
        await w.start()
        return w

    # ------------------------------------------------------------ writes

    async def put(
        self,
        key: str,
        value: bytes,
        *,
        expected: int | None = None,
        ttl: str | None = None,
        bucket: str = subjects.STATE_BUCKET,
        msg_id: str | None = None,
    ) -> int:
        """Single acked write, optionally revision-checked. Returns the new revision."""
        headers: dict[str, str] = {}
        if expected is not None:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(expected)
        if ttl is not None:
            headers["Nats-TTL"] = ttl
        if msg_id:
            headers["Nats-Msg-Id"] = msg_id
        self._check_sizes([(subjects.kv_subject(bucket, key), value, headers)])
        try:
            ack = await self.js.publish(
                subjects.kv_subject(bucket, key), value, headers=headers or None, timeout=self.timeout
            )
        except jserrors.APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                raise ConflictError(f"{key}: revision is no longer {expected}") from exc
            raise StoreError(f"write {key}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"write {key}: {exc}") from exc
        return int(ack.seq)

    async def create(self, key: str, value: bytes, *, within_s: float = 0.0, every_s: float = 0.5,
                     bucket: str = subjects.STATE_BUCKET, ours: Callable[[bytes], bool] | None = None) -> Record:
        """Write a key that must not exist yet (a fresh id); returns the record stored: the
        value written at its revision. While NATS cannot take the write (a stream electing
        its leader, a node lost) it is tried again every `every_s` for up to `within_s`. A
        try whose outcome was unknown may have been stored: the next then finds the key
        taken (NATS checks the expected revision before the message id) and reads it back,
        so the key is written once and the caller told so. What it reads back may have
        been rewritten since (a job placed by the leader: found by exploring, where the
        submission was refused as taken and its client told to submit again): `ours` tells
        whether a value found is this write's, rewritten or not (by default the same
        bytes), and the record found is returned. ConflictError when the key holds
        something else."""
        unknown = False

        async def once() -> Record:
            nonlocal unknown
            try:
                return Record(key, await self.put(key, value, expected=0, bucket=bucket), value)
            except ConflictError:
                if not unknown:
                    raise
                rec = await self.get(key, bucket)  # a StoreError here: tried again
                if rec.value is None:  # a replica behind the write that was refused as taken
                    raise StoreError(f"write {key}: taken, but not read back yet") from None
                if rec.value == value or (ours is not None and ours(rec.value)):
                    return rec
                raise
            except StoreError:
                unknown = True  # it may have been stored (a refusal is not tried again anyway)
                raise

        # Taken, or a record NATS refuses: trying again would not change it.
        return await retrying.within(once, within_s, every_s, lambda e: isinstance(e, StoreError)
                                     and not isinstance(e, ConflictError | RejectedError))

    async def delete(self, key: str, *, expected: int | None = None, bucket: str = subjects.STATE_BUCKET) -> int:
        """Delete a key (a delete marker), optionally revision-checked. Returns its revision."""
        headers = {"KV-Operation": "DEL"}
        if expected is not None:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(expected)
        try:
            ack = await self.js.publish(subjects.kv_subject(bucket, key), b"", headers=headers, timeout=self.timeout)
        except jserrors.APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                raise ConflictError(f"{key}: revision is no longer {expected}") from exc
            raise StoreError(f"delete {key}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"delete {key}: {exc}") from exc
        return int(ack.seq)

    async def commit(
        self,
        writes: list[Write],
        fence: Fence | None = None,
        bucket: str = subjects.STATE_BUCKET,
        *,
        within_s: float = 0.0,
        every_s: float = 0.5,
    ) -> CommitResult:
        """Apply `writes` (and the fence check) as one atomic batch: all or nothing.

        Raises ConflictError when a revision check failed (FencedError when the
        leadership term moved on), RejectedError when NATS refused the batch itself,
        StoreError when the outcome is unknown or NATS could not take it. A retry with
        the same writes is made idempotent by per-message Nats-Msg-Id; with `within_s`
        the last kind is tried again every `every_s` for up to that long (a stream
        electing its leader), and a try that was applied makes the next a duplicate."""
        return await retrying.within(lambda: self._commit_once(writes, fence, bucket), within_s, every_s,
                                     lambda e: isinstance(e, StoreError)
                                     and not isinstance(e, ConflictError | FencedError | RejectedError))

    async def _commit_once(self, writes: list[Write], fence: Fence | None, bucket: str) -> CommitResult:
        if not writes:
            return CommitResult()
        if len(writes) + (1 if fence else 0) > MAX_BATCH + 1:
            raise StoreError(f"batch of {len(writes)} writes exceeds {MAX_BATCH}")
        msgs: list[tuple[str, bytes, dict[str, str]]] = []
        for w in writes:
            h: dict[str, str] = {}
            if w.expected is not None:
                h["Nats-Expected-Last-Subject-Sequence"] = str(w.expected)
            if w.ttl is not None:
                h["Nats-TTL"] = w.ttl
            if w.delete:
                h["KV-Operation"] = "DEL"
            msgs.append((subjects.kv_subject(bucket, w.key), b"" if w.delete else w.value, h))
        if fence is not None:
            msgs.append(
                (
                    subjects.kv_subject(bucket, "fence" if fence.key == "term" else f"fence.{fence.key}"),
                    json.dumps({"term": fence.term, "holder": fence.holder}).encode(),
                    {
                        "Nats-Expected-Last-Subject-Sequence": str(fence.expected),
                        "Nats-Expected-Last-Subject-Sequence-Subject": subjects.kv_subject(bucket, fence.key),
                    },
                )
            )
        n = len(msgs)
        self._check_sizes(msgs)
        # Deterministic message ids: a retry of the same batch after an unknown outcome
        # is refused as a duplicate if the first try was applied, so it applies once.
        digest = hashlib.sha256()
        for subj, data, h in msgs:
            digest.update(subj.encode() + b"\0" + h.get("Nats-Expected-Last-Subject-Sequence", "").encode()
                          + b"\0" + hashlib.sha256(data).digest() + (b"\0DEL" if "KV-Operation" in h else b""))
        ident = digest.hexdigest()[:32]
        for i, (_subj, _data, h) in enumerate(msgs, start=1):
            h["Nats-Msg-Id"] = f"{ident}.{i}"
        resp: dict[str, Any] = {}
        for attempt in range(1, self.commit_retries + 1):
            batch_id = uuid.uuid4().hex
            try:
                for i, (subj, data, h) in enumerate(msgs, start=1):
                    hh = dict(h, **{"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(i)})
                    if i < n:
                        await self.nc.publish(subj, data, headers=hh)
                    else:
                        hh["Nats-Batch-Commit"] = "1"
                        reply = await self.nc.request(subj, data, timeout=self.timeout, headers=hh)
                resp = json.loads(reply.data or b"{}")
                break
            except ValueError as exc:
                raise StoreError(f"commit: bad reply {reply.data[:200]!r}") from exc
            except Exception as exc:  # noqa: BLE001 - timeout or connection loss: outcome unknown
                self.unknown_outcomes += 1
                log.warning("commit outcome unknown (try %d): %s", attempt, exc)
                if attempt == self.commit_retries:
                    raise StoreError(f"commit outcome unknown: {exc}") from exc
                await asyncio.sleep(0.2 * attempt)
        err = resp.get("error")
        if err and err.get("err_code") == DUPLICATE_MSG_ID:
            return CommitResult(duplicate=True)
        if err:
            code = err.get("err_code")
            if code in (WRONG_LAST_SEQUENCE, WRONG_LAST_SEQUENCE_CONSTANT):
                if fence is not None:
                    current = await self.get("term", bucket)
                    if current.revision != fence.term:
                        raise FencedError(f"term {fence.term} superseded by {current.revision}")
                    if fence.key != "term" and (await self.get(fence.key, bucket)).revision != fence.expected:
                        raise FencedError(f"term {fence.term}: fence {fence.key} moved on")
                raise ConflictError(err.get("description", "wrong last sequence"))
            if code in NOT_READY:
                raise StoreError(f"commit not taken, the store is not ready: {err}")
            raise RejectedError(f"commit rejected: {err}")
        last = int(resp["seq"])
        revisions = {}
        first = last - n + 1
        for i, w in enumerate(writes):
            revisions[w.key] = first + i
        return CommitResult(revisions=revisions, last_seq=last)

    def _check_sizes(self, msgs: list[tuple[str, bytes, dict[str, str]]]) -> None:
        """Refuse, before anything is sent, a batch with a message NATS would refuse for
        its size (its payload and headers past the server's `max_payload`)."""
        limit = self.nc.max_payload
        if not limit:
            return
        for subj, data, h in msgs:
            size = len(data) + sum(len(k) + len(v) + 4 for k, v in h.items()) + 128  # batch headers, framing
            if size > limit:
                key = subj.split(".", 2)[2] if subj.startswith("$KV.") else subj
                raise RejectedError(f"record {key} is {len(data):,} bytes; NATS takes at most {limit:,} a message",
                                    key=key)


def delivery_position(msg: Msg) -> tuple[int, int, float]:
    """`ack_position` of a JetStream delivery, or nats-py's `Msg.metadata` for a reply
    subject of another form (raises for what is not a JetStream delivery)."""
    pos = ack_position(msg.reply)
    if pos is None:
        meta = msg.metadata
        pos = (meta.sequence.stream, meta.num_pending, meta.timestamp.timestamp())
    return pos


_letting_go: set[asyncio.Task[None]] = set()  # unsubscribes under way (a reference keeps each)


def _let_go(made: asyncio.Future[JetStreamContext.PushSubscription]) -> None:
    """A subscription made for a watch that was stopped meanwhile: unsubscribed."""
    if made.cancelled() or made.exception() is not None:
        return

    async def unsubscribe() -> None:
        try:
            await made.result().unsubscribe()
        except Exception as exc:  # noqa: BLE001 - the connection is going: nothing to let go
            log.debug("a stopped watch's subscription: %s", exc)

    task = asyncio.ensure_future(unsubscribe())
    _letting_go.add(task)
    task.add_done_callback(_letting_go.discard)


class Watch:
    """A KV watch built on an ordered push consumer; resumes across reconnects."""

    def __init__(
        self,
        store: Store,
        bucket: str,
        pattern: str,
        on_record: Callable[[Record], None],
        *,
        every_revision: bool = False,
        after_seq: int = 0,
        on_reset: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        # Told when the bucket's stream went back to numbering its records afresh (a bucket
        # kept in memory, after every NATS node restarted): its records' revisions start
        # low again, below those read before, and the watch starts again from each key's
        # latest (found by exploring: the ordered consumer waited past the old last
        # sequence, and every heartbeat was ignored for as long as the bucket had been in use).
        self.on_reset = on_reset
        self.resets = 0
        self._monitor: asyncio.Task[None] | None = None
        self.bucket = bucket
        self.pattern = pattern
        self.on_record = on_record
        # False: the latest value of each key, then every change (a view of the bucket);
        # True: every revision still stored, oldest first (a checker reading the history).
        self.every_revision = every_revision
        # > 0: start after this stream sequence. In a bucket that keeps one revision per
        # key (the state bucket), that is the latest value of each key written after it.
        self.after_seq = after_seq
        self.synced = asyncio.Event()
        self.received = 0  # records handed to on_record so far
        self.last_seq = 0  # stream sequence of the last record handed to on_record
        self.start_seq = 0  # the stream's last sequence when the watch started
        self._sub: JetStreamContext.PushSubscription | None = None
        self._stopped = False
        self._prefix = f"$KV.{bucket}."

    async def start(self) -> None:
        self._stopped = False
        await self._subscribe()
        if self.on_reset is not None and not self._stopped:  # (a stop() while it subscribed)
            self._monitor = asyncio.ensure_future(self._watch_for_reset())

    async def _watch_for_reset(self) -> None:
        """Every RESET_CHECK_S: a stream whose last sequence is below the last one read
        was emptied and numbers its records afresh: `on_reset`, then read again."""
        stream = f"KV_{self.bucket}"
        below = 0  # looks in a row that found the stream below what was read
        while True:
            # A start again that failed is tried again sooner (found by exploring: its first
            # try often timed out while the stream was being restored).
            await asyncio.sleep(RESET_CHECK_S if self._sub is not None else RESET_CHECK_S / 4)
            try:
                last = (await self.store.js.stream_info(stream)).state.last_seq
            except Exception as exc:  # noqa: BLE001 - NATS away or electing: look again later
                log.debug("watch %s: stream info: %s", self.bucket, exc)
                continue
            below = below + 1 if last < self.last_seq else 0
            if self._sub is not None and below < 2:
                continue  # (two looks in a row: not one answer of a stream leader just elected)
            below = 0
            if self._sub is not None:
                log.warning("watch %s: the stream's last record is %d, below the %d read: it was emptied and "
                            "numbers its records afresh; reading each key's latest again", self.bucket, last,
                            self.last_seq)
                self.resets += 1
                try:
                    await self._sub.unsubscribe()
                except Exception:  # noqa: BLE001
                    pass
                self._sub = None
                self.last_seq = self.after_seq = 0
                # Replaying each key's latest again: its gaps are no records missed (they
                # were counted as skipped, and held the read clock).
                self.synced.clear()
                assert self.on_reset is not None
                self.on_reset()
            try:
                await self._subscribe()
            except Exception as exc:  # noqa: BLE001 - tried again at the next look
                log.warning("watch %s: starting again failed: %s", self.bucket, exc)

    async def _subscribe(self) -> None:
        info = await self.store.js.stream_info(f"KV_{self.bucket}")
        self.start_seq = info.state.last_seq
        if info.state.messages == 0:
            self.synced.set()

        async def cb(msg: Msg) -> None:
            if self._stopped:
                return
            try:
                seq, pending, stamp = delivery_position(msg)
                # `pending` counts what the store had not delivered yet; what it delivered
                # and this client has not handed over yet waits in the subscription's queue.
                sub = self._sub
                if sub is not None:
                    pending += sub.pending_msgs
                key = msg.subject[len(self._prefix) :]
                value = None if is_tombstone(msg.headers) else msg.data
                skipped = seq - self.last_seq - 1 if self.synced.is_set() and self.last_seq else 0
                self.on_record(Record(key, seq, value, msg.headers, stamp, pending, max(0, skipped)))
                self.received += 1
                if seq > self.last_seq:
                    self.last_seq = seq
                if pending == 0:
                    self.synced.set()
            except Exception:  # noqa: BLE001 - one bad record must not stop the watch
                log.exception("watch %s: handling %s failed", self.bucket, msg.subject)

        # Shielded: a stop() that cancels a start again (after a reset) while the
        # subscription is being made lets it go once it is made, instead of leaving it
        # delivering to a stopped watch (a review's doubt).
        making = asyncio.ensure_future(self.store.js.subscribe(
            f"{self._prefix}{self.pattern}",
            stream=f"KV_{self.bucket}",
            cb=cb,
            ordered_consumer=True,
            # The server sends a heartbeat when idle; two missed ones make nats-py
            # recreate the consumer. Its default (5 s) left a watch whose consumer died
            # with its NATS node silent for 10 s; 1 s makes that 2 s.
            idle_heartbeat=WATCH_HEARTBEAT_S,
            deliver_policy=self._deliver_policy(),
            config=jsapi.ConsumerConfig(opt_start_seq=self.after_seq + 1) if self.after_seq else None,
            inactive_threshold=300,
            pending_msgs_limit=1_000_000,
            pending_bytes_limit=1024 * 1024 * 1024,
        ))
        try:
            self._sub = await asyncio.shield(making)
        except asyncio.CancelledError:
            making.add_done_callback(_let_go)
            raise
        if self._stopped:
            await self.stop()
            return
        if not self.synced.is_set():
            try:
                ci = await self._sub.consumer_info()
                if ci.num_pending == 0 and self._sub.delivered == 0:
                    self.synced.set()
            except Exception:  # noqa: BLE001
                pass

    @property
    def replayed(self) -> bool:
        """Every record stored before the watch started (each key's latest, unless
        `every_revision`) has been handed to `on_record`, whether or not it has caught
        up with what was stored since (`synced`): records come in stream order, so once
        one at or past the stream's last sequence at the start has come, all before have."""
        return self.synced.is_set() or (self.start_seq > 0 and self.last_seq >= self.start_seq)

    def _deliver_policy(self) -> jsapi.DeliverPolicy:
        if self.after_seq:
            return jsapi.DeliverPolicy.BY_START_SEQUENCE
        return jsapi.DeliverPolicy.ALL if self.every_revision else jsapi.DeliverPolicy.LAST_PER_SUBJECT

    async def caught_up(self, poll_s: float = 0.05) -> None:
        """Return once every record stored before the call has been handed to `on_record`
        (a read barrier: a new leader must not act on a view older than its lease).

        The target is the stream's last sequence now. That record may be gone (expired)
        and never arrive: then the consumer having nothing left to deliver beyond what
        was handed over also counts. Errors (a consumer being recreated, NATS electing a
        stream leader) are waited out; cancel the caller to give up."""
        stream = f"KV_{self.bucket}"
        while True:
            try:
                target = (await self.store.js.stream_info(stream)).state.last_seq
                break
            except Exception as exc:  # noqa: BLE001
                log.debug("watch %s: stream info: %s", self.bucket, exc)
                await asyncio.sleep(0.2)
        checked = 0.0
        loop = asyncio.get_running_loop()
        while self.last_seq < target:
            if self._sub is not None and loop.time() - checked >= 0.5:
                checked = loop.time()
                try:
                    ci = await self._sub.consumer_info()
                    delivered = ci.delivered.stream_seq if ci.delivered is not None else 0
                    if ci.num_pending == 0 and (delivered or 0) <= self.last_seq \
                            and self._sub.pending_msgs == 0:
                        return
                except Exception as exc:  # noqa: BLE001
                    log.debug("watch %s: consumer info: %s", self.bucket, exc)
            await asyncio.sleep(poll_s)

    async def stop(self) -> None:
        self._stopped = True
        if self._monitor is not None:
            self._monitor.cancel()
            await asyncio.gather(self._monitor, return_exceptions=True)
            self._monitor = None
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # noqa: BLE001
                pass
            self._sub = None

