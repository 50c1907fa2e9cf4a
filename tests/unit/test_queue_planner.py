"""Queues in the planner (server.scheduling.planner with queues, fairshare, preemption):
quotas cap placement, fair share interleaves queues, reclaim and priority preemption with
the safe handover (the preemptor is placed only once its victims are reported stopped,
and no allocation ever holds both), PREEMPTED tries requeued in submission order without
counting against maxAttempts, time limits ending TIMEOUT, a new leader finishing a
preemption from the records, and Hypothesis properties over random clusters driven for
many cycles by a simulated agent (no overcommit, quotas kept, no queue below its nominal
quota left waiting behind borrowers once reclaim has run)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.scheduling.cycle.admission import Admission
from server.scheduling.cycle.work import Work
from server.scheduling.planner import Plan, QueuePolicy, plan_cycle
from server.scheduling.preemption import stoppable
from server.scheduling.queues import (
    GANG_WHOLE,
    OVER_QUOTA,
    PREEMPTION_GRACE,
    PRIORITY_WAIT,
    RECLAIM_WAIT,
    USER_LIMIT,
    QueueBook,
    job_demand,
    job_usage,
    meters,
    nominal,
    queue_usage,
    user_gpus,
)
from server.state.cluster import ClusterState
from server.views.queues import reasons
from tests.factories import job as make_job
from tests.factories import job_spec, set_or_drop
from tests.unit.test_planner import NOW, TERM, World
from wire.messages import Attempt, AttemptState, JobState, Queue, ResourceQuota, StatusReport, encode
from wire.records import Record

H100 = "gpu:H100"


class QWorld(World):
    def queue(self, name: str, *, cohort: str | None = None, gpus: float | None = None, borrow: float | None = None,
              lend: float | None = None, **fields: object) -> Queue:
        quota = {H100: ResourceQuota(nominal=gpus, borrowing_limit=borrow, lending_limit=lend)} \
            if gpus is not None else {}
        q = Queue(name=name, cohort=cohort, quota=quota, **fields)
        self.state.apply_state_record(Record(f"queue.{name}", next(self.rev), encode(q)))
        return q

    def qsubmit(self, job_id: str, queue: str, *, gpus: int = 1, priority: int = 0, submitted_at: float = NOW - 100,
                **fields: object) -> None:
        spec = job_spec(job_id, command=["run", job_id], gpus=gpus, queue=queue, priority=priority, **fields)
        job = make_job(job_id, spec=spec, submitted_at=submitted_at)
        self.state.apply_state_record(Record(f"job.{job_id}", next(self.rev), encode(job)))

    def qcycle(self, reports: list[StatusReport] | None = None, now: float = NOW, policy: QueuePolicy | None = None,
               **kw: object) -> Plan:
        for host_id, entry in list(self.state.hosts.items()):  # the hosts keep heartbeating
            hb = entry.latest()
            if hb is not None and entry.seen_at < now:
                self.host(host_id, gpus=len(hb.gpus), now=now)
        commands = kw.pop("commands", None) or []
        plan = plan_cycle(self.state, reports=reports or [], commands=commands, now=now,  # type: ignore[arg-type]
                          term=TERM, queues=policy or QueuePolicy(half_life_s=0), **kw)  # type: ignore[arg-type]
        self.commit(plan)
        return plan

    def agent_reports(self, now: float) -> list[StatusReport]:
        """What agents would report: placed tasks started, stopped tasks KILLED."""
        out = []
        for host_id, alloc in self.state.allocs.items():
            for t in alloc.tasks:
                job = self.state.jobs.get(t.job_id)
                a = next((a for a in job.attempts if a.id == t.attempt_id), None) if job else None
                if a is None or a.state.terminal:
                    continue
                if t.stop:
                    out.append(StatusReport(host_id=host_id, attempt_id=t.attempt_id, job_id=t.job_id,
                                            state=AttemptState.KILLED, ts=now, reason="stopped"))
                elif a.state is AttemptState.PLACED:
                    out.append(StatusReport(host_id=host_id, attempt_id=t.attempt_id, job_id=t.job_id,
                                            state=AttemptState.RUNNING, ts=now))
        return out

    def holding(self, queue: str) -> float:
        return queue_usage(self.state.jobs.values()).get(queue, {}).get(H100, 0.0)


def no_overcommit(state: ClusterState) -> None:
    for host_id, alloc in state.allocs.items():
        used = Counter(i for t in alloc.tasks for i in t.gpu_indices)
        assert all(n == 1 for n in used.values()), (host_id, used)


def test_quota_caps_what_a_queue_is_placed() -> None:
    w = QWorld()
    w.host("h1")
    w.queue("a", gpus=2)
    for i in range(4):
        w.qsubmit(f"a{i}", "a")
    plan = w.qcycle()
    assert plan.placed == 2
    assert w.holding("a") == 2
    assert all(a.gpu_model == "H100" for j in w.state.jobs.values() for a in j.attempts)


def test_a_job_of_any_model_stays_one_unless_its_queue_narrows_the_models() -> None:
    """A queue with a quota per GPU model places a job that names no model on any model
    while every model is allowed (no model set made up for it: a set is placed the slower
    way), and on the allowed models only once a model's quota is used up."""
    w = QWorld()
    w.host("h1")
    w.host("a1", model="A100")
    w.state.apply_state_record(Record("queue.q", next(w.rev), encode(Queue(name="q", quota={
        H100: ResourceQuota(nominal=8.0), "gpu:A100": ResourceQuota(nominal=1.0)}))))
    w.qsubmit("j1", "q")
    adm = Admission(Work(w.state, Plan()), NOW, QueuePolicy(half_life_s=0))
    job = w.job("j1")
    spec, refusal = adm.restrict(job)
    assert spec is job.spec and refusal is None
    w.qsubmit("j0", "q", gpu_model="A100")  # uses up the queue's A100 quota
    plan = w.qcycle()
    assert plan.placed == 2 and w.holding("q") + w.state.queue_usage["q"].get("gpu:A100", 0.0) == 2
    assert "A100" in {a.gpu_model for a in w.job("j0").attempts}
    w.qsubmit("j2", "q")
    adm = Admission(Work(w.state, Plan()), NOW, QueuePolicy(half_life_s=0))
    spec, refusal = adm.restrict(w.job("j2"))
    assert spec is not None and refusal is None and spec.models() == frozenset({"H100"})


def test_unknown_queue_waits_and_default_queue_runs_as_before() -> None:
    w = QWorld()
    w.host("h1")
    w.qsubmit("lost", "nosuch")
    w.qsubmit("plain", "default")
    plan = w.qcycle()
    assert plan.placed == 1 and w.job("plain").state is JobState.PLACED and w.job("lost").state is JobState.QUEUED


def test_fair_share_interleaves_queues_by_weight() -> None:
    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("a", weight=3.0)
    w.queue("b", weight=1.0)
    for i in range(10):
        # a's jobs were all submitted first: FIFO would give a everything.
        w.qsubmit(f"a{i}", "a", submitted_at=NOW - 100 + i)
        w.qsubmit(f"b{i}", "b", submitted_at=NOW - 50 + i)
    w.qcycle()
    assert (w.holding("a"), w.holding("b")) == (6, 2)


def _fill(w: QWorld, queue: str, n: int, started: float, prefix: str | None = None) -> None:
    for i in range(n):
        w.qsubmit(f"{prefix or queue}{i}", queue, submitted_at=started + i)
    _placed_and_running(w, started + n)


def _placed_and_running(w: QWorld, now: float) -> None:
    w.qcycle(now=now)
    w.qcycle(w.agent_reports(now), now=now)


def test_a_victim_is_stopped_with_the_grace_it_was_told_and_a_grace_of_0_kills_at_once() -> None:
    """Found by exploring: a queue's grace lowered after its tries started cut their
    checkpoint short of the MUSTER_PREEMPT_DEADLINE they were told (they got the new
    grace); and a queue's grace of 0 gave its tries the agent's 10 s (0 on the wire is the
    agent's default)."""
    from wire.messages import IMMEDIATE_GRACE_S

    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("a", cohort="c", gpus=4, min_runtime_s=0)
    w.queue("b", cohort="c", gpus=4, min_runtime_s=0, preempt_grace_s=30)
    _fill(w, "a", 2, NOW - 1000)
    _fill(w, "b", 6, NOW - 900)  # b borrows 2 of a's 4
    assert all(t.grace_s == 30 for t in w.tasks("h1") if t.job_id.startswith("b"))
    w.queue("b", cohort="c", gpus=4, min_runtime_s=0, preempt_grace_s=3)  # lowered while they run
    w.qsubmit("a-new1", "a", submitted_at=NOW - 10)
    w.qsubmit("a-new2", "a", submitted_at=NOW - 9)
    plan = w.qcycle(now=NOW)
    assert plan.preempted == {("reclaim", "a"): 2}
    stopping = [t for t in w.tasks("h1") if t.stop]
    assert len(stopping) == 2 and all(t.grace_s == 30 for t in stopping), stopping
    assert "grace up to 30 s" in " ".join(r.detail for r in reasons(w.state, w.job("a-new1"), NOW, 0.0))
    w.host("h2", gpus=8)
    w.queue("z", gpus=2, preempt_grace_s=0)
    w.qsubmit("z0", "z", submitted_at=NOW - 5)
    w.qcycle(now=NOW + 1)
    assert [t.grace_s for t in w.tasks("h2") if t.job_id == "z0"] == [IMMEDIATE_GRACE_S]


def test_a_queue_moved_out_of_its_cohort_gives_back_what_it_borrowed() -> None:
    """Found by exploring: a queue that borrowed and was then moved out of its cohort kept
    what it held above its nominal quota for good (reclaim took only from its own cohort
    and unmetered queues), the cohort's member below its nominal quota waiting with no
    reason given. A queue of no cohort cannot borrow: what it holds above its nominal
    quota is reclaimed as a cohort member's would be."""
    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("x1", cohort="cx", gpus=4, min_runtime_s=0)
    w.queue("x2", cohort="cx", gpus=4, min_runtime_s=0)
    _fill(w, "x1", 6, NOW - 1000)  # 4 of its own, 2 borrowed
    assert w.holding("x1") == 6
    w.queue("x1", gpus=4, min_runtime_s=0)  # out of the cohort
    for i in range(4):
        w.qsubmit(f"x2-{i}", "x2", submitted_at=NOW - 10 + i)
    plan = w.qcycle(now=NOW)
    assert plan.preempted == {("reclaim", "x2"): 2}, plan.preempted
    assert sorted(t.job_id for t in w.tasks("h1") if t.stop) == ["x14", "x15"]  # the youngest
    no_overcommit(w.state)


def test_reclaim_hands_gpus_over_only_after_the_victims_stopped() -> None:
    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("a", cohort="c", gpus=4, min_runtime_s=0, preempt_grace_s=45)
    w.queue("b", cohort="c", gpus=4, min_runtime_s=0)
    _fill(w, "a", 2, NOW - 1000)
    _fill(w, "b", 6, NOW - 900)  # b borrows 2 of a's 4
    assert (w.holding("a"), w.holding("b")) == (2, 6)
    w.qsubmit("a-new1", "a", submitted_at=NOW - 10)
    w.qsubmit("a-new2", "a", submitted_at=NOW - 9)
    plan = w.qcycle(now=NOW)
    assert plan.placed == 0 and plan.preempted == {("reclaim", "a"): 2}
    stopping = [t for t in w.tasks("h1") if t.stop]
    # The two youngest of b's jobs, told to stop with a's grace ... no: their own queue's grace.
    assert sorted(t.job_id for t in stopping) == ["b4", "b5"] and all(t.grace_s == 30 for t in stopping)
    assert "reclaim" in w.job("b5").current.reason
    assert sorted(w.job("a-new1").preempting + w.job("a-new2").preempting) == ["b4:1", "b5:1"]
    # While they stop nothing new is placed on their GPUs, nor preempted again.
    plan = w.qcycle(now=NOW + 1)
    assert plan.placed == 0 and not plan.preempted
    no_overcommit(w.state)
    # Their agent reports them stopped: a's jobs are placed in the same cycle, on their GPUs.
    freed = {i for t in stopping for i in t.gpu_indices}
    ran = sum(NOW + 20 - w.job(v).current.started_at for v in ("b4", "b5"))
    plan = w.qcycle(w.agent_reports(NOW + 20), now=NOW + 20)
    assert plan.placed == 2
    # Their work is lost, all they ran (one GPU each; the scheduler adds it to a metric).
    assert plan.preemption_lost == {("b", False): ran} and ran > 1800
    new = [t for t in w.tasks("h1") if t.job_id.startswith("a-new")]
    assert {i for t in new for i in t.gpu_indices} == freed
    assert not any(t.job_id in ("b4", "b5") for t in w.tasks("h1"))
    no_overcommit(w.state)
    for v in ("b4", "b5"):
        j = w.job(v)
        assert j.state is JobState.QUEUED and j.current.state is AttemptState.PREEMPTED
        assert j.submitted_at == NOW - 900 + int(v[1])  # keeps its place in its queue
    assert (w.holding("a"), w.holding("b")) == (4, 4)


