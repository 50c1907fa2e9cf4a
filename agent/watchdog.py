"""A task attempt's watchdog: runs the attempt's command and stops it once the agent
that started it has stopped heartbeating, whatever became of that agent.

A live agent cut off from NATS stops its own attempts (self-fencing, agent.agent). An
agent that was killed (kill -9, the OOM killer) or frozen (SIGSTOP, a hung machine)
cannot, and its attempts would run on while the control plane, seeing the heartbeat key
expire, runs them again elsewhere. So the agent starts each attempt through this script:

    python -I -S agent/watchdog.py DIR STALE_AFTER GRACE -- COMMAND...

The agent touches DIR/alive after every heartbeat the store took. The watchdog starts
COMMAND in its own process group (the agent starts the watchdog in a session of its own,
so the group is the attempt's) and checks DIR/alive every half second. Once the file has
not changed for STALE_AFTER seconds (on this process's monotonic clock, so a step of the
wall clock changes nothing), it writes DIR/fenced.<its pid>, sends SIGTERM to the rest
of its process group and SIGKILL to whatever is left after GRACE seconds. The agent
chooses STALE_AFTER just over its own fence delay and GRACE so that the attempt is dead
before the heartbeat key expires.

The watchdog leaves the group's signals to the attempt (SIGTERM, SIGINT and SIGHUP
reach it, not the watchdog) and exits as its command did: the same exit code, or the same
signal. A command that cannot be started exits 127 with the reason on stdout. Standard
library only: it runs with -I -S.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 0.5
_GROUP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def say(text: str) -> None:
    """A line on stdout (the attempt's output); the agent that reads it may be gone."""
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except OSError:
        pass


def mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def group_members(pgid: int, but: int) -> list[int]:
    """Processes of process group `pgid` other than `but` (from /proc)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == but:
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # Field 5 is the process group; the command name (field 2) may hold spaces.
        if int(stat[stat.rindex(")") + 2:].split()[2]) == pgid:
            out.append(int(name))
    return out


def signal_group(sig: int) -> None:
    """`sig` to every other process of this process group: the attempt and its children."""
    for pid in group_members(os.getpgrp(), os.getpid()):
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def fence(directory: str, child: subprocess.Popen, silent_s: float, grace_s: float) -> None:  # type: ignore[type-arg]
    with open(os.path.join(directory, f"fenced.{os.getpid()}"), "w") as f:
        f.write(f"{silent_s:.1f}\n")
    say(f"muster watchdog: no heartbeat from the agent for {silent_s:.1f} s; stopping the attempt")
    signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    signal_group(signal.SIGKILL)  # also what the attempt left behind after it exited


def watch(directory: str, stale_after_s: float, grace_s: float, command: list[str]) -> int:
    # The watchdog outlives a SIGTERM sent to the group, to report how the command
    # ended. Handlers, not SIG_IGN: exec resets handled signals to their default, so the
    # command starts with the default dispositions (an ignored signal would stay ignored).
    for sig in _GROUP_SIGNALS:
        signal.signal(sig, lambda *_: None)
    try:
        child = subprocess.Popen(command)
    except (OSError, ValueError) as exc:
        say(f"cannot start {command[0]!r}: {exc}")
        return 127
    alive = os.path.join(directory, "alive")
    last, changed = mtime(alive), time.monotonic()
    while True:
        try:
            return child.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            pass
        seen, now = mtime(alive), time.monotonic()
        if seen != last:
            last, changed = seen, now
        elif now - changed >= stale_after_s:
            fence(directory, child, now - changed, grace_s)
            return child.wait()


def main(argv: list[str]) -> None:
    if len(argv) < 5 or argv[3] != "--":
        say("usage: watchdog.py DIR STALE_AFTER GRACE -- COMMAND...")
        sys.exit(2)
    code = watch(argv[0], float(argv[1]), float(argv[2]), argv[4:])
    if code < 0:  # ended by a signal: end by the same one
        try:
            signal.signal(-code, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL, SIGSTOP: not catchable, default already
            pass
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
