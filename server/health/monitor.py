"""The leader's watch over host health: turns heartbeat changes into recorded
transitions (events) and alerts. Decisions come from `health.host_health` and
`health.transitions`, applied by `healthindex.HealthIndex`; this module only publishes.

Subjects (JSON payloads are `messages.Event`):
  muster.events.host.<HEALTHY|SUSPECT|LOST>   every health transition (kept in EVENTS)
  alerts.host.lost / alerts.host.recovered     a host's heartbeat key expired / it came back
  alerts.host.fenced                           a host's agent fenced itself and is heard again
  alerts.host.rollup                           a host's heartbeat purged every other host's (Nats-Rollup: all)
  alerts.host.labels_disputed                  a host's agent reports a label key only operators set, another value
  alerts.gpu.unhealthy                         a GPU reported an Xid or uncorrectable ECC error (its work is moved)
  alerts.domain.disrupted                      (from the scheduler) a suspected partition
  alerts.job.failed                            (from the scheduler) a job failed for good
  alerts.job.gpus_idle                         (from the scheduler) a running job's GPUs all idle for long
  alerts.history.behind / history.recovered    (from the writing historian) history unwritten for long / written again
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping

from nats.aio.client import Client as NATS

from server import metrics
from server.health.alertsummary import ALERTS_ONE_BY_ONE, summarized, summary
from server.health.rules import Health
from server.scheduling.hostlabels import Dispute
from server.state.cluster import ClusterState
from server.state.lease import Leader
from wire import subjects
from wire.messages import Event, GpuUsage, Heartbeat, encode

log = logging.getLogger(__name__)

# Host transitions a replica saw while following, this recent (and at least three lease
# TTLs), are still published and alerted when it takes the lead: the old leader may have
# been gone for them (it is lost a lease's TTL before a follower takes over), and without
# them a host lost or back in that gap had no event and no alert (found by exploring).
# One the old leader had alerted just before it stopped is alerted again.
TAKEOVER_WINDOW_S = 15.0
# A host whose heartbeats purge the bucket again and again is alerted once this long.
ROLLUP_REALERT_S = 60.0


async def publish_alert(nc: NATS, kind: str, ev: Event) -> None:
    ev.kind = kind
    try:
        await nc.publish(f"{subjects.ALERTS_PREFIX}.{kind}", encode(ev))
    except Exception as exc:  # noqa: BLE001 - alerts are best effort; the log keeps them
        log.warning("alert %s not published: %s", kind, exc)


def job_failed_alerts(failed: list[Event], queues: dict[str, str], now: float) -> list[Event]:
    """Jobs a cycle failed for good: one alert a job, or one for them all with how many
    of each queue (`queues`: job id -> its queue)."""
    by_queue: dict[str, int] = {}
    for e in failed:
        q = queues.get(e.job_id or "", "?")
        by_queue[q] = by_queue.get(q, 0) + 1
    return summarized(failed, now, f"{len(failed)} jobs failed for good", {"by_queue": by_queue}, of="job")


def _by_label(events: list[Event], label: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in events:
        labels = e.data.get("labels")
        value = labels.get(label) if isinstance(labels, dict) else None
        if isinstance(value, str):
            counts[value] = counts.get(value, 0) + 1
    return counts


def host_alerts(events: list[Event], now: float, what: str) -> list[Event]:
    """Hosts lost (or recovered) in one check, each with its labels: one alert a host, or
    one for them all with how many there are in each rack and zone."""
    return summarized(events, now, f"{len(events)} hosts {what}",
                      {"by_rack": _by_label(events, "rack"), "by_zone": _by_label(events, "zone")})


def gpu_alert(host_id: str, usage: GpuUsage, now: float) -> Event:
    return Event(kind=subjects.ALERT_GPU_UNHEALTHY, ts=now, host_id=host_id,
                 message=(f"GPU {usage.index} on {host_id} faulted: {usage.fault or 'unhealthy'}; it takes no new "
                          f"work, and what ran on it is stopped and tried again elsewhere"),
                 data={"gpu": usage.index, "fault": usage.fault or ""})


def gpu_alerts(faulted: list[tuple[str, GpuUsage]], now: float) -> list[Event]:
    """GPUs faulted in one check: one alert a GPU, or one for them all with how many of
    each kind of fault (its text up to the first colon: "xid 79", ...)."""
    kinds: dict[str, int] = {}
    for _, u in faulted:
        k = (u.fault or "unhealthy").split(":")[0]
        kinds[k] = kinds.get(k, 0) + 1
    hosts = len({h for h, _ in faulted})
    return summarized([gpu_alert(h, u, now) for h, u in faulted], now,
                      f"{len(faulted)} GPUs on {hosts} hosts faulted ("
                      + ", ".join(f"{k}: {n}" for k, n in sorted(kinds.items())) + ")",
                      {"gpus": len(faulted), "faults": kinds})


# A host's labels as placement reads them (ClusterState.labels_of), for alerts' data.
LabelsOf = Callable[[str], Mapping[str, str]]


def _reported(hb: Heartbeat) -> LabelsOf:
    return lambda _host: hb.labels


def pressure_alerts(pressed: list[tuple[str, Heartbeat]], now: float, labels_of: LabelsOf | None = None) -> list[Event]:
    """Hosts whose agents began to ask for no new work (or for another reason) since the
    last check: one alert a host, or one for them all past ALERTS_ONE_BY_ONE."""
    events = [Event(kind=subjects.ALERT_HOST_PRESSURE, ts=now, host_id=h,
                    message=f"host {h} takes no new work: {hb.pressure}",
                    data={"labels": dict((labels_of or _reported(hb))(h)), "pressure": hb.pressure})
              for h, hb in pressed]
    return summarized(events, now, f"{len(events)} hosts take no new work", {"by_rack": _by_label(events, "rack")})


def rollup_alert(host_id: str, stamp: float, now: float) -> Event:
    """The alert for a heartbeat of `host_id` published with `Nats-Rollup: all` (stored at
    `stamp`), which removed every other host's heartbeat from the bucket."""
    return Event(kind=subjects.ALERT_HOST_ROLLUP, ts=now, host_id=host_id,
                 message=(f"host {host_id}'s heartbeat was published with Nats-Rollup: all, which removed every other "
                          f"host's heartbeat: no agent sends that, so {host_id}'s NATS credentials are being misused "
                          f"(revoke them: muster creds revoke-agent {host_id}). Hosts whose agents do not heartbeat "
                          f"again are taken as LOST a TTL and an interval after their last heartbeat"),
                 data={"stored_at": stamp})


