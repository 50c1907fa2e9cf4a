"""The history writer lease's rules, against a store that answers as told: a writer
keeps writing through a failed renewal and stops only when another holds the key (an
expired key is taken again)."""

from __future__ import annotations

from server.history.writerlease import WriterLease, lease_key, shared_database
from wire.errors import ConflictError, StoreError
from wire.records import Record


class Store:
    def __init__(self) -> None:
        self.value: bytes | None = None
        self.revision = 0
        self.fail: Exception | None = None

    async def get(self, key: str) -> Record:
        return Record(key, self.revision, self.value)

    async def put(self, key: str, value: bytes, *, expected: int | None = None, ttl: str | None = None) -> int:
        if self.fail is not None:
            raise self.fail
        if expected is not None and expected != self.revision:
            raise ConflictError("wrong last sequence")
        self.revision += 1
        self.value = value
        return self.revision


async def test_a_writer_keeps_the_lease_through_timeouts_and_gives_it_up_to_a_new_holder() -> None:
    store = Store()
    mine = WriterLease(store, "k", "a")  # type: ignore[arg-type]
    other = WriterLease(store, "k", "b")  # type: ignore[arg-type]
    assert await mine.acquire()
    assert not await other.acquire()  # held
    store.fail = StoreError("nats: timeout")
    assert await mine.renew()  # still the writer
    store.fail = None
    assert await mine.renew()
    # A renewal that landed although its answer timed out: the key moved on, to us.
    store.revision += 1
    assert await mine.renew() and mine.revision == store.revision
    # The key expired (its expiry marker is the last revision) while this writer was
    # writing, and nobody took it: the writer takes it again.
    store.value, store.revision = None, store.revision + 1
    assert await mine.renew() and store.value == b"a" and mine.revision == store.revision
    assert not await other.acquire()
    # The key expired and another took it.
    store.value, store.revision = None, store.revision + 1
    assert await other.acquire()
    assert not await mine.renew()
    await other.release()
    assert store.value == b"" and await mine.acquire()
    # An acquisition that landed although its answer was lost is found ours.
    assert await mine.acquire() and mine.revision == store.revision


def test_only_a_database_of_others_too_is_shared() -> None:
    assert shared_database("postgresql+psycopg://u@h/db")
    assert not shared_database("sqlite:////var/lib/muster/history.db")
    assert lease_key("postgresql://a") != lease_key("postgresql://b")
    assert lease_key("postgresql://a").startswith("history.writer.")
