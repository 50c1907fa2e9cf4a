"""The JetStream streams and KV buckets Muster needs, created (or updated) by the control
plane: `ensure_streams(store)` at server start-up, by `muster nats --cluster`, and by the
benchmark.

A NATS cluster that has just started may not answer JetStream requests yet: its meta
leader is still being elected (requests time out or are refused as unavailable), and a
new replicated stream has no leader for a moment after it was created. `ensure_streams`
waits that out, retrying within a deadline, and returns once every stream has a leader.
A request refused for its content (a bad configuration) is not retried.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from nats.js import api as jsapi
from nats.js import errors as jserrors

from wire import subjects
from wire.errors import StoreError
from wire.kv import Store
from wire.retrying import within

log = logging.getLogger(__name__)

STREAM_IN_USE = 10058  # the stream exists with another configuration: update it
# "no suitable peers for placement, peer offline": a cluster that has just formed may not
# have seen every peer yet (seen in CI). Retried within the deadline like a timeout; a
# cluster too small for the replicas asked answers the same, and fails at the deadline.
NO_PEERS_YET = 10005
READY_DEADLINE_S = 60.0
_RETRY_S = 0.25


def kv_stream(bucket: str, replicas: int, storage: jsapi.StorageType = jsapi.StorageType.FILE,
              **extra: object) -> jsapi.StreamConfig:
    """A KV bucket's stream: last value per key, per-message TTL, expiry markers."""
    return jsapi.StreamConfig(
        name=f"KV_{bucket}",
        subjects=[f"$KV.{bucket}.>"],
        retention=jsapi.RetentionPolicy.LIMITS,
        max_msgs_per_subject=1,
        discard=jsapi.DiscardPolicy.NEW,
        storage=storage,
        num_replicas=replicas,
        allow_rollup_hdrs=True,
        deny_delete=True,
        allow_direct=True,
        allow_msg_ttl=True,
        subject_delete_marker_ttl=60,
        **extra,  # type: ignore[arg-type]
    )


# Caps of the input streams (work queues). Full, a stream refuses new messages (the
# publisher gets an error and keeps its message) rather than dropping old ones that were
# acknowledged to their senders: nothing acknowledged is ever discarded.
INPUT_CAPS = {
    subjects.STATUS_STREAM: (1_000_000, 1024**3),  # messages, bytes
    subjects.CMDS_STREAM: (100_000, 256 * 1024**2),
    subjects.SUBMIT_STREAM: (100_000, 2 * 1024**3),
}
# Messages one subject of SUBMIT may hold (`muster.submit.<user>`, or `.<user>.<queue>`):
# past it, that subject's publishes are refused ("maximum messages per subject exceeded",
# wire.errors.SubmissionsWaiting), and the other submitters' still pass (found by
# exploring: one user's runaway script filled the stream, and every other submitter was
# refused). A tenth of the stream: 5,000,000 jobs in submit_over_nats' messages of 500,
# far more than the leader takes in minutes.
SUBMIT_PER_SUBJECT = 10_000
PER_SUBJECT_CAPS = {subjects.SUBMIT_STREAM: SUBMIT_PER_SUBJECT}


def log_stream(name: str, subject_list: list[str], replicas: int, *, work_queue: bool, max_age_days: int,
               **extra: object) -> jsapi.StreamConfig:
    """A stream of messages: a work queue (consumed once, capped, refusing new messages
    when full) or a retained log (old messages age out)."""
    if work_queue and name in INPUT_CAPS:
        extra = {"max_msgs": INPUT_CAPS[name][0], "max_bytes": INPUT_CAPS[name][1],
                 "discard": jsapi.DiscardPolicy.NEW, **extra}
    if work_queue and name in PER_SUBJECT_CAPS:
        extra = {"max_msgs_per_subject": PER_SUBJECT_CAPS[name], "discard_new_per_subject": True, **extra}
    return jsapi.StreamConfig(
        name=name,
        subjects=subject_list,
        retention=jsapi.RetentionPolicy.WORK_QUEUE if work_queue else jsapi.RetentionPolicy.LIMITS,
        storage=jsapi.StorageType.FILE,
        num_replicas=replicas,
        max_age=max_age_days * 24 * 3600,
        **extra,  # type: ignore[arg-type]
    )


def hosts_storage(replicas: int) -> jsapi.StorageType:
    """Heartbeats are ephemeral: replicated, the `hosts` bucket is kept in memory on each
    node (it survives the loss of a node; a restart of every node loses it, and the
    leader's grace for unheard hosts keeps work in place until agents are heard again),
    sparing the fsync of every heartbeat that the state bucket needs
    (docs/benchmarks.md, "What a heartbeat costs NATS"). A single node keeps it on file."""
    return jsapi.StorageType.MEMORY if replicas > 1 else jsapi.StorageType.FILE


