"""The task watchdog (agent/watchdog.py) with real processes and signals: it reports its
command's end unchanged, leaves the group's signals to the command, and stops the
command (and what it started) once the agent's `alive` file stops changing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from agent.runner import WATCHDOG
from tests.conftest import wait_until
from tests.test_failures import _process_gone

PY = sys.executable


def start(d: Path, command: list[str], stale_after: float = 60.0, grace: float = 1.0) -> subprocess.Popen[bytes]:
    (d / "alive").touch()
    return subprocess.Popen([PY, "-I", "-S", str(WATCHDOG), str(d), str(stale_after), str(grace), "--", *command],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def marker(log: Path, child_pid_file: Path | None = None) -> list[str]:
    """Notes 'start', and 'stop' on SIGTERM (then exits 143); optionally leaves a
    `sleep` child behind in its process group, whose pid it writes down."""
    code = f"""
import os, signal, subprocess, sys, time
def note(what):
    with open({str(log)!r}, 'a') as f:
        f.write(what + '\\n')
def stop(*_):
    note('stop'); sys.exit(143)
signal.signal(signal.SIGTERM, stop)
if {str(child_pid_file) if child_pid_file else None!r}:
    child = subprocess.Popen(['sleep', '600'])
    with open({str(child_pid_file)!r}, 'w') as f:
        f.write(str(child.pid))
note('start')
while True:
    time.sleep(0.05)
"""
    return [PY, "-c", code]


def test_exit_codes_and_output_pass_through(tmp_path: Path) -> None:
    p = start(tmp_path, [PY, "-c", "print('hello'); raise SystemExit(3)"])
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 3
    assert out == b"hello\n"
    p = start(tmp_path, [PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
    p.communicate(timeout=30)
    assert p.returncode == -signal.SIGSEGV
    assert not list(tmp_path.glob("fenced.*"))


def test_a_command_that_cannot_start_exits_127(tmp_path: Path) -> None:
    p = start(tmp_path, ["/nonexistent/muster-no-such-command"])
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 127
    assert b"cannot start" in out


def test_the_groups_sigterm_reaches_the_command_and_the_watchdog_reports_it(tmp_path: Path) -> None:
    log = tmp_path / "marks"
    p = start(tmp_path, marker(log))
    wait_until(lambda: log.exists() and "start" in log.read_text(), what="the command started")
    os.killpg(p.pid, signal.SIGTERM)  # what the agent's Run.stop sends
    p.communicate(timeout=30)
    assert p.returncode == 143  # the command's own exit, reported by the watchdog
    assert log.read_text().split() == ["start", "stop"]
    # A command without a handler dies of the signal, and so does the watchdog after it.
    p = start(tmp_path, ["sleep", "600"])
    time.sleep(0.3)
    os.killpg(p.pid, signal.SIGTERM)
    p.communicate(timeout=30)
    assert p.returncode == -signal.SIGTERM
    assert not list(tmp_path.glob("fenced.*"))


def test_a_silent_agent_gets_its_attempt_stopped_with_what_it_started(tmp_path: Path) -> None:
    """`alive` stops changing (the agent was killed or frozen): the watchdog writes
    fenced.<pid>, SIGTERMs the command and SIGKILLs what is left of the group (here a
    `sleep` the command started and did not stop)."""
    log, child_pid = tmp_path / "marks", tmp_path / "child"
    p = start(tmp_path, marker(log, child_pid), stale_after=1.0, grace=1.0)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 143
    assert log.read_text().split() == ["start", "stop"]
    assert (tmp_path / f"fenced.{p.pid}").exists()
    assert b"no heartbeat from the agent" in out
    wait_until(lambda: _process_gone(int(child_pid.read_text())), timeout=30, what="the left-behind child killed")


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    p = start(tmp_path, [PY, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                   "while True: time.sleep(0.05)"], stale_after=1.0, grace=0.5)
    p.communicate(timeout=60)
    # SIGKILL goes to the whole group but the watchdog, which then ends as its command did.
    assert p.returncode == -signal.SIGKILL
    assert (tmp_path / f"fenced.{p.pid}").exists()


def test_a_live_agent_keeps_its_attempt_running(tmp_path: Path) -> None:
    """While `alive` keeps changing the command runs to its end, past many times the
    watchdog's stale delay."""
    stop = threading.Event()

    def touch() -> None:
        while not stop.is_set():
            os.utime(tmp_path / "alive")
            stop.wait(0.1)

    # Stale after 2.5 s, touched every 0.1 s: also on a filesystem whose timestamps have
    # whole seconds, the file changes well within the delay.
    p = start(tmp_path, [PY, "-c", "import time; time.sleep(6)"], stale_after=2.5, grace=0.5)
    t = threading.Thread(target=touch, daemon=True)
    t.start()
    try:
        p.communicate(timeout=60)
    finally:
        stop.set()
        t.join(5)
    assert p.returncode == 0
    assert not list(tmp_path.glob("fenced.*"))
