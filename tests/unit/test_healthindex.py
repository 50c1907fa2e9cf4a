"""HealthIndex: host health kept from heartbeats and expiries, checked against a pass over
every host (what the monitor used to compute each second), with a fake clock."""

from __future__ import annotations

import random

import pytest

from server.health.index import HealthIndex
from server.health.rules import Health, host_health
from server.state.cluster import ClusterState
from tests.factories import T0, heartbeat_record, host_alloc, task
from wire.messages import SHAPE_HEADER, encode
from wire.records import Record

INTERVAL = 5.0


def beat(rec: Record) -> tuple[bytes | None, str | None]:
    """A heartbeat record's bytes and shape, as the ingest process hands them over."""
    return rec.value, (rec.headers or {}).get(SHAPE_HEADER)


def full_scan(s: ClusterState, now: float) -> dict[str, Health]:
    return {h: host_health(present=e.present, last_seen=e.seen_at, now=now, interval_s=INTERVAL)
            for h, e in s.hosts.items() if e.heartbeat is not None}


class Model:
    """A ClusterState fed by heartbeats and expiries, plus what a watcher of its health
    changes has been told."""

    def __init__(self) -> None:
        self.s = ClusterState(heartbeat_interval_s=INTERVAL)
        self.rev = 0
        self.told: dict[str, Health] = {}

    def heartbeat(self, host: str, now: float, gpus: int = 2) -> None:
        self.rev += 1
        value, shape = beat(heartbeat_record(host, self.rev, boot_id="b", seq=self.rev, gpus=gpus))
        self.s.apply_heartbeat(host, self.rev, value, shape, now)

    def expire(self, host: str, now: float) -> None:
        self.rev += 1
        self.s.apply_heartbeat(host, self.rev, None, None, now)

    def refresh(self, now: float) -> list[tuple[str, Health | None, Health]]:
        idx = self.s.refresh_health(now)
        changes = idx.take_changes()
        for host, old, new in changes:
            assert self.told.get(host) == old, f"{host}: told {self.told.get(host)}, change says from {old}"
            assert old is not new
            self.told[host] = new
        return changes

    def check(self, now: float) -> None:
        truth = full_scan(self.s, now)
        assert self.s.health_index.health == truth
        assert self.told == truth
        for h in Health:
            assert self.s.health_index.count(h) == sum(1 for v in truth.values() if v is h)


def test_transitions_of_one_host() -> None:
    m = Model()
    m.heartbeat("h1", T0)
    assert m.refresh(T0) == [("h1", None, Health.HEALTHY)]
    m.heartbeat("h1", T0 + 5)
    assert m.refresh(T0 + 10) == []
    assert m.refresh(T0 + 15) == []  # exactly two intervals after the last heartbeat
    assert m.refresh(T0 + 15.5) == [("h1", Health.HEALTHY, Health.SUSPECT)]
    assert m.refresh(T0 + 16) == []  # said once
    m.heartbeat("h1", T0 + 16)
    assert m.refresh(T0 + 16) == [("h1", Health.SUSPECT, Health.HEALTHY)]
    m.expire("h1", T0 + 31)
    assert m.refresh(T0 + 31) == [("h1", Health.HEALTHY, Health.LOST)]
    assert m.refresh(T0 + 100) == []  # a lost host stays lost, and is not re-examined
    m.heartbeat("h1", T0 + 101)
    assert m.refresh(T0 + 101) == [("h1", Health.LOST, Health.HEALTHY)]
    m.check(T0 + 101)


def test_a_host_known_only_by_its_expiry_has_no_health() -> None:
    m = Model()
    m.expire("ghost", T0)
    assert m.refresh(T0) == []
    assert m.s.health_index.health == {}


