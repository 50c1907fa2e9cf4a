"""The heartbeat ingest process (server.health.ingest) against a real nats-server: it replays
the bucket, feeds new heartbeats and TTL expiries to the parent's ClusterState, is
restarted when killed (kill -9), and stops cleanly."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from server.health.ingest import HeartbeatIngest, IngestConfig
from server.state.cluster import ClusterState
from server.state.streams import ensure_streams
from tests.conftest import eventually
from tests.factories import heartbeat
from wire import subjects
from wire.kv import Store, connect
from wire.messages import SHAPE_HEADER, Heartbeat, encode, shape_digest

# What the agents of these tests send: a host in rack r1 (two H100s, the factory's shape).
AGENT = {"boot_id": "b1", "labels": {"rack": "r1"}}


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
    before = await send(store, heartbeat("h-old", ts=time.time(), **AGENT))  # stored before the ingest starts: replayed
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
        # Stamped with the time the store stored it, and the read clock stands there with
        # nothing behind it (caught up only if it was applied within FRESH_S of being
        # stored, which a loaded machine's process start may exceed: see below).
        stored = (await store.js.get_msg(f"KV_{subjects.HOSTS_BUCKET}", seq=before)).time
        assert stored is not None
        assert state.hosts["h-old"].seen_at == pytest.approx(stored.timestamp(), abs=1e-3)
        await eventually(lambda: state.clock.position is not None, 60, "the read clock")
        assert state.clock.position == pytest.approx(stored.timestamp(), abs=1e-3)
        assert state.clock.behind == 0
        # Fresh heartbeats applied at the stream's end: the clock is caught up.
        deadline = time.monotonic() + 60
        while not state.clock.caught_up:
            assert time.monotonic() < deadline, "the read clock never caught up"
            await send(store, heartbeat("h-old", ts=time.time(), **AGENT))
            await asyncio.sleep(0.5)

        # A new host; a heartbeat of the same shape (liveness only) and one of a new shape.
        rev = await send(store, heartbeat("h-new", ts=time.time(), **AGENT))
        await eventually(lambda: "h-new" in state.hosts, 60, "the new host")
        seen = state.hosts["h-new"].seen_at
        rev2 = await send(store, heartbeat("h-new", seq=2, ts=time.time(), **AGENT))
        await eventually(lambda: state.hosts["h-new"].revision == rev2, 60, "the second heartbeat")
        assert rev2 > rev and state.hosts["h-new"].seen_at >= seen
        assert state.hosts["h-new"].latest().seq == 2  # kept raw, decoded when read
        rev3 = await send(store, heartbeat("h-new", seq=3, cpus=32, ts=time.time(), **AGENT))
        await eventually(lambda: state.hosts["h-new"].revision == rev3, 60, "the reshaped heartbeat")
        assert state.index.caps["h-new"].cpus == 32  # a new shape re-indexes the host

        # The TTL expiry marker reaches the parent: the host is LOST.
        await send(store, heartbeat("h-short", ts=time.time(), **AGENT), ttl="1s")
        await eventually(lambda: "h-short" in state.hosts, 60, "the short-lived host")
        await eventually(lambda: not state.hosts["h-short"].present, 60, "the expiry of h-short")
        assert lost == ["h-short"] and state.hosts["h-short"].lost_at is not None
        assert not state.index.caps["h-short"].schedulable
        received = ingest.received

        # kill -9 the ingest process: it is restarted, replays, and keeps feeding.
        assert ingest.proc is not None and ingest.proc.pid is not None
        os.kill(ingest.proc.pid, signal.SIGKILL)
        await eventually(lambda: ingest.restarts == 1, 60, "a restart")
        rev4 = await send(store, heartbeat("h-new", seq=4, cpus=32, ts=time.time(), **AGENT))
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


async def test_a_follower_reads_the_bucket_now_and_then_and_on_once_it_leads(nats_url: str) -> None:
    """A follower's ingest with `every_s` (MUSTER_FOLLOWER_HEARTBEATS_EVERY): each reading
    hands over every host's last heartbeat and stops, saying it reads no further (the read
    clock then stands at it); heartbeats stored between readings arrive only with the next
    one. Once the server leads (`go_live`), it reads them as they are stored."""
    nc = await connect(nats_url, name="test-ingest-follower")
    store = Store(nc)
    await ensure_streams(store)
    await send(store, heartbeat("h-a", ts=time.time(), **AGENT))
    state = ClusterState(heartbeat_interval_s=5)
    positions: list[bool] = []

    def advance(position: float, behind: int, local_now: float, skipped: int, live: bool = True,
                whole: bool = True) -> None:
        positions.append(live)
        state.clock.advance(position, behind, local_now, skipped, live, whole)

    ingest = HeartbeatIngest(IngestConfig(nats_url=nats_url, flush_s=0.05, every_s=3600), state.apply_heartbeat,
                             advance)
    stop = asyncio.Event()
    ingest.start()
    supervisor = asyncio.create_task(ingest.run(stop, check_s=0.1))
    try:
        await asyncio.wait_for(ingest.synced.wait(), timeout=60)
        rev_a = state.hosts["h-a"].revision
        assert positions and positions[-1] is False and not state.clock.caught_up  # a reading, not live
        # A host that joins while hosts are joining is read a second later (JOINING_EVERY_S) ...
        await send(store, heartbeat("h-b", ts=time.time(), **AGENT))
        await eventually(lambda: "h-b" in state.hosts, 60, "the joining host")
        # ... but once a reading found no new host, the next is an hour away: a new
        # heartbeat of a known host is not read.
        # (Readings of 1, 2 and 2 records: h-a; h-a and the new h-b; no new host.)
        await eventually(lambda: ingest.received >= 5, 60, "a reading with no new host")
        received = ingest.received
        rev_new = await send(store, heartbeat("h-a", seq=2, ts=time.time(), **AGENT))
        await asyncio.sleep(2.5)
        assert state.hosts["h-a"].revision < rev_new and ingest.received == received
        # The server leads: every host's last heartbeat at once, then each as it is stored.
        ingest.go_live()
        await eventually(lambda: state.hosts["h-a"].revision == rev_new, 60, "the heartbeat stored between readings")
        rev_live = await send(store, heartbeat("h-b", seq=2, ts=time.time(), **AGENT))
        await eventually(lambda: state.hosts["h-b"].revision == rev_live, 60, "a heartbeat read as it is stored")
        assert positions[-1] is True
        await eventually(lambda: state.clock.caught_up, 60, "the clock running on")
        assert state.hosts["h-a"].revision > rev_a
        # kill -9 the live ingest: the child started again reads live too (every batch it
        # sends says so), not every hour.
        assert ingest.proc is not None and ingest.proc.pid is not None
        os.kill(ingest.proc.pid, signal.SIGKILL)
        await eventually(lambda: ingest.restarts == 1, 60, "a restart")
        since = len(positions)
        rev_after = await send(store, heartbeat("h-b", seq=3, ts=time.time(), **AGENT))
        await eventually(lambda: state.hosts["h-b"].revision == rev_after, 60, "a heartbeat read after the restart")
        assert len(positions) > since and all(positions[since:])
    finally:
        stop.set()
        await asyncio.wait_for(supervisor, timeout=10)
        await asyncio.to_thread(ingest.stop)
        await nc.close()


@pytest.mark.parametrize(("every_s", "kill"), [(0.0, False), (0.5, False), (0.0, True)])
async def test_a_bucket_that_numbers_its_records_afresh_is_read_again(nats_url: str, every_s: float,
                                                                      kill: bool) -> None:
    """Every NATS node restarted with the replicated `hosts` bucket in memory: it comes back
    empty, its records numbered from 1 again. The ingest (reading live, or a follower's
    readings now and then) sees the stream below what it read, the server forgets the
    revisions it read, and the heartbeats stored from then on are applied (found by
    exploring: each was taken for an older record and dropped; every host stayed SUSPECT
    and nothing was scheduled). Shown here by deleting and creating the stream again; with
    `kill`, the ingest process is killed meanwhile, and the one started after it (which never
    read the stream before) has the server forget all the same (found by a review)."""
    nc = await connect(nats_url, name="test-ingest-renumbered")
    store = Store(nc)
    await ensure_streams(store)
    state = ClusterState(heartbeat_interval_s=5)
    for i in range(20):
        await send(store, heartbeat("h-r", seq=i, ts=time.time(), **AGENT))
    ingest = HeartbeatIngest(IngestConfig(nats_url=nats_url, flush_s=0.05, every_s=every_s), state.apply_heartbeat,
                             state.clock.advance, state.hosts_renumbered)
    stop = asyncio.Event()
    ingest.start()
    supervisor = asyncio.create_task(ingest.run(stop, check_s=0.1))
    try:
        await asyncio.wait_for(ingest.synced.wait(), timeout=60)
        await eventually(lambda: "h-r" in state.hosts and state.hosts["h-r"].revision == 20, 60, "the first reading")
        await store.js.delete_stream(f"KV_{subjects.HOSTS_BUCKET}")
        if kill:
            assert ingest.proc is not None and ingest.proc.pid is not None
            os.kill(ingest.proc.pid, signal.SIGKILL)
            await eventually(lambda: ingest.restarts == 1, 60, "a restart")
        await ensure_streams(store)
        rev = await send(store, heartbeat("h-r", seq=100, cpus=48, ts=time.time(), **AGENT))
        assert rev == 1
        await eventually(lambda: state.hosts["h-r"].revision == rev, 60, "the heartbeat of the renumbered bucket")
        assert state.hosts["h-r"].latest().seq == 100 and state.index.caps["h-r"].cpus == 48
        rev = await send(store, heartbeat("h-r", seq=101, cpus=48, ts=time.time(), **AGENT))
        await eventually(lambda: state.hosts["h-r"].revision == rev, 60, "the next one")
    finally:
        stop.set()
        await asyncio.wait_for(supervisor, timeout=10)
        await asyncio.to_thread(ingest.stop)
        await nc.close()


async def test_an_ingest_that_cannot_read_the_bucket_yet_waits_for_it(nats_url: str) -> None:
    """The hosts bucket's stream is not there (NATS restoring it after a restart): the
    ingest process says so and reads again a second later, rather than end with a
    traceback and be started again (found by exploring)."""
    nc = await connect(nats_url, name="test-ingest-waits")
    store = Store(nc)
    await ensure_streams(store)
    await store.js.delete_stream(f"KV_{subjects.HOSTS_BUCKET}")
    state = ClusterState(heartbeat_interval_s=5)
    ingest = HeartbeatIngest(IngestConfig(nats_url=nats_url, flush_s=0.05), state.apply_heartbeat,
                             state.clock.advance, state.hosts_renumbered)
    stop = asyncio.Event()
    ingest.start()
    supervisor = asyncio.create_task(ingest.run(stop, check_s=0.1))
    try:
        await asyncio.sleep(3)  # several tries to read
        await ensure_streams(store)
        rev = await send(store, heartbeat("h-w", ts=time.time(), **AGENT))
        await eventually(lambda: "h-w" in state.hosts and state.hosts["h-w"].revision == rev, 60, "the heartbeat")
        assert ingest.restarts == 0
    finally:
        stop.set()
        await asyncio.wait_for(supervisor, timeout=10)
        await asyncio.to_thread(ingest.stop)
        await nc.close()