def test_a_victim_cancelled_in_its_grace_ends_killed_as_cancelled_not_preempted() -> None:
    """Found by exploring: a reclaim's victim cancelled while in its grace ended CANCELLED
    with its attempt PREEMPTED (the cancel's reason on it), its run charged to preemption in
    the accounting. It now ends KILLED, stopped by the cancel, and costs no preemption; the
    preemptor still gets its GPU once the victim has stopped."""
    from wire.messages import Command

    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("a", cohort="c", gpus=4, min_runtime_s=0, preempt_grace_s=45)
    w.queue("b", cohort="c", gpus=4, min_runtime_s=0)
    _fill(w, "a", 3, NOW - 1000)
    _fill(w, "b", 5, NOW - 900)  # b borrows 1 of a's 4
    w.qsubmit("a-new", "a", submitted_at=NOW - 10)
    plan = w.qcycle(now=NOW)
    assert plan.preempted == {("reclaim", "a"): 1}
    [victim] = [t.job_id for t in w.tasks("h1") if t.stop]
    w.qcycle(commands=[Command(kind="cancel", job_id=victim, by="op", reason="wrong input", ts=NOW + 1)],
             now=NOW + 1)
    assert w.job(victim).state is JobState.CANCELLED and w.job(victim).current.stop_kind == "cancel"
    plan = w.qcycle(w.agent_reports(NOW + 20), now=NOW + 20)
    a = w.job(victim).current
    assert a.state is AttemptState.KILLED and a.reason == "wrong input", a
    assert plan.preemption_lost == {} and plan.placed == 1 and w.job("a-new").state is JobState.PLACED
    no_overcommit(w.state)


def test_reclaim_stops_jobs_that_checkpoint_first_as_they_lose_only_the_grace() -> None:
    """A job that checkpoints (JobSpec.checkpoints) loses at most its queue's grace of work
    when stopped: b0 and b1, running 900 s but checkpointing (30 s lost each), go before
    b4 and b5, which have run 100 s and would lose all of it; b2 and b3, as old and not
    checkpointing, stay."""
    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("a", cohort="c", gpus=4, min_runtime_s=0)
    w.queue("b", cohort="c", gpus=4, min_runtime_s=0)  # grace 30 s, the default
    _fill(w, "a", 2, NOW - 1000)
    for i in range(4):
        w.qsubmit(f"b{i}", "b", submitted_at=NOW - 900 + i, checkpoints=i < 2)
    w.qcycle(now=NOW - 900)
    w.qcycle(w.agent_reports(NOW - 900), now=NOW - 900)
    _fill(w, "b", 2, NOW - 102, prefix="b-late")  # started at NOW - 100
    assert (w.holding("a"), w.holding("b")) == (2, 6)
    w.qsubmit("a-new1", "a", submitted_at=NOW - 10)
    w.qsubmit("a-new2", "a", submitted_at=NOW - 9)
    plan = w.qcycle(now=NOW)
    assert plan.preempted == {("reclaim", "a"): 2}
    assert sorted(t.job_id for t in w.tasks("h1") if t.stop) == ["b0", "b1"]
    assert plan.preemption_cost == 2 * 30.0  # what the storm alert adds up: the grace each, one GPU
    # Stopped, they lose only the seconds from the stop to their exit.
    plan = w.qcycle(w.agent_reports(NOW + 5), now=NOW + 5)
    assert plan.preemption_lost == {("b", True): 2 * 5.0}


def test_a_gang_that_needs_more_victims_than_a_cycle_allows_gets_them_in_one_cycle() -> None:
    """Reclaim for a gang of two whole hosts, each full of a borrower's one-GPU jobs: 16
    victims, four times the cycle's budget here. The cycle's first preemption may stop
    them all (the budget paces many preemptions; it must not starve one large one); the
    gang is placed on those two hosts once they have stopped."""
    w = QWorld()
    for h in ("h1", "h2", "h3"):
        w.host(h, gpus=8)
    w.queue("lender", cohort="c", gpus=8, min_runtime_s=0)
    w.queue("gang", cohort="c", gpus=16, min_runtime_s=0)
    _fill(w, "lender", 24, NOW - 1000)  # 24 GPUs: 16 of them borrowed from gang's quota
    w.qsubmit("big", "gang", gpus=8, replicas=2, submitted_at=NOW - 10)
    policy = QueuePolicy(half_life_s=0, preemptions_per_cycle=4)
    plan = w.qcycle(now=NOW, policy=policy)
    assert plan.preempted == {("reclaim", "gang"): 16}
    stopping = {h for h in ("h1", "h2", "h3") if all(t.stop for t in w.tasks(h))}
    assert len(stopping) == 2 and len(w.job("big").preempting) == 16
    plan = w.qcycle(w.agent_reports(NOW + 5), now=NOW + 5, policy=policy)
    assert w.job("big").state is JobState.PLACED
    assert {t.host_id for t in w.job("big").current_tasks()} == stopping
    no_overcommit(w.state)
    assert (w.holding("lender"), w.holding("gang")) == (8, 16)


def test_a_job_within_nominal_that_nothing_can_be_reclaimed_for_does_not_keep_free_gpus_idle() -> None:
    """A job within its queue's nominal quota finds no room (here no host has the CPUs it
    asks), and no queue of its cohort borrows: reclaim has nothing to take, so the cohort
    still lends what is free to a borrower's job, instead of keeping it idle for a room
    only jobs ending can make. With a borrower to reclaim from, whose stops cannot make the
    room either (its jobs hold one CPU each), the reclaim finds no victims and the cohort
    lends all the same (found by the fairness benchmark on trace shapes: GPUs stood idle,
    outside any grace, for a reclaim that could not come)."""
    w = QWorld()
    w.host("h1", gpus=4, cpus=64)
    w.host("h2", gpus=4, cpus=64)
    w.queue("a", cohort="c", gpus=6, min_runtime_s=0)
    w.queue("b", cohort="c", gpus=2, min_runtime_s=0)
    for i in range(3):
        w.qsubmit(f"a{i}", "a", cpus=20, submitted_at=NOW - 1000 + i)
    _fill(w, "b", 2, NOW - 900)
    assert (w.holding("a"), w.holding("b")) == (3, 2)
    # Within a's nominal quota, fits no host (and has not waited long enough to hold one).
    w.qsubmit("wide", "a", cpus=64, submitted_at=NOW - 1)
    w.qsubmit("extra", "b", submitted_at=NOW - 1)  # would borrow one of a's unused GPUs
    plan = w.qcycle(now=NOW)
    assert w.job("extra").state is JobState.PLACED and w.job("wide").state is JobState.QUEUED
    assert not plan.preempted
    no_overcommit(w.state)
    # Now b borrows, but stopping its jobs would not make wide's room: the free GPU is lent.
    w.qsubmit("extra2", "b", submitted_at=NOW)
    plan = w.qcycle(w.agent_reports(NOW + 1), now=NOW + 1)
    assert w.job("extra2").state is JobState.PLACED and not plan.preempted


def test_gpus_freed_beyond_a_preemptors_need_go_to_other_jobs_in_the_same_cycle() -> None:
    """The host kept for a preemptor while its victim stops is let go once the preemptor
    is placed: what the victim freed beyond its need goes to another waiting job in that
    cycle, not one cycle later."""
    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("a", cohort="c", gpus=4, min_runtime_s=0)
    w.queue("b", cohort="c", gpus=4, min_runtime_s=0)
    _fill(w, "b", 4, NOW - 1000, prefix="old")  # four 1-GPU jobs, long running
    w.qsubmit("big", "b", gpus=4, submitted_at=NOW - 200)  # b borrows a's 4
    w.qcycle(now=NOW - 100)
    w.qcycle(w.agent_reports(NOW - 100), now=NOW - 100)
    assert w.holding("b") == 8
    w.qsubmit("first", "a", gpus=2, submitted_at=NOW - 10)
    plan = w.qcycle(now=NOW)
    # The cheapest victim: big ran 100 s on 4 GPUs, two old ones 1,000 s on one each.
    assert plan.preempted == {("reclaim", "a"): 1} and w.job("first").preempting == ["big:1"]
    freed = {i for t in w.tasks("h1") if t.job_id == "big" for i in t.gpu_indices}
    w.qsubmit("second", "a", gpus=2, submitted_at=NOW + 1)  # within a's quota too, no room
    plan = w.qcycle(now=NOW + 1)
    assert plan.placed == 0 and not plan.preempted and not w.job("second").preempting
    # big reports stopped: first takes 2 of its 4 GPUs, second the other 2, in that cycle.
    plan = w.qcycle(w.agent_reports(NOW + 20), now=NOW + 20)
    assert plan.placed == 2
    assert w.job("first").state is JobState.PLACED and w.job("second").state is JobState.PLACED
    assert {i for t in w.tasks("h1") if t.job_id in ("first", "second") for i in t.gpu_indices} == freed
    no_overcommit(w.state)
    assert (w.holding("a"), w.holding("b")) == (4, 4)


def test_preempted_tries_do_not_count_against_max_attempts() -> None:
    w = QWorld()
    w.host("h1", gpus=1)
    w.queue("a", gpus=1, min_runtime_s=0)
    w.qsubmit("low", "a", max_attempts=1, submitted_at=NOW - 500)
    w.qcycle(now=NOW - 400)
    w.qcycle(w.agent_reports(NOW - 400), now=NOW - 400)
    w.qsubmit("high", "a", priority=10)
    plan = w.qcycle(now=NOW)
    assert plan.preempted == {("priority", "a"): 1}
    plan = w.qcycle(w.agent_reports(NOW + 1), now=NOW + 1)
    assert w.job("high").state is JobState.PLACED
    low = w.job("low")
    assert low.state is JobState.QUEUED and low.attempts[0].state is AttemptState.PREEMPTED
    # high ends: low runs again though its single attempt was used.
    w.qcycle(w.agent_reports(NOW + 2), now=NOW + 2)
    high = w.job("high").current
    done = StatusReport(host_id="h1", attempt_id=high.id, job_id="high", state=AttemptState.SUCCEEDED, exit_code=0,
                        ts=NOW + 3)
    w.qcycle([done], now=NOW + 3)
    assert w.job("low").state is JobState.PLACED and w.job("low").tries == 2


def test_fair_share_preemption_evens_out_borrowing_by_weight() -> None:
    w = QWorld()
    w.host("h1", gpus=8)
    for name, gpus in (("a", 2), ("b", 2), ("idle", 4)):
        w.queue(name, cohort="c", gpus=gpus, min_runtime_s=0, fair_share_preemption=name == "b")
    _fill(w, "a", 8, NOW - 1000)  # a borrows all it can: b's 2 and the idle queue's 4
    for i in range(8):
        w.qsubmit(f"b{i}", "b", submitted_at=NOW - 10 + i)
    now = NOW
    for _ in range(6):
        w.qcycle(w.agent_reports(now), now=now)
        no_overcommit(w.state)
        now += 1
    # b took back its nominal (reclaim), then what a borrowed from the idle queue was
    # shared out by fair share until the shares met.
    assert (w.holding("a"), w.holding("b")) == (4, 4)
    kinds = {a.reason.split(")")[0].split("(")[-1] for j in w.state.jobs.values() for a in j.attempts
             if a.state is AttemptState.PREEMPTED}
    assert kinds == {"reclaim", "fair-share"}


def _stoppable_kept(state: ClusterState) -> None:
    """The facts the state keeps for searches for victims are the job records' own."""
    kept = {job_id: (f.started_at, f.size) for job_id, f in state.victims.facts.items()}
    assert kept == {j.id: f for j in state.jobs.values() if (f := stoppable(j)) is not None}


