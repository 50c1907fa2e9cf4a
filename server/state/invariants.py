"""The invariants, checked from the recorded history: pure code over job records.

Every attempt records its host, GPUs, term and when it was placed and ended, so the
allocation history can be replayed: at no moment may a host hold more GPUs, CPU or
memory than it has, nor one GPU twice. Also: a job has at most one live attempt,
attempt numbers run 1, 2, 3 ..., terms never go backwards, a SUCCEEDED job has exactly
one successful try (every task of a gang), a gang's try has all its tasks, and every
allocation record matches its live attempts.

Replaying needs one clock for placement (the leader's) and ending (the agent's or the
leader's); that holds for processes on one machine and for hosts with synced clocks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from wire.messages import AttemptState, HostAlloc, Job, JobState

EPS = 1e-6


@dataclass(frozen=True)
class Capacity:
    gpus: int
    cpus: float
    memory_mb: int


def check(
    jobs: Iterable[Job],
    capacity: dict[str, Capacity],
    allocs: Iterable[HostAlloc] = (),
    current_term: int | None = None,
) -> list[str]:
    """Every violation found, as a sentence; an empty list means all invariants hold."""
    problems: list[str] = []
    jobs = list(jobs)
    # (host) -> list of (start, end, gpus, cpus, mem, attempt id)
    spans: dict[str, list[tuple[float, float, list[int], float, int, str]]] = defaultdict(list)
    live_by_attempt: dict[str, str] = {}
    for job in jobs:
        tries = sorted({a.number for a in job.attempts})
        if tries != list(range(1, len(tries) + 1)):
            problems.append(f"job {job.id}: attempt numbers {tries}")
        for n in tries:
            tasks = sorted(a.task for a in job.attempts if a.number == n)
            if tasks != list(range(job.spec.replicas)):
                problems.append(f"job {job.id}: try {n} has tasks {tasks}, not all {job.spec.replicas} of the gang")
        live = [a for a in job.attempts if not a.state.terminal]
        if len(live) > job.spec.replicas or any(a.number != job.tries for a in live):
            problems.append(f"job {job.id}: {len(live)} live attempts {[a.id for a in live]}")
        if job.state.terminal and live:
            problems.append(f"job {job.id} is {job.state.value} with live attempt {live[0].id}")
        terms = [a.term for a in job.attempts]
        if terms != sorted(terms):
            problems.append(f"job {job.id}: attempt terms go backwards {terms}")
        if current_term is not None and any(t > current_term for t in terms):
            problems.append(f"job {job.id}: attempt term above the current term {current_term}")
        if job.state is JobState.SUCCEEDED:
            ok = [a for a in job.attempts if a.state is AttemptState.SUCCEEDED]
            if len(ok) != job.spec.replicas or any(a.number != job.tries for a in ok):
                problems.append(f"job {job.id}: SUCCEEDED with {len(ok)} successful attempts")
        for a in job.attempts:
            end = a.finished_at if a.state.terminal and a.finished_at is not None else float("inf")
            spans[a.host_id].append((a.placed_at, end, a.gpu_indices, job.spec.cpus, job.spec.memory_mb, a.id))
            if not a.state.terminal:
                live_by_attempt[a.id] = a.host_id
    for host_id, items in spans.items():
        cap = capacity.get(host_id)
        events: list[tuple[float, int, int]] = []
        for i, (start, end, *_rest) in enumerate(items):
            events.append((start, 1, i))
            if end != float("inf"):
                events.append((end, 0, i))
        events.sort()
        active: set[int] = set()
        for t, kind, i in events:
            if kind == 0:
                active.discard(i)
                continue
            active.add(i)
            gpus = [g for j in active for g in items[j][2]]
            if len(gpus) != len(set(gpus)):
                problems.append(f"host {host_id} at {t:.3f}: a GPU held twice {sorted(gpus)}")
            if cap is not None:
                if len(gpus) > cap.gpus or any(g >= cap.gpus for g in gpus):
                    problems.append(f"host {host_id} at {t:.3f}: GPUs {sorted(gpus)} beyond {cap.gpus}")
                if sum(items[j][3] for j in active) > cap.cpus + EPS:
                    problems.append(f"host {host_id} at {t:.3f}: CPU over {cap.cpus}")
                if sum(items[j][4] for j in active) > cap.memory_mb:
                    problems.append(f"host {host_id} at {t:.3f}: memory over {cap.memory_mb}")
    seen_tasks: dict[str, str] = {}
    for alloc in allocs:
        for task in alloc.tasks:
            if task.attempt_id in seen_tasks:
                problems.append(f"attempt {task.attempt_id} allocated on {seen_tasks[task.attempt_id]} "
                                f"and {alloc.host_id}")
            seen_tasks[task.attempt_id] = alloc.host_id
        gpus = [g for task in alloc.tasks for g in task.gpu_indices]
        if len(gpus) != len(set(gpus)):
            problems.append(f"allocation of {alloc.host_id} holds a GPU twice")
        cap = capacity.get(alloc.host_id)
        if cap is not None and (len(gpus) > cap.gpus or sum(task.cpus for task in alloc.tasks) > cap.cpus + EPS
                                or sum(task.memory_mb for task in alloc.tasks) > cap.memory_mb):
            problems.append(f"allocation of {alloc.host_id} exceeds its capacity")
    for attempt_id, host_id in live_by_attempt.items():
        if seen_tasks and seen_tasks.get(attempt_id) != host_id:
            problems.append(f"live attempt {attempt_id} has no allocation on {host_id}")
    return problems
