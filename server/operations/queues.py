"""Queues created, changed and deleted by an admin: the queue records the planner reads."""

from __future__ import annotations

import time
from typing import Any

from server.operations.base import Operations
from server.scheduling import advance
from wire import subjects
from wire.errors import ConflictError, NotFound, ValidationError
from wire.kv import Write
from wire.messages import DEFAULT_QUEUE, Event, Queue, encode
from wire.records import Record
from wire.validation import validate_queue


class QueueOperations(Operations):
    async def create_queue(self, data: dict[str, Any], by: str) -> Queue:
        """Store a new queue (also under the name of one deleted before: its key's delete
        marker is the revision the write expects). Raises ValidationError (bad input, or
        the name is taken, here or by another replica meanwhile)."""
        now = time.time()
        q = validate_queue({**data, "created_at": now, "updated_at": now, "by": by}, self.known_gpu_models())
        if q.name in self.state.queues or q.name == DEFAULT_QUEUE:
            # (The default queue exists before any record of its own: found by exploring,
            # creating it replaced its settings with a new queue's, preemption on.)
            raise ValidationError("name", f"a queue named {q.name!r} exists"
                                  + (" (change it with updateQueue)" if q.name == DEFAULT_QUEUE else ""), "EXISTS")
        key = subjects.queue_key(q.name)
        try:
            await self._put_queue(q, self.state.revisions.get(key, 0), created=True)
        except ConflictError:
            assert self.store is not None
            self.state.apply_state_record(await self.store.get(key))
            if q.name in self.state.queues:
                raise ValidationError("name", f"a queue named {q.name!r} exists", "EXISTS") from None
            raise ConflictError("the queue changed concurrently; try again", field="name") from None
        return q

    async def update_queue(self, name: str, changes: dict[str, Any], by: str) -> Queue:
        """Change the given fields of a queue (the `default` queue gets a record of its own
        on its first change). Raises NotFound or ValidationError."""
        for _ in range(5):
            cur = self.queue(name)
            if cur is None:
                raise NotFound(f"no queue named {name!r}")
            q = validate_queue({**cur.model_dump(), **changes, "name": name, "updated_at": time.time(), "by": by},
                               self.known_gpu_models(), kept=set(cur.quota))
            try:
                await self._put_queue(q, self.state.revisions.get(subjects.queue_key(name), 0))
                return q
            except ConflictError:
                assert self.store is not None
                self.state.apply_state_record(await self.store.get(subjects.queue_key(name)))
        raise ConflictError("the queue changed concurrently; try again", field="name")

    async def delete_queue(self, name: str, by: str) -> None:
        """Delete a queue that holds no work and that no advance reservation names. Raises
        NotFound, or ValidationError (QUEUE_IN_USE with the counts or the reservations; the
        default queue cannot be deleted). The reservations' check and the deletion are one:
        of a deletion and a reservation naming the queue made meanwhile (on any replica),
        one is stored and the other refused (Operations.ordered_commit). The jobs counted
        are those stored (by any replica) before the call; one submitted at the same moment
        is not held off so (every submission would be a check of its queue's key, one at a
        time): it waits until a queue of that name exists again."""
        if name == DEFAULT_QUEUE:
            raise ValidationError("name", "the default queue always exists (change it with updateQueue)",
                                  "PROTECTED")
        key = subjects.queue_key(name)
        # Jobs and reservations any replica stored before now are in the view, not only
        # those this one has read so far.
        await self.view_caught_up()
        def decide(_stored: Record | None) -> tuple[Write, None]:
            if name not in self.state.queues:
                raise NotFound(f"no queue named {name!r}")
            queued = self.state.backlog.count(name) + self.state.backlog.held_in(name)
            live = len(self.state.queue_live.get(name, ()))
            if queued or live:
                raise ValidationError("name", f"queue {name!r} has {queued} queued and {live} placed or running jobs: "
                                              "cancel them or wait for them to end first", "QUEUE_IN_USE")
            now = time.time()
            naming = sorted(r.name for r in self.state.advance.values()
                            if name in r.queues and not advance.over(r, now))
            if naming:
                raise ValidationError("name", f"queue {name!r} is named by advance reservation {', '.join(naming)}: "
                                              "delete it first, or wait for it to end", "QUEUE_IN_USE")
            return Write(key, b"", expected=self.state.revisions.get(key, 0), delete=True), None

        await self.ordered_write(decide, by, "the queue or advance reservations")
        await self._queue_event("deleted", name, by)

    async def _put_queue(self, q: Queue, expected: int, created: bool = False) -> None:
        assert self.store is not None
        key = subjects.queue_key(q.name)
        body = encode(q)
        rev = await self.store.put(key, body, expected=expected)
        self.state.apply_state_record(Record(key, rev, body))
        await self._queue_event("created" if created else "updated", q.name, q.by)

    async def _queue_event(self, action: str, name: str, by: str) -> None:
        await self._publish_event(f"queue.{action}", Event(kind=f"queue.{action}", message=f"queue {name} {action} "
                                                           f"by {by}", data={"queue": name, "by": by}))
