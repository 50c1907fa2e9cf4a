"""The heartbeat ingest's in-process parts (server.health.ingest), without a nats-server:
what waits in the ingest process (one heartbeat per host, every loss, how far the stream
has been sent, skipped records), and the reader thread taking one batch at a time."""

from __future__ import annotations

import asyncio
import time

import pytest

from server.health.ingest import HeartbeatIngest, IngestConfig, Pending
from server.state.cluster import ClusterState
from tests.conftest import eventually
from tests.factories import heartbeat
from wire.messages import encode

# The heartbeats of these tests: a host in rack r1 (two H100s, the factory's shape).
AGENT = {"boot_id": "b1", "labels": {"rack": "r1"}}


def test_pending_keeps_one_heartbeat_per_host_and_every_loss() -> None:
    """What waits in the ingest process is bounded by the number of hosts, and a host
    that expired and came back between two batches is still seen to have been lost."""
    p = Pending()
    p.add("a", 1, b"a1", "s", now=100.0)
    p.add("b", 2, b"b1", "s", now=101.0)
    p.add("a", 3, b"a2", "s", now=102.0)  # replaces a's older heartbeat
    p.add("b", 4, None, None, now=103.0)  # b expired: its older heartbeat is dropped
    p.add("b", 5, b"b2", "s", now=104.0)  # ... and b came back
    for i in range(1000):
        p.add("c", 10 + i, b"c", "s", now=105.0)
    assert len(p) == 4  # a, b, c heartbeats and b's expiry
    first = p.take(2, synced=True)
    assert not first.synced  # records still wait: the server must not think it has them all
    assert first.received_at == 100.0  # the oldest waiting record's time: never fresher
    assert (first.keys, first.revisions, first.values) == (["b", "a"], [4, 3], [None, b"a2"])
    rest = p.take(10, synced=True)
    assert (rest.keys, rest.revisions, rest.synced) == (["b", "c"], [5, 1009], True)
    assert not p and p.take(10, synced=True).keys == []

    # Applied in that order, the server sees b lost, then up again.
    state = ClusterState(heartbeat_interval_s=5)
    kinds: list[str] = []
    state.listeners.append(lambda kind, obj: kinds.append(f"{kind}:{obj.host_id}") if kind.startswith("host") else None)
    hb = {k: encode(heartbeat(k, ts=time.time(), **AGENT)) for k in "abc"}
    state.apply_heartbeat("b", 2, hb["b"], None, 100.0)
    for batch in (first, rest):
        for k, r, v in zip(batch.keys, batch.revisions, batch.values, strict=True):
            state.apply_heartbeat(k, r, v and hb[k], None, batch.received_at)
    assert kinds == ["host_up:b", "host_lost:b", "host_up:a", "host_up:b", "host_up:c"]


def test_pending_says_how_far_the_stream_has_been_sent() -> None:
    """Each record keeps the time the store stored it; every batch says up to when the
    stream has reached the server: just short of the oldest record still waiting (a
    host keeps its place while newer heartbeats replace its older one), or the newest
    read once nothing waits, with what is still unsent."""
    p = Pending()
    p.add("a", 1, b"a1", "s", now=500.0, stamp=100.0, behind=7)
    p.add("c", 2, b"c1", "s", now=500.1, stamp=101.0, behind=6)
    p.add("a", 3, b"a2", "s", now=500.2, stamp=103.0, behind=5)  # a keeps its place, first 100
    p.add("d", 4, b"d1", "s", now=500.3, stamp=104.0, behind=0)
    first = p.take(1, synced=True)
    assert first.keys == ["a"] and first.stamps == [103.0]
    assert first.position == pytest.approx(101.0, abs=1e-5) and first.position < 101.0  # c still waits
    assert first.behind == 2  # c and d unsent here, nothing in the stream
    assert first.received_at == 500.0
    # An expiry replacing a waiting heartbeat carries that heartbeat's older stamp.
    p.add("d", 5, None, None, now=500.4, stamp=120.0, behind=0)
    second = p.take(1, synced=True)
    assert second.keys == ["d"] and second.values == [None] and second.stamps == [120.0]
    assert second.position == pytest.approx(101.0, abs=1e-5)  # c (first 101) still waits
    assert second.received_at == 500.1  # the oldest record still waiting was received then
    p.add("e", 6, None, None, now=500.5, stamp=121.0, behind=3)
    p.add("e", 7, b"e1", "s", now=500.6, stamp=122.0, behind=0)
    rest = p.take(10, synced=True)
    assert rest.keys == ["e", "c", "e"] and rest.stamps == [121.0, 101.0, 122.0]
    assert (rest.position, rest.behind) == (122.0, 0)  # nothing waits: the newest read


