"""Byte budgets: what a KV record may grow to, so that no input can make the scheduler
write a record NATS refuses.

Every job record (`job.<id>`) and allocation record (`alloc.<host>`) stays within
`RECORD_BUDGET` bytes, under NATS's default 1 MiB payload limit with room for headers:

- A job's record grows with its attempts (at most `max_attempts` tries of `replicas`
  tasks each). The free text an attempt holds (its output tail and reason, which come
  from the job's own process) is clipped to a share of `TEXT_BUDGET_PER_JOB`, measured
  in bytes of its JSON encoding (a control character takes 6 bytes there). What cannot
  be clipped (ids, numbers, the spec) is bounded by `job_record_bound`; a job whose bound
  exceeds the budget is refused at submission (`check_spec`, code TOO_LARGE).
- A host's allocation record lists every task assigned to it, each with its command and
  environment; `task_record_bound` is one task's worst case, and placement puts no task
  on a host whose record it would push past the budget.

Pure: no I/O.
"""

from __future__ import annotations

import functools
import json

from pydantic_core import to_json

from wire.messages import RESERVED_HOSTS_KEPT, Attempt, AttemptState, Job, JobSpec, Reserved, Task

RECORD_BUDGET = 960 * 1024
TEXT_BUDGET_PER_JOB = 320 * 1024
TAIL_MAX = 4096  # bytes of an attempt's output tail, encoded, at most
REASON_MAX = 512  # bytes of an attempt's reason, encoded, at most
# Below these the share of a job's text budget is not cut further (the planner's own
# reasons, such as "host <id> lost while stopping", must always fit).
TAIL_MIN = 256
REASON_MIN = 160
CANCEL_REASON_MAX = 1024
HOLD_REASON_MAX = 256  # a held job's `hold` (who held it and why), encoded, at most
# What an operator's update may add to a record after its bound was worked out: the hold
# text, and a priority where the spec had the default (left out of the record).
UPDATE_SLACK = len(',"hold":""') + HOLD_REASON_MAX + len(',"priority":-1000')
STOP_REASON_MAX = 160  # a task's stop reason (the control plane's own words)
MAX_PREEMPTING = 64  # victims one preemption stops, at most (a job record lists them)
_PENDING_REASONS_BOUND = 1024  # a dozen fixed reason strings with counts
_JOB_ID = "j" * 64  # the longest job id
_HOST_ID = "h" * 63  # the longest host id
_LONG_NUMBER = 10**15
_LONG_TIME = 10_000_000_000.123456


def encoded_len(text: str) -> int:
    """Bytes `text` takes inside a JSON document as the records are written (UTF-8, with
    control characters escaped)."""
    return len(json.dumps(text, ensure_ascii=False).encode()) - 2


