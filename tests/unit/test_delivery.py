"""scheduling.delivery: which hosts get their assignment record again, from a cluster
view fed through real records (tests/unit/test_planner.py's World) and a fake clock."""

from __future__ import annotations

from server.scheduling.delivery import undelivered
from tests.unit.test_planner import NOW, World, report
from wire.messages import AttemptState


def healthy(_host: str) -> bool:
    return True


def test_a_task_not_started_after_the_wait_has_its_hosts_record_sent_again_once_per_wait() -> None:
    w = World(interval_s=3600.0)
    w.host("h1")
    w.host("h2")
    w.submit("j1", gpus=8)
    w.submit("j2", gpus=8)
    w.cycle(now=NOW)
    hosts = {w.job(j).current.host_id for j in ("j1", "j2")}
    assert hosts == {"h1", "h2"}
    rev = {h: w.state.revisions[f"alloc.{h}"] for h in hosts}
    assert undelivered(w.state, NOW + 9.9, 10.0, healthy, {}) == {}
    assert undelivered(w.state, NOW + 10.0, 10.0, healthy, {}) == rev
    # j1's host reports it running: only j2's host is left.
    h2 = w.job("j2").current.host_id
    w.cycle(reports=[report(w, "j1", AttemptState.RUNNING, ts=NOW + 11)], now=NOW + 11)
    assert w.state.placed_ids == {"j2"}
    assert undelivered(w.state, NOW + 12, 10.0, healthy, {}) == {h2: rev[h2]}
    # Sent again at NOW + 12: not before NOW + 22, unless the record changed.
    sent = {h2: (rev[h2], NOW + 12)}
    assert undelivered(w.state, NOW + 21, 10.0, healthy, sent) == {}
    assert undelivered(w.state, NOW + 22, 10.0, healthy, sent) == {h2: rev[h2]}
    assert undelivered(w.state, NOW + 21, 10.0, healthy, {h2: (rev[h2] - 1, NOW + 12)}) == {h2: rev[h2]}
    # A host that is not healthy gets nothing (its work is the eviction's business).
    assert undelivered(w.state, NOW + 30, 10.0, lambda h: h != h2, {}) == {}
    # Once running, nothing is sent.
    w.cycle(reports=[report(w, "j2", AttemptState.RUNNING, ts=NOW + 31)], now=NOW + 31)
    assert w.state.placed_ids == set()
    assert undelivered(w.state, NOW + 100, 10.0, healthy, {}) == {}
