"""Leader election on the `lease` KV key, with the leadership term as a fencing token.

Acquisition is one atomic commit: the `lease` key (must still be at the revision we
read: absent or expired) with a per-message TTL, the `term` key and the fence slot keys
`term.1`..`term.3`. The revision of that `term` write is the leadership term; every
leader commit checks `term` or one slot key inside the same batch (see Store.commit's
fence), so a stale leader's writes are rejected by the store itself. (Slots exist
because a clustered stream refuses a second batch in flight that checks the same key.)
Renewal republishes the lease with a revision check and the TTL (KV's update() would
drop the TTL). Only the local monotonic clock is trusted:
a leader that could not renew within the lease TTL stops leading on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from nats.aio.client import Client as NATS

from wire.errors import ConfigError, ConflictError, StoreError
from wire.kv import Fence, Store, Write
from wire.stopping import pause

log = logging.getLogger(__name__)


# Fence slots: how many leader commits may be in flight at once (see store.Fence).
FENCE_SLOTS = 4


def fence_key(slot: int) -> str:
    return "term" if slot == 0 else f"term.{slot}"


@dataclass(frozen=True)
class LeaseConfig:
    ttl_s: int = 5
    renew_every_s: float = 1.5
    retry_every_s: float = 0.5
    # Test-only switches. `shared`: no lease at all, every replica schedules under the
    # current term (safety then rests on the revision checks alone). `trust_local_clock`
    # False: a replica does not notice on its own that its lease ran out, so only the
    # store's fence can stop a stale leader.
    shared: bool = False
    trust_local_clock: bool = True

    def validate(self) -> LeaseConfig:
        if self.ttl_s < 1 or int(self.ttl_s) != self.ttl_s:
            raise ConfigError("lease TTL must be a whole number of seconds >= 1")
        if not (self.ttl_s > 2 * self.renew_every_s > 0):
            raise ConfigError("lease TTL must exceed twice the renew interval")
        if self.retry_every_s <= 0:
            raise ConfigError("lease retry interval must be positive")
        return self


class Leader(Protocol):
    """What the scheduler and the health monitor read of a leadership: a `Leadership`, or
    a `ThreadedLeadership` keeping one in a thread of its own."""

    config: LeaseConfig
    changed: asyncio.Event

    @property
    def leading(self) -> bool: ...

    @property
    def term(self) -> int: ...

    def fence(self, slot: int = 0) -> Fence: ...

    def step_down(self, why: str) -> None: ...


class Leadership:
    """Campaigns for the lease and keeps it. `term` is 0 while not leading."""

    def __init__(
        self,
        store: Store,
        holder: str,
        config: LeaseConfig | None = None,
        on_change: Callable[[bool, int], None] | None = None,
    ) -> None:
        self.store = store
        self.holder = holder
        self.config = (config or LeaseConfig()).validate()
        self.on_change = on_change
        self.term = 0
        self._slots: dict[int, int] = {}  # revisions of the `term.<n>` fence keys, this term
        self._lease_rev = 0
        self._valid_until = 0.0  # monotonic
        self.changed = asyncio.Event()
        self.takeovers = 0

    @property
    def leading(self) -> bool:
        if not self.config.trust_local_clock:
            return self.term > 0
        return self.term > 0 and time.monotonic() < self._valid_until

    def fence(self, slot: int = 0) -> Fence:
        """The fence for a commit in slot `slot` (0..FENCE_SLOTS-1): commits in flight at
        the same time must use different slots (see Fence)."""
        if slot == 0:
            return Fence(self.term, self.holder)
        return Fence(self.term, self.holder, key=fence_key(slot), revision=self._slots.get(slot, 0))

    def _set(self, term: int) -> None:
        was = self.term
        self.term = term
        if (was > 0) != (term > 0) or (was and term and was != term):
            log.info("leadership %s (term %d)", "acquired" if term else "lost", term or was)
            self.changed.set()
            if self.on_change:
                self.on_change(term > 0, term)

    def step_down(self, why: str) -> None:
        if self.term:
            log.warning("stepping down from term %d: %s", self.term, why)
            self._lease_rev = 0
            # Every fence from here is refused, in whichever slot (the slot keys' revisions
            # of the term stepped down from would still pass where no one took over).
            self._slots = {}
            self._set(0)

    async def try_acquire(self) -> bool:
        lease = await self.store.get("lease")
        if lease.value:  # held (an empty value is a resigned lease)
            return False
        term = await self.store.get("term")
        slots = {n: await self.store.get(fence_key(n)) for n in range(1, FENCE_SLOTS)}
        started = time.monotonic()
        value = json.dumps({"holder": self.holder, "ts": time.time()}).encode()
        try:
            res = await self.store.commit(
                [
                    Write("lease", self.holder.encode(), expected=lease.revision, ttl=f"{self.config.ttl_s}s"),
                    Write("term", value, expected=term.revision),
                ]
                # Every fence slot moves with the term: a deposed leader's commit in
                # flight in any slot is refused.
                + [Write(fence_key(n), value, expected=rec.revision) for n, rec in slots.items()]
            )
        except ConflictError:
            return False
        self._lease_rev = res.revisions["lease"]
        self._valid_until = started + self.config.ttl_s
        self.takeovers += 1
        self._slots = {n: res.revisions[fence_key(n)] for n in slots}
        self._set(res.revisions["term"])
        return True

    async def renew(self) -> None:
        started = time.monotonic()
        try:
            self._lease_rev = await self.store.put(
                "lease", self.holder.encode(), expected=self._lease_rev, ttl=f"{self.config.ttl_s}s"
            )
            self._valid_until = started + self.config.ttl_s
        except ConflictError:
            self.step_down("lease was taken over")
        except StoreError as exc:
            log.warning("lease renewal failed: %s", exc)
            if time.monotonic() >= self._valid_until:
                self.step_down("lease expired before it could be renewed")

    async def _join_shared(self) -> None:
        term = await self.store.get("term")
        if term.revision == 0:
            try:
                await self.store.put("term", json.dumps({"holder": "shared", "ts": time.time()}).encode(), expected=0)
            except ConflictError:
                pass
            term = await self.store.get("term")
        self._slots = {n: (await self.store.get(fence_key(n))).revision for n in range(1, FENCE_SLOTS)}
        self._valid_until = float("inf")
        self._set(term.revision)

    async def run(self, stop: asyncio.Event) -> None:
        """Campaign and renew until `stop` is set; then give the lease up."""
        if self.config.shared:
            while not self.term and not stop.is_set():
                try:
                    await self._join_shared()
                except StoreError as exc:
                    log.warning("joining shared scheduling: %s", exc)
                    await asyncio.sleep(0.5)
            await stop.wait()
            self._set(0)
            return
        while not stop.is_set():
            try:
                if self.term:
                    if self.config.trust_local_clock and time.monotonic() >= self._valid_until:
                        self.step_down("lease expired (process was paused or cut off)")
                    else:
                        await self.renew()
                else:
                    await self.try_acquire()
            except StoreError as exc:
                log.debug("lease: %s", exc)
            except Exception:  # noqa: BLE001
                log.exception("lease loop error")
            wait = self.config.renew_every_s if self.term else self.config.retry_every_s
            await pause(stop, wait)
        await self.resign()

    async def resign(self) -> None:
        """Hand the lease back so another replica takes over at once."""
        if not self.term:
            return
        rev = self._lease_rev
        self._set(0)
        try:
            # Expire the lease now: a 1 s TTL write, checked against our revision.
            await self.store.put("lease", b"", expected=rev, ttl="1s")
        except StoreError:
            pass


class ThreadedLeadership:
    """A `Leadership` kept by a thread of its own, with its own event loop and NATS
    connection: renewals then never wait behind the main loop's work (a burst of API
    requests or a long scheduling cycle), while safety still rests on the store's fence.

    The main loop reads `leading`, `term` and `fence()` as it would from a Leadership,
    and waits on `changed`."""

    def __init__(self, connect: Callable[[], object], holder: str, config: LeaseConfig | None = None,
                 on_change: Callable[[bool, int], None] | None = None, replicas: int = 1) -> None:
        self._connect = connect  # returns an awaitable NATS connection, called in the thread
        self.holder = holder
        self.config = (config or LeaseConfig()).validate()
        self.on_change = on_change
        self.replicas = replicas
        self.changed = asyncio.Event()
        self.inner: Leadership | None = None
        self._main: asyncio.AbstractEventLoop | None = None
        self._tloop: asyncio.AbstractEventLoop | None = None
        self._tstop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._stopping = threading.Event()  # set by run() on stop, read by the thread as it starts
        self._thread: threading.Thread | None = None

    @property
    def leading(self) -> bool:
        return self.inner is not None and self.inner.leading

    @property
    def term(self) -> int:
        return self.inner.term if self.inner is not None else 0

    @property
    def takeovers(self) -> int:
        return self.inner.takeovers if self.inner is not None else 0

    def fence(self, slot: int = 0) -> Fence:
        assert self.inner is not None
        return self.inner.fence(slot)

    def step_down(self, why: str) -> None:
        if self.inner is not None and self._tloop is not None:
            self._tloop.call_soon_threadsafe(self.inner.step_down, why)

    def _changed(self, leading: bool, term: int) -> None:
        # Called in the lease thread: hand the news to the main loop.
        def notify() -> None:
            self.changed.set()
            if self.on_change:
                self.on_change(leading, term)

        if self._main is not None:
            self._main.call_soon_threadsafe(notify)

    def _thread_main(self) -> None:
        async def go() -> None:
            from wire.kv import Store

            self._tloop = asyncio.get_running_loop()
            self._tstop = asyncio.Event()
            # A stop that came before the two above were set could not be passed on (found
            # by a test's shutdown right after start: the thread went on, took the lease and
            # kept it, and the shutdown waited for it in vain).
            if self._stopping.is_set():
                self._tstop.set()
            nc = await self._connected(self._tstop)
            if nc is None:  # stopped before NATS could be reached
                self._ready.set()
                return
            try:
                self.inner = Leadership(Store(nc, replicas=self.replicas), self.holder, self.config,
                                        on_change=self._changed)
                self._ready.set()
                await self.inner.run(self._tstop)
            finally:
                self._ready.set()
                try:
                    await asyncio.wait_for(nc.close(), timeout=5)
                except Exception:  # noqa: BLE001
                    pass

        try:
            asyncio.run(go())
        except Exception:  # noqa: BLE001
            log.exception("lease thread failed")
            self._ready.set()

    async def _connected(self, stop: asyncio.Event) -> NATS | None:
        """The lease's own NATS connection, tried again until it is made or `stop` is set
        (found by a review: a first try that failed, NATS restarting as the replica started,
        ended the thread, and the replica never campaigned, looking healthy)."""
        while True:
            try:
                nc: NATS = await self._connect()  # type: ignore[misc]
                return nc
            except Exception as exc:  # noqa: BLE001 - whatever the client raises: said, and tried again
                log.warning("lease: cannot connect to NATS (%s); trying again", exc)
            if await pause(stop, max(1.0, self.config.retry_every_s)):
                return None

    async def run(self, stop: asyncio.Event) -> None:
        self._main = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._thread_main, name="muster-lease", daemon=True)
        self._thread.start()
        # Until the thread is ready (30 s at most) or told to stop: a stop while it still
        # tries to connect is passed on at once (found by a review: it waited the 30 s).
        deadline = time.monotonic() + 30
        while not self._ready.is_set() and time.monotonic() < deadline:
            if await pause(stop, 0.05):
                break
        await stop.wait()
        self._stopping.set()  # (before the look below: the thread sees the one or the other)
        if self._tloop is not None and self._tstop is not None:
            with contextlib.suppress(RuntimeError):  # (its loop closed: the thread has ended)
                self._tloop.call_soon_threadsafe(self._tstop.set)  # resigns the lease on the way out
        await asyncio.to_thread(self._thread.join, 15)
