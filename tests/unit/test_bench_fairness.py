"""The fairness scenario (`muster bench --tenants`, bench/fairness.py) at a small scale,
for correctness only: queues arriving in waves on a simulated fleet with reclaim between
them; no GPU is ever held twice (checked every cycle, preemptions included), no cohort
holds more than its pool, every job ends once. Its figures come from the benchmark
itself (docs/benchmarks.md), never from a test."""

from __future__ import annotations

import math
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
    # So does the split by when the stop came (within the goal window of the arrival, or later).
    window = rep["preemption"]["by_window"]
    assert sum(v["tries"] for v in window.values()) == rep["preemption"]["preempted_tries"]
    assert abs(sum(v["gpu_s_lost"] for v in window.values()) - rep["preemption"]["gpu_s_lost"]) < 1
    assert window["arrival"]["tries"] > 0  # the later queues reclaimed on arriving
    assert set(rep["time_to_90pct_entitled_s"]) == {"t0", "t1", "t2"}


def test_jobs_that_checkpoint_say_so_unless_told_not_to() -> None:
    """`--checkpointing` draws which jobs keep what they saved; they say so in their spec
    (`checkpoints`) unless `--checkpoints-unsaid`, and the same jobs are drawn either way.
    The report splits the loss by whether the stopped job kept a checkpoint."""
    base = ["--tenants", "3", "--hosts", "6", "--rate", "20", "--wave", "3", "--gap", "10", "--tail", "25",
            "--mean-duration", "20", "--grace", "3", "--ckpt", "1", "--checkpointing", "0.5"]
    said = simulate(build_parser().parse_args(base))
    unsaid = simulate(build_parser().parse_args([*base, "--checkpoints-unsaid"]))
    for rep in (said, unsaid):
        assert rep["correctness"]["ok"]
        p = rep["preemption"]
        assert sum(v["tries"] for v in p["by_checkpoint"].values()) == p["preempted_tries"]
        assert abs(sum(v["gpu_s_lost"] for v in p["by_checkpoint"].values()) - p["gpu_s_lost"]) < 1
    keeping = said["preemption"]["jobs_keeping_checkpoints"]
    assert keeping == unsaid["preemption"]["jobs_keeping_checkpoints"] > 0
    assert said["preemption"]["jobs_saying_they_checkpoint"] == keeping
    assert unsaid["preemption"]["jobs_saying_they_checkpoint"] == 0


def _step(sim, now: float) -> None:  # type: ignore[no-untyped-def]
    from server.scheduling.planner import QueuePolicy, plan_cycle

    plan = plan_cycle(sim.state, reports=sim.agent(now), commands=[], now=now, term=1, queues=QueuePolicy())
    sim.apply(plan)


def test_the_loss_lower_bound_takes_the_youngest_excess_of_the_lenders() -> None:
    """One host of 8 GPUs. t0 (nominal 3) borrows from t1's unused nominal 5 and holds 7
    in one-GPU jobs started at 1, 11 and 21 s; the 8th GPU stays free (t0 has no 8th
    job). t1 (nominal 5) arriving at 30 s needs 5 GPUs (90 % of 5, rounded up) within a
    grace of 10 s: one is free, none ends by itself, so 4 must be taken from t0's 4 above
    its nominal, the youngest: runtimes 9, 9, 19, 19."""
    from bench.fairness import Simulation
    from bench.workload import JobReq

    args = build_parser().parse_args(["--tenants", "2", "--hosts", "1", "--grace", "10"])
    sim = Simulation(args)
    sim.setup(0.0)
    assert [t.nominal for t in sim.tenants] == [3, 5]  # 8 GPUs by weights 1 and 2: 2.67 and 5.33, all owned
    n = 0
    for at, count in ((0.0, 2), (10.0, 3), (20.0, 2)):
        for _ in range(count):
            sim.submit(at, "t0", JobReq(name="j", gpus=1, cpus=1, memory_mb=1024, duration_s=1000), n)
            n += 1
        _step(sim, at)  # placed
        _step(sim, at + 1)  # reported running: started at + 1
    assert sorted(a.started_at for j in sim.state.jobs.values() for a in j.attempts) == [1, 1, 11, 11, 11, 21, 21]
    bound = sim.loss_lower_bound("t1", 5, 30.0)
    assert bound == {"gpus_to_take": 4, "gpus_takeable": 4, "gpu_s": 9 * 2 + 19 * 2}
    # A job that ends by itself within the grace frees its GPU without loss.
    first = next(j for j in sim.state.jobs.values() if j.attempts[0].started_at == 21)
    sim.durations[first.id] = 15.0  # ends at 36 s
    assert sim.loss_lower_bound("t1", 5, 30.0) == {"gpus_to_take": 3, "gpus_takeable": 4, "gpu_s": 9 + 19 * 2}


