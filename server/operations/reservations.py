"""Advance reservations: hosts set aside for some queues and users over a time window
(server.scheduling.advance), created, changed and deleted by an admin."""

from __future__ import annotations

import time
from typing import Any

from server.operations.base import Operations
from server.scheduling import advance
from server.timefmt import PAST_START_SLACK_S, iso_utc
from wire import subjects
from wire.errors import NotFound, ValidationError
from wire.kv import Write
from wire.messages import MAX_MESSAGE_BYTES, AdvanceReservation, Event, encode
from wire.records import Record
from wire.validation import validate_advance_reservation

# How far ahead an advance reservation may start, and how long it may last; its record
# expires this long after it ends.
MAX_RESERVATION_AHEAD_S = 365 * 86400
MAX_RESERVATION_S = 90 * 86400
RESERVATION_KEPT_S = 86400



class ReservationOperations(Operations):
    async def create_advance_reservation(self, data: dict[str, Any], by: str) -> AdvanceReservation:
        """Set hosts aside for some queues' and users' jobs over a time window
        (scheduling.advance). A start just past (5 minutes at most), or none, is now. Raises
        ValidationError: bad input, a name taken, an unknown host or queue, a window too far
        ahead or too long, a record too large, or a host set aside by another reservation
        over an overlapping window (OVERLAPS). The checks and the write are one: of two
        creations (on any replicas) that would clash, or a creation and the deletion of a
        queue it names, one is stored and the other refused (Operations.ordered_commit)."""
        def decide(stored: Record | None) -> tuple[Write, AdvanceReservation]:
            now = time.time()
            r, body = self._checked_reservation({**data, "created_at": now, "by": by}, now)
            if r.name in self.state.advance:
                raise ValidationError("name", f"an advance reservation named {r.name!r} exists", "EXISTS")
            key = subjects.advres_key(r.name)
            # Expected: the key's delete marker, or its expiry's, when one of the name was
            # before; or none once that marker has gone too, which the view does not see (the
            # key as stored when the last try was refused, if it held nothing).
            absent = stored is not None and stored.key == key and stored.value is None
            return Write(key, body, expected=stored.revision if absent and stored else self.state.revisions.get(key, 0),
                         ttl=f"{int(r.ends - now + RESERVATION_KEPT_S)}s"), r

        r = await self.ordered_write(decide, by, "advance reservations")
        await self._reservation_event("created", r, by)
        return r

    async def update_advance_reservation(self, name: str, changes: dict[str, Any], by: str) -> AdvanceReservation:
        """Change the given fields of an advance reservation (its end, start, hosts, queues,
        users, description), checked as a new one is, and stored as one is. Raises NotFound
        or ValidationError."""
        key = subjects.advres_key(name)

        def decide(_stored: Record | None) -> tuple[Write, AdvanceReservation]:
            cur = self.state.advance.get(name)
            if cur is None:
                raise NotFound(f"no advance reservation named {name!r}")
            now = time.time()
            given = {k: v for k, v in changes.items() if v is not None}
            if cur.ends <= now and "starts" not in given:
                # An ended one changed would open again at its old start, at once, stopping
                # what runs on its hosts (found by exploring: `set --end 2m` on one over for
                # ten minutes). Given a new start, it is checked as a new one is.
                raise ValidationError("endsAt", f"advance reservation {name!r} has ended: give it a new start too, "
                                                "or create a new one", "ENDED")
            # A start given is no earlier than now; one kept is kept (an open reservation stays
            # the window it is: no alert that it ended and opened again).
            r, body = self._checked_reservation({**cur.model_dump(), **given, "name": name, "by": by}, now,
                                                clamp_start="starts" in given)
            return Write(key, body, expected=self.state.revisions.get(key, 0),
                         ttl=f"{int(r.ends - now + RESERVATION_KEPT_S)}s"), r

        r = await self.ordered_write(decide, by, "the advance reservation")
        await self._reservation_event("updated", r, by)
        return r

    def _checked_reservation(self, data: dict[str, Any], now: float,
                             clamp_start: bool = True) -> tuple[AdvanceReservation, bytes]:
        """An advance reservation's record from `data` (its start no earlier than `now` when
        `clamp_start`), with every check but its name's being free; and its bytes."""
        if clamp_start:
            given = data.get("starts")
            starts = now if given is None else float(given)
            if starts < now - PAST_START_SLACK_S:
                # A wrong day or year would set the hosts aside at once, stopping what runs
                # there (a review); a moment past is taken as now.
                raise ValidationError("startsAt", f"is {now - starts:.0f} s in the past: give a time ahead, or none "
                                                  "to open it now", "OUT_OF_RANGE")
            data = {**data, "starts": max(now, starts)}
        r = validate_advance_reservation(data)
        if r.ends > now + MAX_RESERVATION_AHEAD_S or r.starts > now + MAX_RESERVATION_AHEAD_S:
            raise ValidationError("endsAt", f"must be at most {MAX_RESERVATION_AHEAD_S // 86400} days ahead",
                                  "OUT_OF_RANGE")
        if r.ends - r.starts > MAX_RESERVATION_S:
            raise ValidationError("endsAt", f"a reservation lasts at most {MAX_RESERVATION_S // 86400} days",
                                  "OUT_OF_RANGE")
        body = encode(r)
        size = len(body)
        if size > MAX_MESSAGE_BYTES:
            raise ValidationError("hosts", f"{len(r.hosts)} hosts of these names make a record of {size:,} bytes, more "
                                           f"than the {MAX_MESSAGE_BYTES:,} one may hold: set them aside in several "
                                           "reservations", "TOO_LARGE")
        unknown = [h for h in r.hosts if h not in self.state.hosts]
        if unknown:
            more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
            raise ValidationError("hosts", f"no host {', '.join(unknown[:3])}{more}", "NOT_FOUND")
        for name in r.queues:
            if self.queue(name) is None:
                raise ValidationError("queues", f"no queue named {name!r}", "NOT_FOUND")
        other = advance.clash(r, self.state.advance.values(), now)
        if other is not None:
            shared = sorted(set(r.hosts) & set(other.hosts))
            raise ValidationError("hosts", f"host {shared[0]} is set aside by advance reservation {other.name} from "
                                           f"{iso_utc(other.starts)} to {iso_utc(other.ends)}", "OVERLAPS")
        return r, body

    async def _reservation_event(self, action: str, r: AdvanceReservation, by: str) -> None:
        await self._publish_event(f"advres.{action}", Event(
            kind=f"advres.{action}", message=f"advance reservation {r.name} {action} by {by}: {len(r.hosts)} host(s) "
            f"for {advance.whom(r)} from {iso_utc(r.starts)} to {iso_utc(r.ends)}",
            data={"name": r.name, "by": by, "hosts": len(r.hosts), "queues": r.queues, "users": r.users,
                  "starts": r.starts, "ends": r.ends}))

    async def delete_advance_reservation(self, name: str, by: str) -> None:
        """Give the hosts of an advance reservation back to every queue. Raises NotFound."""
        key = subjects.advres_key(name)

        def decide(_stored: Record | None) -> tuple[Write, None]:
            if name not in self.state.advance:
                raise NotFound(f"no advance reservation named {name!r}")
            return Write(key, b"", expected=self.state.revisions.get(key, 0), delete=True), None

        await self.ordered_write(decide, by, "advance reservations")
        await self._publish_event("advres.deleted", Event(
            kind="advres.deleted", message=f"advance reservation {name} deleted by {by}",
            data={"name": name, "by": by}))
