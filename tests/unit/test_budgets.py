"""Byte budgets (wire.budgets) and the isolation of refused inputs (server.scheduling.
isolation): pure code, with hypothesis properties."""

from __future__ import annotations

import json
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.scheduling.isolation import EVICTIONS, INPUT, PLACEMENT, Isolation
from server.scheduling.placement import RECORD_FULL, HostCapacity, check
from server.scheduling.planner import Plan, plan_cycle
from server.state.cluster import ClusterState
from wire.budgets import (
    _LONG_TIME,
    HOLD_REASON_MAX,
    RECORD_BUDGET,
    clip_end,
    clip_start,
    compact_older,
    encoded_len,
    job_record_bound,
    task_bytes,
    task_record_bound,
    text_limits,
    tries_bound,
)
from wire.errors import ValidationError
from wire.messages import Attempt, AttemptState, GpuInfo, Heartbeat, Job, JobSpec, JobState, StatusReport, encode
from wire.records import Record
from wire.validation import validate_job, validate_reason

# Text a job's process may print: control characters, quotes, backslashes, non-ASCII.
nasty = st.text(alphabet=st.sampled_from(["\x00", "\x01", "\x1b", "\n", '"', "\\", "é", "漢", "a", "😀"]),
                max_size=20000)


@given(text=nasty, limit=st.integers(min_value=1, max_value=8192))
@settings(max_examples=200, deadline=None)
def test_clipping_keeps_the_most_text_that_fits(text: str, limit: int) -> None:
    tail, head = clip_end(text, limit), clip_start(text, limit)
    assert text.endswith(tail) and text.startswith(head)
    assert encoded_len(tail) <= limit and encoded_len(head) <= limit
    # Maximal: one more character would not fit (or there is none).
    if len(tail) < len(text):
        assert encoded_len(text[-len(tail) - 1:]) > limit
    if len(head) < len(text):
        assert encoded_len(text[: len(head) + 1]) > limit


@given(replicas=st.integers(1, 256), tries=st.integers(1, 100), gpus=st.integers(0, 64),
       env_bytes=st.integers(0, 60000), command_bytes=st.integers(1, 60000))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_job_record_never_grows_past_its_bound(replicas: int, tries: int, gpus: int, env_bytes: int,
                                                 command_bytes: int) -> None:
    """Every attempt filled with the most text its limits allow, in the longest ids and
    numbers, still encodes within `job_record_bound`; and a spec validation accepts
    never has a bound past the budget."""
    spec = JobSpec(name="n" * 128, command=["\x01" * command_bytes], env={"E" * 8: "\x01" * env_bytes},
                   replicas=replicas, max_attempts=tries, gpus=gpus, cwd="/" + "d" * 4000)
    bound = job_record_bound(spec)
    tail, reason = text_limits(spec)
    n = min(tries * replicas, 3000)  # enough attempts to check the per-attempt bound
    attempts = [Attempt(id=f"{'j' * 64}.{t}.{i}", number=t, task=i, host_id="h" * 63, gpu_indices=[63] * gpus,
                        state=AttemptState.FAILED, term=10**15, placed_at=1e10, started_at=1e10, finished_at=1e10,
                        exit_code=-(2**31), output_tail=clip_end("\x01" * 9000, tail),
                        reason=clip_start("\x00" * 3000, reason))
                for t in range(1, tries + 1) for i in range(replicas)][:n]
    job = Job(id="j" * 64, spec=spec.model_copy(update={"priority": -1000}), state=JobState.FAILED,
              submitted_at=1e10, updated_at=1e10, attempts=attempts, cancel_reason=clip_start("\x00" * 9000, 1024),
              hold=clip_start("\x00" * 9000, HOLD_REASON_MAX),
              pending_reasons={"not enough free GPUs on host": 10**6, "host's assignment record is full": 10**6})
    per_attempt = (bound - len(Job(id="j" * 64, spec=spec, submitted_at=1e10, updated_at=1e10).to_json())) / (
        tries * replicas)
    assert len(job.to_json()) <= len(Job(id="j" * 64, spec=spec, submitted_at=1e10,
                                          updated_at=1e10).to_json()) + 2048 + n * per_attempt
    _spec, errors = validate_job(dict(name="x", command=["x"], replicas=replicas, max_attempts=tries, gpus=gpus))
    if errors:
        assert all(e.code == "TOO_LARGE" and "over" in e.message for e in errors)
    else:
        assert job_record_bound(_spec) <= RECORD_BUDGET  # type: ignore[arg-type]


