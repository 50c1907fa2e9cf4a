"""Many simulated Muster hosts in one process, speaking the agent's wire protocol.

One NATS connection per process. Each host:
  * heartbeats: a `Heartbeat` JSON published (core publish, no ack) to `$KV.hosts.<id>` with
    `Nats-TTL: 15s` and `Muster-Shape`; the process spreads its hosts' heartbeats evenly
    over the interval, and writes each batch of them as HPUB frames built once per host
    but for the body (the bytes nats-py's publish would send);
  * assignments: a core subscription per host on `muster.assign.<id>` (the stream's
    republish of `alloc.<id>`); records older than the last applied `Nats-Sequence` or
    stamped with an older term are ignored; a task never seen on the host starts (once), a
    running task that disappears or carries `stop: true` is killed;
  * tasks: `sleep <seconds>` is simulated with a timer, no process;
  * self-fencing, as an agent fences itself (agent.agent): once a second one heartbeat goes
    through JetStream with an acknowledgement instead (after a heartbeat from each fenced
    host: an agent tries again every second). Two such probes acknowledged one
    after the other, on one connection without a reconnection between them, vouch for
    every heartbeat the process sent between them (the server takes a connection's
    messages in order, and a stream that had lost its leader in between would have failed
    the second probe); heartbeats sent around a failed probe are vouched for by nothing. So
    each host knows when its key was last known stored. A host whose key was not stored
    for the agent's `fence_after_s` freezes its tasks (their timers stop) and starts none;
    stored again before the key could have expired (`agent.agent.fence_timing`'s
    deadline), it continues them; not stored by the fence's SIGTERM moment, or stored only
    after the deadline, it stops them (KILLED, "fenced"), before the key expires and the
    control plane replaces them;
  * status: `StatusReport` JSON via JetStream publish to `muster.status.<id>` with
    `Nats-Msg-Id: <attempt>:<STATE>`, every report retried until the stream acknowledges
    it. Reports are sent in batches by one task (`Outbox`), up to `--max-inflight`
    unacknowledged, with acknowledgements on one wildcard inbox: what nats-py's
    `publish_async` does, without a task, a future and two semaphores per report
    (asyncio's Semaphore looks at every waiter on each acquire; with thousands of
    reports in flight that and the per-report tasks were a fifth of this process).

Like the server (server.memory), it freezes what survives once its hosts are up and
every 2 s after, so the collector's full passes over ~17,000 hosts and their
subscriptions do not stop it; it reports its longest collection since then
(`gc_pause_max_ms`) with its loop lag.

It records when each attempt first arrived on each host (wall clock) with its task index
(`MUSTER_GANG_TASK` in the task's env for a gang's task, else 0), publishes live
counters on `bench.stats.<idx>` once a second, obeys `bench.ctl.<idx>` requests
(`silence` a host's heartbeats, `finish`) and writes its results to `--out` on finish.

    python -m bench.simhosts --nats URL --fleet fleet.json --start 0 --end 20000 --idx 0 --out sim0.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import nats
from agent.agent import FENCED_REASON, AgentConfig, fence_timing
from bench.preload import is_preloaded_attempt
from bench.workload import HostSpec, heartbeat_static, read_fleet
from server.memory import freeze_survivors, keep_frozen, on_collection
from wire import natsclient
from wire.messages import SHAPE_HEADER, Heartbeat, shape_digest
from wire.stopping import pause

log = logging.getLogger("bench.simhosts")

ASSIGN_PREFIX = "muster.assign."
TERMINAL = ("SUCCEEDED", "FAILED", "KILLED", "LOST")


def task_index(t: dict) -> int:
    """A task's index within its gang (the agent's MUSTER_GANG_TASK); 0 for a single job."""
    try:
        return int((t.get("env") or {}).get("MUSTER_GANG_TASK", 0))
    except (TypeError, ValueError):
        return -1  # reported as an unknown task index


def hold(h: SimHost, t: dict) -> bool:
    """Take what an assigned task holds on its host: False when that overcommits a GPU
    (held whole while anything holds it, shared past 1000 thousandths) or a MIG instance."""
    ok = True
    share = int(t.get("gpu_share") or 0)
    for i in t.get("gpu_indices") or ():
        used = h.gpu_milli.get(i, 0)
        if (used and not share) or used + (share or 1000) > 1000:
            ok = False
        h.gpu_milli[i] = used + (share or 1000)
    for u in t.get("mig") or ():
        ok = ok and u not in h.busy_mig
        h.busy_mig.add(u)
    return ok


def unhold(h: SimHost, t: dict) -> None:
    share = int(t.get("gpu_share") or 0)
    for i in t.get("gpu_indices") or ():
        left = h.gpu_milli.get(i, 0) - (share or 1000)
        if left > 0:
            h.gpu_milli[i] = left
        else:
            h.gpu_milli.pop(i, None)
    h.busy_mig.difference_update(t.get("mig") or ())


TERM_KEY = '"term":'  # what every heartbeat tail ends with (SimHost.set_tail)


class SimHost:
    __slots__ = ("spec", "hb_head", "hb_tail", "seq", "applied_seq", "max_term", "running", "seen",
                 "gpu_milli", "busy_mig", "heartbeating", "last_hb", "prev_hb", "subject", "_shape", "ttl",
                 "frame_head", "stored", "fenced", "frozen", "fenced_from", "tail_base", "fenced_at",
                 "fence_counts", "fence_stopping")

    def __init__(self, spec: HostSpec, boot_id: str, ttl: str = "15s") -> None:
        self.spec = spec
        static = json.dumps(heartbeat_static(spec), separators=(",", ":"))[1:-1]
        self.hb_head = f'{{"v":1,"host_id":"{spec.id}","boot_id":"{boot_id}","seq":'.encode()
        self.seq = 0
        self.applied_seq = 0
        self.max_term = 0
        self.running: dict[str, tuple[asyncio.TimerHandle, dict]] = {}
        self.seen: set[str] = set()
        # Thousandths of each GPU its running tasks hold (1000 for a GPU held whole), and
        # the MIG instances they run on: what the simulator checks placements against.
        self.gpu_milli: dict[int, int] = {}
        self.busy_mig: set[str] = set()
        self.heartbeating = True
        self.last_hb = 0.0
        self.prev_hb = 0.0  # the heartbeat before the last (wall time): Simulator.fence_loop
        # Self-fencing (Simulator.fence_loop, which sets it when it starts): when its key
        # was last known stored (wall time), and whether it is fenced now.
        self.stored = 0.0
        self.fenced = False
        # While fenced: the frozen tasks' seconds left to run, and `stored` at the fence.
        self.frozen: dict[str, float] = {}
        self.fenced_from = 0.0
        # The heartbeat's fence counters, as an agent's (agent.agent): fences ended, the
        # last one's length, frozen tasks continued and stopped; and this fence's start
        # (wall time) and the tasks it stopped so far (counted in when it ends).
        self.fence_counts = (0, 0.0, 0, 0)
        self.fenced_at = 0.0
        self.fence_stopping = 0
        self.subject = f"$KV.hosts.{spec.id}"
        self.ttl = ttl
        # ("HPUB <subject>  <header length> " (no reply subject), header block): the
        # heartbeat's frame but for its length and body, built once per shape (nats-py's
        # publish builds and checks the header block for every message).
        self.frame_head: tuple[bytes, bytes] | None = None
        self.set_tail(f',{static},"cpu_pct":1.0,"mem_used_mb":1024,"simulated":true,'
                      f'"agent_version":"bench-sim","term":'.encode())

    def set_tail(self, tail: bytes) -> None:
        """What the heartbeat carries between its timestamp and its term (inventory and
        usage; the fence counters are added to it), and with it the shape header a real
        agent sends for that (wire.messages.shape_digest)."""
        self.tail_base = tail
        fences, last_s, continued, stopped = self.fence_counts
        if fences:
            tail = (f'{tail.decode()[:-len(TERM_KEY)]}"fences":{fences},"last_fence_s":{last_s:.3f},'
                    f'"fence_continued":{continued},"fence_stopped":{stopped},{TERM_KEY}').encode()
        self.hb_tail = tail
        sample = b"".join((self.hb_head, b"0", b',"ts":0.0', tail, b"0}"))
        self.shape = shape_digest(Heartbeat.model_validate_json(sample))

    @property
    def shape(self) -> str:
        return self._shape

    @shape.setter
    def shape(self, value: str) -> None:
        self._shape = value
        self.frame_head = None  # its header block carries the shape

    def heartbeat(self, now: float) -> bytes:
        self.seq += 1
        return b"".join((self.hb_head, str(self.seq).encode(), b',"ts":', repr(now).encode(), self.hb_tail,
                         str(self.max_term).encode(), b"}"))

    def heartbeat_frame(self, now: float) -> bytes:
        """The heartbeat as the HPUB protocol frame nats-py's publish would send (no reply)."""
        if self.frame_head is None:
            headers = f"NATS/1.0\r\nNats-TTL: {self.ttl}\r\n{SHAPE_HEADER}: {self.shape}\r\n\r\n".encode()
            self.frame_head = (f"HPUB {self.subject}  {len(headers)} ".encode(), headers)
        hpub, headers = self.frame_head
        body = self.heartbeat(now)
        return b"".join((hpub, str(len(headers) + len(body)).encode(), b"\r\n", headers, body, b"\r\n"))


