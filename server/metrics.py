"""Prometheus metrics, with conventional names. One registry per process."""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from server.memory import on_collection
from wire.stopping import pause

REGISTRY = CollectorRegistry(auto_describe=True)

HEARTBEATS = Counter(
    "muster_heartbeats_received_total", "Heartbeat records seen by the watch", registry=REGISTRY
)
HEARTBEATS_PENDING = Gauge(
    "muster_heartbeats_pending",
    "Heartbeat records not yet applied by the server when it last heard (unread in the stream, "
    "or read and waiting in the ingest process)",
    registry=REGISTRY,
)
HEARTBEATS_SKIPPED = Counter(
    "muster_heartbeats_skipped_total",
    "Heartbeat records removed from the stream before the server's reader got to them (replaced by a newer "
    "heartbeat of their host while the reader was behind); while they are, hosts are not judged SUSPECT",
    registry=REGISTRY,
)
HEARTBEAT_INGEST_LAG = Gauge(
    "muster_heartbeat_ingest_lag_seconds",
    "Age of the newest heartbeat batch from the ingest process when it was applied",
    registry=REGISTRY,
)
HEARTBEAT_INGEST_RESTARTS = Counter(
    "muster_heartbeat_ingest_restarts_total", "Heartbeat ingest processes restarted after dying",
    registry=REGISTRY,
)
HISTORY_UNWRITTEN = Gauge(
    "muster_history_unwritten_seconds",
    "How long the history this replica's historian writes has gone unwritten, its writes failing (0 while "
    "they go through, and on a replica whose historian does not hold the writer lease)",
    registry=REGISTRY,
)
HISTORIAN_RESTARTS = Counter(
    "muster_historian_restarts_total", "Historian processes restarted after dying", registry=REGISTRY,
)
DROPPED = Counter(
    "muster_messages_dropped_total",
    "Untrusted messages dropped (malformed, oversized, wrong host, stale term)",
    ["kind"],
    registry=REGISTRY,
)
POISON = Counter(
    "muster_poison_total",
    "Inputs and jobs the scheduler isolated because the store refused their records",
    ["kind"],
    registry=REGISTRY,
)
HOST_FENCES = Counter(
    "muster_host_fences_total", "Fences hosts' agents reported (noticed by the leader: alerts.host.fenced)",
    registry=REGISTRY,
)
FENCED_ATTEMPTS = Counter(
    "muster_fenced_attempts_total", "Attempts those fences froze, by how they came out of it",
    ["outcome"], registry=REGISTRY,
)
HOSTS = Gauge("muster_hosts", "Hosts by health", ["health"], registry=REGISTRY)
JOBS = Gauge("muster_jobs", "Jobs in the live state by state", ["state"], registry=REGISTRY)
QUEUE_DEPTH = Gauge("muster_queue_depth", "Jobs waiting to be placed", registry=REGISTRY)
JOBS_PARKED = Gauge("muster_jobs_parked", "Queued jobs not considered for placement: held by an operator, or "
                    "waiting for the jobs they run after", ["why"], registry=REGISTRY)
LOST_HOSTS_WAITING_FOR_REPORTS = Gauge(
    "muster_lost_hosts_waiting_for_reports",
    "Lost hosts whose work is not replaced yet: their key expired after the last status report read (the leader's; "
    "0 on the other replicas)",
    registry=REGISTRY)
PLACEMENTS = Counter("muster_placements_total", "Jobs placed (a gang of N tasks counts once)", registry=REGISTRY)
REDELIVERED = Counter("muster_assignments_redelivered_total",
                      "Assignment records sent again to a host whose agent had not started a task placed "
                      "on it (scheduling.delivery)", registry=REGISTRY)