def test_the_state_keeps_which_running_jobs_could_be_stopped() -> None:
    """ClusterState.victims follows each job record (placed, running, stopping,
    requeued), so the victim search reads it instead of every running job's attempts."""
    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("a", cohort="c", gpus=4, min_runtime_s=0)
    w.queue("b", cohort="c", gpus=4, min_runtime_s=0)
    w.qsubmit("b0", "b", gpus=2, submitted_at=NOW - 1000)
    w.qcycle(now=NOW - 1000)
    _stoppable_kept(w.state)
    assert "b0" not in w.state.victims.facts  # placed, not started: not a victim yet
    w.qcycle(w.agent_reports(NOW - 990), now=NOW - 990)
    b0 = w.state.victims.facts["b0"]
    assert (b0.started_at, b0.size) == (NOW - 990, 2.0)  # since its start, 2 GPUs
    _fill(w, "b", 4, NOW - 900, prefix="bf")  # b borrows 2 of a's 4
    _stoppable_kept(w.state)
    w.qsubmit("a0", "a", gpus=2, submitted_at=NOW - 10)
    w.qsubmit("a1", "a", gpus=2, submitted_at=NOW - 9)
    plan = w.qcycle(now=NOW)
    assert plan.preempted  # reclaim: b's victims stopping are no longer stoppable
    stopping = {t.job_id for t in w.tasks("h1") if t.stop}
    assert stopping and not stopping & set(w.state.victims.facts)
    _stoppable_kept(w.state)
    w.qcycle(w.agent_reports(NOW + 20), now=NOW + 20)  # stopped and requeued; a's placed
    _stoppable_kept(w.state)
    assert not stopping & set(w.state.victims.facts)


def test_min_runtime_and_disabled_preemption_protect_running_jobs() -> None:
    w = QWorld()
    w.host("h1", gpus=1)
    w.queue("a", gpus=1, min_runtime_s=600)
    w.qsubmit("low", "a", submitted_at=NOW - 500)
    w.qcycle(now=NOW - 100)
    w.qcycle(w.agent_reports(NOW - 100), now=NOW - 100)
    w.qsubmit("high", "a", priority=10)
    assert not w.qcycle(now=NOW).preempted  # low ran 100 s of its 600 s minimum
    w.queue("a", gpus=1, min_runtime_s=0, preempt_within=False)
    assert not w.qcycle(now=NOW + 1).preempted  # priority preemption switched off


def test_time_limit_stops_the_try_and_ends_the_job_timeout() -> None:
    w = QWorld()
    w.host("h1")
    w.queue("a", default_time_limit_s=60, max_time_limit_s=120, preempt_grace_s=5)
    w.qsubmit("short", "a")
    w.qsubmit("long", "a", time_limit_s=1000)  # capped at the queue's maximum
    w.qcycle(now=NOW)
    w.qcycle(w.agent_reports(NOW), now=NOW)
    assert w.job("long").current.time_limit_s == 120
    assert w.state.deadlines == {"short": NOW + 60, "long": NOW + 120}
    plan = w.qcycle(now=NOW + 61)
    assert plan.timed_out == 1
    [t] = [t for t in w.tasks("h1") if t.job_id == "short"]
    assert t.stop and t.grace_s == 5 and "time limit" in t.stop_reason
    w.qcycle(w.agent_reports(NOW + 63), now=NOW + 63)
    j = w.job("short")
    assert j.state is JobState.TIMEOUT and j.current.state is AttemptState.TIMEOUT
    assert "time limit of 60 s" in j.end_reason
    assert w.job("long").state is JobState.RUNNING


def test_a_time_limit_of_days_is_told_in_days() -> None:
    """Found by exploring: a job with a 30-day limit ended "time limit of 2.592e+06 s reached"."""
    w = QWorld()
    w.host("h1")
    w.queue("a", preempt_grace_s=5)
    w.qsubmit("month", "a", time_limit_s=30 * 86400)
    w.qcycle(now=NOW)
    w.qcycle(w.agent_reports(NOW), now=NOW)
    w.qcycle(now=NOW + 30 * 86400 + 1)
    [t] = w.tasks("h1")
    assert t.stop and t.stop_reason == "time limit of 30d reached", t.stop_reason
    w.qcycle(w.agent_reports(NOW + 30 * 86400 + 3), now=NOW + 30 * 86400 + 3)
    assert w.job("month").state is JobState.TIMEOUT and w.job("month").end_reason == "time limit of 30d reached"


def test_a_time_limit_passed_before_a_drains_deadline_ends_the_try_timeout_when_one_cycle_sees_both() -> None:
    """Found by exploring: a limit (NOW+60) and the host's drain deadline (NOW+65) both
    passed when a cycle came (NOW+70: a new leader's first, a slow one): the drain's stop
    came first, and the try was requeued uncounted, to run again with a fresh limit. The
    earlier of the two ends it; a drain that came first still requeues it."""
    from server.state.cluster import HostConfig
    from wire.messages import AdvanceReservation
    from wire.records import Record

    def ended_with(key: str, value: bytes) -> JobState:
        """A 60 s try running from NOW, the record `key` stored, and a cycle at NOW+70: how
        its job is then."""
        w = QWorld()
        w.host("h1")
        w.queue("a", preempt_grace_s=5)
        w.qsubmit("j", "a", time_limit_s=60, max_attempts=1)
        w.qcycle(now=NOW)
        w.qcycle(w.agent_reports(NOW), now=NOW)
        w.state.apply_state_record(Record(key, next(w.rev), value))
        w.qcycle(now=NOW + 70)
        w.qcycle(w.agent_reports(NOW + 71), now=NOW + 71)
        return w.job("j").state

    for drain_at, expect in ((NOW + 65, JobState.TIMEOUT), (NOW + 55, JobState.QUEUED)):
        cfg = HostConfig(cordoned=True, draining=True, drain_deadline=drain_at, reason="reboot", by="alice")
        got = ended_with("hostcfg.h1", cfg.model_dump_json().encode())
        assert got is expect, (drain_at - NOW, got)
    # The same for an advance reservation that sets the host aside for another queue (a
    # review): one that began before the limit stops the try as its own, requeued.
    for starts, expect in ((NOW + 65, JobState.TIMEOUT), (NOW + 55, JobState.QUEUED)):
        r = AdvanceReservation(name="launch", hosts=["h1"], queues=["other"], starts=starts, ends=NOW + 4000)
        got = ended_with("advres.launch", encode(r))
        assert got is expect, (starts - NOW, got)


def test_a_running_jobs_time_limit_is_changed_for_its_try_and_a_shorter_one_stops_it() -> None:
    """`updateJob(timeLimitSeconds)`: the job's limit and its running try's change at
    once, the deadline moves with them; a limit the try has run past stops it in the next
    cycle (TIMEOUT). A try being stopped keeps its end; a queued job's limit is capped at
    placement by its queue's maximum, as always."""
    from wire.messages import Command

    def limit(job_id: str, seconds: float, at: float) -> Command:
        return Command(kind="update", job_id=job_id, by="ops", time_limit_s=seconds, ts=at)

    w = QWorld()
    w.host("h1")
    w.queue("a", max_time_limit_s=3600, preempt_grace_s=5)
    w.qsubmit("train", "a", time_limit_s=600)
    w.qsubmit("eval", "a", time_limit_s=600)
    w.qcycle(now=NOW)
    w.qcycle(w.agent_reports(NOW), now=NOW)
    assert w.state.deadlines == {"train": NOW + 600, "eval": NOW + 600}
    plan = w.qcycle(commands=[limit("train", 7200, NOW + 10)], now=NOW + 10)  # an admin's raise
    assert plan.jobs["train"].spec.time_limit_s == 7200 and plan.jobs["train"].current.time_limit_s == 7200
    assert [e.message for e in plan.events if e.kind == "job.updated"] == ["time limit 600 s -> 7200 s"]
    assert w.state.deadlines == {"train": NOW + 7200, "eval": NOW + 600}
    assert w.qcycle(commands=[limit("train", 7200, NOW + 11)], now=NOW + 11).ignored == 1  # nothing to change
    # Lowered below what it has run: stopped in the next cycle, and it ends TIMEOUT.
    w.qcycle(commands=[limit("eval", 5, NOW + 20)], now=NOW + 20)
    plan = w.qcycle(now=NOW + 21)
    assert plan.timed_out == 1
    [t] = [t for t in w.tasks("h1") if t.job_id == "eval"]
    assert t.stop and "time limit of 5 s" in t.stop_reason
    # While it is being stopped, its limit stays.
    assert w.qcycle(commands=[limit("eval", 900, NOW + 22)], now=NOW + 22).ignored == 1
    w.qcycle(w.agent_reports(NOW + 23), now=NOW + 23)
    assert w.job("eval").state is JobState.TIMEOUT and w.job("train").state is JobState.RUNNING
    # A queued job: its own limit changes; placed, it runs under the queue's maximum,
    # unless an admin set it past that (found by exploring: a queued job's raise was
    # accepted, and its try ran capped all the same).
    w.qsubmit("later", "a", time_limit_s=60)
    w.qsubmit("over", "a", time_limit_s=60)
    w.qsubmit("blocker", "a", gpus=8)  # not placed: train holds a GPU
    w.qcycle(commands=[limit("later", 5000, NOW + 30),
                       Command(kind="update", job_id="over", by="admin", time_limit_s=5000, time_limit_exempt=True,
                               ts=NOW + 30)], now=NOW + 30)
    assert w.job("later").spec.time_limit_s == 5000 and w.job("later").current.time_limit_s == 3600
    assert w.job("over").spec.time_limit_exempt and w.job("over").current.time_limit_s == 5000
    # The same limit, no longer exempt (an admin set it again within the maximum's rules):
    # a change, and later tries are capped again.
    plan = w.qcycle(commands=[limit("over", 5000, NOW + 31)], now=NOW + 31)
    assert plan.ignored == 0 and not w.job("over").spec.time_limit_exempt
    # An admin removes a running try's limit (0, exempt): it has no deadline any more.
    plan = w.qcycle(commands=[Command(kind="update", job_id="train", by="admin", time_limit_s=0,
                                      time_limit_exempt=True, ts=NOW + 32)], now=NOW + 32)
    assert [e.message for e in plan.events if e.kind == "job.updated"] == ["time limit 7200 s -> none"]
    assert w.job("train").current.time_limit_s == 0 and w.state.deadlines.get("train") is None


def test_a_new_leader_finishes_a_preemption_from_the_records() -> None:
    w = QWorld()
    w.host("h1", gpus=1)
    w.queue("a", gpus=1, min_runtime_s=0)
    w.qsubmit("low", "a", submitted_at=NOW - 500)
    w.qcycle(now=NOW - 100)
    w.qcycle(w.agent_reports(NOW - 100), now=NOW - 100)
    w.qsubmit("high", "a", priority=10)
    w.qcycle(now=NOW)
    reports = w.agent_reports(NOW + 5)
    # A new leader: a state rebuilt from the stored records only.
    fresh = QWorld()
    fresh.host("h1", gpus=1)
    for key in sorted(w.state.revisions):
        kind, _, name = key.partition(".")
        if kind == "job":
            fresh.state.apply_state_record(Record(key, next(fresh.rev), encode(w.state.jobs[name])))
        elif kind == "alloc":
            fresh.alloc_record(w.state.allocs[name])
        elif kind == "queue":
            fresh.state.apply_state_record(Record(key, next(fresh.rev), encode(w.state.queues[name])))
    assert not fresh.qcycle(now=NOW + 1).preempted  # it waits for the victim, preempts nothing new
    fresh.qcycle(reports, now=NOW + 5)
    assert fresh.job("high").state is JobState.PLACED
    assert fresh.job("low").current.state is AttemptState.PREEMPTED
    no_overcommit(fresh.state)


# ---------------------------------------------------------------- properties


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[tuple[str, float | None]], list[tuple[str, int, int, int]]]:
    """Queues (name, borrowing limit) and jobs (queue, GPUs, priority, wave): the first
    wave comes from the first queues and borrows, the second from all and reclaims."""
    nq = draw(st.integers(2, 4))
    queues = [(f"q{i}", draw(st.none() | st.integers(0, 8).map(float))) for i in range(nq)]
    jobs = draw(st.lists(st.tuples(st.integers(0, nq - 1), st.integers(1, 2), st.integers(0, 3), st.integers(0, 1)),
                         min_size=8, max_size=40))
    return queues, [(f"q{q if wave else q % 2}", g, p, wave) for q, g, p, wave in jobs]