@given(replicas=st.integers(1, 64), tries=st.integers(1, 20), gpus=st.integers(0, 64),
       env_bytes=st.integers(0, 60000))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_record_with_as_many_tries_as_it_holds_stays_within_the_budget(replicas: int, tries: int, gpus: int,
                                                                        env_bytes: int) -> None:
    """Preemptions, drains and requeues add tries beyond `max_attempts`: with the older
    ones compacted (`compact_older`), the most tries a record holds (`tries_bound`), every
    one at its largest, still encodes within the budget."""
    spec = JobSpec(name="n" * 128, command=["x"], env={"E" * 8: "\x01" * env_bytes}, replicas=replicas,
                   max_attempts=tries, gpus=gpus)
    if job_record_bound(spec) > RECORD_BUDGET:
        return  # refused at submission
    most = tries_bound(spec)
    assert most >= tries
    tail, reason = text_limits(spec)
    attempts = [Attempt(id=f"{'j' * 64}.{t}.{i}", number=t, task=i, host_id="h" * 63, gpu_indices=[63] * gpus,
                        state=AttemptState.PREEMPTED, term=10**15, placed_at=1e10, started_at=1e10,
                        finished_at=1e10, exit_code=-(2**31), stop_kind="preempt", stop_at=1e10, time_limit_s=1e10,
                        gpu_model="m" * 64, output_tail=clip_end("\x01" * 9000, tail),
                        reason=clip_start("\x00" * 3000, reason))
                for t in range(1, most + 1) for i in range(replicas)]
    job = Job(id="j" * 64, spec=spec.model_copy(update={"priority": -1000}), state=JobState.QUEUED,
              submitted_at=1e10, updated_at=1e10, not_before=1e10, attempts=attempts,
              cancel_reason=clip_start("\x00" * 9000, 1024), hold=clip_start("\x00" * 9000, HOLD_REASON_MAX),
              pending_reasons={"not enough free GPUs on host": 10**6, "host's assignment record is full": 10**6})
    compact_older(job)
    assert len(job.to_json()) <= RECORD_BUDGET
    assert all(not a.output_tail for a in job.attempts if a.number <= most - tries)
    assert all(a.output_tail for a in job.attempts if a.number > most - tries)


def test_a_job_requeued_past_what_its_record_holds_ends_failed_saying_so() -> None:
    from tests.unit.test_gangs import NOW, World
    from wire.messages import Command

    w = World()
    w.host("a")
    w.submit("requeued-a-lot", gpus=1, max_attempts=1)
    most = tries_bound(w.job("requeued-a-lot").spec)
    # Its record as all but its last two tries, each requeued, left it (compacted).
    ended = [Attempt(id=f"requeued-a-lot.{n}", number=n, host_id="a", gpu_indices=[0], state=AttemptState.KILLED,
                     stop_kind="requeue", placed_at=NOW, started_at=NOW, finished_at=NOW, reason="requeued by x")
             for n in range(1, most - 1)]
    grown = w.job("requeued-a-lot").model_copy(update={"attempts": ended})
    w.state.apply_state_record(Record("job.requeued-a-lot", next(w.rev), encode(grown)))
    for n in range(most - 1, most + 1):
        w.cycle()
        job = w.job("requeued-a-lot")
        assert job.state is JobState.PLACED and job.tries == n
        att = job.attempts[-1]
        plan = plan_cycle(w.state, reports=[], commands=[Command(kind="requeue", job_id=job.id)], now=NOW, term=1)
        for j in plan.jobs.values():
            w.state.apply_state_record(Record(f"job.{j.id}", next(w.rev), encode(j)))
        for alloc in plan.allocs.values():
            w.state.apply_state_record(Record(f"alloc.{alloc.host_id}", next(w.rev), encode(alloc)))
        w.cycle(reports=[StatusReport(host_id=att.host_id, attempt_id=att.id, job_id=job.id,
                                      state=AttemptState.KILLED, ts=NOW, output_tail="o" * 5000)])
    job = w.job("requeued-a-lot")
    assert job.state is JobState.FAILED and job.tries == most
    assert job.end_reason.startswith(f"tried {most} times (preempted, drained or requeued beyond its 1 attempts)")
    assert [a.output_tail != "" for a in job.attempts] == [False] * (most - 1) + [True]  # older tries compacted
    assert len(job.to_json()) <= RECORD_BUDGET


