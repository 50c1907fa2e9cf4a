"""What every operation of a replica reads: its cluster view, its store, its queues, and
the events it publishes. `server.replica.Muster` is all the operations in one object."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from server.scheduling.queues import queue_named
from server.state.cluster import ClusterState
from server.views.jobs import JobView
from wire import subjects
from wire.errors import ConflictError, FencedError, RejectedError, StoreError
from wire.kv import Store
from wire.messages import DEFAULT_QUEUE, Event, Queue, encode, implicit_default_queue

log = logging.getLogger(__name__)


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

    async def _publish_event(self, subject: str, ev: Event) -> None:
        assert self.store is not None
        try:
            await self.store.nc.publish(f"{subjects.EVENTS_PREFIX}.{subject}", encode(ev))
        except Exception:  # noqa: BLE001 - the record is stored; the event is best effort
            log.warning("%s event not published", subject)