async def test_the_server_takes_one_batch_at_a_time_from_the_pipe() -> None:
    """The reader thread hands the event loop a batch only once the last one was applied:
    what waits stays in the pipe (and, behind it, coalesced in the ingest process), not
    queued on the loop, where 50,000 registrations once ran back to back for 25 s."""
    import multiprocessing
    import threading

    from server.health.ingest import HeartbeatBatch

    seen: list[tuple[int, int]] = []  # (batches taken from the pipe, batches applied) at each apply

    def apply(key: str, rev: int, value: bytes | None, shape: str | None, now: float, ttl: float | None) -> None:
        seen.append((ingest.batches_read, len(seen) + 1))

    ingest = HeartbeatIngest(IngestConfig(nats_url="nats://unused"), apply)
    ingest._loop = asyncio.get_running_loop()
    recv, send = multiprocessing.Pipe(duplex=False)
    for i in range(20):
        send.send(HeartbeatBatch(0.0, False, [f"h{i}"], [i + 1], [b"x"], [None], [0.0]))
    reader = threading.Thread(target=ingest._read, args=(recv,), daemon=True)
    reader.start()

    await eventually(lambda: len(seen) == 20, 60, "20 batches applied")
    assert seen == [(k, k) for k in range(1, 21)]  # batch k applied before batch k+1 was read
    send.close()
    await asyncio.to_thread(reader.join, 30)
    assert not reader.is_alive()


def test_pending_reports_skipped_records_until_it_drains() -> None:
    p = Pending()
    p.add("a", 1, b"a", "s", now=1.0, stamp=1.0, skipped=0)
    p.add("b", 9, b"b", "s", now=1.1, stamp=1.5, skipped=7)
    p.add("c", 12, b"c", "s", now=1.2, stamp=1.6, skipped=2)
    assert p.take(1, synced=True).skipped == 9
    assert p.take(10, synced=True).skipped == 9  # said until the child has drained
    p.add("d", 13, b"d", "s", now=1.3, stamp=1.7)
    assert p.take(10, synced=True).skipped == 0


def test_pending_carries_each_heartbeats_ttl_and_every_rollup() -> None:
    """The TTL each heartbeat was stored with reaches the server with it (a key purged
    without an expiry marker is judged by it), and a heartbeat published with
    `Nats-Rollup: all` is told even when a newer heartbeat of its host replaced it."""
    p = Pending()
    p.add("a", 1, b"a1", "s", now=1.0, stamp=1.0, ttl=15.0, rollup=True)
    p.add("a", 2, b"a2", "s", now=1.1, stamp=1.1, ttl=15.0, rollup=True)  # replaces the one that purged
    p.add("b", 3, b"b1", "s", now=1.2, stamp=1.2, ttl=6.0)
    p.add("c", 4, None, None, now=1.3, stamp=1.3)
    batch = p.take(10, synced=True)
    assert batch.keys == ["c", "a", "b"] and batch.ttls == [0.0, 15.0, 6.0]
    assert batch.rollups == [("a", 1.0)]  # one a host, the first
    assert p.take(10, synced=True).rollups is None  # told once

    # The server applies each with its TTL, and is told of the rollup.
    state = ClusterState(heartbeat_interval_s=5)
    told: list[object] = []
    state.listeners.append(lambda kind, obj: told.append(obj) if kind == "host_rollup" else None)
    ingest = HeartbeatIngest(IngestConfig(nats_url="nats://unused"), state.apply_heartbeat, state.clock.advance,
                             on_rollup=state.rolled_up)
    hb = encode(heartbeat("a", ts=time.time(), **AGENT))
    ingest._on_batch(batch._replace(values=[None, hb, hb], keys=["c", "a", "a"], whole=True))
    assert state.hosts["a"].ttl_s == 6.0 and told == [("a", 1.0)]
    assert state.clock.whole
    ingest._on_batch(batch._replace(keys=[], revisions=[], values=[], shapes=[], stamps=[], ttls=[], rollups=None,
                                    position=2.0, whole=False))
    assert not state.clock.whole and state.clock.heard_to() is None  # reading each key's latest
