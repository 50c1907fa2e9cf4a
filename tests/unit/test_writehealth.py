"""Whether history is written (server.history.writehealth): how long it has gone unwritten,
and the alerts that calls for, each once."""

from __future__ import annotations

from server.history.writehealth import WriteHealth
from wire import subjects


def test_history_unwritten_for_long_is_alerted_once_and_its_recovery_too() -> None:
    h = WriteHealth(behind_after_s=60.0)
    assert h.unwritten_s(1000.0) == 0.0 and h.alert(1000.0) is None
    h.failed(1000.0, "connection refused")
    h.failed(1030.0, "server closed the connection")  # still failing: since the first
    assert h.unwritten_s(1030.0) == 30.0 and h.alert(1030.0) is None
    ev = h.alert(1061.0)
    assert ev is not None and ev.kind == subjects.ALERT_HISTORY_BEHIND
    assert ev.data == {"since": 1000.0, "error": "server closed the connection"}
    assert ev.message == "history not written for 61 s: server closed the connection"
    assert h.alert(1200.0) is None  # once
    h.wrote()
    assert h.unwritten_s(1201.0) == 0.0
    ev = h.alert(1201.0)
    assert ev is not None and ev.kind == subjects.ALERT_HISTORY_RECOVERED
    assert h.alert(1202.0) is None
    # A failure that does not last: nothing said.
    h.failed(1300.0, "timeout")
    h.wrote()
    assert h.alert(1400.0) is None
