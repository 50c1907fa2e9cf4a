"""Live feeds behind the GraphQL subscriptions: host health transitions, job record
changes and alerts, fanned out to per-subscriber asyncio queues.

One `Hub` per `Muster`. It hooks `ClusterState.listeners` once and is shared by every
subscriber. Host health is a function of the clock too (HEALTHY -> SUSPECT happens when
heartbeats stop arriving, without any record), so while anyone listens to health one
shared task recomputes every host's health once a second (and at once when a heartbeat
key expires or a host comes back) and queues the transitions. Queues are bounded: a
subscriber that does not keep up loses its oldest items, never the server's memory.
Listeners and tasks are removed when the last subscriber leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import weakref
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from wire import subjects
from wire.errors import DecodeError
from wire.messages import Event, Job, decode

log = logging.getLogger(__name__)

QUEUE_SIZE = 1000
HEALTH_POLL_S = 1.0


@dataclass
class HealthChange:
    host_id: str
    old: str | None
    new: str
    ts: float


@dataclass
class LiveAlert:
    id: str
    kind: str
    ts: float
    host_id: str | None
    job_id: str | None
    message: str


def _put(q: asyncio.Queue[Any], item: Any) -> None:
    """Queue without blocking; drop the oldest item when the subscriber lags."""
    while True:
        try:
            q.put_nowait(item)
            return
        except asyncio.QueueFull:
            with contextlib.suppress(asyncio.QueueEmpty):
                q.get_nowait()


class Hub:
    def __init__(self, muster: Any) -> None:
        self.muster = muster
        self.health_subs: set[asyncio.Queue[HealthChange]] = set()
        self.job_subs: dict[asyncio.Queue[Job], str | None] = {}
        self._hooked = False
        self._health_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._known: dict[str, str] = {}

    # ------------------------------------------------------------ listener

    def _hook(self) -> None:
        if not self._hooked:
            self.muster.state.listeners.append(self._on_state)
            self._hooked = True

    def _maybe_unhook(self) -> None:
        if self._hooked and not self.health_subs and not self.job_subs:
            with contextlib.suppress(ValueError):
                self.muster.state.listeners.remove(self._on_state)
            self._hooked = False

    def _on_state(self, kind: str, obj: object) -> None:
        if kind == "job" and self.job_subs:
            assert isinstance(obj, Job)
            for q, want in self.job_subs.items():
                if want is None or want == obj.id:
                    _put(q, obj)
        elif kind in ("host_lost", "host_up") and self.health_subs:
            self._wake.set()

    # ------------------------------------------------------------ health

    def _snapshot(self, now: float) -> dict[str, str]:
        st = self.muster.state
        return {h: st.health(h, now).value for h, e in st.hosts.items() if e.heartbeat is not None}

    async def _health_loop(self) -> None:
        self._known = self._snapshot(time.time())
        while self.health_subs:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=HEALTH_POLL_S)
            self._wake.clear()
            now = time.time()
            current = self._snapshot(now)
            known = self._known
            for h, new in current.items():
                old = known.get(h)
                if old != new:
                    change = HealthChange(h, old, new, now)
                    for q in self.health_subs:
                        _put(q, change)
            self._known = current

    async def host_health(self) -> AsyncGenerator[HealthChange, None]:
        q: asyncio.Queue[HealthChange] = asyncio.Queue(QUEUE_SIZE)
        self.health_subs.add(q)
        self._hook()
        if self._health_task is None or self._health_task.done():
            self._health_task = asyncio.create_task(self._health_loop(), name="graphql-host-health")
        try:
            while True:
                yield await q.get()
        finally:
            self.health_subs.discard(q)
            if not self.health_subs and self._health_task is not None:
                self._health_task.cancel()
                self._health_task = None
            self._maybe_unhook()

    # ------------------------------------------------------------ jobs

    async def job_updates(self, job_id: str | None) -> AsyncGenerator[Job, None]:
        q: asyncio.Queue[Job] = asyncio.Queue(QUEUE_SIZE)
        self.job_subs[q] = job_id
        self._hook()
        try:
            while True:
                yield await q.get()
        finally:
            self.job_subs.pop(q, None)
            self._maybe_unhook()

    # ------------------------------------------------------------ alerts

    async def alerts(self, kind: str | None = None) -> AsyncGenerator[LiveAlert, None]:
        """Alerts as they are published on `alerts.>` (core NATS, one subscription per
        subscriber, removed when it leaves)."""
        nc = self.muster.nc
        if nc is None:
            raise RuntimeError("not connected to NATS")
        q: asyncio.Queue[LiveAlert] = asyncio.Queue(QUEUE_SIZE)
        prefix = subjects.ALERTS_PREFIX + "."

        async def on_msg(msg: Any) -> None:
            try:
                ev = decode(Event, msg.data)
            except DecodeError:
                log.warning("dropped malformed alert on %s", msg.subject)
                return
            digest = hashlib.sha256(msg.subject.encode() + b"\0" + msg.data).hexdigest()[:20]
            _put(q, LiveAlert(id=f"live:{digest}", kind=msg.subject.removeprefix(prefix), ts=ev.ts,
                              host_id=ev.host_id, job_id=ev.job_id, message=ev.message))

        subject = f"{prefix}{kind}" if kind else f"{prefix}>"
        sub = await nc.subscribe(subject, cb=on_msg)
        try:
            while True:
                yield await q.get()
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


_hubs: weakref.WeakKeyDictionary[Any, Hub] = weakref.WeakKeyDictionary()


def hub_for(muster: Any) -> Hub:
    hub = _hubs.get(muster)
    if hub is None:
        hub = _hubs[muster] = Hub(muster)
    return hub
