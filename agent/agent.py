"""The host agent: heartbeats with telemetry, runs assigned task attempts, reports their state.

Assignments are the host's `alloc.<host>` record in the `state` bucket, republished
by the stream to `muster.assign.<host>`; the agent also reads it whenever it
(re)connects, and reconciles: start what is assigned and was never started here,
stop what is no longer assigned. It never starts an attempt twice, and refuses
records stamped with a leadership term older than one it has seen.

Restarts: with a state dir the agent keeps `<host>.seen` (attempts ever started here) and
`<host>.runs/<attempt>` (the process group of each attempt running now). An agent that
starts again after a crash (kill -9, OOM) first kills the process groups its previous
incarnation left running (one it was stopping once its grace has ended), then reports
each attempt it had started and that is still assigned as LOST ("agent restarted"): the
control plane retries it, and nothing is left RUNNING with nobody watching it. What the
agent keeps there, removed under it while it runs, is written again at the next heartbeat
(`_look_at_state_dir`, agent.statedir).

Self-fencing: a cut-off host's work must be dead before the control plane, seeing its
heartbeat key expire one TTL after the last heartbeat stored, replaces it elsewhere. When
no heartbeat has been stored for `fence_after_s` (counted from when the last stored one
was sent), the agent freezes its attempts (SIGSTOP: they run nothing) and starts none.
Every heartbeat is stored only if the host's key still holds the one this agent stored
last (`Nats-Expected-Last-Subject-Sequence`): one stored while frozen proves the key never
expired nor was lost, the control plane cannot have replaced the work, and the attempts
are continued where they stood (a stream re-electing its leader after a NATS node's loss
costs no work). A probe refused means the key changed: the agent reads the key, and if it
holds a heartbeat of its own, sent with the check, whose acknowledgement was lost, the
chain holds and goes on from it; otherwise (expired, the bucket emptied, overwritten) the
attempts are stopped. With no answer at all, they get SIGTERM a moment before the
key could expire and SIGKILL at the deadline (`fence_timing`). KEEP_RUNNING attempts are
never touched. An agent that was killed and not restarted, or frozen itself, cannot do
this: its watchdog (agent.watchdog, a small process of its own started with the agent)
stops the attempts listed in `<host>.runs` once the agent has neither had a heartbeat
stored (`<host>.watchdog/alive`: its pid and when that heartbeat was sent) for a little
longer than `fence_after_s` nor shown itself awake (`awake`, touched twice a second), and
kills them at the deadline whatever the agent does. Without a state dir both live in a
temporary directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import errors as jserrors

from agent.gpu import GpuBackend, mps_reached, mps_running, open_backend
from agent.gpuwatch import STALE_ROUNDS, GpuWatch, is_stale, usage_to_report, util_by_index
from agent.hostinfo import boot_id, host_capacity, host_usage
from agent.isolation import DEFAULT_PIDS_MAX, Isolation, remove_tree, task_end
from agent.runner import HOST_ERRNOS, Run, watchdog_mark
from agent.statedir import StateWatch, take_lock
from agent.watchdog import RUN_TMP, RunRecord, exited, put_run, read_run, run_record, start_time
from wire import subjects
from wire.durable import TMP, sync_dir, write_durably
from wire.errors import ConfigError, DecodeError, StoreError
from wire.kv import WRONG_LAST_SEQUENCE, Store, connect
from wire.messages import (
    MAX_RECORD_BYTES,
    MAX_TASKS_PER_HEARTBEAT,
    SHAPE_HEADER,
    AttemptState,
    Heartbeat,
    HostAlloc,
    OutputReply,
    OutputRequest,
    StatusReport,
    Task,
    decode,
    encode,
    max_counts,
    shape_digest,
)
from wire.owndir import own_dir
from wire.records import stored_ttl_s
from wire.stopping import pause
from wire.subjects import agent_inbox_prefix

log = logging.getLogger(__name__)
WATCHDOG = str(Path(__file__).with_name("watchdog.py"))
# The fence loop comes round every half second; one this late is said in the log.
LATE_LOOP_S = 1.5
# The shutdown waits this long for a reconcile under way (its note of tries as seen).
RECONCILE_AT_SHUTDOWN_S = 10.0
FENCED_REASON = "fenced: host cut off from the control plane"  # an attempt stopped by a fence
# A try not started, handed back after a fence whose end could not check the heartbeat key.
UNCHECKED_REASON = ("not started: its host was cut off, and whether its heartbeat key expired meanwhile (and the try "
                    "was placed again elsewhere) could not be checked")

VERSION = "0.1.0"
# Simulated hosts report a typical GPU node's CPU and RAM unless told otherwise.
SIM_CPUS = 96
SIM_MEMORY_MB = 1024 * 1024
ENDED_KEPT = 10_000  # ended attempts remembered for re-reporting
UNACKED_KEPT = 64  # heartbeats sent and not acknowledged, remembered to recognise in the key
REPORTS_AT_SHUTDOWN_S = 10.0  # the most a clean shutdown waits to deliver its last reports
DISK_CHECK_S = 15.0  # how often the free disk space is looked at (Agent._disk_checked)
CLAIM_TRIES = 5  # looks for another agent of the host, each followed by a claim of its heartbeat key (Agent._claim)
START_TROUBLE_S = 60.0  # the host asks for no new work this long after a try could not start for want of its resources
START_TROUBLE_MAX_S = 960.0  # ... doubled each time the trouble comes back before a try started, up to this
GPU_LOOK_S = 5.0  # the most a failed try's report waits for a fresh reading of its GPUs (Agent._task_gpu_fault)
GPU_CLOSE_S = 5.0  # the most the shutdown waits for the GPU watch's thread (stuck in NVML: left behind)


def parse_labels(text: str | None) -> dict[str, str]:
    from wire.validation import validate_labels

    labels: dict[str, str] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        k, sep, v = part.partition("=")
        if not sep:
            raise ConfigError(f"label {part!r} is not key=value")
        labels[k.strip()] = v.strip()
    errors = validate_labels(labels)
    if errors:
        raise ConfigError("; ".join(str(e) for e in errors))
    return labels


def fence_timing(fence_after_s: float, ttl_s: float, kill_grace_s: float) -> tuple[float, float]:
    """(SIGTERM at, SIGKILL at): seconds after the last stored heartbeat was sent at which
    attempts still frozen by the fence get SIGTERM, and by which they are dead. The
    deadline is a second before the key can expire (one TTL after that moment); SIGTERM
    comes up to a second (`kill_grace_s` if shorter) before it, and never before the fence."""
    kill_at = max(fence_after_s + 0.2, ttl_s - 1.0)
    return max(fence_after_s, kill_at - min(1.0, kill_grace_s)), kill_at


def watchdog_timing(fence_after_s: float, ttl_s: float, kill_grace_s: float) -> tuple[float, float, float]:
    """(stale after, grace, deadline) for the watchdog: a silent agent that is not awake
    gets its attempts stopped a little after its own fence would have frozen them
    (SIGTERM), and SIGKILLed a second before the heartbeat key can expire; a silent agent
    that is awake fences by itself, and the watchdog only kills what is left at the
    deadline, a quarter of a second after the agent's own (`fence_timing`) and never later
    than a quarter of a second before the key can expire."""
    stale_after = fence_after_s + min(1.0, (ttl_s - fence_after_s) / 3)
    grace = max(0.2, min(kill_grace_s, ttl_s - stale_after - 1.0))
    _, kill_at = fence_timing(fence_after_s, ttl_s, kill_grace_s)
    deadline = min(ttl_s - 0.25, max(kill_at + 0.25, stale_after + grace))
    return round(stale_after, 3), round(grace, 3), round(deadline, 3)


@dataclass
class AgentConfig:
    nats_url: str
    host_id: str
    labels: dict[str, str] = field(default_factory=dict)
    simulate_gpus: str | None = None
    heartbeat_interval_s: float = 5.0
    ttl_intervals: int = 3
    # 0: two heartbeat intervals (10 s at the default 5 s), set by validate().
    fence_after_s: float = 0.0
    kill_grace_s: float = 10.0
    # An attempt still assigned this long after its end was reported is reported again.
    resend_after_s: float = 30.0
    cpus: int | None = None
    memory_mb: int | None = None
    state_dir: Path | None = None
    fault_file: str | None = None
    # NATS credentials (nkey seed file, see server/natsauth.py) and client TLS.
    nats_creds: str | None = None
    nats_ca: str | None = None
    nats_cert: str | None = None
    nats_key: str | None = None
    # How attempts are isolated (agent.isolation): the user they run as (None: the
    # dedicated task user when the agent is root, else the agent's own user), the cgroup
    # version (auto, v2, v1, off), each attempt's pids limit (0: none), where attempts'
    # working directories are made (None: a temporary directory), where the GPU device
    # files are, and the name of the cgroup under which attempts' cgroups are made (None:
    # muster-<host id>).
    run_as: str | None = None
    job_uids: str | None = None  # agent.isolation.parse_job_uids
    cgroups: str = "auto"
    cgroup_name: str | None = None
    pids_max: int = DEFAULT_PIDS_MAX
    work_dir: Path | None = None
    gpu_dev_dir: str = "/dev"
    # A running attempt whose GPUs have all been idle this long is named in the heartbeat
    # (Heartbeat.gpu_idle: the leader alerts `job.gpus_idle`); 0: never.
    gpu_idle_after_s: float = 1800.0
    # Below this much free space where attempts' directories are made, or in the state
    # directory, the host asks for no new work (Heartbeat.pressure); 0: never.
    min_free_disk_mb: int = 256

    def validate(self) -> AgentConfig:
        """Check the settings; an unset fence delay becomes two heartbeat intervals (one
        heartbeat may fail without a fence), which must be shorter than the key's TTL, and
        relative directories absolute."""
        if self.heartbeat_interval_s <= 0:
            raise ConfigError("heartbeat interval must be positive")
        if self.min_free_disk_mb < 0:
            raise ConfigError("the free disk floor (--min-free-disk-mb) must be 0 (none) or more")
        if self.fence_after_s == 0:
            self.fence_after_s = 2 * self.heartbeat_interval_s
        ttl = self.heartbeat_interval_s * self.ttl_intervals
        if not 0 < self.fence_after_s < ttl:
            raise ConfigError(f"fence_after ({self.fence_after_s:g} s) must be positive and shorter than the "
                              f"heartbeat TTL ({ttl:g} s)")
        # Directories given relative to where the agent started (found by exploring: a
        # relative --work-dir was taken, and every task failed, exit 127, unable to enter
        # its directory from the launcher's working directory).
        if self.state_dir is not None:
            self.state_dir = self.state_dir.absolute()
        if self.work_dir is not None:
            self.work_dir = self.work_dir.absolute()
        return self


class Agent:
    def __init__(self, config: AgentConfig, gpus: GpuBackend | None = None) -> None:
        self.config = config.validate()
        self.gpus = gpus or open_backend(config.simulate_gpus, config.fault_file)
        # The only caller of the backend once the agent runs (agent.gpuwatch): NVML is read on
        # a thread of its own, a round each heartbeat interval, and the loop reads its snapshot.
        self.gpu_watch = GpuWatch(self.gpus, config.heartbeat_interval_s)
        # A snapshot older than this means an NVML call hangs: reported without telemetry,
        # and the host asks for no new work (`_gpu_stall`, said in `pressure()`).
        self._gpu_stale_after_s = STALE_ROUNDS * config.heartbeat_interval_s
        self._gpu_stall = ""
        self.boot_id = boot_id()
        self.instance = secrets.token_hex(8)  # this process, in its heartbeats (Heartbeat.instance)
        self._lock_fd: int | None = None  # the state directory's lock, held while running
        self.runs: dict[str, Run] = {}
        # The last try that could not start for want of the host's resources: why, when
        # (time.monotonic()) and for how long after it the host asks for no new work
        # (START_TROUBLE_S, doubled each time the trouble came back before a try started).
        self._start_trouble: tuple[str, float, float] | None = None
        self._started_since_trouble = False  # a try has started since the last trouble
        self._disk_trouble = ""  # _check_disk's last answer
        self._disk_next = 0.0  # when it is asked again (time.monotonic())
        self._disk_task: asyncio.Future[str] | None = None
        self.seen: set[str] = set()  # attempts ever started (or refused) here
        # Noted as seen, not started: the fence began while the note was being written;
        # started by the next reconcile that finds them still assigned, or handed back by
        # the shutdown. attempt id -> its task.
        self._unstarted: dict[str, Task] = {}
        # Nonzero (which of them) after a fence that ended with a heartbeat stored without
        # the check (`_end_fence(key_intact=False)`): the key may have expired meanwhile and
        # the leader replaced what the assignment lists, so nothing listed is started until
        # a read of the assignment made after that end (`_refresh_assignments`) was applied;
        # until then each try not started is handed back (`UNCHECKED_REASON`).
        self._key_unchecked = 0
        self._unchecked_ends = 0
        # The newest assignment record a reconcile was given, applied or not (fenced): the
        # one applied may be applied again for what it left unstarted only while no newer
        # one came (a review: an older record could otherwise start a try since stopped).
        self._newest_seq = 0
        # One reconcile at a time: one waits for the note of what it starts to be written
        # (off the loop), and a newer record must not be applied meanwhile (it could stop
        # an attempt before the older one had started it).
        self._reconcile_lock = asyncio.Lock()
        self._refreshes: set[asyncio.Task[None]] = set()
        self.max_term = 0
        self.applied_seq = 0
        # When the last heartbeat the store took was sent (monotonic): the store stored it
        # after that, so its key cannot expire before this plus the TTL.
        self.last_heartbeat_ok = time.monotonic()
        self.fenced = False
        self._hb_rev: int | None = None  # the stream sequence of that heartbeat
        # Heartbeats sent over `_hb_rev` and not acknowledged (a timeout may hide one the
        # store took): heartbeat seq -> (exact bytes, when sent). See _adopt_unacknowledged.
        self._unacked: OrderedDict[int, tuple[bytes, float]] = OrderedDict()
        self.adopted = 0  # heartbeats found stored after their acknowledgement was lost
        self._frozen: dict[str, Run] = {}  # attempts frozen by the fence, waiting for a probe
        self._fence_stops: set[asyncio.Task[None]] = set()
        # Fences since this agent started (heartbeat fields): ended, the last one's length,
        # attempts continued and stopped.
        self.fences = 0
        self.last_fence_s = 0.0
        self.fence_continued = 0
        self.fence_stopped = 0
        self._fenced_at = 0.0  # when the fence froze the attempts (monotonic)
        self._fence_stopping = 0  # attempts this fence stopped (counted in at its end)
        self.dropped = 0
        self.hb_seq = 0
        # When the backend last reported a new GPU fault (monotonic); it wakes the heartbeat.
        self._fault_at = 0.0
        self._hb_wake = asyncio.Event()
        self._hb_stored = asyncio.Event()  # set each time the store takes a heartbeat
        # When the previous incarnation's last heartbeat was sent (monotonic, from its
        # watchdog file: `_run`), and when this one's first was stored: until then a try it
        # left in its grace must be dead before that heartbeat's key could expire (`_grace_ends`).
        self._previous_heard: float | None = None
        self._first_stored: float | None = None
        # Shutting down: heartbeats say so (nothing more is placed here), and no new
        # attempt is started; set once the store has taken a heartbeat that says so.
        self.leaving = False
        self._leaving_stored = asyncio.Event()
        # The assignment's counts of operators' clears of each GPU's fault mark (None: no
        # assignment read yet; the first one read is where this agent starts from).
        self._gpu_clears: dict[int, int] | None = None
        self._reports: deque[tuple[StatusReport, str]] = deque()  # (report, Nats-Msg-Id)
        # Terminal reports the STATUS stream acknowledged (attempt -> report, when), and
        # the attempts the last applied assignment lists: an attempt still assigned long
        # after its end was reported is reported again (see _resend_unapplied).
        self._ended: OrderedDict[str, tuple[StatusReport, float]] = OrderedDict()
        self._assigned: set[str] = set()
        self.resent = 0
        self._report_wake = asyncio.Event()
        self._stop = asyncio.Event()
        self.store: Store | None = None
        self._seen_file = (config.state_dir / f"{config.host_id}.seen") if config.state_dir else None
        # Running attempts' process groups (for a restarted agent and for the watchdog),
        # and where the watchdog sees that this agent is alive.
        self._tmp_dir = None if config.state_dir else Path(tempfile.mkdtemp(prefix=f"muster-agent-{config.host_id}-"))
        base = config.state_dir or self._tmp_dir
        assert base is not None
        # The agent's files are its own: a task (another user) can neither read nor change
        # them, nor have made the directory first (wire.owndir).
        try:
            own_dir(base, "the agent's state directory")
        except OSError as exc:
            raise ConfigError(str(exc)) from exc
        self._runs_dir = base / f"{config.host_id}.runs"
        # Terminal reports not yet acknowledged by the STATUS stream, one file each: an
        # agent killed before delivering one delivers it after its restart.
        self._unsent_dir = base / f"{config.host_id}.reports"
        self._watch_dir = base / f"{config.host_id}.watchdog"
        # This agent's instance, for its next start (`_take_instance`): with a state dir.
        self._instance_file = (base / f"{config.host_id}.instance") if config.state_dir else None
        try:
            for d in (self._runs_dir, self._unsent_dir, self._watch_dir):
                own_dir(d)
        except OSError as exc:
            raise ConfigError(str(exc)) from exc
        # Read at start-up, before the loop runs (the backend's inventory is the one it read
        # when it started; the device minors are read here once): not the GPU watch's.
        self.isolation = Isolation(config.host_id, run_as=config.run_as, cgroup_mode=config.cgroups,
                                   pids_max=config.pids_max, work_root=config.work_dir,
                                   private_dir=base / f"{config.host_id}.launch", dev_dir=config.gpu_dev_dir,
                                   gpu_minors=getattr(self.gpus, "device_minors", lambda: None)(),
                                   mig_parents={m.uuid: g.index for g in self.gpus.inventory() for m in g.mig},
                                   cgroup_name=config.cgroup_name, job_uids=config.job_uids)
        self._watchdog: subprocess.Popen[bytes] | None = None
        self.watchdog_restarts = 0
        # What the agent made in its state directory, looked at each heartbeat: lost (removed
        # under it), it is written again (`_look_at_state_dir`); what could not be, why (the
        # host asks for no new work meanwhile: `pressure()`).
        self._state_watch = StateWatch(
            [base, self._runs_dir, self._unsent_dir, self.isolation.private_dir, self.isolation.exits_dir,
             *([self._instance_file] if self._instance_file is not None else [])],
            lock=base / f"{config.host_id}.lock")
        self._state_trouble = ""
        self._load_seen()
        # Attempts a previous incarnation started and this one cannot watch, killed when it
        # runs (once no other agent is found running as this host): reported LOST once each
        # when their assignment is seen.
        self.killed_leftovers: list[str] = []
        # Attempts whose tasks ended while no agent ran: the wait status their launcher kept
        # (agent/launch.py), reported as their end when their assignment is seen.
        self._ended_away: dict[str, int] = {}
        # Tries a previous incarnation was stopping whose grace had not ended when this one
        # started (`kill:` in their run records): left to run to that end, their checkpoint
        # window, then killed as leftovers are (`_let_grace_end`). attempt id -> its record;
        # and of those, the tries an assignment listed meanwhile, reported once they ended.
        self._in_grace: dict[str, RunRecord] = {}
        self._after_grace: dict[str, Task] = {}
        self._grace_tasks: list[asyncio.Task[None]] = []
        self._previous_instance = ""  # the last agent on this state directory (_take_instance)
        # Another agent of this host that stopped, not the last one on this state directory
        # (this one started without its state: a new or wiped directory, or none): what the
        # first assignment lists it may have started (_another_agent, reconcile).
        self._stateless_after = ""
        # ... reported LOST once that agent's heartbeat key would have expired (by its last
        # heartbeat's time): its watchdog has stopped what it ran by then, as the leader
        # would have replaced it then had this agent not started.
        self._stateless_until = 0.0
        self._lost_later: list[Task] = []
        self._applied_once = False  # an assignment (or its absence) applied since the start
        self._assign_sub: Subscription | None = None  # the subscription to this host's assignments
        self._newest_queued: tuple[HostAlloc, int] | None = None  # of those passed over (_on_assign)
        self.coalesced = 0  # assignments passed over for a newer one already queued
        # Attempts a previous incarnation started: one still assigned is reported LOST once.
        # (Only those: an attempt this agent ran itself and whose report is not applied yet
        # is still in the assignment for a while, and must be left alone.)
        self._inherited = set(self.seen)
        self._reported_lost: set[str] = set()
        self._load_unsent()

    # ------------------------------------------------------------ persistence of "started"

    def _load_seen(self) -> None:
        if self._seen_file and self._seen_file.exists():
            self.seen.update(self._seen_on_disk())

    def _seen_on_disk(self) -> set[str]:
        """The tries the seen file notes. Read as bytes (found by exploring: one byte that is
        not UTF-8 kept the agent from starting); each note begins a line of its own
        (`_write_seen`), so a line cut short by a crash or a full disk spoils no other.
        Raises OSError."""
        assert self._seen_file is not None
        return {x for x in self._seen_file.read_bytes().decode("utf-8", "replace").split() if x}

    def _write_all_seen(self) -> None:
        """Write the seen file again whole, where it lacks a try this agent has seen (made
        again by a note written since the state directory was lost, or gone). Raises OSError."""
        assert self._seen_file is not None
        try:
            if self.seen <= self._seen_on_disk():
                return
        except FileNotFoundError:
            pass
        write_durably(self._seen_file, "".join(f"{a}\n" for a in sorted(self.seen)).encode())

    def _mark_seen(self, attempt_id: str) -> str:
        """Note the attempt as seen here, in memory and on disk (so that a restart never
        starts it again): "" once it is, else why it could not be written (found by
        exploring: with the disk full the error ended the reading of the assignment, and
        the attempt stayed PLACED for good, a cancel unable to end it)."""
        self.seen.add(attempt_id)
        return self._write_seen([attempt_id])

    async def _mark_seen_off_loop(self, attempt_ids: list[str]) -> str:
        """`_mark_seen` of several attempts, written with one fsync in a thread: a disk
        that takes seconds to sync (a task writing its checkpoint with fsync, say) would
        otherwise stop this agent's loop, its heartbeats and its fence for as long, and the
        host be fenced for it (found by a CI run, where an agent whose loop did not run for
        2 s had its tries stopped by its watchdog)."""
        self.seen.update(attempt_ids)
        return await asyncio.to_thread(self._write_seen, attempt_ids)

    def _write_seen(self, attempt_ids: list[str]) -> str:
        if self._seen_file:
            try:
                own_dir(self._seen_file.parent)  # made again, if gone, only as the agent's own
                made = not self._seen_file.exists()
                with open(self._seen_file, "a") as f:
                    # Begun on a line of its own: one the last write left cut short (a crash,
                    # a full disk) would otherwise run into this one, and both be lost (found
                    # by exploring: a try so lost was started again after a restart).
                    f.write("\n" + "".join(a + "\n" for a in attempt_ids))
                    f.flush()
                    os.fsync(f.fileno())
                if made:  # its name, too, must outlive a crash of the machine
                    sync_dir(self._seen_file.parent)
            except OSError as exc:
                log.warning("attempts %s cannot be noted as seen: %s", ", ".join(attempt_ids), exc)
                return str(exc)
        return ""

    @staticmethod
    def _ended_while_away(t: Task, status: int,
                          gone: str = "ended while its agent was down; its output was not kept",
                          ) -> tuple[AttemptState, int | None, str, str]:
        """The end of a task that ended while no agent ran (or in the grace of a stop its
        previous agent began: `gone` says which), from the wait status its launcher kept:
        (state, exit code, output, reason) for its report. Its output is not known (no
        agent read it)."""
        if t.stop:
            # Asked to stop (a preemption, a cancel, a time limit): its agent may have sent
            # the SIGTERM before it died, and a task that saved its state and exited 0 has
            # not finished (as a live agent's run says: found by a review).
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
            return AttemptState.KILLED, code, "", f"{t.stop_reason or 'stopped'} ({gone})"
        if os.WIFEXITED(status):
            code = os.WEXITSTATUS(status)
            if code == 0:
                return AttemptState.SUCCEEDED, 0, "", gone
            return AttemptState.FAILED, code, "", f"exit code {code}: {gone}"
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
        return AttemptState.FAILED, -sig, "", f"killed by signal {sig}: {gone}"

    def _note_handed_back(self, attempt_id: str) -> None:
        """Note a try about to be handed back unstarted as seen. Where that cannot be written
        the host is in trouble (it asks for no new work) and the try's report kept on disk,
        if it can be, keeps a restart from starting it (`_load_unsent`); with neither written,
        a restart before the leader has applied the report could start it."""
        unsaved = self._mark_seen(attempt_id)
        if unsaved:
            self._troubled(unsaved)

    def _run_file(self, attempt_id: str) -> Path:
        return self._runs_dir / attempt_id

    def _record_run(self, attempt_id: str, pid: int, keep_running: bool = False,
                    cgroup_paths: list[str] | None = None, work_dir: str | None = None,
                    launcher: int | None = None, kill_at: float | None = None) -> None:
        path = self._run_file(attempt_id)
        own_dir(path.parent)
        # `pid`: the task's process group; `keep`: a KEEP_RUNNING attempt, which the watchdog
        # leaves alone; `cg:<dir>`: the attempt's cgroup directories (killed whole by the
        # watchdog and a restarted agent); `wd:<dir>`: the directory made for it (removed by
        # a restarted agent); `sup:<pid>:<start>`: the launcher that stays the task's parent
        # (killed first by a restarted agent: it would write that kill down as the task's end).
        # (The launcher wrote the same before the task started: agent/launch.py.) `kill:`
        # the end of a stop's grace (Run._record_stop).
        text = run_record(pid, start_time(pid), keep_running, launcher,
                          start_time(launcher) if launcher is not None else "", cgroup_paths or (), work_dir,
                          kill_at=kill_at)
        try:
            if path.read_text() == text:
                return  # the launcher's, as it should be: not written again
        except OSError:
            pass
        put_run(path, text)

    def _forget_run(self, attempt_id: str) -> None:
        self._run_file(attempt_id).unlink(missing_ok=True)

    def _kill_leftovers(self) -> list[str]:
        """SIGKILL the process groups of attempts a previous incarnation left running
        (each ran in a session of its own: its pid is its group id). A pid whose process
        start time differs was reused by something else and is left alone, and so is
        every process of a record written in another boot of the machine (its processes
        are gone, and a pid and start tick may come again after a reboot). A try that
        incarnation was stopping, whose grace has not ended (`kill:` in its record), is left
        to run to that end (`_in_grace`, `_let_grace_end`): its checkpoint window is not cut
        short. Returns the attempts whose processes were killed."""
        killed: list[str] = []
        if not self._runs_dir.exists():
            return killed
        for f in sorted(self._runs_dir.iterdir()):
            if f.name.endswith(RUN_TMP):  # (half written when the agent died: the record is the other)
                f.unlink(missing_ok=True)
                continue
            try:
                r = read_run(f.read_text())
            except (ValueError, IndexError, OSError):
                f.unlink(missing_ok=True)
                continue
            if r.other_boot():
                log.info("attempt %s was recorded in an earlier boot of this machine (boot %s): its processes "
                         "are gone, and none is signalled", f.name, r.boot)
            elif r.kill_at is not None and r.kill_at > time.monotonic() and self._leftover_runs(r):
                log.warning("attempt %s (process group %d) was being stopped by a previous agent: left to run to "
                            "the end of its grace, in %.1f s", f.name, r.pid, r.kill_at - time.monotonic())
                self._in_grace[f.name] = r
                continue  # (its record stays: the watchdog, and the next start, find it)
            if self._kill_leftover(f.name, r):
                killed.append(f.name)
        return killed

    @staticmethod
    def _leftover_runs(r: RunRecord) -> bool:
        """The task a run record names still runs (its first process, not a zombie)."""
        return start_time(r.pid) == r.start and not exited(r.pid)

    def _kill_leftover(self, attempt_id: str, r: RunRecord) -> bool:
        """Kill what is left of a try a previous incarnation ran (none of a record of
        another boot), remove its cgroups, its directory and its record. Whether its task
        was killed."""
        killed = False
        if not r.other_boot():
            # Its launcher first, then its process group and its cgroup: a task killed
            # while its launcher lives would have that end written down as its own.
            if r.launcher is not None and start_time(r.launcher[0]) == r.launcher[1]:
                with contextlib.suppress(OSError):
                    os.kill(r.launcher[0], signal.SIGKILL)
            if start_time(r.pid) == r.start:
                with contextlib.suppress(OSError):
                    os.killpg(r.pid, signal.SIGKILL)
                    killed = True
                    log.warning("killed attempt %s (process group %d) left running by a previous agent",
                                attempt_id, r.pid)
            try:
                if r.cgroups:
                    self.isolation.kill_leftover(r.cgroups)
            except OSError:
                pass
        # Its working directory (the attempt's data, which a later task of the same job
        # could read): removed, with its work root once empty, whatever the kill met.
        if r.work_dir is not None:
            self.isolation.remove_leftover_dir(Path(r.work_dir), attempt_id)
        self._run_file(attempt_id).unlink(missing_ok=True)
        return killed

    def _grace_ends(self, r: RunRecord) -> float:
        """When a try left in its grace (`_in_grace`) is killed (monotonic): its stop's end,
        or the fence's deadline if this agent is fenced and that comes first (it must be dead
        before the heartbeat key can expire, as this agent's own tries are)."""
        assert r.kill_at is not None
        ends = r.kill_at
        if self.fenced:
            ends = min(ends, self.last_heartbeat_ok + self.fence_timing()[1])
        if self._previous_heard is not None:
            # Until this agent's first heartbeat is stored (NATS unreachable at its start, say),
            # the key is the previous one's, and may expire a TTL after its last heartbeat:
            # the leader then frees the try's place (found by a review: the try ran on to its
            # grace's end, minutes away, past the expiry).
            bound = self._previous_heard + self.fence_timing()[1]
            if self._first_stored is None or self._first_stored > bound:
                ends = min(ends, bound)
        return ends

    async def _let_grace_end(self, attempt_id: str, r: RunRecord) -> None:
        """Let a try a previous incarnation was stopping run to the end of its grace (or end
        in it), then kill what is left of it as a leftover, note its end (its launcher's
        record, if it ended by itself), and report it if an assignment listed it meanwhile
        (`_after_grace`; else the assignment that lists it reports it). Cancelled (the agent
        does not start after all), it is killed at once."""
        try:
            while self._leftover_runs(r) and time.monotonic() < self._grace_ends(r):
                await asyncio.sleep(0.25)
        finally:
            own_end = task_end(self.isolation.exit_file(attempt_id))
            killed = self._kill_leftover(attempt_id, r)
            status = task_end(self.isolation.exit_file(attempt_id))
            if killed and own_end is None:
                self.isolation.forget_exit(attempt_id)  # (its launcher killed first: the kill's, not its own)
            elif status is not None:
                self._ended_away.setdefault(attempt_id, status)
            del self._in_grace[attempt_id]
        t = self._after_grace.pop(attempt_id, None)
        if t is not None:
            async with self._reconcile_lock:
                if attempt_id in self._assigned and attempt_id not in self._reported_lost:
                    await self._report_inherited(t, in_grace=True)

    def _load_unsent(self) -> None:
        """Queue the terminal reports a previous incarnation could not deliver: the real
        outcome of those attempts, not LOST."""
        if not self._unsent_dir.exists():
            return
        loaded: list[tuple[StatusReport, str]] = []
        for f in self._unsent_dir.iterdir():
            if f.name.endswith(TMP):  # half written when the agent died: never acknowledged either
                f.unlink(missing_ok=True)
                continue
            try:
                head, _, body = f.read_bytes().partition(b"\n")
                r = decode(StatusReport, body)
            except (OSError, DecodeError) as exc:
                log.warning("dropped unsent report %s: %s", f.name, exc)
                f.unlink(missing_ok=True)
                continue
            loaded.append((r, head.decode(errors="replace")))
        for r, msg_id in sorted(loaded, key=lambda x: x[0].ts):
            self._reports.append((r, msg_id))
            self._reported_lost.add(r.attempt_id)  # its end is known: never LOST
            # Nor started here: a try handed back unstarted whose note as seen could not be
            # written (a disk that failed the one and not the other) is still assigned.
            self.seen.add(r.attempt_id)
        if loaded:
            log.warning("delivering %d reports a previous agent could not deliver", len(loaded))

    def _persist_unsent(self, r: StatusReport, msg_id: str) -> None:
        """Keep a terminal report on disk until the STATUS stream takes it, durably (its
        directory synced too: a report whose name a machine's crash lost was reported LOST
        by the next start, and its try run again). A temporary file a full disk left is
        removed. Raises OSError."""
        own_dir(self._unsent_dir)
        write_durably(self._unsent_dir / r.attempt_id, msg_id.encode() + b"\n" + encode(r))

    # ------------------------------------------------------------ heartbeats

    def heartbeat(self) -> Heartbeat:
        cpus, mem = host_capacity()
        if self.gpus.simulated:
            cpus = SIM_CPUS
            mem = SIM_MEMORY_MB
        cpus = self.config.cpus or cpus
        mem = self.config.memory_mb or mem
        cpu_pct, mem_used = host_usage()
        self.hb_seq += 1
        # The GPU watch's latest snapshot (read now where the backend is read in line): it
        # never waits on NVML. The faults it found are taken first, so that the snapshot
        # shows each of them and `_fault_at` comes before this heartbeat is sent.
        self.gpu_watch.set_busy({i for r in self.runs.values() for i in r.task.gpu_indices})
        self.gpu_watch.current()
        self._poll_gpu_faults()
        snap = self.gpu_watch.snapshot()
        stale = self.gpu_watch.threaded and is_stale(snap, time.monotonic(), self._gpu_stale_after_s)
        self._note_gpu_stall(stale, snap.taken_at is None)
        usage = usage_to_report(snap, stale)
        # What this agent runs on each GPU: thousandths allocated (1000 for a GPU held
        # whole) and GPU memory given to shared tasks.
        share: dict[int, int] = {}
        gpu_mem: dict[int, int] = {}
        for r in self.runs.values():
            for i in r.task.gpu_indices:
                share[i] = share.get(i, 0) + (r.task.gpu_share or 1000)
                gpu_mem[i] = gpu_mem.get(i, 0) + r.task.gpu_memory_mb
        for u in usage:
            u.share_allocated = share.get(u.index, 0)
            u.mem_allocated_mb = gpu_mem.get(u.index, 0)
        # A GPU whose utilisation is unread (all of them from a stale snapshot) gives no
        # sample, and ends an idle stretch: unknown is not idle.
        util = {} if stale else util_by_index(usage)
        now = time.time()
        for r in self.runs.values():
            r.sample_gpus(util, now)
        idle_after = self.config.gpu_idle_after_s
        idle = {r.task.attempt_id: r.gpu_idle_since for r in self.runs.values()
                if idle_after > 0 and r.gpu_idle_since is not None and now - r.gpu_idle_since >= idle_after}
        return Heartbeat(
            host_id=self.config.host_id,
            boot_id=self.boot_id,
            instance=self.instance,
            seq=self.hb_seq,
            ts=time.time(),
            labels=self.config.labels,
            gpus=list(snap.inventory),
            cpus=cpus,
            memory_mb=mem,
            gpu_usage=usage,
            cpu_pct=cpu_pct,
            mem_used_mb=mem_used,
            simulated=self.gpus.simulated,
            agent_version=VERSION,
            term=self.max_term,
            isolation=self.isolation.describe(),
            isolated=self.isolation.isolated,
            fences=self.fences,
            last_fence_s=round(self.last_fence_s, 3),
            fence_continued=self.fence_continued,
            fence_stopped=self.fence_stopped,
            leaving=self.leaving,
            gpu_idle=dict(sorted(idle.items())[:MAX_TASKS_PER_HEARTBEAT]),
            pressure=self.pressure(),
        )

    def _note_gpu_stall(self, stale: bool, never_read: bool) -> None:
        """Say once, loudly, that the GPU watch's snapshot is stale (an NVML call hangs: a
        wedged driver), and once that it is fresh again. While it is stale the heartbeats go
        on, with each GPU's fault marks and no telemetry (`usage_to_report`), and the host asks
        for no new work (`pressure()`): its GPU faults cannot be seen meanwhile, and new work
        would likely hang in the driver too. Running work is left alone."""
        was = self._gpu_stall
        if not stale:
            if was:
                log.warning("NVML answers again: GPU telemetry reported again, and the host takes new work")
            self._gpu_stall = ""
            return
        self._gpu_stall = ("GPU telemetry: no NVML reading yet" if never_read else
                           f"GPU telemetry: NVML has not answered for over {self._gpu_stale_after_s:g} s")
        if not was:
            log.error("%s (a hung NVML call: a wedged driver?): heartbeats go on without GPU telemetry, GPU faults "
                      "are not seen, and the host asks for no new work until NVML answers", self._gpu_stall)

    def _troubled(self, why: str, now: float | None = None) -> None:
        """A try could not start, or be kept, for want of the host's resources: the host asks
        for no new work for START_TROUBLE_S, and the leader hears of it at once, not at the
        next heartbeat. A trouble that comes back within START_TROUBLE_MAX_S of the end of
        its hold, no try having started meanwhile (a fault that stays: a read-only work
        root, a broken mount), keeps the host out twice as long each time, up to
        START_TROUBLE_MAX_S: it took a batch again each minute, each try requeued and an
        alert each time (a review)."""
        now = time.monotonic() if now is None else now
        last = self._start_trouble
        hold = START_TROUBLE_S
        if last is not None:
            _why, at, held = last
            if now - at < held:
                hold = held
            elif not self._started_since_trouble and now - at - held < START_TROUBLE_MAX_S:
                # Back soon after its hold (a host quiet for longer starts again from a minute).
                hold = min(2 * held, START_TROUBLE_MAX_S)
        self._start_trouble = (why, now, hold)
        self._started_since_trouble = False
        self._hb_wake.set()

    def _start_troubled(self, now: float | None = None) -> str:
        """Why a try could not start here within the trouble's hold (START_TROUBLE_S, or
        longer when it keeps coming back), or ""."""
        now = time.monotonic() if now is None else now
        if self._start_trouble is not None and now - self._start_trouble[1] < self._start_trouble[2]:
            why, _at, hold = self._start_trouble
            return why if hold <= START_TROUBLE_S else f"{why} (again: no new work for {hold:.0f} s)"
        return ""

    def pressure(self) -> str:
        """Why this host should be given no new work now ("" while it may): too little free
        disk where attempts' directories are made or in the state directory, a state
        directory lost and not written again whole (`_write_state_again`), or a try that
        could not start for want of the host's resources within START_TROUBLE_S (found by
        exploring: with the disk full every try sent here failed, each counted as its job's
        own failure, and the host went on being given work)."""
        why = [self._disk_trouble] if self._disk_trouble else []
        if self._state_trouble:
            why.append(self._state_trouble)
        if self._gpu_stall:
            why.append(self._gpu_stall)
        trouble = self._start_troubled()
        if trouble:
            why.append(f"could not start a try: {trouble}")
        return "; ".join(dict.fromkeys(why))[:512]

    def _check_disk(self) -> str:
        """Too little free disk where attempts' directories are made or in the state
        directory, in words, or "". Blocking (statvfs: a hung network file system would
        hang it), so run in a thread now and then (`_disk_look`). Its words change only
        when the trouble does (a heartbeat's shape, decoded by the control plane at each
        change), and a trouble clears only above the floor and a quarter (no flapping)."""
        floor = self.config.min_free_disk_mb
        if floor <= 0:
            return ""
        out = []
        for what, path in (("directory for attempts", self.isolation.work_root),
                           ("state directory", self._runs_dir.parent)):
            try:
                st = os.statvfs(path)
            except OSError:
                continue
            free_mb = st.f_bavail * st.f_frsize // (1024 * 1024)
            text = f"disk: less than {floor} MB free in its {what}"
            if free_mb < floor or (text in self._disk_trouble and free_mb < floor * 1.25):
                out.append(text)
        return "; ".join(out)

    def _look_at_state_dir(self) -> None:
        """Each heartbeat: whether what the agent made in its state directory is still there
        (agent.statedir); what was lost (removed under the agent) is written again, at once,
        and until it could be whole."""
        needed = [self._seen_file] if self._seen_file is not None and self.seen else []
        lost = self._state_watch.lost(self._lock_fd, needed)
        if lost or self._state_trouble:
            self._write_state_again(lost)

    def _write_state_again(self, lost: list[str]) -> None:
        """Write again what the agent keeps in its state directory, `lost` under it: its
        directories (the launchers' too), its lock, its instance, the tries it has seen, the
        records of the tries running (and of those left in their grace) with the records of
        their ends, and the reports not yet delivered, so that a restart finds them as they
        were. Each piece that cannot be written (a disk full, the directory taken by
        another user) is said, and the host asks for no new work until the next heartbeat's
        try writes it (`pressure()`). Not written again: the watchdog's marks of tries it
        stopped (`fenced/`, its own), and the launch specs of tries being started (those
        fail to start, as the host's trouble). On the loop: a rare event, and its writes
        small (the seen file and the reports are synced)."""
        base = self._runs_dir.parent
        if lost:
            log.error("the agent's state directory %s lost what the agent keeps there (%s): removed or replaced "
                      "while the agent ran; writing it again", base, ", ".join(lost))
        failed: list[str] = []

        def attempt(what: str, write: Callable[[], object]) -> None:
            try:
                write()
            except OSError as exc:
                failed.append(f"{what}: {exc}")

        def own_dirs() -> None:
            own_dir(base, "the agent's state directory")
            for d in (self._runs_dir, self._unsent_dir, self._watch_dir):
                own_dir(d)
            self.isolation.own_dirs()

        attempt("its directories", own_dirs)
        attempt("its lock", self._lock_again)
        instance = self._instance_file
        if instance is not None and not self._holds(instance, self.instance + "\n"):
            attempt("its instance", partial(write_durably, instance, (self.instance + "\n").encode()))
        if self._seen_file is not None and self.seen:
            attempt("the tries it has seen", self._write_all_seen)
        for a, run in list(self.runs.items()):
            if run.live and run.proc is not None:
                attempt(f"the record of try {a}", partial(
                    self._record_run, a, run.group_pid, run.task.keep_running, run.cgroup_paths, run.work_dir,
                    launcher=run.proc.pid, kill_at=run.stop_deadline))
                attempt(f"the record of try {a}'s end", partial(self.isolation.keep_end_record, a))
        for a, record in list(self._in_grace.items()):
            attempt(f"the record of try {a}", partial(put_run, self._run_file(a), record.line()))
        for a, status in list(self._ended_away.items()):
            attempt(f"the record of try {a}'s end", partial(self.isolation.keep_end_record, a, status))
        for r, msg_id in list(self._reports):
            if r.state.terminal and not (self._unsent_dir / r.attempt_id).exists():
                attempt(f"the report of try {r.attempt_id}", partial(self._persist_unsent, r, msg_id))
        self._touch_alive()
        self._touch_awake()
        self._state_watch.mark()
        if not failed:
            if lost or self._state_trouble:
                log.warning("the agent's state directory %s is written again", base)
            self._state_trouble = ""
            return
        trouble = f"state directory lost, not written again whole: {'; '.join(failed)}"[:400]
        if trouble != self._state_trouble:
            log.error("%s: the host asks for no new work until it is", trouble)
        self._state_trouble = trouble

    @staticmethod
    def _holds(path: Path, text: str) -> bool:
        try:
            return path.read_text() == text
        except OSError:
            return False

    def _disk_look(self) -> None:
        """Take the last free disk space check's answer (`_disk_trouble`) when it has come,
        and start the next in a thread every DISK_CHECK_S: a check that hangs keeps the last
        answer, and never holds a heartbeat up."""
        t = self._disk_task
        if t is not None and t.done():
            self._disk_task = None
            try:
                self._disk_trouble = t.result()
            except Exception as exc:  # noqa: BLE001 - the last answer stands
                log.warning("the free disk space check failed: %s", exc)
        now = time.monotonic()
        if self._disk_task is None and now >= self._disk_next:
            self._disk_next = now + DISK_CHECK_S
            self._disk_task = asyncio.ensure_future(asyncio.to_thread(self._check_disk))

    async def _heartbeat_loop(self) -> None:
        assert self.store is not None
        ttl = self._heartbeat_ttl()
        subject = subjects.kv_subject(subjects.HOSTS_BUCKET, self.config.host_id)
        interval = self.config.heartbeat_interval_s
        failures = 0
        while not self._stop.is_set():
            began = time.monotonic()
            self._disk_look()
            self._look_at_state_dir()
            # Each heartbeat is stored only over the last one this agent stored, so that one
            # taken while attempts are frozen (or sent just before the fence froze them)
            # proves the key never expired (see the module's docstring).
            probe = self._hb_rev
            try:
                hb = self.heartbeat()
                data = encode(hb)
                headers = {"Nats-TTL": ttl, SHAPE_HEADER: shape_digest(hb)}
                sent = time.monotonic()
                if probe is not None:
                    headers["Nats-Expected-Last-Subject-Sequence"] = str(probe)
                    self._unacked[hb.seq] = (data, sent)
                    while len(self._unacked) > UNACKED_KEPT:
                        self._unacked.popitem(last=False)
                ack = await self.store.js.publish(subject, data, headers=headers, timeout=min(2.0, interval))
                self.last_heartbeat_ok, self._hb_rev = sent, ack.seq
                if self._first_stored is None:
                    self._first_stored = sent
                self._hb_stored.set()
                if hb.leaving:
                    self._leaving_stored.set()
                self._unacked.clear()
                failures = 0
                self._touch_alive()
                if self.fenced:
                    self._end_fence(key_intact=probe is not None)
                    self._refresh_soon()
                elif self._key_unchecked and not self._refreshes:
                    self._refresh_soon()  # the last read after an unchecked fence failed: again
            except Exception as exc:  # noqa: BLE001 - the link is down: keep trying
                failures += 1
                if probe is not None and isinstance(exc, jserrors.APIError) and exc.err_code == WRONG_LAST_SEQUENCE:
                    outcome = await self._adopt_unacknowledged(probe)
                    if outcome == "unknown" and self._frozen:
                        pass  # read again after the next refusal; the fence's deadline still holds
                    elif outcome != "adopted":
                        # The next heartbeat goes unconditionally (within a second).
                        self._hb_rev = None
                        self._unacked.clear()
                        if self._frozen:
                            self._stop_frozen("its heartbeat key changed while it was cut off (expired, "
                                              "overwritten, or the bucket was emptied)")
                        else:
                            log.warning("heartbeat refused: the key no longer holds the last heartbeat this "
                                        "agent stored (it expired, or was overwritten)")
                elif failures == 1 or failures % 10 == 0:
                    log.warning("heartbeat failed (%d in a row): %s", failures, exc)
            await self._check_fence()
            if self._resend_unapplied(time.monotonic()):
                self._refresh_soon()  # in case it is our view that is old
            # One heartbeat an interval, counted from the start of the last (a slow publish
            # does not stretch the period); after a failure the next try comes within a
            # second, so that one slow or lost answer is not half of fence_after.
            wait = interval - (time.monotonic() - began)
            await pause(self._hb_wake, max(0.0, min(wait, 1.0) if failures else wait))  # set by stop() too
            self._hb_wake.clear()

    async def _adopt_unacknowledged(self, probe: int) -> str:
        """After a heartbeat checked against `probe` was refused: does the key hold one this
        agent sent with the check whose acknowledgement was lost (a publish that timed out
        after the store took it)? That heartbeat was stored only over `_hb_rev`, so the key
        still held then and holds now: the chain goes on from it (`_hb_rev` := its
        sequence, and the fence counts from when it was sent): "adopted". Matched on its
        exact bytes, so that neither another agent process of this host nor anyone else's
        write can pass for it. A read that fails, or shows `probe` itself (a replica behind:
        the refusal says the key no longer holds it), tells nothing: "unknown". Anything
        else in the key: "changed". A stale read can at worst show an older heartbeat of
        ours, which was stored all the same: what proves the key held is still only a
        checked heartbeat taken."""
        assert self.store is not None
        try:
            rec = await self.store.get(self.config.host_id, bucket=subjects.HOSTS_BUCKET)
        except StoreError as exc:
            log.warning("heartbeat refused, and the key cannot be read: %s", exc)
            return "unknown"
        if rec.revision == probe:
            return "unknown"
        if rec.value is None:
            return "changed"
        try:
            theirs = decode(Heartbeat, rec.value).instance
        except DecodeError:
            theirs = ""
        if theirs and theirs != self.instance:
            log.error("another agent (instance %s) heartbeats as host %s: two agents run this host's work; stop "
                      "one of them", theirs, self.config.host_id)
        for seq, (data, sent) in self._unacked.items():
            if data == rec.value:
                self._hb_rev = rec.revision
                self.last_heartbeat_ok = max(self.last_heartbeat_ok, sent)
                self._touch_alive()
                while self._unacked and next(iter(self._unacked)) <= seq:
                    self._unacked.popitem(last=False)
                self.adopted += 1
                log.warning("heartbeat %d was stored though its acknowledgement was lost: going on from it", seq)
                return "adopted"
        return "changed"

    async def _fence_loop(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            await self._check_fence()
            self._touch_awake()
            self._keep_watchdog()
            await pause(self._stop, 0.5)
            # A loop that came round late: this agent did not run (the machine starved or
            # froze it, or a write blocked its loop), and its watchdog may have taken it
            # for asleep. Said, so that a fence it caused can be told from one NATS caused.
            now = time.monotonic()
            if now - last > LATE_LOOP_S:
                log.warning("the agent did not run for %.1f s (its loop came round late)", now - last - 0.5)
            last = now

    def fence_timing(self) -> tuple[float, float]:
        c = self.config
        return fence_timing(c.fence_after_s, c.heartbeat_interval_s * c.ttl_intervals, c.kill_grace_s)

    async def _check_fence(self) -> None:
        silent = time.monotonic() - self.last_heartbeat_ok
        if silent < self.config.fence_after_s:
            return
        if not self.fenced:
            self.fenced = True
            # The fence began when the silence passed its delay, not when this loop saw it:
            # an agent frozen (SIGSTOP) or starved past the delay notices only once it runs.
            self._fenced_at = self.last_heartbeat_ok + self.config.fence_after_s
            doomed = [r for r in self.runs.values() if not r.task.keep_running]
            for r in doomed:
                r.freeze()
            self._frozen = {r.task.attempt_id: r for r in doomed}
            log.error("no heartbeat stored for %.1f s: fencing myself, %d attempts frozen until the store confirms "
                      "this host's key (%d keep running)", silent, len(doomed), len(self.runs) - len(doomed))
        term_at, _ = self.fence_timing()
        if self._frozen and silent >= term_at:
            self._stop_frozen(f"no heartbeat stored for {silent:.1f} s")

    def _stop_frozen(self, why: str) -> None:
        """Stop the frozen attempts: SIGTERM (continued to take it), SIGKILL at the fence's
        deadline, before the key can expire and the control plane replace them."""
        frozen, self._frozen = self._frozen, {}
        if not frozen:
            return
        _, kill_at = self.fence_timing()
        grace = max(0.0, kill_at - (time.monotonic() - self.last_heartbeat_ok))
        log.error("%s: stopping %d frozen attempts (SIGKILL in %.1f s)", why, len(frozen), grace)
        self._fence_stopping += len(frozen)
        for r in frozen.values():
            t = asyncio.create_task(r.stop(FENCED_REASON, grace))
            self._fence_stops.add(t)
            t.add_done_callback(self._fence_stops.discard)

    def _end_fence(self, key_intact: bool) -> None:
        """A heartbeat was stored again. Over the one stored before the fence (`key_intact`):
        the frozen attempts go on where they stood; else (the agent knew of no heartbeat
        stored to check against) they are stopped, and no try the assignment lists is
        started from a record read before this end (`_key_unchecked`): the leader may have
        taken the key's expiry and placed those tries elsewhere, and the record the agent
        reads now may be one written before it did (found by a review: the read when
        heartbeats resumed started them, beside their replacements)."""
        self.fenced = False
        if not key_intact:
            self._stop_frozen("a heartbeat was stored again, but whether the key held could not be checked")
            self._unchecked_ends += 1
            self._key_unchecked = self._unchecked_ends
        # The counters move together, once a fence is over, so that every heartbeat
        # carries whole fences.
        self.fences += 1
        self.last_fence_s = time.monotonic() - self._fenced_at
        self.fence_stopped += self._fence_stopping
        self._fence_stopping = 0
        frozen, self._frozen = self._frozen, {}
        if frozen:
            for r in frozen.values():
                r.thaw()
            self.fence_continued += len(frozen)
            log.warning("heartbeats stored again over the last one before the fence: %d frozen attempts continued",
                        len(frozen))
        else:
            log.warning("heartbeats resumed; reconciling with current assignments")

    # ------------------------------------------------------------ assignments

    def _decoded_alloc(self, data: bytes, what: str) -> HostAlloc | None:
        """An assignment record's `data` decoded; None (counted in `dropped`, said) when it
        does not decode."""
        try:
            return decode(HostAlloc, data, limit=MAX_RECORD_BYTES)
        except DecodeError as exc:
            self.dropped += 1
            log.warning("dropped %s: %s", what, exc)
            return None

    async def _on_assign(self, msg: Msg) -> None:
        alloc = self._decoded_alloc(msg.data, "assignment")
        if alloc is None:
            return
        seq = int((msg.headers or {}).get("Nats-Sequence", "0") or 0)
        # Each assignment is the host's whole list: of those queued one behind another only
        # the newest (the highest revision; the later of equals) is read (found by
        # exploring: an agent continued after a SIGSTOP started a cancelled gang task from
        # an older one, then stopped it). Kept until the queue is read to its end, not
        # dropped: the one behind may be an older revision sent again (a review).
        best = self._newest_queued
        if best is None or seq >= best[1]:
            best = (alloc, seq)
        sub = self._assign_sub
        if sub is not None and sub.pending_msgs > 0:
            self._newest_queued = best
            self.coalesced += 1
            return
        self._newest_queued = None
        await self.reconcile(*best)

    async def _on_output_request(self, msg: Msg) -> None:
        """Answer an API replica's question for a running attempt's output so far."""
        try:
            req = decode(OutputRequest, msg.data)
        except DecodeError as exc:
            self.dropped += 1
            log.warning("dropped output request: %s", exc)
            return
        run = self.runs.get(req.attempt_id)
        tail, written = run.live_tail() if run is not None else ("", 0)
        reply = OutputReply(attempt_id=req.attempt_id, running=run is not None, output_tail=tail, ts=time.time(),
                            written=written)
        try:
            await msg.respond(encode(reply))
        except Exception as exc:  # noqa: BLE001 - the asker is gone, or the link is down
            log.info("output request not answered: %s", exc)

    def _refresh_soon(self) -> None:
        """Read the assignment again in a task of its own: the heartbeat loop must not wait
        for a reconcile, which may be waiting for its note to be written to a slow disk."""
        t = asyncio.create_task(self._refresh_assignments(), name="refresh-assignments")
        self._refreshes.add(t)
        t.add_done_callback(self._refreshes.discard)

    async def _refresh_assignments(self) -> None:
        assert self.store is not None
        unchecked = self._key_unchecked  # this read comes after that unchecked fence's end
        try:
            rec = await self.store.get(subjects.alloc_key(self.config.host_id))
        except StoreError as exc:
            log.warning("cannot read assignments: %s", exc)
            return
        alloc = HostAlloc(host_id=self.config.host_id) if rec.value is None else \
            self._decoded_alloc(rec.value, "assignment record")
        if alloc is None:
            return
        await self.reconcile(alloc, rec.revision)
        if unchecked and self._key_unchecked == unchecked and not self.fenced and rec.revision >= self._newest_seq:
            # What it listed unstarted was handed back (by it, or by a record pushed before
            # it). Records after it list, besides those, only tries placed since the
            # leader heard this host again: it places nothing on a host it has not heard
            # from for two heartbeat intervals, and the fence began as long after the last
            # heartbeat stored. (A read older than a record already given, from a replica
            # behind, clears nothing: the next heartbeat reads again.)
            self._key_unchecked = 0

    async def reconcile(self, alloc: HostAlloc, seq: int) -> None:
        """Make the running attempts match `alloc`."""
        async with self._reconcile_lock:
            await self._reconcile(alloc, seq)

    async def _reconcile(self, alloc: HostAlloc, seq: int) -> None:
        if alloc.host_id != self.config.host_id:
            self.dropped += 1
            log.warning("dropped assignment for another host %s", alloc.host_id)
            return
        again = seq == self.applied_seq and bool(self._unstarted) and seq >= self._newest_seq
        if seq and (seq < self.applied_seq or (seq == self.applied_seq and not again)):
            return  # older than what we applied (the same again only for what it left unstarted)
        if alloc.term < self.max_term:
            self.dropped += 1
            log.warning("refused assignment with stale term %d < %d", alloc.term, self.max_term)
            return
        self._newest_seq = max(self._newest_seq, seq)
        self.max_term = max(self.max_term, alloc.term)
        seen = self._gpu_clears
        if seen is not None:
            rose = sorted(i for i, n in alloc.gpu_clears.items() if n > seen.get(i, 0))
            if rose:
                # Made by the GPU watch (at once for a backend read in line), whose round after
                # it wakes the heartbeat again: the leader learns of the GPUs at once.
                self.gpu_watch.clear(rose)
                log.warning("GPU fault marks cleared by an operator: GPUs %s", rose)
                self._hb_wake.set()
        self._gpu_clears = max_counts(seen or {}, alloc.gpu_clears)
        wanted = {t.attempt_id: t for t in alloc.tasks}
        self._assigned = set(wanted)
        for gone in self._unstarted.keys() - self._assigned:
            del self._unstarted[gone]
        for attempt_id, run in list(self.runs.items()):
            t = wanted.get(attempt_id)
            if t is None or t.stop:
                # A stop from the control plane (cancel, drain, preemption, time limit)
                # says why and may give its own grace between SIGTERM and SIGKILL.
                why = (t.stop_reason or "cancelled") if t is not None else "no longer assigned"
                grace = t.grace_s if t is not None and t.grace_s > 0 else None
                asyncio.create_task(run.stop(why, grace))
        if self.fenced:
            # Never start work while cut off. Nor is the record taken as applied: the
            # read when heartbeats resume (or the leader's resend of the same revision)
            # starts what it lists, which would otherwise stay PLACED for good.
            return
        first, self._applied_once = not self._applied_once, True
        self.applied_seq = max(self.applied_seq, seq)
        to_start: list[Task] = []  # to be noted as seen, then started
        held: list[Task] = []  # noted already (`_unstarted`), to be started
        for t in alloc.tasks:
            if t.attempt_id in self.runs:
                continue
            if first and self._stateless_after and t.attempt_id not in self.seen and not t.stop:
                # This agent started without its host's previous agent's state: the tries
                # it was given may have been started by that one (found by exploring: an
                # agent restarted on a fresh state directory ran the same try again beside
                # what the old one had left). Never started here; reported LOST, run again.
                self._mark_seen(t.attempt_id)
                if time.time() >= self._stateless_until:
                    await self._report_stateless_lost(t)
                else:
                    self._lost_later.append(t)
                continue
            if t.attempt_id in self._unstarted:
                # Noted as seen while a fence began: never started. Started below, with
                # what is noted now, under the same checks (a review: started here, a
                # fence that began during a report above was not seen).
                del self._unstarted[t.attempt_id]
                if t.stop:
                    await self._report(t, AttemptState.KILLED, None, "", "cancelled before it started")
                elif self._key_unchecked:
                    await self._hand_back_unchecked(t)
                else:
                    held.append(t)
                continue
            if t.attempt_id in self.seen:
                if t.attempt_id in self._in_grace:
                    # Being stopped by a previous incarnation, its grace still running: reported
                    # once it has ended (`_let_grace_end`), not while it may still run.
                    self._after_grace[t.attempt_id] = t
                elif t.attempt_id in self._inherited and t.attempt_id not in self._reported_lost:
                    await self._report_inherited(t)
                continue
            if t.stop:
                self._mark_seen(t.attempt_id)  # a restart finds it stopped in the assignment all the same
                await self._report(t, AttemptState.KILLED, None, "", "cancelled before it started")
                continue
            if self.leaving:
                # Shutting down: what the leader placed before it read that this host is
                # leaving is given back unstarted, reported KILLED by the shutdown (requeued
                # at once, not counted as a try). Started now, it would outlive the agent
                # with no one to stop or report it; left assigned, it would wait for the
                # host's return or end LOST, counted, once the host's key expired.
                self._note_handed_back(t.attempt_id)
                await self._report(t, AttemptState.KILLED, None, "", "not started: its agent was shutting down")
                continue
            if self._key_unchecked:
                # Placed before the fence, perhaps replaced since (`_end_fence`): handed back
                # unstarted as the host's (requeued at once, not counted). A report for a try
                # the leader has ended already changes nothing.
                self._note_handed_back(t.attempt_id)
                await self._hand_back_unchecked(t)
                continue
            trouble = self._start_troubled()
            if trouble:
                # The host could not start a try a moment ago (no space, memory, ...): what
                # the leader placed before it read that is given back unstarted (requeued
                # at once, not counted), rather than failing the same way (a review: the
                # retry came straight back here and used up the job's attempts).
                self._note_handed_back(t.attempt_id)
                await self._report(t, AttemptState.KILLED, None, "", f"not started: the host could not start a try "
                                   f"a moment ago ({trouble})", host_trouble=True)
                continue
            to_start.append(t)
        unsaved = await self._mark_seen_off_loop([t.attempt_id for t in to_start]) if to_start else ""
        for t in held:
            await self._start_noted(t)
        for t in to_start:
            if unsaved:
                # Unnoted, a restart of this agent could start it again: handed back unstarted,
                # the host's trouble (its state directory's disk full, say), not the job's.
                self._troubled(unsaved)
                await self._report(t, AttemptState.KILLED, None, "", f"not started: the agent could not note it "
                                   f"({unsaved})", host_trouble=True)
            else:
                await self._start_noted(t)

    async def _report_inherited(self, t: Task, in_grace: bool = False) -> None:
        """Report once a try a previous incarnation of this agent started: stopped by its
        watchdog (which noted it), being stopped by the control plane (the stop is done: what
        it left was killed at start-up, or at the end of its grace; found by exploring, where
        such an attempt was never reported and held its GPUs for good), ended while no agent
        ran (its launcher's record), or its outcome is unknown (any process it left was
        killed at start-up). `in_grace`: left to run to the end of its stop's grace first
        (`_let_grace_end`)."""
        self._reported_lost.add(t.attempt_id)
        mark = watchdog_mark(self._watch_dir / "fenced", t.attempt_id)
        status = self._ended_away.pop(t.attempt_id, None)
        clean = status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        if mark is not None and (mark[1] or not clean):
            # Stopped by the watchdog (what it left, when its task had ended by itself,
            # unless that end was a failure), as a live agent's run says.
            await self._report(t, AttemptState.KILLED, None, "", mark[0])
        elif in_grace and not t.stop:
            # Stopped by the previous agent itself (its shutdown, its fence: the record's
            # `kill:` says a SIGTERM was sent), not by the control plane: the stop's end, as
            # a live agent's run says (KILLED whatever its exit: a task that saved its state
            # and exited 0 has not finished; found by a review, it was reported SUCCEEDED, or
            # FAILED and counted), and the host's doing, not the job's (requeued, uncounted).
            code = None if status is None else os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
            await self._report(t, AttemptState.KILLED, code, "", "stopped by its agent, which restarted in the "
                               "stop's grace; its output was not kept", host_trouble=True)
        elif status is not None and in_grace:
            await self._report(t, *self._ended_while_away(
                t, status, "ended in its grace, its agent having restarted; its output was not kept"))
        elif status is not None:
            await self._report(t, *self._ended_while_away(t, status))
        elif t.stop:
            how = "killed at the end of its grace, its agent having restarted" if in_grace else \
                "killed when its agent restarted"
            await self._report(t, AttemptState.KILLED, None, "", f"{t.stop_reason or 'stopped'} ({how})")
        else:
            await self._report(t, AttemptState.LOST, None, "", "agent restarted; the attempt's outcome is unknown")

    async def _start_noted(self, t: Task) -> None:
        """Start a try noted as seen, unless the shutdown or the fence began while it was
        being noted (or while a report before it was written): the shutdown hands it back
        (as above); the fence holds it, started by the reconcile that comes when heartbeats
        resume (the same record may be applied again for it) or handed back by the
        shutdown; a host in trouble since (it could not start a try) hands it back as the
        host's (a review: a held try was started without that look). No await between the
        look and the start."""
        if self.leaving:
            await self._report(t, AttemptState.KILLED, None, "", "not started: its agent was shutting down")
        elif self.fenced:
            self._unstarted[t.attempt_id] = t
        elif self._key_unchecked:  # an unchecked fence began and ended while it was noted
            await self._hand_back_unchecked(t)
        elif trouble := self._start_troubled():
            await self._report(t, AttemptState.KILLED, None, "", f"not started: the host could not start a try "
                               f"a moment ago ({trouble})", host_trouble=True)
        else:
            self._start(t)

    async def _hand_back_unchecked(self, t: Task) -> None:
        """Hand a try back unstarted after a fence whose end could not check the heartbeat
        key (`_key_unchecked`): KILLED as the host's, requeued at once, not counted."""
        await self._report(t, AttemptState.KILLED, None, "", UNCHECKED_REASON, host_trouble=True)

    async def _hand_back_unstarted(self) -> None:
        """The shutdown: what a fence held unstarted is handed back (KILLED, not counted;
        the report is kept on disk if it cannot be delivered now)."""
        held, self._unstarted = self._unstarted, {}
        for t in held.values():
            await self._report(t, AttemptState.KILLED, None, "", "not started: its agent was shutting down")

    def _start(self, t: Task) -> None:
        """Start an attempt noted as seen (`_mark_seen`)."""
        run = Run(t, self._on_run_state, kill_grace_s=self.config.kill_grace_s,
                  fenced_dir=self._watch_dir / "fenced", isolation=self.isolation, host_id=self.config.host_id,
                  mps=bool(t.gpu_share) and mps_running(),
                  shared_user=mps_reached(t.gpu_share, bool(t.gpu_indices or t.mig or t.gpu_share)),
                  run_file=self._run_file(t.attempt_id))
        self.runs[t.attempt_id] = run
        run.start()

    def _poll_gpu_faults(self) -> None:
        """Take in the faults the GPU watch found since it was last asked (each is handed
        over once; the GPU stays unhealthy in every later heartbeat). Never waits."""
        for fault in self.gpu_watch.take_faults():
            log.error("GPU %d fault: %s", fault.index, fault.describe())
            self._fault_at = time.monotonic()
            self._hb_wake.set()

    @property
    def gpu_faults(self) -> dict[int, str]:
        """The GPUs the backend holds faulted (until an operator clears them): index -> the
        fault, as the GPU watch's latest snapshot shows them. The backend's marks are the one
        record of them."""
        return self.gpu_watch.snapshot().faulted()

    async def _heartbeat_since(self, t0: float) -> None:
        """Wait, two heartbeat intervals at most, until a heartbeat sent after `t0` (monotonic)
        was stored: the leader then learns of a GPU fault before the report of the task it
        ended, and does not place the job's next try on that GPU."""
        deadline = time.monotonic() + 2 * self.config.heartbeat_interval_s
        self._hb_wake.set()
        while self.last_heartbeat_ok < t0 and not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("no heartbeat stored since a GPU fault: reporting the task's end without it")
                return
            self._hb_stored.clear()
            await pause(self._hb_stored, left)

    async def _task_gpu_fault(self, t: Task) -> str:
        """The faults of the GPUs `t` holds (whole, shared, or under its MIG instance), from
        a reading begun after it ended (its GPU may have faulted a moment ago), waited for
        GPU_LOOK_S at most: with NVML hung, the last reading says."""
        await self.gpu_watch.fresh(GPU_LOOK_S)
        self._poll_gpu_faults()
        snap = self.gpu_watch.snapshot()
        faults = snap.faulted()
        if not faults:
            return ""
        held = set(t.gpu_indices)
        if t.mig:
            held.update(g.index for g in snap.inventory for m in g.mig if m.uuid in t.mig)
        return "; ".join(f"GPU {i} faulted ({faults[i]})" for i in sorted(held & faults.keys()))

    async def _on_run_state(
        self, t: Task, state: AttemptState, code: int | None, tail: str, reason: str
    ) -> None:
        run = self.runs.get(t.attempt_id)
        if run is not None and run.host_trouble and state.terminal:
            self._troubled(run.host_trouble)
        if state is AttemptState.RUNNING and run is not None and run.proc is not None:
            self._started_since_trouble = True
            try:
                self._record_run(t.attempt_id, run.group_pid, t.keep_running, run.cgroup_paths, run.work_dir,
                                 launcher=run.proc.pid)
            except Exception as exc:  # noqa: BLE001 - whatever it was, the try is unrecorded
                # Unrecorded, the watchdog could not stop it were this agent frozen or cut
                # off (and a restarted agent would not know it): it is stopped, and says why
                # (found by a review: the error ended the run's task, and the attempt was
                # never reported ended, its GPUs held for good; by exploring: a process name
                # that was not text made another error, and the try ran on unrecorded).
                why = f"the agent could not record it for its watchdog ({exc})"
                log.error("attempt %s: %s: stopping it", t.attempt_id, why)
                if isinstance(exc, OSError) and exc.errno in HOST_ERRNOS:  # (its disk full: the host's want)
                    run.host_trouble = str(exc)
                    self._troubled(run.host_trouble)
                asyncio.create_task(run.stop(why))
        # Terminal: the report is kept on disk (until delivered) before the run is
        # forgotten, so that a restart finds one or the other.
        fault = await self._task_gpu_fault(t) if state is AttemptState.FAILED else ""
        if fault:
            await self._heartbeat_since(self._fault_at)
        await self._report(t, state, code, tail, reason, gpu_fault=fault,
                           gpu_util_pct=run.gpu_util_pct if run is not None and state.terminal else None,
                           host_trouble=run is not None and bool(run.host_trouble))
        if state.terminal:
            self.runs.pop(t.attempt_id, None)
            self._forget_run(t.attempt_id)

    # ------------------------------------------------------------ status reports

    async def _report(self, t: Task, state: AttemptState, code: int | None, tail: str, reason: str,
                      gpu_fault: str = "", gpu_util_pct: float | None = None, host_trouble: bool = False) -> None:
        r = StatusReport(
            host_id=self.config.host_id, attempt_id=t.attempt_id, job_id=t.job_id, state=state,
            exit_code=code, output_tail=tail, ts=time.time(), term=t.term, reason=reason,
            gpu_fault=gpu_fault[:512], shutdown=self.leaving and state is AttemptState.KILLED,
            gpu_util_pct=gpu_util_pct, host_trouble=host_trouble and state is AttemptState.KILLED,
            instance=self.instance,
        )
        msg_id = f"{r.attempt_id}:{r.state.value}"
        if state.terminal:
            try:
                # In a thread: its fsync may take seconds on a busy disk (see _mark_seen_off_loop).
                await asyncio.to_thread(self._persist_unsent, r, msg_id)
            except OSError as exc:
                log.warning("cannot keep the report of %s on disk: %s", r.attempt_id, exc)
        self._reports.append((r, msg_id))
        self._report_wake.set()

    def _resend_unapplied(self, now: float) -> int:
        """Report again the end of attempts the assignment still lists `resend_after_s`
        after the STATUS stream took the report. The leader normally drops an ended
        attempt from the host's assignment within a cycle; one still there was not
        applied (e.g. a new leader whose view lagged took the report as stale): the
        report is idempotent, so sending it again is safe and heals that for good."""
        n = 0
        for attempt_id in self._assigned & self._ended.keys():  # the assignment is the short list
            r, at = self._ended[attempt_id]
            if now - at >= self.config.resend_after_s:
                self.resent += 1
                n += 1
                self._ended[attempt_id] = (r, now)
                self._reports.append((r, f"{r.attempt_id}:{r.state.value}:resent{self.resent}"))
        if n:
            log.warning("%d ended attempts still assigned to this host: reporting them again", n)
            self._report_wake.set()
        return n

    async def _report_loop(self) -> None:
        """Deliver status reports in order, retrying until each is acknowledged."""
        assert self.store is not None
        subject = subjects.status_subject(self.config.host_id)
        while True:
            if not self._reports:
                if self._stop.is_set():
                    return
                self._report_wake.clear()
                try:
                    await asyncio.wait_for(self._report_wake.wait(), timeout=0.5)
                except TimeoutError:
                    pass
                continue
            r, msg_id = self._reports[0]
            try:
                await self.store.js.publish(subject, encode(r), headers={"Nats-Msg-Id": msg_id}, timeout=2)
                self._reports.popleft()
                if r.state.terminal:
                    (self._unsent_dir / r.attempt_id).unlink(missing_ok=True)
                    self._forget_end(r.attempt_id)
                    self._ended[r.attempt_id] = (r, time.monotonic())
                    self._ended.move_to_end(r.attempt_id)
                    while len(self._ended) > ENDED_KEPT:
                        self._ended.popitem(last=False)
            except Exception as exc:  # noqa: BLE001
                log.warning("status report not delivered yet: %s", exc)
                if self._stop.is_set():
                    return
                await asyncio.sleep(0.5)

    def _forget_end(self, attempt_id: str) -> None:
        """Once the STATUS stream took a try's end: its launcher's record of it and the
        watchdog's mark of its stop go, which a restart before would read the end from (found
        by exploring: removed before the report was kept, an agent killed in between left the
        next one nothing to go by, and a try that had succeeded was reported LOST and run
        again; removed once kept, a report that could not be kept on a full disk left the
        same, a review)."""
        self._ended_away.pop(attempt_id, None)
        self.isolation.forget_exit(attempt_id)
        (self._watch_dir / "fenced" / attempt_id).unlink(missing_ok=True)

    async def _report_stateless_lost(self, t: Task) -> None:
        await self._report(t, AttemptState.LOST, None, "", f"agent restarted without its state (the previous agent, "
                                                           f"instance {self._stateless_after}, may have started it)")

    async def _lost_when_the_old_key_would_expire(self) -> None:
        """Report LOST what the first assignment listed of a previous agent whose state this
        one has not, once that agent's key would have expired (none if this one stops first:
        the next finds them noted as seen, and reports them as a restart does)."""
        if await pause(self._stop, max(0.0, self._stateless_until - time.time())):
            return
        while self._lost_later:
            await self._report_stateless_lost(self._lost_later.pop(0))

    # ------------------------------------------------------------ lifecycle

    async def run(self, stop: asyncio.Event | None = None) -> None:
        external = stop or asyncio.Event()
        self.isolation.log_start()
        self._check_creds()
        self._lock_state_dir()
        try:
            await self._run(external)
        finally:
            self._unlock_state_dir()

    async def _run(self, external: asyncio.Event) -> None:
        # The state directory is this agent's (locked): what a previous incarnation left in
        # it is killed, and the watchdog watches this one.
        self._previous_heard = self._last_alive()
        self._touch_alive()
        self._previous_instance = self._take_instance()
        self._state_watch.mark()
        # What ended while no agent ran is read before anything left is killed (the end of
        # what this start kills is no task's own end).
        self._ended_away = self.isolation.ended_while_away()
        self.killed_leftovers = self._kill_leftovers()
        # A task that ended by itself in between (its launcher killed first, none that this
        # start killed has its end written): its end too, read again.
        killed = set(self.killed_leftovers)
        for attempt_id, status in self.isolation.ended_while_away().items():
            if attempt_id in killed and attempt_id not in self._ended_away:
                self.isolation.forget_exit(attempt_id)  # this start's kill: no task's own end
            else:
                self._ended_away.setdefault(attempt_id, status)
        self._grace_tasks = [asyncio.create_task(self._let_grace_end(a, r), name=f"grace-{a}")
                             for a, r in list(self._in_grace.items())]
        self.isolation.remove_empty_leftovers()
        # The GPU watch's news (a fault found, a clear made) wakes the heartbeat; its first
        # reading is waited for, before anything runs (bounded: a hung NVML is then said in
        # the heartbeats, `_note_gpu_stall`).
        loop = asyncio.get_running_loop()

        def gpu_news() -> None:  # on the GPU watch's thread
            loop.call_soon_threadsafe(self._hb_wake.set)

        self.gpu_watch.on_news = gpu_news
        await self.gpu_watch.fresh(self._gpu_stale_after_s)
        self._start_watchdog()

        async def on_reconnect() -> None:
            log.info("reconnected to NATS")
            self._refresh_soon()

        # Credentials: AgentConfig.nats_creds/... when present, else MUSTER_NATS_CREDS etc.
        # (read by connect()). The per-host inbox prefix is what the agent's NATS
        # permissions allow it to subscribe to (server/natsauth.py).
        nc = await connect(self.config.nats_url, name=f"muster-agent-{self.config.host_id}",
                           reconnected_cb=on_reconnect,
                           creds=getattr(self.config, "nats_creds", None),
                           tls_ca=getattr(self.config, "nats_ca", None),
                           tls_cert=getattr(self.config, "nats_cert", None),
                           tls_key=getattr(self.config, "nats_key", None),
                           inbox_prefix=agent_inbox_prefix(self.config.host_id))
        self.store = Store(nc)
        other = ""
        for _ in range(CLAIM_TRIES):
            other, rev = await self._another_agent(external)
            if other or external.is_set() or await self._claim(rev):
                break
        else:
            other = (f"host {self.config.host_id}'s heartbeat key was written by someone else at each of "
                     f"{CLAIM_TRIES} tries to claim it")
        if other or external.is_set():
            # Nothing was started: let go of what this agent took (another runs as this host);
            # what was left in its grace is killed now, as any leftover.
            for g in self._grace_tasks:
                g.cancel()
            await asyncio.gather(*self._grace_tasks, return_exceptions=True)
            await self._disconnect()
            await self.gpu_watch.aclose(GPU_CLOSE_S)
            self._stop_watchdog()
            if self._tmp_dir is not None:
                remove_tree(self._tmp_dir)
            if not other:
                return
            raise ConfigError(f"{other}: not starting a second agent as host {self.config.host_id} (the two would "
                              "run the host's work twice); stop the other, or give this one its own host id")
        # The fence counts from here, not from the wait above: nothing has run yet, and a
        # wait as long as the fence delay made it freeze, then stop, what it was just given
        # (found by a review).
        self.last_heartbeat_ok = time.monotonic()
        self._touch_alive()
        sub = self._assign_sub = await nc.subscribe(subjects.assign_subject(self.config.host_id),
                                                    cb=self._on_assign, pending_msgs_limit=10_000)
        await nc.subscribe(subjects.output_subject(self.config.host_id), cb=self._on_output_request,
                           pending_msgs_limit=1_000)
        await self._refresh_assignments()
        tasks = [
            asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
            asyncio.create_task(self._fence_loop(), name="fence"),
            asyncio.create_task(self._report_loop(), name="reports"),
        ]
        if self._stateless_after:
            tasks.append(asyncio.create_task(self._lost_when_the_old_key_would_expire(), name="stateless-lost"))
        log.info("agent %s up (%s GPUs%s)", self.config.host_id, len(self.gpu_watch.snapshot().inventory),
                 ", simulated" if self.gpus.simulated else "")
        await external.wait()
        await self.shutdown(tasks, sub)

    async def shutdown(self, tasks: list[asyncio.Task[None]], sub: object) -> None:
        """Say in a heartbeat that this host is leaving (the leader places nothing more on
        it, and no new attempt starts here), stop running attempts (they are reported
        KILLED) while heartbeats and reports still go out, deliver those reports, then
        stop heartbeating and drain the connection.

        Heartbeats go on until the attempts have stopped: an attempt's grace (its
        checkpoint window) may be longer than the heartbeat key's TTL, and a host whose
        key expired is LOST, its attempts ended LOST and counted against their jobs'
        tries, where a stop by the agent's shutdown is not counted."""
        self.leaving = True
        self._hb_wake.set()
        try:  # without a link the leader learns it when the key expires
            await asyncio.wait_for(self._leaving_stored.wait(), timeout=min(5.0, 2 * self.config.heartbeat_interval_s))
        except TimeoutError:
            log.warning("shutting down before a heartbeat saying so was stored")
        # A reconcile under way (its note being written) ends first, bounded: a disk that
        # hangs must not hang the shutdown (a review: the connection's close cut it short,
        # and the try it was starting was reported LOST by the next agent, never run).
        try:
            await asyncio.wait_for(self._reconcile_lock.acquire(), timeout=RECONCILE_AT_SHUTDOWN_S)
        except TimeoutError:
            log.warning("shutting down while an assignment is still being applied (its note not written)")
        else:
            try:
                await self._hand_back_unstarted()
            finally:
                self._reconcile_lock.release()
        for t in list(self._refreshes):
            t.cancel()
        await asyncio.gather(*(r.stop("agent shutting down") for r in list(self.runs.values())))
        await asyncio.gather(*(r.wait() for r in list(self.runs.values())), return_exceptions=True)
        # A try left in its grace by the previous incarnation ends by that grace's end too.
        await asyncio.gather(*self._grace_tasks, return_exceptions=True)
        await self._reports_sent(REPORTS_AT_SHUTDOWN_S)
        self._stop.set()
        self._hb_wake.set()
        self._hb_stored.set()
        try:
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=10)
        except TimeoutError:
            for t in tasks:
                t.cancel()
        assert self.store is not None
        try:
            await self._disconnect()
        finally:  # what is the host's is let go of whatever became of the link
            await self.gpu_watch.aclose(GPU_CLOSE_S)
            self._stop_watchdog()
            self.isolation.close()
            if self._tmp_dir is not None:
                remove_tree(self._tmp_dir)

    async def _disconnect(self) -> None:
        """Drain the NATS connection, or close it where it cannot be drained (NATS is gone:
        a drain raises while reconnecting, and a close may raise too: found by exploring, an
        agent stopped while its NATS was down ended with a traceback, its clean-up not run)."""
        assert self.store is not None
        try:
            await asyncio.wait_for(self.store.nc.drain(), timeout=5)
            return
        except Exception as exc:  # noqa: BLE001
            log.debug("NATS connection not drained (%s); closing it", exc)
        try:
            await asyncio.wait_for(self.store.nc.close(), timeout=5)
        except Exception as exc:  # noqa: BLE001
            log.warning("NATS connection not closed cleanly: %s", exc)

    async def _reports_sent(self, timeout_s: float) -> None:
        """Wait until every status report is delivered, `timeout_s` at most (an undelivered
        one stays on disk for the next start)."""
        deadline = time.monotonic() + timeout_s
        while self._reports and time.monotonic() < deadline:
            self._report_wake.set()
            await asyncio.sleep(0.05)
        if self._reports:
            log.warning("%d status report(s) not delivered before shutdown; kept for the next start",
                        len(self._reports))

    def _lock_state_dir(self) -> None:
        """Hold the state directory's lock while running: a second agent of this host on
        the same directory would kill the first one's attempts as leftovers of its own."""
        path = self._state_watch.lock
        try:
            self._lock_fd = take_lock(path)
        except OSError:
            raise ConfigError(f"another agent of host {self.config.host_id} runs with the state directory "
                              f"{path.parent}: not starting a second") from None

    def _lock_again(self) -> None:
        """Hold the lock of a lock file made again (the one held was removed, or replaced):
        the lock of the one removed keeps out no agent started later. Raises OSError (the
        lock of the new one is another process's: an agent started on the directory while
        it was gone, which finds this one's heartbeats in the key and stops)."""
        if self._state_watch.lock_held(self._lock_fd):
            return
        fd = take_lock(self._state_watch.lock)
        old, self._lock_fd = self._lock_fd, fd
        if old is not None:
            os.close(old)

    def _unlock_state_dir(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # the lock goes with it
            self._lock_fd = None

    async def _another_agent(self, stop: asyncio.Event) -> tuple[str, int | None]:
        """Whether another agent process runs as this host: its heartbeats are in the key,
        and go on being stored for a heartbeat interval and a second (one that stopped, a
        previous incarnation of this agent, stores none); what it is, or "" when none does,
        and the key's revision last read (None when it could not be read)."""
        assert self.store is not None

        ttl_s: list[float] = []  # the other's heartbeat's TTL, as stored with it

        async def other() -> tuple[int | None, Heartbeat | None]:
            try:
                rec = await self.store.get(self.config.host_id, bucket=subjects.HOSTS_BUCKET,  # type: ignore[union-attr]
                                           with_headers=True)
            except StoreError as exc:
                log.warning("cannot read this host's heartbeat key to look for another agent: %s", exc)
                return None, None
            try:
                hb = decode(Heartbeat, rec.value) if rec.value else None
            except DecodeError:
                return rec.revision, None
            ttl = stored_ttl_s(rec.headers)
            if ttl is not None:
                ttl_s.append(ttl)
            return rec.revision, hb if hb is not None and hb.instance != self.instance else None

        rev, hb = await other()
        if hb is None:
            return "", rev
        if self._previous_instance and hb.instance == self._previous_instance:
            # This host's last agent on this state directory, whose lock this one now holds:
            # it has stopped. Waiting to see whether it still runs let the key expire after a
            # restart a few seconds late, the host go LOST and what had ended meanwhile run
            # again (found by exploring).
            log.info("host %s's key holds the heartbeat of its previous agent (instance %s), which has stopped",
                     self.config.host_id, hb.instance)
            return "", rev
        if hb.instance:  # not the last agent of this state directory: what it started is not known here
            self._stateless_after = hb.instance
            # When its key expires by the TTL it was stored with (found by exploring: this
            # agent's own, shorter after a change of settings, had its tries reported LOST
            # before the other's watchdog stopped them); this agent's where none was read.
            ttl = ttl_s[0] if ttl_s else self.config.heartbeat_interval_s * self.config.ttl_intervals
            self._stateless_until = hb.ts + max(ttl, self.config.heartbeat_interval_s * self.config.ttl_intervals)
        log.info("host %s's key holds a heartbeat of another agent (instance %s): waiting %.0f s to see whether "
                 "it runs", self.config.host_id, hb.instance or "unknown", self.config.heartbeat_interval_s + 1)
        if await pause(stop, self.config.heartbeat_interval_s + 1):
            return "", None
        later_rev, later = await other()
        if later is None or later_rev == rev:
            return "", later_rev
        return (f"another agent (instance {later.instance or 'unknown'}, version {later.agent_version or 'unknown'}) "
                f"heartbeats as host {self.config.host_id}"), later_rev

    def _take_instance(self) -> str:
        """The instance of the last agent that ran on this state directory (read from
        `<host>.instance`, "" when none), which this one's replaces there. Called once the
        directory's lock is held: that agent has stopped."""
        path = self._instance_file
        if path is None:
            return ""
        try:
            previous = path.read_text().strip()
        except OSError:
            previous = ""
        try:
            # Whole and durable: one written over in place and cut short by a crash (or lost
            # with the machine) left the next start without it, on the stateless path.
            write_durably(path, (self.instance + "\n").encode())
        except OSError as exc:
            log.warning("cannot write %s: %s (a restart will wait to see whether this agent still runs)", path, exc)
        return previous

    async def _claim(self, rev: int | None) -> bool:
        """Store this agent's first heartbeat only over the key's revision `rev` that
        `_another_agent` last read: of two agents of one host started at the same instant,
        both of which found no other's heartbeat, only one is stored; the other is refused
        and looks again (False), and then finds the first one's. The heartbeats after it go
        on from it (`_hb_rev`). True also when the outcome is unknown (the key unread, the
        link down): the first heartbeat of the loop then goes unconditionally, as before."""
        assert self.store is not None
        if rev is None:
            return True
        hb = self.heartbeat()
        headers = {"Nats-TTL": self._heartbeat_ttl(), SHAPE_HEADER: shape_digest(hb),
                   "Nats-Expected-Last-Subject-Sequence": str(rev)}
        sent = time.monotonic()
        try:
            ack = await self.store.js.publish(subjects.kv_subject(subjects.HOSTS_BUCKET, self.config.host_id),
                                              encode(hb), headers=headers,
                                              timeout=min(2.0, self.config.heartbeat_interval_s))
        except jserrors.APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                log.warning("host %s's heartbeat key was written since it was read: looking again for another "
                            "agent of this host", self.config.host_id)
                return False
            log.warning("first heartbeat not stored (%s): going on", exc)
            return True
        except Exception as exc:  # noqa: BLE001 - the link is down: the heartbeat loop tries again
            log.warning("first heartbeat not stored (%s): going on", exc)
            return True
        self.last_heartbeat_ok, self._hb_rev = sent, ack.seq
        self._hb_stored.set()
        return True

    def _heartbeat_ttl(self) -> str:
        """The heartbeat key's TTL (`Nats-TTL`: whole seconds, at least 1): rounded up, so
        that the key lives at least as long as the fence and the watchdog assume (found by
        exploring: 0.5 s x 3 was sent as 1 s, and the key expired before the watchdog had
        stopped the frozen agent's tries)."""
        return f"{max(1, math.ceil(self.config.heartbeat_interval_s * self.config.ttl_intervals - 1e-9))}s"

    def _check_creds(self) -> None:
        """Say so when the agent's NATS credentials are open to the task user."""
        for path in (self.config.nats_creds or os.environ.get("MUSTER_NATS_CREDS"), self.config.nats_key):
            if not path:
                continue
            try:
                st = os.stat(path)
            except OSError:
                continue
            user = self.isolation.user
            if (st.st_mode & 0o004 or (st.st_mode & 0o040 and st.st_gid in user.groups)
                    or (user.switches and st.st_uid == user.uid)):
                log.error("%s (mode %o, owner uid %d) may be read by tasks: make it private to the agent's "
                          "user (chmod 600)", path, st.st_mode & 0o777, st.st_uid)

    # ------------------------------------------------------------ watchdog

    def watchdog_timing(self) -> tuple[float, float, float]:
        c = self.config
        return watchdog_timing(c.fence_after_s, c.heartbeat_interval_s * c.ttl_intervals, c.kill_grace_s)

    def _last_alive(self) -> float | None:
        """When the agent that wrote the watchdog's `alive` file last had a heartbeat stored
        (monotonic: this boot's; None if the file is missing or unreadable)."""
        try:
            return float((self._watch_dir / "alive").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            return None

    def _touch_alive(self) -> None:
        """Show the watchdog a heartbeat was stored: write this agent's pid (which agent
        wrote) and when that heartbeat was sent (monotonic, the clock the watchdog reads)."""
        path = self._watch_dir / "alive"
        try:
            self._in_watch_dir(lambda: path.write_text(f"{os.getpid()} {self.last_heartbeat_ok:.3f}\n"))
        except OSError as exc:
            log.warning("cannot write %s: %s (the watchdog will stop this host's attempts)", path, exc)

    def _touch_awake(self) -> None:
        """Show the watchdog this agent is running its fence loop (and so fences itself)."""
        try:
            self._in_watch_dir((self._watch_dir / "awake").touch)  # its time is what the watchdog reads
        except OSError:
            pass  # the watchdog then treats a silent agent as asleep: SIGTERM at stale_after

    def _in_watch_dir(self, write: Callable[[], object]) -> None:
        """`write` a file of the watchdog's directory, made again first if it is gone
        (found by exploring: removed by hand, it was never made again, and the watchdog
        stopped every try of a healthy agent, new ones too). Raises OSError."""
        try:
            write()
        except FileNotFoundError:
            own_dir(self._watch_dir)
            write()

    def _start_watchdog(self) -> None:
        stale_after, grace, deadline = self.watchdog_timing()
        # A session of its own: it must outlive this process, and not get its signals.
        self._watchdog = subprocess.Popen(
            [sys.executable, "-I", "-S", WATCHDOG, str(self._watch_dir), str(self._runs_dir), str(os.getpid()),
             str(stale_after), str(grace), str(deadline), *self.isolation.cgroup_bases()],
            stdin=subprocess.DEVNULL, start_new_session=True)

    def _keep_watchdog(self) -> None:
        """Start the watchdog again if it died (killed by hand, or by the OOM killer)."""
        if self._watchdog is not None and self._watchdog.poll() is not None:
            log.warning("the watchdog exited (code %s); starting it again", self._watchdog.returncode)
            self.watchdog_restarts += 1
            self._start_watchdog()

    def _stop_watchdog(self) -> None:
        if self._watchdog is None:
            return
        self._watchdog.terminate()
        try:
            self._watchdog.wait(5)
        except subprocess.TimeoutExpired:
            self._watchdog.kill()
            self._watchdog.wait()
        self._watchdog = None

    def status_json(self) -> str:
        return json.dumps({"host": self.config.host_id, "running": sorted(self.runs), "term": self.max_term})
