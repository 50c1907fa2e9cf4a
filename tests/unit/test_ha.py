"""The scheduler's loop when leading is interrupted, in-process with a stand-in for the
leadership: expected errors (a fenced commit, a NATS timeout) are one warning line, any
other is logged with its traceback, and the loop keeps going until told to stop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest

from server.scheduling.scheduler import Scheduler
from server.state.cluster import ClusterState
from wire.kv import Fence

# Stand-ins for what the scheduler's loop talks to, shared by the tests below.


class Lease:
    """The leadership: leading under `term` (a test may change it)."""

    class config:  # noqa: N801 - as Leader's
        ttl_s = 5

    def __init__(self, term: int = 1) -> None:
        self.leading, self.term, self.changed = True, term, asyncio.Event()

    def fence(self, slot: int = 0) -> Fence:
        return Fence(self.term, "me")

    def step_down(self, why: str) -> None:
        pass


class Nc:
    """A NATS connection that keeps the subjects published to."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def publish(self, subject: str, data: bytes = b"", headers: object = None) -> None:
        self.sent.append(subject)


class Msg:
    """A JetStream delivery at stream position `seq`, stored at `ts` (no position: seq 0)."""

    def __init__(self, seq: int = 0, ts: float = 0.0) -> None:
        self.reply = f"$JS.ACK.STATUS.sched.1.{seq}.{seq}.{int(ts * 1e9)}.0" if seq else None
        self.acked = 0

    async def ack(self) -> None:
        self.acked += 1

    async def nak(self) -> None:
        pass


class Feed:
    """A pull feed that delivers nothing until told to stop."""

    def __init__(self, nc: object = None, stream: str = "", *args: object, **kw: object) -> None:
        self.stream, self.read_to = stream, None
        self.stop: asyncio.Event | None = None

    async def run(self, stop: asyncio.Event) -> None:
        self.stop = stop
        await stop.wait()


@contextlib.contextmanager
def feeds_stood_in() -> Iterator[list[Feed]]:
    """The scheduler's consumers and feeds replaced by `Feed`s for the block: the list of
    those made."""
    import server.scheduling.scheduler as sch

    made: list[Feed] = []

    async def no_consumer(*args: object, **kw: object) -> None:
        pass

    def feed(*args: object, **kw: object) -> Feed:
        made.append(Feed(*args, **kw))
        return made[-1]

    patch = pytest.MonkeyPatch()
    patch.setattr(sch, "ensure_consumer", no_consumer)
    patch.setattr(sch, "PullFeed", feed)
    try:
        yield made
    finally:
        patch.undo()


async def leading_with_a_commit_in_flight(store: object) -> tuple[Scheduler, asyncio.Event, asyncio.Task[None], bool]:
    """A scheduler running with `store` (whose commit hangs), a job submitted: it, the
    event that stops it, its task, and whether a commit came to be in flight."""
    import time

    from server.scheduling.scheduler import SchedulerConfig
    from tests.unit.test_planner import World

    now = time.time()
    w = World(interval_s=3600.0)
    w.host("h1", gpus=2, now=now)
    sched = Scheduler(store, w.state, Lease(), SchedulerConfig(tick_s=0.2, plan_share=1.0))  # type: ignore[arg-type]
    stop = asyncio.Event()
    task = asyncio.create_task(sched.run(stop))
    w.submit("j1", gpus=1, submitted_at=now - 10)
    for _ in range(500):  # until its commit is in flight
        if sched._inflight:
            break
        await asyncio.sleep(0.02)
    return sched, stop, task, bool(sched._inflight)


