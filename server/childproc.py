"""The server's helper processes (historian, heartbeat ingest): how each one runs and
stops. A helper names itself (`ps` shows `muster-history`, `muster-ingest`), stops
cleanly on SIGTERM or SIGINT, and does not outlive the server: when its parent is gone
(kill -9) it stops by itself within a second, and is ended ORPHAN_EXIT_S later if it has
not. The server starts a helper that died
again (HelperProcess.run)."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Awaitable, Callable

from wire.stopping import pause

log = logging.getLogger(__name__)


def run_helper(name: str, body: Callable[[asyncio.Event], Awaitable[None]], nice: int = 0) -> None:
    """Process entry point: set up logging, take `name`, add `nice`, then run
    `body(stop)` until it returns; `stop` is set by SIGTERM/SIGINT or the parent's end."""
    from wire.logs import name_this_process, setup

    setup()
    name_this_process(name)
    if nice:
        try:
            os.nice(nice)
        except OSError:
            pass

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        _watch_parent(name, os.getppid(), lambda: loop.call_soon_threadsafe(stop.set))
        await body(stop)

    asyncio.run(go())


ORPHAN_EXIT_S = 10.0  # how long a helper whose server is gone has to stop before it is ended


def _watch_parent(name: str, parent: int, stop: Callable[[], object]) -> None:
    """Once the server is gone: `stop` (the helper finishes what it holds), and
    ORPHAN_EXIT_S later, if it still runs, end it, whatever its event loop is doing. A
    thread of its own (found in a test run: an ingest whose server was killed -9 sat
    blocked, ignoring SIGTERM, for good; a look from its own loop never ran)."""
    import threading

    def look() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        log.warning("%s: server process gone; stopping", name)
        try:
            stop()
        except RuntimeError:  # (its loop over already: the process is ending)
            return
        time.sleep(ORPHAN_EXIT_S)
        log.warning("%s: server process gone and this one still running; ending it", name)
        os._exit(1)

    threading.Thread(target=look, name="orphan-exit", daemon=True).start()


def stop_helper(proc: multiprocessing.process.BaseProcess | None, timeout: float) -> None:
    """SIGTERM (the helper finishes what it holds), then SIGKILL after `timeout`."""
    if proc is None or not proc.is_alive():
        return
    proc.terminate()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join(5)


class HelperProcess:
    """A helper process the server starts beside itself, starts again whenever it has
    died, and stops. Subclasses say how it starts (`start`, which sets `proc`)."""

    label = "helper"  # for the log

    def __init__(self) -> None:
        self.proc: multiprocessing.process.BaseProcess | None = None
        self.restarts = 0
        self._stopping = False
        self._deaths: list[float] = []  # when the process was last found dead

    def start(self) -> None:
        raise NotImplementedError

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def restarted(self) -> None:
        """Called after each restart (a metric, say)."""

    def _join(self) -> None:
        if self.proc is not None:
            self.proc.join(5)

    async def run(self, stop: asyncio.Event, check_s: float = 0.5) -> None:
        """Start the process again whenever it has died, until `stop`. Backs off when it
        keeps dying (NATS refusing it, say): 0.5 s after the first death in a minute,
        doubling up to 30 s."""
        while not stop.is_set():
            await pause(stop, check_s)
            if stop.is_set() or self._stopping:
                return
            if self.alive:
                continue
            now = time.monotonic()
            self._deaths = [t for t in self._deaths if now - t < 60] + [now]
            delay = min(30.0, 0.5 * 2 ** (len(self._deaths) - 1))
            code = self.proc.exitcode if self.proc is not None else None
            log.warning("%s process exited (code %s); restarting it in %.1f s", self.label, code, delay)
            await asyncio.to_thread(self._join)
            if await pause(stop, delay):
                return
            if self._stopping:
                return
            self.restarts += 1
            self.restarted()
            self.start()

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM the process and wait for it (blocking); no restart after this."""
        self._stopping = True
        stop_helper(self.proc, timeout)
        self.proc = None
