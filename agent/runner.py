"""Runs one task attempt as a real subprocess: environment, GPU visibility, output tail,
and a staged stop (SIGTERM, grace period, SIGKILL to the whole process group). An
attempt the agent's watchdog stopped (agent.watchdog) ends KILLED with its reason."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from wire.messages import AttemptState, Task

log = logging.getLogger(__name__)

TAIL_BYTES = 4096


class Run:
    def __init__(
        self,
        task: Task,
        on_state: Callable[[Task, AttemptState, int | None, str, str], Awaitable[None]],
        kill_grace_s: float = 10.0,
        base_env: dict[str, str] | None = None,
        fenced_dir: Path | None = None,
    ) -> None:
        self.task = task
        self.fenced_dir = fenced_dir  # where the agent's watchdog notes the attempts it stopped
        self.on_state = on_state
        self.kill_grace_s = kill_grace_s
        self.base_env = base_env if base_env is not None else dict(os.environ)
        self.proc: asyncio.subprocess.Process | None = None
        self._tail = bytearray()
        self.stop_reason: str | None = None
        self.signaled = False  # a stop signal really reached the process
        self.started_at: float | None = None
        self.done = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def tail(self) -> str:
        return self._tail.decode(errors="replace")

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"run-{self.task.attempt_id}")

    def env(self) -> dict[str, str]:
        env = dict(self.base_env)
        env.update(self.task.env)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in self.task.gpu_indices)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["MUSTER_JOB_ID"] = self.task.job_id
        env["MUSTER_ATTEMPT_ID"] = self.task.attempt_id
        env["MUSTER_ATTEMPT"] = str(self.task.number)
        # Seconds between SIGTERM and SIGKILL when the control plane stops this attempt
        # (preemption, time limit, cancel): the task's window to checkpoint.
        env["MUSTER_PREEMPT_DEADLINE"] = f"{self.task.grace_s or self.kill_grace_s:g}"
        return env

    async def _run(self) -> None:
        t = self.task
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *t.command,
                cwd=t.cwd or None,
                env=self.env(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except (OSError, ValueError) as exc:
            self._tail.extend(f"cannot start {t.command[0]!r}: {exc}\n".encode())
            await self.on_state(t, AttemptState.FAILED, 127, self.tail, f"spawn failed: {exc}")
            self.done.set()
            return
        self.started_at = time.time()
        await self.on_state(t, AttemptState.RUNNING, None, "", "")
        assert self.proc.stdout is not None
        while True:
            chunk = await self.proc.stdout.read(65536)
            if not chunk:
                break
            self._tail.extend(chunk)
            if len(self._tail) > TAIL_BYTES:
                del self._tail[: len(self._tail) - TAIL_BYTES]
        code = await self.proc.wait()
        fenced = self._fenced_by_watchdog()
        if code == 0:
            state = AttemptState.SUCCEEDED  # it finished on its own, even if a stop raced it
        elif fenced:
            # The watchdog stopped it (the agent was frozen or cut off); an agent that
            # comes back and fences itself only finds the attempt ended.
            state = AttemptState.KILLED
            self.stop_reason = fenced
            log.warning("attempt %s %s", t.attempt_id, fenced.removeprefix("fenced: "))
        elif self.signaled:
            state = AttemptState.KILLED
        else:
            state = AttemptState.FAILED
        await self.on_state(t, state, code, self.tail, (self.stop_reason or "") if state is AttemptState.KILLED else "")
        self.done.set()

    def _fenced_by_watchdog(self) -> str | None:
        """The stop reason when the agent's watchdog stopped this attempt (it leaves
        `fenced/<attempt>` behind), else None."""
        if self.fenced_dir is None:
            return None
        mark = self.fenced_dir / self.task.attempt_id
        try:
            silent = mark.read_text().strip()
        except OSError:
            return None
        mark.unlink(missing_ok=True)
        return f"fenced: stopped by the agent's watchdog after {silent} s without a heartbeat from the agent"

    async def stop(self, reason: str, grace_s: float | None = None) -> None:
        """SIGTERM the process group, wait the grace period, then SIGKILL it."""
        if self.stop_reason is None:
            self.stop_reason = reason
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        self._signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout=self.kill_grace_s if grace_s is None else grace_s)
        except TimeoutError:
            self._signal(signal.SIGKILL)
            await proc.wait()

    def _signal(self, sig: int) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.signaled = True
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            self.proc.send_signal(sig)

    async def wait(self) -> None:
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