def cohort_world(queues: list[tuple[str, float | None]], per_user: list[float], nhosts: int,
                 gpus: int) -> tuple[QWorld, dict[str, Queue]]:
    """`nhosts` hosts of `gpus` GPUs; the queues in one cohort, their nominal quotas
    sharing the cluster out, reclaim on, each with its per-user limit (0: none); every
    other queue with fair share between its users (scheduling.userfair)."""
    w = QWorld()
    for h in range(nhosts):
        w.host(f"h{h}", gpus=gpus)
    for k, (name, borrow) in enumerate(queues):
        w.queue(name, cohort="c", gpus=gpus * nhosts / len(queues), borrow=borrow, min_runtime_s=0,
                max_gpus_per_user=per_user[k], fair_share_users=k % 2 == 1)
    return w, dict(w.state.queues)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.integers(0, 2**16), st.lists(st.sampled_from([0.0, 0.0, 2.0, 3.0]), min_size=4, max_size=4))
def test_cycles_keep_quotas_never_overcommit_and_reclaim_unblocks_queues_below_nominal(
        scenario, seed: int, per_user: list[float]) -> None:
    queues, jobs = scenario
    w, configs = cohort_world(queues, per_user, len(queues) // 2 + 1, 8)
    # Jobs arrive in two waves: what the first wave borrows, the second reclaims.
    now = NOW
    for step in range(24):
        for i, (q, g, p, wave) in enumerate(jobs):
            if step == 8 * wave:
                w.qsubmit(f"j{i}", q, gpus=g, priority=p, submitted_at=now - 100 + i, user=f"u{(seed >> i) & 1}")
        w.qcycle(w.agent_reports(now), now=now)
        no_overcommit(w.state)
        usage = queue_usage(w.state.jobs.values())
        for name, q in configs.items():
            rq = q.quota[H100]
            limit = nominal(q, H100) + (rq.borrowing_limit if rq.borrowing_limit is not None else 1e9)
            # A queue may hold more than nominal + borrowing only while its victims stop
            # (never through a placement): count only tasks not told to stop.
            held = sum(len(t.gpu_indices) for a in w.state.allocs.values() for t in a.tasks
                       if not t.stop and w.state.jobs[t.job_id].spec.queue == name)
            assert held <= limit + 1e-6, (name, held, limit, usage)
            # No user of a queue with a per-user limit is ever placed past it.
            for user in ("u0", "u1"):
                mine = sum(len(t.gpu_indices) for a in w.state.allocs.values() for t in a.tasks
                           if not t.stop and w.state.jobs[t.job_id].spec.queue == name
                           and w.state.jobs[t.job_id].spec.user == user)
                assert not q.max_gpus_per_user or mine <= q.max_gpus_per_user, (name, user, mine)
        now += 1
    # Quiescence: a queue waiting with a job that fits within its nominal quota does not
    # wait behind borrowers: nobody in the cohort holds more than its nominal (a job its
    # user's per-user limit holds back waits by design).
    book = QueueBook(w.state.queues, queue_usage(w.state.jobs.values()))
    for j in w.state.queued():
        q = w.state.queues[j.spec.queue]
        mine = user_gpus(w.state.jobs.values(), j.spec.queue).get(j.spec.user, 0.0)
        if q.max_gpus_per_user and mine + j.spec.gpus > q.max_gpus_per_user:
            continue
        if book.within_nominal(j.spec.queue, job_demand(j.spec, "H100")) and meters(q, H100):
            borrowers = [n for n in configs if book.used(n, H100) > nominal(configs[n], H100) + 1e-6]
            # What is free plus what the borrowers hold above nominal cannot host the job.
            assert not borrowers or j.spec.gpus > 1, (j.id, borrowers, book.usage)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.integers(0, 2**16), st.lists(st.sampled_from([0.0, 2.0, 3.0]), min_size=4, max_size=4),
       st.lists(st.sampled_from(["AB", "BA"]), min_size=24, max_size=24))
def test_pipelined_cycles_keep_quotas_and_per_user_limits(scenario, seed: int, per_user: list[float],
                                                           orders: list[str]) -> None:
    """As the scheduler runs them: each step plans cycle A, then cycle B while A's commit
    is in flight (A's records frozen, its job records pending, with what they hold or
    not), and stores them in either order. No queue holds more than its nominal quota plus its borrowing limit, and no
    user more than its queue's per-user limit, in tasks not told to stop."""
    queues, jobs = scenario
    w, configs = cohort_world(queues, per_user, len(queues) // 2 + 2, 4)
    policy = QueuePolicy(half_life_s=0)
    now = NOW
    for step in range(24):
        for i, (q, g, p, wave) in enumerate(jobs):
            if step == 8 * wave:
                w.qsubmit(f"j{i}", q, gpus=g, priority=p, submitted_at=now - 100 + i, user=f"u{(seed >> i) & 1}")
        reports = w.agent_reports(now)
        half = len(reports) // 2
        a = plan_cycle(w.state, reports=reports[:half], commands=[], now=now, term=TERM, queues=policy)
        b = plan_cycle(w.state, reports=reports[half:], commands=[], now=now, term=TERM, queues=policy,
                       frozen_jobs=set(a.jobs), frozen_hosts=set(a.allocs), pending=a.jobs,
                       # what A's records hold as the scheduler passes it (every other step)
                       pending_held={j: job_usage(r) for j, r in a.jobs.items()} if step % 2 else None)
        for name in orders[step]:
            w.commit(a if name == "A" else b)
            no_overcommit(w.state)
            for qn, q in configs.items():
                rq = q.quota[H100]
                limit = nominal(q, H100) + (rq.borrowing_limit if rq.borrowing_limit is not None else 1e9)
                live = [(w.state.jobs[t.job_id].spec.user, len(t.gpu_indices)) for al in w.state.allocs.values()
                        for t in al.tasks if not t.stop and w.state.jobs[t.job_id].spec.queue == qn]
                assert sum(n for _u, n in live) <= limit + 1e-6, (qn, live, limit)
                for user in ("u0", "u1"):
                    mine = sum(n for u, n in live if u == user)
                    assert not q.max_gpus_per_user or mine <= q.max_gpus_per_user, (qn, user, mine)
        now += 1


def test_why_pending_says_what_reclaim_waits_for() -> None:
    """A job within its queue's nominal quota, the rest lent out: reclaim waits for the
    borrowers' minimum runtime (and says when it ends), or is off for the queue."""
    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("a", cohort="c", gpus=4, min_runtime_s=0)
    w.queue("b", cohort="c", gpus=4, min_runtime_s=60)
    _fill(w, "b", 8, NOW - 18)  # started at NOW - 10: 8 GPUs, 4 of them a's
    w.qsubmit("mine", "a", gpus=4)
    why = {r.reason: r.detail for r in reasons(w.state, w.state.jobs["mine"], NOW, 0.0)}
    assert why[RECLAIM_WAIT] == ("queue b borrows gpu:H100, but its 8 running job(s) have run less than its "
                                 "minimum runtime (60 s): the first may be stopped in 50 s")
    assert not w.qcycle(now=NOW).preempted  # as it says
    w.queue("a", cohort="c", gpus=4, min_runtime_s=0, reclaim=False)
    why = {r.reason: r.detail for r in reasons(w.state, w.state.jobs["mine"], NOW + 60, 0.0)}
    assert why[RECLAIM_WAIT] == "reclaim is off for queue a: what b borrowed comes back only as their jobs end"
    w.queue("a", cohort="c", gpus=4, min_runtime_s=0)
    assert RECLAIM_WAIT not in {r.reason for r in reasons(w.state, w.state.jobs["mine"], NOW + 60, 0.0)}
    assert w.qcycle(now=NOW + 60).preempted  # old enough now: reclaim takes them back


def test_why_pending_says_what_reclaim_from_an_unmetered_queue_waits_for() -> None:
    """A queue's job within its nominal quota that its quota admits, the hosts full of the
    unmetered default queue's young jobs: no quota refusal to show, yet the job waits for
    reclaim (every GPU of an unmetered queue counts as borrowed), and says until when."""
    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("r", gpus=2, min_runtime_s=0)
    _fill(w, "default", 8, NOW - 18)  # started at NOW - 10; the implicit default's minimum runtime is 60 s
    w.qsubmit("mine", "r", gpus=1)
    job = w.state.jobs["mine"]
    assert reasons(w.state, job, NOW, 0.0) == []  # without knowing that no host has room: nothing at queue level
    why = {r.reason: r.detail for r in reasons(w.state, job, NOW, 0.0, fits_now=False)}
    assert why == {RECLAIM_WAIT: "queue default borrows gpu:H100, but its 8 running job(s) have run less than its "
                                 "minimum runtime (60 s): the first may be stopped in 50 s"}
    assert not w.qcycle(now=NOW).preempted  # as it says
    assert RECLAIM_WAIT not in {r.reason for r in reasons(w.state, job, NOW + 60, 0.0, fits_now=False)}
    assert w.qcycle(now=NOW + 60).preempted  # old enough now: reclaim takes one back


def test_the_job_view_tries_a_placement_only_for_a_job_its_quota_admits(monkeypatch: pytest.MonkeyPatch) -> None:
    """`JobView.queue_reasons` finds out whether a host has room (a placement) only when
    the job's queue admits it; a job its quota refuses is explained by the quota alone."""
    import server.views.jobs as jobs_view
    from server.views.jobs import JobView

    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("r", gpus=2, min_runtime_s=0)
    _fill(w, "default", 8, NOW - 18)
    w.qsubmit("mine", "r", gpus=1)  # admitted; no host has room
    w.qsubmit("big", "r", gpus=4)  # over r's nominal quota of 2, no cohort
    tries = []
    real = jobs_view.Placer.place
    monkeypatch.setattr(jobs_view.Placer, "place",
                        lambda self, spec, *a: tries.append(spec.name) or real(self, spec, *a))
    view = JobView(w.state, None, half_life_s=0.0)
    assert RECLAIM_WAIT in {r.reason for r in view.queue_reasons(w.state.jobs["mine"], NOW)}
    assert tries == ["mine"]
    assert OVER_QUOTA in {r.reason for r in view.queue_reasons(w.state.jobs["big"], NOW)}
    assert tries == ["mine"]  # no placement for the job its quota refuses


def test_a_users_jobs_stop_at_the_queues_per_user_limit_and_preempt_nothing() -> None:
    """One user's long array takes the queue's per-user limit and no more: a teammate's
    later job of the same queue is placed past it, and nothing is preempted for it."""
    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("team", gpus=8, max_gpus_per_user=3, min_runtime_s=0)
    for i in range(6):
        w.qsubmit(f"big{i}", "team", gpus=1, submitted_at=NOW - 100 + i, user="alice")
    w.qsubmit("mate", "team", gpus=2, submitted_at=NOW - 50, user="bob")
    plan = w.qcycle()
    placed = sorted(j.id for j in plan.jobs.values() if j.state is JobState.PLACED)
    assert placed == ["big0", "big1", "big2", "mate"] and not plan.preempted
    held = {u: sum(len(t.gpu_indices) for a in w.state.allocs.values() for t in a.tasks
                   if w.state.jobs[t.job_id].spec.user == u) for u in ("alice", "bob")}
    assert held == {"alice": 3, "bob": 2}
    why = {r.reason: r.detail for r in reasons(w.state, w.state.jobs["big3"], NOW, 0.0)}
    assert why[USER_LIMIT] == "alice holds 3 GPUs of queue team + 1 wanted > its per-user limit 3"
    # A job of hers that outranks her running ones may not take her past the limit either,
    # nor preempt for it: it waits for one of hers to end.
    w.qcycle(w.agent_reports(NOW), now=NOW)
    w.qsubmit("urgent", "team", gpus=1, priority=10, submitted_at=NOW, user="alice")
    assert not w.qcycle(now=NOW + 1).preempted and w.state.jobs["urgent"].state is JobState.QUEUED
    done = StatusReport(host_id="h1", attempt_id="big0.1", job_id="big0", state=AttemptState.SUCCEEDED,
                        exit_code=0, ts=NOW + 2)
    w.qcycle([done], now=NOW + 2)
    assert w.state.jobs["urgent"].state is JobState.PLACED and w.state.jobs["big3"].state is JobState.QUEUED


def test_a_cancelled_job_still_stopping_counts_against_its_users_limit() -> None:
    """A user at her per-user limit cancels a job: its task runs out its stop's grace on
    its GPU, and her next job waits until it has stopped (found by a review: a job that
    ended while its task stopped held no GPU of its user's, who could go past the limit
    with GPUs still held; the queue's quota counted them)."""
    from tests.unit.test_planner import cancel

    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("team", gpus=8, max_gpus_per_user=3, min_runtime_s=0)
    for i in range(4):
        w.qsubmit(f"big{i}", "team", gpus=1, submitted_at=NOW - 100 + i, user="alice")
    w.qcycle()
    w.qcycle(w.agent_reports(NOW), now=NOW)
    w.qcycle(commands=[cancel("big0")], now=NOW + 1)
    assert w.state.jobs["big0"].stopping and w.state.jobs["big3"].state is JobState.QUEUED
    assert user_gpus(w.state.jobs.values(), "team") == w.state.user_usage["team"] == {"alice": 3.0}
    w.qcycle(now=NOW + 2)
    assert w.state.jobs["big3"].state is JobState.QUEUED
    killed = StatusReport(host_id="h1", attempt_id="big0.1", job_id="big0", state=AttemptState.KILLED,
                          exit_code=-15, ts=NOW + 3)
    w.qcycle([killed], now=NOW + 3)
    w.qcycle(now=NOW + 4)
    assert not w.state.jobs["big0"].stopping and w.state.jobs["big3"].state is JobState.PLACED


def test_preemption_for_a_user_stops_at_the_users_limit() -> None:
    """Reclaim starts only for what a user may still take: with a per-user limit of 3 and
    jobs of 2, 2, 2 and 1 GPUs, it stops 3 GPUs' worth (for a 2 and the 1), not 7, and no
    preemptor waits for ever past its user's limit holding the GPUs its victims freed
    (found by the quota property: two preemptors over the limit kept 4 GPUs idle)."""
    w, _configs = cohort_world([("big", None), ("small", None)], [0.0, 3.0], 2, 8)
    _fill(w, "big", 16, NOW - 100)  # big borrows all of small's 8 GPUs
    for i, g in enumerate((2, 2, 2, 1)):
        w.qsubmit(f"s{i}", "small", gpus=g, submitted_at=NOW - 10 + i, user="alice")
    plan = w.qcycle(now=NOW)
    assert sum(plan.preempted.values()) == 3
    for step in range(1, 4):
        w.qcycle(w.agent_reports(NOW + step), now=NOW + step)
    running = {j.id for j in w.state.jobs.values() if j.spec.queue == "small" and j.state is JobState.RUNNING}
    assert running == {"s0", "s3"} and not any(j.preempting for j in w.state.jobs.values())


def test_pipelined_cycles_count_what_the_commits_in_flight_place() -> None:
    """The scheduler plans a cycle while the last one's commit is in flight: what that
    commit places counts against the queue's quota and its users' limits, so that two
    cycles do not each admit up to the same limit (found by hand: a queue with a quota of
    1 GPU held 2, one job on each of two hosts)."""
    w = QWorld()
    w.host("h1", gpus=2)
    w.host("h2", gpus=2)
    w.queue("lab", gpus=1, min_runtime_s=0)
    w.queue("team", gpus=8, max_gpus_per_user=1, min_runtime_s=0)
    for name, queue in (("lab0", "lab"), ("lab1", "lab"), ("t0", "team"), ("t1", "team")):
        w.qsubmit(name, queue, gpus=1, user="alice")
    plan_a = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, queues=QueuePolicy(half_life_s=0),
                        placements=2)  # a cycle that placed lab0 and t0 on one host, not yet stored
    placed_a = {j.id for j in plan_a.jobs.values() if j.state is JobState.PLACED}
    assert placed_a == {"lab0", "t0"}, placed_a
    plan_b = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, queues=QueuePolicy(half_life_s=0),
                        frozen_jobs=set(plan_a.jobs), frozen_hosts=set(plan_a.allocs), pending=plan_a.jobs)
    assert plan_b.placed == 0, {j.id for j in plan_b.jobs.values()}
    # Without the records in flight, the same cycle would have placed both again.
    blind = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, queues=QueuePolicy(half_life_s=0),
                       frozen_jobs=set(plan_a.jobs), frozen_hosts=set(plan_a.allocs))
    assert {j.id for j in blind.jobs.values() if j.state is JobState.PLACED} == {"lab1", "t1"}


