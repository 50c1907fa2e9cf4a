"""The planner's shortcuts over long queues (QueuePolicy.shortcuts in server.scheduling.planner: a
queue's jobs deferred at once when each of them would borrow, a job or a queue left once
it is known refused, by a refused job no larger or by the least refused demand of one
resource, a borrowing job left once one of its queue no larger and no longer found no
host) change how many jobs a cycle looks at, never what it decides:
random clusters with queues over and under their quotas are driven for many cycles by a
simulated agent, and every cycle's plan with the shortcuts equals the plan without."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.scheduling.cycle import admission
from server.scheduling.planner import Plan, QueuePolicy, plan_cycle
from server.scheduling.queues import CPU
from tests.unit.test_planner import NOW, TERM
from tests.unit.test_queue_planner import QWorld
from wire.messages import AttemptState, JobState, ResourceQuota, StatusReport, encode
from wire.records import Record

QUEUES = ("qa", "qb", "qc")


SHAPES = (  # (gpus, gpu_share, cpus, memory_mb)
    (1, 0, 1.0, 512), (2, 0, 2.0, 512), (8, 0, 8.0, 4096), (0, 250, 1.0, 512), (0, 500, 1.0, 512),
    (0, 0, 2.0, 512), (4, 0, 1.0, 4096), (1, 0, 0.0, 512),
)


@st.composite
def jobs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Jobs of three queues; each queue's jobs mostly of one shape (so that floors cover
    whole queues and the shortcuts are taken), some of any shape, some naming a model."""
    base = {q: draw(st.sampled_from(SHAPES)) for q in QUEUES}
    out = []
    for _ in range(draw(st.integers(4, 48))):
        queue = draw(st.sampled_from(QUEUES))
        gpus, share, cpus, memory = base[queue] if draw(st.integers(0, 3)) else draw(st.sampled_from(SHAPES))
        fields: dict[str, Any] = {"queue": queue, "gpus": gpus, "gpu_share": share, "cpus": cpus,
                                  "memory_mb": memory, "priority": draw(st.integers(0, 2)),
                                  "wave": draw(st.integers(0, 2))}
        if gpus and draw(st.integers(0, 7)) == 0:
            fields["gpu_model"] = "H100"  # a job naming its model: never behind a floor
        if gpus and draw(st.integers(0, 7)) == 0:
            fields["replicas"] = 2
        limit = draw(st.sampled_from([0.0, 0.0, 0.0, 30.0, 600.0]))  # keep off reserved hosts, or not
        if limit:
            fields["time_limit_s"] = limit
        fields["user"] = draw(st.sampled_from(["ann", "bo", "cy"]))
        if draw(st.integers(0, 7)) == 0:
            fields["exclude_hosts"] = ["h0"]  # passed over as hard to place only by jobs that exclude it too
        out.append(fields)
    return out


def _plan(w: QWorld, reports: list, now: float, shortcuts: bool) -> Plan:
    return plan_cycle(w.state, reports=reports, commands=[], now=now, term=TERM,
                      queues=QueuePolicy(half_life_s=0, preemptions_per_cycle=2, shortcuts=shortcuts))


def _canonical(plan: Plan) -> tuple[object, ...]:
    return ({k: encode(v) for k, v in plan.jobs.items()}, {k: encode(v) for k, v in plan.allocs.items()},
            [(e.kind, e.job_id, e.message) for e in plan.events], plan.placed, dict(plan.preempted))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs(), st.lists(st.sampled_from([0.75, 1.5, 2.25, 4.0, 8.0]), min_size=3, max_size=3),
       st.lists(st.sampled_from([None, None, 3.0, 8.0, 20.0]), min_size=3, max_size=3),
       st.lists(st.sampled_from([0.0, 0.0, 1.0, 2.0, 4.0]), min_size=3, max_size=3))
