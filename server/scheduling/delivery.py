"""Which hosts' assignments must be sent again. Pure code, no I/O.

An agent learns its work from the stream's republish of its `alloc.<host>` record to
`muster.assign.<host>`: core NATS, at most once. It reads the record itself when it
connects or reconnects, but a republish can be lost without the agent noticing: the
NATS node that led the state stream dies between storing and republishing, or the agent
reads the record from a replica that has not caught up and the republish reaches it
while it is still reconnecting. The work would then stay PLACED for good.

The leader knows: a task the agent has not reported running `after_s` after its host's
record was last delivered, on a host that is heartbeating. `undelivered()` names those
hosts with the revision of the record to send again, and the scheduler publishes the
record it holds to the host's subject (the agent ignores a record it has already
applied, so a resend is harmless).

A task not started in time is far more often a slow agent than a lost message: on a
saturated machine every agent lags, and sending every lagging host its record again
each time it changes (which the stream republishes anyway) once made the leader send
some 290-390 records a second to agents already behind. So the wait runs from the record's
last delivery, not from the task's placement: a task placed on the host since (the
record written again, and republished), a change of the record the leader noticed, or
its own resend; it runs only as far as the leader has read the agents' status reports
(a loaded leader reads them late, and a task reported running looks unstarted until
then); and each resend to the same host doubles the wait, up to `MAX_DOUBLINGS` times,
until none of its tasks waits to start.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from server.state.cluster import ClusterState
from wire import subjects
from wire.messages import AttemptState

MAX_DOUBLINGS = 3  # the wait between resends to one host grows to 8 times `after_s`


@dataclass(frozen=True)
class Sent:
    """A host's record as last delivered: its revision, when (sent again by the leader,
    or a change the leader noticed), and how many times it was sent again since the host
    last had no task waiting to start."""

    revision: int
    at: float
    resends: int


@dataclass
class Deliveries:
    """`due`: host -> revision of the record to send again now. `waiting`: every host
    with a task placed more than the wait ago and not started, and its revision."""

    due: dict[str, int] = field(default_factory=dict)
    waiting: dict[str, int] = field(default_factory=dict)


def undelivered(
    state: ClusterState,
    now: float,
    after_s: float,
    healthy: Callable[[str], bool],
    sent: Mapping[str, Sent],
    reports_read_to: float | None = None,
) -> Deliveries:
    """The healthy hosts with a task placed more than `after_s` ago and not yet running,
    and of those the ones whose record is due again: none of their tasks was placed
    within the wait, nor was the record delivered within it (`sent`), the wait doubling
    with each resend. The wait is counted up to `reports_read_to` when given (the store's
    time up to which every status report has reached the state; 0: none is known read,
    as in a new leader's first seconds): a task whose start report the leader has not
    read yet is not taken for one its agent never got."""
    seen = now if reports_read_to is None else min(now, reports_read_to)
    placed: dict[str, tuple[float, float]] = {}  # host -> (oldest, newest) placement of a task not started
    for job_id in state.placed_ids:
        job = state.jobs.get(job_id)
        if job is None:
            continue
        for a in job.current_tasks():
            if a.state is not AttemptState.PLACED:
                continue
            alloc = state.allocs.get(a.host_id)
            if alloc is None or not any(t.attempt_id == a.id for t in alloc.tasks):
                continue  # its record no longer lists it: nothing to deliver
            old = placed.get(a.host_id)
            placed[a.host_id] = (a.placed_at, a.placed_at) if old is None else \
                (min(old[0], a.placed_at), max(old[1], a.placed_at))
    out = Deliveries()
    for host, (oldest, newest) in placed.items():
        rev = state.revisions.get(subjects.alloc_key(host), 0)
        if not rev or seen - oldest < after_s or not healthy(host):
            continue
        out.waiting[host] = rev
        last = sent.get(host)
        if last is not None and last.revision != rev:
            continue  # changed since, so republished, at a time not known: delivered now (next_sent)
        delivered = max(newest, last.at) if last is not None else newest
        resends = last.resends if last is not None else 0
        if seen - delivered >= after_s * 2 ** min(resends, MAX_DOUBLINGS):
            out.due[host] = rev
    return out


def next_sent(sent: Mapping[str, Sent], found: Deliveries, resent: Mapping[str, int], now: float) -> dict[str, Sent]:
    """What the caller remembers after a check: each host of `resent` (those of `due` it
    sent again) delivered now, once more; a waiting host whose record changed since it was
    last remembered, delivered now (the stream republished it); hosts no longer waiting
    forgotten."""
    out: dict[str, Sent] = {}
    for host, rev in found.waiting.items():
        last = sent.get(host)
        if host in resent:
            out[host] = Sent(resent[host], now, (last.resends if last is not None else 0) + 1)
        elif last is not None and last.revision != rev:
            out[host] = Sent(rev, now, last.resends)
        elif last is not None:
            out[host] = last
    return out