def test_a_pipelined_cycle_counts_the_preemptions_in_flight() -> None:
    """A reclaim planned by a cycle whose commit is in flight is under way for the next
    cycle: it does not stop more of the lender's jobs for another job of the reclaiming
    queue (which would take the lender below its nominal quota)."""
    w = QWorld()
    w.host("h1", gpus=8)
    w.host("h2", gpus=8)
    w.queue("a", cohort="c", gpus=8, min_runtime_s=0)
    w.queue("b", cohort="c", gpus=8, min_runtime_s=0)
    _fill(w, "b", 8, NOW - 200)  # b borrows a's 8 GPUs: its older jobs on one host,
    _fill(w, "b", 8, NOW - 100, prefix="late")  # its younger (cheaper to stop) on the other
    late_host = {a.host_id for j in w.state.jobs.values() if j.id.startswith("late") for a in j.attempts}
    assert len(late_host) == 1
    w.qsubmit("p1", "a", gpus=8, submitted_at=NOW - 10)
    policy = QueuePolicy(half_life_s=0)
    plan_a = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, queues=policy)
    assert len(plan_a.jobs["p1"].preempting) == 8 and plan_a.preempted == {("reclaim", "a"): 8}
    assert set(plan_a.allocs) == late_host
    w.qsubmit("p2", "a", gpus=1, submitted_at=NOW - 5)  # arrives while plan_a is being stored
    frozen = dict(frozen_jobs=set(plan_a.jobs), frozen_hosts=set(plan_a.allocs))
    plan_b = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, queues=policy, pending=plan_a.jobs,
                        **frozen)  # type: ignore[arg-type]
    assert not plan_b.preempted and "p2" not in plan_b.jobs
    # Not knowing of plan_a's reclaim, the same cycle would stop a fifth job of b, leaving
    # b below its nominal quota.
    blind = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, queues=policy,
                       **frozen)  # type: ignore[arg-type]
    assert blind.preempted == {("reclaim", "a"): 1} and len(blind.jobs["p2"].preempting) == 1


def test_why_pending_says_what_priority_preemption_waits_for() -> None:
    """A high-priority job its full queue refuses: the lower-priority jobs are younger than
    the queue's minimum runtime (and when the first may go), or priority preemption is off."""
    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("a", gpus=4, min_runtime_s=60)
    _fill(w, "a", 4, NOW - 14)  # started at NOW - 10
    w.qsubmit("urgent", "a", priority=10)
    why = {r.reason: r.detail for r in reasons(w.state, w.state.jobs["urgent"], NOW, 0.0)}
    assert why[PRIORITY_WAIT] == ("its queue's 4 lower-priority running job(s) have run less than its minimum "
                                  "runtime (60 s): the first may be stopped in 50 s")
    assert not w.qcycle(now=NOW).preempted
    w.queue("a", gpus=4, min_runtime_s=60, preempt_within=False)
    why = {r.reason: r.detail for r in reasons(w.state, w.state.jobs["urgent"], NOW + 60, 0.0)}
    assert why[PRIORITY_WAIT] == ("priority preemption is off for queue a: its 4 lower-priority running job(s) "
                                  "are not stopped for this one")
    w.queue("a", gpus=4, min_runtime_s=60)
    assert PRIORITY_WAIT not in {r.reason for r in reasons(w.state, w.state.jobs["urgent"], NOW + 60, 0.0)}
    assert w.qcycle(now=NOW + 60).preempted
    w.qsubmit("peer", "a", priority=0)  # no lower-priority job to stop for it: no such reason
    assert PRIORITY_WAIT not in {r.reason for r in reasons(w.state, w.state.jobs["peer"], NOW + 60, 0.0)}


user_record = st.builds(
    lambda i, state, queue, user, gpus, share, tasks: make_job(
        f"j{i}", state=state,
        spec=job_spec(f"j{i}", queue=queue, user=user, gpus=0 if share else gpus, gpu_share=share,
                      replicas=len(tasks) or 1),
        attempts=[Attempt(id=f"j{i}.1.{t}", number=1, task=t, host_id="h", state=s) for t, s in enumerate(tasks)]),
    st.integers(0, 7), st.sampled_from([JobState.QUEUED, JobState.PLACED, JobState.RUNNING, JobState.SUCCEEDED]),
    st.sampled_from(["a", "b"]), st.sampled_from(["u0", "u1"]), st.integers(0, 4), st.sampled_from([0, 0, 250]),
    st.lists(st.sampled_from([AttemptState.PLACED, AttemptState.RUNNING, AttemptState.SUCCEEDED,
                              AttemptState.KILLED]), max_size=3))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(user_record, st.integers(0, 7)), max_size=40))
def test_the_per_user_tally_kept_equals_one_worked_out_afresh(steps: list) -> None:
    """Records set and dropped in any order (a job's user, queue, size and tries changing
    between its records): what the state keeps per queue and user is what `user_gpus`
    works out from every record, per queue what `queue_usage` does, and per job what
    `job_usage` does."""
    state = ClusterState()
    for step in steps:
        set_or_drop(state, step)
        assert state.held == {j.id: u for j in state.jobs.values() if (u := job_usage(j))}
        fresh = queue_usage(state.jobs.values())
        assert {q: u for q, u in state.queue_usage.items() if u}.keys() == {q for q, u in fresh.items() if u}
        for q, u in fresh.items():
            assert all(abs(state.queue_usage[q].get(r, 0.0) - v) < 1e-6 for r, v in u.items())
        afresh = {q: u for q in ("a", "b") if (u := user_gpus(state.jobs.values(), q))}
        assert state.user_usage.keys() == afresh.keys()
        for q, users in afresh.items():
            assert state.user_usage[q].keys() == users.keys()
            assert all(abs(state.user_usage[q][u] - g) < 1e-6 for u, g in users.items())


def test_a_job_holding_a_reservation_looks_for_victims_on_its_own_reserved_host() -> None:
    """Each blocked job's victims are looked for where it may go: a job that holds a
    reservation may preempt on its own reserved hosts, whichever job the cycle looked at
    last (here one kept off those hosts)."""
    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("team", gpus=16, min_runtime_s=60)
    w.qsubmit("low", "team", gpus=8, submitted_at=NOW - 100)
    w.qcycle(now=NOW - 30)
    w.qcycle(reports=w.agent_reports(NOW - 30), now=NOW - 30)
    assert w.state.jobs["low"].state is JobState.RUNNING
    w.qsubmit("high", "team", gpus=8, priority=10, submitted_at=NOW - 20)
    w.qsubmit("other", "team", gpus=1, submitted_at=NOW - 10)  # after high in order; no time limit
    plan = w.qcycle(now=NOW)
    assert [r.job_id for r in plan.reservations] == ["high"] and not plan.preempted  # low is too young
    plan = w.qcycle(now=NOW + 40)  # low has run 70 s
    assert plan.preempted and w.state.jobs["high"].preempting, plan.preempted