def test_the_shortcuts_never_change_a_plan(specs: list[dict[str, Any]], nominals: list[float],
                                           cpu_nominals: list[float | None], per_user: list[float]) -> None:
    """Queues with a GPU quota, some with a CPU quota as well (refused on either), some
    with a limit of GPUs per user (jobs on the list for preemption held back by it)."""
    w = QWorld()
    for h in range(2):
        w.host(f"h{h}", gpus=8, cpus=32)
    for name, gpus, cpus, user_gpus in zip(QUEUES, nominals, cpu_nominals, per_user, strict=True):
        q = w.queue(name, cohort="c", gpus=gpus, min_runtime_s=0, preempt_within=True,
                    max_gpus_per_user=user_gpus)
        if cpus is not None:
            quota = {**q.quota, CPU: ResourceQuota(nominal=cpus)}
            w.state.apply_state_record(Record(f"queue.{name}", next(w.rev),
                                              encode(q.model_copy(update={"quota": quota}))))
    now = NOW
    for step in range(16):
        for i, f in enumerate(specs):
            if step == 4 * f["wave"]:
                fields = {k: v for k, v in f.items() if k != "wave"}
                w.qsubmit(f"j{i:03d}", submitted_at=now - 100 + i, **fields)
        reports = w.agent_reports(now)
        for host_id in list(w.state.hosts):  # the hosts keep heartbeating
            w.host(host_id, gpus=8, cpus=32, now=now)
        fast = _plan(w, reports, now, True)
        slow = _plan(w, reports, now, False)
        assert _canonical(fast) == _canonical(slow), f"cycle {step}"
        w.commit(fast)
        now += 1


def _looked_at(w: QWorld, monkeypatch: pytest.MonkeyPatch, method: str) -> tuple[list[str], list[str]]:
    """The queued jobs (`wait*`) a cycle called `admission.Admission.<method>` for, with the
    shortcuts and without; the two plans are the same."""
    seen: list[str] = []
    real = getattr(admission.Admission, method)

    def spy(self: admission.Admission, job: Any, *args: Any) -> Any:
        seen.append(job.id)
        return real(self, job, *args)

    monkeypatch.setattr(admission.Admission, method, spy)
    fast = _plan(w, [], NOW + 2, True)
    looked_fast = [j for j in seen if j.startswith("wait")]
    seen.clear()
    slow = _plan(w, [], NOW + 2, False)
    assert _canonical(fast) == _canonical(slow)
    return looked_fast, [j for j in seen if j.startswith("wait")]


def _started(w: QWorld) -> None:
    """Two cycles: what fits is placed, then started (the agents' reports)."""
    w.qcycle(now=NOW)
    w.qcycle(w.agent_reports(NOW + 1), now=NOW + 1)


def _queue_at_nominal() -> QWorld:
    """qa (2 GPUs nominal, cohort c with qb's 6) holding its 2 GPUs."""
    w = QWorld()
    w.host("h0", gpus=8)
    w.queue("qa", cohort="c", gpus=2, min_runtime_s=0)
    w.queue("qb", cohort="c", gpus=6, min_runtime_s=0)
    for i in range(2):
        w.qsubmit(f"run{i}", "qa", gpus=1, submitted_at=NOW - 200 + i)
    _started(w)
    return w


def test_a_queue_whose_every_job_would_borrow_is_deferred_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shortcut is taken (not only harmless): with a queue at its nominal quota, the
    first pass works out the demand of one of its jobs, not of each."""
    w = _queue_at_nominal()
    for i in range(50):
        w.qsubmit(f"wait{i:02d}", "qa", gpus=2, submitted_at=NOW - 100 + i)
    fast, slow = _looked_at(w, monkeypatch, "demand")
    assert len(slow) >= 50 and len(fast) < len(slow)


def test_a_job_asking_as_much_of_a_refused_resource_is_not_looked_at(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the list for preemption is full, a job asking at least as many GPUs as one its
    queue's quota refused is refused unlooked at, whatever its CPUs: the jobs refused
    first were large in CPUs, so no earlier refusal was smaller in every respect."""
    w = QWorld()
    w.host("h0", gpus=8, cpus=64)
    w.queue("qa", gpus=2, min_runtime_s=0)  # no cohort: it may never hold more than 2
    for i in range(2):
        w.qsubmit(f"run{i}", "qa", gpus=1, submitted_at=NOW - 200 + i)
    _started(w)
    # 1 GPU each, CPUs 8, 4, then 1, 2, 3, 1, 2, 3, ...
    cpus = [8.0, 4.0] + [float(1 + i % 3) for i in range(40)]
    for i, c in enumerate(cpus):
        w.qsubmit(f"wait{i:02d}", "qa", gpus=1, cpus=c, submitted_at=NOW - 100 + i)
    fast, slow = _looked_at(w, monkeypatch, "restrict")
    assert len(slow) == len(cpus)
    # Two refusals fill the list (2 x preemptions_per_cycle 2 = 4 places: wait00-03);
    # every later job asks for 1 GPU, as much as the least refused.
    assert fast == ["wait00", "wait01", "wait02", "wait03"]


