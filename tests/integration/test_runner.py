"""One attempt's stop (agent.runner.Run) with a real process and real signals, without
an agent around it: a stop repeated while the first is under way sends no second
SIGTERM (the task's checkpoint window stays whole), and a later stop with a shorter grace
brings the SIGKILL forward (fencing must finish within the heartbeat TTL)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from agent.runner import Run
from tests.factories import task
from tests.integration.conftest import group_states
from wire.messages import AttemptState

# Counts its SIGTERMs in a file and ignores them: only a SIGKILL ends it.
STUBBORN = """
import signal, sys, time
path = sys.argv[1]
def term(*_):
    with open(path, "a") as f:
        f.write("term\\n")
signal.signal(signal.SIGTERM, term)
open(path, "a").write("ready\\n")
while True:
    time.sleep(0.05)
"""


async def _started(run: Run, log: Path) -> None:
    deadline = time.monotonic() + 30
    while not (log.exists() and "ready" in log.read_text()):
        assert time.monotonic() < deadline, "the attempt did not start"
        await asyncio.sleep(0.05)


async def test_a_repeated_stop_sends_one_sigterm_and_a_shorter_grace_kills_sooner(tmp_path: Path) -> None:
    log = tmp_path / "signals"
    states: list[AttemptState] = []

    async def on_state(_task: object, state: AttemptState, *_: object) -> None:
        states.append(state)

    run = Run(task(command=[sys.executable, "-c", STUBBORN, str(log)]), on_state, kill_grace_s=600.0)
    run.start()
    await _started(run, log)
    first = asyncio.create_task(run.stop("cancelled", 600.0))
    while "term" not in log.read_text():
        await asyncio.sleep(0.05)
    again = asyncio.create_task(run.stop("cancelled", 600.0))  # the control plane repeats itself
    await asyncio.sleep(0.5)
    assert not first.done() and not again.done()
    # Fencing: what is left of the TTL is short. (Waited for at most 120 s: the first
    # stop alone would wait 600 s before its SIGKILL.)
    await asyncio.wait_for(run.stop("fenced: host cut off from the control plane", 0.5), timeout=120)
    await asyncio.wait_for(asyncio.gather(first, again), timeout=120)
    await run.wait()
    assert log.read_text().count("term") == 1
    assert run.stop_reason == "cancelled"
    assert AttemptState.RUNNING in states and states[-1] is AttemptState.KILLED


async def test_a_frozen_attempt_runs_nothing_until_continued_and_a_stop_reaches_its_handler(tmp_path: Path) -> None:
    """The fence's freeze stops every process of the attempt (a child included); thawed,
    they run on; a stop while frozen delivers the SIGTERM on continuing, so the task's
    handler runs."""
    log = tmp_path / "signals"
    states: list[AttemptState] = []

    async def on_state(_task: object, state: AttemptState, *_: object) -> None:
        states.append(state)

    code = STUBBORN.replace("open(path, \"a\").write(\"ready\\n\")",
                            "import subprocess; subprocess.Popen(['sleep', '600']); open(path, 'a').write('ready\\n')")
    run = Run(task(command=[sys.executable, "-c", code, str(log)]), on_state, kill_grace_s=600.0)
    run.start()
    await _started(run, log)
    assert run.proc is not None
    group = run.proc.pid
    while len(group_states(group)) < 2:  # the task and its child
        await asyncio.sleep(0.05)
    run.freeze()
    while not all(x == "T" for x in group_states(group)):
        await asyncio.sleep(0.05)
    run.thaw()
    while "T" in group_states(group):
        await asyncio.sleep(0.05)
    run.freeze()
    while not all(x == "T" for x in group_states(group)):
        await asyncio.sleep(0.05)
    await asyncio.wait_for(run.stop("fenced: host cut off from the control plane", 3.0), timeout=120)
    await run.wait()
    assert log.read_text().count("term") == 1  # handled after continuing, before the SIGKILL
    assert states == [AttemptState.RUNNING, AttemptState.KILLED]
    assert not run.frozen
