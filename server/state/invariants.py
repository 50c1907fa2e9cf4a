"""The invariants, checked from the recorded history: pure code over job records.

Every attempt records its host, GPUs (and its share of one GPU, or its MIG instances),
term and when it was placed and ended, so the allocation history can be replayed: at no
moment may a host hold more GPUs, CPU or memory than it has, nor one GPU twice; a shared
GPU never holds more than 1000 thousandths (integers: no rounding) nor more GPU memory
than it has, and is never also held whole; a MIG instance is never held twice. Also: a job has at most one live attempt,
attempt numbers run 1, 2, 3 ..., terms never go backwards, a SUCCEEDED job has exactly
one successful try (every task of a gang), a gang's try has all its tasks, and every
allocation record matches its live attempts.

Replaying needs one clock for placement (the leader's) and ending (the agent's or the
leader's); that holds for processes on one machine and for hosts with synced clocks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from wire.messages import AttemptState, HostAlloc, Job, JobState

EPS = 1e-6


@dataclass(frozen=True)
class Capacity:
    gpus: int
    cpus: float
    memory_mb: int
    gpu_memory_mb: dict[int, int] = field(default_factory=dict)  # GPU index -> MB (for shares)
    # The MIG instances the host reports: uuid -> the GPU it is on.
    mig: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Hold:
    """What one task holds: whole GPUs, or `share` thousandths and `gpu_memory_mb` of the
    one GPU in `gpus`, or MIG instances."""

    gpus: tuple[int, ...]
    share: int = 0
    gpu_memory_mb: int = 0
    mig: tuple[str, ...] = ()


def gpu_problems(holds: Iterable[Hold], cap: Capacity | None) -> list[str]:
    """Overcommit of GPUs among `holds`, held at once on one host: a GPU held whole twice,
    held whole and shared, shared past 1000 thousandths or past its memory; a MIG
    instance held twice or unknown to the host, or held while its GPU is held whole or
    shared; a GPU index beyond the host's."""
    problems: list[str] = []
    whole: defaultdict[int, int] = defaultdict(int)
    share: defaultdict[int, int] = defaultdict(int)
    mem: defaultdict[int, int] = defaultdict(int)
    mig: defaultdict[str, int] = defaultdict(int)
    for h in holds:
        for g in h.gpus:
            if h.share:
                share[g] += h.share
                mem[g] += h.gpu_memory_mb
            else:
                whole[g] += 1
        for u in h.mig:
            mig[u] += 1
    held = [g for g, n in whole.items() for _ in range(n)]
    if len(held) != len(set(held)):
        problems.append(f"a GPU held twice {sorted(held)}")
    for g in sorted(share):
        if whole.get(g):
            problems.append(f"GPU {g} held whole and shared")
        if share[g] > 1000:
            problems.append(f"GPU {g} shared {share[g]}/1000")
        if cap is not None and cap.gpu_memory_mb and mem[g] > cap.gpu_memory_mb.get(g, 0):
            problems.append(f"GPU {g} gives its shares {mem[g]} MB of {cap.gpu_memory_mb.get(g, 0)} MB")
    twice = sorted(u for u, n in mig.items() if n > 1)
    if twice:
        problems.append(f"MIG instances held twice {twice}")
    if cap is not None:
        gpus = set(whole) | set(share)
        if len(gpus) > cap.gpus or any(g >= cap.gpus for g in gpus):
            problems.append(f"GPUs {sorted(gpus)} beyond {cap.gpus}")
        unknown = sorted(u for u in mig if u not in cap.mig)
        if unknown:
            problems.append(f"MIG instances {unknown} not on the host")
        for u in sorted(mig):
            parent = cap.mig.get(u)
            if parent is not None and parent in gpus:
                how = "whole" if whole.get(parent) else "shared"
                problems.append(f"GPU {parent} held {how} and through its MIG instance {u}")
    return problems