words = st.text(alphabet=st.sampled_from(["\x00", "\x1b", '"', "\\", "é", "漢", "😀", "a", "/", " "]), max_size=40)


@given(command=st.lists(words, min_size=1, max_size=5),
       env=st.dictionaries(st.from_regex(r"[A-Z_]{1,8}", fullmatch=True), words, max_size=4),
       cwd=st.none() | words, replicas=st.integers(1, 256), tries=st.integers(1, 100), gpus=st.integers(0, 64),
       share=st.sampled_from([0, 1, 500, 999]), gpu_memory=st.sampled_from([0, 1, 81920]),
       mig=st.sampled_from([None, "1g.10gb"]), cpus=st.sampled_from([0.001, 1.0, 2.5, 4096.0]),
       memory=st.integers(1, 2**40))
@settings(max_examples=300, deadline=None)
def test_the_record_bounds_equal_the_records_they_stand_for(
        command: list[str], env: dict[str, str], cwd: str | None, replicas: int, tries: int, gpus: int, share: int,
        gpu_memory: int, mig: str | None, cpus: float, memory: int) -> None:
    """The bounds are worked out from lengths made once per shape plus the spec's own JSON;
    they equal what building the largest records gives, byte for byte."""
    from wire.budgets import (
        _HOST_ID,
        _JOB_ID,
        _LONG_NUMBER,
        _LONG_TIME,
        _PENDING_REASONS_BOUND,
        CANCEL_REASON_MAX,
        MAX_PREEMPTING,
        STOP_REASON_MAX,
        UPDATE_SLACK,
        _worst_attempt_bytes,
    )
    from wire.messages import RESERVED_HOSTS_KEPT, Reserved, Task

    spec = JobSpec(name="n", command=command, env=env, cwd=cwd, replicas=replicas, max_attempts=tries, gpus=gpus,
                   gpu_share=share, gpu_memory_mb=gpu_memory, mig_profile=mig, cpus=cpus, memory_mb=memory)
    gang = dict(env, MUSTER_GANG_TASK="255", MUSTER_GANG_SIZE="256",
                MUSTER_GANG_HOSTS=",".join([_HOST_ID] * replicas)) if replicas > 1 else env
    task = Task(attempt_id=f"{_JOB_ID}.{tries}.255", job_id=_JOB_ID, number=tries, command=command, env=gang, cwd=cwd,
                gpu_indices=[63] * max(gpus, 1), gpu_share=999 if share else 0, gpu_memory_mb=gpu_memory,
                mig=["u" * 96] if mig else [], cpus=cpus, memory_mb=memory, term=_LONG_NUMBER, stop=True,
                keep_running=True, stop_reason="r" * STOP_REASON_MAX, grace_s=_LONG_TIME)
    assert task_record_bound(spec) == len(task.compact_json()) + 1
    base = Job(id=_JOB_ID, spec=spec, submitted_at=_LONG_TIME, updated_at=_LONG_TIME, not_before=_LONG_TIME,
               preempting=[f"{_JOB_ID}:{_LONG_NUMBER}"] * MAX_PREEMPTING,
               reserved=Reserved(hosts=[_HOST_ID] * RESERVED_HOSTS_KEPT, host_count=_LONG_NUMBER, start=_LONG_TIME,
                                 since=_LONG_TIME))
    tail, reason = text_limits(spec)
    per_attempt = _worst_attempt_bytes(tries, replicas, gpus, bool(share), bool(mig)) + 1 + tail + reason
    assert job_record_bound(spec) == (len(base.to_json()) + _PENDING_REASONS_BOUND + CANCEL_REASON_MAX
                                      + UPDATE_SLACK + tries * replicas * per_attempt)


