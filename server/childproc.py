"""The server's helper processes (historian, heartbeat ingest): how each one runs and
stops. A helper names itself (`ps` shows `muster-history`, `muster-ingest`), stops
cleanly on SIGTERM or SIGINT, and does not outlive the server: when its parent is gone
(kill -9) it stops by itself within a second."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
from collections.abc import Awaitable, Callable

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
        parent = os.getppid()

        async def orphaned() -> None:
            while not stop.is_set():
                if os.getppid() != parent:
                    log.warning("%s: server process gone; stopping", name)
                    stop.set()
                await asyncio.sleep(1)

        watchdog = asyncio.create_task(orphaned())
        try:
            await body(stop)
        finally:
            watchdog.cancel()

    asyncio.run(go())


def stop_helper(proc: multiprocessing.process.BaseProcess | None, timeout: float) -> None:
    """SIGTERM (the helper finishes what it holds), then SIGKILL after `timeout`."""
    if proc is None or not proc.is_alive():
        return
    proc.terminate()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join(5)