def test_interrupted_leading_logs_expected_errors_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    """A fenced commit or a NATS timeout is part of a cluster's life: one warning line,
    then the scheduler leads again. Anything else is a bug: logged with its traceback.
    The scheduler keeps going either way, and stops when told."""
    import logging

    import nats.errors

    from wire.errors import FencedError

    async def main() -> list[logging.LogRecord]:
        stop = asyncio.Event()
        sched = Scheduler(None, ClusterState(), Lease())  # type: ignore[arg-type]
        errors = [FencedError("term 1 superseded by 2"), nats.errors.TimeoutError(), ValueError("a bug")]

        async def lead(_stop: asyncio.Event) -> None:
            if not errors:
                stop.set()
                return
            raise errors.pop(0)

        sched._lead = lead  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="server.scheduling.scheduler"):
            await asyncio.wait_for(sched.run(stop), timeout=30)
        return [r for r in caplog.records if r.name == "server.scheduling.scheduler"]

    records = asyncio.run(main())
    assert [(r.levelno, r.exc_info is not None) for r in records] == [
        (logging.WARNING, False), (logging.WARNING, False), (logging.ERROR, True)]
    assert "FencedError: term 1 superseded by 2" in records[0].getMessage()
    assert "TimeoutError" in records[1].getMessage()


def test_inputs_put_back_keep_their_streams_order() -> None:
    """Two pipelined cycles whose commits failed, the earlier one's first: their inputs go
    back where the stream stored them, so the bound of the reports read (the first queued
    one's time) never passes a report still queued (found by a review: the later cycle's
    inputs went back before the earlier's, and a report stored at 5 s was said read when
    10 s was the bound)."""
    from server.scheduling.planner import Plan
    from server.scheduling.scheduler import _Cycle

    sched = Scheduler(None, ClusterState(), Lease())  # type: ignore[arg-type]
    sched._status_feed = Feed()  # type: ignore[assignment]
    sched._status_feed.read_to = 100.0
    first, second, third, later = Msg(1, 5.0), Msg(2, 10.0), Msg(3, 11.0), Msg(4, 50.0)
    sched._reports = [(later, None)]  # type: ignore[list-item]
    sched._commands = [(later, None)]  # type: ignore[list-item]
    c1 = _Cycle(Plan(), 0.0, [], [(first, None)], [(first, None)], [])  # type: ignore[list-item]
    c2 = _Cycle(Plan(), 0.0, [], [(second, None), (third, None)], [], [])  # type: ignore[list-item]
    sched._put_back(c1)
    sched._put_back(c2)
    assert [m for m, _ in sched._reports] == [first, second, third, later]
    assert [m for m, _ in sched._commands] == [first, later]
    assert sched._reports_read_to() == 5.0 and sched._reports_read_to(1) == 10.0


def test_a_disrupted_domain_is_alerted_once_per_window() -> None:
    """Only cycles with lost hosts to evict find a domain disrupted: one in between that
    has none does not make the next alert again (found by a review); a window after the
    last finding, a new disruption is alerted."""
    from server.scheduling.planner import Plan

    class Store:
        nc = Nc()

    def alerted() -> int:
        return Store.nc.sent.count("alerts.domain.disrupted")

    async def main() -> list[int]:
        sched = Scheduler(Store(), ClusterState(), Lease())  # type: ignore[arg-type]
        window = sched.budget.config.domain_window_s
        dom = {("rack", "r1"): 10}
        for at, found in ((1000.0, dom), (1001.0, dom), (1002.0, {}), (1003.0, dom)):
            await sched._alerts(Plan(disrupted=dict(found)), at)
        once = alerted()
        await sched._alerts(Plan(disrupted=dict(dom)), 1003.0 + window + 1)
        return [once, alerted()]

    assert asyncio.run(main()) == [1, 2]
    assert Store.nc.sent.count("muster.events.domain.disrupted") == 2


