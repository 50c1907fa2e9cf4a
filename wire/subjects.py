"""Names of NATS buckets, streams and subjects: the protocol between the parts."""

from __future__ import annotations

import re

# KV bucket of heartbeats: key = host id, per-key TTL = 3 heartbeat intervals.
HOSTS_BUCKET = "hosts"
# KV bucket of durable control-plane state. Keys:
#   job.<id>        Job record (written by API on submit, then by the leader only)
#   alloc.<host>    HostAlloc: the host's assigned attempts (the leader only)
#   lease           the leader lease (TTL, renewed with a revision check)
#   term            written once per leadership acquisition; its revision is the term
#   term.<n>        fence slots 1..3, written with `term` (see store.Fence)
#   fence           written in every leader commit, checked against `term`
#   fence.term.<n>  the same for a commit checking slot `term.<n>`
#   auth.token.<h>  hashed API tokens
#   hostcfg.<host>  operator settings of a host (cordon, drain)
#   queue.<name>    a queue's quota, weight, cohort and rules (the API, admin only)
#   qusage.<name>   a queue's decayed past use (the leader)
#   advres.<name>   an advance reservation: hosts set aside for queues over a time window
#                   (the API, admin only; expires a day after it ends)
#   advres-order    written, revision-checked, in the same atomic batch as every change
#                   of an advance reservation and every deletion of a queue (the API): of
#                   two such changes decided on the same view, one is stored
STATE_BUCKET = "state"
STATE_STREAM = f"KV_{STATE_BUCKET}"
HOSTS_STREAM = f"KV_{HOSTS_BUCKET}"

# Agents receive their `alloc.<host>` record republished on this core subject.
ASSIGN_PREFIX = "muster.assign"
# Agents report attempt state on this JetStream subject (stream STATUS).
STATUS_STREAM = "STATUS"
STATUS_PREFIX = "muster.status"
# API replicas ask a host's agent for a running attempt's output so far (core NATS,
# request-reply: OutputRequest, answered with OutputReply).
OUTPUT_PREFIX = "muster.output"
# API replicas send commands to the leader (stream CMDS).
CMDS_STREAM = "CMDS"
CMDS_PREFIX = "muster.cmd"
# Programs that speak NATS submit jobs here (stream SUBMIT), in messages of up to 500 jobs
# (wire.messages.MAX_SUBMIT_JOBS); the leader turns them into job records in its next commit.
SUBMIT_STREAM = "SUBMIT"
SUBMIT_PREFIX = "muster.submit"

# Events (job and host changes) and alerts, core NATS. Streams EVENTS and ALERTS keep
# host/domain events and all alerts for history; plain subscribers get them live.
EVENTS_PREFIX = "muster.events"
ALERTS_PREFIX = "alerts"
EVENTS_STREAM = "EVENTS"
ALERTS_STREAM = "ALERTS"

