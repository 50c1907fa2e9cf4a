"""Which hosts' assignments must be sent again. Pure code, no I/O.

An agent learns its work from the stream's republish of its `alloc.<host>` record to
`muster.assign.<host>`: core NATS, at most once. It reads the record itself when it
connects or reconnects, but a republish can be lost without the agent noticing: the
NATS node that led the state stream dies between storing and republishing, or the agent
reads the record from a replica that has not caught up and the republish reaches it
while it is still reconnecting. The work would then stay PLACED for good.

The leader knows: a task the agent has not reported running `after_s` after it was
placed, on a host that is heartbeating. `undelivered()` names those hosts with the
revision of the record to send again, and the scheduler publishes the record it holds
to the host's subject (the agent ignores a record it has already applied, so a resend
is harmless). Once per `after_s` per host at most: the caller remembers what it sent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from server.state.cluster import ClusterState
from wire import subjects
from wire.messages import AttemptState


def undelivered(
    state: ClusterState,
    now: float,
    after_s: float,
    healthy: Callable[[str], bool],
    sent: Mapping[str, tuple[int, float]],
) -> dict[str, int]:
    """Host -> revision of its assignment record, for each healthy host with a task
    placed more than `after_s` ago and not yet running, unless that revision was sent
    again less than `after_s` ago (`sent`: host -> (revision, when))."""
    out: dict[str, int] = {}
    for job_id in state.placed_ids:
        job = state.jobs.get(job_id)
        if job is None:
            continue
        for a in job.current_tasks():
            if a.state is not AttemptState.PLACED or now - a.placed_at < after_s:
                continue
            host = a.host_id
            if host in out or not healthy(host):
                continue
            rev = state.revisions.get(subjects.alloc_key(host), 0)
            alloc = state.allocs.get(host)
            if not rev or alloc is None or not any(t.attempt_id == a.id for t in alloc.tasks):
                continue  # its record no longer lists it: nothing to deliver
            last = sent.get(host)
            if last is not None and last[0] == rev and now - last[1] < after_s:
                continue
            out[host] = rev
    return out