def test_a_queue_whose_smallest_job_would_borrow_is_deferred_without_a_look(monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue at its nominal quota whose jobs differ in every size but GPUs: its smallest
    job would borrow, so the first pass defers the whole queue without working out any
    job's demand (no job was at least as large in every respect as an earlier one, which
    the floor of known borrowers needs)."""
    w = _queue_at_nominal()
    for i in range(30):  # CPUs falling while memory rises: no job smaller than an earlier one in every respect
        w.qsubmit(f"wait{i:02d}", "qa", gpus=1, cpus=float(30 - i), memory_mb=512 + 64 * i,
                  submitted_at=NOW - 100 + i)
    fast, slow = _looked_at(w, monkeypatch, "demand")
    # Only the jobs the cycle looks for victims for (2 x preemptions_per_cycle) had theirs.
    assert len(slow) >= 30 and len(fast) <= 4


def test_a_job_as_hard_to_place_as_one_that_found_no_host_is_not_looked_at(monkeypatch: pytest.MonkeyPatch) -> None:
    """qa may borrow what qb does not use (its quota admits every job), but no host has a
    free GPU: another cohort's queue holds h1. Once the list for preemption is full and
    the cycle can make no more reservations, qa's later jobs as large as one that found no
    host, and running no shorter, are not looked at; the one with a shorter time limit is
    (it might backfill hosts reserved for others)."""
    w = QWorld()
    w.host("h0", gpus=8)
    w.host("h1", gpus=8)
    w.queue("qa", cohort="c", gpus=8, min_runtime_s=0)
    w.queue("qb", cohort="c", gpus=8, min_runtime_s=0)
    w.queue("qz", cohort="z", gpus=8, min_runtime_s=0)
    for i in range(8):
        w.qsubmit(f"run{i}", "qa", gpus=1, submitted_at=NOW - 200 + i)
        w.qsubmit(f"other{i}", "qz", gpus=1, submitted_at=NOW - 200 + i)
    _started(w)
    assert sum(1 for j in w.state.jobs.values() if j.state is JobState.RUNNING) == 16
    for i in range(40):
        fields: dict[str, Any] = {"time_limit_s": 60.0} if i == 30 else {}
        w.qsubmit(f"wait{i:02d}", "qa", gpus=1 + i % 2, submitted_at=NOW - 100 + i, **fields)
    fast, slow = _looked_at(w, monkeypatch, "restrict")
    assert len(slow) == 40
    assert len(fast) < 20 and "wait30" in fast  # the first ones, and the one with a shorter limit
    assert "wait31" not in fast and "wait39" not in fast


def test_a_reservation_given_up_in_the_cycle_lets_jobs_that_found_no_host_be_looked_at_again() -> None:
    """p holds a reservation on the host of x, the job that ends first; once x has ended,
    p is placed there in the second pass, after a 1-GPU job of its queue found no host
    (the other host full, x's reserved for p: submitted before p, of p's priority, it may
    not be placed before its begin time, so p reserved first). The hosts of its
    reservation are no longer held back: a later 1-GPU job is placed on what p left of
    it, the shortcut as without."""
    from tests.factories import job as make_job
    from tests.factories import job_spec

    w = QWorld()
    w.host("h0", gpus=8)
    w.host("h1", gpus=8)
    w.queue("qa", cohort="c", gpus=0, min_runtime_s=0)  # all it holds it borrows: every job in the second pass
    w.queue("qb", cohort="c", gpus=16, min_runtime_s=0)
    w.queue("qz", cohort="z", gpus=8, min_runtime_s=0)
    for i in range(8):
        w.qsubmit(f"z{i}", "qz", gpus=1, submitted_at=NOW - 300 + i)
    w.qsubmit("x", "qb", gpus=8, time_limit_s=200.0, submitted_at=NOW - 300)  # h1 free soonest
    w.qcycle(now=NOW - 100)
    w.qcycle(w.agent_reports(NOW - 99), now=NOW - 99)
    x = w.job("x")
    assert x.state is JobState.RUNNING
    on = x.attempts[-1].host_id
    w.qsubmit("p", "qa", gpus=4, submitted_at=NOW - 90)
    w.qcycle(now=NOW - 80)
    reserved = w.job("p").reserved
    assert reserved is not None and reserved.hosts == [on]
    for i in range(8):  # fit no host: fill the list for preemption and use the cycle's reservation tries
        w.qsubmit(f"huge{i}", "qa", gpus=16, priority=2, submitted_at=NOW - 70 + i)
    first = make_job("first", spec=job_spec("first", command=["run", "first"], gpus=1, queue="qa"),
                     submitted_at=NOW - 95, not_before=NOW - 1)
    w.state.apply_state_record(Record("job.first", next(w.rev), encode(first)))
    w.qsubmit("later", "qa", gpus=1, submitted_at=NOW - 50)
    ended = [StatusReport(host_id=on, attempt_id=x.attempts[-1].id, job_id="x", state=AttemptState.SUCCEEDED,
                          ts=NOW, exit_code=0)]
    fast = _plan(w, ended, NOW, True)
    slow = _plan(w, ended, NOW, False)
    assert _canonical(fast) == _canonical(slow)
    placed = {j for j, job in fast.jobs.items() if job.state is JobState.PLACED}
    assert placed == {"p", "later"}


def test_a_job_within_its_nominal_quota_as_hard_to_place_as_one_that_found_no_host_is_not_looked_at(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first pass likewise: qa's jobs are within its nominal quota, but another cohort's
    queue holds every GPU (nothing for reclaim to take back). Once the list for
    preemption is full and no more reservations can be made, a job as hard to place as
    one that found no host is not looked at; one asking fewer CPUs is."""
    w = QWorld()
    w.host("h0", gpus=8)
    w.host("h1", gpus=8)
    w.queue("qa", cohort="c", gpus=16, min_runtime_s=0)
    w.queue("qz", cohort="z", gpus=16, min_runtime_s=0)
    for i in range(16):
        w.qsubmit(f"z{i:02d}", "qz", gpus=1, submitted_at=NOW - 300 + i)
    _started(w)
    for i in range(40):
        fields: dict[str, Any] = {"cpus": 0.0} if i == 30 else {}
        w.qsubmit(f"wait{i:02d}", "qa", gpus=1 + i % 2, submitted_at=NOW - 100 + i, **fields)
    fast, slow = _looked_at(w, monkeypatch, "restrict")
    assert len(slow) == 40
    assert len(fast) < 20 and "wait30" in fast
    assert "wait31" not in fast and "wait39" not in fast


