"""The scheduler loop: runs while this replica leads, commits each cycle's plan atomically.

Inputs: queued jobs (from the state watch), agent status reports (durable consumer on
STATUS) and operator commands (durable consumer on CMDS). Each cycle takes a
snapshot, asks the pure planner for decisions, and commits them as one revision-
checked, term-fenced batch. Messages are acknowledged only after their effects are
committed, so a new leader resumes where the old one stopped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import api as jsapi

from server import metrics
from server.health.idlegpus import IdleWatch
from server.health.monitor import job_failed_alerts, publish_alert
from server.health.rules import Health
from server.scheduling.cadence import cycle_gap
from server.scheduling.delivery import Sent, next_sent, undelivered
from server.scheduling.eviction import EvictionBudget, EvictionConfig
from server.scheduling.isolation import Isolation, Narrowing
from server.scheduling.planner import KeyInFlight, Plan, QueuePolicy, plan_cycle
from server.scheduling.queues import Resources, job_usage
from server.scheduling.queuewatch import QueueWatch
from server.scheduling.windowwatch import WindowWatch
from server.state.cluster import ClusterState
from server.state.consumers import Held, PullFeed, ensure_consumer
from server.state.lease import FENCE_SLOTS, Leader
from server.views import queues as queue_view
from server.views.hosts import finish_stepwise
from server.views.jobs import JobView
from wire import subjects
from wire.errors import ConflictError, DecodeError, FencedError, RejectedError, StoreError
from wire.kv import CommitResult, Store, Write
from wire.messages import MAX_SUBMIT_BYTES, Command, Event, Job, JobState, StatusReport, SubmitRequest, decode, encode
from wire.records import ack_position
from wire.stopping import pause

log = logging.getLogger(__name__)

# How long the intake of a submission waits for history to say which of its ids were used.
USED_IDS_WAIT_S = 5.0
USED_IDS_PAUSE_S = 10.0  # and, after it did not, how long it is not asked
SCREEN_AT_ONCE = 100  # submissions marked at once: what a cycle takes (_plan_next)
# Inputs of a kind the leader holds at once (queued, or in a commit in flight), in cycles'
# takes: the commits in flight, the cycle being planned and the next one's. A feed pulls
# no more meanwhile (server.state.consumers.Held), so that what it holds is taken well
# within the consumer's ack_wait and the rest waits in its stream.
HELD_CYCLES_BEYOND_PIPELINE = 2


def _stored_at(msg: Msg) -> float:
    """When the store stored a delivered message (its clock, seconds); unknown: no bound."""
    pos = ack_position(msg.reply)
    return pos[2] if pos is not None else float("inf")


T = TypeVar("T")

# The stream each kind of input comes from.
_STREAM_OF = {"status": subjects.STATUS_STREAM, "command": subjects.CMDS_STREAM,
              "submission": subjects.SUBMIT_STREAM}

# Jobs of a queue about to be alerted as starved looked at for one that could ever run
# (Scheduler._runnable), and how long a queue's answer is kept.
RUNNABLE_LOOKS = 200
RUNNABLE_KEPT_S = 60.0


def _index_of(queue: list[tuple[Msg, T]], item: tuple[Msg, T]) -> int:
    """Where an input is in its queue (the same delivery: the message itself)."""
    return next(i for i, x in enumerate(queue) if x[0] is item[0])


def _stream_order(items: list[tuple[Msg, T]]) -> list[tuple[Msg, T]]:
    """Queued inputs in the order their stream stored them (by stream sequence; a stable
    sort: those of an unknown position keep their order, first)."""
    def seq(item: tuple[Msg, T]) -> int:
        pos = ack_position(item[0].reply)
        return pos[0] if pos is not None else 0

    return sorted(items, key=seq)


@dataclass
class _Cycle:
    """A planned cycle: its decisions, the writes that commit them, the inputs it used."""

    plan: Plan
    now: float
    writes: list[Write]
    reports: list[tuple[Msg, StatusReport]]
    commands: list[tuple[Msg, Command]]
    submissions: list[tuple[Msg, SubmitRequest]]
    slot: int = 0  # fence slot of its commit (one per commit in flight: see store.Fence)
    narrowing: Narrowing | None = None  # while isolating a refused input (scheduling.isolation)
    failing: tuple[str, ...] = ()  # the jobs this cycle fails because their records were refused
    term: int = 0  # the term it was planned under: it commits under that term only
    # The eviction budget it spent (EvictionBudget.taken): given back if it does not commit.
    evictions: list[tuple[tuple[str, str], ...]] = field(default_factory=list)

    def frozen(self) -> tuple[set[str], set[str]]:
        return set(self.plan.jobs), set(self.plan.allocs)

    @functools.cached_property
    def held(self) -> dict[str, Resources]:
        """What each job record it writes holds (queues.job_usage): worked out once, read
        by every cycle planned while it is in flight."""
        return {job_id: job_usage(job) for job_id, job in self.plan.jobs.items()}

    @property
    def writes_usage(self) -> bool:
        return bool(self.plan.usage)


@dataclass(frozen=True)
class SchedulerConfig:
    tick_s: float = 1.0  # full re-plan at least this often
    fetch_batch: int = 500
    max_keys_per_commit: int = 900
    # Cycles whose commits may be in flight at once. Each later cycle leaves the records
    # the earlier ones write alone, so the commits never conflict with each other; the
    # leader plans while NATS stores (1 = plan, commit, wait, repeat). At most
    # lease.FENCE_SLOTS: each commit in flight checks a fence key of its own.
    pipeline: int = 3
    eviction: EvictionConfig = field(default_factory=EvictionConfig)
    # A finished job's record leaves the state bucket this long after it finished (the
    # history database keeps it); 0 keeps it forever.
    finished_job_ttl_s: int = 3600
    # Work on a host with no record in the hosts bucket at all (its key expired before
    # this leader started, or the bucket was lost with a whole NATS cluster) is replaced
    # only after the host has been unheard this long; None: one heartbeat TTL (three
    # intervals), within which a live agent heartbeats again and a cut-off one has
    # fenced itself.
    unheard_grace_s: float | None = None
    # A task its agent has not reported running this long after it was placed has its
    # host's assignment record sent again (scheduling.delivery); None: two heartbeat
    # intervals.
    redeliver_after_s: float | None = None
    # How the host of a task is chosen among the feasible ones (scheduling.capacity.POLICIES):
    # "fgd", fragmentation-aware, or "binpack", the tightest fit.
    placement_policy: str = "fgd"
    # fgd: the feasible hosts compared per task (from the tightest levels of the index up).
    placement_candidates: int = 16
    # Fair share and preemption (scheduling.planner.QueuePolicy).
    queues: QueuePolicy = field(default_factory=QueuePolicy)
    # Alerts: a preemption storm, a starved queue (scheduling.queuewatch).
    watch: QueueWatch = field(default_factory=QueueWatch)
    # After a cycle that planned for T seconds and placed nothing, the next one starts
    # no sooner than T * (1 - share) / share later (scheduling.cadence), so that the
    # API, the state watch and the commits keep the rest of the event loop when every
    # new job wakes the scheduler for a queue that cannot be placed. 1: back to back.
    plan_share: float = 0.5


def _depends_on(data: dict[str, object]) -> list[str]:
    """The job ids a submitted job's input names to run after (the planner checks them)."""
    deps = data.get("depends_on")
    return [d for d in deps if isinstance(d, str)] if isinstance(deps, list) else []


