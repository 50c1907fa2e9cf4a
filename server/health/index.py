"""HealthIndex: every host's health, kept current without a pass over every host.

Building a map of every host's health once a second and diffing it with the last one
costs a fifth of a server's busy time at 50,000 hosts. A host's health can only change when something happens to it
(a heartbeat after a silence, an expired key) or when its last heartbeat grows too
old. The index is told of the first (`seen`, `expired`) and files every live host
under the second its last heartbeat arrived, so `refresh(now)` looks only at hosts
touched since the last refresh and at the seconds that have just fallen due. What
health *is* stays decided by `health.host_health`; what changed by
`health.transitions`.

A host found SUSPECT is also filed under the second its heartbeat key should expire
(its last heartbeat's time plus the TTL it was stored with): `overdue(heard_to)` looks
only at the seconds that have fallen due for `rules.key_overdue`, for the hosts whose
key was removed without an expiry marker (a purged bucket).

Time is the caller's (the time a heartbeat was received, and `now`), so the index is
tested with a fake clock. Heartbeat times need not be monotonic: every filed second
older than the due line is examined, in order, on each refresh.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Protocol

from server.health.rules import Health, host_health, key_overdue, transitions


class Seen(Protocol):
    """What the index reads of a host (server.state.cluster.HostEntry)."""

    present: bool
    seen_at: float
    ttl_s: float | None  # the TTL its last heartbeat was stored with (None: none)

    @property
    def heartbeat(self) -> object | None: ...


Change = tuple[str, Health | None, Health]


class HealthIndex:
    def __init__(self) -> None:
        self.health: dict[str, Health] = {}
        self.counts: Counter[Health] = Counter()
        self._touched: set[str] = set()
        # int(seen_at) -> live hosts whose last heartbeat arrived in that second.
        self._filed: dict[int, set[str]] = {}
        # int(seen_at + ttl_s) -> hosts found SUSPECT whose heartbeat key should expire in
        # that second (a host heard since is dropped when its second comes).
        self._expiring: dict[int, set[str]] = {}
        self._changes: list[Change] = []

    # ------------------------------------------------------------ told by ClusterState

    def seen(self, host_id: str, before: float | None, at: float) -> None:
        """A heartbeat of `host_id` received at `at` (the previous one at `before`)."""
        if self.health.get(host_id) is not Health.HEALTHY:
            self._touched.add(host_id)
        new = int(at)
        if before is not None:
            old = int(before)
            if old == new:
                return
            self._unfile(host_id, old)
        bucket = self._filed.get(new)
        if bucket is None:
            self._filed[new] = {host_id}
        else:
            bucket.add(host_id)

    def expired(self, host_id: str, last_seen: float | None) -> None:
        """The heartbeat key of `host_id` expired (or was deleted)."""
        self._touched.add(host_id)
        if last_seen is not None:
            self._unfile(host_id, int(last_seen))

    def _unfile(self, host_id: str, second: int) -> None:
        bucket = self._filed.get(second)
        if bucket is not None:
            bucket.discard(host_id)
            if not bucket:
                del self._filed[second]

    # ------------------------------------------------------------ read

    def refresh(self, hosts: Mapping[str, Seen], now: float, interval_s: float) -> None:
        """Bring `health` and `counts` up to `now`; what changed waits in `take_changes`."""
        due_line = now - 2 * interval_s
        candidates, self._touched = self._touched, set()
        for second in sorted(s for s in self._filed if s + 1 <= due_line):
            candidates |= self._filed.pop(second)
        # The second the due line falls in holds hosts on both sides of it: look at it
        # and keep it filed.
        partial = self._filed.get(int(due_line))
        if partial:
            candidates |= partial
        current: dict[str, Health] = {}
        for host_id in candidates:
            entry = hosts.get(host_id)
            if entry is None or entry.heartbeat is None:
                continue
            health = current[host_id] = host_health(present=entry.present, last_seen=entry.seen_at,
                                                    now=now, interval_s=interval_s)
            if health is Health.SUSPECT and entry.ttl_s is not None:
                self._expiring.setdefault(int(entry.seen_at + entry.ttl_s), set()).add(host_id)
        changes = transitions(self.health, current)
        for host_id, old, new in changes:
            if old is not None:
                self.counts[old] -= 1
            self.counts[new] += 1
            self.health[host_id] = new
        self._changes.extend(changes)

    def overdue(self, hosts: Mapping[str, Seen], heard_to: float, margin_s: float) -> list[str]:
        """Hosts found SUSPECT whose heartbeat key should have expired `margin_s` before
        `heard_to` and is still present here (`rules.key_overdue`), in host order. Only the
        seconds that have fallen due are looked at; a host heard since its filing is
        dropped (it is filed again if it falls silent again)."""
        out: list[str] = []
        for second in sorted(s for s in self._expiring if s <= heard_to - margin_s):
            for host_id in self._expiring.pop(second):
                entry = hosts.get(host_id)
                if entry is None or not entry.present or entry.ttl_s is None:
                    continue
                if key_overdue(last_seen=entry.seen_at, ttl_s=entry.ttl_s, now=heard_to, margin_s=margin_s):
                    out.append(host_id)
                elif int(entry.seen_at + entry.ttl_s) == second:  # due later in this second
                    self._expiring.setdefault(second, set()).add(host_id)
        out.sort()
        return out

    def take_changes(self) -> list[Change]:
        """Transitions found by refreshes since the last call, oldest first
        (None: a host not known before)."""
        out, self._changes = self._changes, []
        return out

    def count(self, health: Health) -> int:
        return self.counts[health]