def clip_end(text: str, limit: int) -> str:
    """The longest tail of `text` whose encoding fits in `limit` bytes."""
    if len(text) * 6 <= limit or encoded_len(text) <= limit:
        return text
    s = text[-limit:]
    while (n := encoded_len(s)) > limit:
        s = s[max(1, (n - limit) // 6):]
    return s


def clip_start(text: str, limit: int) -> str:
    """The longest head of `text` whose encoding fits in `limit` bytes."""
    if len(text) * 6 <= limit or encoded_len(text) <= limit:
        return text
    s = text[:limit]
    while (n := encoded_len(s)) > limit:
        s = s[: len(s) - max(1, (n - limit) // 6)]
    return s


def attempts_bound(spec: JobSpec) -> int:
    """How many attempt entries a job's record can hold."""
    return spec.max_attempts * spec.replicas


def text_limits(spec: JobSpec) -> tuple[int, int]:
    """(output tail, reason) bytes one attempt of `spec` may keep, encoded."""
    share = TEXT_BUDGET_PER_JOB // attempts_bound(spec)
    tail = max(TAIL_MIN, min(TAIL_MAX, share * TAIL_MAX // (TAIL_MAX + REASON_MAX)))
    reason = max(REASON_MIN, min(REASON_MAX, share - tail))
    return tail, reason


@functools.lru_cache(maxsize=1024)
def _worst_attempt_bytes(max_attempts: int, replicas: int, gpus: int, shared: bool, mig: bool) -> int:
    """The encoded size of the largest attempt entry a job of this shape can hold (the
    same for every job of the shape: worked out once per shape)."""
    return len(Attempt(id=f"{_JOB_ID}.{max_attempts}.{replicas - 1}", number=max_attempts,
                       task=replicas - 1, host_id=_HOST_ID, gpu_indices=[63] * max(gpus, 1),
                       gpu_share=999 if shared else 0, mig=["u" * 96] if mig else [],
                       state=AttemptState.SUCCEEDED, term=_LONG_NUMBER, placed_at=_LONG_TIME,
                       started_at=_LONG_TIME, finished_at=_LONG_TIME, exit_code=-(2**31), stop_kind="preempt",
                       stop_at=_LONG_TIME, time_limit_s=_LONG_TIME, gpu_model="m" * 64,
                       gpu_util_pct=12.345678901234567).to_json())


def _spec_json_len(spec: JobSpec) -> int:
    """The bytes `spec` takes inside its job's record (Job.to_json leaves out defaults)."""
    return len(spec.__pydantic_serializer__.to_json(spec, exclude_defaults=True))


@functools.cache
def _job_frame_bytes() -> int:
    """The bytes of the largest attempt-less job record but for its spec's own: a job's
    record is this frame with the spec's JSON inside, so the two lengths add up."""
    spec = JobSpec(name="x", command=["x"])
    base = Job(id=_JOB_ID, spec=spec, submitted_at=_LONG_TIME, updated_at=_LONG_TIME, not_before=_LONG_TIME,
               preempting=[f"{_JOB_ID}:{_LONG_NUMBER}"] * MAX_PREEMPTING,
               reserved=Reserved(hosts=[_HOST_ID] * RESERVED_HOSTS_KEPT, host_count=_LONG_NUMBER, start=_LONG_TIME,
                                 since=_LONG_TIME))
    return len(base.to_json()) - _spec_json_len(spec)


def job_record_bound(spec: JobSpec) -> int:
    """The most bytes the record of a job with `spec` can take, every attempt at its
    largest (its free text clipped to `text_limits`). Worked out from lengths made once
    (the record's frame, the largest attempt of the job's shape) and the spec's JSON,
    not by building the record (each submission asks)."""
    tail, reason = text_limits(spec)
    per_attempt = _worst_attempt_bytes(spec.max_attempts, spec.replicas, spec.gpus, bool(spec.gpu_share),
                                       bool(spec.mig_profile)) + 1 + tail + reason
    return (_job_frame_bytes() + _spec_json_len(spec) + _PENDING_REASONS_BOUND + CANCEL_REASON_MAX + UPDATE_SLACK
            + _waiting_bytes(spec) + attempts_bound(spec) * per_attempt)


# A try older than the job's newest `max_attempts` (more tries come from preemptions,
# drains, shutdowns and requeues, which are not counted) keeps no output tail and a reason
# of at most this many bytes: what lets a job be preempted or requeued many times.
COMPACT_REASON_MAX = REASON_MIN
_MAX_TRY_NUMBER = 10**6  # a try number as long as a record's tries could make it


def compact_older(job: Job) -> None:
    """Drop the output tail and clip the reason of every try but the newest `max_attempts`."""
    oldest_kept = job.tries - job.spec.max_attempts
    for a in job.attempts:
        if a.number <= oldest_kept:
            a.output_tail = ""
            a.reason = clip_start(a.reason, COMPACT_REASON_MAX)


def tries_bound(spec: JobSpec) -> int:
    """How many tries a job's record holds within the budget: its newest `max_attempts`
    with their text (`job_record_bound`), older ones compacted (`compact_older`) in the
    room the budget leaves."""
    frame = _worst_attempt_bytes(_MAX_TRY_NUMBER, spec.replicas, spec.gpus, bool(spec.gpu_share),
                                 bool(spec.mig_profile))
    longer_numbers = attempts_bound(spec) * 2 * len(str(_MAX_TRY_NUMBER))  # the kept tries' ids and numbers grow
    room = RECORD_BUDGET - job_record_bound(spec) - longer_numbers
    return spec.max_attempts + max(0, room // (spec.replicas * (frame + 1 + COMPACT_REASON_MAX + 2)))


def _waiting_bytes(spec: JobSpec) -> int:
    """The most a record's `waiting_for` takes: the spec's dependencies, at most."""
    if not spec.depends_on:
        return 0
    return len(',"waiting_for":') + len(to_json(spec.depends_on))


_FRAME_COMMAND = ["x"]
_FRAME_ENV = {"k": "v"}
_FRAME_CWD = "c"


@functools.lru_cache(maxsize=1024)
def _task_frame_bytes(max_attempts: int, gpus: int, shared: bool, gpu_memory_mb: int, mig: bool, cpus: float,
                      memory_mb: int, has_env: bool, has_cwd: bool) -> int:
    """The bytes of the largest task of this shape but for its command's, env's and cwd's
    JSON (which a task's JSON holds as they are, so the lengths add up): made once per
    shape."""
    task = Task(attempt_id=f"{_JOB_ID}.{max_attempts}.255", job_id=_JOB_ID, number=max_attempts,
                command=_FRAME_COMMAND, env=_FRAME_ENV if has_env else {}, cwd=_FRAME_CWD if has_cwd else None,
                gpu_indices=[63] * max(gpus, 1), gpu_share=999 if shared else 0, gpu_memory_mb=gpu_memory_mb,
                mig=["u" * 96] if mig else [], cpus=cpus, memory_mb=memory_mb, term=_LONG_NUMBER, stop=True,
                keep_running=True, stop_reason="r" * STOP_REASON_MAX, grace_s=_LONG_TIME)
    n = len(task.compact_json()) - len(to_json(_FRAME_COMMAND))
    if has_env:
        n -= len(to_json(_FRAME_ENV))
    if has_cwd:
        n -= len(to_json(_FRAME_CWD))
    return n


def task_record_bound(spec: JobSpec) -> int:
    """The most bytes one task of `spec` takes in its host's allocation record."""
    env = dict(spec.env, MUSTER_GANG_TASK="255", MUSTER_GANG_SIZE="256",
               MUSTER_GANG_HOSTS=",".join([_HOST_ID] * spec.replicas)) if spec.replicas > 1 else spec.env
    n = _task_frame_bytes(spec.max_attempts, spec.gpus, bool(spec.gpu_share), spec.gpu_memory_mb,
                          bool(spec.mig_profile), spec.cpus, spec.memory_mb, bool(env), spec.cwd is not None)
    n += len(to_json(spec.command))
    if env:
        n += len(to_json(env))
    if spec.cwd is not None:
        n += len(to_json(spec.cwd))
    return n + 1


def task_bytes(spec: JobSpec) -> int:
    """`task_record_bound(spec)`, computed once per spec (placement asks for every host it
    considers)."""
    private = spec.__pydantic_private__
    assert private is not None
    n: int | None = private.get("_task_bytes")
    if n is None:
        n = private["_task_bytes"] = task_record_bound(spec)
    return n


# With a count of operators' clears for each of the 64 GPU indices a host may have.
_GPU_CLEARS = "{" + ",".join(f'"{i}":{_LONG_NUMBER}' for i in range(64)) + "}"
ALLOC_RECORD_OVERHEAD = len(f'{{"v":1,"host_id":"{_HOST_ID}","term":{_LONG_NUMBER},'
                            f'"gpu_clears":{_GPU_CLEARS},"tasks":[]}}')


def check_spec(spec: JobSpec) -> list[tuple[str, str]]:
    """(field, message) for each budget `spec` cannot keep; empty when its records fit."""
    problems: list[tuple[str, str]] = []
    job_bytes = job_record_bound(spec)
    if job_bytes > RECORD_BUDGET:
        problems.append(("maxAttempts", (
            f"the job's record could grow to {job_bytes:,} bytes ({spec.max_attempts} tries x {spec.replicas} "
            f"tasks, with its command and environment), {job_bytes - RECORD_BUDGET:,} bytes over the "
            f"{RECORD_BUDGET:,}-byte limit of a job record: fewer tries or tasks, or a smaller command and "
            f"environment")))
    elif spec.retry_failures and spec.max_attempts + spec.retry_failures > (most := tries_bound(spec)):
        problems.append(("retryFailures", (
            f"the job's record holds at most {most} tries ({spec.replicas} tasks each): {spec.max_attempts} "
            f"attempts and {spec.retry_failures} retries of failures would need more; ask for fewer")))
    assignment = task_bytes(spec) + ALLOC_RECORD_OVERHEAD
    if assignment > RECORD_BUDGET:
        problems.append(("env", (
            f"one task's assignment (its command and environment) takes {assignment:,} bytes, "
            f"{assignment - RECORD_BUDGET:,} bytes over the {RECORD_BUDGET:,}-byte limit of a host's "
            f"assignment record")))
    return problems