def test_priority_preemption_stops_no_victim_on_a_model_the_queue_may_not_use_now() -> None:
    """A job that accepts H100 or A100, whose queue's quota now admits it on H100 only,
    finds no room on H100: a lower-priority job of its queue on an A100 is no victim,
    since what it would free is a model the job may not be placed on."""
    w = QWorld()
    w.host("h1", gpus=1)
    w.host("a1", gpus=1, model="A100")

    def queue(name: str, h100: float, a100: float) -> None:
        q = Queue(name=name, min_runtime_s=0, quota={H100: ResourceQuota(nominal=h100),
                                                     "gpu:A100": ResourceQuota(nominal=a100)})
        w.state.apply_state_record(Record(f"queue.{name}", next(w.rev), encode(q)))

    queue("a", 1, 1)
    queue("b", 1, 0)
    w.qsubmit("low-a100", "a", gpu_model="A100", submitted_at=NOW - 500)
    w.qsubmit("b-h100", "b", gpu_model="H100", submitted_at=NOW - 500)
    w.qcycle(now=NOW - 400)
    w.qcycle(w.agent_reports(NOW - 400), now=NOW - 400)
    assert w.job("low-a100").state is JobState.RUNNING and w.job("b-h100").state is JobState.RUNNING
    queue("a", 1, 0)  # its A100 quota taken away: it holds one it may keep, but no new one
    w.qsubmit("high", "a", gpu_models=["H100", "A100"], priority=10)
    plan = w.qcycle(now=NOW)
    assert plan.preempted == {} and w.job("low-a100").state is JobState.RUNNING
    assert w.job("high").state is JobState.QUEUED and not w.job("high").preempting


def test_a_queue_whose_jobs_all_wait_for_their_begin_time_is_not_counted_as_waiting() -> None:
    """The queues' fairness (`queueFairness`, `queuesWaiting`) is over the queues with jobs
    that could be placed now, as the starvation alert is: one whose every job waits for its
    begin time is not one of them until then."""
    from server.views.queues import fairness

    w = QWorld()
    w.host("h1", gpus=1)
    w.queue("a", gpus=1)
    w.queue("b", gpus=1)
    w.qsubmit("runs", "a")
    w.qcycle(now=NOW)
    w.qsubmit("later", "b")
    later = w.job("later").model_copy(update={"not_before": NOW + 3600})
    w.state.apply_job(later, 10**9)
    w.qsubmit("waits", "a")
    assert fairness(w.state, NOW)[1] == 1  # a only
    assert fairness(w.state, NOW + 3601)[1] == 2  # b's job may be placed from its begin time


@pytest.mark.parametrize("first", [4, 3])
def test_reclaim_counts_what_the_same_cycle_placed(first: int) -> None:
    """Found by review: preemption decided on a book that lacked the cycle's own placements,
    so a job that would borrow (its queue brought to its nominal quota by a job placed
    earlier in the same cycle) reclaimed from a lender as if it were within it."""
    w = QWorld()
    w.host("h1", gpus=8)
    w.host("h2", gpus=first)
    w.queue("a", cohort="c", gpus=4, min_runtime_s=0)
    w.queue("b", cohort="c", gpus=4, min_runtime_s=0)
    w.queue("z", cohort="c", gpus=16, min_runtime_s=0)
    for i in range(8):
        w.qsubmit(f"b{i}", "b", submitted_at=NOW - 1000 + i)
    _placed_and_running(w, NOW - 990)  # b holds h1: it borrows 4
    w.qsubmit("a1", "a", gpus=first, submitted_at=NOW - 10)  # fills h2
    w.qsubmit("a2", "a", gpus=1, submitted_at=NOW - 9)  # no room left anywhere
    plan = w.qcycle(now=NOW)
    assert plan.jobs["a1"].state is JobState.PLACED
    if first == 4:  # a at its nominal quota: a2 would borrow, and reclaim has nothing to restore
        assert not plan.preempted and not w.job("a2").preempting
    else:  # a2 keeps a within its nominal quota: one of b's borrowed GPUs comes back
        assert plan.preempted == {("reclaim", "a"): 1} and len(w.job("a2").preempting) == 1


def test_a_priority_preemption_holds_back_no_other_queue() -> None:
    """Found by review: any preemption under way (a priority one within a queue too) held
    back every unmetered queue's jobs, the implicit `default` queue's, cluster-wide, for the
    victims' whole grace, with free GPUs elsewhere."""
    w = QWorld()
    w.host("h1", gpus=8)
    w.host("h2", gpus=4)
    w.queue("team", cohort="lab", gpus=16, min_runtime_s=0, preempt_grace_s=600)
    w.qsubmit("lo", "team", gpus=8, submitted_at=NOW - 1000)
    _placed_and_running(w, NOW - 990)
    w.qsubmit("hi", "team", gpus=8, priority=10, submitted_at=NOW - 20)
    plan = w.qcycle(now=NOW - 10)
    assert plan.preempted == {("priority", "team"): 1} and w.job("hi").preempting
    w.qsubmit("d1", "default", gpus=1, submitted_at=NOW - 5)
    plan = w.qcycle(now=NOW)  # lo still in its grace
    assert plan.jobs["d1"].state is JobState.PLACED and plan.jobs["d1"].attempts[-1].host_id == "h2"
    assert w.job("hi").preempting  # still waiting for lo


def test_a_preemptor_placed_by_a_commit_in_flight_counts_once_against_its_users_limit() -> None:
    """Found by review: a preemptor whose placement was in flight counted both as a waiting
    preemptor's claim and as its placed record, so its user's GPUs were counted twice and a
    job within the user's limit waited a cycle."""
    w = QWorld()
    w.host("h1", gpus=2)
    w.host("h2", gpus=1)
    w.queue("team", gpus=16, max_gpus_per_user=3, min_runtime_s=0, preempt_grace_s=5)
    w.qsubmit("lo", "team", gpus=2, submitted_at=NOW - 1000, user="bob")  # h1: h2 is too small
    _placed_and_running(w, NOW - 990)
    w.qsubmit("p", "team", gpus=2, priority=10, submitted_at=NOW - 100, user="ann")
    w.qcycle(now=NOW - 90)
    assert w.job("p").preempting
    w.qcycle(w.agent_reports(NOW - 80), now=NOW - 80, placements=0)  # lo stopped; p not placed yet
    policy = QueuePolicy(half_life_s=0)
    plan_a = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, queues=policy)
    assert plan_a.jobs["p"].state is JobState.PLACED
    w.qsubmit("j", "team", gpus=1, submitted_at=NOW - 1, user="ann")  # ann: 2 + 1, her limit
    plan_b = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, queues=policy,
                        frozen_jobs=set(plan_a.jobs), frozen_hosts=set(plan_a.allocs), pending=plan_a.jobs)
    assert plan_b.jobs["j"].state is JobState.PLACED


def test_an_over_share_queues_reservations_do_not_keep_fair_share_preemption_off_their_hosts() -> None:
    """Found by exploring: u1 (unmetered, fair-share preemption on) fills both hosts with
    two jobs left waiting, which reserve the hosts; u2 arrives with none of its share, and
    its fair-share preemption found every host held for u1's jobs, so it waited until u1's
    waiting jobs were cancelled. A reservation holds only against the jobs of queues that do
    not rank before its job's queue."""
    w = QWorld()
    w.host("h1", gpus=8)
    w.host("h2", gpus=8)
    for name in ("u1", "u2"):
        w.queue(name, fair_share_preemption=True, min_runtime_s=0, preempt_grace_s=3)
    policy = QueuePolicy()
    for i in range(18):
        w.qsubmit(f"a{i}", "u1", submitted_at=NOW - 60, group="g1")
    w.qcycle(now=NOW - 50, policy=policy)
    w.qcycle(w.agent_reports(NOW - 50), now=NOW - 50, policy=policy)
    for t in range(-45, -5, 5):  # the two left waiting reserve the hosts
        plan = w.qcycle(w.agent_reports(NOW + t), now=NOW + t, policy=policy)
    assert sorted(h for r in plan.reservations for h in r.hosts) == ["h1", "h2"]
    assert {r.job_id for r in plan.reservations} <= {f"a{i}" for i in range(18)}
    for i in range(4):
        w.qsubmit(f"b{i}", "u2", submitted_at=NOW, group="g2")
    plan = w.qcycle(now=NOW, policy=policy)
    assert plan.preempted == {("fair-share", "u2"): 4}
    assert all(len(w.job(f"b{i}").preempting) == 1 for i in range(4))


def test_after_a_quota_is_lowered_reclaim_stops_only_what_the_job_needs() -> None:
    """Found by exploring: r2's nominal quota lowered under what it holds overdraws the
    cohort's pool; a job of r1 within the part of its quota r1 does not lend was refused by
    the pool all the same, and reclaim stopped 4 of r2's jobs for 1 GPU, leaving 3 idle."""
    w = QWorld()
    w.host("h1", gpus=8)
    w.host("h2", gpus=8)
    w.queue("r1", cohort="rc", gpus=8, borrow=4, lend=2, min_runtime_s=0, preempt_grace_s=3)
    w.queue("r2", cohort="rc", gpus=8, min_runtime_s=0, preempt_grace_s=3)
    for i in range(16):
        w.qsubmit(f"b{i}", "r2", submitted_at=NOW - 1000 + i)
    for i in range(6):
        w.qsubmit(f"a{i}", "r1", submitted_at=NOW - 1000 + i)
    _placed_and_running(w, NOW - 990)
    assert (w.holding("r1"), w.holding("r2")) == (6.0, 10.0)
    w.queue("r2", cohort="rc", gpus=4, min_runtime_s=0, preempt_grace_s=3)
    w.queue("r1", cohort="rc", gpus=12, borrow=4, lend=2, min_runtime_s=0, preempt_grace_s=3)  # lends 2 of 12
    w.qsubmit("one", "r1", submitted_at=NOW - 5)
    plan = w.qcycle(now=NOW)
    assert plan.preempted == {("reclaim", "r1"): 1} and len(w.job("one").preempting) == 1


def test_why_pending_of_a_preemptor_does_not_count_its_victims_stopping_against_it() -> None:
    """Found by exploring: a high-priority job of a full queue, waiting for the victims it
    preempted, was also told 'over nominal quota: 8 held + 2 wanted > 8', the 8 counting
    the 2 victims stopping."""
    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("a", gpus=8, min_runtime_s=0, preempt_grace_s=30)
    _fill(w, "a", 8, NOW - 100)
    w.qsubmit("urgent", "a", gpus=2, priority=10)
    assert w.qcycle(now=NOW).preempted == {("priority", "a"): 2}
    why = {r.reason: r.detail for r in reasons(w.state, w.state.jobs["urgent"], NOW + 1, 0.0)}
    assert PREEMPTION_GRACE in why and OVER_QUOTA not in why, why


def test_why_pending_tells_the_grace_of_victims_of_the_implicit_default_queue() -> None:
    """Found by review: 'grace up to 0 s' for victims of the implicit default queue (30 s)."""
    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("a", fair_share_preemption=True, min_runtime_s=0)
    _fill(w, "default", 8, NOW - 100)
    w.qsubmit("mine", "a", gpus=1)
    assert w.qcycle(now=NOW).preempted
    why = {r.reason: r.detail for r in reasons(w.state, w.state.jobs["mine"], NOW + 1, 0.0)}
    assert why[PREEMPTION_GRACE] == "1 preempted job(s) stopping (grace up to 30 s)", why


def test_while_a_reclaim_that_makes_room_is_under_way_the_cohort_lends_nothing_new() -> None:
    """The other side of the rule above: a job within its nominal quota for which reclaim
    found victims keeps its cohort from lending what is free meanwhile (it would be taken
    back at once): a borrower's job waits though a GPU is free elsewhere."""
    w = QWorld()
    w.host("h1", gpus=2, cpus=64)
    w.queue("a", cohort="c", gpus=2, min_runtime_s=0)
    w.queue("b", cohort="c", gpus=1, min_runtime_s=0)
    _fill(w, "b", 2, NOW - 1000)
    w.host("h2", gpus=1, cpus=8)  # (joins after: placement would take the tighter host first)
    assert {w.job(f"b{i}").current.host_id for i in range(2)} == {"h1"}  # b borrows 1 of a's 2
    w.qsubmit("a0", "a", cpus=60, submitted_at=NOW - 2)  # only h1 has its CPUs: b's jobs must go
    w.qsubmit("b2", "b", cpus=1, submitted_at=NOW - 1)  # would borrow h2's free GPU
    plan = w.qcycle(now=NOW)
    assert plan.preempted == {("reclaim", "a"): 1} and w.job("b2").state is JobState.QUEUED


def test_why_pending_tells_the_refusal_on_a_model_the_queue_has_a_quota_of() -> None:
    """Found by exploring: a job of a queue with an H100 quota, on a cluster with A100 hosts
    too, was told 'gpu:A100: 0 held + 4 wanted > 0' (a model it has no quota of), not that
    its H100 quota was used up."""
    w = QWorld()
    w.host("h1", gpus=4)
    w.host("a1", gpus=4, model="A100")
    w.queue("lo", gpus=4, min_runtime_s=0)
    _fill(w, "lo", 4, NOW - 100)
    w.qsubmit("more", "lo", gpus=1)
    why = {r.reason: r.detail for r in reasons(w.state, w.state.jobs["more"], NOW, 0.0)}
    assert why[OVER_QUOTA].startswith("gpu:H100: 4 held + 1 wanted > 4"), why


