"""Runs one task attempt as a real subprocess: environment, GPU visibility, output tail,
and a staged stop (SIGTERM, grace period, SIGKILL to the whole attempt). An attempt the
agent's watchdog stopped (agent.watchdog) ends KILLED with its reason.

The attempt is started through the launcher (agent.launch) as its isolation prescribes
(agent.isolation: task user, clean environment, working directory, cgroup). When its
first process exits, whatever it left behind is killed (the whole cgroup, else its
process group), so that nothing of an ended attempt runs on or holds its output pipe."""

from __future__ import annotations

import asyncio
import codecs
import errno
import logging
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from agent import cgroups
from agent.isolation import (
    LAUNCH_ENV,
    MIN_MEMORY_LIMIT_MB,
    OOM_REASON,
    Isolation,
    Launch,
    clean_env,
    task_end,
    task_facts,
)
from agent.watchdog import LEFTOVERS_ONLY, exited, put_run, read_run, start_time
from wire.messages import GPU_IDLE_UTIL_PCT, AttemptState, Task
from wire.owndir import own_dir

# The launcher's failures that are the host's begin with this (agent/launch.py).
HOST_FAILURE = "host: "
TASK_PID_LINE = re.compile(r"^pid: (\d+)\n")  # agent/launch.py's TASK_PID line (written before anything else)
# Errors that are the host's want, not the job's fault (a try that cannot be recorded: Agent._on_run_state).
HOST_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.EAGAIN, errno.EMFILE, errno.ENFILE,
                         errno.EIO, errno.EROFS})

# A decoding error handler: each byte that is not UTF-8 becomes one "?" (Run.tail).
BYTE_FOR_BYTE = "muster-byte-for-byte"
codecs.register_error(BYTE_FOR_BYTE, lambda e: ("?" * (e.end - e.start), e.end))  # type: ignore[attr-defined]

log = logging.getLogger(__name__)