def test_a_shutdown_that_cancels_the_wait_for_commits_still_stops_leading() -> None:
    """The replica's shutdown waits a while, then cancels the scheduler: while a commit
    hangs (NATS away), that cancel lands in the scheduler's wait for its commits in flight.
    The rest of leading's end runs all the same: the commit is cancelled, the feeds stop,
    nothing is left running (found by a review: the feeds and the commit ran on)."""

    from wire.errors import StoreError

    class Store:
        nc = Nc()
        js = None
        gets = 0

        async def commit(self, writes: object, fence: object = None) -> None:
            await asyncio.sleep(3)
            raise StoreError("commit outcome unknown")

        async def get(self, key: str) -> None:
            Store.gets += 1
            raise StoreError("timeout")

    async def main() -> tuple[bool, bool, list[str], int]:
        sched, stop, task, in_flight = await leading_with_a_commit_in_flight(Store())
        stop.set()
        await asyncio.sleep(1.0)  # the scheduler is left waiting for the commit
        task.cancel()  # as the replica's shutdown does after its wait
        await asyncio.gather(task, return_exceptions=True)
        left = [t.get_coro().__qualname__ for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        stopped = bool(feeds) and all(f.stop is not None and f.stop.is_set() for f in feeds)
        return in_flight, stopped, left, len(sched._inflight)

    with feeds_stood_in() as feeds:
        assert asyncio.run(main()) == (True, True, [], 0)
    # The cancelled commit's keys are not read again one by one (each read waits out its
    # timeout while NATS is away: a review timed such a shutdown at keys x 5 s).
    assert Store.gets == 0


def test_the_gauges_loop_outlives_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    """An exception while setting the gauges is logged, and the next round runs (found by a
    review: one exception ended the loop unseen, the gauges frozen)."""
    from server import replica

    class Replica:
        def __init__(self) -> None:
            self._stop = asyncio.Event()
            self.rounds = 0

        def _set_gauges(self) -> None:
            self.rounds += 1
            if self.rounds == 1:
                raise KeyError("a queue deleted meanwhile")
            self._stop.set()

    r = Replica()

    async def main() -> None:
        await asyncio.wait_for(replica.Muster._gauges(r), timeout=30)  # type: ignore[arg-type]

    asyncio.run(main())
    assert r.rounds == 2 and "gauges not updated" in caplog.text


def test_a_cycle_commits_only_after_its_terms_read_barrier() -> None:
    """The lease lost and taken again (term 1, then 2) while the loop of term 1 waits: no
    cycle commits under term 2 before term 2's read barrier has run (found by a review:
    the loop planned and committed under the new term first)."""
    import time

    from server.scheduling.scheduler import SchedulerConfig
    from tests.unit.test_planner import World
    from wire.kv import CommitResult

    log: list[tuple[str, int]] = []

    class Store:
        nc = Nc()
        js = None
        seq = 1000

        async def commit(self, writes: list, fence: Fence) -> CommitResult:  # type: ignore[type-arg]
            log.append(("commit", fence.term))
            revs = {}
            for w in writes:
                Store.seq += 1
                revs[w.key] = Store.seq
            return CommitResult(revisions=revs, last_seq=Store.seq)

    async def main() -> None:
        now = time.time()
        w = World(interval_s=3600.0)
        w.host("h1", gpus=2, now=now)
        lease = Lease()

        async def caught_up() -> None:
            log.append(("caught up", lease.term))

        sched = Scheduler(Store(), w.state, lease, SchedulerConfig(tick_s=0.3, plan_share=1.0),  # type: ignore[arg-type]
                          caught_up=caught_up)
        # What an earlier term of this replica watched is not carried into a new one.
        sched.watch._waiting_since["long-gone"] = 1.0
        sched.disrupted[("rack", "r9")] = now
        stop = asyncio.Event()
        task = asyncio.create_task(sched.run(stop))
        for _ in range(500):
            if log:
                break
            await asyncio.sleep(0.01)
        lease.term = 2  # lost and taken again while term 1's loop waits
        w.submit("j1", gpus=1, submitted_at=now - 10)
        for _ in range(500):
            if ("commit", 2) in log:
                break
            await asyncio.sleep(0.01)
        stop.set()
        await task
        assert "long-gone" not in sched.watch._waiting_since and sched.disrupted == {}

    with feeds_stood_in():
        asyncio.run(main())
    assert ("commit", 2) in log and log.index(("caught up", 2)) < log.index(("commit", 2)), log
    assert ("commit", 1) not in log


def test_a_commit_whose_outcome_was_unknown_but_that_landed_is_published() -> None:
    """The store raised "outcome unknown" for a commit that had landed: its keys are read
    back, and it is treated as done (its input acknowledged, its events and alerts
    published), not put back to be ignored when read again with nothing published (found
    by a review: a job's failure alert was lost so)."""
    import time

    from tests.unit.test_planner import World, report
    from wire.errors import StoreError
    from wire.kv import CommitResult
    from wire.messages import AttemptState
    from wire.records import Record

    class Store:
        def __init__(self, state: ClusterState) -> None:
            self.nc, self.state, self.stored, self.seq = Nc(), state, dict[str, tuple[int, bytes]](), 1000

        async def commit(self, writes: list, fence: Fence) -> CommitResult:  # type: ignore[type-arg]
            for w in writes:
                self.seq += 1
                self.stored[w.key] = (self.seq, w.value)
            raise StoreError("commit outcome unknown: nats: timeout")  # ... but it landed

        async def get(self, key: str) -> Record:
            rev, value = self.stored.get(key, (self.state.revisions.get(key, 0), None))
            return Record(key, rev, value)

    async def main() -> tuple[list[str], int, int]:
        now = time.time()
        w = World(interval_s=3600.0)
        w.host("h1", gpus=2, now=now)
        w.submit("j1", gpus=1, max_attempts=1, submitted_at=now - 10)
        w.cycle(now=now)
        store = Store(w.state)
        sched = Scheduler(store, w.state, Lease(term=7))  # type: ignore[arg-type]
        m = Msg()
        sched._reports.append((m, report(w, "j1", AttemptState.FAILED, exit_code=1, ts=now)))  # type: ignore[arg-type]
        c = sched._plan_next()
        assert c is not None and "job.failed" in [e.kind for e in c.plan.events]
        await sched._finish(c)
        return store.nc.sent, m.acked, len(sched._reports)

    sent, acked, queued = asyncio.run(main())
    assert "alerts.job.failed" in sent and acked == 1 and queued == 0, (sent, acked, queued)


def test_a_refused_input_is_found_where_it_went_back() -> None:
    """A narrowed cycle's one input refused by the store: that input is stripped of its
    text (then dropped), wherever it went back in the queue, not the queue's head (found by
    a review: a redelivered report of an earlier stream position ahead of it was dropped,
    or overwritten by the refused one)."""
    from server.scheduling.isolation import INPUT, Isolation
    from server.scheduling.planner import Plan
    from server.scheduling.scheduler import _Cycle
    from wire.errors import RejectedError
    from wire.messages import AttemptState, StatusReport

    class Store:
        nc = Nc()

    def report(job: str, tail: str = "") -> StatusReport:
        return StatusReport(host_id="h1", attempt_id=f"{job}.1", job_id=job, state=AttemptState.SUCCEEDED, ts=1.0,
                            output_tail=tail)

    async def main() -> list[tuple[str, str]]:
        sched = Scheduler(Store(), ClusterState(), Lease())  # type: ignore[arg-type]
        sched._isolation = Isolation(inputs=1, placements=0, evictions=False)
        refused, late = Msg(20, 20.0), Msg(5, 5.0)
        sched._reports = [(late, report("redelivered"))]  # type: ignore[list-item]
        c = _Cycle(Plan(), 0.0, [], [(refused, report("big", "lots of output"))], [], [],  # type: ignore[list-item]
                   narrowing=INPUT)
        sched._put_back(c)
        await sched._refused(c, RejectedError("message size exceeds maximum allowed"))
        stripped = [(r.job_id, r.output_tail) for _, r in sched._reports]
        c = _Cycle(Plan(), 0.0, [], [(refused, sched._reports[1][1])], [], [], narrowing=INPUT)  # type: ignore[list-item]
        sched._reports.remove(c.reports[0])
        sched._put_back(c)
        await sched._refused(c, RejectedError("message size exceeds maximum allowed"))
        return [*stripped, *[(r.job_id, "left") for _, r in sched._reports]]

    assert asyncio.run(main()) == [("redelivered", ""), ("big", ""), ("redelivered", "left")]


def test_a_cycle_that_does_not_commit_gives_its_eviction_budget_back() -> None:
    """A lost host's work replaced in a cycle whose commit conflicts: the reschedules did
    not happen, so the pacing buckets get their tokens back (found by a review: they were
    spent at plan time, and failed commits slowed the rescheduling that followed)."""
    import time

    from server.scheduling.eviction import EvictionConfig
    from tests.unit.test_planner import World
    from wire.errors import ConflictError
    from wire.kv import CommitResult
    from wire.records import Record

    class Store:
        def __init__(self, state: ClusterState) -> None:
            self.nc, self.state, self.commits = Nc(), state, 0

        async def commit(self, writes: list, fence: Fence) -> CommitResult:  # type: ignore[type-arg]
            self.commits += 1
            raise ConflictError("wrong last sequence")

        async def get(self, key: str) -> Record:
            return Record(key, self.state.revisions.get(key, 0), None)

    async def main() -> tuple[int, float, float, float]:
        now = time.time()
        w = World(interval_s=3600.0)
        w.host("h1", now=now)
        w.submit("j1", gpus=8, submitted_at=now - 10)
        w.cycle(now=now)
        w.state.apply_host_record(Record("h1", next(w.rev), None), now=now)  # its key expired
        w.host("h2", now=now)
        store = Store(w.state)
        sched = Scheduler(store, w.state, Lease())  # type: ignore[arg-type]
        sched.budget.config = EvictionConfig(global_rate_per_s=0.001, global_burst=5.0)
        c = sched._plan_next()
        assert c is not None and c.plan.evicted == 1 and c.evictions == [()]
        assert sched.budget.global_bucket is not None
        spent = sched.budget.global_bucket.tokens
        await sched._finish(c)
        return store.commits, spent, sched.budget.global_bucket.tokens, sched.budget.global_bucket.burst

    commits, spent, left, burst = asyncio.run(main())
    assert commits == 1 and spent == burst - 1 and left == burst, (commits, spent, left)


def test_a_cancel_while_an_unknown_commit_is_read_back_puts_its_inputs_back() -> None:
    """Leading ends while the keys of a commit whose outcome is unknown are read back: its
    inputs go back to the queues (to be returned to the stream), as for a commit cancelled
    in flight (found by a review: they were left out, back only after the ack wait)."""
    import time

    from tests.unit.test_planner import World, report
    from wire.errors import StoreError
    from wire.messages import AttemptState

    reading = asyncio.Event()

    class Store:
        nc = Nc()

        async def commit(self, writes: object, fence: object = None) -> None:
            raise StoreError("commit outcome unknown: nats: timeout")

        async def get(self, key: str) -> None:
            reading.set()
            await asyncio.sleep(30)

    async def main() -> tuple[bool, list[str]]:
        now = time.time()
        w = World(interval_s=3600.0)
        w.host("h1", gpus=2, now=now)
        w.submit("j1", gpus=1, submitted_at=now - 10)
        w.cycle(now=now)
        sched = Scheduler(Store(), w.state, Lease())  # type: ignore[arg-type]
        sched._reports.append((Msg(3, now), report(w, "j1", AttemptState.RUNNING, ts=now)))  # type: ignore[arg-type]
        c = sched._plan_next()
        assert c is not None and c.reports and not sched._reports
        task = asyncio.create_task(sched._finish(c))
        await asyncio.wait_for(reading.wait(), 10)
        task.cancel()
        done = await asyncio.gather(task, return_exceptions=True)
        return isinstance(done[0], asyncio.CancelledError), [r.job_id for _, r in sched._reports]

    assert asyncio.run(main()) == (True, ["j1"])


def test_the_feeds_stop_when_leading_ends_while_commits_drain() -> None:
    """Leading ends with a commit in flight: the feeds stop at once, not once the commit
    is done (found by a review: they went on pulling for up to 30 s, holding inputs from
    the next leader)."""

    from wire.errors import StoreError

    release = asyncio.Event()

    class Store:
        nc = Nc()
        js = None

        async def commit(self, writes: object, fence: object = None) -> None:
            await release.wait()
            raise StoreError("commit outcome unknown")

        async def get(self, key: str) -> None:
            raise StoreError("timeout")

    async def main() -> tuple[bool, bool, bool]:
        sched, stop, task, in_flight = await leading_with_a_commit_in_flight(Store())
        stop.set()
        await asyncio.sleep(0.5)
        stopped_while_draining = bool(feeds) and all(f.stop is not None and f.stop.is_set() for f in feeds)
        still_draining = bool(sched._inflight)
        release.set()
        await asyncio.wait_for(task, 10)
        return in_flight, stopped_while_draining, still_draining

    with feeds_stood_in() as feeds:
        assert asyncio.run(main()) == (True, True, True)


def watching_for_starved_queues(state: ClusterState) -> Scheduler:
    """A scheduler over `state` whose starved-queue watch alerts after 100 s."""
    from server.scheduling.scheduler import SchedulerConfig

    sched = Scheduler(None, state, Lease())  # type: ignore[arg-type]
    sched.config = SchedulerConfig()
    sched.watch.starved_after_s = 100.0
    return sched


async def starved_at(sched: Scheduler, now: float) -> list[str]:
    """The queues `sched` alerts as starved at `now` (its once-a-second look made now), once
    the look it began at whether their jobs could run is done."""
    from server.scheduling.planner import Plan

    sched._watched_at = 0.0
    out = [str(e.data["queue"]) for e in sched._queue_alerts(Plan(), now) if e.kind == "queue.starved"]
    if sched._runnable_check is not None:
        await sched._runnable_check  # found out meanwhile
    return out


def test_a_queue_whose_jobs_no_host_could_ever_run_is_not_alerted_as_starved() -> None:
    """A queue's only waiting job asks for more GPUs than any host has: it waits for a host
    that can take it (its submitter was told so), and the queue is not alerted as starved;
    once a job that could run waits as long with none placed, it is (found by exploring:
    `queue.starved` fired for the impossible job). Whether a queue's jobs could run is
    found out in a task of its own, off the commit path, and kept a while."""
    from server.scheduling.scheduler import RUNNABLE_KEPT_S
    from tests.unit.test_planner import NOW, World

    w = World(interval_s=3600.0)
    w.host("h1", gpus=8, now=NOW)
    for i in range(25):  # more than the first 20 looked at once (a review: those past them were taken as runnable)
        w.submit(f"huge{i}", gpus=16, submitted_at=NOW - 10 + i)

    async def main() -> list[list[str]]:
        sched = watching_for_starved_queues(w.state)

        said = [await starved_at(sched, NOW), await starved_at(sched, NOW + 200), await starved_at(sched, NOW + 201)]
        assert sched._runnable_found["default"][0] is False
        w.submit("fits", gpus=8, submitted_at=NOW + 150)
        said.append(await starved_at(sched, NOW + 202))  # the answer is kept a while
        later = NOW + 202 + RUNNABLE_KEPT_S + 1
        said += [await starved_at(sched, later), await starved_at(sched, later + 1)]
        return said

    assert asyncio.run(main()) == [[], [], [], [], [], ["default"]]


def test_a_queue_whose_jobs_wait_for_their_group_or_their_users_limit_is_not_alerted_as_starved() -> None:
    """Found by exploring: an array throttled to 2 at once (`%2`) on an idle 8-GPU host had
    its other elements waiting for their group, as why-pending said, and the queue was
    alerted as starved ("6 jobs waiting and none placed"); so was one whose jobs waited for
    their user's running-jobs limit. Jobs held back by their own limits wait their turn."""
    from tests.factories import job as make_job
    from tests.factories import job_spec
    from tests.unit.test_planner import NOW, World
    from wire.messages import Queue, encode
    from wire.records import Record

    def starved(w: World) -> list[list[str]]:
        async def main() -> list[list[str]]:
            sched = watching_for_starved_queues(w.state)
            return [await starved_at(sched, at) for at in (NOW, NOW + 200, NOW + 201)]

        return asyncio.run(main())

    w = World(interval_s=3600.0)
    w.host("h1", gpus=8, now=NOW)
    for i in range(8):
        spec = job_spec(f"sweep-{i}", command=["x"], gpus=1, group="sweep#abcd", group_limit=2, user="alice")
        w.state.apply_state_record(Record(f"job.s{i:07d}", next(w.rev),
                                          encode(make_job(f"s{i:07d}", spec=spec, submitted_at=NOW - 100 + i))))
    assert w.cycle(now=NOW - 50).placed == 2
    assert w.state.backlog.eligible_counts(NOW) == {"default": 6}
    assert starved(w) == [[], [], []]

    w = World(interval_s=3600.0)
    w.host("h1", gpus=8, now=NOW)
    w.state.apply_state_record(Record("queue.default", next(w.rev),
                                      encode(Queue(name="default", max_running_jobs_per_user=1))))
    for i in range(3):
        w.submit(f"u{i}", gpus=1, submitted_at=NOW - 100 + i)
    assert w.cycle(now=NOW - 50).placed == 1
    assert starved(w) == [[], [], []]
    other = make_job("other", spec=job_spec("other", command=["x"], gpus=1, user="someone-else"), submitted_at=NOW - 40)
    w.state.apply_state_record(Record("job.other", next(w.rev), encode(other)))  # one that could be placed: alerted
    assert starved(w) == [[], [], ["default"]]


def test_every_queue_gets_its_turn_to_be_found_runnable() -> None:
    """Whether a queue's jobs could ever run is found one queue at a time: every queue
    asked about gets its turn, in the order first asked (found by a review: with many
    queues, the first asked took every turn and the last were never looked at)."""
    from server.scheduling.scheduler import SchedulerConfig
    from tests.unit.test_planner import NOW, World

    w = World(interval_s=3600.0)
    w.host("h1", gpus=8, now=NOW)
    w.submit("huge", gpus=16, submitted_at=NOW - 10)

    async def main() -> dict[str, tuple[bool, float]]:
        sched = Scheduler(None, w.state, Lease())  # type: ignore[arg-type]
        sched.config = SchedulerConfig()
        for q in ("a", "b", "c", "default"):
            assert sched._runnable(q, NOW) is False  # not known yet
        assert sched._runnable_check is not None
        await sched._runnable_check
        return sched._runnable_found

    found = asyncio.run(main())
    assert {q: f[0] for q, f in found.items()} == {"a": False, "b": False, "c": False, "default": False}


def test_a_queues_runnable_answer_is_kept_from_when_it_was_found() -> None:
    """An answer that took its turn long after it was asked is kept RUNNABLE_KEPT_S from
    when it was found (a review: stamped with when it was asked, one that took longer was
    stale at once, and the queue was never alerted)."""
    from server.scheduling.scheduler import RUNNABLE_KEPT_S, SchedulerConfig
    from tests.unit.test_planner import World

    clock = iter([0.0, 100.0])  # monotonic: when asked, when found

    async def main() -> bool:
        sched = Scheduler(None, World().state, Lease())  # type: ignore[arg-type]
        sched.config = SchedulerConfig()
        sched._monotonic = lambda: next(clock)

        async def found(queue: str, now: float) -> bool:
            return True

        sched._find_runnable = found  # type: ignore[method-assign]
        assert sched._runnable("q", 1000.0) is False
        assert sched._runnable_check is not None
        await sched._runnable_check
        return sched._runnable("q", 1000.0 + 100.0 + RUNNABLE_KEPT_S - 1)

    assert asyncio.run(main()) is True


def test_a_leader_woken_after_its_lease_ended_sends_no_assignment_again() -> None:
    """The loop waits for work; its lease ends meanwhile (a leader frozen past its TTL, as
    `leading` says by the clock): woken, it sends nothing, not even a resend of the
    assignment records from its stale view (found by exploring: the resend came before the
    look at the lease)."""
    import time

    from server.scheduling.scheduler import SchedulerConfig
    from tests.unit.test_planner import World

    class Store:
        nc = Nc()
        js = None

    async def main() -> list[bool]:
        w = World(interval_s=3600.0)
        w.host("h1", gpus=2, now=time.time())
        lease = Lease()
        sched = Scheduler(Store(), w.state, lease, SchedulerConfig(tick_s=30.0))  # type: ignore[arg-type]
        resent: list[bool] = []

        async def redeliver() -> None:
            resent.append(lease.leading)

        sched._redeliver = redeliver  # type: ignore[method-assign]
        stop = asyncio.Event()
        task = asyncio.create_task(sched.run(stop))
        sched.wake.set()
        for _ in range(500):
            if resent:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # back to waiting for work
        lease.leading = False  # the lease ran out while it waited
        sched.wake.set()
        await asyncio.sleep(0.3)
        stop.set()
        lease.changed.set()
        await asyncio.wait_for(task, timeout=30)
        return resent

    with feeds_stood_in():
        resent = asyncio.run(main())
    assert resent and all(resent), resent