class Outbox:
    """Status reports on their way to the STATUS stream: sent in batches, each retried
    until the stream acknowledges it (reports are idempotent by `Nats-Msg-Id`)."""

    RETRY_S = 5.0  # resend what has not been acknowledged after this long

    def __init__(self, nc, inbox: str, max_inflight: int, counters: dict[str, int],
                 on_stored: Callable[[str], None] | None = None) -> None:
        self.nc = nc
        self.on_stored = on_stored  # called with a report's msg id once the stream has it
        self.inbox = inbox
        self.max_inflight = max_inflight
        self.c = counters
        self.queue: deque[tuple[str, bytes, str]] = deque()  # (subject, body, msg id)
        self.unacked: dict[str, tuple[str, bytes, str, float]] = {}  # token -> report, sent at
        self.wake = asyncio.Event()
        self.next_token = 0

    def __len__(self) -> int:
        return len(self.queue) + len(self.unacked)

    def put(self, subject: str, body: bytes, msg_id: str) -> None:
        self.queue.append((subject, body, msg_id))
        self.wake.set()

    async def on_ack(self, msg) -> None:
        entry = self.unacked.pop(msg.subject[len(self.inbox) + 1:], None)
        if entry is None:
            return  # a late answer to a report sent again since
        if not msg.data or b'"error"' in msg.data:  # no responders, or the stream refused
            self.c["report_retries"] += 1
            asyncio.get_running_loop().call_later(0.5, self.put, *entry[:3])
            return
        self.c["reports_acked"] += 1
        if self.on_stored is not None:
            self.on_stored(entry[2])
        self.wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        await self.nc.subscribe(self.inbox + ".*", cb=self.on_ack, pending_msgs_limit=1_000_000,
                                pending_bytes_limit=256 * 1024 * 1024)
        last_check = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            while self.queue and len(self.unacked) < self.max_inflight:
                subject, body, msg_id = self.queue.popleft()
                self.next_token += 1
                token = str(self.next_token)
                self.unacked[token] = (subject, body, msg_id, now)
                try:
                    await self.nc.publish(subject, body, reply=f"{self.inbox}.{token}",
                                          headers={"Nats-Msg-Id": msg_id})
                except Exception as exc:  # noqa: BLE001 - e.g. closed while reconnecting: resent after RETRY_S
                    self.c["errors"] += 1
                    log.debug("report %s: %s", msg_id, exc)
                    break
            if now - last_check >= 1.0:
                last_check = now
                late = [t for t, e in self.unacked.items() if now - e[3] > self.RETRY_S]
                for token in late:
                    subject, body, msg_id, _ = self.unacked.pop(token)
                    self.c["report_retries"] += 1
                    self.queue.append((subject, body, msg_id))
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=0.5)
            except TimeoutError:
                pass
            await asyncio.sleep(0.005)  # gather what else wants to go into the next batch


