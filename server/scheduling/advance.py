"""Advance reservations: hosts set aside for some queues' jobs over a time window, as
Slurm's advance reservations (`scontrol create reservation`): a team's launch run on
Friday, a demo, a benchmark that needs whole racks. A reservation names queues and
users: a job of one of the queues, or of one of the users in any queue, is its job
(`admits`). From the window's start to its end only its jobs are placed on the hosts, and
there first; before it, other jobs take them only if their time limit ends them by the
start (so the hosts stay busy with short work until then, and nothing placed after the
reservation was made must be stopped); other work still there at the start (placed
before the reservation was made) is stopped and requeued, not counted as a try. Its jobs
may run anywhere else too, and count against their queues' quotas as any job does.

Pure: the reservations, a job's queue and time limit, and a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from server.scheduling.hostsets import Unions
from server.scheduling.maintenance import START_ALLOWANCE_S
from wire.messages import AdvanceReservation


def admits(r: AdvanceReservation, queue: str, user: str) -> bool:
    """Whether a job of `queue` and `user` is the reservation's."""
    return queue in r.queues or user in r.users


def whom(r: AdvanceReservation) -> str:
    """Whose the reservation is, in words: "queue a, b and user x"."""
    parts = [f"queue{'s' if len(r.queues) > 1 else ''} {', '.join(r.queues)}" if r.queues else "",
             f"user{'s' if len(r.users) > 1 else ''} {', '.join(r.users)}" if r.users else ""]
    return " and ".join(p for p in parts if p)


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
    """The hosts set aside that a job of a queue and user, with a time limit, may not take
    now: those of every reservation not over that does not admit it, open or not yet open
    and its limit running into it. Worked out once per queue, user and limit a cycle, and
    one set for all that keep to the same reservations (the placer reads the index without
    a large set held back once per set: scheduling.capacity)."""

    def __init__(self, reservations: Mapping[str, AdvanceReservation], now: float) -> None:
        self.now = now
        self.live = [r for r in reservations.values() if not over(r, now)]
        self._by: dict[tuple[str, str, float], frozenset[str]] = {}
        hosts = {r.name: r.hosts for r in self.live}
        self._of = Unions[str](hosts.__getitem__)  # reservations' names -> their hosts
        self._own: dict[tuple[str, str], frozenset[str]] = {}
        # Users any reservation names: the others' jobs are looked up by queue alone.
        self._users = frozenset(u for r in self.live for u in r.users)

    def __bool__(self) -> bool:
        return bool(self.live)

    def __call__(self, queue: str, user: str, limit_s: float) -> frozenset[str]:
        if not self.live:
            return frozenset()
        user = user if user in self._users else ""
        got = self._by.get((queue, user, limit_s))
        if got is None:
            keeping = tuple(r.name for r in self.live if not admits(r, queue, user)
                            and (active(r, self.now) or not may_run_before(limit_s, self.now, r)))
            got = self._by[(queue, user, limit_s)] = self._of(keeping)
        return got

    def own(self, queue: str, user: str) -> frozenset[str]:
        """The hosts of the open reservations that admit a job of `queue` and `user`: where
        it is placed first (it may take any other host when those have no room)."""
        user = user if user in self._users else ""
        got = self._own.get((queue, user))
        if got is None:
            got = self._own[(queue, user)] = frozenset(h for r in self.live if admits(r, queue, user)
                                                       and active(r, self.now) for h in r.hosts)
        return got

    def keeping(self, host_id: str, queue: str, user: str, limit_s: float) -> list[AdvanceReservation]:
        """The reservations that keep a job of `queue` and `user` with that limit off `host_id`."""
        return [r for r in self.live if host_id in r.hosts and not admits(r, queue, user)
                and (active(r, self.now) or not may_run_before(limit_s, self.now, r))]


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
