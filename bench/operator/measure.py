"""Timing the requests: sequential, round-robin over the kinds, the first rounds untimed,
the server's CPU time read around each request; and a sampler of every process's CPU
time and RSS (for peak RSS) while the benchmark runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
import psutil

from bench.operator.queries import Req
from bench.processes import Child


class Sampler(threading.Thread):
    """Samples the processes' CPU time and RSS twice a second (for peak RSS)."""

    def __init__(self, children: list[Child]) -> None:
        super().__init__(name="operator-bench-sampler", daemon=True)
        self.children = children
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            for c in list(self.children):
                c.sample()


def measure(reqs: list[Req], console: httpx.Client, api: httpx.Client, server: psutil.Process | None,
            warmup: int, reps: int, progress: Callable[[str], None]) -> None:
    """Round-robin over the requests; the first `warmup` rounds are not counted."""
    for rnd in range(warmup + reps):
        for q in reqs:
            c0 = _cpu(server)
            t0 = time.perf_counter()
            if q.kind == "console":
                r = console.get(q.target)
            else:
                r = api.post("/graphql", json={"query": q.target, "variables": q.variables or {}})
            dt = time.perf_counter() - t0
            c1 = _cpu(server)
            err = q.check(r)
            if rnd >= warmup:
                q.times.append(dt)
                q.server_cpu.append(c1 - c0)
                q.ok += err is None
            if err is not None:
                q.failures += 1
                q.first_failure = q.first_failure or err
        if rnd + 1 == warmup or (rnd + 1 - warmup) % 5 == 0:
            progress(f"measure: round {rnd + 1} of {warmup + reps}")


def _cpu(p: psutil.Process | None) -> float:
    if p is None:
        return 0.0
    try:
        t = p.cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0