class Simulator:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        fleet = read_fleet(Path(args.fleet))[args.start:args.end]
        boot = os.urandom(8).hex()
        ttl = f"{int(args.heartbeat_interval * 3)}s"
        self.hosts = [SimHost(h, boot, ttl) for h in fleet]
        self.by_id = {h.spec.id: h for h in self.hosts}
        self.nc: nats.NATS | None = None
        self.stop = asyncio.Event()
        self.outbox: Outbox | None = None
        # results
        self.arrivals: list[tuple[str, str, str, float, int]] = []  # job, attempt, host, wall time, task
        self.new_arrivals: list[tuple[str, int, float]] = []  # job, task, wall time
        self.c = dict(hb_sent=0, assign_msgs=0, assign_stale=0, assign_dropped=0, started=0, finished=0,
                      killed=0, adopted=0, reports_acked=0, report_retries=0, gpu_collisions=0, slow_consumer=0,
                      errors=0, fences=0, fenced_kills=0, fenced_thawed=0, acked_hb_failures=0,
                      assign_while_fenced=0)
        # When each attempt was stopped by its host's fence (wall time).
        self.fenced_attempts: dict[str, float] = {}
        self.fenced_hosts: set[SimHost] = set()  # the hosts fenced now (fence_loop)
        # How each attempt ended on its host: [state, when, when the stream stored the
        # report (None: not yet)], wall times; it explains a retry the verdict rejects.
        self.host_ends: dict[str, list] = {}
        self.max_running = 0
        self.running = 0
        self.loop_lag_max = 0.0
        self.gc_pause_max = 0.0  # the longest garbage collection (seconds), any generation, once ready
        self.gc_full_pauses = 0  # full (generation 2) collections
        self.ready = False
        on_collection(self._on_gc)

    def _on_gc(self, took: float, info: dict) -> None:
        if not self.ready:
            return  # counted from when the hosts are up, like the loop lag
        self.gc_pause_max = max(self.gc_pause_max, took)
        if info.get("generation") == 2:
            self.gc_full_pauses += 1

    # ------------------------------------------------------------ heartbeats

    async def heartbeat_loop(self) -> None:
        assert self.nc is not None
        n = len(self.hosts)
        if n == 0:
            return
        interval = self.args.heartbeat_interval
        start = time.monotonic()
        k = 0
        nc = self.nc
        while not self.stop.is_set():
            due = int((time.monotonic() - start) / interval * n) + 1
            now = time.time()
            frames = []
            while k < due:
                h = self.hosts[k % n]
                k += 1
                if h.heartbeating:
                    frames.append(h.heartbeat_frame(now))
                    h.prev_hb, h.last_hb = h.last_hb, now
            if frames and not nc.is_closed:
                # The due heartbeats as one write into nats-py's outgoing buffer: the same
                # frames its publish() sends, without building each header block again
                # (a fifth of this process). nats-py is pinned (pyproject.toml); while
                # reconnecting the buffer holds them, as it would published ones.
                await nc._send_command(b"".join(frames))
                if nc._flush_queue is not None and nc._flush_queue.empty():
                    await nc._flush_pending()
                self.c["hb_sent"] += len(frames)
            await asyncio.sleep(0.02)

    # ------------------------------------------------------------ assignments

    async def on_assign(self, msg) -> None:
        t_arr = time.time()
        self.c["assign_msgs"] += 1
        h = self.by_id.get(msg.subject[len(ASSIGN_PREFIX):])
        if h is None or not h.heartbeating:
            return  # unknown, or a silenced (dead) host
        seq = int((msg.headers or {}).get("Nats-Sequence", "0") or 0)
        if seq and seq <= h.applied_seq:
            self.c["assign_stale"] += 1
            return
        try:
            d = json.loads(msg.data)
            tasks = d["tasks"]
            term = int(d.get("term", 0))
        except (ValueError, KeyError, TypeError):
            self.c["assign_dropped"] += 1
            return
        if d.get("host_id") != h.spec.id or term < h.max_term:
            self.c["assign_dropped"] += 1
            return
        h.max_term = max(h.max_term, term)
        wanted = {t["attempt_id"]: t for t in tasks}
        for aid in list(h.running):
            t = wanted.get(aid)
            if t is None or t.get("stop"):
                self.kill(h, aid, "cancelled" if t is not None else "no longer assigned")
        if h.fenced:
            # As an agent: nothing starts while cut off, and the record is not taken as
            # applied, so the leader's resend of it starts its tasks once heard again.
            self.c["assign_while_fenced"] += 1
            return
        h.applied_seq = max(h.applied_seq, seq)
        for t in tasks:
            aid = t["attempt_id"]
            if aid in h.seen:
                continue
            h.seen.add(aid)
            if is_preloaded_attempt(aid):
                self.c["adopted"] += 1  # already running before the run began (--preload)
                continue
            task = task_index(t)
            self.arrivals.append((t["job_id"], aid, h.spec.id, t_arr, task))
            self.new_arrivals.append((t["job_id"], task, t_arr))
            if t.get("stop"):
                self.report(h, t, "KILLED", None, "cancelled before it started")
                continue
            self.start(h, t)

    def start(self, h: SimHost, t: dict) -> None:
        if not hold(h, t):
            self.c["gpu_collisions"] += 1
        cmd = t.get("command") or []
        try:
            dur = float(cmd[1]) if len(cmd) > 1 and cmd[0] == "sleep" else 1.0
        except ValueError:
            dur = 1.0
        handle = asyncio.get_running_loop().call_later(dur, self.finish, h, t["attempt_id"])
        h.running[t["attempt_id"]] = (handle, t)
        self.c["started"] += 1
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        self.report(h, t, "RUNNING", None, "")

    def _end(self, h: SimHost, aid: str, state: str) -> dict | None:
        """Take a running task off its host as it ends in `state`, noting when (host_ends)."""
        entry = h.running.pop(aid, None)
        if entry is None:
            return None
        handle, t = entry
        handle.cancel()
        unhold(h, t)
        self.running -= 1
        self.host_ends[aid] = [state, time.time(), None]
        return t

    def finish(self, h: SimHost, aid: str) -> None:
        t = self._end(h, aid, "SUCCEEDED")
        if t is not None:
            self.c["finished"] += 1
            self.report(h, t, "SUCCEEDED", 0, "")

    def kill(self, h: SimHost, aid: str, reason: str) -> None:
        t = self._end(h, aid, "KILLED")
        if t is not None:
            self.c["killed"] += 1
            self.report(h, t, "KILLED", None, reason)

    # ------------------------------------------------------------ self-fencing

    async def fence_loop(self) -> None:
        """One acknowledged heartbeat (a probe) a second, taking the hosts in turn. Two
        probes stored one after the other vouch for the heartbeats sent between them; then
        each host whose key was not known stored for the fence delay is fenced, and each
        fenced host stored since is let go."""
        assert self.nc is not None
        js = self.nc.jetstream()
        interval = self.args.heartbeat_interval
        # An agent's default delay: two intervals (AgentConfig.validate), less than the TTL.
        fence_after = AgentConfig(nats_url="", host_id="", heartbeat_interval_s=interval).validate().fence_after_s
        term_at, kill_at = fence_timing(fence_after, 3 * interval, AgentConfig.kill_grace_s)
        n = len(self.hosts)
        k = 0
        for h in self.hosts:
            h.stored = time.time()  # from when this loop starts watching
        last_ok: float | None = None  # when the previous probe was sent, if it was stored
        last_reconnects = self.nc.stats["reconnects"]
        while not await pause(self.stop, 1.0):
            # A fenced agent tries a heartbeat every second (agent.agent retries a failed one
            # within a second): sent before this probe, which vouches for them if stored.
            retry = [h for h in self.fenced_hosts if h.heartbeating]
            t = time.time()
            if retry and not self.nc.is_closed:
                await self.nc._send_command(b"".join(h.heartbeat_frame(t) for h in retry))
                for h in retry:
                    h.prev_hb, h.last_hb = h.last_hb, t
                self.c["hb_sent"] += len(retry)
            probe = next((h for h in (self.hosts[(k + i) % n] for i in range(n)) if h.heartbeating), None)
            k += 1
            sent = time.time()
            stored = False
            if probe is not None:
                try:
                    await js.publish(probe.subject, probe.heartbeat(sent), timeout=2.0,
                                     headers={"Nats-TTL": probe.ttl, SHAPE_HEADER: probe.shape})
                    stored = True
                    probe.stored = max(probe.stored, sent)
                    probe.prev_hb, probe.last_hb = probe.last_hb, sent
                except Exception as exc:  # noqa: BLE001 - the link or the stream is down
                    self.c["acked_hb_failures"] += 1
                    log.debug("acknowledged heartbeat: %s", exc)
            reconnects = self.nc.stats["reconnects"]
            if stored and reconnects == last_reconnects:
                # The probe, sent a moment after the fenced hosts' heartbeats on the same
                # connection, was stored: so were they (an agent learns it from each ack).
                for h in retry:
                    h.stored = max(h.stored, t)
            since = last_ok if stored and reconnects == last_reconnects else None
            last_ok, last_reconnects = (sent if stored else None), reconnects
            now = time.time()
            fenced, frozen, stopped, thawed, lifted = 0, 0, 0, 0, 0
            for h in self.hosts:
                if not h.heartbeating:
                    continue
                if since is not None:
                    # Its latest heartbeat sent between the two probes, if any.
                    t = h.last_hb if h.last_hb <= sent else h.prev_hb
                    if since <= t <= sent and t > h.stored:
                        h.stored = t
                if h.fenced:
                    if h.stored > h.fenced_from:  # stored again
                        # Over the one before the fence only if the key cannot have expired.
                        continued = 0
                        if h.stored - h.fenced_from < kill_at:
                            continued = self.thaw(h)
                            thawed += continued
                        else:
                            stopped += self.stop_frozen(h, now)
                        self.fence_ended(h, continued, now)
                        h.fenced = False
                        self.fenced_hosts.discard(h)
                        lifted += 1
                    elif h.frozen and now - h.fenced_from >= term_at:
                        stopped += self.stop_frozen(h, now)
                elif now - h.stored >= fence_after:
                    fenced += 1
                    frozen += self.fence(h)
            if fenced:
                log.error("no heartbeat stored for %.0f s: %d hosts fenced, %d tasks frozen", fence_after, fenced,
                          frozen)
            if stopped:
                log.error("%d frozen tasks stopped (no heartbeat stored over the last before the fence)", stopped)
            if lifted:
                log.warning("heartbeats stored again: fence lifted on %d hosts, %d frozen tasks continued", lifted,
                            thawed)

    def fence(self, h: SimHost) -> int:
        """Fence host `h`: freeze its tasks (their timers stop); how many."""
        h.fenced, h.fenced_from, h.fenced_at = True, h.stored, time.time()
        self.fenced_hosts.add(h)
        self.c["fences"] += 1
        loop = asyncio.get_running_loop()
        for aid, (handle, _) in h.running.items():
            handle.cancel()
            h.frozen[aid] = max(0.0, handle.when() - loop.time())
        return len(h.frozen)

    def thaw(self, h: SimHost) -> int:
        """Continue `h`'s frozen tasks where they stood; how many."""
        loop = asyncio.get_running_loop()
        frozen, h.frozen = h.frozen, {}
        for aid, left in frozen.items():
            entry = h.running.get(aid)
            if entry is not None:
                h.running[aid] = (loop.call_later(left, self.finish, h, aid), entry[1])
        self.c["fenced_thawed"] += len(frozen)
        return len(frozen)

    def stop_frozen(self, h: SimHost, now: float) -> int:
        """Stop `h`'s frozen tasks (KILLED, the agent's reason); how many."""
        frozen, h.frozen = h.frozen, {}
        n = 0
        for aid in frozen:
            if aid in h.running:
                self.fenced_attempts[aid] = now
                self.kill(h, aid, FENCED_REASON)
                n += 1
        self.c["fenced_kills"] += n
        h.fence_stopping += n
        return n

    @staticmethod
    def fence_ended(h: SimHost, continued: int, now: float) -> None:
        """The fence of `h` is over: its heartbeat's counters move together, as an agent's
        do (and with them its shape, so the control plane reads the fence)."""
        fences, _, cont, stopped = h.fence_counts
        h.fence_counts = (fences + 1, max(0.0, now - h.fenced_at), cont + continued, stopped + h.fence_stopping)
        h.fence_stopping = 0
        h.set_tail(h.tail_base)

    # ------------------------------------------------------------ status reports

    def report(self, h: SimHost, t: dict, state: str, code: int | None, reason: str) -> None:
        body = json.dumps({"v": 1, "host_id": h.spec.id, "attempt_id": t["attempt_id"], "job_id": t["job_id"],
                           "state": state, "exit_code": code, "output_tail": "", "ts": time.time(),
                           "term": t.get("term", 0), "reason": reason}).encode()
        assert self.outbox is not None
        self.outbox.put(f"muster.status.{h.spec.id}", body, f"{t['attempt_id']}:{state}")

    def _report_stored(self, msg_id: str) -> None:
        aid, _, state = msg_id.rpartition(":")
        end = self.host_ends.get(aid)
        if end is not None and end[0] == state and end[2] is None:
            end[2] = time.time()

    @property
    def reports_pending(self) -> int:
        return len(self.outbox) if self.outbox is not None else 0

    # ------------------------------------------------------------ control and stats

    def stats(self) -> dict:
        arr, self.new_arrivals = self.new_arrivals, []
        return {"idx": self.args.idx, "t": time.time(), "ready": self.ready, "hosts": len(self.hosts),
                "running": self.running, "max_running": self.max_running,
                "reports_pending": self.reports_pending, "loop_lag_max_ms": round(self.loop_lag_max * 1000, 1),
                "gc_pause_max_ms": round(self.gc_pause_max * 1000, 1), "gc_full_pauses": self.gc_full_pauses,
                **self.c, "arrivals": arr}

    async def stats_loop(self) -> None:
        assert self.nc is not None
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                await asyncio.wait_for(self.stop.wait(), timeout=1.0)
            except TimeoutError:
                pass
            self.loop_lag_max = max(self.loop_lag_max, time.monotonic() - t0 - 1.0)
            try:
                await self.nc.publish(f"bench.stats.{self.args.idx}", json.dumps(self.stats()).encode())
            except Exception:  # noqa: BLE001
                pass

    async def on_ctl(self, msg) -> None:
        req = json.loads(msg.data)
        if req.get("cmd") == "silence":
            if req.get("host") == "busiest":  # the host running the most tasks right now
                h = max(self.hosts, key=lambda x: len(x.running), default=None)
            else:
                h = self.by_id.get(req.get("host", ""))
            if h is None:
                await msg.respond(json.dumps({"error": "unknown host"}).encode())
                return
            h.heartbeating = False
            n_running = len(h.running)
            # The host dies: its tasks vanish without a report, as on a real host failure.
            for handle, _task in h.running.values():
                handle.cancel()
            self.running -= len(h.running)
            h.running.clear()
            h.gpu_milli.clear()
            h.busy_mig.clear()
            await msg.respond(json.dumps({"host": h.spec.id, "last_heartbeat": h.last_hb,
                                          "running": n_running}).encode())
        elif req.get("cmd") == "finish":
            # Deliver the reports still in flight, then write the results.
            deadline = time.monotonic() + float(req.get("flush_s", 15))
            while self.reports_pending and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            self.write_results()
            await msg.respond(json.dumps({"ok": True, "pending_reports": self.reports_pending}).encode())
            self.stop.set()

    def write_results(self) -> None:
        out = {"idx": self.args.idx, "hosts": len(self.hosts), "counters": self.c,
               "max_running": self.max_running, "running_at_end": self.running,
               "reports_pending_at_end": self.reports_pending,
               "loop_lag_max_ms": round(self.loop_lag_max * 1000, 1),
               "gc_pause_max_ms": round(self.gc_pause_max * 1000, 1), "gc_full_pauses": self.gc_full_pauses,
               "silenced": {h.spec.id: h.last_hb for h in self.hosts if not h.heartbeating},
               "fenced": self.fenced_attempts, "host_ends": self.host_ends, "arrivals": self.arrivals}
        tmp = Path(self.args.out + ".tmp")
        tmp.write_text(json.dumps(out))
        tmp.replace(self.args.out)

    async def run(self) -> None:
        async def error_cb(exc: Exception) -> None:
            if isinstance(exc, nats.errors.SlowConsumerError):
                self.c["slow_consumer"] += 1
            else:
                self.c["errors"] += 1
                log.warning("nats: %s", exc)

        self.nc = await natsclient.connect(self.args.nats.split(","), name=f"bench-sim-{self.args.idx}",
                                           error_cb=error_cb, max_reconnect_attempts=-1,
                                           reconnect_time_wait=0.5, pending_size=64 * 1024 * 1024,
                                           flush_timeout=30)
        self.outbox = Outbox(self.nc, f"_INBOX.bench-sim-{self.args.idx}-{os.urandom(4).hex()}",
                             self.args.max_inflight, self.c, self._report_stored)
        await self.nc.subscribe(f"bench.ctl.{self.args.idx}", cb=self.on_ctl)
        if self.args.wildcard:
            await self.nc.subscribe(ASSIGN_PREFIX + ">", cb=self.on_assign, pending_msgs_limit=1_000_000,
                                    pending_bytes_limit=1024 * 1024 * 1024)
        else:
            for h in self.hosts:
                await self.nc.subscribe(ASSIGN_PREFIX + h.spec.id, cb=self.on_assign, pending_msgs_limit=100_000)
        await self.nc.flush(timeout=60)
        # The server's collector policy (server.memory): a full collection walked every
        # host and subscription of this process and stopped it for up to 347 ms (three
        # in a 50,000-host run), which showed as dispatch latency of a third of the fleet.
        freeze_survivors()
        self.ready = True
        tasks = [asyncio.create_task(self.heartbeat_loop()), asyncio.create_task(self.stats_loop()),
                 asyncio.create_task(self.outbox.run(self.stop)), asyncio.create_task(keep_frozen(self.stop)),
                 asyncio.create_task(self.fence_loop())]
        await self.stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await asyncio.wait_for(self.nc.drain(), timeout=5)
        except Exception:  # noqa: BLE001
            await self.nc.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.simhosts")
    ap.add_argument("--nats", required=True)
    ap.add_argument("--fleet", required=True)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--end", type=int, default=None)
    ap.add_argument("--idx", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--heartbeat-interval", type=float, default=5.0)
    ap.add_argument("--max-inflight", type=int, default=2000)
    ap.add_argument("--wildcard", action="store_true", help="one muster.assign.> subscription, not one per host")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s sim%(process)d %(levelname)s %(message)s")
    asyncio.run(Simulator(args).run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