def placeable_since(job: Job) -> float:
    """Since when a job just placed could have been: its submission, begin time, release or
    dependencies' end (Job.waiting_since), or its last try's end (a retry, a preemption, a
    requeue). Found by exploring: muster_placement_latency_seconds counted from the
    submission, a requeued job's earlier runs and holds included."""
    ended = [t.finished_at for t in job.attempts if t.state.terminal and t.finished_at]
    return max([job.waiting_since, *ended])


class Scheduler:
    def __init__(
        self,
        store: Store,
        state: ClusterState,
        leadership: Leader,
        config: SchedulerConfig | None = None,
        caught_up: Callable[[], Awaitable[None]] | None = None,
        recorded_jobs: Callable[[list[str]], Awaitable[dict[str, JobState]]] | None = None,
    ) -> None:
        self.store = store
        # Of some job ids, those history has a job of, with the state it last saw each in:
        # a submission over NATS naming one as its own id is refused, ids are never reused
        # (SubmitRequest.used); one it runs after is judged by that state
        # (SubmitRequest.recorded), as the API judges it.
        self.recorded_jobs = recorded_jobs
        self._used_ids_failed_at: float | None = None
        # A read barrier: returns once the state watch has delivered everything stored
        # before the call (Watch.caught_up). A new leader waits for it before it takes
        # any input, or it would act on records older than the previous leader's last
        # commits: a report for an attempt it has not seen yet would be dropped as stale.
        self.caught_up = caught_up
        self.state = state
        self.leadership = leadership
        self.config = config or SchedulerConfig()
        self.wake = asyncio.Event()
        self._reports: list[tuple[Msg, StatusReport]] = []
        self._commands: list[tuple[Msg, Command]] = []
        self._submissions: list[tuple[Msg, SubmitRequest]] = []
        # What each feed has handed over and is not acknowledged or given back yet (by
        # stream), anew each time this replica leads.
        self._held: dict[str, Held] = {}
        self.cycles = 0
        self.placed = 0
        self.conflicts = 0
        self.budget = EvictionBudget(self.config.eviction)
        self.disrupted: dict[tuple[str, str], float] = {}  # domains alerted as disrupted: when last found so
        self.last_plan: Plan | None = None
        self.replans = 0  # plans dropped because they touched a record in flight (KeyInFlight)
        self._inflight: dict[asyncio.Task[Plan], _Cycle] = {}
        # Finding what the store refuses (scheduling.isolation).
        self._isolation: Isolation | None = None
        self._fail: dict[str, str] = {}  # jobs to end FAILED: their records were refused
        self._skip: set[str] = set()  # jobs whose records cannot be written at all
        self._stripped: set[tuple[str, str]] = set()  # reports already retried without their text
        self.poisoned = 0
        # When this leader first saw each unheard host (cycle.stops.evict_lost's grace).
        self._unheard_since: dict[str, float] = {}
        # Assignment records delivered to hosts with a task waiting to start
        # (scheduling.delivery); when the last check ran.
        self._delivered: dict[str, Sent] = {}
        self._delivery_checked = 0.0
        self.watch = self.config.watch
        self._watched_term = 0  # the term `watch` and `disrupted` were started for
        self.windows = WindowWatch()  # anew with each term (_lead)
        self.idle_gpus = IdleWatch()  # anew with each term (_lead)
        self._jobs_view: JobView | None = None  # what _runnable asks whether a job could ever run
        # queue -> (whether a job of it waiting could ever run, when that was found out),
        # and the check under way (one at a time, off the commit path: Scheduler._runnable).
        self._runnable_found: dict[str, tuple[bool, float]] = {}
        # Queues asked about, in the order first asked: when (the caller's clock, and monotonic).
        self._runnable_wanted: dict[str, tuple[float, float]] = {}
        self._runnable_check: asyncio.Task[None] | None = None
        self._monotonic = time.monotonic  # (a test's own clock)
        self._placed_queues: set[str] = set()
        self._watched_at = 0.0
        self._plan_after = 0.0  # time.monotonic() before which the next cycle waits (plan_share)
        # The status stream's feed while leading: how far its reports have been read
        # (PullFeed.read_to), which lost hosts' eviction waits for (cycle.stops.evict_lost).
        self._status_feed: PullFeed | None = None
        state.listeners.append(self._on_state)

    def _on_state(self, kind: str, obj: object) -> None:
        self.wake.set()

    # ------------------------------------------------------------ inputs

    def _decode_report(self, msg: Msg) -> StatusReport | None:
        try:
            r = decode(StatusReport, msg.data)
        except DecodeError as exc:
            metrics.DROPPED.labels("status").inc()
            log.warning("dropped status report on %s: %s", msg.subject, exc)
            return None
        if msg.subject != subjects.status_subject(r.host_id):
            metrics.DROPPED.labels("status").inc()
            log.warning("dropped status report: %s claims host %s", msg.subject, r.host_id)
            return None
        if r.shutdown:
            self.state.mark_leaving(r.host_id, r.ts)
        self.state.heard_from(r.host_id, r.instance, r.ts)
        return r

    def _decode_submission(self, msg: Msg) -> SubmitRequest | None:
        """A submission as its subject and NATS tell it: its jobs are the user's the subject
        names (`muster.submit.<user>`: what a submitter's credentials allow it), whatever
        its body says, of the queue it names if it names one (`muster.submit.<user>.<queue>`:
        all a submitter bound to queues may publish on), and were submitted when the stream
        stored it, not when the client says (found by exploring: a client named any user,
        and dated its jobs back to the head of their queues)."""
        named = subjects.submitter_of(msg.subject)
        try:
            if named is None:
                raise DecodeError(f"{msg.subject[:80]!r} names no user")
            req = decode(SubmitRequest, msg.data, limit=MAX_SUBMIT_BYTES)
        except DecodeError as exc:
            metrics.DROPPED.labels("submission").inc()
            log.warning("dropped submission: %s", exc)
            return None
        stored = _stored_at(msg)
        # The uid keys of its jobs come from a nonce of the leader's, not from ids the client
        # chose (found by exploring: an id chosen for its uid ran as another team's job's).
        user, queue = named
        return req.model_copy(update={"user": user, "ts": stored if stored != float("inf") else time.time(),
                                      "nonce": secrets.token_hex(16), "used": None, "recorded": {},
                                      "queue": queue})

    async def _reject_unread(self, msg: Msg) -> None:
        """A submission that cannot be read (malformed, too many jobs, a field of the wrong
        type): each job id found in it is said rejected on muster.events.job.rejected, with
        why (found by exploring: it was acknowledged and dropped with a log line only).
        Whatever the body is (nested past the parser's depth included), it raises nothing:
        the message is acknowledged after it."""
        try:
            try:
                decode(SubmitRequest, msg.data, limit=MAX_SUBMIT_BYTES)
                why = f"{msg.subject[:80]!r} names no user, or a queue that is not a queue's name"
            except DecodeError as exc:
                why = str(exc)
            body = json.loads(msg.data)
            jobs = body.get("jobs") if isinstance(body, dict) else None
            ids = [j["id"] for j in jobs if isinstance(j, dict) and isinstance(j.get("id"), str)] \
                if isinstance(jobs, list) else []
        except Exception:  # noqa: BLE001 - not JSON, or JSON past any parser's depth: no ids to tell
            return
        await self._publish([Event(kind="job.rejected", job_id=i[:128], message=f"the submission could not be read: "
                                                                                f"{why}"[:1000]) for i in ids[:1000]])

    async def _screen_submissions(self) -> None:
        """Mark the submissions waiting for a cycle (those not marked yet) with the ids of
        their jobs that an earlier job had, whose records are gone (`used`, from history),
        and with the state history last saw each job they run after in that the view does
        not hold (`recorded`), in one question to history for them all: found by
        exploring, an id used again after its job's record expired ran a second job under
        it, another user's included, and replaced the first's history; and a dependency
        known only to history was refused, where the API accepted it. The decision stays
        the planner's (cycle.submissions), over what is marked here. History out of reach:
        none are known (said once), and it is not asked again for USED_IDS_PAUSE_S (each
        ask holds a thread)."""
        waiting = [r for _, r in self._submissions[:SCREEN_AT_ONCE] if r.used is None]
        if not waiting:
            return
        failed = self._used_ids_failed_at
        fresh = {i for r in waiting for i in (d.get("id") for d in r.jobs) if isinstance(i, str)
                 and i not in self.state.jobs and subjects.job_key(i) not in self.state.revisions}
        deps = {d for r in waiting for data in r.jobs for d in _depends_on(data) if d not in self.state.jobs}
        found: dict[str, JobState] = {}
        asked = fresh | deps
        if asked and self.recorded_jobs is not None and (
                failed is None or time.monotonic() - failed >= USED_IDS_PAUSE_S):
            try:
                # (a database that does not answer must not hold submissions up)
                found = await asyncio.wait_for(self.recorded_jobs(sorted(asked)), USED_IDS_WAIT_S)
            except Exception as exc:  # noqa: BLE001 - NATS is the truth; history only guards ids gone from it
                if failed is None:
                    log.warning("cannot ask history which submitted job ids were used before, or how the jobs "
                                "they run after ended (%r): taking the ids, not knowing those jobs", exc)
                self._used_ids_failed_at = time.monotonic()
            else:
                if failed is not None:
                    log.warning("history answers again about submitted job ids and the jobs they run after")
                self._used_ids_failed_at = None
        used = fresh & found.keys()
        marked = {id(r): r.model_copy(update={
            "used": sorted(used & {d.get("id") for d in r.jobs}),
            "recorded": {d: found[d] for data in r.jobs for d in _depends_on(data) if d in deps and d in found}})
            for r in waiting}
        # (the feed may have added submissions meanwhile: those are left as they are)
        self._submissions[:] = [(m, marked.get(id(r), r)) for m, r in self._submissions]

    def _decode_command(self, msg: Msg) -> Command | None:
        try:
            return decode(Command, msg.data)
        except DecodeError as exc:
            metrics.DROPPED.labels("command").inc()
            log.warning("dropped command: %s", exc)
            return None

    def _receiver(self, sink: list, decoder, held: Held, kind: str):
        """What a pull feed does with each message: decode it onto the queue (a malformed
        one is counted, acknowledged and dropped, never retried) and wake the loop. A
        message delivered again while held (queued, or in a commit in flight: its ack_wait
        passed) is dropped: the delivery held settles it (found by exploring: with a
        backlog, each was queued again, and 30,000 submissions made 69,105 deliveries)."""

        async def receive(m: Msg) -> None:
            if not held.add(m, time.monotonic()):
                metrics.INPUTS_HELD_AGAIN.labels(kind).inc()
                return
            decoded = decoder(m)
            if decoded is None:
                if sink is self._submissions:
                    await self._reject_unread(m)
                await self._ack(m, held)
                return
            sink.append((m, decoded))
            self.wake.set()

        return receive

    async def _ack(self, m: Msg, held: Held | None) -> None:
        """Acknowledge an input (an error is harmless: it comes back, and is idempotent),
        and hold it no more."""
        try:
            await m.ack()
        except Exception:  # noqa: BLE001
            pass
        if held is not None:
            held.settle(m)

    # ------------------------------------------------------------ the loop

    async def run(self, stop: asyncio.Event) -> None:
        """Schedule whenever this replica leads, until `stop` is set."""
        while not stop.is_set():
            if not self.leadership.leading:
                self.leadership.changed.clear()
                stop_task = asyncio.ensure_future(stop.wait())
                change_task = asyncio.ensure_future(self.leadership.changed.wait())
                await asyncio.wait({stop_task, change_task}, return_when=asyncio.FIRST_COMPLETED)
                stop_task.cancel()
                change_task.cancel()
                continue
            try:
                await self._lead(stop)
            except asyncio.CancelledError:
                raise
            except (TimeoutError, StoreError, NatsError, OSError) as exc:
                # Expected in a cluster's life (NATS re-electing or reconnecting, another
                # replica's term fencing this one): one line, and lead again if still leader.
                log.warning("scheduling interrupted (%s: %s); starting again", type(exc).__name__, exc)
                await asyncio.sleep(0.5)
            except Exception:  # noqa: BLE001 - a bug: the whole traceback, and carry on leading
                log.exception("scheduling interrupted; starting again")
                await asyncio.sleep(0.5)

    async def _lead(self, stop: asyncio.Event) -> None:
        term = self.leadership.term
        if not await self._catch_up(stop, term):
            return
        log.info("scheduling as leader, term %d", term)
        self.windows = WindowWatch()  # its first check takes the windows open now as known
        self.idle_gpus = IdleWatch()  # its first check alerts the attempts idle now again
        if term != self._watched_term:
            # A new term starts them afresh, as a new leader's (found by a review: a replica
            # leading again kept when it had last seen each queue waiting, and alerted a
            # starvation it had not watched); a loop interrupted within a term keeps them.
            w = self.config.watch
            self.watch = QueueWatch(storm_count=w.storm_count, storm_window_s=w.storm_window_s,
                                    starved_after_s=w.starved_after_s)
            self.disrupted = {}
            self._watched_term = term
        js = self.store.js
        # A message taken by a leader that then died or froze returns after ack_wait:
        # keep it close to the lease so a new leader sees it soon after taking over.
        cfg = jsapi.ConsumerConfig(ack_wait=self.leadership.config.ttl_s + 1, max_ack_pending=100_000,
                                   max_deliver=-1)
        # (stream, consumer, subject, queue, decoder, kind, what a cycle takes of it: _plan_next)
        consumers = (
            (subjects.STATUS_STREAM, "scheduler-status", f"{subjects.STATUS_PREFIX}.>", self._reports,
             self._decode_report, "status", self.config.fetch_batch * 4),
            (subjects.CMDS_STREAM, "scheduler-cmds", f"{subjects.CMDS_PREFIX}.>", self._commands,
             self._decode_command, "command", self.config.fetch_batch),
            (subjects.SUBMIT_STREAM, "scheduler-submit", f"{subjects.SUBMIT_PREFIX}.>", self._submissions,
             self._decode_submission, "submission", SCREEN_AT_ONCE),
        )
        cycles = max(1, min(self.config.pipeline, FENCE_SLOTS)) + HELD_CYCLES_BEYOND_PIPELINE
        leading_stop = asyncio.Event()
        feeds = []
        # What an earlier leader took and did not acknowledge comes back after ack_wait:
        # until then the status feed cannot say how far the reports have been read.
        trust_after = time.time() + (cfg.ack_wait or 0)
        self._held = {}
        for stream, durable, subject, sink, decoder, kind, take in consumers:
            await ensure_consumer(js, stream, durable, subject, dataclasses.replace(cfg))
            held = self._held[stream] = Held(limit=cycles * take, ack_wait_s=cfg.ack_wait or 0)
            feeds.append(PullFeed(self.store.nc, stream, durable, self._receiver(sink, decoder, held, kind),
                                  batch=self.config.fetch_batch, trust_after=trust_after,
                                  redelivered_after_s=cfg.ack_wait or 0, held=held))
        self._status_feed = next(f for f in feeds if f.stream == subjects.STATUS_STREAM)
        fetchers = [asyncio.create_task(f.run(leading_stop)) for f in feeds]
        go_again = False
        try:
            while not stop.is_set() and self.leadership.leading and self.leadership.term == term:
                if not go_again:
                    try:
                        await asyncio.wait_for(self.wake.wait(), timeout=self.config.tick_s)
                    except TimeoutError:
                        pass
                self.wake.clear()
                go_again = False
                if not (self.leadership.leading and self.leadership.term == term):
                    break  # a leader woken after its lease ended sends nothing, no resend either
                try:
                    await self._redeliver()
                    await self._reap(block=len(self._inflight) >= max(1, min(self.config.pipeline, FENCE_SLOTS)))
                    if await self._wait_for_turn(stop):
                        break
                    await self._screen_submissions()
                    c = self._plan_next(term)
                    if c is None:
                        continue
                    if not c.writes:
                        await self._finish(c)  # acknowledgements and events only
                        continue
                    used = {x.slot for x in self._inflight.values()}
                    c.slot = min(set(range(FENCE_SLOTS)) - used)
                    task = asyncio.ensure_future(self._finish(c))
                    self._inflight[task] = c
                    task.add_done_callback(lambda _t: self.wake.set())
                    go_again = bool(self._reports or self._commands or self._submissions) or (
                        c.plan.placed > 0 and len(self.state.backlog) > 0)
                except FencedError as exc:
                    self.leadership.step_down(str(exc))
                except StoreError as exc:
                    log.warning("cycle failed: %s", exc)
                    await asyncio.sleep(0.1)
        finally:
            # Commits in flight end on their own (each has a timeout); their inputs are
            # acknowledged, or put back and returned to the stream below. The replica's
            # shutdown may cancel this wait: what follows runs all the same (found by a
            # review: the cancel skipped it, and the fetchers and commits ran on).
            try:
                # The feeds take nothing more meanwhile: what they hold goes back to the
                # stream below, for the next leader (found by a review: they went on pulling
                # while the commits drained, holding inputs from the next leader).
                leading_stop.set()
                if self._inflight:
                    await asyncio.wait(list(self._inflight), timeout=30)
            finally:
                await self._stop_leading(leading_stop, fetchers)

    async def _stop_leading(self, leading_stop: asyncio.Event, fetchers: list[asyncio.Task[None]]) -> None:
        """Leading ends: commits still in flight are cancelled (their inputs put back),
        the feeds stop, and every input not acknowledged goes back to the stream. The
        runnable check goes last: a commit's landing may still ask for one."""
        for t in list(self._inflight):
            if not t.done():
                t.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)
        self._inflight.clear()
        if self._runnable_check is not None:
            self._runnable_check.cancel()
            await asyncio.gather(self._runnable_check, return_exceptions=True)
            self._runnable_check = None
        self._runnable_found, self._runnable_wanted = {}, {}
        leading_stop.set()
        self._status_feed = None
        for f in fetchers:
            f.cancel()
        await asyncio.gather(*fetchers, return_exceptions=True)
        # Unacknowledged inputs go back to the stream for the next leader.
        for m, _ in self._reports + self._commands + self._submissions:
            try:
                await m.nak()
            except Exception:  # noqa: BLE001
                pass
        self._reports.clear()
        self._commands.clear()
        self._submissions.clear()
        self._held = {}

    async def _wait_for_turn(self, stop: asyncio.Event) -> bool:
        """Leave the event loop to the rest of the replica until the last cycle's gap
        (plan_share, scheduling.cadence) has passed. Returns whether `stop` was set."""
        rest = self._plan_after - time.monotonic()
        if rest <= 0:
            return stop.is_set()
        return await pause(stop, rest)

    async def _catch_up(self, stop: asyncio.Event, term: int) -> bool:
        """Wait for the read barrier (if any); False if leadership of `term` ended first."""
        if self.caught_up is None:
            return True
        started = time.monotonic()
        barrier = asyncio.ensure_future(self.caught_up())
        while not barrier.done():
            await asyncio.wait({barrier}, timeout=1.0)
            if stop.is_set() or not self.leadership.leading or self.leadership.term != term:
                barrier.cancel()
                await asyncio.gather(barrier, return_exceptions=True)
                return False
        barrier.result()
        took = time.monotonic() - started
        metrics.CATCH_UP_SECONDS.observe(took)
        log.info("leader of term %d caught up with the state in %.2f s", term, took)
        return True

    async def _reap(self, block: bool) -> None:
        """Collect finished commits (waiting for one if `block`); re-raise a fence."""
        if block and self._inflight:
            await asyncio.wait(list(self._inflight), return_when=asyncio.FIRST_COMPLETED)
        fenced: FencedError | None = None
        for t in [t for t in self._inflight if t.done()]:
            del self._inflight[t]
            metrics.COMMITS_IN_FLIGHT.set(len(self._inflight))
            if t.cancelled():
                continue
            exc = t.exception()
            if isinstance(exc, FencedError):
                fenced = exc
            elif isinstance(exc, StoreError):
                log.warning("cycle failed: %s", exc)
            elif exc is not None:
                log.error("commit failed", exc_info=exc)
        if fenced is not None:
            raise fenced

    async def cycle(self) -> Plan | None:
        """One scheduling cycle, committed before it returns: plan from the snapshot,
        commit, acknowledge."""
        c = self._plan_next()
        if c is None:
            return None
        return await self._finish(c)

    def _plan_next(self, term: int | None = None) -> _Cycle | None:
        """Plan a cycle from the snapshot, leaving alone what the commits in flight write.
        Takes the inputs it uses off the queues (the rest stay, in order). None when not
        leading, or (`term` given) when leading under another term than `term`: the loop
        waited (for a commit, its turn) while the lease was lost and taken again, and the
        new term's read barrier has not been passed (found by a review: a cycle was
        committed under a new term before that term caught up with the store)."""
        if not self.leadership.leading or (term is not None and self.leadership.term != term):
            return None
        frozen_jobs: set[str] = set()
        frozen_hosts: set[str] = set()
        pending: dict[str, Job] = {}
        pending_held: dict[str, Resources] = {}
        for c in self._inflight.values():  # in the order they were planned
            jobs, hosts = c.frozen()
            frozen_jobs |= jobs
            frozen_hosts |= hosts
            pending.update(c.plan.jobs)
            pending_held.update(c.held)
        narrowing = self._isolation.next() if self._isolation is not None else None
        if self._isolation is not None and narrowing is None:
            log.warning("isolation over: the rest of the refused cycle committed")
            self._isolation = None
        failing = tuple(j for j in self._fail if j not in frozen_jobs)
        if (narrowing is not None or failing) and self._inflight:
            return None  # narrowed cycles run alone; planned again when the commits land
        self.cycles += 1
        started = time.perf_counter()
        reports_in = self._reports[: self.config.fetch_batch * 4]
        commands_in = self._commands[: self.config.fetch_batch]
        submissions_in = self._submissions[:SCREEN_AT_ONCE]
        placements: int | None = None
        evict = True
        if failing:  # a cycle of its own: only the failures
            reports_in, commands_in, submissions_in, placements, evict = [], [], [], 0, False
        elif narrowing is not None:
            n = narrowing.inputs
            reports_in = reports_in[:n]
            commands_in = commands_in[: n - len(reports_in)]
            submissions_in = submissions_in[: n - len(reports_in) - len(commands_in)]
            placements, evict = narrowing.placements, narrowing.evict
        now = time.time()
        term = self.leadership.term
        self._note_unheard(now)
        # Every report the store stored before `read_to` is in `reports_in` or was taken
        # by an earlier cycle: the queue holds them in the stream's order. When the store
        # stored each bounds its time too (cycle.reports.report_time).
        read_to = self._reports_read_to(len(reports_in))
        stamps = [_stored_at(m) for m, _ in reports_in]
        try:
            plan = plan_cycle(
                self.state,
                reports=[r for _, r in reports_in],
                commands=[c for _, c in commands_in],
                now=now,
                term=term,
                max_keys=self.config.max_keys_per_commit,
                policy=self.config.placement_policy,
                candidates=self.config.placement_candidates,
                budget=self.budget,
                submissions=[r for _, r in submissions_in],
                frozen_jobs=frozen_jobs,
                frozen_hosts=frozen_hosts,
                placements=placements,
                evict=evict,
                fail={j: self._fail[j] for j in failing},
                skip=self._skip,
                unheard_since=self._unheard_since,
                unheard_grace_s=self.unheard_grace_s,
                queues=self.config.queues,
                usage=not any(c.writes_usage for c in self._inflight.values()),
                reports_read_to=read_to,
                report_stamps=stamps,
                pending=pending,
                pending_held=pending_held,
            )
        except KeyInFlight as exc:
            # A check missed a record in flight: plan again once nothing is in flight.
            self.replans += 1
            self.budget.refund(self.budget.taken(), now)
            log.warning("cycle touched %s while its commit is in flight; planning again after it", exc)
            self.wake.set()
            return None
        self.last_plan = plan
        reports_in = self._take(self._reports, plan.reports_used, plan.deferred_reports)
        commands_in = self._take(self._commands, plan.commands_used, plan.deferred_commands)
        submissions_in = self._take(self._submissions, plan.submissions_used, plan.deferred_submissions)
        for kind, deferred, waiting in (("status", plan.deferred_reports, self._reports),
                                        ("command", plan.deferred_commands, self._commands),
                                        ("submission", plan.deferred_submissions, self._submissions)):
            if deferred:
                metrics.INPUTS_DEFERRED.labels(kind).inc(len(deferred))
            metrics.INPUTS_WAITING.labels(kind).set(len(waiting))
        metrics.COMMITS_IN_FLIGHT.set(len(self._inflight) + 1)
        metrics.LOST_HOSTS_WAITING_FOR_REPORTS.set(plan.held_for_reports)
        ttl = f"{self.config.finished_job_ttl_s}s" if self.config.finished_job_ttl_s else None
        writes = [
            Write(subjects.job_key(j.id), encode(j), expected=self.state.revisions.get(subjects.job_key(j.id), 0),
                  ttl=ttl if j.state.terminal and not self._live_attempt(j) else None)
            for j in plan.jobs.values()
        ] + [
            Write(subjects.alloc_key(h), encode(a), expected=self.state.revisions.get(subjects.alloc_key(h), 0))
            for h, a in plan.allocs.items()
        ] + [
            Write(subjects.qusage_key(q), encode(u), expected=self.state.revisions.get(subjects.qusage_key(q), 0))
            for q, u in plan.usage.items()
        ]
        objects = list(plan.jobs.values()) + list(plan.allocs.values()) + list(plan.usage.values())
        for w, obj in zip(writes, objects, strict=True):
            self.state.expect(w.key, w.value, obj)
        took = time.perf_counter() - started
        metrics.PLAN_SECONDS.observe(took)
        self._plan_after = time.monotonic() + cycle_gap(took, self.config.plan_share, placed=plan.placed)
        return _Cycle(plan, now, writes, reports_in, commands_in, submissions_in, narrowing=narrowing,
                      failing=failing, term=term, evictions=self.budget.taken())

    async def _redeliver(self) -> None:
        """Once a second: send again the assignment record of each host whose agent has
        not started a task placed on it (scheduling.delivery)."""
        now = time.time()
        if now - self._delivery_checked < 1.0:
            return
        self._delivery_checked = now
        after = self.config.redeliver_after_s
        after = 2 * self.state.heartbeat_interval_s if after is None else after
        # Every status report stored before this has reached the state (or is in a
        # commit in flight, which a resend does not wait for: it is harmless). 0 in a new
        # leader's first ack_wait, while reports an earlier leader took may come back:
        # nothing is sent again until then (else every host whose start report is unread
        # would get its record again at a takeover).
        found = undelivered(self.state, now, after, lambda h: self.state.health(h, now) is Health.HEALTHY,
                            self._delivered, self._reports_read_to())
        resent: dict[str, int] = {}
        try:
            for host, rev in found.due.items():
                alloc = self.state.allocs.get(host)
                if alloc is None:
                    continue
                try:
                    await self.store.nc.publish(subjects.assign_subject(host), encode(alloc),
                                                headers={"Nats-Sequence": str(rev)})
                except NatsError as exc:
                    log.warning("cannot send %s its assignments again: %s", host, exc)
                    return
                resent[host] = rev
                metrics.REDELIVERED.inc()
                last = self._delivered.get(host)
                log.warning("%s has not started a task placed on it %.0f s or more ago: its assignments sent again "
                            "(revision %d, resend %d)", host, after, rev, (last.resends if last else 0) + 1)
        finally:
            self._delivered = next_sent(self._delivered, found, resent, now)

    def _reports_read_to(self, taken: int = 0) -> float | None:
        """The store's time before which every status report has been read and taken (by
        a cycle; `taken` more of those queued are about to be): the status feed's read
        position, held back to the first report still queued. None when not leading;
        0 while the feed cannot tell yet (PullFeed.trust_after)."""
        feed = self._status_feed
        read_to = feed.read_to if feed is not None else None
        if read_to and len(self._reports) > taken:
            read_to = min(read_to, _stored_at(self._reports[taken][0]))
        return read_to

    @property
    def unheard_grace_s(self) -> float:
        g = self.config.unheard_grace_s
        return 3 * self.state.heartbeat_interval_s if g is None else g

    def _note_unheard(self, now: float) -> None:
        """Keep when each host with work but no record in the hosts bucket was first seen
        so by this leader (a fresh leader counts from its first cycle)."""
        unheard = {h for h in self.state.unheard if h not in self.state.hosts}
        for h in [h for h in self._unheard_since if h not in unheard]:
            del self._unheard_since[h]
        for h in unheard:
            self._unheard_since.setdefault(h, now)

    @staticmethod
    def _take(queue: list, used: int, deferred: list[int]) -> list:
        """Remove the first `used` inputs from `queue` and return them, except the
        deferred ones, which stay at the front in their order."""
        head = queue[:used]
        del queue[:used]
        if not deferred:
            return head
        skip = set(deferred)
        queue[:0] = [x for i, x in enumerate(head) if i in skip]
        return [x for i, x in enumerate(head) if i not in skip]

    def _put_back(self, c: _Cycle) -> None:
        """A cycle that did not commit: its inputs go back into the queues, where their
        stream put them. (Not simply at the front: two pipelined cycles whose commits
        failed, the later first back, put the later inputs before the earlier ones, and
        `_reports_read_to`, which reads the first queued report's time as the bound of what
        has been read, said a report still queued was read: a lost host's work could be
        replaced before its last report was applied. Found by a review.)"""
        for w in c.writes:
            self.state.unexpect(w.key)
        self.budget.refund(c.evictions, time.time())
        c.evictions = []
        self._reports[:] = _stream_order([*c.reports, *self._reports])
        self._commands[:] = _stream_order([*c.commands, *self._commands])
        self._submissions[:] = _stream_order([*c.submissions, *self._submissions])

    async def _not_committed(self, c: _Cycle) -> None:
        """A refused commit, or one whose outcome is unknown: its inputs go back, and its
        keys are read again (the store has what our view may not)."""
        self._put_back(c)
        await self._refresh([w.key for w in c.writes])

    async def _landed(self, c: _Cycle) -> CommitResult | None:
        """The result of a commit whose outcome is unknown, if it landed: every key it wrote
        holds what it wrote, at the revisions read. (Its keys are frozen for later cycles
        while it is in flight, and its records carry their times: no other write leaves the
        same bytes.) None when it did not, or they cannot be read."""
        revisions: dict[str, int] = {}
        try:
            for w in c.writes:
                rec = await self.store.get(w.key)
                if rec.value != w.value:
                    return None
                revisions[w.key] = rec.revision
        except StoreError:
            return None
        return CommitResult(revisions=revisions)

    async def _finish(self, c: _Cycle) -> Plan:
        """Commit a planned cycle; once durable, acknowledge its inputs and publish."""
        plan, now, writes = c.plan, c.now, c.writes
        if writes:
            fence = self.leadership.fence(c.slot)
            if c.term and fence.term != c.term:
                # Planned under a term that has ended (this replica may lead again, under a
                # new term whose read barrier this plan did not pass): not committed.
                metrics.COMMITS.labels("fenced").inc()
                self._put_back(c)
                return plan
            started = time.perf_counter()
            try:
                res = await self.store.commit(writes, fence=fence)
            except FencedError:
                metrics.COMMITS.labels("fenced").inc()
                self._put_back(c)
                raise
            except ConflictError as exc:
                metrics.COMMITS.labels("conflict").inc()
                self.conflicts += 1
                log.info("commit conflict, refreshing %d keys: %s", len(writes), exc)
                await self._not_committed(c)
                return plan
            except RejectedError as exc:
                metrics.COMMITS.labels("rejected").inc()
                self._put_back(c)
                await self._refused(c, exc)
                self.wake.set()
                return plan
            except asyncio.CancelledError:
                # Leading ends (the replica's shutdown): inputs back to be returned to the
                # stream; its keys are not read again one by one while NATS may be away (a
                # review timed the wait at keys x the read timeout); the next leader reads them.
                metrics.COMMITS.labels("unknown").inc()
                self._put_back(c)
                raise
            except BaseException as exc:
                try:
                    landed = await self._landed(c) if isinstance(exc, StoreError) else None
                except asyncio.CancelledError:
                    # Leading ends while its keys are read back: as a cancelled commit.
                    metrics.COMMITS.labels("unknown").inc()
                    self._put_back(c)
                    raise
                if landed is None:
                    metrics.COMMITS.labels("unknown").inc()
                    await self._not_committed(c)
                    raise
                # Its reply was lost, but it landed: as committed, at the revisions read back,
                # its inputs acknowledged and its events and alerts published (found by a
                # review: they were lost, the inputs put back and ignored when read again).
                log.warning("a commit whose outcome was unknown had landed: %s", exc)
                res = landed
            metrics.COMMITS.labels("ok").inc()
            metrics.COMMIT_SECONDS.observe(time.perf_counter() - started)
            if res.duplicate:
                for w in writes:
                    self.state.unexpect(w.key)
                await self._refresh([w.key for w in writes])
            for j in (() if res.duplicate else plan.jobs.values()):
                self.state.apply_job(j, res.revisions[subjects.job_key(j.id)])
            for h, a in (() if res.duplicate else plan.allocs.items()):
                self.state.apply_alloc(a, res.revisions[subjects.alloc_key(h)])
            for q, u in (() if res.duplicate else plan.usage.items()):
                self.state.apply_queue_usage(u, res.revisions[subjects.qusage_key(q)])
            for (kind, queue), n in plan.preempted.items():
                metrics.PREEMPTIONS.labels(queue, kind).inc(n)
            for (queue, ckpt), gpu_s in plan.preemption_lost.items():
                metrics.PREEMPTION_LOST.labels(queue, "yes" if ckpt else "no").inc(gpu_s)
            if plan.timed_out:
                metrics.TIMEOUTS.inc(plan.timed_out)
            if plan.gpu_fault_stops:
                metrics.GPU_FAULT_STOPS.inc(plan.gpu_fault_stops)
            rs = plan.reservations
            metrics.RESERVATIONS.set(len(rs))
            metrics.RESERVED_HOSTS.set(sum(len(r.hosts) for r in rs))
            metrics.RESERVATION_WAIT.set(max(0.0, min(r.start for r in rs) - now) if rs else 0.0)
            if plan.placed:
                self.placed += plan.placed
                metrics.PLACEMENTS.inc(plan.placed)
                for ev in plan.events:
                    if ev.kind == "job.placed" and ev.job_id in plan.jobs:
                        metrics.PLACEMENT_LATENCY.observe(max(0.0, now - placeable_since(plan.jobs[ev.job_id])))
        self._settled(c)
        # Effects are durable: acknowledge the inputs, then tell the world.
        for stream, inputs in ((subjects.STATUS_STREAM, c.reports), (subjects.CMDS_STREAM, c.commands),
                               (subjects.SUBMIT_STREAM, c.submissions)):
            for m, _ in inputs:
                await self._ack(m, self._held.get(stream))
        if plan.accepted:
            metrics.SUBMISSIONS.inc(plan.accepted)
        for queue, n in plan.limited.items():
            metrics.SUBMISSIONS_REFUSED.labels(queue).inc(n)
        for job_id, why in plan.rejected:
            metrics.DROPPED.labels("submission").inc()
            await self._publish([Event(kind="job.rejected", job_id=job_id, message=why)])
        await self._publish(plan.events)
        await self._alerts(plan, now)
        if (plan.placed and len(self.state.backlog) > 0) or len(self._submissions) > 0:
            self.wake.set()  # more may fit; go again at once
        elif plan.paced:
            asyncio.get_running_loop().call_later(0.1, self.wake.set)  # pacing: come back soon
        elif plan.held_for_reports:
            asyncio.get_running_loop().call_later(0.5, self.wake.set)  # the status feed moves on its own
        return plan

    # ------------------------------------------------------------ refused commits

    def _settled(self, c: _Cycle) -> None:
        """A cycle committed: what it tried while isolating is done."""
        for job_id in c.failing:
            self._fail.pop(job_id, None)
        if c.narrowing is not None and self._isolation is not None:
            used = bool(c.reports or c.commands or c.submissions)
            self._isolation.settle(c.narrowing, used, c.plan.placed)

    async def _refused(self, c: _Cycle, exc: RejectedError) -> None:
        """The store refused a cycle's commit for what it held (its inputs are back at the
        front of their queues): isolate the input or job behind it (scheduling.isolation)."""
        if c.failing:
            # Even the FAILED records of these jobs are refused: leave them alone.
            for job_id in c.failing:
                self._fail.pop(job_id, None)
                self._skip.add(job_id)
            await self._poison("job", f"jobs {', '.join(c.failing)} left alone: even their FAILED records "
                                      f"were refused ({exc})", job_ids=list(c.failing))
            return
        if c.narrowing is None:
            n = len(c.reports) + len(c.commands) + len(c.submissions)
            self._isolation = Isolation(inputs=n, placements=c.plan.placed, evictions=c.plan.evicted > 0)
            log.warning("the store refused a commit of %d records (%s): trying its %d inputs and %d placements "
                        "one at a time", len(c.writes), exc, n, c.plan.placed)
            return
        iso = self._isolation
        assert iso is not None
        # The refused cycle's first input, found where it went back (by identity: put back in
        # stream order, an input redelivered after another leader's ack wait may be ahead).
        if c.reports:
            m, r = c.reports[0]
            at = _index_of(self._reports, c.reports[0])
            key = (r.attempt_id, r.state.value)
            if (r.output_tail or r.reason) and key not in self._stripped:
                self._stripped.add(key)
                bare = r.model_copy(update={"output_tail": "", "reason": "output dropped: the job's record "
                                                                       "could not take it"})
                self._reports[at] = (m, bare)  # tried again without the job's text
                return
            del self._reports[at]
            await self._drop(m, "status", f"status report of {r.attempt_id} dropped: {exc}", job_ids=[r.job_id])
        elif c.commands:
            m, cmd = c.commands[0]
            del self._commands[_index_of(self._commands, c.commands[0])]
            await self._drop(m, "command", f"{cmd.kind} of {cmd.job_id} dropped: {exc}", job_ids=[cmd.job_id])
        elif c.submissions:
            m, req = c.submissions[0]
            del self._submissions[_index_of(self._submissions, c.submissions[0])]
            ids = [str(d.get("id")) for d in req.jobs]
            await self._drop(m, "submission", f"a submission of {len(ids)} jobs from {req.user} dropped: {exc}",
                             job_ids=ids)
            await self._publish([Event(kind="job.rejected", job_id=i, message=f"the store refused it: {exc}")
                                 for i in ids])
        else:
            # A placement or evictions: the jobs it changed end FAILED, in a cycle of their own.
            for job_id in c.plan.jobs:
                self._fail[job_id] = f"its records could not be written: {exc}"
            await self._poison("job", f"jobs {', '.join(c.plan.jobs)} fail: the store refused their records ({exc})",
                               job_ids=list(c.plan.jobs))
        iso.settle(c.narrowing, bool(c.reports or c.commands or c.submissions), c.plan.placed)

    async def _drop(self, m: Msg, kind: str, message: str, job_ids: list[str]) -> None:
        await self._ack(m, self._held.get(_STREAM_OF[kind]))  # never delivered again
        metrics.DROPPED.labels(kind).inc()
        await self._poison(kind, message, job_ids)

    async def _poison(self, kind: str, message: str, job_ids: list[str]) -> None:
        self.poisoned += 1
        metrics.POISON.labels(kind).inc()
        log.error("poison input isolated: %s", message)
        ev = Event(kind=subjects.ALERT_INPUT_REJECTED, job_id=job_ids[0] if len(job_ids) == 1 else None,
                   message=message[:2000], data={"kind": kind, "jobs": job_ids[:100]})
        await publish_alert(self.store.nc, subjects.ALERT_INPUT_REJECTED, ev)

    def _queue_alerts(self, plan: Plan, now: float) -> list[Event]:
        """Preemption storms at once; starved queues, and windows that began or ended
        (advance reservations, maintenance), checked at most once a second."""
        out = self.watch.preempted(now, sum(plan.preempted.values()), plan.preemption_cost)
        for ev in plan.events:
            if ev.kind == "job.placed" and ev.job_id in plan.jobs:
                self._placed_queues.add(plan.jobs[ev.job_id].spec.queue)
        if now - self._watched_at >= 1.0:
            self._watched_at = now
            out += self.windows.check(now, self.state.advance, self.state.maintenance)
            out += self.idle_gpus.check(now, self.state.idle_gpus(), self.state.jobs)
            rows = queue_view.rows(self.state, now, self.config.queues.half_life_s)
            below = {r.queue.name for r in rows if r.share * r.queue.weight < r.entitled - 1e-9}
            out += self.watch.queues(now, self.state.backlog.eligible_counts(now), self._placed_queues, below,
                                     {r.queue.name: (r.dominant, r.entitled) for r in rows},
                                     lambda q: self._runnable(q, now))
            self._placed_queues = set()
        return out

    def _runnable(self, queue: str, now: float) -> bool:
        """Whether a job of `queue` waiting now could ever run as the cluster stands: its
        queue's own limits admit it with nothing else held, and some host known could take
        it idle (what its submitter was warned of otherwise: server.views.jobs). Found out
        in a task of its own, a pass over the hosts a step at a time between the event
        loop's other work (a review measured 4 s of a blocked loop for 20 jobs of other
        shapes at 50,000 hosts, found in one go), and kept RUNNABLE_KEPT_S: False until
        it is known."""
        found = self._runnable_found.get(queue)
        if found is not None and now - found[1] <= RUNNABLE_KEPT_S:
            return found[0]
        # Every queue asked about gets its turn, in the order first asked (found by a
        # review: one check at a time, started by the first queue asked, left queues late
        # in the order never looked at).
        self._runnable_wanted.setdefault(queue, (now, self._monotonic()))
        if self._runnable_check is None or self._runnable_check.done():
            self._runnable_check = asyncio.ensure_future(self._find_wanted())
        return False

    async def _find_wanted(self) -> None:
        while self._runnable_wanted:
            queue, (asked, since) = next(iter(self._runnable_wanted.items()))
            try:
                runnable = await self._find_runnable(queue, asked)
            except Exception:  # noqa: BLE001 - an answer kept as unknown; the other queues go on
                log.exception("finding whether queue %s's jobs could run failed", queue)
                runnable = True
            # Kept from when it was found, on the caller's clock (a review: stamped with when
            # it was asked, an answer that took its turn past RUNNABLE_KEPT_S was stale at once).
            self._runnable_found[queue] = (runnable, asked + self._monotonic() - since)
            self._runnable_wanted.pop(queue, None)

    async def _find_runnable(self, queue: str, now: float) -> bool:
        """`_runnable`'s answer for `queue`: the first RUNNABLE_LOOKS jobs in its order are
        looked at (a job its own limits hold back, its user's or its group's, is not one that
        could run: `queue_view.own_limits`); past them it is taken as runnable."""
        view = self._jobs_view
        if view is None or view.state is not self.state:
            view = self._jobs_view = JobView(self.state, None, self.config.queues.half_life_s)
        runnable = False
        for n, key in enumerate(list(self.state.backlog.order.get(queue, ()))[:RUNNABLE_LOOKS + 1]):
            if n >= RUNNABLE_LOOKS:
                runnable = True
                break
            job = self.state.jobs.get(key[2])
            if job is None or job.not_before > now or view.queue_never(job):
                continue
            if queue_view.own_limits(self.state, job, self.state.queues.get(job.spec.queue)):
                continue  # waits its turn by its own (its user's, its group's) limits: not starved
            if not await finish_stepwise(view.hosts_never_steps(job, time.monotonic()), lambda: asyncio.sleep(0)):
                runnable = True
                break
        return runnable

    async def _alerts(self, plan: Plan, now: float) -> None:
        nc = self.store.nc
        for ev in self._queue_alerts(plan, now):
            await publish_alert(nc, ev.kind, ev)
        failed = [ev.model_copy() for ev in plan.events if ev.kind == "job.failed"]
        queues = {ev.job_id: plan.jobs[ev.job_id].spec.queue for ev in failed if ev.job_id and ev.job_id in plan.jobs}
        for ev in job_failed_alerts(failed, queues, now):  # one for many past 5 in a cycle
            await publish_alert(nc, subjects.ALERT_JOB_FAILED, ev)
        # A domain alerted stays alerted until a window has passed without a cycle finding
        # it disrupted: only cycles with lost hosts to evict look (found by a review: a
        # cycle that had none forgot it, and the next one alerted again).
        window = self.budget.config.domain_window_s
        self.disrupted = {d: t for d, t in self.disrupted.items() if now - t <= window}
        for dom, lost in plan.disrupted.items():
            seen = dom in self.disrupted
            self.disrupted[dom] = now
            if seen:
                continue
            label, value = dom
            size = self.state.domain_sizes().get(dom, 0)
            cfg = self.budget.config
            ev = Event(kind=subjects.ALERT_DOMAIN_DISRUPTED, ts=now,
                       message=(f"{lost} of {size} hosts in {label}={value} lost within "
                                f"{cfg.domain_window_s:g} s: suspected partition; rescheduling from it "
                                f"is paced at {cfg.domain_rate_per_s:g}/s, only to where capacity exists; "
                                f"KEEP_RUNNING work on hosts that return in time stays where it is"),
                       data={"label": label, "value": value, "lost": lost, "size": size,
                             "rate_per_s": cfg.domain_rate_per_s})
            await self.store.nc.publish(f"{subjects.EVENTS_PREFIX}.domain.disrupted", encode(ev))
            await publish_alert(nc, subjects.ALERT_DOMAIN_DISRUPTED, ev)

    @staticmethod
    def _live_attempt(job) -> bool:
        return any(not a.state.terminal for a in job.attempts)

    async def _refresh(self, keys: list[str]) -> None:
        for k in keys:
            try:
                self.state.apply_state_record(await self.store.get(k))
            except StoreError as exc:
                log.warning("refresh %s: %s", k, exc)

    async def _publish(self, events: list[Event]) -> None:
        for ev in events:
            try:
                await self.store.nc.publish(f"{subjects.EVENTS_PREFIX}.{ev.kind}", encode(ev))
            except Exception:  # noqa: BLE001 - events are best effort; history has the truth
                break
