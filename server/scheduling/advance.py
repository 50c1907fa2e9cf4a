"""Advance reservations: hosts set aside for some queues' jobs over a time window, as
Slurm's advance reservations (`scontrol create reservation`): a team's launch run on
Friday, a demo, a benchmark that needs whole racks. From the window's start to its end
only the named queues' jobs are placed on the hosts; before it, other jobs take them only
if their time limit ends them by the start (so the hosts stay busy with short work until
then, and nothing placed after the reservation was made must be stopped); work of other
queues still there at the start (placed before the reservation was made) is stopped and
requeued, not counted as a try. The named queues' jobs may run anywhere else too, and
count against their queues' quotas as any job does.

Pure: the reservations, a job's queue and time limit, and a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from server.scheduling.maintenance import START_ALLOWANCE_S
from wire.messages import AdvanceReservation


def active(r: AdvanceReservation, now: float) -> bool:
    """Whether the reservation's window is open (only its queues' jobs placed there)."""
    return r.starts <= now < r.ends


def over(r: AdvanceReservation, now: float) -> bool:
    return now >= r.ends


def may_run_before(limit_s: float, now: float, r: AdvanceReservation) -> bool:
    """Whether a job of another queue that runs at most `limit_s` (0: no limit) may start
    on the reservation's hosts now: the window has not begun, and the limit ends the job
    by its start, allowing `START_ALLOWANCE_S` for it to start."""
    return now < r.starts and limit_s > 0 and now + START_ALLOWANCE_S + limit_s <= r.starts


class SetAside:
    """The hosts set aside that a job of a queue, with a time limit, may not take now:
    those of every reservation not over that does not name its queue, open or not yet
    open and its limit running into it. Worked out once per queue and limit a cycle, and
    one set for all that keep to the same reservations (the placer reads the index without
    a large set held back once per set: scheduling.capacity)."""

    def __init__(self, reservations: Mapping[str, AdvanceReservation], now: float) -> None:
        self.now = now
        self.live = [r for r in reservations.values() if not over(r, now)]
        self._by: dict[tuple[str, float], frozenset[str]] = {}
        self._of: dict[tuple[str, ...], frozenset[str]] = {}
        self._own: dict[str, frozenset[str]] = {}

    def __bool__(self) -> bool:
        return bool(self.live)

    def __call__(self, queue: str, limit_s: float) -> frozenset[str]:
        if not self.live:
            return frozenset()
        got = self._by.get((queue, limit_s))
        if got is None:
            keeping = tuple(r.name for r in self.live if queue not in r.queues
                            and (active(r, self.now) or not may_run_before(limit_s, self.now, r)))
            got = self._of.get(keeping)
            if got is None:
                got = self._of[keeping] = frozenset(h for r in self.live if r.name in keeping for h in r.hosts)
            self._by[(queue, limit_s)] = got
        return got

    def own(self, queue: str) -> frozenset[str]:
        """The hosts of the open reservations that name `queue`: where its jobs are placed
        first (they may take any other host when those have no room)."""
        got = self._own.get(queue)
        if got is None:
            got = self._own[queue] = frozenset(h for r in self.live if queue in r.queues and active(r, self.now)
                                               for h in r.hosts)
        return got

    def keeping(self, host_id: str, queue: str, limit_s: float) -> list[AdvanceReservation]:
        """The reservations that keep a job of `queue` with that limit off `host_id`."""
        return [r for r in self.live if host_id in r.hosts and queue not in r.queues
                and (active(r, self.now) or not may_run_before(limit_s, self.now, r))]


def open_on(reservations: Iterable[AdvanceReservation], now: float) -> dict[str, AdvanceReservation]:
    """Host -> the reservation open on it now: where other queues' work is stopped."""
    return {h: r for r in reservations if active(r, now) for h in r.hosts}


def on_host(reservations: Iterable[AdvanceReservation], host_id: str, now: float) -> list[AdvanceReservation]:
    """The reservations not over that set `host_id` aside, soonest first."""
    return sorted((r for r in reservations if not over(r, now) and host_id in r.hosts), key=lambda r: r.starts)


def clash(new: AdvanceReservation, existing: Iterable[AdvanceReservation], now: float) -> AdvanceReservation | None:
    """A reservation not over, other than `new`'s own name, that shares a host with it
    over an overlapping window (a host is set aside for one reservation at a time)."""
    hosts = set(new.hosts)
    for r in existing:
        if r.name != new.name and not over(r, now) and r.starts < new.ends and new.starts < r.ends \
                and not hosts.isdisjoint(r.hosts):
            return r
    return None
