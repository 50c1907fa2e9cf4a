"""The heartbeat ingest process (server.health.ingest) against a real nats-server: it replays
the bucket, feeds new heartbeats and TTL expiries to the parent's ClusterState, is
restarted when killed (kill -9), and stops cleanly."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from server.health.ingest import HeartbeatIngest, IngestConfig, Pending
from server.state.cluster import ClusterState
from server.state.streams import ensure_streams
from tests.conftest import eventually
from wire import subjects
from wire.kv import Store, connect
from wire.messages import SHAPE_HEADER, GpuInfo, GpuUsage, Heartbeat, encode, shape_digest


def heartbeat(host_id: str, seq: int = 1, cpus: int = 16) -> Heartbeat:
    return Heartbeat(host_id=host_id, boot_id="b1", seq=seq, ts=time.time(), labels={"rack": "r1"},
                     gpus=[GpuInfo(index=i, model="H100", memory_mb=80_000) for i in range(2)],
                     gpu_usage=[GpuUsage(index=i) for i in range(2)], cpus=cpus, memory_mb=64_000)


async def send(store: Store, hb: Heartbeat, ttl: str = "60s") -> int:
    """What an agent publishes: the heartbeat, its TTL and its shape digest."""
    ack = await store.js.publish(subjects.kv_subject(subjects.HOSTS_BUCKET, hb.host_id), encode(hb),
                                 headers={"Nats-TTL": ttl, SHAPE_HEADER: shape_digest(hb)}, timeout=10)
    return int(ack.seq)


def running(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's exit may never be reaped here)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_ingest_process_feeds_heartbeats_expiries_and_survives_kill9(nats_url: str) -> None:
    nc = await connect(nats_url, name="test-ingest")
    store = Store(nc)
    await ensure_streams(store)
    before = await send(store, heartbeat("h-old"))  # stored before the ingest starts: replayed
    state = ClusterState(heartbeat_interval_s=5)
    lost: list[str] = []
    state.listeners.append(lambda kind, obj: lost.append(obj.host_id) if kind == "host_lost" else None)
    ingest = HeartbeatIngest(IngestConfig(nats_url=nats_url, flush_s=0.05), state.apply_heartbeat,
                             state.clock.advance)
    stop = asyncio.Event()
    ingest.start()
    supervisor = asyncio.create_task(ingest.run(stop, check_s=0.1))
    try:
        await asyncio.wait_for(ingest.synced.wait(), timeout=60)
        assert state.hosts["h-old"].revision == before and state.hosts["h-old"].present
        assert state.index.caps["h-old"].cpus == 16
        # Stamped with the time the store stored it, and the read clock stands there
        # (nothing else was in the stream, so it is caught up).
        stored = (await store.js.get_msg(f"KV_{subjects.HOSTS_BUCKET}", seq=before)).time
        assert stored is not None
        assert state.hosts["h-old"].seen_at == pytest.approx(stored.timestamp(), abs=1e-3)
        await eventually(lambda: state.clock.position is not None, 60, "the read clock")
        assert state.clock.position == pytest.approx(stored.timestamp(), abs=1e-3)
        assert state.clock.caught_up and state.clock.behind == 0

        # A new host; a heartbeat of the same shape (liveness only) and one of a new shape.
        rev = await send(store, heartbeat("h-new"))
        await eventually(lambda: "h-new" in state.hosts, 60, "the new host")
        seen = state.hosts["h-new"].seen_at
        rev2 = await send(store, heartbeat("h-new", seq=2))
        await eventually(lambda: state.hosts["h-new"].revision == rev2, 60, "the second heartbeat")
        assert rev2 > rev and state.hosts["h-new"].seen_at >= seen
        assert state.hosts["h-new"].latest().seq == 2  # kept raw, decoded when read
        rev3 = await send(store, heartbeat("h-new", seq=3, cpus=32))
        await eventually(lambda: state.hosts["h-new"].revision == rev3, 60, "the reshaped heartbeat")
        assert state.index.caps["h-new"].cpus == 32  # a new shape re-indexes the host

        # The TTL expiry marker reaches the parent: the host is LOST.
        await send(store, heartbeat("h-short"), ttl="1s")
        await eventually(lambda: "h-short" in state.hosts, 60, "the short-lived host")
        await eventually(lambda: not state.hosts["h-short"].present, 60, "the expiry of h-short")
        assert lost == ["h-short"] and state.hosts["h-short"].lost_at is not None
        assert not state.index.caps["h-short"].schedulable
        received = ingest.received

        # kill -9 the ingest process: it is restarted, replays, and keeps feeding.
        assert ingest.proc is not None and ingest.proc.pid is not None
        os.kill(ingest.proc.pid, signal.SIGKILL)
        await eventually(lambda: ingest.restarts == 1, 60, "a restart")
        rev4 = await send(store, heartbeat("h-new", seq=4, cpus=32))
        await eventually(lambda: state.hosts["h-new"].revision == rev4, 60, "a heartbeat after the restart")
        assert ingest.received > received and ingest.alive
        assert state.hosts["h-old"].present and state.hosts["h-new"].present
        assert not state.hosts["h-short"].present  # the replay does not bring it back
    finally:
        stop.set()
        await asyncio.wait_for(supervisor, timeout=10)
        proc = ingest.proc
        await asyncio.to_thread(ingest.stop)
        await nc.close()
    # A clean stop: the child exited on SIGTERM (not killed), the reader thread ended.
    assert proc is not None and proc.exitcode == 0
    assert ingest.proc is None and ingest._reader is None
    assert ingest.restarts == 1


async def test_ingest_process_stops_when_its_server_is_killed(nats_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """kill -9 of the process that started it: the ingest process does not outlive it."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    script = tmp_path / "parent.py"
    script.write_text(
        "import asyncio, sys\n"
        "from server.health.ingest import HeartbeatIngest, IngestConfig, Pending\n"
        "async def main():\n"
        f"    i = HeartbeatIngest(IngestConfig(nats_url={nats_url!r}), lambda *a: None)\n"
        "    i.start()\n"
        "    print(i.proc.pid, flush=True)\n"
        "    await asyncio.sleep(3600)\n"
        "asyncio.run(main())\n")
    parent = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert running(child)
        parent.kill()
        parent.wait(10)
        await eventually(lambda: not running(child), 60, "the ingest process to exit after its server")
    finally:
        if parent.poll() is None:
            parent.kill()


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
    hb = {k: encode(heartbeat(k)) for k in "abc"}
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

    def apply(key: str, rev: int, value: bytes | None, shape: str | None, now: float) -> None:
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