def test_a_record_waiting_for_its_dependencies_stays_within_its_bound() -> None:
    deps = [f"j{i:063d}" for i in range(32)]
    spec = JobSpec(name="n", command=["x"], depends_on=deps)
    job = Job(id="j" * 64, spec=spec, submitted_at=_LONG_TIME, updated_at=_LONG_TIME, not_before=_LONG_TIME,
              waiting_for=deps, hold=clip_start("\x00" * 900, HOLD_REASON_MAX),
              pending_reasons={"x" * 40: 10**6}, cancel_reason=clip_start("\x00" * 9000, 1024))
    assert len(job.to_json()) <= job_record_bound(spec)
    assert job_record_bound(spec) - job_record_bound(spec.model_copy(update={"depends_on": []})) >= len(
        json.dumps(deps, separators=(",", ":")))


def test_the_largest_gang_with_the_default_attempts_is_accepted_and_a_huge_one_refused() -> None:
    spec, errors = validate_job(dict(name="g", command=["x"], replicas=256, max_attempts=3, gpus=8,
                                     env={"K": "v" * 60000}))
    assert spec is not None and not errors, errors
    spec, errors = validate_job(dict(name="g", command=["x"], replicas=256, max_attempts=100))
    assert spec is None and [e.code for e in errors] == ["TOO_LARGE"]
    assert "bytes over" in errors[0].message and "983,040" in errors[0].message


def test_a_full_assignment_record_refuses_one_more_task() -> None:
    spec = JobSpec(name="x", command=["x"], env={"K": "v" * 50000})
    host = HostCapacity(id="h", schedulable=True, cordoned=False, gpu_models={}, unhealthy_gpus=frozenset(),
                        cpus=1000.0, memory_mb=10**9)
    assert check(spec, host)[0] is None
    host.record_bytes = RECORD_BUDGET - task_bytes(spec) // 2
    assert check(spec, host)[0] == RECORD_FULL
    assert task_bytes(spec) == task_record_bound(spec)


# What is not text to show: C0 and C1 controls and DEL, surrogates, the line and paragraph
# separators, bidirectional embeddings, overrides and isolates.
NOT_TEXT = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0), *range(0xD800, 0xE000, 97), 0xDFFF, 0x2028, 0x2029,
                              *range(0x202A, 0x202F), *range(0x2066, 0x206A))]


@given(text=st.text(st.characters(codec=None) | st.sampled_from(NOT_TEXT), max_size=600))
@settings(max_examples=300, deadline=None)
def test_reasons_with_control_characters_are_refused(text: str) -> None:
    stripped = text.strip()
    bad = any(c in NOT_TEXT and c not in "\t\n" for c in stripped if not 0xD800 <= ord(c) < 0xE000) \
        or any(0xD800 <= ord(c) < 0xE000 for c in stripped) or len(stripped) > 512
    try:
        assert validate_reason(text) == stripped and not bad
    except ValidationError as exc:
        assert bad and exc.field == "reason" and exc.code in ("INVALID", "TOO_LARGE")


def test_validate_reason_refuses_nul_and_requires_when_asked() -> None:
    for reason in ("bad\x00reason", "\x1b[31mred"):
        try:
            validate_reason(reason)
            raise AssertionError("accepted")
        except ValidationError as exc:
            assert exc.code == "INVALID"
    try:
        validate_reason("  ", required=True)
        raise AssertionError("accepted")
    except ValidationError as exc:
        assert exc.code == "REQUIRED"
    assert validate_reason(string.printable.strip() + "\tok\nnext") .endswith("next")
    # Text of any other category is text: an emoji sequence's joiner, a right-to-left mark, accents.
    assert validate_reason("fixed by 👩\u200d💻 \u200fשלום café") == "fixed by 👩\u200d💻 \u200fשלום café"
    # C1 and DEL are controls too; a lone surrogate (a JSON body may hold one) cannot be stored; a
    # right-to-left override reorders what is shown after it.
    for reason in ("line\x85next", "del\x7fete", "half \ud800 a pair", "\u202eevil", "one\u2028two"):
        try:
            validate_reason(reason)
            raise AssertionError("accepted")
        except ValidationError as exc:
            assert exc.code == "INVALID"


# ---------------------------------------------------------------- the planner keeps its records small