def labels_disputed_alerts(disputed: list[tuple[str, tuple[Dispute, ...]]], now: float) -> list[Event]:
    """Hosts whose agents newly report label keys only operators set with another value
    than the operator's (scheduling.hostlabels: ignored): one alert a host, or one for them
    all with how many hosts each key was disputed on."""
    events = []
    keys: dict[str, int] = {}
    for h, found in disputed:
        for d in found:
            keys[d.key] = keys.get(d.key, 0) + 1
        events.append(Event(
            kind=subjects.ALERT_HOST_LABELS_DISPUTED, ts=now, host_id=h,
            message=(f"host {h}'s agent reports {', '.join(d.text() for d in found)}: label keys only operators set, "
                     f"so ignored. If the host should have them, set them (muster host label {h} KEY=VALUE); else "
                     "its agent's --labels are wrong, or its NATS credentials are misused"),
            data={"disputes": [{"key": d.key, "agent": d.agent, "operator": d.operator} for d in found]}))
    return summarized(events, now, f"{len(events)} hosts' agents report label keys only operators set, with "
                      "values not the operator's (ignored)", {"by_key": keys})


def _fence_counts(hb: Heartbeat, before: Heartbeat) -> tuple[int, int, int]:
    """(fences, frozen attempts continued, stopped) that `hb` reports beyond `before` (the
    agent's counters only grow, and move together when a fence ends)."""
    return (hb.fences - before.fences, max(0, hb.fence_continued - before.fence_continued),
            max(0, hb.fence_stopped - before.fence_stopped))


def fence_alert(host_id: str, hb: Heartbeat, before: Heartbeat, now: float,
                labels_of: LabelsOf | None = None) -> Event:
    """The alert for fences a host's heartbeat `hb` reports beyond those of the heartbeat
    read `before`."""
    n, continued, stopped = _fence_counts(hb, before)
    what = f"{n} fences" if n > 1 else "fenced"
    return Event(
        kind=subjects.ALERT_HOST_FENCED, ts=now, host_id=host_id,
        message=(f"host {host_id}: {what} (no heartbeat stored for its fence delay), the last for "
                 f"{hb.last_fence_s:.1f} s; {continued} frozen attempts continued, {stopped} stopped"),
        data={"labels": dict((labels_of or _reported(hb))(host_id)), "fences": n, "last_fence_s": hb.last_fence_s,
              "continued": continued, "stopped": stopped})


