"""The fairness scenario (`muster bench --tenants`, bench/fairness.py) at a small scale,
for correctness only: queues arriving in waves on a simulated fleet with reclaim between
them; no GPU is ever held twice (checked every cycle, preemptions included), no cohort
holds more than its pool, every job ends once. Its figures come from the benchmark
itself (docs/benchmarks.md), never from a test."""

from __future__ import annotations

import re

from bench.fairness import build_parser, simulate


def test_small_fairness_run_is_correct() -> None:
    args = build_parser().parse_args(["--tenants", "3", "--hosts", "6", "--rate", "20", "--wave", "3", "--gap", "10",
                                      "--tail", "25", "--mean-duration", "20", "--grace", "3", "--ckpt", "1"])
    rep = simulate(args)
    assert rep["correctness"] == {"ok": True, "violations": [], "ended_twice": [], "terminal_without_end_event": []}
    assert rep["jobs_submitted"] > 50 and rep["jobs_finished"] > 0
    # The run exercised what it checks: the later queues reclaimed from the first.
    assert rep["preemption"]["preempted_tries"] > 0
    # The breakdown names who took from whom and adds up to the totals.
    by = rep["preemption"]["by"]
    assert sum(v["tries"] for v in by.values()) == rep["preemption"]["preempted_tries"]
    assert abs(sum(v["gpu_s_lost"] for v in by.values()) - rep["preemption"]["gpu_s_lost"]) < 1
    for key in by:
        m = re.fullmatch(r"(reclaim|priority|fair-share) by (t\d) from (t\d)", key)
        assert m is not None, key
        assert (m.group(2) == m.group(3)) == (m.group(1) == "priority"), key  # reclaim takes from others
    assert set(rep["time_to_90pct_entitled_s"]) == {"t0", "t1", "t2"}
