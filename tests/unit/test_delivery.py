"""scheduling.delivery: which hosts get their assignment record again, from a cluster
view fed through real records (tests/unit/test_planner.py's World) and a fake clock."""

from __future__ import annotations

from server.scheduling.delivery import MAX_DOUBLINGS, Deliveries, Sent, next_sent, undelivered
from tests.unit.test_planner import NOW, World, report
from wire.messages import AttemptState


def healthy(_host: str) -> bool:
    return True


def due(w: World, now: float, sent: dict[str, Sent] | None = None) -> dict[str, int]:
    return undelivered(w.state, now, 10.0, healthy, sent or {}).due


def test_a_task_not_started_after_the_wait_has_its_hosts_record_sent_again() -> None:
    w = World(interval_s=3600.0)
    w.host("h1")
    w.host("h2")
    w.submit("j1", gpus=8)
    w.submit("j2", gpus=8)
    w.cycle(now=NOW)
    hosts = {w.job(j).current.host_id for j in ("j1", "j2")}
    assert hosts == {"h1", "h2"}
    rev = {h: w.state.revisions[f"alloc.{h}"] for h in hosts}
    assert due(w, NOW + 9.9) == {}
    assert due(w, NOW + 10.0) == rev
    assert undelivered(w.state, NOW + 10.0, 10.0, healthy, {}).waiting == rev
    # j1's host reports it running: only j2's host is left.
    h2 = w.job("j2").current.host_id
    w.cycle(reports=[report(w, "j1", AttemptState.RUNNING, ts=NOW + 11)], now=NOW + 11)
    assert w.state.placed_ids == {"j2"}
    assert due(w, NOW + 12) == {h2: rev[h2]}
    # Sent again at NOW + 12: not before NOW + 12 + 20 (the wait doubles).
    sent = {h2: Sent(rev[h2], NOW + 12, 1)}
    assert due(w, NOW + 31.9, sent) == {}
    assert due(w, NOW + 32, sent) == {h2: rev[h2]}
    # A host that is not healthy gets nothing (its work is the eviction's business).
    assert undelivered(w.state, NOW + 30, 10.0, lambda h: h != h2, {}) == Deliveries()
    # Once running, nothing is sent, and the host is forgotten.
    w.cycle(reports=[report(w, "j2", AttemptState.RUNNING, ts=NOW + 31)], now=NOW + 31)
    assert w.state.placed_ids == set()
    found = undelivered(w.state, NOW + 100, 10.0, healthy, sent)
    assert found == Deliveries() and next_sent(sent, found, {}, NOW + 100) == {}


def test_the_wait_runs_from_the_records_last_delivery_and_doubles_with_each_resend() -> None:
    """A slow agent (a saturated machine) whose host keeps getting work is not sent its
    record again while the stream republishes it anyway, and one sent it again is sent it
    at growing intervals, up to 2**MAX_DOUBLINGS waits apart."""
    w = World(interval_s=3600.0)
    w.host("h1")
    w.submit("j1", gpus=1)
    w.cycle(now=NOW)
    w.submit("j2", gpus=1)
    w.cycle(now=NOW + 8)  # placed on h1 too: its record written again, and republished
    assert {w.job(j).current.host_id for j in ("j1", "j2")} == {"h1"}
    rev = w.state.revisions["alloc.h1"]
    assert due(w, NOW + 10) == {} and due(w, NOW + 17.9) == {}
    sent: dict[str, Sent] = {}
    times = []
    now = NOW + 18.0
    while now < NOW + 1000:
        found = undelivered(w.state, now, 10.0, healthy, sent)
        assert found.waiting == {"h1": rev}
        if found.due:
            assert found.due == {"h1": rev}
            times.append(now - NOW)
        sent = next_sent(sent, found, found.due, now)
        now += 1.0
    assert times[:6] == [18, 38, 78, 158, 238, 318]
    assert all(b - a == 10 * 2 ** MAX_DOUBLINGS for a, b in zip(times[3:], times[4:], strict=False))
    assert sent["h1"].resends == len(times)


def test_a_change_of_the_record_counts_as_its_delivery_and_keeps_the_resends() -> None:
    w = World(interval_s=3600.0)
    w.host("h1")
    w.submit("j1", gpus=1)
    w.submit("j2", gpus=1)
    w.cycle(now=NOW)
    rev = w.state.revisions["alloc.h1"]
    found = undelivered(w.state, NOW + 10, 10.0, healthy, {})
    sent = next_sent({}, found, found.due, NOW + 10)
    assert sent == {"h1": Sent(rev, NOW + 10, 1)}
    # j2 runs and ends: the record changes (the stream republishes it) while j1 still waits.
    w.cycle(reports=[report(w, "j2", AttemptState.RUNNING, ts=NOW + 11)], now=NOW + 11)
    w.cycle(reports=[report(w, "j2", AttemptState.SUCCEEDED, ts=NOW + 12, exit_code=0)], now=NOW + 12)
    new = w.state.revisions["alloc.h1"]
    assert new != rev and w.state.placed_ids == {"j1"}
    found = undelivered(w.state, NOW + 13, 10.0, healthy, sent)
    assert found.due == {}
    # However late the check that first sees the change, it is not taken for no delivery.
    assert due(w, NOW + 40, sent) == {}
    sent = next_sent(sent, found, found.due, NOW + 13)
    assert sent == {"h1": Sent(new, NOW + 13, 1)}
    assert due(w, NOW + 32.9, sent) == {} and due(w, NOW + 33, sent) == {"h1": new}


def test_the_wait_counts_only_as_far_as_the_status_reports_are_read() -> None:
    """A leader that has read the status reports only up to some time cannot tell a task
    that started after it from one its agent never got: the wait runs up to there."""
    w = World(interval_s=3600.0)
    w.host("h1")
    w.submit("j1", gpus=1)
    w.cycle(now=NOW)
    rev = w.state.revisions["alloc.h1"]
    assert undelivered(w.state, NOW + 30, 10.0, healthy, {}, reports_read_to=NOW + 9.9) == Deliveries()
    found = undelivered(w.state, NOW + 30, 10.0, healthy, {}, reports_read_to=NOW + 10)
    assert found.due == {"h1": rev} == found.waiting
    # Nothing known read yet (a new leader's first seconds): nothing is due.
    assert undelivered(w.state, NOW + 30, 10.0, healthy, {}, reports_read_to=0.0) == Deliveries()
    # Read past the clock (another clock): no further than now.
    assert undelivered(w.state, NOW + 9, 10.0, healthy, {}, reports_read_to=NOW + 60) == Deliveries()
    sent = next_sent({}, found, found.due, NOW + 30)
    assert undelivered(w.state, NOW + 50, 10.0, healthy, sent, reports_read_to=NOW + 49).due == {}
    assert undelivered(w.state, NOW + 50, 10.0, healthy, sent, reports_read_to=NOW + 50).due == {"h1": rev}
