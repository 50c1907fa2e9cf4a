"""ReadClock and health judged on what has been read (server.health.readclock), fake clock."""

from __future__ import annotations

from server.health.readclock import ReadClock
from server.health.rules import Health
from server.state.cluster import ClusterState
from tests.factories import T0, heartbeat_record

# The hosts of these tests: one small GPU each.
HOST = {"boot_id": "b", "gpus": 1, "gpu_memory_mb": 1, "cpus": 8, "memory_mb": 1000}


def test_local_time_until_anything_is_read() -> None:
    c = ReadClock()
    assert c.now(T0) == T0


def test_caught_up_runs_on_from_the_position_and_behind_stands_still() -> None:
    c = ReadClock()
    # The store's clock is 100 s ahead of ours: only differences count.
    c.advance(T0 + 100, behind=0, local_now=T0)
    assert c.now(T0 + 3) == T0 + 103
    c.advance(T0 + 104, behind=5000, local_now=T0 + 5)
    assert c.now(T0 + 5) == c.now(T0 + 60) == T0 + 104  # behind: what was read is all it knows
    c.advance(T0 + 90, behind=0, local_now=T0 + 61)  # an older position never moves it back
    assert c.position == T0 + 104 and c.caught_up


def test_a_reader_that_is_behind_does_not_make_hosts_suspect() -> None:
    """Hosts are judged on the time up to which heartbeats were read: a reader 30 s behind
    the stream does not call a host SUSPECT for silence it has not seen; a host silent in
    what was read is SUSPECT however far behind the reader is."""
    s = ClusterState(heartbeat_interval_s=5.0)
    rev = 0
    for t in (0.0, 5.0, 10.0):  # live-a beats every 5 s, quiet-b stops after its first
        for host in ("live-a", "quiet-b") if t == 0.0 else ("live-a",):
            rev += 1
            s.apply_host_record(heartbeat_record(host, rev, seq=rev, **HOST, stamp=T0 + t, behind=40_000),
                                now=T0 + 40 + t)
    # 50 s of wall clock later, the reader has read only up to T0 + 10.
    assert s.clock.position == T0 + 10 and not s.clock.caught_up
    assert s.health("live-a", now=T0 + 50) is Health.HEALTHY
    assert s.health("quiet-b", now=T0 + 50) is Health.HEALTHY  # silent 10 s in what was read: not yet
    changes = s.refresh_health(T0 + 50).take_changes()
    assert sorted(changes) == [("live-a", None, Health.HEALTHY), ("quiet-b", None, Health.HEALTHY)]
    assert s.capacities(now=T0 + 50)["live-a"].schedulable
    # The reader catches up: a record stored at T0 + 49.5, applied at T0 + 50 with
    # nothing after it; quiet-b has been silent for 49.5 s of what was read.
    rev += 1
    s.apply_host_record(heartbeat_record("live-a", rev, seq=rev, **HOST, stamp=T0 + 49.5, behind=0), now=T0 + 50)
    assert s.clock.caught_up
    assert s.health("quiet-b", now=T0 + 50) is Health.SUSPECT
    assert s.refresh_health(T0 + 50).take_changes() == [("quiet-b", Health.HEALTHY, Health.SUSPECT)]
    # Caught up, the clock runs on: live-a silent for two intervals, then more.
    assert s.health_time(T0 + 60) == T0 + 59.5
    assert s.health("live-a", now=T0 + 60) is Health.HEALTHY  # exactly two intervals
    assert s.health("live-a", now=T0 + 61) is Health.SUSPECT


def test_a_late_record_saying_nothing_is_pending_does_not_make_the_clock_run_on() -> None:
    """The store counts as pending only what it has not delivered: a record that sat in a
    backed-up connection arrives saying "nothing after me". Applied long after it was
    stored, it does not count as caught up (at 50,000 hosts, taking it at its word let
    the clock run on while the server was 20 s behind, and live hosts went SUSPECT)."""
    c = ReadClock()
    c.advance(T0, behind=0, local_now=T0 + 10)
    assert not c.caught_up and c.now(T0 + 30) == T0
    c.advance(T0 + 29, behind=0, local_now=T0 + 30)  # fresh again
    assert c.caught_up and c.now(T0 + 31) == T0 + 30


def test_records_without_a_stamp_keep_the_local_clock() -> None:
    s = ClusterState(heartbeat_interval_s=5.0)
    s.apply_host_record(heartbeat_record("h", 1, seq=1, **HOST), now=T0)
    assert s.clock.position is None and s.hosts["h"].seen_at == T0
    assert s.health("h", now=T0 + 11) is Health.SUSPECT


def test_the_clock_holds_while_superseded_heartbeats_are_skipped() -> None:
    """A reader more than an interval behind finds heartbeats already replaced by newer
    ones (the bucket keeps one per host) and never sees them: their hosts are alive but
    look silent. While batches report skipped records the clock holds where it stood."""
    c = ReadClock()
    c.advance(T0 + 10, behind=100, local_now=T0 + 11)
    c.advance(T0 + 20, behind=100, local_now=T0 + 21, skipped=5000)
    assert c.held_at == T0 + 10 and c.now(T0 + 60) == T0 + 10
    c.advance(T0 + 30, behind=100, local_now=T0 + 31, skipped=10)
    assert c.now(T0 + 60) == T0 + 10  # still holding where it started
    c.advance(T0 + 33, behind=0, local_now=T0 + 33.5)  # nothing skipped, but not an interval yet
    assert c.now(T0 + 60) == T0 + 10
    c.advance(T0 + 40, behind=0, local_now=T0 + 40.5)  # an interval (5 s) of stream without a skip
    assert c.held_at is None and c.now(T0 + 41) == T0 + 40.5


def test_a_host_whose_heartbeats_were_skipped_is_not_called_suspect() -> None:
    s = ClusterState(heartbeat_interval_s=5.0)
    s.apply_host_record(heartbeat_record("a", 1, seq=1, **HOST, stamp=T0, behind=10), now=T0 + 1)
    # b's record arrives after 3,000 skipped ones (a's newer heartbeats among them).
    s.apply_host_record(heartbeat_record("b", 3002, seq=2, **HOST, stamp=T0 + 14, behind=10, skipped=3000),
                        now=T0 + 15)
    assert s.health("a", now=T0 + 15) is Health.HEALTHY


def test_a_reading_that_stops_leaves_the_clock_where_it_read_to() -> None:
    """A follower that reads the bucket now and then (MUSTER_FOLLOWER_HEARTBEATS_EVERY): its
    last batch of a reading says it reads no further (`live` False), so the clock stands at
    the reading however far the local clock runs, and hosts heard then are not made
    SUSPECT by the time between readings. Live again, it runs on."""
    c = ReadClock()
    c.advance(T0 + 100, behind=0, local_now=T0 + 100, live=False)
    assert not c.caught_up and c.now(T0 + 100) == c.now(T0 + 130) == T0 + 100
    c.advance(T0 + 131, behind=0, local_now=T0 + 131)
    assert c.caught_up and c.now(T0 + 134) == T0 + 134

    state = ClusterState(heartbeat_interval_s=5)
    state.apply_host_record(heartbeat_record("h", 1, **HOST, stamp=T0 + 99), now=T0 + 100)
    state.clock.advance(T0 + 100, behind=0, local_now=T0 + 100, live=False)
    assert state.health("h", T0 + 140) is Health.HEALTHY  # 40 s on, nothing newer was read
    state.clock.advance(T0 + 100, behind=0, local_now=T0 + 100)  # the same reading, live
    assert state.health("h", T0 + 140) is Health.SUSPECT
