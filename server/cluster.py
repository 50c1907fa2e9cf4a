"""ClusterState: every server's in-memory view of the cluster, fed by KV watches.

It holds the latest heartbeat of each host, every job record, every host
allocation, operator host settings and the token hashes, each with its store
revision. Records older than what is held are ignored, so the leader can apply
its own commits at once and let the watch catch up later.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel

from server import subjects
from server.errors import DecodeError
from server.health import Health, host_health
from server.messages import Heartbeat, HostAlloc, Job, JobState, decode
from server.placement import HostCapacity
from server.store import Record

log = logging.getLogger(__name__)


class HostConfig(BaseModel):
    """Operator settings of a host (`hostcfg.<host>`). A draining host is also cordoned;
    at `drain_deadline` its remaining attempts are stopped and requeued elsewhere."""

    cordoned: bool = False
    draining: bool = False
    drain_deadline: float = 0.0
    reason: str = ""
    by: str = ""
    ts: float = 0.0


class TokenInfo(BaseModel):
    name: str
    role: str = "operator"
    created_at: float = 0.0


@dataclass
class HostEntry:
    host_id: str
    heartbeat: Heartbeat | None
    revision: int
    seen_at: float
    present: bool = True
    lost_at: float | None = None


@dataclass
class ClusterState:
    heartbeat_interval_s: float = 5.0
    hosts: dict[str, HostEntry] = field(default_factory=dict)
    jobs: dict[str, Job] = field(default_factory=dict)
    allocs: dict[str, HostAlloc] = field(default_factory=dict)
    hostcfg: dict[str, HostConfig] = field(default_factory=dict)
    tokens: dict[str, TokenInfo] = field(default_factory=dict)
    revisions: dict[str, int] = field(default_factory=dict)
    term: int = 0
    leader: str = ""
    dropped: Counter[str] = field(default_factory=Counter)
    listeners: list[Callable[[str, object], None]] = field(default_factory=list)

    # ------------------------------------------------------------ feeding

    def _notify(self, kind: str, obj: object) -> None:
        for fn in self.listeners:
            try:
                fn(kind, obj)
            except Exception:  # noqa: BLE001
                log.exception("listener failed on %s", kind)

    def apply_host_record(self, rec: Record, now: float | None = None) -> None:
        now = time.time() if now is None else now
        entry = self.hosts.get(rec.key)
        if entry is not None and rec.revision <= entry.revision:
            return
        if rec.value is None:
            if entry is None:
                self.hosts[rec.key] = HostEntry(rec.key, None, rec.revision, now, False, now)
            else:
                entry.revision = rec.revision
                if entry.present:
                    entry.present = False
                    entry.lost_at = now
                    self._notify("host_lost", entry)
            return
        try:
            hb = decode(Heartbeat, rec.value)
        except DecodeError as exc:
            self.dropped["heartbeat"] += 1
            log.warning("dropped heartbeat for %s: %s", rec.key, exc)
            return
        if hb.host_id != rec.key:
            self.dropped["heartbeat"] += 1
            log.warning("dropped heartbeat: key %s carries host %s", rec.key, hb.host_id)
            return
        was_present = entry.present if entry else False
        before = {u.index for u in entry.heartbeat.gpu_usage if not u.healthy} if entry and entry.heartbeat else set()
        self.hosts[rec.key] = HostEntry(rec.key, hb, rec.revision, now, True, None)
        if not was_present:
            self._notify("host_up", self.hosts[rec.key])
        for u in hb.gpu_usage:
            if not u.healthy and u.index not in before:
                self._notify("gpu_unhealthy", (rec.key, u))

    def apply_state_record(self, rec: Record) -> None:
        key = rec.key
        if rec.revision <= self.revisions.get(key, 0):
            return
        self.revisions[key] = rec.revision
        kind, _, name = key.partition(".")
        try:
            if kind == "job":
                if rec.value is None:
                    self.jobs.pop(name, None)
                    return
                job = decode(Job, rec.value)
                self.jobs[name] = job
                self._notify("job", job)
            elif kind == "alloc":
                if rec.value is None:
                    self.allocs.pop(name, None)
                    return
                self.allocs[name] = decode(HostAlloc, rec.value)
            elif kind == "hostcfg":
                if rec.value is None:
                    self.hostcfg.pop(name, None)
                else:
                    self.hostcfg[name] = decode(HostConfig, rec.value)
                self._notify("hostcfg", name)
            elif kind == "auth" and name.startswith("token."):
                h = name[len("token.") :]
                if rec.value is None:
                    self.tokens.pop(h, None)
                else:
                    self.tokens[h] = decode(TokenInfo, rec.value)
            elif key == "term":
                self.term = rec.revision
            elif key == "lease":
                self.leader = (rec.value or b"").decode(errors="replace")
        except DecodeError as exc:
            self.dropped[kind] += 1
            log.warning("dropped state record %s: %s", key, exc)

    def apply_job(self, job: Job, revision: int) -> None:
        if revision <= self.revisions.get(subjects.job_key(job.id), 0):
            return
        self.revisions[subjects.job_key(job.id)] = revision
        self.jobs[job.id] = job
        self._notify("job", job)

    def apply_alloc(self, alloc: HostAlloc, revision: int) -> None:
        key = subjects.alloc_key(alloc.host_id)
        if revision <= self.revisions.get(key, 0):
            return
        self.revisions[key] = revision
        self.allocs[alloc.host_id] = alloc

    # ------------------------------------------------------------ views

    def health(self, host_id: str, now: float | None = None) -> Health:
        entry = self.hosts.get(host_id)
        if entry is None:
            return Health.LOST
        now = time.time() if now is None else now
        return host_health(
            present=entry.present,
            last_seen=entry.seen_at,
            now=now,
            interval_s=self.heartbeat_interval_s,
        )

    def capacities(self, now: float | None = None) -> dict[str, HostCapacity]:
        """A fresh working copy of every known host's capacity and current usage."""
        now = time.time() if now is None else now
        out: dict[str, HostCapacity] = {}
        for host_id, entry in self.hosts.items():
            hb = entry.heartbeat
            if hb is None:
                continue
            cfg = self.hostcfg.get(host_id)
            unhealthy = frozenset(u.index for u in hb.gpu_usage if not u.healthy)
            cap = HostCapacity(
                id=host_id,
                schedulable=self.health(host_id, now) is Health.HEALTHY,
                cordoned=bool(cfg and (cfg.cordoned or cfg.draining)),
                gpu_models={g.index: g.model for g in hb.gpus},
                unhealthy_gpus=unhealthy,
                cpus=float(hb.cpus),
                memory_mb=hb.memory_mb,
                labels=dict(hb.labels),
            )
            alloc = self.allocs.get(host_id)
            if alloc:
                for t in alloc.tasks:
                    cap.reserve(t.gpu_indices, t.cpus, t.memory_mb)
            out[host_id] = cap
        return out

    def job_counts(self) -> Counter[str]:
        return Counter(j.state.value for j in self.jobs.values())

    def queued(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.state is JobState.QUEUED]
