"""Operators' job controls over many cycles (cycle.reports.apply_update and apply_requeue,
cycle.submissions.resolve_dependencies, Backlog.held/waiting): in any order of holds, releases, priority
changes, requeues, cancels and jobs running after others, with tasks ending as they may,
a held job or one waiting for others is never placed, a job runs only after what it
depends on has ended as its dependency asks, no GPU is held twice, and every try a
requeue stopped goes uncounted."""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from server.scheduling import retry
from server.scheduling.planner import plan_cycle
from tests.factories import job as make_job
from tests.factories import job_spec
from tests.unit.test_planner import NOW, TERM
from tests.unit.test_queue_planner import QWorld, no_overcommit
from wire.messages import AttemptState, Command, JobState, StatusReport, encode
from wire.records import Record

N = 6  # jobs job-0000 ... job-0005


def job_id(i: int) -> str:
    return f"job-{i:04d}"


submit = st.tuples(st.just("submit"), st.integers(0, N - 1), st.integers(1, 4),
                  st.lists(st.integers(0, N - 1), min_size=1, max_size=2) | st.just([]),
                  st.sampled_from(["afterok", "afterany", "afternotok"]),
                  st.sampled_from([False, False, False, True]))
end = st.tuples(st.just("end"), st.integers(0, N - 1),
                st.sampled_from([AttemptState.SUCCEEDED, AttemptState.SUCCEEDED, AttemptState.FAILED]))
ops = st.lists(st.one_of(
    submit, submit, end, end,
    st.tuples(st.sampled_from(["hold", "release", "requeue", "requeue-hold", "cancel"]), st.integers(0, N - 1)),
    st.tuples(st.just("priority"), st.integers(0, N - 1), st.integers(-3, 3)),
    st.tuples(st.just("wait"),),
), min_size=10, max_size=60)


def command(op: tuple, now: float) -> Command | None:
    kind, i = op[0], op[1]
    if kind in ("hold", "release"):
        return Command(kind="update", job_id=job_id(i), by="op", hold=kind == "hold", ts=now)
    if kind == "priority":
        return Command(kind="update", job_id=job_id(i), by="op", priority=op[2], ts=now)
    if kind.startswith("requeue"):
        return Command(kind="requeue", job_id=job_id(i), by="op", hold=kind == "requeue-hold", ts=now)
    if kind == "cancel":
        return Command(kind="cancel", job_id=job_id(i), by="op", ts=now)
    return None


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_held_and_waiting_jobs_are_never_placed_and_dependencies_are_kept(steps: list[tuple]) -> None:
    w = QWorld(interval_s=3600.0)
    w.host("h1", gpus=8)
    now = NOW
    commands: list[Command] = []
    ended: list[StatusReport] = []
    for op in steps:
        kind = op[0]
        if kind == "submit":
            _, i, gpus, deps, rule, held = op
            jid = job_id(i)
            deps = [job_id(d) for d in dict.fromkeys(deps) if d != i and job_id(d) in w.state.jobs]
            if jid in w.state.jobs:
                continue
            # What the API stores: it refuses what could never run, and waits for what has not ended.
            if rule != "afterany" and any(w.state.jobs[d].state.terminal and (
                    w.state.jobs[d].state is JobState.SUCCEEDED) is (rule == "afternotok") for d in deps):
                continue
            spec = job_spec(jid, command=["run"], gpus=gpus, depends_on=deps, depend_any=rule == "afterany",
                            depend_not_ok=rule == "afternotok")
            rec = make_job(jid, spec=spec, submitted_at=now - 100 + i, hold="held by op" if held else "",
                           waiting_for=[d for d in deps if not w.state.jobs[d].state.terminal])
            w.state.apply_state_record(Record(f"job.{jid}", next(w.rev), encode(rec)))
        elif kind == "end":
            job = w.state.jobs.get(job_id(op[1]))
            live = [a for a in job.current_tasks() if a.state is AttemptState.RUNNING] if job else []
            ended += [StatusReport(host_id=a.host_id, attempt_id=a.id, job_id=job.id, state=op[2], ts=now,
                                   exit_code=0 if op[2] is AttemptState.SUCCEEDED else 1) for a in live]
        elif kind != "wait":
            c = command(op, now)
            if c is not None:
                commands.append(c)
        # A cycle after each step.
        before = {j.id: j for j in w.state.jobs.values()}
        releases = {c.job_id for c in commands if c.kind == "update" and c.hold is False}
        # What the agent does: placed tasks start, stopped ones are reported KILLED.
        reports = [*ended, *w.agent_reports(now)]
        plan = plan_cycle(w.state, reports=reports, commands=commands, now=now, term=TERM)
        w.commit(plan)
        # What the examples reach (pytest --hypothesis-show-statistics).
        for j in plan.jobs.values():
            if j.spec.depends_on and len(j.attempts) > len(before[j.id].attempts if j.id in before else []):
                event("a job placed after its dependencies")
            if j.cancel_reason.startswith("dependency"):
                event("a job cancelled by its dependency")
            if any(a.stop_kind == retry.REQUEUE and a.state is AttemptState.KILLED for a in j.current_tasks()):
                event("a requeued try ended")
        commands, ended = [], []
        now += 1
        no_overcommit(w.state)
        for j in w.state.jobs.values():
            old = before.get(j.id)
            placed_now = len(j.attempts) > (len(old.attempts) if old else 0)
            if placed_now:
                # Not held before the cycle (unless released in it), not waiting for others.
                assert old is None or not old.hold or old.state is not JobState.QUEUED or j.id in releases, j.id
                assert not j.waiting_for and not j.hold, j.id
                for d in j.spec.depends_on:
                    dep = w.state.jobs[d]
                    assert dep.state.terminal, (j.id, d, dep.state)
                    assert j.spec.depend_any or (dep.state is JobState.SUCCEEDED) is not j.spec.depend_not_ok, (
                        j.id, d, dep.state)
            if j.state is JobState.QUEUED and (j.hold or j.waiting_for):
                assert j.id not in set(w.state.backlog.ids())
            # A requeue never fails a job: a failed job's last try failed by itself (a
            # task exited non-zero, before or while it was being stopped), and the tries a
            # requeue stopped are not counted.
            if j.state is JobState.FAILED:
                assert any(a.state is AttemptState.FAILED for a in j.current_tasks()), j.id
                assert j.tries - retry.uncounted_tries(j) <= j.spec.max_attempts
