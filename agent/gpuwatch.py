"""The agent's GPU watch: one thread owns the GPU backend, so that the agent's event loop
never waits on NVML.

NVML calls take milliseconds to tens of milliseconds each, and a wedged driver leaves its
callers stuck for good (in D state). Made on the agent's loop they would hold up its
heartbeats, its fence and its watchdog's proof of life: a host whose telemetry hangs would
fence itself and have every task stopped. So a `GpuWatch` makes every call the agent needs
of a blocking backend on a thread of its own (`poll_faults`, with its event waits and ECC
counters, `usage`, `clear_faults`, `close`), one round every `period_s` or sooner when
asked, and publishes what it read:

* `snapshot()`: the latest `GpuSnapshot` (usage, inventory, when it was read), immutable,
  read without waiting. Faults the thread finds are marked on it at once, before the
  round's usage is read, so that the loop never holds a fault its snapshot does not show.
* `take_faults()`: the faults found since the last call, each handed over exactly once
  (taken and appended under one lock).
* `clear(indices)`: an operator's clear, made by the thread first thing in its next round
  (woken for it), whose usage then shows the marks gone. Returns a
  `concurrent.futures.Future` of the indices that had a mark; nobody has to wait for it.
* `fresh(timeout_s)` (a coroutine): the snapshot of a round begun after the call, awaited
  at most `timeout_s`; the latest one after that. For a decision that needs the GPUs'
  state now (did a failed task's GPU fault?), bounded.
* `on_news`: called (from the thread) when a round found faults or applied clears; the
  agent makes it wake its heartbeat.
* `aclose(timeout_s)` (a coroutine): stops the thread, which closes the backend; waits
  `timeout_s` at most. A thread stuck in NVML is left behind (it is a daemon) and said in
  the log: a hung driver never hangs the agent's shutdown.

Backends that declare `blocking = False` (`SimulatedBackend`, `EmptyBackend`: in-process,
they never wait on a device) are read in line instead, on the caller's thread, by the same
round (`_round`): `current()` reads one for each heartbeat, `clear()` and `fresh()` read one
at once. Tests and benchmarks so see the same deterministic telemetry as they would
calling the backend themselves, and a simulated host costs no thread (its fault file, a
local file, is read on the loop as before). A backend without the attribute is taken as
blocking.

Not the watch's: the start-up reads. The inventory is read once when the watch is made
(the backends read it when they start: `NvmlBackend.inventory()` returns its copy without
an NVML call), as are the device minor numbers the isolation reads (`agent.isolation`),
before the loop runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace
from typing import TypeVar

from agent.gpu import GpuBackend, GpuFault
from wire.messages import GPU_FIGURES, GpuInfo, GpuUsage

log = logging.getLogger(__name__)
T = TypeVar("T")

# A snapshot older than this many rounds (heartbeat intervals) means an NVML call hangs.
STALE_ROUNDS = 3


@dataclass(frozen=True)
class GpuSnapshot:
    """What the GPU backend said in one round. `usage` entries are shared with every
    reader and never changed: copy one (`model_copy`) to change it. `taken_at` is the
    `time.monotonic()` at which the round read the usage, None before the first read;
    `number`: the round that read it (0: none)."""

    usage: tuple[GpuUsage, ...]
    inventory: tuple[GpuInfo, ...]
    taken_at: float | None
    number: int = 0

    def age(self, now: float) -> float | None:
        """Seconds since the usage was read (None: never)."""
        return None if self.taken_at is None else max(0.0, now - self.taken_at)

    def faulted(self) -> dict[int, str]:
        """The GPUs the backend holds faulted: index -> the fault."""
        return {u.index: u.fault or "unhealthy" for u in self.usage if not u.healthy}


# ---------------------------------------------------------------- pure helpers


def with_faults(snap: GpuSnapshot, faults: Iterable[GpuFault]) -> GpuSnapshot:
    """`snap` with the GPUs of `faults` marked faulted (a GPU marked already keeps its
    first fault, as the backends do); the telemetry and its age unchanged."""
    marks: dict[int, str] = {}
    for f in faults:
        marks.setdefault(f.index, f.describe())
    if not marks:
        return snap
    usage = tuple(u.model_copy(update={"healthy": False, "fault": marks[u.index]})
                  if u.healthy and u.index in marks else u for u in snap.usage)
    return replace(snap, usage=usage)


def is_stale(snap: GpuSnapshot, now: float, stale_after_s: float) -> bool:
    """Whether the snapshot is too old to report as the GPUs' state: never read, or read
    more than `stale_after_s` ago (an NVML call hangs)."""
    age = snap.age(now)
    return age is None or age > stale_after_s


def usage_to_report(snap: GpuSnapshot, stale: bool) -> list[GpuUsage]:
    """The usage entries a heartbeat carries, copies it may change. From a stale snapshot
    each GPU's health marks only (a fault stays known), every figure of its telemetry
    unread (`GpuUsage.unread`; 0 for older readers): numbers read long ago are not
    reported as the GPUs' state."""
    if not stale:
        return [u.model_copy(update={"unread": list(u.unread)}) for u in snap.usage]
    return [GpuUsage(index=u.index, healthy=u.healthy, fault=u.fault, unread=list(GPU_FIGURES)) for u in snap.usage]


