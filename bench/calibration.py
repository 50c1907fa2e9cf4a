"""How fast this machine runs Python right now, for comparing benchmark reports.

Every recorded figure comes from one 2-CPU virtual machine whose speed is not constant:
the same code, with the same command, has measured a p99 dispatch latency of 98 ms on
one day and seconds on another, where every process simply took longer for the same
work. A report therefore carries the time a fixed single-threaded pure-Python workload
took on its machine just before the run (the least of a few tries, so that a moment's
interruption does not count), and two reports are comparable only when those are close.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# What the workload is, named in every report that carries its time.
WORKLOAD = "sum of i * i % 7 for i in range(2,000,000), one thread, least of 5 tries"


def _work() -> int:
    total = 0
    for i in range(2_000_000):
        total += i * i % 7
    return total


def python_speed(tries: int = 5, clock: Callable[[], float] = time.perf_counter,
                 work: Callable[[], object] = _work) -> dict[str, Any]:
    """The least wall time of `tries` runs of the workload, in milliseconds."""
    best = float("inf")
    for _ in range(tries):
        t = clock()
        work()
        best = min(best, clock() - t)
    return {"python_workload_ms": round(best * 1000, 1), "workload": WORKLOAD}
