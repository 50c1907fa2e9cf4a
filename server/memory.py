"""The garbage collector's policy in a server process.

A server holds its whole view of the cluster in memory: at 50,000 hosts and tens of
thousands of jobs, millions of long-lived objects. CPython's full collection walks every
one of them and, here, finds next to nothing to free: measured in `muster bench` at
50,000 hosts, full collections took 0.6 s growing to 6.7 s, every few seconds, and freed
0 to 2,874 objects, while holding the GIL (the event loop and the lease thread stood
still, longer than the lease itself).

So objects that survive are moved out of the collector's sight (`gc.freeze`) once the
state is loaded and then every `every_s` (2 s). Reference counting still frees a frozen object
when the last reference to it goes (almost everything here: replaced jobs, allocations,
heartbeats); only reference cycles among frozen objects would stay, and the collector
found almost none. Young objects are collected (generations 0 and 1) before each freeze
so fresh garbage is not frozen with them. `muster_gc_pause_seconds` shows the effect.

What it costs: an object alive at a freeze that later dies in a reference cycle is never
freed (found by exploring: a request in flight at a freeze, about 2 % of them, left its
library objects behind, about 1.6 KB/s under a modest console and API load). Muster's own
objects are kept out of cycles; docs/architecture.md says what an operator does about
the rest.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any

from wire.stopping import pause


def freeze_survivors() -> None:
    """Collect the young generations, then freeze everything left (O(1); counting the
    frozen objects, `gc.get_freeze_count()`, walks them all: measured at a quarter of
    the server's loop when done every 2 s, so it is not)."""
    gc.collect(1)
    gc.freeze()


async def keep_frozen(stop: asyncio.Event, every_s: float = 2.0) -> None:
    """Freeze the survivors every `every_s` until `stop`."""
    while not stop.is_set():
        if not await pause(stop, every_s):
            freeze_survivors()


def on_collection(report: Callable[[float, dict[str, Any]], None]) -> Callable[[str, dict[str, Any]], None]:
    """Time every garbage collection of this process: `report(seconds, info)` after each
    one (`info` as gc.callbacks get it: generation, collected, ...). Returns the callback
    it added to `gc.callbacks`."""
    started = [0.0]

    def cb(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        report(time.perf_counter() - started[0], info)

    gc.callbacks.append(cb)
    return cb
