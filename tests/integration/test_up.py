"""`muster up` (what `make run` runs): everything starts, prints its URLs and token,
stops cleanly on Ctrl-C, and a second start resumes with the same state."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from server.broker.natsd import free_port
from server.cli.up import cgroup_tag
from tests.conftest import ROOT, wait_until
from tests.integration.conftest import Api


def start_up(data: Path, http: int, nats: int) -> tuple[subprocess.Popen[str], list[str]]:
    p = subprocess.Popen(
        [sys.executable, "-m", "server.cli", "up", "--data-dir", str(data), "--http-port", str(http),
         "--nats-port", str(nats)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )
    lines: list[str] = []
    assert p.stdout is not None
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip())
        if "Press Ctrl-C" in line:
            return p, lines
    p.kill()
    raise AssertionError("muster up did not come up:\n" + "\n".join(lines))


def leftovers(data: Path) -> list[str]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if str(data) in cmd:
            found.append(cmd)
    return found


def stop_up(p: subprocess.Popen[str]) -> int:
    p.send_signal(signal.SIGINT)
    try:
        return p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()


HUNT = r"""
found=0
env | grep -E 'NATS|TOKEN|CREDS|SEED' && found=1
for f in $(find "$1" -type f 2>/dev/null); do
  if head -c 65536 "$f" 2>/dev/null | grep -q -a -E 'SU[A-Z2-7]{40}|mst_'; then echo "READ $f"; found=1; fi
done
ls "$1/.muster" >/dev/null 2>&1 && { echo "LISTED $1/.muster"; found=1; }
echo "hunt over: found=$found uid=$(id -u)"
"""


@pytest.fixture
def public(tmp_path: Path) -> Iterator[Path]:
    """A directory any user may enter (the test's tmp_path is private to its user), as a
    project directory usually is."""
    d = Path(tempfile.mkdtemp(prefix="muster-up-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_up_runs_everything_and_resumes(public: Path) -> None:
    """... and, run as root, its tasks run as another user and cannot read its secrets:
    the NATS seeds, the operator token, the history, the agents' state."""
    data = public / ".muster"
    http, nats = free_port(), free_port()
    p, lines = start_up(data, http, nats)
    out = "\n".join(lines)
    assert f"http://127.0.0.1:{http}/" in out
    assert f"http://127.0.0.1:{http}/graphql" in out
    assert "SIMULATED" in out
    m = re.search(r"token:\s+(\S+)\s+\(saved in", out)
    assert m, out
    token = m.group(1)
    assert (data / "token").read_text().strip() == token
    try:
        api = Api(f"http://127.0.0.1:{http}", token)
        api.wait_hosts(2)
        hosts = api.q("{ hosts { edges { node { id simulated } } } }")["hosts"]["edges"]
        assert {h["node"]["id"] for h in hosts} == {"local-1", "local-2"}
        assert all(h["node"]["simulated"] for h in hosts)
        job = api.submit(name="persisted", command=["true"], gpus=1, cpus=1, memoryMb=64)["job"]
        assert api.wait_job(job["id"], {"SUCCEEDED", "FAILED"})["state"] == "SUCCEEDED"
        # `muster token` and `muster check` find this NATS and its credentials from the data
        # dir alone (the port is not the default one).
        env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_NATS")}
        for argv, says in ((["token", "list"], "operator  admin"), (["check"], "0 invariant violations")):
            r = subprocess.run([sys.executable, "-m", "server.cli", *argv, "--data-dir", str(data)],
                               capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
            assert r.returncode == 0 and says in r.stdout, (argv, r.stdout, r.stderr)
        assert data.stat().st_mode & 0o777 == 0o700
        # The logs (the server's holds the operator token it printed) are the user's alone.
        logs = data / "logs"
        assert logs.stat().st_mode & 0o777 == 0o700
        assert [f.name for f in logs.iterdir() if f.stat().st_mode & 0o077] == []
        if os.geteuid() == 0:
            hunt = api.submit(name="hunter", command=["sh", "-c", HUNT, "hunt", str(public)], gpus=1, cpus=1,
                              memoryMb=64)["job"]
            api.wait_job(hunt["id"], {"SUCCEEDED", "FAILED"})
            tail = api.job(hunt["id"])["attempts"][-1]["outputTail"]
            assert "hunt over: found=0" in tail, tail
            assert token not in tail
            isolated = api.q("{ hosts { edges { node { isolated } } } }")["hosts"]["edges"]
            assert all(h["node"]["isolated"] is True for h in isolated), isolated
        # Its agents' cgroups are its own (another `muster up` here names its hosts alike).
        agents = [c for c in leftovers(data) if " -m agent " in f"{c} "]
        assert len(agents) == 2 and all(f"--cgroup-name muster-{cgroup_tag(data)}-local-" in c for c in agents), \
            agents
    finally:
        rc = stop_up(p)
    assert rc == 0
    # Nothing left running.
    assert leftovers(data) == []

    # Second start: same token (not printed again), the job is still there.
    p, lines = start_up(data, http, nats)
    out = "\n".join(lines)
    assert token not in out
    try:
        api = Api(f"http://127.0.0.1:{http}", token)
        assert api.job(job["id"])["state"] == "SUCCEEDED"
        api.wait_hosts(2)
        # An agent killed (-9) is a host lost, as in a real cluster: the rest keeps running.
        agent = next(proc for proc in psutil.process_iter(["cmdline"])
                     if (cmd := proc.info["cmdline"] or []) and "agent" in cmd and "local-2" in cmd
                     and str(data) in " ".join(cmd))
        agent.kill()
        wait_until(lambda: api.q('{ host(id: "local-2") { health } }')["host"]["health"] == "LOST", timeout=90,
                   what="local-2 LOST")
        assert p.poll() is None
        assert api.q('{ host(id: "local-1") { health } }')["host"]["health"] == "HEALTHY"
    finally:
        assert stop_up(p) == 0


def test_json_logs(tmp_path: Path) -> None:
    """MUSTER_LOG_FORMAT=json: every log line of a real server is one JSON object."""
    import json

    from server.broker.natsd import start_nats, wait_for_port

    nats = start_nats(tmp_path / "nats", port=0)
    port = free_port()
    env = {**os.environ, "MUSTER_LOG_FORMAT": "json"}
    p = subprocess.Popen([sys.executable, "-m", "server.cli", "server", "--nats", nats.url, "--http-port",
                          str(port), "--data-dir", str(tmp_path / "srv")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        wait_for_port(port, timeout=60)
        deadline = time.monotonic() + 30
        while not (tmp_path / "srv" / "token").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
        nats.stop()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines, "the server logged nothing"
    docs = [json.loads(ln) for ln in lines]
    assert all({"ts", "level", "logger", "msg"} <= d.keys() for d in docs)
    assert any("leadership acquired" in d["msg"] for d in docs)
