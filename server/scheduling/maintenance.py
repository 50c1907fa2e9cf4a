"""Maintenance windows: drains scheduled ahead. An operator who will take hosts down at a
set time (a driver or firmware update, a rack's power work) drains them from then on; until
then each such host takes only jobs whose time limit (the job's own, or its queue's default)
ends them by the drain's deadline, when whatever still runs there is stopped. So a window
announced ahead stops nothing placed after it was announced, and the hosts stay busy with
short work until it begins, as Slurm's maintenance reservations do. From the window's start
the host is cordoned (nothing new is placed); at its deadline the drain stops the rest.

Pure: the hosts' windows, a job's time limit and a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from server.scheduling.hostsets import Unions

# A job's time limit counts from its start, which comes a little after its placement (the
# assignment reaching its agent, the process starting): the allowance for that, so that a
# job placed just in time is not stopped by the drain a few seconds before its own limit.
START_ALLOWANCE_S = 10.0


@dataclass(frozen=True)
class Window:
    """A host's scheduled drain: cordoned from `starts`, what still runs stopped at `stops`."""

    starts: float
    stops: float


def started(window: Window | None, now: float) -> bool:
    """Whether the host's drain has begun (nothing new may be placed there)."""
    return window is not None and now >= window.starts


def may_run_before(limit_s: float, now: float, window: Window) -> bool:
    """Whether a job that runs at most `limit_s` (0: no limit) may start on the host now:
    its drain has not begun, and the limit ends the job by the drain's deadline, allowing
    `START_ALLOWANCE_S` for it to start."""
    return now < window.starts and limit_s > 0 and now + START_ALLOWANCE_S + limit_s <= window.stops


def begun(windows: Mapping[str, Window], now: float) -> frozenset[str]:
    """The hosts whose window has begun: no job may take them (the planner's health check
    refuses them; why pending names them with `KeptOff`'s)."""
    return frozenset(h for h, w in windows.items() if started(w, now))


class KeptOff:
    """The hosts with a window not yet begun that a job may not take now, by the job's
    time limit (the same set for every job of one limit, worked out once per limit). A
    window that has begun keeps every job off (`started`, `begun`): left out here, so that
    hosts drained long ago do not weigh on every job's set of hosts to avoid. Limits that
    keep to the same windows share one set (hosts drained together share a window; the
    placer reads the index without a large set held back once per set:
    scheduling.capacity)."""

    def __init__(self, windows: Mapping[str, Window], now: float) -> None:
        self.windows = windows
        self.now = now
        self._by_limit: dict[float, frozenset[str]] = {}
        # Windows not begun -> their hosts, filled in when first asked. The union's lambda
        # holds the dict, not this object (a reference cycle: the server's collector, which
        # freezes what lives, never freed one, found by exploring, one every few cycles).
        ahead: dict[Window, list[str]] = {}
        self._ahead = ahead
        self._ahead_made = False
        self._of = Unions[Window](lambda w: ahead.get(w, ()))

    def __call__(self, limit_s: float) -> frozenset[str]:
        if not self.windows:
            return frozenset()
        got = self._by_limit.get(limit_s)
        if got is None:
            if not self._ahead_made:
                self._ahead_made = True
                for h, w in self.windows.items():
                    if not started(w, self.now):
                        self._ahead.setdefault(w, []).append(h)
            keeping = tuple(w for w in self._ahead if not may_run_before(limit_s, self.now, w))
            got = self._by_limit[limit_s] = self._of(keeping)
        return got