def test_a_job_asking_more_resources_than_one_that_found_no_host_is_looked_at() -> None:
    """Whether a job within its nominal quota that finds no host keeps its cohort from
    lending is decided on the resources it asks: qb borrows CPUs only. The jobs of qa that
    ask no CPUs find no host and leave the cohort lending; the later one asking a CPU, as
    hard to place as they, is looked at all the same, and what it decides (the cohort
    lends nothing new, what qb borrows being reclaim's) holds: qb's next job is not placed."""
    w = QWorld()
    w.host("h0", gpus=8, cpus=32)
    w.host("h1", gpus=8, cpus=32)
    qa = w.queue("qa", cohort="c", gpus=16, min_runtime_s=0)
    w.state.apply_state_record(Record("queue.qa", next(w.rev), encode(qa.model_copy(
        update={"quota": {**qa.quota, CPU: ResourceQuota(nominal=8.0)}}))))
    qb = w.queue("qb", cohort="c", gpus=0, min_runtime_s=0)
    w.state.apply_state_record(Record("queue.qb", next(w.rev), encode(qb.model_copy(
        update={"quota": {**qb.quota, CPU: ResourceQuota(nominal=0.0)}}))))
    w.queue("qz", cohort="z", gpus=16, min_runtime_s=0)
    for i in range(16):
        w.qsubmit(f"z{i:02d}", "qz", gpus=1, cpus=0.0, memory_mb=0, submitted_at=NOW - 300 + i)
    w.qsubmit("cpu-run", "qb", gpus=0, cpus=2.0, memory_mb=0, submitted_at=NOW - 300)
    _started(w)
    assert w.job("cpu-run").state is JobState.RUNNING and w.holding("qz") == 16
    for i in range(10):  # ask no CPU of qa's quota: qb borrows nothing they ask
        w.qsubmit(f"nocpu{i}", "qa", gpus=1, cpus=0.0, memory_mb=0, priority=1, submitted_at=NOW - 100 + i)
    w.qsubmit("cpu", "qa", gpus=1, cpus=1.0, memory_mb=0, submitted_at=NOW - 100)
    w.qsubmit("cpu-next", "qb", gpus=0, cpus=1.0, memory_mb=0, submitted_at=NOW - 100)
    fast = _plan(w, [], NOW + 2, True)
    slow = _plan(w, [], NOW + 2, False)
    assert _canonical(fast) == _canonical(slow)
    assert "cpu-next" not in fast.jobs or fast.jobs["cpu-next"].state is JobState.QUEUED


