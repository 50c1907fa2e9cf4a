"""The server's helper processes do not outlive it (server.childproc)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.conftest import ROOT

# A "server" that starts a helper whose event loop is blocked for good, says the helper's
# pid, and dies as kill -9 would end it (os._exit: nothing stops the helper).
PARENT = """
import multiprocessing, os, sys, time

def body_blocked(stop):
    async def run(stop):
        time.sleep(3600)  # a loop blocked: its own look at its parent never runs
    return run(stop)

def helper():
    import server.childproc as c
    c.ORPHAN_EXIT_S = 0.5
    c.run_helper("muster-test-helper", body_blocked)

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=helper)
    p.start()
    print(p.pid, flush=True)
    time.sleep(2.0)  # (the helper up, its loop blocked)
    os._exit(0)
"""


def test_a_helper_whose_server_died_ends_even_with_its_loop_blocked(tmp_path: os.PathLike[str]) -> None:
    """Found in a test run: an ingest process whose server was killed -9 sat blocked,
    ignoring SIGTERM, for twelve minutes. A thread of its own ends it once its server is
    gone and it has not stopped."""
    script = os.path.join(str(tmp_path), "parent.py")
    with open(script, "w") as f:
        f.write(PARENT)
    parent = subprocess.Popen([sys.executable, script], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())  # (not read to its end: the helper holds it too)
    parent.wait(60)
    parent.stdout.close()
    def running() -> bool:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                return f.read().rpartition(b")")[2].split()[0] != b"Z"
        except OSError:
            return False

    deadline = time.monotonic() + 60
    try:
        while running():
            assert time.monotonic() < deadline, "the helper outlived its server"
            time.sleep(0.1)
    finally:
        if running():
            os.kill(pid, 9)