def test_a_ready_preemptor_whose_freed_host_a_commit_in_flight_writes_waits_a_cycle() -> None:
    """Found by exploring: a gang reclaimed two hosts; the first victim's end was being
    committed while the next cycle read the second's: the gang, its room not visible yet,
    gave up its preemption, the second victim was placed again on the host it had just
    freed, and the gang preempted a third job. It waits a cycle, keeping its hosts."""
    w = QWorld()
    for h in ("l1", "l2", "l3"):
        w.host(h, gpus=4)
    w.queue("hi", cohort="lab", gpus=8, min_runtime_s=0, preempt_grace_s=5)
    w.queue("lo", cohort="lab", gpus=4, min_runtime_s=0, preempt_grace_s=5)
    for i, n in enumerate("abc"):
        w.qsubmit(n, "lo", gpus=4, submitted_at=NOW - 100 + i)
        _placed_and_running(w, NOW - 90 + i)
    w.qsubmit("h", "hi", gpus=4, replicas=2, submitted_at=NOW - 5)
    assert w.qcycle(now=NOW).preempted == {("reclaim", "hi"): 2}
    victims = {e.split(":")[0] for e in w.job("h").preempting}
    assert victims == {"b", "c"}
    kills = {r.job_id: r for r in w.agent_reports(NOW + 6)}
    policy = QueuePolicy(half_life_s=0)
    for h in ("l1", "l2", "l3"):
        w.host(h, gpus=4, now=NOW + 6)
    a = plan_cycle(w.state, reports=[kills["b"]], commands=[], now=NOW + 6, term=TERM, queues=policy)
    b = plan_cycle(w.state, reports=[kills["c"]], commands=[], now=NOW + 6.1, term=TERM, queues=policy,
                   frozen_jobs=set(a.jobs), frozen_hosts=set(a.allocs), pending=a.jobs)
    assert not b.preempted and "h" not in b.jobs  # still preempting, nothing placed in its hosts
    assert not any(j.state is JobState.PLACED for j in b.jobs.values())
    w.commit(a)
    w.commit(b)
    c = w.qcycle(now=NOW + 6.2)
    assert c.jobs["h"].state is JobState.PLACED and not c.preempted
    assert sorted(t.host_id for t in c.jobs["h"].current_tasks()) == sorted(
        w.job(v).attempts[0].host_id for v in victims)


def test_only_a_queue_that_others_come_before_waits_for_fair_share() -> None:
    """`waiting for fair share` names the waiting queues admission order puts first: the
    queue holding nothing is first in that order and is not told it waits for fair share
    (found by exploring), the one holding everything is, by that one."""
    from server.scheduling.queues import FAIR_SHARE

    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("big", min_runtime_s=0, fair_share_preemption=False)
    w.queue("team", min_runtime_s=0)
    _fill(w, "big", 8, NOW - 20)
    w.qsubmit("big-more", "big")
    w.qsubmit("mine", "team")
    team = {r.reason: r.detail for r in reasons(w.state, w.state.jobs["mine"], NOW, 0.0)}
    assert FAIR_SHARE not in team, team
    big = {r.reason: r.detail for r in reasons(w.state, w.state.jobs["big-more"], NOW, 0.0)}
    assert big[FAIR_SHARE].endswith("1 waiting queue(s) come first by fair share"), big


def test_a_reservation_does_not_hold_against_a_higher_priority_job_of_its_queue() -> None:
    """Found by exploring: low-priority jobs left waiting (preempted ones keep their
    submission time, so they reserve at once) held every host for themselves, and the
    higher-priority jobs of the same queue could neither start nor preempt there until the
    reservations ran out, ten minutes later. A reservation holds against the jobs after
    its own in the queue's order, not against those of a higher priority."""
    w = QWorld()
    w.host("h1", gpus=8)
    w.host("h2", gpus=8)
    w.queue("q", min_runtime_s=0, preempt_grace_s=3)
    policy = QueuePolicy()
    for i in range(18):
        w.qsubmit(f"lo{i}", "q", submitted_at=NOW - 60)
    w.qcycle(now=NOW - 50, policy=policy)
    w.qcycle(w.agent_reports(NOW - 50), now=NOW - 50, policy=policy)
    for t in range(-45, -5, 5):  # the two left waiting reserve the hosts
        plan = w.qcycle(w.agent_reports(NOW + t), now=NOW + t, policy=policy)
    assert sorted(h for r in plan.reservations for h in r.hosts) == ["h1", "h2"]
    for i in range(4):
        w.qsubmit(f"hi{i}", "q", priority=10, submitted_at=NOW)
    plan = w.qcycle(now=NOW, policy=policy)
    assert plan.preempted == {("priority", "q"): 4}
    assert all(len(w.job(f"hi{i}").preempting) == 1 for i in range(4))


def test_why_pending_names_a_gang_that_does_not_fit_whole_before_the_preemption_it_waits_for() -> None:
    """A gang whose tasks each fit but not all at once, in a queue without priority
    preemption: that it cannot fit whole comes first (it was told "priority preemption is
    off" first, found by exploring), then why nothing is stopped for it."""
    from server.views.jobs import JobView

    w = QWorld()
    w.host("h1", gpus=4)
    w.host("h2", gpus=4)
    w.queue("a", preempt_within=False)
    _fill(w, "a", 4, NOW - 14)  # four one-GPU jobs on one host
    assert len({t.gpu_indices[0] for a in w.state.allocs.values() for t in a.tasks}) == 4
    w.qsubmit("gang", "a", gpus=4, priority=10, replicas=2)
    why = JobView(w.state, None, half_life_s=0).queue_reasons(w.state.jobs["gang"], NOW)
    assert [r.reason for r in why] == [GANG_WHOLE, PRIORITY_WAIT]
    assert why[0].detail == "2 tasks must be placed at once; hosts take some, not all"


def test_a_quota_removed_while_in_use_leaves_no_nominal_gauge(tmp_path: Path) -> None:
    """Found by exploring: a queue's GPU quota removed while its GPUs were in use kept its
    `muster_queue_nominal` series on /metrics (the old figure), beside `allocated`."""
    from server.metrics import REGISTRY
    from server.replica import Muster, ServerConfig

    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("gq", gpus=4)
    _fill(w, "gq", 2, NOW - 100)
    mu = Muster(ServerConfig(data_dir=tmp_path / "mu"))
    mu.state = w.state

    def sample(name: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"queue": "gq", "resource": H100})

    mu._queue_gauges()
    assert (sample("muster_queue_nominal"), sample("muster_queue_allocated")) == (4.0, 2.0)
    w.queue("gq", gpus=None)  # no GPU quota now; its jobs run on
    mu._queue_gauges()
    assert (sample("muster_queue_nominal"), sample("muster_queue_allocated")) == (None, 2.0)


def test_a_job_to_begin_later_is_parked_not_pending() -> None:
    """Found by exploring: a job with a begin time 2 h ahead counted as its queue's
    pending (`pendingCount`, `muster_queue_pending`), while nothing could place it."""
    from server.views.queues import rows

    w = QWorld()
    w.queue("bq", gpus=4)
    w.qsubmit("now-1", "bq")
    spec = job_spec("later-1", command=["x"], gpus=1, queue="bq", begin_at=NOW + 7200)
    w.state.apply_state_record(Record("job.later-1", next(w.rev), encode(make_job(
        "later-1", spec=spec, submitted_at=NOW - 5, not_before=NOW + 7200))))
    row = next(r for r in rows(w.state, NOW, 0.0) if r.queue.name == "bq")
    assert (row.pending, row.parked) == (1, 1)
    row = next(r for r in rows(w.state, NOW + 7201, 0.0) if r.queue.name == "bq")
    assert (row.pending, row.parked) == (2, 0)


def test_a_requeue_held_of_a_job_in_its_preemption_grace_holds_it_once_its_try_has_stopped() -> None:
    """Found by exploring: `requeueJob(hold: true)` (the remedy updateJob(held)'s refusal
    for a running job points to) of a job being preempted was taken, and dropped by the
    leader: the job came back queued, not held, and was placed again once the preemptor
    ended. Its try keeps its stop and end (PREEMPTED), and the job is held."""
    import asyncio

    from server.operations.jobs import JobOperations
    from server.views.jobs import JobView
    from wire.errors import ValidationError
    from wire.messages import Command

    w = QWorld()
    w.host("h1", gpus=2)
    w.queue("a", gpus=2, min_runtime_s=0, preempt_grace_s=30)
    w.qsubmit("low", "a", submitted_at=NOW - 500)
    w.qcycle(now=NOW - 300)
    w.qcycle(w.agent_reports(NOW - 299), now=NOW - 299)
    w.qsubmit("high", "a", gpus=2, priority=10, submitted_at=NOW - 10)
    w.qcycle(now=NOW)
    assert w.job("low").current.stop_kind == "preempt"
    # The API refuses a requeue not held of a try stopping already (it would be dropped).
    ops = JobOperations()
    ops.state, ops.store, ops.jobs = w.state, None, JobView(w.state, None, 0.0)
    with pytest.raises(ValidationError) as refused:
        asyncio.run(ops.requeue("low", "op"))
    assert refused.value.code == "ALREADY_STOPPING" and "preempt" in refused.value.message
    plan = w.qcycle(now=NOW + 1, commands=[Command(kind="requeue", job_id="low", by="op", reason="bad data",
                                                   hold=True)])
    assert plan.ignored == 0 and [e.message for e in plan.events if e.kind == "job.updated"] == [
        "held by op (its try already stopping: preempt)"]
    w.qcycle(w.agent_reports(NOW + 5), now=NOW + 5)  # the victim stopped
    low = w.job("low")
    assert low.state is JobState.QUEUED and low.hold == "held by op: bad data"
    assert [a.state for a in low.attempts] == [AttemptState.PREEMPTED]
    w.qcycle(w.agent_reports(NOW + 6), now=NOW + 6)
    high = w.job("high").current
    w.qcycle([StatusReport(host_id=high.host_id, attempt_id=high.id, job_id="high", state=AttemptState.SUCCEEDED,
                           exit_code=0, ts=NOW + 7)], now=NOW + 7)
    w.qcycle(now=NOW + 8)
    assert w.job("low").state is JobState.QUEUED and w.job("low").tries == 1  # held: not placed again


def _capacity_afresh(state: ClusterState) -> dict[str, float]:
    from server.scheduling.fairshare import host_capacity
    from server.scheduling.queues import add

    out: dict[str, float] = {}
    for cap in state.index.caps.values():
        add(out, host_capacity(cap)[0])
    return out