def fences_alert(fenced: list[tuple[str, Heartbeat, Heartbeat]], now: float,
                 labels_of: LabelsOf | None = None) -> Event:
    """One alert for many hosts' fences noticed together: how many hosts, what their
    fences did in all, the longest, and the first hosts by name."""
    each = [_fence_counts(hb, before) for _, hb, before in fenced]
    continued = sum(c for _, c, _ in each)
    stopped = sum(x for _, _, x in each)
    longest = max(hb.last_fence_s for _, hb, _ in fenced)
    return summary([fence_alert(h, hb, before, now, labels_of) for h, hb, before in fenced], now,
                   f"{len(fenced)} hosts fenced (no heartbeat stored for their fence delay), the longest for "
                   f"{longest:.1f} s; {continued} frozen attempts continued, {stopped} stopped",
                   {"fences": sum(n for n, _, _ in each), "last_fence_s": longest, "continued": continued,
                    "stopped": stopped})


def fence_alerts(fenced: list[tuple[str, Heartbeat, Heartbeat]], now: float,
                 labels_of: LabelsOf | None = None) -> list[Event]:
    """The alerts for the fences noticed since the last check: one a host, or one for
    them all past ALERTS_ONE_BY_ONE."""
    if len(fenced) > ALERTS_ONE_BY_ONE:
        return [fences_alert(fenced, now, labels_of)]
    return [fence_alert(host_id, hb, before, now, labels_of) for host_id, hb, before in fenced]