TAIL_BYTES = 4096
# How long the output of an attempt whose process exited is still read (what escaped a
# stop without cgroups may hold the pipe for ever).
PIPE_AFTER_EXIT_S = 2.0


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Tells when the process exits, even while something it left holds its output
    (`Process.wait()` also waits for the pipes)."""

    def __init__(self, exited: asyncio.Event, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=2**16, loop=loop)
        self.exited = exited

    def process_exited(self) -> None:
        super().process_exited()
        self.exited.set()


def gpu_env(task: Task, mps: bool, agent_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a task's process is told of its GPUs. Whole GPUs and a share of one:
    CUDA_VISIBLE_DEVICES lists their indices (in PCI bus order, as NVML counts them); a MIG
    instance: CUDA_VISIBLE_DEVICES=MIG-<uuid>. A shared task runs beside the other tasks
    on its GPU, time-sliced and not isolated; where CUDA MPS runs on the host (`mps`), its
    share becomes CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (rounded up to a whole percent) and its
    GPU memory CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (for device 0, the one device it sees),
    with the MPS pipe directory the agent found MPS in (`agent_env`, default the agent's
    environment), which the task's clean environment would otherwise lack."""
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if task.mig:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(u if u.startswith("MIG-") else f"MIG-{u}" for u in task.mig)
        return env
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in task.gpu_indices)
    if task.gpu_share:
        env["MUSTER_GPU_SHARE"] = str(task.gpu_share)  # thousandths of the GPU
        if mps:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, -(-task.gpu_share // 10)))
            if task.gpu_memory_mb:
                env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={task.gpu_memory_mb}M"
            pipe = (os.environ if agent_env is None else agent_env).get("CUDA_MPS_PIPE_DIRECTORY")
            if pipe:
                env["CUDA_MPS_PIPE_DIRECTORY"] = pipe
    return env


def watchdog_mark(fenced_dir: Path, attempt_id: str) -> tuple[str, bool] | None:
    """When the agent's watchdog stopped the attempt (it leaves `fenced/<attempt>` behind,
    which the agent removes once the STATUS stream took the report it goes into:
    `Agent._forget_end`): the stop reason, and whether it signalled the attempt's first
    process (False: that had exited already, and only what it left behind was stopped).
    None when it did not."""
    try:
        silent, *what = (fenced_dir / attempt_id).read_text().split()
    except (OSError, ValueError):
        return None
    reason = f"fenced: stopped by the agent's watchdog after {silent} s without a heartbeat from the agent"
    return reason, what != [LEFTOVERS_ONLY]


class Run:
    def __init__(
        self,
        task: Task,
        on_state: Callable[[Task, AttemptState, int | None, str, str], Awaitable[None]],
        kill_grace_s: float = 10.0,
        base_env: dict[str, str] | None = None,
        fenced_dir: Path | None = None,
        mps: bool = False,
        isolation: Isolation | None = None,
        host_id: str = "",
        shared_user: bool = False,
        run_file: Path | None = None,
    ) -> None:
        self.task = task
        # Where the try is recorded for the agent's watchdog and a restarted agent: its
        # launcher writes it before the task runs (agent/launch.py).
        self.run_file = run_file
        self.mps = mps  # CUDA MPS runs on the host: a shared task gets its limits
        # It runs as the task user itself, not its job's uid (a GPU task where CUDA MPS runs).
        self.shared_user = shared_user
        self.fenced_dir = fenced_dir  # where the agent's watchdog notes the attempts it stopped
        self.on_state = on_state
        self.kill_grace_s = kill_grace_s
        self.base_env = base_env if base_env is not None else clean_env()
        self.isolation = isolation
        self.host_id = host_id
        self.proc: asyncio.subprocess.Process | None = None  # the launcher
        self.task_pid = 0  # the task's first process, when the launcher stays its parent (group_pid)
        self._running = False  # the command runs (the launcher has said which process is the task)
        self._freeze_early = False  # frozen before that: applied once it runs
        self.launch: Launch | None = None
        self._tail = bytearray()
        self.written = 0  # bytes the attempt's process wrote in all (the tail is their last ones)
        self.host_trouble = ""  # why it could not start for want of the host's resources (Run._run)
        self.stop_reason: str | None = None
        self.signaled = False  # a stop signal really reached the process
        self._stopping: asyncio.Future[None] | None = None  # the stop under way
        self.frozen = False  # SIGSTOPped by the agent's fence (freeze), not yet continued
        self.cgroup_frozen = False  # and its cgroup frozen by the kernel freezer
        self._kill_at: float | None = None  # when it sends SIGKILL (monotonic)
        self._early_grace: float | None = None  # the grace of a stop made while it was being started
        self._kill_at_moved = asyncio.Event()
        self.started_at: float | None = None
        # Its GPUs' utilisation, sampled at each heartbeat while it runs (`sample_gpus`), and
        # since when every sample found all of them idle (None: the last did not).
        self.gpu_util_sum = 0.0
        self.gpu_util_samples = 0
        self.gpu_idle_since: float | None = None
        self.done = asyncio.Event()
        self._exited = asyncio.Event()
        self._transport: asyncio.SubprocessTransport | None = None
        self._task: asyncio.Task[None] | None = None

    def live_tail(self) -> tuple[str, int]:
        """The tail as a running process's output is shown (`liveOutput`) and the bytes
        written up to its end (`liveOutputBytes`): a character its process has written only
        part of so far is held back, counted neither, and shown whole at a later look (found
        by exploring: split between two looks, `job logs -f` printed "??" and then a
        replacement character)."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors=BYTE_FOR_BYTE)
        text = decoder.decode(bytes(self._tail), final=False)
        held = len(decoder.getstate()[0])
        return text, self.written - held

    @property
    def tail(self) -> str:
        """The last bytes written, as text: a byte that is not UTF-8 is a "?" each, so that
        the text is as many bytes as the output it shows, and two looks' byte counts tell
        where the new part begins (`muster job logs -f`; found by exploring: with U+FFFD,
        three bytes for one, that much real output before each was dropped)."""
        return self._tail.decode("utf-8", errors=BYTE_FOR_BYTE)

    def sample_gpus(self, util_by_index: dict[int, float], now: float) -> None:
        """One sample, at `now`, of how busy its GPUs are (their mean utilisation, as the
        heartbeat reports it: for a share, the whole GPU's), taken while its process runs;
        none for a task without GPUs or on a MIG instance (NVML gives no utilisation per
        instance), nor when one of its GPUs is missing from `util_by_index` (its utilisation
        not read: `gpuwatch.util_by_index`), which ends an idle stretch: idle is seen at every
        sample of it (a review: a stretch begun before NVML stopped answering grew on, and
        raised `job.gpus_idle` from unknown figures). All of them under GPU_IDLE_UTIL_PCT:
        idle since this sample, unless since an earlier one."""
        t = self.task
        if self.proc is None or self.proc.returncode is not None or not t.gpu_indices or t.mig:
            return
        got = [util_by_index[i] for i in t.gpu_indices if i in util_by_index]
        if len(got) != len(t.gpu_indices):
            self.gpu_idle_since = None
        else:
            self.gpu_util_sum += sum(got) / len(got)
            self.gpu_util_samples += 1
            if max(got) < GPU_IDLE_UTIL_PCT:
                self.gpu_idle_since = self.gpu_idle_since if self.gpu_idle_since is not None else now
            else:
                self.gpu_idle_since = None

    @property
    def gpu_util_pct(self) -> float | None:
        """Its GPUs' mean utilisation over the samples taken (None: none was)."""
        if not self.gpu_util_samples:
            return None
        return round(min(100.0, max(0.0, self.gpu_util_sum / self.gpu_util_samples)), 1)

    @property
    def cgroup_paths(self) -> list[str]:
        return list(self.launch.group.paths) if self.launch is not None and self.launch.group is not None else []

    @property
    def work_dir(self) -> str | None:
        """The directory made for the attempt (None: the job's cwd, or none made)."""
        return str(self.launch.work_dir) if self.launch is not None and self.launch.work_dir is not None else None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"run-{self.task.attempt_id}")

    def env(self) -> dict[str, str]:
        """The attempt's environment: a clean base, the job's env, then the facts the agent
        sets (agent.isolation). Nothing of the agent's own environment."""
        env = dict(self.base_env)
        env.update(self.task.env)
        env.update(gpu_env(self.task, self.mps))
        env.update(task_facts(self.task, self.host_id))
        # Seconds between SIGTERM and SIGKILL when the control plane stops this attempt
        # (preemption, time limit, cancel): the task's window to checkpoint.
        env["MUSTER_PREEMPT_DEADLINE"] = f"{self.task.grace_s or self.kill_grace_s:g}"
        return env

    def _prepare(self, isolation: Isolation) -> Launch:
        if self.run_file is None:
            return isolation.prepare(self.task, self.env(), self.shared_user)
        own_dir(self.run_file.parent)
        return isolation.prepare(self.task, self.env(), self.shared_user, run_file=self.run_file)

    async def _spawn(self) -> str:
        """Start the launcher; "" once the job's command runs, else why it could not."""
        t = self.task
        loop = asyncio.get_running_loop()
        if self.isolation is not None:
            self.launch = await asyncio.to_thread(self._prepare, self.isolation)
        else:
            self.launch = Isolation.unconfined(t, self.env())
        status_r, status_w = os.pipe()
        try:
            try:
                transport, protocol = await loop.subprocess_exec(
                    lambda: _Protocol(self._exited, loop),
                    *self.launch.argv, str(status_w),
                    env=dict(LAUNCH_ENV),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=(status_w,),
                )
            finally:
                os.close(status_w)
            self._transport = transport
            self.proc = asyncio.subprocess.Process(transport, protocol, loop)
            # Read to its end (every copy closed: the exec, or the launcher's failure), the
            # task's pid taken out (agent/launch.py: `pid: `, when the launcher stays its
            # parent); what is left is why the command could not start, nothing once it runs.
            data = b""
            while True:
                readable: asyncio.Future[None] = loop.create_future()

                def ready(fut: asyncio.Future[None] = readable) -> None:
                    if not fut.done():
                        fut.set_result(None)

                loop.add_reader(status_r, ready)
                try:
                    await readable
                finally:
                    loop.remove_reader(status_r)
                chunk = os.read(status_r, 4096)
                if not chunk:
                    break
                data += chunk
            text = data.decode(errors="replace")
            named = TASK_PID_LINE.search(text)
            if named is not None:
                self.task_pid = int(named.group(1))
                text = text[:named.start()] + text[named.end():]
            return text
        finally:
            os.close(status_r)

    async def _run(self) -> None:
        t = self.task
        try:
            failed = await self._spawn()
        except (OSError, ValueError) as exc:
            failed = str(exc)
            if isinstance(exc, OSError):
                # The agent's own making of the try failed (no space, memory or processes, a
                # cgroup, its directory gone): the host's want, not the job's fault (nothing of
                # the job's is tried here; its command and cwd are the launcher's). The try
                # ends as the host's, requeued, and the host asks for no new work a while
                # (found by exploring: with the disk full, every try sent here FAILED as its
                # job's own failure).
                self.host_trouble = failed
        if failed.startswith(HOST_FAILURE):  # the launcher's, for the host's want (agent/launch.py)
            failed = failed[len(HOST_FAILURE):]
            self.host_trouble = failed
        if failed:
            if self.proc is not None:
                await self._exited.wait()
            await self._cleanup()
            self._tail.extend(f"{failed}\n".encode())
            if self.host_trouble:
                await self.on_state(t, AttemptState.KILLED, None, self.tail,
                                    f"the host could not start it: {failed}")
            else:
                await self.on_state(t, AttemptState.FAILED, 127, self.tail, f"spawn failed: {failed}")
            self.done.set()
            return
        assert self.proc is not None and self.proc.stdout is not None
        self._running = True
        if self._freeze_early:  # frozen while it was being started
            self._freeze_early = False
            self.freeze()
        self.started_at = time.time()
        try:
            await self.on_state(t, AttemptState.RUNNING, None, "", "")
        except Exception:  # noqa: BLE001 - its end is still waited for and reported
            log.exception("attempt %s: reporting its start failed", t.attempt_id)
        if self.stop_reason is not None:  # stopped while it was being started
            asyncio.create_task(self.stop(self.stop_reason, self._early_grace))
        reader = asyncio.create_task(self._read(self.proc.stdout))
        await self._exited.wait()
        code = self.proc.returncode
        assert code is not None
        # A launcher that stays the task's parent and ended without writing the task's end
        # was killed itself (the OOM killer, an operator), the task perhaps running on: the
        # try's end is the host's want, not the job's failure (a review). The launcher makes
        # the record when the task starts and writes the end over it in place, so a disk
        # filled meanwhile does not keep it from doing so (found by exploring: a try that
        # succeeded was reported KILLED and run again); one that exited (not killed by a
        # signal) and still wrote nothing ended as its task did, its exit code the task's.
        # (Left: a task killed by a signal whose end could not be written even in place is
        # taken for a killed launcher's.)
        orphaned = (self.task_pid and code < 0 and self.launch is not None and self.launch.exit_file is not None
                    and task_end(self.launch.exit_file) is None)
        # Whatever the process left (daemons, background children) dies with it.
        await self._sweep()
        try:
            await asyncio.wait_for(asyncio.shield(reader), timeout=PIPE_AFTER_EXIT_S)
        except TimeoutError:
            reader.cancel()
            log.warning("attempt %s: what it left behind still holds its output; no longer read", t.attempt_id)
        group = self.launch.group if self.launch is not None else None
        oom = group.oom_kills() if group is not None else 0
        own_oom = group.reached_limit() if group is not None and oom else True
        await self._cleanup()
        mark = watchdog_mark(self.fenced_dir, t.attempt_id) if self.fenced_dir is not None else None
        # Stopped by the watchdog, whatever its exit code (one that saves its state on the
        # SIGTERM and exits 0 has not finished: found by a review, it was SUCCEEDED), unless
        # it had exited before and only what it left behind was stopped.
        fenced = mark[0] if mark is not None and (mark[1] or code != 0 or self.signaled) else None
        reason = ""
        if fenced:
            # The watchdog stopped it (the agent was frozen or cut off); an agent that
            # comes back and fences itself only finds the attempt ended.
            state = AttemptState.KILLED
            self.stop_reason = reason = fenced
            log.warning("attempt %s %s", t.attempt_id, fenced.removeprefix("fenced: "))
        elif orphaned:
            state = AttemptState.KILLED
            self.host_trouble = reason = "its launcher was killed, and the task with it"
            log.warning("attempt %s: %s", t.attempt_id, reason)
        elif code == 0 and not self.signaled:
            state = AttemptState.SUCCEEDED  # it finished on its own
        elif self.signaled:
            # Stopped, whatever its exit code: one that saves its state in the grace and
            # exits 0 has not finished its work (a preempted try must be run again, a
            # try at its time limit ends TIMEOUT), so it is not SUCCEEDED.
            state = AttemptState.KILLED
            reason = self.stop_reason or ""
        elif oom and not own_oom:
            # Killed for want of memory its own limit did not set (an enclosing group's, the
            # host's): the host's want, not the job's failure (found by exploring: it was
            # FAILED "for using more than its memory limit").
            state = AttemptState.KILLED
            self.host_trouble = reason = (
                f"{OOM_REASON}: the kernel killed {oom} process{'es' if oom > 1 else ''} of the task for want of "
                f"the host's memory (an enclosing cgroup's limit, or the host's), not for its own limit of "
                f"{max(t.memory_mb, MIN_MEMORY_LIMIT_MB)} MB")
            log.warning("attempt %s %s", t.attempt_id, reason)
        elif oom:
            state = AttemptState.FAILED
            reason = (f"{OOM_REASON}: the kernel killed {oom} process{'es' if oom > 1 else ''} of the task "
                      f"for using more than its memory limit of {max(t.memory_mb, MIN_MEMORY_LIMIT_MB)} MB")
            log.warning("attempt %s %s", t.attempt_id, reason)
        else:
            state = AttemptState.FAILED
        # The launcher's record of the task's end and the watchdog's mark stay: the agent
        # removes them once the STATUS stream took the report (a restart before reads the
        # end from them: found by exploring).
        await self.on_state(t, state, code, self.tail, reason)
        self.done.set()

    async def _read(self, stdout: asyncio.StreamReader) -> None:
        while True:
            chunk = await stdout.read(65536)
            if not chunk:
                return
            self._tail.extend(chunk)
            self.written += len(chunk)
            if len(self._tail) > TAIL_BYTES:
                del self._tail[: len(self._tail) - TAIL_BYTES]

    async def _sweep(self) -> None:
        """SIGKILL what is left of the attempt: its cgroup, and its process group."""
        if self.proc is not None:
            try:
                os.killpg(self.group_pid, signal.SIGKILL)
            except OSError:
                pass
        if self.launch is not None and self.launch.group is not None:
            await asyncio.to_thread(Isolation.sweep, self.launch)

    async def _cleanup(self) -> None:
        if self.launch is not None:
            await self._sweep()
            try:
                await asyncio.to_thread(Isolation.release, self.launch)
            except Exception:  # noqa: BLE001 - the try ended whatever its clean-up met, and is reported
                log.exception("attempt %s: removing its cgroup or directory failed", self.task.attempt_id)
        if self._transport is not None:
            self._transport.close()  # the pipe, if something still holds it

    async def stop(self, reason: str, grace_s: float | None = None) -> None:
        """SIGTERM the attempt, wait the grace period, then SIGKILL all of it. A stop
        already under way is waited for, not started again: the attempt gets one SIGTERM
        (its checkpoint window is not cut short by a second signal), however often the
        control plane repeats the stop."""
        if self.stop_reason is None:
            self.stop_reason = reason
        proc = self.proc
        if not self._running and grace_s is not None:
            # Stopped while it is being started: the stop made once it has is given this
            # grace (found by a review: it got the agent's default, a second for a 20 s one).
            self._early_grace = grace_s if self._early_grace is None else min(self._early_grace, grace_s)
        if proc is None or not self._running or self._exited.is_set():
            # (Until the launcher has said which process is the task, a signal would reach
            # the launcher alone, which ignores it: a review. The start applies the stop.)
            return
        # A later stop may shorten the grace (fencing must finish within the TTL), never
        # lengthen it.
        kill_at = time.monotonic() + (self.kill_grace_s if grace_s is None else grace_s)
        if self._kill_at is None or kill_at < self._kill_at:
            self._kill_at = kill_at
            self._kill_at_moved.set()
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stopping)

    def freeze(self) -> None:
        """SIGSTOP every process of the attempt (its cgroups and its process group), then
        freeze its cgroup where it has a freezer, so that it runs nothing while the agent
        cannot tell whether the control plane still counts its host alive. SIGSTOP cannot
        be caught; a process forked during a sweep of the cgroup is caught by the next (at
        most three), and one stopped process group is stopped at once (a fork under way
        when the signal comes is restarted, stopped). The freezer holds them even against
        a SIGCONT from another process of the task's user; the SIGSTOP keeps a host without
        one (or an attempt without a cgroup) frozen all the same."""
        if self._exited.is_set():
            return
        if self.proc is None or not self._running:
            self._freeze_early = True  # applied once the task is known (a SIGSTOP would stop its launcher)
            return
        self.frozen = True
        self._pause(signal.SIGSTOP)
        self.cgroup_frozen = cgroups.set_frozen(self.cgroup_paths, True)

    def thaw(self) -> None:
        """Thaw the cgroup and SIGCONT what `freeze` stopped."""
        self._freeze_early = False
        if not self.frozen:
            return
        self.frozen = False
        if self.cgroup_frozen:
            self.cgroup_frozen = not cgroups.set_frozen(self.cgroup_paths, False)
        if self.proc is not None and not self._exited.is_set():
            self._pause(signal.SIGCONT)

    def _pause(self, sig: int) -> None:
        assert self.proc is not None
        for _ in range(3 if sig == signal.SIGSTOP else 1):
            try:
                cgroups.signal_attempt(self.cgroup_paths, self.group_pid, sig)
            except PermissionError:
                self._kill_first(sig)

    async def _stop(self) -> None:
        self._signal(signal.SIGTERM)
        # A frozen attempt gets its SIGTERM when it is continued: its handler runs, within
        # the grace (a fenced agent's grace ends before its heartbeat key can expire).
        self.thaw()
        self._record_stop()
        exited = asyncio.ensure_future(self._exited.wait())
        try:
            while not self._exited.is_set():
                assert self._kill_at is not None
                left = self._kill_at - time.monotonic()
                if left <= 0:
                    break
                self._kill_at_moved.clear()
                moved = asyncio.ensure_future(self._kill_at_moved.wait())
                await asyncio.wait({exited, moved}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                if moved.done():
                    self._record_stop()
                moved.cancel()
        finally:
            exited.cancel()
        if not self._exited.is_set():
            self._signal(signal.SIGKILL)
            await self._sweep()
            await self._exited.wait()

    @property
    def live(self) -> bool:
        """The task runs (the launcher has named it) and has not been seen to end."""
        return self._running and not self._exited.is_set()

    @property
    def stop_deadline(self) -> float | None:
        """When the stop under way sends its SIGKILL (monotonic), once its SIGTERM reached
        the task; else None."""
        return self._kill_at if self._stopping is not None and self.signaled else None

    def _record_stop(self) -> None:
        """Write the stop's SIGKILL time into the try's run record (`kill:`): an agent
        started again in the grace (this one killed -9) lets the task run to it rather than
        kill it at its start, cutting its checkpoint window short. Written after the SIGTERM:
        a record saying a grace runs for a task never told to stop would hold it to a SIGKILL
        without its window."""
        deadline = self.stop_deadline
        if self.run_file is None or deadline is None or self._exited.is_set():
            return
        try:
            r = read_run(self.run_file.read_text())
            put_run(self.run_file, r._replace(kill_at=deadline).line())
        except (OSError, ValueError, IndexError) as exc:
            log.warning("attempt %s: the end of its stop's grace cannot be recorded (%s): an agent started again "
                        "before it would kill the task at once", self.task.attempt_id, exc)

    def _signal(self, sig: int) -> None:
        """`sig` to every process of the attempt, once each: the processes in its cgroup
        (every descendant: the launcher joined it before the job's command ran), or,
        without one, its process group. SIGKILL goes to both."""
        if self.proc is None or self._exited.is_set():
            return
        # A task that has already ended by itself (its parent, the launcher, not yet seen to
        # end) was not stopped by this signal: it ends as it ended (found by exploring: a
        # requeue in that moment made a finished try KILLED, and it ran again). What it
        # left behind is still signalled.
        if start_time(self.group_pid) and not exited(self.group_pid):
            self.signaled = True
        group = self.launch.group if self.launch is not None else None
        try:
            cgroups.signal_attempt(group.paths if group is not None else (), self.group_pid, sig)
        except PermissionError:
            self._kill_first(sig)

    def _kill_first(self, sig: int) -> None:
        """`sig` to the task's first process alone (its group could not be signalled)."""
        try:
            os.kill(self.group_pid, sig)
        except OSError:
            pass

    @property
    def group_pid(self) -> int:
        """The task's process group: its first process's pid, which the launcher names when
        it stays the task's parent, else the launcher's own (it became the task)."""
        if self.task_pid:
            return self.task_pid
        return self.proc.pid if self.proc is not None else 0

    async def wait(self) -> None:
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

