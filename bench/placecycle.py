"""`python -m bench placer`: what placing one cycle's jobs costs, in process.

The leader's placement core (`capacity.Placer` with the default `fgd` policy) over a
capacity index of `--hosts` simulated hosts of 8 H100s, partly filled (seeded: a ninth
of them empty, the rest holding 2 to 8 GPUs' worth of work), and `--cycles` cycles that
each place the same `--jobs` jobs (1, 2, 4 or 8 GPUs, four CPUs and 16 GB per GPU) on a
fresh Placer, as the scheduler does each cycle. The fragmentation measure is that of the
jobs' own mix. No NATS, no processes: it isolates the cost of finding and scoring hosts,
which is most of a placing cycle.

With `--pinned N`, each cycle also tries N jobs pinned to a pool of hosts by a label
(`pool=p<i>`, JobSpec.host_labels), each pool one host in a thousand and every one of its
hosts full: jobs that wait for their pool, tried again every cycle. Each is a placement
that finds nothing.

Reports the time per cycle (p50, p99) and per placement, the jobs placed per cycle, and
checks that no copy of a host holds more than it has.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import Counter
from typing import Any

from bench.inprocess import run_and_report
from server.scheduling.capacity import CapacityIndex, Placer
from server.scheduling.fragmentation import Fragmentation, Shape, ShapeMix
from server.scheduling.placement import HostCapacity
from wire.messages import JobSpec

SIZES = (1, 1, 1, 2, 2, 4, 8)  # GPUs per job, as often as they appear
FILL = (0, 0, 2, 4, 6, 7, 8, 8, 8)  # GPUs held on a host at the start, as often as they appear


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench placer", description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=50_000, help="simulated hosts of 8 H100s")
    ap.add_argument("--jobs", type=int, default=50, help="jobs placed per cycle")
    ap.add_argument("--cycles", type=int, default=40, help="cycles timed (after 3 untimed)")
    ap.add_argument("--pinned", type=int, default=0,
                    help="jobs per cycle pinned by a label to a pool of full hosts (one in a thousand)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None, help="the report (default: bench/results/placer-<hosts>.json)")
    return ap


def job(gpus: int) -> JobSpec:
    return JobSpec(name=f"g{gpus}", command=["x"], gpus=gpus, cpus=4.0 * gpus, memory_mb=16_000 * gpus)


def fleet(hosts: int, rng: random.Random) -> CapacityIndex:
    index = CapacityIndex()
    for h in range(hosts):
        cap = HostCapacity(id=f"h{h:06d}", schedulable=True, cordoned=False, gpu_models={i: "H100" for i in range(8)},
                           unhealthy_gpus=frozenset(), cpus=96.0, memory_mb=1_024_000,
                           gpu_memory={i: 81_559 for i in range(8)})
        held = rng.choice(FILL)
        if held:
            cap.reserve(list(range(held)), 4.0 * held, 16_000 * held)
        index.put(cap)
    return index


def pin_pools(index: CapacityIndex, pools: int) -> list[JobSpec]:
    """Label every thousandth host `pool=p<i>` (i = 0 .. pools - 1 in turn), fill those
    hosts, and return one 1-GPU job pinned to each pool."""
    if not pools:
        return []
    for n, host_id in enumerate(sorted(index.caps)[::1000]):
        cap = index.caps[host_id]
        free = cap.free_gpus(None)
        if free:
            cap.reserve(free, 0.0, 0)
        cap.labels = {**cap.labels, "pool": f"p{n % pools}"}
        index.put(cap)
    return [job(1).model_copy(update={"name": f"pinned{i}", "host_labels": {"pool": f"p{i}"}})
            for i in range(pools)]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    index = fleet(args.hosts, rng)
    specs = [job(rng.choice(SIZES)) for _ in range(args.jobs)]
    specs += pin_pools(index, args.pinned)
    frag = Fragmentation(ShapeMix.of(Counter(Shape.of(job(g)) for g in SIZES)))
    overcommits: list[str] = []

    def cycle() -> int:
        placer = Placer(index, lambda host_id: True, fragmentation=frag)
        placed = 0
        for s in specs:
            choice = placer.place(s)
            if choice is not None:
                placer.reserve(choice, s)
                placed += 1
        for cap in placer.touched.values():
            if len(cap.used_gpus) > len(cap.gpu_models) or cap.used_cpus > cap.cpus + 1e-9 \
                    or cap.used_memory_mb > cap.memory_mb:
                overcommits.append(cap.id)
        return placed

    for _ in range(3):
        cycle()
    ms: list[float] = []
    placed: list[int] = []
    for _ in range(args.cycles):
        t0 = time.perf_counter()
        placed.append(cycle())
        ms.append((time.perf_counter() - t0) * 1000)
    ms.sort()
    per_cycle = statistics.median(ms)
    return {
        "scenario": "placer",
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "jobs_placed_per_cycle": statistics.median(placed),
        "cycle_ms": {"p50": round(per_cycle, 2), "p99": round(ms[max(0, int(len(ms) * 0.99) - 1)], 2),
                     "max": round(ms[-1], 2), "cycles": len(ms)},
        "placement_us_p50": round(per_cycle * 1000 / max(1, len(specs)), 1),
        "correctness": {"ok": not overcommits, "overcommitted_hosts": sorted(set(overcommits))[:10]},
    }


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    pinned = f"-pinned{args.pinned}" if args.pinned else ""
    return run_and_report("placer", argv, lambda: measure(args), args.json,
                          f"placer-{args.hosts // 1000}k{pinned}.json")