def test_only_touched_and_due_hosts_are_examined() -> None:
    """The point of the index: a refresh with nothing new looks at no host."""
    m = Model()
    for i in range(1000):
        m.heartbeat(f"h{i}", T0 + i / 1000)
    m.refresh(T0 + 1)

    examined: list[str] = []

    class Spy(dict):  # type: ignore[type-arg]
        def get(self, key, default=None):  # type: ignore[no-untyped-def]
            examined.append(key)
            return super().get(key, default)

    hosts = Spy(m.s.hosts)
    m.s.health_index.refresh(hosts, T0 + 2, INTERVAL)
    assert examined == []
    m.heartbeat("h7", T0 + 3)  # a healthy host's heartbeat changes nothing to look at
    m.s.health_index.refresh(hosts, T0 + 3, INTERVAL)
    assert examined == []
    m.expire("h8", T0 + 4)
    m.s.health_index.refresh(hosts, T0 + 4, INTERVAL)
    assert examined == ["h8"]


def test_memory_stays_bounded_without_refreshes() -> None:
    """Nothing refreshes a ClusterState that no monitor watches: each host is filed once."""
    m = Model()
    for t in range(2000):
        m.heartbeat(f"h{t % 50}", T0 + t * 0.37)
    idx = m.s.health_index
    filed = [h for bucket in idx._filed.values() for h in bucket]
    assert sorted(filed) == sorted(f"h{i}" for i in range(50))


@pytest.mark.parametrize("seed", range(8))
def test_agrees_with_a_full_scan(seed: int) -> None:
    """Random heartbeats (some arriving with earlier times than the last, as batches
    stamped with their oldest record can), expiries, reshapes and refreshes at random
    moments: after every refresh the index equals a pass over every host, the changes it
    reported lead from what a watcher was told to exactly that, and the GPU counts equal
    a recount."""
    rnd = random.Random(seed)
    m = Model()
    hosts = [f"h{i:03d}" for i in range(60)]
    now = T0
    for _ in range(3000):
        now += rnd.expovariate(20.0)
        host = rnd.choice(hosts)
        r = rnd.random()
        if r < 0.80:
            m.heartbeat(host, now - rnd.random() * 0.5, gpus=rnd.choice((2, 2, 2, 8)))
        elif r < 0.85:
            m.expire(host, now)
        elif r < 0.90:
            m.rev += 1
            tasks = [task(f"j{k}", attempt_id=f"j{k}-1", command=["x"], gpu_indices=list(range(rnd.randint(0, 2))))
                     for k in range(rnd.randint(0, 3))]
            m.s.apply_state_record(Record(f"alloc.{host}", m.rev, encode(host_alloc(host, tasks))))
        elif r < 0.92:
            m.rev += 1
            m.s.apply_state_record(Record(f"alloc.{host}", m.rev, None))
        else:
            m.refresh(now)
            m.check(now)
            present = sum(len(e.latest().gpus)  # type: ignore[union-attr]
                          for e in m.s.hosts.values() if e.present and e.heartbeat is not None)
            assert m.s.gpus_present == present
            held = [{i for t in a.tasks for i in t.gpu_indices} for h, a in m.s.allocs.items()
                    if h in m.s.hosts and m.s.hosts[h].present]  # a lost host's count for nothing
            assert m.s.gpus_allocated == sum(len(gpus) for gpus in held)
    # Then silence: every live host goes SUSPECT (or LOST, expired since the last refresh).
    later = now + 3 * INTERVAL
    changes = m.refresh(later)
    m.check(later)
    assert any(new is Health.SUSPECT for _, _, new in changes)
    assert all(new is not Health.HEALTHY for _, _, new in changes)
    assert all(v is not Health.HEALTHY for v in m.told.values())


def test_interval_is_read_from_the_state() -> None:
    s = ClusterState(heartbeat_interval_s=1.0)
    value, shape = beat(heartbeat_record("h1", 1, boot_id="b"))
    s.apply_heartbeat("h1", 1, value, shape, T0)
    s.refresh_health(T0).take_changes()
    assert s.refresh_health(T0 + 2.5).take_changes() == [("h1", Health.HEALTHY, Health.SUSPECT)]
    assert isinstance(s.health_index, HealthIndex)