class HealthMonitor:
    def __init__(self, nc: NATS, state: ClusterState, leadership: Leader, every_s: float = 1.0) -> None:
        self.nc = nc
        self.state = state
        self.leadership = leadership
        self.every_s = every_s
        self._term = 0
        self.wake = asyncio.Event()
        self._gpu_alerts: list[tuple[str, GpuUsage]] = []
        self._fence_alerts: list[tuple[str, Heartbeat, Heartbeat]] = []
        self._pressure_alerts: list[tuple[str, Heartbeat]] = []
        self._rollup_alerts: list[tuple[str, float]] = []
        self._rollup_alerted: dict[str, float] = {}  # host -> when its last host.rollup was published
        self._disputes: list[tuple[str, tuple[Dispute, ...]]] = []
        # While following: (when, host, from, to) of the transitions seen, the last
        # TAKEOVER_WINDOW_S of them.
        self._following: deque[tuple[float, str, Health, Health]] = deque()
        state.listeners.append(self._on_state)

    def _on_state(self, kind: str, obj: object) -> None:
        if kind in ("host_lost", "host_up"):
            self.wake.set()
        elif kind == "gpu_unhealthy":
            self._gpu_alerts.append(obj)  # type: ignore[arg-type]
            self.wake.set()
        elif kind == "host_fenced":  # alerted at the next check (within every_s), with the others then
            self._fence_alerts.append(obj)  # type: ignore[arg-type]
        elif kind == "host_pressure":
            self._pressure_alerts.append(obj)  # type: ignore[arg-type]
        elif kind == "host_rollup":
            self._rollup_alerts.append(obj)  # type: ignore[arg-type]
            self.wake.set()
        elif kind == "host_labels_disputed":  # alerted at the next check
            self._disputes.append(obj)  # type: ignore[arg-type]

    async def check(self) -> None:
        now = time.time()
        # Only the hosts touched since the last check, or whose last heartbeat has just
        # grown too old, are looked at (server.health.index).
        changes = self.state.refresh_health(now).take_changes()
        following = self._following
        if not self.leadership.leading:
            self._gpu_alerts.clear()
            self._fence_alerts.clear()
            self._pressure_alerts.clear()
            self._rollup_alerts.clear()
            self._disputes.clear()
            following.extend((now, h, frm, to) for h, frm, to in changes if frm is not None)
            while following and now - following[0][0] > self._takeover_window_s():
                following.popleft()
            return
        if self._term != self.leadership.term:
            # A new term: the present is taken as known, not announced again, but for the
            # transitions of the last TAKEOVER_WINDOW_S, in their order.
            self._term = self.leadership.term
            recent = [(h, frm, to) for t, h, frm, to in following if now - t <= self._takeover_window_s()]
            following.clear()
            changes = [*recent, *changes]
        lost: list[Event] = []
        recovered: list[Event] = []
        for host_id, old, new in changes:
            if old is None and new is Health.HEALTHY:
                continue  # a host seen for the first time is not a transition
            entry = self.state.hosts.get(host_id)
            ev = Event(kind=f"host.{new.value.lower()}", ts=now, host_id=host_id,
                       message=f"{host_id}: {old.value if old else 'NEW'} -> {new.value}",
                       data={"from": old.value if old else None, "to": new.value,
                             "labels": dict(self.state.labels_of(host_id))})
            try:
                await self.nc.publish(f"{subjects.EVENTS_PREFIX}.host.{new.value}", encode(ev))
            except Exception as exc:  # noqa: BLE001
                log.warning("host event not published: %s", exc)
            if new is Health.LOST:
                lost.append(self._host_alert(host_id, now, "heartbeat key expired" if entry is None
                                             or not entry.lost_unmarked else
                                             "no heartbeat for its key's TTL, and its key gone without an expiry "
                                             "marker (the hosts bucket purged): taken as expired"))
            elif old is Health.LOST and new is Health.HEALTHY:
                recovered.append(self._host_alert(host_id, now, "heartbeats resumed"))
        for ev in host_alerts(lost, now, "lost (heartbeat keys expired)"):
            await publish_alert(self.nc, subjects.ALERT_HOST_LOST, ev)
        for ev in host_alerts(recovered, now, "recovered (heartbeats resumed)"):
            await publish_alert(self.nc, subjects.ALERT_HOST_RECOVERED, ev)
        faulted, self._gpu_alerts = self._gpu_alerts, []
        for ev in gpu_alerts(faulted, now):
            await publish_alert(self.nc, subjects.ALERT_GPU_UNHEALTHY, ev)
        fenced, self._fence_alerts = self._fence_alerts, []
        for _, hb, before in fenced:
            n, continued, stopped = _fence_counts(hb, before)
            metrics.HOST_FENCES.inc(n)
            metrics.FENCED_ATTEMPTS.labels(outcome="continued").inc(continued)
            metrics.FENCED_ATTEMPTS.labels(outcome="stopped").inc(stopped)
        for ev in fence_alerts(fenced, now, self.state.labels_of):
            await publish_alert(self.nc, subjects.ALERT_HOST_FENCED, ev)
        pressed, self._pressure_alerts = self._pressure_alerts, []
        for ev in pressure_alerts(pressed, now, self.state.labels_of):
            await publish_alert(self.nc, subjects.ALERT_HOST_PRESSURE, ev)
        rolled, self._rollup_alerts = self._rollup_alerts, []
        for host_id, stamp in dict(reversed(rolled)).items():  # (each host once, its first)
            if now - self._rollup_alerted.get(host_id, float("-inf")) >= ROLLUP_REALERT_S:
                self._rollup_alerted[host_id] = now
                await publish_alert(self.nc, subjects.ALERT_HOST_ROLLUP, rollup_alert(host_id, stamp, now))
        disputed, self._disputes = self._disputes, []
        # (each host once, as it stands now: a dispute settled since the notice is not alerted)
        current = [(h, self.state.label_disputes[h]) for h in dict.fromkeys(h for h, _ in disputed)
                   if h in self.state.label_disputes]
        for ev in labels_disputed_alerts(current, now):
            await publish_alert(self.nc, subjects.ALERT_HOST_LABELS_DISPUTED, ev)

    def _takeover_window_s(self) -> float:
        config = getattr(self.leadership, "config", None)
        return max(TAKEOVER_WINDOW_S, 3 * config.ttl_s) if config is not None else TAKEOVER_WINDOW_S

    def _host_alert(self, host_id: str, now: float, why: str) -> Event:
        return Event(kind="", ts=now, host_id=host_id, message=f"host {host_id}: {why}",
                     data={"labels": dict(self.state.labels_of(host_id))})

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=self.every_s)
            except TimeoutError:
                pass
            self.wake.clear()
            try:
                await self.check()
            except Exception:  # noqa: BLE001
                log.exception("health check failed")