NOW = 1_000_000.0


def _state_with(job: Job, hosts: int = 1) -> ClusterState:
    st = ClusterState()
    for i in range(hosts):
        hb = Heartbeat(host_id=f"h{i}", boot_id="b", ts=NOW, cpus=64, memory_mb=256_000,
                       gpus=[GpuInfo(index=g, model="H100", memory_mb=80_000) for g in range(8)])
        st.apply_host_record(Record(f"h{i}", 1 + i, encode(hb)), now=NOW)
    st.apply_state_record(Record(f"job.{job.id}", 100, encode(job)))
    return st


def _commit(st: ClusterState, plan: Plan, rev: int) -> None:
    for j in plan.jobs.values():
        st.apply_state_record(Record(f"job.{j.id}", rev, encode(j)))
        rev += 1
    for a in plan.allocs.values():
        st.apply_state_record(Record(f"alloc.{a.host_id}", rev, encode(a)))
        rev += 1


def test_a_report_full_of_control_characters_is_clipped_to_the_attempts_share() -> None:
    """The job a stalled cluster came from: a gang whose tasks each print kilobytes of
    control characters. Its record stays within its bound however much they print."""
    spec = JobSpec(name="noisy", command=["x"], gpus=1, replicas=8)
    st = _state_with(Job(id="noisy-job", spec=spec, submitted_at=NOW - 10, updated_at=NOW - 10))
    plan = plan_cycle(st, reports=[], commands=[], now=NOW, term=1)
    assert plan.placed == 1
    _commit(st, plan, 200)
    job = st.jobs["noisy-job"]
    reports = [StatusReport(host_id=a.host_id, attempt_id=a.id, job_id=job.id, state=AttemptState.FAILED,
                            exit_code=1, output_tail="\x01" * 16000, reason="\x00" * 500, ts=NOW)
               for a in job.attempts]
    plan = plan_cycle(st, reports=reports, commands=[], now=NOW + 1, term=1)
    job = plan.jobs["noisy-job"]
    tail, reason = text_limits(job.spec)
    assert all(a.output_tail and encoded_len(a.output_tail) <= tail and encoded_len(a.reason) <= reason
               for a in job.attempts)
    assert len(job.to_json()) <= job_record_bound(job.spec)


def test_a_job_whose_records_were_refused_ends_failed_with_the_reason() -> None:
    spec = JobSpec(name="fat", command=["x"], gpus=1)
    st = _state_with(Job(id="fat-job", spec=spec, submitted_at=NOW - 10, updated_at=NOW - 10))
    _commit(st, plan_cycle(st, reports=[], commands=[], now=NOW, term=1), 200)
    plan = plan_cycle(st, reports=[], commands=[], now=NOW + 1, term=1,
                      fail={"fat-job": "its records could not be written: too large"})
    failed = plan.jobs["fat-job"]
    assert failed.state is JobState.FAILED and failed.end_reason.startswith("its records could not be written")
    assert all(t.stop for t in plan.allocs["h0"].tasks if t.job_id == "fat-job")
    assert [e.kind for e in plan.events] == ["job.failed"]
    # A job left alone (its records cannot be written at all) is not placed.
    st2 = _state_with(Job(id="left", spec=spec, submitted_at=NOW - 10, updated_at=NOW - 10))
    assert plan_cycle(st2, reports=[], commands=[], now=NOW, term=1, skip={"left"}).placed == 0
    assert plan_cycle(st2, reports=[], commands=[], now=NOW, term=1, placements=0).placed == 0


# ---------------------------------------------------------------- isolation


def test_isolation_tries_each_input_then_each_placement_then_evictions() -> None:
    iso = Isolation(inputs=2, placements=2, evictions=True)
    seen = []
    while (n := iso.next()) is not None:
        seen.append(n)
        iso.settle(n, used_input=n is INPUT, placed=1 if n is PLACEMENT else 0)
    assert seen == [INPUT, INPUT, PLACEMENT, PLACEMENT, EVICTIONS]
    # No input left to take (another replica consumed it): nothing more to try there.
    iso = Isolation(inputs=3, placements=0, evictions=False)
    iso.settle(INPUT, used_input=False, placed=0)
    assert iso.next() is None
