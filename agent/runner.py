"""Runs one task attempt as a real subprocess: environment, GPU visibility, output tail,
a staged stop (SIGTERM, grace period, SIGKILL to the whole process group), and, unless
the task keeps running through cuts, a watchdog (agent.watchdog) that stops it when the
agent stops heartbeating."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NamedTuple

from server.messages import AttemptState, Task

log = logging.getLogger(__name__)

TAIL_BYTES = 4096
WATCHDOG = Path(__file__).with_name("watchdog.py")


class Watchdog(NamedTuple):
    """Where the agent shows it is alive (`dir/alive`, touched after every heartbeat the
    store took), and when the watchdog gives up on it (see agent.watchdog)."""

    dir: Path
    stale_after_s: float
    grace_s: float


def cannot_start(command: list[str], cwd: str | None, env: dict[str, str]) -> str | None:
    """Why `command` could not be started (as the exec would fail), or None. Checked
    before starting it through the watchdog, which can only report a failed exec as
    exit code 127."""
    if cwd and not os.path.isdir(cwd):
        return f"[Errno 2] No such directory: {cwd!r}"
    exe = command[0]
    if "/" in exe:
        path = exe if os.path.isabs(exe) or not cwd else os.path.join(cwd, exe)
        if not os.path.isfile(path):
            return f"[Errno 2] No such file or directory: {exe!r}"
        if not os.access(path, os.X_OK):
            return f"[Errno 13] Permission denied: {exe!r}"
        return None
    if shutil.which(exe, path=env.get("PATH", os.defpath)) is None:
        return f"[Errno 2] No such file or directory: {exe!r}"
    return None


class Run:
    def __init__(
        self,
        task: Task,
        on_state: Callable[[Task, AttemptState, int | None, str, str], Awaitable[None]],
        kill_grace_s: float = 10.0,
        base_env: dict[str, str] | None = None,
        watchdog: Watchdog | None = None,
    ) -> None:
        self.task = task
        # A task that keeps running through cuts (keep_running) is not fenced: no watchdog.
        self.watchdog = watchdog if not task.keep_running else None
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
        return env

    async def _run(self) -> None:
        t = self.task
        env = self.env()
        command = list(t.command)
        try:
            if self.watchdog is not None:
                why = cannot_start(command, t.cwd or None, env)
                if why is not None:
                    raise OSError(why)
                w = self.watchdog
                command = [sys.executable, "-I", "-S", str(WATCHDOG), str(w.dir), str(w.stale_after_s),
                           str(w.grace_s), "--", *command]
            self.proc = await asyncio.create_subprocess_exec(
                *command,
                cwd=t.cwd or None,
                env=env,
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
        """The stop reason when the watchdog stopped this attempt (it leaves
        `fenced.<pid>` behind), else None."""
        if self.watchdog is None or self.proc is None:
            return None
        mark = self.watchdog.dir / f"fenced.{self.proc.pid}"
        try:
            silent = mark.read_text().strip()
        except OSError:
            return None
        mark.unlink(missing_ok=True)
        return f"fenced: stopped by its watchdog after {silent} s without a heartbeat from the agent"

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
        except asyncio.TimeoutError:
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
