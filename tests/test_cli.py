"""The `muster` CLI through its real entry point (`python -m server.cli`) against a real
server subprocess and a real agent."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import nats as nats_py

from wire.messages import Event, encode
from tests.conftest import ROOT, Api, Cluster, ctrl_c_works, wait_until


def muster(c: Cluster, url: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MUSTER_URL": url, "MUSTER_TOKEN": c.token}
    return subprocess.run([sys.executable, "-m", "server.cli", *argv], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)


def test_job_and_host_commands(cluster: Cluster) -> None:
    srv = cluster.server()
    cluster.agent("cli-1", gpus="2xH100")
    Api(srv.url, cluster.token).wait_hosts(1)

    # a job that succeeds: -o json, its logs
    r = muster(cluster, srv.url, "job", "submit", "--wait", "-o", "json", "hello", "--", "sh", "-c", "echo hi-there")
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert job["state"] == "SUCCEEDED"
    r = muster(cluster, srv.url, "job", "logs", job["id"])
    assert r.returncode == 0 and "hi-there" in r.stdout and "attempt 1 on cli-1" in r.stdout, r.stdout + r.stderr
    r = muster(cluster, srv.url, "job", "logs", job["id"], "-o", "json")
    assert json.loads(r.stdout)[0]["outputTail"].strip() == "hi-there"

    # a job that fails: exit code 2, like `nomad job run`
    r = muster(cluster, srv.url, "job", "submit", "--wait", "bad", "--", "sh", "-c", "exit 3")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "FAILED" in r.stdout

    # a job that can never be placed: --wait --timeout gives up with 2; `why` explains (exit 0)
    r = muster(cluster, srv.url, "job", "submit", "--gpus", "64", "--wait", "--timeout", "2", "huge", "--", "true")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "not placed" in r.stderr
    queued_id = r.stdout.split()[-2]  # table: ID STATE / <id> QUEUED
    r = muster(cluster, srv.url, "job", "why", queued_id)
    assert r.returncode == 0, r.stderr
    assert "QUEUED" in r.stdout and "position 1" in r.stdout and "GPU" in r.stdout.upper(), r.stdout
    why = json.loads(muster(cluster, srv.url, "job", "why", queued_id, "-o", "json").stdout)
    assert why["queuePosition"] == 1 and why["pendingReasons"][0]["hosts"] == 1
    assert muster(cluster, srv.url, "job", "why", "j-nope").returncode == 3

    # listings in json, filters
    # (the list reads the history database, filled asynchronously by the historian)
    wait_until(lambda: json.loads(muster(cluster, srv.url, "job", "list", "-o", "json").stdout)["totalCount"] >= 3,
               what="three jobs in `job list`")
    queued = json.loads(muster(cluster, srv.url, "job", "list", "--state", "QUEUED", "-o", "json").stdout)
    assert [e["node"]["id"] for e in queued["edges"]] == [queued_id]
    r = muster(cluster, srv.url, "job", "list")
    assert r.returncode == 0 and "NAME" in r.stdout and "huge" in r.stdout

    # hosts
    r = muster(cluster, srv.url, "host", "show", "cli-1")
    assert r.returncode == 0, r.stderr
    assert "cli-1" in r.stdout and "HEALTHY" in r.stdout and "rack=r1" in r.stdout and job["id"] in r.stdout
    h = json.loads(muster(cluster, srv.url, "host", "show", "cli-1", "-o", "json").stdout)
    assert h["gpus"] == 2 and h["health"] == "HEALTHY" and len(h["recentAttempts"]) == 2
    assert muster(cluster, srv.url, "host", "show", "nope").returncode == 3
    hosts = json.loads(muster(cluster, srv.url, "host", "list", "--rack", "r1", "-o", "json").stdout)
    assert hosts["totalCount"] == 1
    hosts = json.loads(muster(cluster, srv.url, "host", "list", "--rack", "r9", "-o", "json").stdout)
    assert hosts["totalCount"] == 0

    # --watch re-renders until Ctrl-C, which exits 0
    env = {**os.environ, "MUSTER_URL": srv.url, "MUSTER_TOKEN": cluster.token}
    p = subprocess.Popen([sys.executable, "-m", "server.cli", "host", "list", "--watch"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_works)
    time.sleep(5)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=20)
    assert p.returncode == 0, err
    assert out.count("cli-1") >= 2, out

    # no token, a bad token
    r = subprocess.run([sys.executable, "-m", "server.cli", "job", "list"], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "MUSTER_URL": srv.url, "MUSTER_TOKEN": "wrong"}, timeout=60)
    assert r.returncode == 4


def test_alerts_tail_prints_new_alerts(cluster: Cluster) -> None:
    srv = cluster.server()
    env = {**os.environ, "MUSTER_URL": srv.url, "MUSTER_TOKEN": cluster.token, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "server.cli", "alerts", "tail", "-n", "0", "-o", "json",
                          "--interval", "0.5"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=ctrl_c_works)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        time.sleep(3)  # the CLI has started and taken its first look

        async def publish() -> None:
            nc = await nats_py.connect(cluster.nats_url)
            ev = Event(kind="host.lost", host_id="tail-host", message="heartbeat key expired")
            await nc.publish("alerts.host.lost", encode(ev))
            await nc.flush()
            await nc.close()

        asyncio.run(publish())
        deadline = time.monotonic() + 20
        found: dict[str, Any] | None = None
        while found is None and time.monotonic() < deadline:
            for line in list(lines):
                a = json.loads(line)
                if a["hostId"] == "tail-host":
                    found = a
            time.sleep(0.1)
        assert found is not None, (lines, p.poll())
        assert found["kind"] == "host.lost" and found["message"] == "heartbeat key expired"
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    assert p.returncode == 0, p.stderr.read() if p.stderr else ""


def test_bench_options_reach_the_benchmark_parser() -> None:
    """`muster bench --hosts N ...` hands every option to the benchmark (no `--` needed)."""
    for argv in (["bench", "--hosts", "10", "--help"], ["bench", "--", "--hosts", "10", "--help"]):
        r = subprocess.run([sys.executable, "-m", "server.cli", *argv], capture_output=True, text=True,
                           cwd=ROOT, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "usage: muster bench" in r.stdout and "--burst" in r.stdout
    r = subprocess.run([sys.executable, "-m", "server.cli", "bench", "--no-such-option"], capture_output=True,
                       text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "unrecognized arguments: --no-such-option" in r.stderr
