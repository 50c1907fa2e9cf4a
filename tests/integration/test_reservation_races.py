"""Advance reservations and queue deletions made at the same moment, on two replicas and
within one, against a real NATS: a host is set aside by one reservation at a time, and a
queue a reservation names is not deleted under it, whichever request is stored first
(server.operations.base: Operations.ordered_commit)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import nats as nats_py
from server.replica import Muster, ServerConfig
from tests.conftest import eventually
from tests.factories import heartbeat
from wire import subjects
from wire.errors import ValidationError
from wire.messages import AdvanceReservation, encode

HOSTS = [f"race-{i}" for i in range(6)]


@pytest.fixture
async def replicas(nats_url: str, tmp_path: Path) -> AsyncIterator[tuple[Muster, Muster]]:
    """Two replicas of one cluster, each with its own view, both seeing HOSTS."""
    started: list[Muster] = []
    try:
        for name in ("race-a", "race-b"):
            mu = Muster(ServerConfig(nats_url=nats_url, data_dir=tmp_path / name, name=name,
                                     heartbeat_interval_s=1.0, production=False))
            await mu.start()
            started.append(mu)
        nc = await nats_py.connect(nats_url)
        try:
            for h in HOSTS:
                await nc.publish(subjects.kv_subject(subjects.HOSTS_BUCKET, h),
                                 encode(heartbeat(h, ts=time.time())), headers={"Nats-TTL": "300s"})
            await nc.flush()
        finally:
            await nc.close()
        for mu in started:
            await eventually(lambda mu=mu: all(h in mu.state.hosts for h in HOSTS), what="the hosts seen")
        yield started[0], started[1]
    finally:
        for mu in started:
            await mu.shutdown()


def _input(name: str, hosts: list[str], queue: str = "default") -> dict[str, object]:
    return {"name": name, "hosts": hosts, "queues": [queue], "ends": time.time() + 3600}


async def _same_view(a: Muster, b: Muster) -> None:
    """Both replicas have read every reservation and queue stored."""
    for m in (a, b):
        await asyncio.wait_for(m._watches[0].caught_up(), 10)


async def test_of_reservations_made_at_once_for_one_host_one_is_stored(
        replicas: tuple[Muster, Muster]) -> None:
    a, b = replicas
    # Eight at once for one host, half on each replica: one is made, the others overlap it.
    got = await asyncio.gather(*(m.create_advance_reservation(_input(f"one-{i}", [HOSTS[0]]), "admin")
                                 for i, m in enumerate([a, b] * 4)), return_exceptions=True)
    made = [r for r in got if isinstance(r, AdvanceReservation)]
    refused = [e for e in got if isinstance(e, ValidationError)]
    assert len(made) == 1 and len(refused) == 7, got
    assert {e.code for e in refused} == {"OVERLAPS"}, refused
    assert all(f"set aside by advance reservation {made[0].name}" in e.message for e in refused), refused
    await _same_view(a, b)
    for m in (a, b):
        assert sorted(m.state.advance) == [made[0].name]

    # Five at once for five other hosts (and one more of the name taken): each is made,
    # none refused for another's sake.
    got = await asyncio.gather(*(m.create_advance_reservation(_input(f"each-{i}", [h]), "admin")
                                 for i, (m, h) in enumerate(zip([a, b] * 3, HOSTS[1:], strict=False))),
                               a.create_advance_reservation(_input(made[0].name, [HOSTS[5]]), "admin"),
                               return_exceptions=True)
    assert all(isinstance(r, AdvanceReservation) for r in got[:-1]), got
    taken = got[-1]
    assert isinstance(taken, ValidationError) and taken.code in ("EXISTS", "OVERLAPS"), taken
    await _same_view(a, b)
    for m in (a, b):
        assert sorted(h for r in m.state.advance.values() for h in r.hosts) == sorted(HOSTS), m.state.advance

    # Two moved at once onto the one host set free (a change is checked as a creation is):
    # one moves.
    await a.delete_advance_reservation("each-4", "admin")
    await _same_view(a, b)
    got = await asyncio.gather(a.update_advance_reservation("each-0", {"hosts": [HOSTS[5]]}, "admin"),
                               b.update_advance_reservation("each-1", {"hosts": [HOSTS[5]]}, "admin"),
                               return_exceptions=True)
    assert sum(isinstance(r, AdvanceReservation) for r in got) == 1, got
    assert [e.code for e in got if isinstance(e, ValidationError)] == ["OVERLAPS"], got


async def test_a_queue_deleted_as_a_reservation_names_it_is_one_or_the_other(
        replicas: tuple[Muster, Muster]) -> None:
    a, b = replicas
    for i in range(6):
        queue = f"team-{i}"
        await a.create_queue({"name": queue}, "admin")
        await eventually(lambda queue=queue: queue in b.state.queues, what="the queue seen")
        # The deletion on one replica, the reservation naming the queue on the other (and
        # the other way round), at once.
        deleter, maker = (a, b) if i % 2 else (b, a)
        got = await asyncio.gather(deleter.delete_queue(queue, "admin"),
                                   maker.create_advance_reservation(_input(f"for-{i}", [HOSTS[i]], queue), "admin"),
                                   return_exceptions=True)
        deleted, made = got
        await _same_view(a, b)
        if isinstance(made, AdvanceReservation):
            # Made: the queue stays, its deletion refused for the reservation.
            assert isinstance(deleted, ValidationError) and deleted.code == "QUEUE_IN_USE", got
            assert f"named by advance reservation for-{i}" in deleted.message, deleted
            assert queue in a.state.queues and queue in b.state.queues
            await a.delete_advance_reservation(made.name, "admin")
        else:
            # Deleted: the reservation refused, as one naming a queue that does not exist.
            assert deleted is None, got
            assert isinstance(made, ValidationError) and made.code == "NOT_FOUND", got
            assert f"no queue named {queue!r}" in made.message, made
            assert queue not in a.state.queues and queue not in b.state.queues
            assert f"for-{i}" not in a.state.advance and f"for-{i}" not in b.state.advance
