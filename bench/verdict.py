"""How one submitted job reached the simulated hosts: `judge` checks a job's arrivals
(each first sighting of an attempt on a host) for dispatch exactly once, all-or-nothing
gangs, gang tasks on distinct hosts, and retries only after the host the benchmark killed.

A gang (a trace job of more than 8 GPUs) is one job of `replicas` tasks. It counts as
dispatched when every task of one try has reached a host; its dispatch latency is that
moment minus its submit time, counted once per gang."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Verdict:
    """How one submitted job (single or gang) reached the simulated hosts."""

    dispatched_at: float | None = None  # when the last task of its first complete try arrived
    tasks_seen: int = 0  # distinct task indices that reached a host, over all tries
    tries: int = 0
    twice: bool = False  # an attempt or a task reached hosts more than once, or a retry without cause
    retried_after_fence: bool = False  # a later try came after its simulator fenced the one before
    partial: bool = False  # a try of which some tasks reached hosts and others never did
    shared_host: bool = False  # two tasks of one try on one host, where they cannot both fit
    problems: list[str] = field(default_factory=list)


def attempt_id(job_id: str, number: int, task: int, replicas: int) -> str:
    """The server's attempt id (server/scheduling/cycle/placing.py): `<job>.<try>`, or
    `<job>.<try>.<task>` in a gang."""
    return f"{job_id}.{number}.{task}" if replicas > 1 else f"{job_id}.{number}"


def try_number(job_id: str, aid: str) -> int:
    """The try an attempt id belongs to (0 if it is not one of this job's)."""
    try:
        return int(aid[len(job_id) + 1:].split(".")[0]) if aid.startswith(job_id + ".") else 0
    except ValueError:
        return 0


def judge(job_id: str, replicas: int, arrivals: list[tuple[str, str, float, int]], placed: dict[str, str],
          lost_host: str | None, exclusive: bool, ended: dict[str, str] | None = None,
          fenced: dict[str, float] | None = None, host_ends: dict[str, list] | None = None) -> Verdict:
    """Check one job's arrivals: (attempt id, host, wall time, task index) for each first
    sighting of an attempt on a host. `placed` maps attempt id -> host from the job's
    records (may be empty), `lost_host` is the host the benchmark killed, and `exclusive`
    says a gang's tasks cannot share a host (each needs more than half of the largest).
    `ended` maps attempt id -> "STATE: reason" from the job's records; it only explains
    problems. `fenced` maps attempt id -> when a simulator stopped it by fencing itself,
    and `host_ends` attempt id -> [state, when, when its report was stored or None] as
    its host saw it end; it too only explains problems.

    All-or-nothing: every try that reached any host reached it with all `replicas` tasks,
    unless the missing tasks were placed on the killed host (which ignores assignments).
    A later try is right only when the one before touched the killed host, or when every
    attempt of the one before that reached a host had been stopped by its host's fence
    (as an agent fences itself when its heartbeats are not stored) before the later try
    first reached a host."""
    v = Verdict()
    by_attempt: dict[str, list[tuple[str, float, int]]] = defaultdict(list)
    for aid, host, ts, task in arrivals:
        by_attempt[aid].append((host, ts, task))
    tries: dict[int, dict[int, list[tuple[str, float]]]] = defaultdict(lambda: defaultdict(list))
    for aid, seen in by_attempt.items():
        if len(seen) > 1:
            v.twice = True
            v.problems.append(f"attempt {aid} reached hosts {len(seen)} times ({sorted(h for h, _, _ in seen)})")
        host, ts, task = min(seen, key=lambda x: x[1])
        tries[try_number(job_id, aid)][task].append((host, ts))
    v.tries = len(tries)
    want = set(range(replicas))
    v.tasks_seen = len({t for tasks in tries.values() for t in tasks} & want)
    for number in sorted(tries):
        tasks = tries[number]
        if set(tasks) - want:
            v.twice = True
            v.problems.append(f"try {number}: task indices {sorted(set(tasks) - want)} outside 0..{replicas - 1}")
        for t, hs in tasks.items():
            if len(hs) > 1:
                v.twice = True
                v.problems.append(f"try {number}: task {t} dispatched {len(hs)} times")
        hosts = [h for hs in tasks.values() for h, _ in hs]
        if exclusive and len(set(hosts)) < len(hosts):
            v.shared_host = True
            v.problems.append(f"try {number}: {len(hosts)} tasks on only {len(set(hosts))} hosts")
        missing = want - set(tasks)
        if not missing:
            if v.dispatched_at is None:
                v.dispatched_at = max(ts for hs in tasks.values() for _, ts in hs)
        elif not (lost_host and all(placed.get(attempt_id(job_id, number, i, replicas)) == lost_host
                                    for i in missing)):
            v.partial = True
            v.problems.append(f"try {number}: {len(want & set(tasks))} of {replicas} tasks dispatched")
    numbers = sorted(tries)
    for number, after in zip(numbers, numbers[1:], strict=False):
        touched = {h for hs in tries[number].values() for h, _ in hs}
        touched |= {h for aid, h in placed.items() if try_number(job_id, aid) == number}
        if lost_host is not None and lost_host in touched:
            continue
        next_at = min(ts for hs in tries[after].values() for _, ts in hs)
        reached = [aid for aid in by_attempt if try_number(job_id, aid) == number]
        if all((fenced or {}).get(aid, float("inf")) <= next_at for aid in reached):
            v.retried_after_fence = True
            continue
        v.twice = True
        how = "; ".join(f"{aid} on {placed.get(aid, '?')} ended {e}{_on_host(aid, host_ends, next_at)}"
                        for aid, e in sorted((ended or {}).items()) if try_number(job_id, aid) == number)
        v.problems.append(f"try {number} of {len(tries)} that reached hosts: a later one came though it neither "
                          f"touched the killed host nor was fenced" + (f" ({how})" if how else ""))
    return v


def _on_host(aid: str, host_ends: dict[str, list] | None, retry_at: float) -> str:
    """How the attempt ended on its host, in seconds before (-) or after the retry reached one."""
    end = (host_ends or {}).get(aid)
    if not end:
        return ", on its host: not ended"
    state, at, stored = end
    said = "its report not stored" if stored is None else f"its report stored at {stored - retry_at:+.1f} s"
    return f", on its host: {state} at {at - retry_at:+.1f} s, {said} (from the retry's arrival)"


def undispatched(never: list[str], jobs: dict[str, dict[str, Any]], waiting: set[str] | frozenset[str] = frozenset(),
                 ) -> tuple[list[str], list[str], list[str], list[str]]:
    """Of the jobs never dispatched: those queued when the run ended, as the observer read
    their records; those whose submissions still waited in the SUBMIT stream then
    (`waiting`: stored and acknowledged, not yet taken in by the leader), both the
    backlog of a run the machine could not keep up with; those placed (or running) whose
    assignment no simulated host had seen; and the rest, lost: no record of them and no
    submission waiting, or a record that ended otherwise."""
    state = {j: (jobs.get(j) or {}).get("state") for j in never}
    queued = [j for j in never if state[j] == "QUEUED"]
    in_stream = [j for j in never if j not in jobs and j in waiting]
    placed = [j for j in never if state[j] in ("PLACED", "RUNNING")]
    return queued, in_stream, placed, sorted(set(never) - set(queued) - set(in_stream) - set(placed))