def stream_configs(replicas: int) -> list[jsapi.StreamConfig]:
    """Every stream and bucket, in the order they are created."""
    gib = 1024 * 1024 * 1024
    return [
        kv_stream(
            subjects.STATE_BUCKET, replicas, allow_atomic=True, duplicate_window=120,
            republish=jsapi.RePublish(src=f"$KV.{subjects.STATE_BUCKET}.alloc.>",
                                      dest=f"{subjects.ASSIGN_PREFIX}.>"),
        ),
        kv_stream(subjects.HOSTS_BUCKET, replicas, hosts_storage(replicas), duplicate_window=5),
        log_stream(subjects.STATUS_STREAM, [f"{subjects.STATUS_PREFIX}.>"], replicas, work_queue=True,
                   max_age_days=7, duplicate_window=120),
        log_stream(subjects.CMDS_STREAM, [f"{subjects.CMDS_PREFIX}.>"], replicas, work_queue=True,
                   max_age_days=7, duplicate_window=120),
        log_stream(subjects.SUBMIT_STREAM, [f"{subjects.SUBMIT_PREFIX}.>"], replicas, work_queue=True,
                   max_age_days=7, duplicate_window=120),
        # Host and domain events, and operators' changes to jobs and queues (few), which the
        # history keeps (a job's other events are derived from its record: history.timeline).
        log_stream(subjects.EVENTS_STREAM,
                   [f"{subjects.EVENTS_PREFIX}.host.>", f"{subjects.EVENTS_PREFIX}.domain.>",
                    f"{subjects.EVENTS_PREFIX}.job.updated", f"{subjects.EVENTS_PREFIX}.queue.>"], replicas,
                   work_queue=False, max_age_days=7, max_bytes=gib),
        log_stream(subjects.ALERTS_STREAM, [f"{subjects.ALERTS_PREFIX}.>"], replicas, work_queue=False,
                   max_age_days=30, max_bytes=gib),
    ]


async def ensure_streams(store: Store, deadline_s: float = READY_DEADLINE_S) -> None:
    """Create (or update) every stream and bucket Muster needs, waiting for a cluster that
    is still forming. Idempotent. Raises StoreError when JetStream refuses a
    configuration, or is not ready within `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    for cfg in stream_configs(store.replicas):
        await _ensure_stream(store, cfg, deadline)
    for cfg in stream_configs(store.replicas):
        await _wait_leader(store, cfg.name or "", deadline)


class _NotReady(Exception):
    """A refusal that means the cluster is not ready yet (retried)."""


async def _ensure_stream(store: Store, cfg: jsapi.StreamConfig, deadline: float) -> None:
    tries = 0

    async def once() -> None:
        nonlocal tries
        tries += 1
        try:
            await store.js.add_stream(cfg)
        except jserrors.BadRequestError as exc:
            if exc.err_code == NO_PEERS_YET:
                raise _NotReady(str(exc)) from exc
            if exc.err_code != STREAM_IN_USE:
                raise StoreError(f"cannot create stream {cfg.name}: {exc}") from exc
            try:
                await store.js.update_stream(await _keeping(store, cfg))
            except jserrors.BadRequestError as refused:  # a configuration it cannot change
                raise StoreError(f"cannot update stream {cfg.name}: {refused}") from refused

    def again(exc: Exception) -> bool:
        """Timeouts, no responders, 503, no peers yet: not ready yet. A refusal is final."""
        if isinstance(exc, StoreError):
            return False
        if tries == 1 or tries % 20 == 0:
            log.info("JetStream not ready for stream %s yet (%s: %s); retrying", cfg.name, type(exc).__name__, exc)
        return True

    try:
        await within(once, max(0.0, deadline - time.monotonic()), _RETRY_S, again)
    except StoreError:
        raise
    except Exception as exc:  # noqa: BLE001 - not ready by the deadline
        raise StoreError(f"cannot create stream {cfg.name}: {exc} (JetStream not ready "
                         f"after {tries} tries)") from exc


async def _keeping(store: Store, cfg: jsapi.StreamConfig) -> jsapi.StreamConfig:
    """`cfg` with what a server must not change of the stream as it exists:

    - its storage: JetStream cannot change it in place. A `hosts` bucket made on file by
      an earlier version stays on file (and costs its fsyncs) until it is deleted with
      the servers stopped (docs/deployment.md); the servers then make it anew.
    - more replicas than this server was started with (found by exploring: a replica
      started without `MUSTER_REPLICAS=3` beside one with it cut every stream to one
      copy, and acknowledged jobs were one node's loss from being lost). A server raises
      the replicas, never lowers them; lowering is an operator's act on the stream."""
    info = await store.js.stream_info(cfg.name or "")
    have_replicas = info.config.num_replicas or 1
    if have_replicas > (cfg.num_replicas or 1):
        log.warning("stream %s keeps its %d replicas: this server was started with %d (MUSTER_REPLICAS); a "
                    "server never lowers them (to lower them, edit the stream with the nats CLI)",
                    cfg.name, have_replicas, cfg.num_replicas or 1)
        cfg = dataclasses.replace(cfg, num_replicas=have_replicas)
    if info.config.storage is None or cfg.storage is None:
        return cfg
    have, want = jsapi.StorageType(info.config.storage), jsapi.StorageType(cfg.storage)  # nats-py gives a str
    if have == want:
        return cfg
    log.warning("stream %s is kept on %s storage (this version makes it on %s): to move it, stop the "
                "servers, delete the stream and start them again", cfg.name, have.value, want.value)
    return dataclasses.replace(cfg, storage=have)


async def _wait_leader(store: Store, name: str, deadline: float) -> None:
    """Wait until a replicated stream has a leader (a single server's always has)."""
    if store.replicas <= 1:
        return
    last: object = None
    while time.monotonic() < deadline:
        try:
            info = await store.js.stream_info(name)
            if info.cluster is not None and info.cluster.leader:
                return
            last = "no leader yet"
        except Exception as exc:  # noqa: BLE001
            last = exc
        await asyncio.sleep(_RETRY_S)
    raise StoreError(f"stream {name} has no leader after the deadline ({last})")
