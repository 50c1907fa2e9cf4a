"""Others' work on hosts set aside (scheduling.setasidework), kept by the cluster state as
records arrive: always the hosts a full look at every task would find; and the planner
stops that work from the reservation's start without walking the other hosts."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from server.scheduling.advance import admits
from server.state.cluster import ClusterState
from tests.factories import host_alloc, job, job_spec, task
from wire.messages import AdvanceReservation, encode
from wire.records import Record

NOW = 1_800_000_000.0
HOSTS = ["a", "b", "c", "d"]
QUEUES = ["launch", "other"]


def full_look(state: ClusterState, r: AdvanceReservation) -> set[str]:
    """The hosts of `r` with a task not told to stop of a job it does not admit (or unknown)."""
    out = set()
    for h in r.hosts:
        alloc = state.allocs.get(h)
        for t in alloc.tasks if alloc else ():
            j = state.jobs.get(t.job_id)
            if not t.stop and (j is None or not admits(r, j.spec.queue, j.spec.user)):
                out.add(h)
    return out


steps = st.lists(st.one_of(
    st.tuples(st.just("job"), st.integers(0, 5)),
    st.tuples(st.just("alloc"), st.sampled_from(HOSTS),
              st.lists(st.tuples(st.integers(0, 5), st.booleans()), max_size=3)),
    st.tuples(st.just("advres"), st.sampled_from(["r1", "r2"]),
              st.one_of(st.none(), st.tuples(st.lists(st.sampled_from(HOSTS), min_size=1, max_size=4, unique=True),
                                             st.sampled_from([["launch"], ["other"], []]),
                                             st.sampled_from([["ann"], []])))),
), max_size=25)


@settings(max_examples=150, deadline=None)
@given(steps)
def test_the_hosts_kept_are_those_a_full_look_finds(seq: list[tuple]) -> None:  # type: ignore[type-arg]
    state = ClusterState(heartbeat_interval_s=1e9)
    rev = itertools.count(1)
    # Hosts whose tasks were last looked at while one of their jobs was not known: listed,
    # maybe more than a full look finds (the planner checks each host it is given).
    doubtful: set[str] = set()

    def unknown_on(h: str) -> bool:
        alloc = state.allocs.get(h)
        return alloc is not None and any(not t.stop and t.job_id not in state.jobs for t in alloc.tasks)

    for step in seq:
        if step[0] == "job":
            _, n = step  # a job's queue and user never change: its number's
            rec = job(f"j{n}", spec=job_spec(f"j{n}", command=["x"], queue=QUEUES[n % 2], user=["ann", "bo"][n // 3]))
            state.apply_state_record(Record(f"job.j{n}", next(rev), encode(rec)))
        elif step[0] == "alloc":
            _, h, tasks = step
            alloc = host_alloc(h, [task(f"j{n}", attempt_id=f"j{n}.{h}.{i}", stop=stop)
                                   for i, (n, stop) in enumerate(tasks)])
            state.apply_state_record(Record(f"alloc.{h}", next(rev), encode(alloc)))
            doubtful.discard(h)
            if unknown_on(h):
                doubtful.add(h)
        else:
            _, name, shape = step
            value = None
            if shape is not None:
                hosts, queues, users = shape
                if not queues and not users:
                    users = ["ann"]
                value = encode(AdvanceReservation(name=name, hosts=hosts, queues=queues, users=users,
                                                  starts=NOW, ends=NOW + 3600, created_at=NOW, by="admin"))
            state.apply_state_record(Record(f"advres.{name}", next(rev), value))
            doubtful |= {h for h in HOSTS if unknown_on(h)}
        for name in ("r1", "r2"):
            r = state.advance.get(name)
            kept = set(state.set_aside_work.hosts(name))
            if r is None:
                assert kept == set()
            else:
                found = full_look(state, r)
                assert found <= kept <= set(r.hosts)  # never one left out
                assert kept - doubtful == found - doubtful  # and exact where every job was known


def test_a_host_listed_before_its_jobs_record_came_is_dropped_when_it_comes() -> None:
    """At a start, allocations may be read before the job records: the host is listed
    (its job unknown) until the job's first record, which names the host, comes."""
    from wire.messages import Attempt, AttemptState, JobState

    state = ClusterState(heartbeat_interval_s=1e9)
    r = AdvanceReservation(name="r1", hosts=["a"], queues=["launch"], starts=NOW, ends=NOW + 3600, created_at=NOW,
                           by="admin")
    state.apply_state_record(Record("advres.r1", 1, encode(r)))
    state.apply_state_record(Record("alloc.a", 2, encode(host_alloc("a", [task("j1")]))))
    assert state.set_aside_work.hosts("r1") == {"a"}
    a = Attempt(id="j1.1", number=1, host_id="a", state=AttemptState.RUNNING, term=1, placed_at=NOW)
    rec = job("j1", spec=job_spec("j1", command=["x"], queue="launch"), state=JobState.RUNNING, attempts=[a])
    state.apply_state_record(Record("job.j1", 3, encode(rec)))
    assert state.set_aside_work.hosts("r1") == set()  # its own job: nothing to stop
    state.apply_state_record(Record("advres.r1", 4, None))
    assert state.set_aside_work.hosts("r1") == frozenset()
