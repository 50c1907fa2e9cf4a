"""Whether history is being written: since when the writing historian has not got its writes
into the database, and the alerts that calls for. Pure: fed its failures and successes with
a clock; the historian (server.history.historian.watch_writes) publishes what it decides
and reports how long history has gone unwritten (`muster_history_unwritten_seconds`).

Found by exploring: while the database did not take history's writes, nothing but the
historian's log said so (only `muster_historian_restarts_total`, for a historian that died).
"""

from __future__ import annotations

from dataclasses import dataclass

from wire import subjects
from wire.messages import Event

BEHIND_AFTER_S = 60.0  # unwritten this long: alert history.behind


@dataclass
class WriteHealth:
    behind_after_s: float = BEHIND_AFTER_S
    failing_since: float | None = None  # the first failure since the last write that went through
    error: str = ""  # what the database (or NATS) said at the last failure
    alerted: bool = False  # history.behind said, history.recovered not yet

    def failed(self, now: float, error: str) -> None:
        """A flush failed, or writing could not start (or stopped) on an error."""
        if self.failing_since is None:
            self.failing_since = now
        self.error = error

    def wrote(self) -> None:
        """A flush went through: everything queued before it is written."""
        self.failing_since = None
        self.error = ""

    def unwritten_s(self, now: float) -> float:
        """How long history has not been written (0 while it is)."""
        return 0.0 if self.failing_since is None else max(0.0, now - self.failing_since)

    def alert(self, now: float) -> Event | None:
        """The alert to publish now, if any: history.behind once history has gone unwritten
        for `behind_after_s`, history.recovered at the first write after that; each once."""
        if self.failing_since is not None and not self.alerted and self.unwritten_s(now) >= self.behind_after_s:
            self.alerted = True
            return Event(kind=subjects.ALERT_HISTORY_BEHIND, ts=now,
                         message=f"history not written for {self.unwritten_s(now):.0f} s: {self.error}"[:2000],
                         data={"since": self.failing_since, "error": self.error[:500]})
        if self.failing_since is None and self.alerted:
            self.alerted = False
            return Event(kind=subjects.ALERT_HISTORY_RECOVERED, ts=now, message="history is written again")
        return None