def test_nominal_quotas_share_out_the_whole_fleet() -> None:
    """Floors by weight, then the GPUs they leave over to the largest remainders: no GPU
    is left that no queue owns, and no queue gets more than one above its floor."""
    from bench.fairness import Simulation

    for tenants, hosts in ((4, 200), (2, 1), (3, 6), (5, 7), (7, 3)):
        sim = Simulation(build_parser().parse_args(["--tenants", str(tenants), "--hosts", str(hosts)]))
        weights = [t.weight for t in sim.tenants]
        exact = [sim.total * w / sum(weights) for w in weights]
        assert sum(t.nominal for t in sim.tenants) == sim.total
        assert all(math.floor(x) <= t.nominal <= math.floor(x) + 1 for t, x in zip(sim.tenants, exact, strict=True))
    sim = Simulation(build_parser().parse_args(["--tenants", "4", "--hosts", "200"]))
    assert [t.nominal for t in sim.tenants] == [229, 457, 686, 228]  # 228.57, 457.14, 685.71, 228.57


def test_jobs_that_keep_checkpoints_lose_only_their_stop_to_exit_time() -> None:
    """The same small run with every job keeping its checkpoint: it is as correct, and each
    preempted try loses no more than the exit time (--ckpt) on each GPU it held."""
    args = build_parser().parse_args(["--tenants", "3", "--hosts", "6", "--rate", "20", "--wave", "3", "--gap", "10",
                                      "--tail", "25", "--mean-duration", "20", "--grace", "3", "--ckpt", "1",
                                      "--checkpointing", "1"])
    rep = simulate(args)
    assert rep["correctness"]["ok"], rep["correctness"]
    p = rep["preemption"]
    assert p["preempted_tries"] > 0 and p["jobs_keeping_checkpoints"] == rep["jobs_submitted"]
    for key, v in p["by"].items():
        assert v["gpu_s_lost"] <= v["gpus"] * (1.0 + args.cycle) + 1e-6, (key, v)


def test_idle_gpus_counts_only_free_gpus_a_waiting_job_would_fit() -> None:
    """The benchmark's idle figure: whole GPUs free on a host where some waiting job
    passes placement's check (its CPUs too; a gang on as many such hosts as it has
    tasks); GPUs free where none fits are stranded, not idle; reserved hosts apart."""
    from bench.fairness import idle_gpus
    from tests.factories import job, job_spec
    from tests.unit.test_planner import World
    from wire.messages import Job

    w = World()
    w.host("h1", gpus=4, cpus=64)
    w.host("h2", gpus=4, cpus=64)
    w.host("h3", gpus=4, cpus=4)
    w.submit("big", gpus=3, cpus=60)
    w.cycle()
    assert [t.job_id for t in w.tasks("h1")] == ["big"]  # h1: 1 GPU and 4 CPUs free

    def waiting(name: str, **fields: object) -> Job:
        return job(name, spec=job_spec(name, **fields))

    eight_cpus = waiting("cpu8", gpus=1, cpus=8)  # fits h2 only
    gang = waiting("gang", gpus=4, cpus=8, replicas=2)  # one task fits h2 only: not the gang
    assert idle_gpus(w.state, [eight_cpus, gang], set()) == (4, 0)
    assert idle_gpus(w.state, [gang], set()) == (0, 0)
    assert idle_gpus(w.state, [eight_cpus], {"h2"}) == (0, 4)
    small = waiting("small", gpus=1, cpus=2)  # fits every host
    assert idle_gpus(w.state, [small, gang], set()) == (9, 0)