def test_fair_share_is_taken_of_the_capacity_work_can_be_placed_on() -> None:
    """Found by review: a queue's share was taken of every host's GPUs, CPUs and memory,
    cordoned and draining hosts' too, so the shares shown and the fair order were worked
    out against room no job could get. The capacity is now what the work holds and what
    placement could still give: a cordoned host (h2), a draining one (h3) and one in a
    maintenance window begun (h4, from NOW + 100) add only what runs there. With their 48
    GPUs counted, queue b (25 of 65 usable CPUs) looked more served than queue a (4 of 10
    usable GPUs), and a's job took the last 4 GPUs of h1 first."""
    from server.state.cluster import HostConfig
    from server.views.queues import rows

    def setting(host_id: str, cfg: HostConfig) -> None:
        w.state.apply_state_record(Record(f"hostcfg.{host_id}", next(w.rev), cfg.model_dump_json().encode()))

    w = QWorld()
    w.host("h1", gpus=8)
    w.queue("a")
    w.queue("b")
    w.qsubmit("a0", "a", gpus=4, cpus=4, submitted_at=NOW - 300)
    w.qsubmit("b0", "b", gpus=0, cpus=24, submitted_at=NOW - 300)
    _placed_and_running(w, NOW - 200)
    for h in ("h2", "h3", "h4"):
        w.host(h, gpus=16, now=NOW - 200)
    setting("h3", HostConfig(cordoned=True, draining=True, drain_deadline=NOW + 3600, by="ops"))
    setting("h4", HostConfig(draining=True, drain_at=NOW + 100, drain_deadline=NOW + 3600, by="ops"))
    # b runs 2 GPUs on h2 (h1 cordoned meanwhile; h4 takes no job without a time limit),
    # which is then cordoned.
    setting("h1", HostConfig(cordoned=True))
    w.qsubmit("b-on-h2", "b", gpus=2, cpus=1, submitted_at=NOW - 200)
    _placed_and_running(w, NOW - 100)
    assert w.job("b-on-h2").current.host_id == "h2"
    setting("h1", HostConfig())
    setting("h2", HostConfig(cordoned=True, by="ops"))
    assert w.state.capacity == _capacity_afresh(w.state)
    # h1's 8 GPUs and 64 CPUs, what b holds on h2, and h4 whole until its window begins.
    assert w.state.capacity_at(NOW)[H100] == 8 + 2 + 16 and w.state.capacity_at(NOW)["cpu"] == 64 + 1 + 64
    assert w.state.capacity_at(NOW + 100)[H100] == 8 + 2 and w.state.capacity_at(NOW + 100)["cpu"] == 64 + 1
    by = {r.queue.name: r for r in rows(w.state, NOW + 100, 0.0)}
    assert by["a"].dominant == 4 / 10 and by["b"].dominant == 25 / 65
    # One waiting job each, room for one of them (4 GPUs free on h1): the queue whose
    # dominant share is lower goes first, b.
    w.qsubmit("a1", "a", gpus=4, cpus=1, submitted_at=NOW - 50)
    w.qsubmit("b1", "b", gpus=4, cpus=1, submitted_at=NOW - 40)
    plan = w.qcycle(now=NOW + 100)
    assert plan.placed == 1 and w.job("b1").state is JobState.PLACED and w.job("a1").state is JobState.QUEUED


def _capacity_step(draw: st.DrawFn) -> tuple[str, str, object]:
    host = draw(st.sampled_from(["h0", "h1", "h2"]))
    kind = draw(st.sampled_from(["heartbeat", "lost", "setting", "alloc"]))
    if kind == "heartbeat":
        return host, kind, (draw(st.sampled_from([2, 4])), draw(st.sets(st.integers(0, 3), max_size=2)),
                            draw(st.sampled_from(["", "", "disk nearly full"])))
    if kind == "setting":
        return host, kind, draw(st.sampled_from(["none", "cordoned", "draining", "ahead", "ahead-later"]))
    if kind == "alloc":
        return host, kind, draw(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0, 250, 500])),
                                         max_size=3))
    return host, kind, None


@settings(max_examples=150, deadline=None)
@given(st.lists(st.composite(_capacity_step)(), max_size=25), st.sampled_from([NOW, NOW + 100, NOW + 1000]))
def test_the_capacity_kept_equals_one_summed_afresh(steps: list, now: float) -> None:
    """Whatever heartbeats (faulty GPUs, a disk nearly full), losses, host settings (a
    cordon, a drain, one scheduled ahead) and allocations (whole GPUs, shares) arrive, the
    capacity the cluster state keeps is every host's part summed afresh, and at any time
    the free part of hosts whose maintenance window has begun is taken out of it."""
    from server.scheduling.fairshare import host_capacity
    from server.scheduling.maintenance import started
    from server.scheduling.queues import add
    from server.state.cluster import HostConfig
    from tests.factories import heartbeat_record, host_alloc, task

    state = ClusterState(heartbeat_interval_s=5.0)
    rev = iter(range(1, 10_000))
    settings_of = {"none": HostConfig(), "cordoned": HostConfig(cordoned=True),
                   "draining": HostConfig(cordoned=True, draining=True, drain_deadline=NOW + 50),
                   "ahead": HostConfig(draining=True, drain_at=NOW + 50, drain_deadline=NOW + 500),
                   "ahead-later": HostConfig(draining=True, drain_at=NOW + 500, drain_deadline=NOW + 900)}
    for host, kind, arg in steps:
        if kind == "heartbeat":
            gpus, bad, pressure = arg
            state.apply_host_record(heartbeat_record(host, next(rev), shape=False, gpus=gpus, unhealthy=bad,
                                                     pressure=pressure, cpus=16), now=NOW)
        elif kind == "lost":
            state.apply_host_record(Record(host, next(rev), None), now=NOW)
        elif kind == "setting":
            state.apply_state_record(Record(f"hostcfg.{host}", next(rev),
                                            settings_of[arg].model_dump_json().encode()))
        else:
            tasks = [task(f"{host}-{i}", gpu_indices=[g], gpu_share=share, gpu_memory_mb=1000 if share else 0,
                          cpus=2.0, memory_mb=100) for i, (g, share) in enumerate(arg)]
            state.apply_state_record(Record(f"alloc.{host}", next(rev), encode(host_alloc(host, tasks))))
        afresh: dict[str, float] = {}
        begun: dict[str, float] = {}
        for cap in state.index.caps.values():
            part, free = host_capacity(cap)
            add(afresh, part)
            if started(state.maintenance.get(cap.id), now):
                add(begun, free)
        assert state.capacity == pytest.approx(afresh)
        add(afresh, begun, -1.0)
        assert state.capacity_at(now) == pytest.approx(afresh)


@pytest.mark.parametrize("ends_by", ["time limit", "drain", "reservation", None])
def test_a_victim_that_ends_by_itself_within_the_grace_is_stopped_first_and_loses_nothing(
        ends_by: str | None) -> None:
    """Found by review: victims were ranked by runtime alone, so reclaim stopped b-young
    (run 100 s) and spared b-old (run 900 s), though b-old was to end within the grace
    anyway: at its time limit (NOW + 10), by its host's drain deadline or at the start of
    an advance reservation that sets its host aside for queue a. Stopping such a victim
    loses nothing: it goes first. One at its time limit ends TIMEOUT, as its limit would
    have ended it (not PREEMPTED, requeued to run again with a fresh limit); one the drain
    or reservation was to stop is requeued, as they would have requeued it. (The fit is on
    h4, free: a's job needs the victim for its cohort's quota only.)"""
    from server.state.cluster import HostConfig
    from wire.messages import AdvanceReservation

    w = QWorld()
    w.queue("a", cohort="c", gpus=2, min_runtime_s=0)
    w.queue("b", cohort="c", gpus=1, min_runtime_s=0)  # grace 30 s, the default
    for h, job_id, queue, started, limit in (("h1", "a0", "a", NOW - 1000, 0.0), ("h2", "b-old", "b", NOW - 900, 910.0),
                                             ("h3", "b-young", "b", NOW - 100, 0.0)):
        w.host(h, gpus=1)
        w.qsubmit(job_id, queue, submitted_at=started - 1,
                  time_limit_s=limit if ends_by == "time limit" else 0.0)
        _placed_and_running(w, started)
    assert [w.job(j).current.host_id for j in ("a0", "b-old", "b-young")] == ["h1", "h2", "h3"]
    w.host("h4", gpus=1)
    if ends_by == "drain":
        cfg = HostConfig(cordoned=True, draining=True, drain_deadline=NOW + 10, by="ops")
        w.state.apply_state_record(Record("hostcfg.h2", next(w.rev), cfg.model_dump_json().encode()))
    elif ends_by == "reservation":
        r = AdvanceReservation(name="launch", hosts=["h2"], queues=["a"], starts=NOW + 10, ends=NOW + 4000)
        w.state.apply_state_record(Record("advres.launch", next(w.rev), encode(r)))
    w.qsubmit("a-new", "a", submitted_at=NOW - 5)
    plan = w.qcycle(now=NOW)
    assert plan.preempted == {("reclaim", "a"): 1}
    [victim] = [e.split(":")[0] for e in w.job("a-new").preempting]
    if ends_by is None:
        assert victim == "b-young" and plan.preemption_cost == 100.0
        return
    assert victim == "b-old" and plan.preemption_cost == 0.0
    stopping = w.job("b-old").current
    if ends_by == "time limit":
        assert stopping.stop_kind == "timeout"
        assert stopping.reason.startswith("time limit of 910 s due within the grace: preempted (reclaim) by a-new")
    else:
        assert stopping.stop_kind == "preempt"
    plan = w.qcycle(w.agent_reports(NOW + 3), now=NOW + 3)  # it stops well before its limit
    j = w.job("b-old")
    if ends_by == "time limit":
        assert j.state is JobState.TIMEOUT and j.current.state is AttemptState.TIMEOUT
        assert plan.preemption_lost == {}
    else:
        assert j.state is JobState.QUEUED and j.current.state is AttemptState.PREEMPTED
    assert w.job("a-new").state is JobState.PLACED and w.job("b-young").state is JobState.RUNNING


def test_a_victim_ends_by_itself_within_the_grace_its_tries_were_told_not_its_queues_now() -> None:
    """Found by a review: whether a victim reaches its time limit within the grace was
    judged by its queue's grace now (30 s, raised since it was placed), though a stop gives
    a try the grace it was told when placed (5 s): b-old, 10 s from its limit, was stopped
    first as losing nothing and recorded TIMEOUT, though it would have been killed 5 s
    before its limit. With the grace it was told it loses its 900 s: b-young (100 s) goes."""
    w = QWorld()
    w.queue("a", cohort="c", gpus=2, min_runtime_s=0)
    w.queue("b", cohort="c", gpus=1, min_runtime_s=0, preempt_grace_s=5.0)
    for h, job_id, queue, started, limit in (("h1", "a0", "a", NOW - 1000, 0.0), ("h2", "b-old", "b", NOW - 900, 910.0),
                                             ("h3", "b-young", "b", NOW - 100, 0.0)):
        w.host(h, gpus=1)
        w.qsubmit(job_id, queue, submitted_at=started - 1, time_limit_s=limit)
        _placed_and_running(w, started)
    assert w.state.allocs["h2"].tasks[0].grace_s == 5.0
    w.queue("b", cohort="c", gpus=1, min_runtime_s=0, preempt_grace_s=30.0)
    w.host("h4", gpus=1)
    w.qsubmit("a-new", "a", submitted_at=NOW - 5)
    plan = w.qcycle(now=NOW)
    [victim] = [e.split(":")[0] for e in w.job("a-new").preempting]
    assert victim == "b-young" and plan.preemption_cost == 100.0
    assert w.job("b-young").current.stop_kind == "preempt"


@pytest.mark.parametrize("stopped_at", [NOW + 20, NOW + 45])
def test_a_preempted_try_still_running_when_its_time_limit_passes_ends_timeout(stopped_at: float) -> None:
    """Found by review: a try preempted before its time limit (NOW + 40) that was still
    running when the limit passed (its grace of 60 s, its queue's when it was placed,
    since lowered to 5 s) ended PREEMPTED and was requeued, to run again with a fresh
    limit. Its limit came while it stopped: it ends TIMEOUT, its reason saying so; one
    that stopped before its limit ends PREEMPTED and is requeued, as before."""
    w = QWorld()
    w.queue("a", cohort="c", gpus=2, min_runtime_s=0)
    w.queue("b", cohort="c", gpus=0, min_runtime_s=0, preempt_grace_s=60)
    w.host("h1", gpus=2)
    _fill(w, "a", 1, NOW - 1000)
    w.qsubmit("b0", "b", submitted_at=NOW - 901, time_limit_s=940)  # borrows a's second GPU
    _placed_and_running(w, NOW - 900)
    w.queue("b", cohort="c", gpus=0, min_runtime_s=0, preempt_grace_s=5)
    w.qsubmit("a-new", "a", submitted_at=NOW - 5)
    plan = w.qcycle(now=NOW)
    assert plan.preempted == {("reclaim", "a"): 1} and w.job("b0").current.stop_kind == "preempt"
    [t] = [t for t in w.tasks("h1") if t.job_id == "b0"]
    assert t.stop and t.grace_s == 60
    w.qcycle(w.agent_reports(stopped_at), now=stopped_at)
    j = w.job("b0")
    if stopped_at > NOW + 40:
        assert j.state is JobState.TIMEOUT and j.current.state is AttemptState.TIMEOUT
        assert j.current.reason.startswith("time limit of 940 s reached while being stopped: preempted (reclaim)")
    else:
        assert j.state is JobState.QUEUED and j.current.state is AttemptState.PREEMPTED
    assert w.job("a-new").state is JobState.PLACED