def check(
    jobs: Iterable[Job],
    capacity: dict[str, Capacity],
    allocs: Iterable[HostAlloc] = (),
    current_term: int | None = None,
) -> list[str]:
    """Every violation found, as a sentence; an empty list means all invariants hold."""
    problems: list[str] = []
    jobs = list(jobs)
    allocs = list(allocs)
    told_to_stop = {t.attempt_id for a in allocs for t in a.tasks if t.stop}
    # (host) -> list of (start, end, GPUs held, cpus, mem, attempt id)
    spans: dict[str, list[tuple[float, float, Hold, float, int, str]]] = defaultdict(list)
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
        # An ended job's attempt still stopping (a cancel's or a time limit's grace: `Job.stopping`)
        # is the normal course; one not told to stop is not. (A cancel's stop kind, "cancel",
        # is set with the stop mark it needs: it excuses nothing.)
        unstopped = [a for a in live if a.stop_kind in ("", "cancel") and a.id not in told_to_stop]
        if job.state.terminal and unstopped:
            problems.append(f"job {job.id} is {job.state.value} with live attempt {unstopped[0].id} not told to stop")
        terms = [a.term for a in job.attempts]
        if terms != sorted(terms):
            problems.append(f"job {job.id}: attempt terms go backwards {terms}")
        if current_term is not None and any(t > current_term for t in terms):
            problems.append(f"job {job.id}: attempt term above the current term {current_term}")
        if job.state is JobState.SUCCEEDED:
            # Exactly one successful try, its last: every task of it succeeded, and no earlier
            # try's every task (a gang's task that succeeded in a try retried whole, another
            # of its tasks lost, is not a successful try: found by exploring).
            ok: defaultdict[int, int] = defaultdict(int)
            for a in job.attempts:
                if a.state is AttemptState.SUCCEEDED:
                    ok[a.number] += 1
            whole = sorted(n for n, k in ok.items() if k >= job.spec.replicas)
            if whole != [job.tries] or ok[job.tries] != job.spec.replicas:
                problems.append(f"job {job.id}: SUCCEEDED with successful tries {whole} (its last: {job.tries}), "
                                f"{ok[job.tries]} of {job.spec.replicas} tasks of the last succeeded")
        for a in job.attempts:
            end = a.finished_at if a.state.terminal and a.finished_at is not None else float("inf")
            hold = Hold(tuple(a.gpu_indices), a.gpu_share, job.spec.gpu_memory_mb if a.gpu_share else 0,
                        tuple(a.mig))
            spans[a.host_id].append((a.placed_at, end, hold, job.spec.cpus, job.spec.memory_mb, a.id))
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
            # The host's capacity is what it reports now: it holds for moments a live try
            # is among, not for the past alone (found by exploring: a host restarted with
            # fewer GPUs had every finished try of before it called a violation).
            now_cap = cap if any(items[j][1] == float("inf") for j in active) else None
            problems += [f"host {host_id} at {t:.3f}: {p}" for p in gpu_problems((items[j][2] for j in active),
                                                                                   now_cap)]
            if now_cap is not None:
                if sum(items[j][3] for j in active) > now_cap.cpus + EPS:
                    problems.append(f"host {host_id} at {t:.3f}: CPU over {now_cap.cpus}")
                if sum(items[j][4] for j in active) > now_cap.memory_mb:
                    problems.append(f"host {host_id} at {t:.3f}: memory over {now_cap.memory_mb}")
    seen_tasks: dict[str, str] = {}
    for alloc in allocs:
        for task in alloc.tasks:
            if task.attempt_id in seen_tasks:
                problems.append(f"attempt {task.attempt_id} allocated on {seen_tasks[task.attempt_id]} "
                                f"and {alloc.host_id}")
            seen_tasks[task.attempt_id] = alloc.host_id
        cap = capacity.get(alloc.host_id)
        holds = [Hold(tuple(t.gpu_indices), t.gpu_share, t.gpu_memory_mb if t.gpu_share else 0, tuple(t.mig))
                 for t in alloc.tasks]
        problems += [f"allocation of {alloc.host_id}: {p}" for p in gpu_problems(holds, cap)]
        if cap is not None and (sum(task.cpus for task in alloc.tasks) > cap.cpus + EPS
                                or sum(task.memory_mb for task in alloc.tasks) > cap.memory_mb):
            problems.append(f"allocation of {alloc.host_id} exceeds its capacity")
    for attempt_id, host_id in live_by_attempt.items():
        if seen_tasks and seen_tasks.get(attempt_id) != host_id:
            problems.append(f"live attempt {attempt_id} has no allocation on {host_id}")
    return problems
