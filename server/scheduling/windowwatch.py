"""Alerts when a time window of the cluster begins or ends: an advance reservation opens
(its hosts now take only its queues' jobs) or ends (deleted, or past its end), and a
maintenance window begins (hosts drained together from one time). Pure: the windows and
a clock in, alert events out (the scheduler publishes them on `alerts.>`).

Each is alerted once by the leader that sees it happen. A leader that takes over finds
the windows already open on its first check: it alerts those that began within
`recent_s` (the previous leader may have been gone when they did) and takes the others
as known.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from server.scheduling import advance
from server.scheduling.maintenance import Window
from server.timefmt import iso_utc
from wire.messages import AdvanceReservation, Event
from wire.subjects import ALERT_MAINTENANCE_BEGAN, ALERT_RESERVATION_ENDED, ALERT_RESERVATION_OPENED

# A window is known by its kind, its name (a reservation's; "" for maintenance) and times
# (a reservation's start only: one whose end is moved stays the same window).
Key = tuple[str, str, float, float]


@dataclass
class WindowWatch:
    recent_s: float = 60.0
    _open: dict[Key, str] = field(default_factory=dict)  # key -> what it is, in words (for the ending)
    _started: bool = False  # checked once already

    def check(self, now: float, reservations: Mapping[str, AdvanceReservation],
              windows: Mapping[str, Window]) -> list[Event]:
        """The windows as they stand at `now`; an alert for each that began or ended since
        the last check."""
        current: dict[Key, tuple[str, Event]] = {}
        for r in reservations.values():
            if advance.active(r, now):
                key = ("advres", r.name, r.starts, 0.0)
                what = f"advance reservation {r.name}"
                current[key] = (what, Event(
                    kind=ALERT_RESERVATION_OPENED, ts=now,
                    message=f"{what} opened: {len(r.hosts)} host(s) set aside for {advance.whom(r)} until "
                            f"{iso_utc(r.ends)}; others' work there is stopped and requeued",
                    data={"name": r.name, "hosts": len(r.hosts), "queues": list(r.queues), "users": list(r.users),
                          "starts": r.starts, "ends": r.ends}))
        drained: dict[Window, list[str]] = {}
        for host_id, w in windows.items():
            # Begun, its deadline passed or not (found by exploring: one of deadline 0, or
            # one that began and passed its deadline between two checks, was never alerted);
            # known for as long as its hosts drain.
            if w.starts <= now:
                drained.setdefault(w, []).append(host_id)
        for w, hosts in drained.items():
            key = ("maintenance", "", w.starts, w.stops)
            hosts.sort()
            more = f" and {len(hosts) - 5} more" if len(hosts) > 5 else ""
            current[key] = (f"maintenance window from {iso_utc(w.starts)}", Event(
                kind=ALERT_MAINTENANCE_BEGAN, ts=now,
                message=f"maintenance window began: {len(hosts)} host(s) draining ({', '.join(hosts[:5])}{more}); "
                        f"what still runs there is stopped at {iso_utc(w.stops)}",
                data={"hosts": len(hosts), "first_hosts": hosts[:5], "starts": w.starts, "stops": w.stops}))
        out: list[Event] = []
        for key, (what, ev) in current.items():
            if key in self._open:
                continue
            self._open[key] = what
            if self._started or now - key[2] <= self.recent_s:
                out.append(ev)
        for key in [k for k in self._open if k not in current]:
            what = self._open.pop(key)
            if key[0] == "advres":
                left = reservations.get(key[1])
                # Which: found by exploring (it said "past its end or deleted" either way).
                why = "deleted" if left is None else "past its end" if now >= left.ends else "its start changed"
                out.append(Event(kind=ALERT_RESERVATION_ENDED, ts=now,
                                 message=f"{what} ended ({why}): its hosts take anyone's jobs",
                                 data={"name": key[1], "starts": key[2], "why": why}))
        self._started = True
        return out
