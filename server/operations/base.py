"""What every operation of a replica reads: its cluster view, its store, its queues, and
the events it publishes. `server.replica.Muster` is all the operations in one object."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from server.scheduling.queues import queue_named
from server.state.cluster import ClusterState
from server.views.jobs import JobView
from wire import subjects
from wire.errors import ConflictError, FencedError, RejectedError, StoreError
from wire.kv import Store, Write
from wire.messages import DEFAULT_QUEUE, Event, Queue, encode, implicit_default_queue
from wire.records import Record

log = logging.getLogger(__name__)

T = TypeVar("T")

# Tries of a change committed with the `advres-order` key (Operations.ordered_commit)
# before it is refused as made concurrently, and how long each waits at most for this
# replica's view to read what was stored before it.
ORDERED_TRIES = 12
ORDER_CATCH_UP_S = 5.0


@contextlib.contextmanager
def maybe_stored(what: str) -> Iterator[None]:
    """A new record's write whose outcome stayed unknown past SUBMIT_RETRY_S: say which,
    and that it may have been stored. A definite refusal (taken, fenced, too large) passes."""
    try:
        yield
    except (ConflictError, FencedError, RejectedError):
        raise
    except StoreError as exc:
        raise StoreError(f"{what} not stored ({exc}); it may have been: look it up before submitting "
                         "again") from exc


class Operations:
    """The parts of a replica its operations use (server.replica.Muster sets them up)."""

    state: ClusterState
    store: Store | None
    jobs: JobView

    def known_gpu_models(self) -> set[str]:
        return self.state.index.models()

    def queue(self, name: str) -> Queue | None:
        """A queue's record; the `default` queue always exists."""
        return queue_named(self.state.queues, name)

    def queues(self) -> list[Queue]:
        out = dict(self.state.queues)
        out.setdefault(DEFAULT_QUEUE, implicit_default_queue())
        return [out[n] for n in sorted(out)]

    async def view_caught_up(self) -> None:
        """A read barrier: return once this replica's view holds every record stored before
        the call (server.replica.Muster: its state watch's). ConflictError past
        ORDER_CATCH_UP_S. Nothing to wait for here, without a watch."""

    async def ordered_commit(self, writes: list[Write], by: str) -> dict[str, int]:
        """Commit `writes` (a change of an advance reservation, a queue's deletion) in one
        atomic batch with a write of the `advres-order` key checked against the revision
        this replica's view has of it; returns the new revisions. Every such change writes
        that key, so one checked against this view is stored only if nothing of the kind
        was stored since the view's: the checks made on the view (a host set aside by one
        reservation at a time, a queue a reservation names not deleted) hold when it is
        stored, whichever replica stores the others. The view has read every such change
        up to its revision of the key: the watch hands records over in the store's order,
        and a write of this replica's own was checked against the one before. Raises
        ConflictError when anything checked moved on (then `after_ordered_refusal`, and
        decide again)."""
        assert self.store is not None
        key = subjects.ADVRES_ORDER_KEY
        order = json.dumps({"key": writes[0].key, "by": by, "at": time.time()}).encode()
        res = await self.store.commit([*writes, Write(key, order, expected=self.state.revisions.get(key, 0))])
        if res.duplicate:  # (applied by an earlier try whose answer was lost: read it back)
            await self.after_ordered_refusal([w.key for w in writes])
            return {w.key: self.state.revisions.get(w.key, 0) for w in writes}
        self.state.apply_state_record(Record(key, res.revisions[key], order))
        return res.revisions

    async def ordered_write(self, decide: Callable[[Record | None], tuple[Write, T]], by: str, what: str) -> T:
        """Decide one write on this replica's view and commit it ordered (`ordered_commit`),
        deciding again on the view as stored after each refusal (`after_ordered_refusal`),
        ORDERED_TRIES times at most. `decide` is given the key as stored when the last try
        was refused (None at the first) and returns the write and what to return once it is
        stored (its record applied to the view); it raises where the view refuses the change.
        ConflictError naming `what` when every try was refused."""
        stored: Record | None = None
        for tries in range(ORDERED_TRIES):
            write, result = decide(stored)
            try:
                revs = await self.ordered_commit([write], by)
            except ConflictError:
                stored = (await self.after_ordered_refusal([write.key], tries))[write.key]
                continue
            self.state.apply_state_record(Record(write.key, revs[write.key], None if write.delete else write.value))
            return result
        raise ConflictError(f"{what} changed concurrently; try again", field="name")

    async def after_ordered_refusal(self, keys: list[str], tries: int = 0) -> dict[str, Record]:
        """After an ordered commit was refused: this replica's view holds `keys` as stored
        now, and every ordered change stored so far (the watch has brought the
        `advres-order` key's revision up to the store's); returns `keys` as stored. Raises
        ConflictError when the view does not get there within ORDER_CATCH_UP_S. `tries`
        (the refusals so far) spreads out the next try of writers that refuse each other
        (a clustered stream refuses a check of a key another is checking at the moment)."""
        assert self.store is not None
        stored = {k: await self.store.get(k) for k in keys}
        for rec in stored.values():
            self.state.apply_state_record(rec)
        target = (await self.store.get(subjects.ADVRES_ORDER_KEY)).revision
        deadline = time.monotonic() + ORDER_CATCH_UP_S
        while self.state.revisions.get(subjects.ADVRES_ORDER_KEY, 0) < target:
            if time.monotonic() > deadline:
                raise ConflictError("this server's view is behind the store; try again", field="name")
            await asyncio.sleep(0.01)
        await asyncio.sleep(random.uniform(0, 0.01 * min(tries, 5)))
        return stored

    async def _publish_event(self, subject: str, ev: Event) -> None:
        assert self.store is not None
        try:
            await self.store.nc.publish(f"{subjects.EVENTS_PREFIX}.{subject}", encode(ev))
        except Exception:  # noqa: BLE001 - the record is stored; the event is best effort
            log.warning("%s event not published", subject)