# Alert kinds, published on `alerts.<kind>` as Event JSON.
ALERT_HOST_LOST = "host.lost"
ALERT_HOST_RECOVERED = "host.recovered"
ALERT_DOMAIN_DISRUPTED = "domain.disrupted"
ALERT_GPU_UNHEALTHY = "gpu.unhealthy"
# A host's agent fenced itself (no heartbeat stored for its fence delay) and is heard
# again: how long, and how many attempts it continued or stopped.
ALERT_HOST_FENCED = "host.fenced"
# A host's agent asks for no new work (Heartbeat.pressure: its disk nearly full, ...).
ALERT_HOST_PRESSURE = "host.pressure"
# A host's heartbeat was published with `Nats-Rollup: all`, which removed every other
# host's heartbeat from the bucket: no agent sends it, so its credentials are misused.
ALERT_HOST_ROLLUP = "host.rollup"
# A host's agent reports a label key only operators set (MUSTER_OPERATOR_LABEL_KEYS,
# `muster.*`) with another value than the operator's, or one the operator did not set:
# ignored, but its host may be misconfigured, or its credentials misused.
ALERT_HOST_LABELS_DISPUTED = "host.labels_disputed"
ALERT_JOB_FAILED = "job.failed"
# A running attempt's GPUs have all been idle for its agent's --gpu-idle-after
# (server.health.idlegpus).
ALERT_JOB_GPUS_IDLE = "job.gpus_idle"
# The scheduler isolated an input or job whose records the store refused
# (server.scheduling.isolation).
ALERT_INPUT_REJECTED = "input.rejected"
# Preemptions over the storm threshold within a window, and a queue whose work waited
# past the starvation threshold while it was below its entitled share.
ALERT_PREEMPTION_STORM = "preemption.storm"
ALERT_QUEUE_STARVED = "queue.starved"
# An advance reservation opened or ended; a maintenance window (a drain scheduled ahead)
# began (server.scheduling.windowwatch).
ALERT_RESERVATION_OPENED = "reservation.opened"
ALERT_RESERVATION_ENDED = "reservation.ended"
ALERT_MAINTENANCE_BEGAN = "maintenance.began"
# The writing historian has not got history into its database for a while; and it has
# again (server.history.writehealth).
ALERT_HISTORY_BEHIND = "history.behind"
ALERT_HISTORY_RECOVERED = "history.recovered"
# Every kind, in the order the console offers them as a filter.
ALERT_KINDS = (ALERT_HOST_LOST, ALERT_HOST_RECOVERED, ALERT_HOST_FENCED, ALERT_HOST_PRESSURE, ALERT_DOMAIN_DISRUPTED,
               ALERT_GPU_UNHEALTHY, ALERT_HOST_ROLLUP, ALERT_HOST_LABELS_DISPUTED,
               ALERT_JOB_FAILED, ALERT_JOB_GPUS_IDLE, ALERT_PREEMPTION_STORM, ALERT_QUEUE_STARVED,
               ALERT_RESERVATION_OPENED, ALERT_RESERVATION_ENDED, ALERT_MAINTENANCE_BEGAN, ALERT_INPUT_REJECTED,
               ALERT_HISTORY_BEHIND, ALERT_HISTORY_RECOVERED)


def job_key(job_id: str) -> str:
    return f"job.{job_id}"


def alloc_key(host_id: str) -> str:
    return f"alloc.{host_id}"


def hostcfg_key(host_id: str) -> str:
    return f"hostcfg.{host_id}"


def queue_key(name: str) -> str:
    return f"queue.{name}"


def qusage_key(name: str) -> str:
    return f"qusage.{name}"


def advres_key(name: str) -> str:
    return f"advres.{name}"


# (A key of its own kind: `advres.<name>` names are reservations.)
ADVRES_ORDER_KEY = "advres-order"


def kv_subject(bucket: str, key: str) -> str:
    return f"$KV.{bucket}.{key}"


def assign_subject(host_id: str) -> str:
    return f"{ASSIGN_PREFIX}.{host_id}"


def output_subject(host_id: str) -> str:
    return f"{OUTPUT_PREFIX}.{host_id}"


def status_subject(host_id: str) -> str:
    return f"{STATUS_PREFIX}.{host_id}"


# A submitter's user name: one subject token (the job's user is the token after
# SUBMIT_PREFIX), the characters API token names take but '.'.
SUBMITTER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


# A queue's name (wire.messages.QUEUE_NAME_PATTERN): one subject token.
QUEUE_TOKEN_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def submit_subject(user: str, queue: str | None = None) -> str:
    """`muster.submit.<user>`, or `muster.submit.<user>.<queue>` for jobs of that queue
    only (what a submitter bound to queues may publish on)."""
    return f"{SUBMIT_PREFIX}.{user}" + (f".{queue}" if queue else "")


def submitter_of(subject: str) -> tuple[str, str] | None:
    """(the user, the queue or "") a submission's subject names (`muster.submit.<user>`
    or `muster.submit.<user>.<queue>`), None if it names no user (or a bad queue)."""
    rest = subject.removeprefix(SUBMIT_PREFIX + ".")
    if rest == subject:
        return None
    user, _, queue = rest.partition(".")
    if not SUBMITTER_RE.fullmatch(user) or (queue and not QUEUE_TOKEN_RE.fullmatch(queue)):
        return None
    return user, queue


def submitter_inbox_prefix(user: str) -> str:
    """The inbox prefix a submitter connects with (where its publishes' acknowledgements
    come): one token of its own, apart from agents' (`_INBOX_<host>`)."""
    return "_SUBMIT_INBOX_" + user


def agent_inbox_prefix(host_id: str) -> str:
    """The inbox prefix an agent connects with; one token, so that no host's inbox
    permission covers another's (`.` becomes `~`, which host names never contain)."""
    return "_INBOX_" + host_id.replace(".", "~")
