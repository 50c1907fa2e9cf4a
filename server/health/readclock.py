"""ReadClock: how far a server has read the heartbeats, on the store's clock.

A host is SUSPECT when it has been silent for two heartbeat intervals. "Silent" must
mean silent in what the server has read, not in what it has not read yet: at 50,000
hosts on a saturated machine the heartbeat reader fell seconds behind the stream, and
judging hosts by the wall clock called thousands of live hosts SUSPECT (and, at
start-up while the first heartbeats were still being read, all 50,000 of them, with an
event each).

Heartbeats are stamped with the time the store stored them (from the delivery's reply
subject) and read in stream order, so once every record stored before P has been
applied, a host last heard of at S has been silent for P - S, whatever the reader's lag.
Health is judged at `now()`:

* the position P (both P and S are the store's clock, so store/server skew does not
  enter the comparison);
* plus the local time since it was applied, only while the reader is caught up: nothing
  left unread (in the stream, the client's queue or the ingest process) and the record
  applied within `FRESH_S` of being stored (the store counts as pending only what it has
  not delivered yet; a record delivered into a backed-up connection arrives seconds
  later saying "nothing after me"). That check compares the two clocks, so keep them
  within a second or so (NTP); with worse skew the clock moves only as records are read;
* held where it stood while the reader skips records. The bucket keeps one heartbeat per
  host, so a reader more than an interval behind finds some already replaced by newer
  ones and removed: those hosts are alive but the server holds only an older heartbeat.
  The hold ends once the reader has gone `settle_s` (an interval) of the stream without
  a skip.

LOST does not depend on this clock: the store's TTL decides it and the expiry marker
arrives in the stream's order (late, when the reader is behind). Only where the marker
never comes (the bucket purged: a heartbeat published with `Nats-Rollup: all` removes
every other host's, markers included) is a host taken as expired by its age, on
`heard_to()`: the position itself, never run on by the local clock (a reader cut off from
NATS, or stalled, is not taken for silent hosts), and only once the reader has read every
host's latest heartbeat since it began reading (`whole`): while a reading of each key's
latest is under way, a host whose older heartbeat this server holds may have a newer one
not read yet, stored before the position.
"""

from __future__ import annotations

# A record applied more than this long after the store stored it was not read at the
# stream's end, whatever the store's pending count said when it was delivered.
FRESH_S = 2.0


class ReadClock:
    def __init__(self) -> None:
        self.position: float | None = None  # stream time of the newest record applied
        self.caught_up = True  # nothing was pending in the stream after it
        self.local_at = 0.0  # local time it was applied
        self.behind = 0  # records still pending in the stream after it
        # Where the clock stands while superseded heartbeats are being skipped (None: not),
        # and for how much stream time after the last skip it keeps holding.
        self.held_at: float | None = None
        self.settle_s = 5.0
        self._skipped_to = 0.0
        # Every host's latest heartbeat as of `position` has been applied: the reader is
        # not in the middle of reading each key's latest (its start, a follower's reading).
        self.whole = True

    def advance(self, position: float, behind: int, local_now: float, skipped: int = 0, live: bool = True,
                whole: bool = True) -> None:
        """Every record the store held before `position` (its time) has been applied;
        `behind` records were still unread or unsent (0: caught up). Not `live`: the
        reader has stopped after reading the bucket once (a follower reading it every so
        often), so the clock stands at `position` until the next reading, however far
        the local clock runs: nothing newer has been read. Not `whole`: the reader is
        reading each key's latest and has not handed them all over yet."""
        if skipped:
            # The stream removed records before they were read: a heartbeat replaced by a
            # newer one of its host (the bucket keeps one per host) while the reader was
            # more than an interval behind. That host is alive, but the server has only
            # its older heartbeat, so silence cannot be measured: the clock holds, until
            # the reader has gone a whole heartbeat interval of the stream without a
            # skip (every live host has then been read again). LOST still comes from the
            # store's TTL.
            if self.held_at is None:
                self.held_at = self.position if self.position is not None else position
            self._skipped_to = max(self._skipped_to, position)
        elif self.held_at is not None and position >= self._skipped_to + self.settle_s:
            self.held_at = None
        if self.position is None or position >= self.position:
            self.position = position
        self.behind = behind
        # Caught up only if nothing was left unread *and* the newest record was applied
        # promptly: the store counts as pending only what it has not yet delivered, and
        # what it delivered into a backed-up connection (its outbound buffer, the
        # sockets) arrives seconds later saying "nothing after me". Taking that at its
        # word let the clock run on at 50,000 hosts while the server was 20 s behind.
        self.caught_up = live and behind == 0 and local_now - position < FRESH_S
        self.local_at = local_now
        self.whole = whole

    def heard_to(self) -> float | None:
        """The store's time up to which every host's heartbeats have been read, not run on
        by the local clock (held while records are skipped); None while a reading of every
        key's latest is under way, or before anything was read. What a host's key is
        judged overdue at (health.rules.key_overdue)."""
        if self.position is None or not self.whole:
            return None
        return self.held_at if self.held_at is not None else self.position

    def now(self, local_now: float) -> float:
        """The time health is judged at (the local clock until anything was read)."""
        if self.position is None:
            return local_now
        if self.held_at is not None:
            return self.held_at
        if self.caught_up:
            return self.position + max(0.0, local_now - self.local_at)
        return self.position
