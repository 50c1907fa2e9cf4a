"""`muster server` as a process, before it has a cluster: started while NATS cannot be
reached (a server started before NATS, as compose or systemd may), it waits for it, says
so in a line now and then (no traceback per try), and stops on SIGTERM or Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server.broker.natsd import free_port
from tests.conftest import ROOT


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_server_waiting_for_nats_stops_on_a_signal(tmp_path: Path, sig: signal.Signals) -> None:
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "server.cli", "server", "--nats", f"nats://127.0.0.1:{free_port()}",
             "--http-port", str(free_port()), "--data-dir", str(tmp_path / "data"), "--name", "early"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            # Trying to connect (it says so in a line): its signal handlers are in place. (A
            # fixed 3 s was not always enough for a loaded machine to start it: the signal
            # came first and ended it with nothing said.)
            deadline = time.monotonic() + 120
            while "NATS at nats://" not in log.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            assert proc.poll() is None, log.read_text()
            proc.send_signal(sig)
            assert proc.wait(timeout=60) is not None  # it used to wait for NATS whatever the signal
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text()
    assert "stopped before NATS could be reached" in text, text
    assert "Traceback" not in text, text
