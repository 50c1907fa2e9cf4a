"""Alerts when a time window begins or ends (scheduling.windowwatch): an advance
reservation opened and ended, a maintenance window begun; each once; a leader that takes
over alerts only those that began lately."""

from __future__ import annotations

from server.scheduling.maintenance import Window
from server.scheduling.windowwatch import WindowWatch
from tests.unit.test_gangs import NOW
from wire.messages import AdvanceReservation
from wire.subjects import ALERT_MAINTENANCE_BEGAN, ALERT_RESERVATION_ENDED, ALERT_RESERVATION_OPENED

R = AdvanceReservation(name="launch", hosts=["a", "b"], queues=["launch"], starts=NOW + 10, ends=NOW + 100)


def test_a_reservation_is_alerted_when_it_opens_and_when_it_ends_once_each() -> None:
    w = WindowWatch()
    assert w.check(NOW, {"launch": R}, {}) == []  # not open yet
    opened = w.check(NOW + 10.5, {"launch": R}, {})
    assert [e.kind for e in opened] == [ALERT_RESERVATION_OPENED]
    assert opened[0].message.startswith("advance reservation launch opened: 2 host(s) set aside for queue launch until")
    assert opened[0].data["hosts"] == 2 and opened[0].data["queues"] == ["launch"]
    assert w.check(NOW + 11, {"launch": R}, {}) == []  # once
    longer = R.model_copy(update={"ends": NOW + 200})
    assert w.check(NOW + 12, {"launch": longer}, {}) == []  # its end moved: the same window
    ended = w.check(NOW + 100, {"launch": R}, {})
    assert [e.kind for e in ended] == [ALERT_RESERVATION_ENDED] and ended[0].data["name"] == "launch"
    assert ended[0].data["why"] == "past its end" and "(past its end)" in ended[0].message
    assert w.check(NOW + 101, {"launch": R}, {}) == []
    # Deleted while open: ended too, saying so.
    w.check(NOW + 20, {"launch": R}, {})
    deleted = w.check(NOW + 21, {}, {})
    assert [e.kind for e in deleted] == [ALERT_RESERVATION_ENDED] and deleted[0].data["why"] == "deleted"


def test_a_maintenance_window_is_alerted_once_when_it_begins_for_all_its_hosts() -> None:
    w = WindowWatch()
    window = Window(NOW + 5, NOW + 50)
    hosts = {f"h{i}": window for i in range(7)} | {"other": Window(NOW + 500, NOW + 600)}
    assert w.check(NOW, {}, hosts) == []
    began = w.check(NOW + 6, {}, hosts)
    assert [e.kind for e in began] == [ALERT_MAINTENANCE_BEGAN] and began[0].data["hosts"] == 7
    assert "7 host(s) draining (h0, h1, h2, h3, h4 and 2 more)" in began[0].message
    assert w.check(NOW + 7, {}, hosts) == [] and w.check(NOW + 60, {}, hosts) == []  # no alert at its end



def test_a_maintenance_window_that_began_and_reached_its_deadline_between_two_checks_is_alerted() -> None:
    """Found by exploring: a window scheduled with deadline 0 (`drain --at T --deadline 0`)
    never raised maintenance.began, nor did one whose start and deadline both fell between
    two checks (at most once a second, and only when a cycle runs)."""
    w = WindowWatch()
    hosts = {"a": Window(NOW + 600, NOW + 600), "b": Window(NOW + 600, NOW + 601)}
    assert w.check(NOW, {}, hosts) == []
    began = w.check(NOW + 602, {}, hosts)
    assert sorted(e.data["hosts"] for e in began) == [1, 1] and {e.kind for e in began} == {ALERT_MAINTENANCE_BEGAN}
    assert w.check(NOW + 603, {}, hosts) == []  # once


def test_a_leader_that_takes_over_alerts_only_what_began_lately() -> None:
    old = R.model_copy(update={"name": "old", "starts": NOW - 600})
    late = R.model_copy(update={"name": "late", "starts": NOW - 30})
    w = WindowWatch(recent_s=60)
    first = w.check(NOW, {"old": old, "late": late}, {"h": Window(NOW - 500, NOW + 50)})
    assert [e.data["name"] for e in first] == ["late"]
    # Known from then on: it ends as any other.
    assert [e.data["name"] for e in w.check(NOW + 100, {}, {})] == ["old", "late"]
