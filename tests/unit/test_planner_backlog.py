"""The planner's shortcuts over long queues (QueuePolicy.shortcuts in server.scheduling.planner: a
queue's jobs deferred at once when each of them would borrow, a job or a queue left once
it is known refused, by a refused job no larger or by the least refused demand of one
resource) change how many jobs a cycle looks at, never what it decides:
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
from wire.messages import ResourceQuota, encode
from wire.records import Record

QUEUES = ("qa", "qb", "qc")


SHAPES = (  # (gpus, gpu_share, cpus, memory_mb)
    (1, 0, 1.0, 512), (2, 0, 2.0, 512), (8, 0, 8.0, 4096), (0, 250, 1.0, 512), (0, 500, 1.0, 512),
    (0, 0, 2.0, 512), (4, 0, 1.0, 4096),
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
       st.lists(st.sampled_from([None, None, 3.0, 8.0, 20.0]), min_size=3, max_size=3))
def test_the_shortcuts_never_change_a_plan(specs: list[dict[str, Any]], nominals: list[float],
                                           cpu_nominals: list[float | None]) -> None:
    """Queues with a GPU quota, some with a CPU quota as well (refused on either)."""
    w = QWorld()
    for h in range(2):
        w.host(f"h{h}", gpus=8, cpus=32)
    for name, gpus, cpus in zip(QUEUES, nominals, cpu_nominals, strict=True):
        q = w.queue(name, cohort="c", gpus=gpus, min_runtime_s=0, preempt_within=True)
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


def _queue_at_nominal() -> QWorld:
    """qa (2 GPUs nominal, cohort c with qb's 6) holding its 2 GPUs."""
    w = QWorld()
    w.host("h0", gpus=8)
    w.queue("qa", cohort="c", gpus=2, min_runtime_s=0)
    w.queue("qb", cohort="c", gpus=6, min_runtime_s=0)
    for i in range(2):
        w.qsubmit(f"run{i}", "qa", gpus=1, submitted_at=NOW - 200 + i)
    w.qcycle(now=NOW)
    w.qcycle(w.agent_reports(NOW + 1), now=NOW + 1)
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
    w.qcycle(now=NOW)
    w.qcycle(w.agent_reports(NOW + 1), now=NOW + 1)
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