PLACEMENT_LATENCY = Histogram(
    "muster_placement_latency_seconds",
    "From when a job could be placed (its submission, begin time, release, dependencies' end, or its last try's "
    "end) to its committed placement (observed by the leader)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
PREEMPTIONS = Counter(
    "muster_preemptions_total", "Jobs told to stop to make room, by the preempting queue and the kind of preemption",
    ["queue", "kind"], registry=REGISTRY)
PREEMPTION_LOST = Counter(
    "muster_preemption_lost_gpu_seconds_total",
    "GPU-seconds of work preempted tries lost, by the victim's queue and whether its job checkpoints (a try that "
    "does not loses all it ran; one that does, the time from its stop to its exit)",
    ["queue", "checkpoints"], registry=REGISTRY)
TIMEOUTS = Counter("muster_timeouts_total", "Tries stopped at their time limit", registry=REGISTRY)
RESERVATIONS = Gauge("muster_reservations", "Waiting jobs the leader's last scheduling cycle held hosts for "
                     "(scheduling.backfill; 0 on the other replicas)", registry=REGISTRY)
RESERVED_HOSTS = Gauge("muster_reserved_hosts", "Hosts the leader's last scheduling cycle held for waiting jobs "
                       "(scheduling.backfill); 0: no reservation, or not the leader", registry=REGISTRY)
RESERVATION_WAIT = Gauge("muster_reservation_start_seconds", "How long until the first reserved job could start on "
                         "its hosts, as the leader's last cycle worked it out (+Inf: unknown, a task there has no "
                         "time limit; 0: no reservation, or not the leader)", registry=REGISTRY)
GPU_FAULT_STOPS = Counter("muster_gpu_fault_stops_total", "Tries stopped because a GPU they hold faulted",
                          registry=REGISTRY)
QUEUE_ALLOCATED = Gauge("muster_queue_allocated", "What a queue's jobs hold now, by resource",
                        ["queue", "resource"], registry=REGISTRY)
QUEUE_NOMINAL = Gauge("muster_queue_nominal", "A queue's nominal quota, by resource", ["queue", "resource"],
                      registry=REGISTRY)
QUEUE_BORROWED = Gauge("muster_queue_borrowed", "What a queue holds above its nominal quota, by resource",
                       ["queue", "resource"], registry=REGISTRY)
QUEUE_PENDING = Gauge("muster_queue_pending", "A queue's jobs waiting to be placed", ["queue"], registry=REGISTRY)
QUEUE_FAIR_SHARE = Gauge("muster_queue_fair_share", "A queue's weighted dominant share (current use and decayed "
                         "past use, over cluster capacity, divided by its weight)", ["queue"], registry=REGISTRY)
QUEUE_DOMINANT_SHARE = Gauge("muster_queue_dominant_share", "A queue's dominant share, unweighted (current use and "
                             "decayed past use over cluster capacity, the largest over resources)", ["queue"],
                             registry=REGISTRY)
QUEUE_ENTITLED_SHARE = Gauge("muster_queue_entitled_share", "The dominant share a queue's weight entitles it to among "
                             "the active queues (itself counted as active)", ["queue"], registry=REGISTRY)
FAIRNESS = Gauge("muster_queue_fairness", "Jain's index, over the queues with jobs waiting, of what each holds "
                 "(its dominant share of the cluster now) over its weight's part among them: 1 when each holds its "
                 "part (or fewer than two wait), towards 1/n as one holds all", registry=REGISTRY)
QUEUES_WAITING = Gauge("muster_queues_waiting", "Queues with jobs waiting for placement (those muster_queue_fairness "
                       "is over)", registry=REGISTRY)
PLAN_SECONDS = Histogram(
    "muster_plan_seconds",
    "One scheduling cycle's planning on the event loop: deciding (server.scheduling.planner) and encoding its records",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
    registry=REGISTRY,
)
COMMITS = Counter(
    "muster_commits_total", "Scheduler commits by outcome", ["outcome"], registry=REGISTRY
)
COMMIT_SECONDS = Histogram(
    "muster_commit_seconds",
    "Atomic batch commit time",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
LEADER = Gauge("muster_leader", "1 when this replica holds the leader lease", registry=REGISTRY)
TERM = Gauge("muster_leader_term", "Current leadership term seen by this replica", registry=REGISTRY)
SUBMISSIONS = Counter("muster_jobs_submitted_total", "Jobs accepted", registry=REGISTRY)
SUBMISSIONS_REFUSED = Counter("muster_submissions_refused_total", "Jobs refused at submission by their queue's "
                              "submission limits (maxSubmittedJobs, maxSubmittedJobsPerUser), by queue: this replica's "
                              "API and, while it leads, NATS submissions", ["queue"], registry=REGISTRY)
INPUTS_WAITING = Gauge(
    "muster_scheduler_inputs_waiting",
    "Status reports, commands and submissions fetched by the leader and not yet committed (0 on the other "
    "replicas)",
    ["kind"],
    registry=REGISTRY,
)
INPUTS_DEFERRED = Counter(
    "muster_scheduler_inputs_deferred_total",
    "Inputs a cycle held back because an earlier cycle's commit, still in flight, writes their records",
    ["kind"],
    registry=REGISTRY,
)
INPUTS_HELD_AGAIN = Counter(
    "muster_scheduler_inputs_held_again_total",
    "Deliveries of an input the leader held already (queued or being committed past the consumer's ack_wait), "
    "dropped",
    ["kind"],
    registry=REGISTRY,
)
COMMITS_IN_FLIGHT = Gauge("muster_scheduler_commits_in_flight", "Cycles committing at once (the leader's; 0 on "
                          "the other replicas)", registry=REGISTRY)
STATE_LOAD_SECONDS = Gauge(
    "muster_state_load_seconds", "How long the server took at start to replay a bucket", ["bucket"],
    registry=REGISTRY,
)
STATE_LOAD_RECORDS = Gauge(
    "muster_state_load_records", "Records the server replayed from a bucket at start", ["bucket"],
    registry=REGISTRY,
)
CATCH_UP_SECONDS = Histogram(
    "muster_leader_catch_up_seconds",
    "How long a new leader waited for its state watch to deliver every record stored before it took over",
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
GC_PAUSE = Histogram(
    "muster_gc_pause_seconds",
    "Python garbage collections in the server process (each stops its event loop)",
    ["generation"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    registry=REGISTRY,
)
LOOP_LAG = Histogram(
    "muster_event_loop_lag_seconds",
    "How late the server's event loop woke for a timer: time it served nothing else "
    "(a long callback, a collection, or the process waiting for a CPU)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    registry=REGISTRY,
)


async def watch_loop_lag(stop: asyncio.Event, every_s: float = 0.1) -> None:
    """Until `stop`: wake every `every_s` and record into LOOP_LAG how late that was."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + every_s
        await pause(stop, every_s)
        LOOP_LAG.observe(max(0.0, loop.time() - due))


def watch_gc(slow_s: float = 0.5) -> None:
    """Time every garbage collection of this process into GC_PAUSE, and log one that
    stops the process for `slow_s` or more. Idempotent."""
    if any(getattr(cb, "_muster", False) for cb in gc.callbacks):
        return
    by_generation = {g: GC_PAUSE.labels(str(g)) for g in range(3)}  # runs on every collection

    def report(took: float, info: dict[str, Any]) -> None:
        by_generation[info.get("generation", 2)].observe(took)
        if took >= slow_s:
            logging.getLogger(__name__).warning("garbage collection (generation %s) took %.2f s, %s objects collected",
                                                info.get("generation"), took, info.get("collected"))

    on_collection(report)._muster = True  # type: ignore[attr-defined]


def leader_gauges_cleared() -> None:
    """A replica that stops leading: the gauges only the leader's cycles set go to 0, so
    that a sum over the replicas is the leader's (found by exploring: a replica that had
    led kept saying what it last saw)."""
    for gauge in (COMMITS_IN_FLIGHT, LOST_HOSTS_WAITING_FOR_REPORTS, RESERVATIONS, RESERVED_HOSTS, RESERVATION_WAIT):
        gauge.set(0)
    for kind in ("status", "command", "submission"):
        INPUTS_WAITING.labels(kind).set(0)