def util_by_index(usage: Iterable[GpuUsage]) -> dict[int, float]:
    """Each GPU's utilisation where it was read: a GPU whose utilisation is unread is
    left out, so that a run on it takes no sample (`Run.sample_gpus`): unknown is not
    idle."""
    return {u.index: u.util_pct for u in usage if u.util_read is not None}


# ---------------------------------------------------------------- the watch


class GpuWatch:
    """The GPU backend's owner (see the module's docstring). `period_s`: how often the
    thread reads the backend unasked (the agent gives its heartbeat interval)."""

    def __init__(self, backend: GpuBackend, period_s: float) -> None:
        self.backend = backend
        self.period_s = period_s
        self.threaded = bool(getattr(backend, "blocking", True))
        self.on_news: Callable[[], None] | None = None
        inventory = tuple(backend.inventory())  # start-up: see the module's docstring
        self._lock = threading.Lock()
        self._snapshot = GpuSnapshot(usage=tuple(GpuUsage(index=g.index, unread=list(GPU_FIGURES)) for g in inventory),
                                     inventory=inventory, taken_at=None)
        self._faults: list[GpuFault] = []
        self._clears: list[tuple[list[int], concurrent.futures.Future[list[int]]]] = []
        self._waiters: list[concurrent.futures.Future[GpuSnapshot]] = []
        self._busy: set[int] | None = None
        self._begun = 0  # rounds begun
        self._failing: set[str] = set()  # backend calls whose failure was logged
        self._wake = threading.Event()
        self._stopping = False
        self._closed = False
        self._thread: threading.Thread | None = None

    # -- what the loop calls (none of it waits on the backend when threaded)

    def snapshot(self) -> GpuSnapshot:
        with self._lock:
            return self._snapshot

    def current(self) -> GpuSnapshot:
        """The snapshot for a heartbeat: read now from a backend read in line; the thread's
        latest (started if it was not) otherwise."""
        if not self.threaded:
            self._round()
        else:
            self.start()
        return self.snapshot()

    def take_faults(self) -> list[GpuFault]:
        """The faults found since the last call; each is returned once."""
        with self._lock:
            faults, self._faults = self._faults, []
        return faults

    def set_busy(self, indices: set[int]) -> None:
        """Which GPUs run work, for a backend that simulates telemetry (`set_busy`); given
        to it at the next round."""
        with self._lock:
            self._busy = set(indices)

    def clear(self, indices: Collection[int]) -> concurrent.futures.Future[list[int]]:
        """Have the backend forget these GPUs' fault marks (an operator's clear), at the
        thread's next round (at once when read in line)."""
        done: concurrent.futures.Future[list[int]] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                done.set_result([])
                return done
            self._clears.append((sorted(set(indices)), done))
        self.poke()
        return done

    def poke(self) -> None:
        """Ask for a round now: run in line, or the thread woken."""
        if not self.threaded:
            self._round()
            return
        self.start()
        self._wake.set()

    async def fresh(self, timeout_s: float) -> GpuSnapshot:
        """The snapshot of a round begun after this call, waited for `timeout_s` at most;
        else the latest (logged)."""
        if not self.threaded:
            self._round()
            return self.snapshot()
        waiter: concurrent.futures.Future[GpuSnapshot] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                return self._snapshot
            self._waiters.append(waiter)
        self.poke()
        try:
            return await asyncio.wait_for(asyncio.wrap_future(waiter), timeout_s)
        except TimeoutError:
            snap = self.snapshot()
            age = snap.age(time.monotonic())
            log.warning("no GPU reading within %.1f s (an NVML call hangs?): going by the last one (%s)", timeout_s,
                        "none read yet" if age is None else f"{age:.1f} s old")
            return snap

    def start(self) -> None:
        """Start the thread (a backend read in line has none); once."""
        if not self.threaded:
            return
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._main, name="gpu-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop reading the backend. Read in line: it is closed now. Threaded: the thread
        is told to stop and closes it when it does (one that never ran is started only for
        that: a blocking backend's `close` is never made on the caller's thread); nobody
        waits (`aclose` does)."""
        begin = None
        with self._lock:
            if self._closed:
                return
            self._closed = self._stopping = True
            clears, self._clears = self._clears, []
            if self.threaded and self._thread is None:
                begin = self._thread = threading.Thread(target=self._main, name="gpu-watch", daemon=True)
        for _, done in clears:
            done.cancel()
        if not self.threaded:
            self._close_backend()
            return
        if begin is not None:
            begin.start()
        self._wake.set()

    async def aclose(self, timeout_s: float) -> bool:
        """`close`, then wait `timeout_s` at most for the thread to end. Whether it did (a
        thread stuck in an NVML call is left behind, a daemon, and said in the log)."""
        self.close()
        thread = self._thread
        if thread is None:
            return True
        deadline = time.monotonic() + timeout_s
        while thread.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        if thread.is_alive():
            log.error("the GPU watch did not stop within %.1f s (an NVML call hangs: a wedged driver?): "
                      "going on without it", timeout_s)
            return False
        return True

    @property
    def alive(self) -> bool:
        """Whether the thread runs now."""
        return self._thread is not None and self._thread.is_alive()

    # -- the backend's side

    def _main(self) -> None:
        while True:
            self._wake.clear()
            with self._lock:
                if self._stopping:
                    break
            try:
                self._round()
            except Exception:  # noqa: BLE001 - the watch goes on; its snapshot ages meanwhile
                log.exception("GPU watch round failed")
            self._wake.wait(self.period_s)
        self._close_backend()
        with self._lock:
            waiters, self._waiters = self._waiters, []
            snap = self._snapshot
        for w in waiters:
            if w.set_running_or_notify_cancel():
                w.set_result(snap)

    def _round(self) -> None:
        """One read of the backend: the clears asked for, the faults (handed over and
        marked at once), then the usage."""
        with self._lock:
            self._begun += 1
            number = self._begun
            clears, self._clears = self._clears, []
            waiters, self._waiters = self._waiters, []
            busy, self._busy = self._busy, None
        for indices, done in clears:
            cleared = self._call("clear_faults", self.backend.clear_faults, indices)
            log.info("GPU fault marks cleared: GPUs %s asked, %s marked", indices, cleared or "none")
            if done.set_running_or_notify_cancel():
                done.set_result(cleared or [])
        set_busy = getattr(self.backend, "set_busy", None)
        if busy is not None and set_busy is not None:
            self._call("set_busy", set_busy, busy)
        faults = self._call("poll_faults", self.backend.poll_faults) or []
        if faults:
            with self._lock:
                self._faults.extend(faults)
                self._snapshot = with_faults(self._snapshot, faults)
            self._tell()
        usage = self._call("usage", self.backend.usage)
        with self._lock:
            if usage is not None:
                self._snapshot = GpuSnapshot(usage=tuple(usage), inventory=self._snapshot.inventory,
                                             taken_at=time.monotonic(), number=number)
            snap = self._snapshot
        for w in waiters:
            if w.set_running_or_notify_cancel():
                w.set_result(snap)
        if clears:
            self._tell()

    def _call(self, what: str, fn: Callable[..., T], *args: object) -> T | None:
        """A backend call; an exception is logged (once a kind while it keeps failing) and
        gives None: one failing call never stops the watch."""
        try:
            out = fn(*args)
        except Exception as exc:  # noqa: BLE001 - the backend's trouble, not the watch's
            if what not in self._failing:
                self._failing.add(what)
                log.exception("GPU backend %s failed: %s", what, exc)
            return None
        self._failing.discard(what)
        return out

    def _tell(self) -> None:
        callback = self.on_news
        if callback is None:
            return
        try:
            callback()
        except Exception as exc:  # noqa: BLE001 - e.g. the agent's loop closed under it
            log.debug("GPU news not passed on: %s", exc)

    def _close_backend(self) -> None:
        self._call("close", self.backend.close)