def test_the_first_jobs_on_the_list_for_preemption_get_the_tries_even_when_held_back_by_then() -> None:
    """ann's four GPU jobs fill the list for preemption (qa's cohort is exhausted: qb
    borrows every GPU); then her CPU job is placed, and her limit of one running job holds
    the four back when victims are looked for. They use the cycle's four tries all the
    same: bo's job, later, asking as many GPUs as the least the quota refused (so the
    shortcuts pass it over) but fewer CPUs than ann's, gets none either way, and the plans
    with and without the shortcuts are the same."""
    w = QWorld()
    w.host("h0", gpus=8, cpus=64)
    w.queue("qa", cohort="c", gpus=8, min_runtime_s=0, max_running_jobs_per_user=1)
    w.queue("qb", cohort="c", gpus=0, min_runtime_s=0)
    for i in range(8):
        w.qsubmit(f"b{i}", "qb", gpus=1, submitted_at=NOW - 300 + i)
    _started(w)
    assert w.holding("qb") == 8
    for i in range(4):
        w.qsubmit(f"ann{i}", "qa", gpus=2, user="ann", priority=2, submitted_at=NOW - 100 + i)
    w.qsubmit("ann-cpu", "qa", gpus=0, cpus=1.0, user="ann", priority=1, submitted_at=NOW - 90)
    w.qsubmit("bo", "qa", gpus=2, cpus=0.5, user="bo", submitted_at=NOW - 80)  # fewer CPUs: not below ann's

    def plan(shortcuts: bool) -> Plan:
        return plan_cycle(w.state, reports=[], commands=[], now=NOW + 2, term=TERM,
                          queues=QueuePolicy(half_life_s=0, preemptions_per_cycle=2, reserve_jobs=0,
                                             shortcuts=shortcuts))

    fast, slow = plan(True), plan(False)
    assert fast.jobs["ann-cpu"].state is JobState.PLACED
    assert _canonical(fast) == _canonical(slow)
    assert not fast.preempted
