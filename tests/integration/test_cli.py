"""The `muster` CLI through its real entry point (`python -m server.cli`) against a real
server subprocess and a real agent."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

import nats as nats_py
from server.broker.natsd import free_port
from tests.conftest import ROOT, wait_until
from tests.integration.conftest import Api, Cluster, ctrl_c_works, process_gone
from wire.messages import Event, encode


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
    assert "warning" not in r.stderr, r.stderr  # a host can take it
    job = json.loads(r.stdout)
    assert job["state"] == "SUCCEEDED"
    # Its id said before the wait (were the API lost meanwhile, the job would run all the same).
    assert r.stderr.startswith(f"{job['id']} submitted; waiting for it to end"), r.stderr
    r = muster(cluster, srv.url, "job", "logs", job["id"])
    assert r.returncode == 0 and "hi-there" in r.stdout and "attempt 1 on cli-1" in r.stdout, r.stdout + r.stderr
    r = muster(cluster, srv.url, "job", "logs", job["id"], "-o", "json")
    assert json.loads(r.stdout)[0]["outputTail"].strip() == "hi-there"
    # without a name: named after its command's program, as sbatch does
    r = muster(cluster, srv.url, "job", "submit", "--wait", "-o", "json", "--", "/bin/echo", "unnamed")
    assert r.returncode == 0, r.stderr
    assert (json.loads(r.stdout)["name"], json.loads(r.stdout)["state"]) == ("echo", "SUCCEEDED")

    # a job that fails: exit code 2, like `nomad job run`
    r = muster(cluster, srv.url, "job", "submit", "--wait", "bad", "--", "sh", "-c", "exit 3")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "FAILED" in r.stdout and "attempt 1 on cli-1: exit 3" in r.stderr, r.stderr  # and why

    # a job that can never be placed: --wait --timeout gives up with 2; `why` explains (exit 0)
    r = muster(cluster, srv.url, "job", "submit", "--gpus", "64", "--wait", "--timeout", "2", "huge", "--", "true")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "not placed" in r.stderr
    # ... and told at once that no host could ever take it
    assert ("warning: no host could run it even idle (of 1 known: 1 host: not enough GPUs on host); it waits for one "
            "that can") in r.stderr, r.stderr
    queued_id = r.stdout.split()[-2]  # table: ID STATE / <id> QUEUED
    r = muster(cluster, srv.url, "job", "why", queued_id)
    assert r.returncode == 0, r.stderr
    assert "QUEUED" in r.stdout and "position 1" in r.stdout and "GPU" in r.stdout.upper(), r.stdout
    assert ("it could never run as the cluster stands: no host could run it even idle (of 1 known: 1 host: not enough "
            "GPUs on host)") in r.stdout, r.stdout
    why = json.loads(muster(cluster, srv.url, "job", "why", queued_id, "-o", "json").stdout)
    assert why["queuePosition"] == 1 and why["pendingReasons"][0]["hosts"] == 1
    assert why["couldNeverRun"] == [
        "no host could run it even idle (of 1 known: 1 host: not enough GPUs on host); it waits for one that can"]
    assert muster(cluster, srv.url, "job", "why", "j-nope").returncode == 3
    # a job cancelled while waited for: 2, it did not do its work (found by exploring: 0)
    env = {**os.environ, "MUSTER_URL": srv.url, "MUSTER_TOKEN": cluster.token}
    waiting = subprocess.Popen([sys.executable, "-m", "server.cli", "job", "submit", "--gpus", "64", "--wait",
                                "doomed", "--", "true"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: json.loads(muster(cluster, srv.url, "job", "list", "--name", "doomed", "-o",
                                             "json").stdout)["totalCount"] == 1, timeout=60, what="doomed submitted")
        assert muster(cluster, srv.url, "job", "cancel", "--name", "doomed").returncode == 0
        out_, err_ = waiting.communicate(timeout=60)
    finally:
        waiting.kill()
    assert waiting.returncode == 2 and "CANCELLED" in out_, (out_, err_)

    # listings in json, filters
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
    assert h["gpus"] == 2 and h["health"] == "HEALTHY" and len(h["recentAttempts"]) == 3  # hello, the unnamed one, bad
    assert h["fences"] == 0 and "fences:" not in r.stdout  # shown once the host has fenced (test_failures)
    assert muster(cluster, srv.url, "host", "show", "nope").returncode == 3
    hosts = json.loads(muster(cluster, srv.url, "host", "list", "--rack", "r1", "-o", "json").stdout)
    assert hosts["totalCount"] == 1
    hosts = json.loads(muster(cluster, srv.url, "host", "list", "--rack", "r9", "-o", "json").stdout)
    assert hosts["totalCount"] == 0
    # cordon and uncordon take hosts as drain does: by rack or label too
    r = muster(cluster, srv.url, "host", "cordon", "--rack", "r1", "--reason", "cable check")
    assert r.returncode == 0 and "cli-1" in r.stdout and "yes" in r.stdout, r.stdout + r.stderr
    assert json.loads(muster(cluster, srv.url, "host", "show", "cli-1", "-o", "json").stdout)["cordoned"] is True
    r = muster(cluster, srv.url, "host", "uncordon", "cli-1", "--label", "rack=r1")  # named twice: once
    assert r.returncode == 0 and r.stdout.count("cli-1") == 1, r.stdout + r.stderr
    assert json.loads(muster(cluster, srv.url, "host", "show", "cli-1", "-o", "json").stdout)["cordoned"] is False
    r = muster(cluster, srv.url, "host", "cordon", "--reason", "x")
    assert r.returncode != 0 and "name the hosts to cordon" in r.stderr, r.stderr

    # --watch re-renders until Ctrl-C, which exits 0
    env = {**os.environ, "MUSTER_URL": srv.url, "MUSTER_TOKEN": cluster.token}
    p = subprocess.Popen([sys.executable, "-m", "server.cli", "host", "list", "--watch"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_works)
    assert p.stdout is not None
    seen = ""
    # Two renders (each is flushed), however slow the machine; a --watch that hangs is
    # killed after two minutes, which ends the read below with the output so far.
    deadline = threading.Timer(120, p.kill)
    deadline.start()
    try:
        while seen.count("cli-1") < 2:
            line = p.stdout.readline()
            assert line, f"--watch ended (or hung and was killed) before rendering twice: {seen!r}"
            seen += line
    finally:
        deadline.cancel()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=20)
    assert p.returncode == 0, err
    out = seen + out
    assert out.count("every 2s:") >= 2, out

    # --watch into a reader that stops reading (`| head -1`): a clean end, no traceback
    p = subprocess.Popen([sys.executable, "-m", "server.cli", "host", "list", "--watch"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stderr is not None
    deadline = threading.Timer(120, p.kill)
    deadline.start()
    try:
        assert p.stdout.readline().startswith("every 2s:")
        p.stdout.close()  # the next render writes into a closed pipe
        err = p.stderr.read()
        p.wait(timeout=20)
    finally:
        deadline.cancel()
    assert p.returncode == 0 and "Traceback" not in err, err

    # not found: 3, from a query's null (show) and from a mutation's NOT_FOUND userError
    for argv in (["job", "show", "j-nope"], ["job", "cancel", "j-nope"], ["host", "cordon", "nope", "--reason", "x"],
                 ["host", "drain", "nope", "--reason", "x"]):
        r = muster(cluster, srv.url, *argv)
        assert r.returncode == 3, (argv, r.stdout, r.stderr)
        assert r.stderr.startswith("error: ") and "nope" in r.stderr and "Traceback" not in r.stderr, r.stderr

    # a bad token, no token: 4; no API at the URL: 1
    r = subprocess.run([sys.executable, "-m", "server.cli", "job", "list"], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "MUSTER_URL": srv.url, "MUSTER_TOKEN": "wrong"}, timeout=60)
    assert r.returncode == 4
    assert "error: unauthorised" in r.stderr, r.stderr
    env = {k: v for k, v in os.environ.items() if k != "MUSTER_TOKEN"}
    r = subprocess.run(
        [sys.executable, "-m", "server.cli", "job", "list"],
        capture_output=True,
        text=True,
        cwd=cluster.tmp,
        env={**env, "MUSTER_URL": srv.url, "MUSTER_DATA_DIR": str(cluster.tmp / "none")},
        timeout=60,
    )
    assert r.returncode == 4 and "error: no token" in r.stderr, r.stderr
    r = muster(cluster, f"http://127.0.0.1:{free_port()}", "job", "list")
    assert r.returncode == 1 and "error: cannot reach" in r.stderr, r.stderr
    # An address that answers, not with the API (a wrong path, a proxy's error page): said,
    # not a traceback (found by exploring).
    r = muster(cluster, srv.url + "/console", "job", "list")
    assert r.returncode == 1 and "answered HTTP 404, not a GraphQL answer" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


PHASES = """
import os, sys, time
for i in range(3):
    print(f"first {i}", flush=True)
while not os.path.exists(sys.argv[1]):  # the test says when to go on
    time.sleep(0.05)
for i in range(3):
    print(f"second {i}", flush=True)
"""


def test_a_running_jobs_output_is_asked_of_its_agent_and_followed(cluster: Cluster) -> None:
    """`liveOutput` is what the running attempt has written so far, asked of its agent;
    `job logs -f` prints each new line once, then the end, and exits with the job."""
    srv = cluster.server()
    cluster.agent("out-1", gpus="1xH100")
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    go = cluster.tmp / "go"
    job_id = api.submit(name="phases", command=[sys.executable, "-c", PHASES, str(go)])["job"]["id"]
    q = """query($id: ID!) { job(id: $id) { state attempts { state outputTail liveOutput } } }"""

    def live() -> str:
        a = api.q(q, {"id": job_id})["job"]["attempts"]
        return (a[0]["liveOutput"] or "") if a else ""

    wait_until(lambda: "first 2" in live(), timeout=60, what="the first lines in liveOutput")
    assert live() == "first 0\nfirst 1\nfirst 2\n"
    # The agent counts what the process wrote in all (one request to it for both fields).
    a = api.q("""query($id: ID!) { job(id: $id) { attempts { liveOutput liveOutputBytes } } }""",
              {"id": job_id})["job"]["attempts"][0]
    assert a["liveOutputBytes"] == len(a["liveOutput"].encode()) == 24
    env = {**os.environ, "MUSTER_URL": srv.url, "MUSTER_TOKEN": cluster.token}
    p = subprocess.Popen([sys.executable, "-m", "server.cli", "job", "logs", "-f", job_id], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    deadline = threading.Timer(120, p.kill)
    deadline.start()
    try:
        seen = ""
        while "first 2" not in seen:
            line = p.stdout.readline()
            assert line, f"logs -f ended before the first lines: {seen!r}"
            seen += line
        go.touch()
        rest, err = p.communicate(timeout=90)
    finally:
        deadline.cancel()
    assert p.returncode == 0, err
    lines = (seen + rest).splitlines()
    assert lines[0].startswith("==> attempt 1 on out-1: RUNNING"), lines
    assert [x for x in lines if not x.startswith("==>")] == [f"first {i}" for i in range(3)] + [
        f"second {i}" for i in range(3)], lines
    assert lines[-1] == "==> attempt 1: SUCCEEDED (exit 0) <==", lines
    ended = api.q(q, {"id": job_id})["job"]
    assert ended["state"] == "SUCCEEDED" and ended["attempts"][0]["liveOutput"] is None
    assert ended["attempts"][0]["outputTail"].splitlines()[-1] == "second 2"
    # `job submit -f`: the output as it runs, then the exit code of --wait (2: FAILED).
    r = muster(cluster, srv.url, "job", "submit", "-f", "failing", "--", "sh", "-c", "echo one; echo two; exit 3")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("==> attempt 1 on out-1: ") and lines[1:3] == ["one", "two"], lines
    assert lines[-1] == "==> attempt 1: FAILED (exit 3) <==" or lines[0].endswith("FAILED (exit 3) <=="), lines
    assert "submitted" in r.stderr and "error: job " in r.stderr and "attempt 1 on out-1: exit 3" in r.stderr, r.stderr
    # `--array 3`: three jobs in one request, each told its index.
    r = muster(cluster, srv.url, "job", "submit", "--array", "3", "-o", "json", "sweep", "--", "sh", "-c",
               "echo index=$MUSTER_ARRAY_INDEX of $MUSTER_ARRAY_SIZE")
    assert r.returncode == 0, r.stderr
    jobs = json.loads(r.stdout)
    assert [j["name"] for j in jobs] == ["sweep-0", "sweep-1", "sweep-2"]
    for i, j in enumerate(jobs):
        done = api.wait_job(j["id"], {"SUCCEEDED", "FAILED"})
        assert done["state"] == "SUCCEEDED" and done["attempts"][0]["outputTail"] == f"index={i} of 3\n", done
    # `job cancel` takes several ids: each cancelled, an unknown one listed as refused (exit 3).
    # (Indices as Slurm writes them: `--array 10,20` is the two jobs long-10 and long-20.)
    r = muster(cluster, srv.url, "job", "submit", "--array", "10,20", "-o", "json", "long", "--", "sleep", "600")
    assert [j["name"] for j in json.loads(r.stdout)] == ["long-10", "long-20"], r.stdout + r.stderr
    ids = [j["id"] for j in json.loads(r.stdout)]
    r = muster(cluster, srv.url, "job", "cancel", *ids, "j-nope", "--reason", "sweep over")
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout.count("cancel requested") == 2 and re.search(r"j-nope +refused: no job j-nope", r.stdout), r.stdout
    for job_id in ids:
        assert api.wait_job(job_id, {"CANCELLED"})["state"] == "CANCELLED"
    # An array no host could take: its jobs' warning, shared, is printed once.
    r = muster(cluster, srv.url, "job", "submit", "--array", "2", "--gpus", "64", "-o", "json", "vast", "--", "true")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("warning: no host could run it even idle") == 1, r.stderr
    assert muster(cluster, srv.url, "job", "cancel", "--name", "vast-", "--reason", "too big").returncode == 0
    # ... or filters, as scancel: a whole array by its name prefix, and nothing else.
    r = muster(cluster, srv.url, "job", "submit", "--array", "3", "-o", "json", "wide", "--", "sleep", "600")
    ids = [j["id"] for j in json.loads(r.stdout)]
    other = json.loads(muster(cluster, srv.url, "job", "submit", "-o", "json", "widen", "--", "sleep", "600").stdout)
    r = muster(cluster, srv.url, "job", "cancel", "--name", "wide-", "--reason", "sweep over", "-o", "json")
    assert r.returncode == 0 and "cancel requested for 3 job(s)" in r.stderr, r.stdout + r.stderr
    assert json.loads(r.stdout)["jobIds"] == ids
    for job_id in ids:
        assert api.wait_job(job_id, {"CANCELLED"})["state"] == "CANCELLED"
    assert api.q('query($id: ID!) { job(id: $id) { cancelReason } }', {"id": ids[0]})["job"]["cancelReason"] \
        == "sweep over"
    assert api.job(other["id"])["state"] in ("QUEUED", "PLACED", "RUNNING")
    # Filters that match nothing say so, with no empty table.
    r = muster(cluster, srv.url, "job", "cancel", "--name", "nothing-by-this-name", "--reason", "none")
    assert r.returncode == 0 and r.stdout == "" and "no job matches" in r.stderr, r.stdout + r.stderr
    r = muster(cluster, srv.url, "job", "cancel", other["id"], "--name", "widen")
    assert r.returncode == 1 and "not both" in r.stderr, r.stderr
    api.q('mutation($id: ID!) { cancelJob(id: $id) { job { id } } }', {"id": other["id"]})


def test_a_team_token_is_told_the_jobs_its_filters_match_are_of_other_queues(cluster: Cluster) -> None:
    """Found by exploring: a token bound to queues a and b running `job cancel --name x`
    (hold, release alike) was told "no job matches: nothing to cancel" while jobs named x
    were queued in default; and the server announced its bootstrap token, an admin's, as an
    "Operator token" alone (its role is said now)."""
    srv = cluster.server()
    # The first start's token is announced as what it is (printed once the port is open).
    wait_until(lambda: "token (" in srv.output(), timeout=30, what="the token announced")
    assert (f"Operator token (its role is admin; shown once, also in {cluster.tmp / 'server' / 'token'}): "
            f"{cluster.token}") in srv.output(), srv.output()
    api = Api(srv.url, cluster.token)
    for queue in ("a", "b"):
        r = muster(cluster, srv.url, "queue", "create", queue)
        assert r.returncode == 0, r.stdout + r.stderr
    r = muster(cluster, srv.url, "job", "submit", "-o", "json", "x-1", "--", "true")  # default: no host takes it
    assert r.returncode == 0, r.stderr
    job_id = json.loads(r.stdout)["id"]
    r = subprocess.run([sys.executable, "-m", "server.cli", "token", "create", "team", "--role", "operator",
                        "--queues", "a,b", "--nats", cluster.nats_url], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    team = r.stdout.strip().splitlines()[-1]
    wait_until(lambda: api.raw("{ ping }", token=team).status_code == 200, timeout=10, what="the team's token")
    env = {**os.environ, "MUSTER_URL": srv.url, "MUSTER_TOKEN": team}
    for argv in (["job", "cancel", "--name", "x-", "--reason", "r"], ["job", "hold", "--name", "x-"]):
        r = subprocess.run([sys.executable, "-m", "server.cli", *argv], capture_output=True, text=True, cwd=ROOT,
                           env=env, timeout=60)
        assert r.returncode == 4, r.stdout + r.stderr
        assert "no job matches" not in r.stderr, r.stderr
        assert (f"no job of this token's queues (a, b) matches: nothing to {argv[1]}; 1 job(s) that match are of "
                "other queues, and this token acts only on jobs of its queues (a, b)") in r.stderr, r.stderr
    assert api.job(job_id)["state"] == "QUEUED"
    r = muster(cluster, srv.url, "job", "cancel", "--name", "x-", "--reason", "done")  # the admin's token
    assert r.returncode == 0 and "cancel requested for 1 job(s)" in r.stderr, r.stdout + r.stderr


def test_hold_release_and_priority_from_the_cli(cluster: Cluster) -> None:
    """`job hold` keeps a queued job from being placed while the GPU it waits for is free
    and later jobs take it; `job release` puts it back; `job set --priority` moves a job."""
    srv = cluster.server()
    cluster.agent("hold-1", gpus="1xH100")
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)

    def submit(name: str, *command: str) -> str:
        r = muster(cluster, srv.url, "job", "submit", "--gpus", "1", "-o", "json", name, "--", *command)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["id"]

    blocker = submit("blocker", "sleep", "600")
    api.wait_job(blocker, {"RUNNING"})
    shown = muster(cluster, srv.url, "job", "show", blocker).stdout
    assert ": RUNNING" in shown and "exit=" not in shown, shown  # no exit code yet ("exit=None" was printed)
    held = submit("held", "true")
    r = muster(cluster, srv.url, "job", "hold", held, "--reason", "dataset not ready")
    assert r.returncode == 0 and "change requested" in r.stdout, r.stdout + r.stderr
    wait_until(lambda: "held by operator: dataset not ready" in muster(cluster, srv.url, "job", "show", held).stdout,
               timeout=30, what="the hold shown")
    assert re.search(rf"{held} +held +QUEUED held", muster(cluster, srv.url, "job", "list").stdout)
    wait_until(lambda: 'muster_jobs_parked{why="held"} 1.0' in httpx.get(srv.url + "/metrics", timeout=30).text,
               timeout=30, what="the held job in the metrics")
    shown = muster(cluster, srv.url, "queue", "show", "default").stdout
    assert "pending 0 (and 1 held, waiting for other jobs or for a time ahead), running 1" in shown, shown
    # Many held at once by a filter (scontrol hold of a list), released at the end.
    batch = [submit(f"batch-{i}", "true") for i in range(2)]
    r = muster(cluster, srv.url, "job", "hold", "--name", "batch-", "--reason", "dataset not ready")
    assert r.returncode == 0 and "hold requested for 2 job(s)" in r.stderr and set(r.stdout.split()) >= set(batch), r
    r = muster(cluster, srv.url, "job", "hold", batch[0], "--name", "batch-")
    assert r.returncode != 0 and "not both" in r.stderr, r.stderr
    wait_until(lambda: all(api.q('query($id: ID!) { job(id: $id) { hold } }', {"id": b})["job"]["hold"]
                           for b in batch), timeout=30, what="the batch held")
    # Of the same priority and submitted later, so behind the held jobs in the queue.
    later = submit("later", "true")
    api.q('mutation($id: ID!) { cancelJob(id: $id) { job { id } } }', {"id": blocker})
    assert api.wait_job(later, {"SUCCEEDED"})["state"] == "SUCCEEDED"  # the GPU was free: the held job stayed
    assert api.job(held)["state"] == "QUEUED"
    r = muster(cluster, srv.url, "job", "set", held, "--priority", "7")
    assert r.returncode == 0, r.stderr
    wait_until(lambda: "priority 7" in muster(cluster, srv.url, "job", "show", held).stdout, timeout=30,
               what="the new priority shown")
    r = muster(cluster, srv.url, "job", "hold", later)  # it has ended
    assert r.returncode == 1 and "already SUCCEEDED" in r.stderr, r.stderr
    r = muster(cluster, srv.url, "job", "release", held)
    assert r.returncode == 0, r.stderr
    assert api.wait_job(held, {"SUCCEEDED"})["state"] == "SUCCEEDED"
    # Submitted held (sbatch -H): it waits for its release with the GPU free.
    r = muster(cluster, srv.url, "job", "submit", "--gpus", "1", "--hold", "-o", "json", "born-held", "--", "true")
    born = json.loads(r.stdout)
    assert born["state"] == "QUEUED" and api.q('query($id: ID!) { job(id: $id) { hold } }',
                                                {"id": born["id"]})["job"]["hold"] == "held by operator at submission"
    muster(cluster, srv.url, "job", "release", born["id"])
    assert api.wait_job(born["id"], {"SUCCEEDED"})["state"] == "SUCCEEDED"
    assert all(api.job(b)["state"] == "QUEUED" for b in batch)  # still held, the GPU free
    r = muster(cluster, srv.url, "job", "release", "--queue", "default", "--name", "batch-")
    assert r.returncode == 0 and "release requested for 2 job(s)" in r.stderr, r.stderr
    assert all(api.wait_job(b, {"SUCCEEDED"})["state"] == "SUCCEEDED" for b in batch)
    r = muster(cluster, srv.url, "job", "release", "--name", "batch-")
    assert r.returncode == 0 and "no job matches: nothing to release" in r.stderr, r.stderr
    r = muster(cluster, srv.url, "job", "hold", "--queue", "defualt")
    assert r.returncode != 0 and "no queue 'defualt'" in r.stderr, r.stderr


def test_requeue_from_the_cli(cluster: Cluster) -> None:
    """`job requeue` stops a running job's try and runs it again, not counting the try (one
    attempt allowed, a second made); with --hold it stays queued, held."""
    srv = cluster.server()
    cluster.agent("rq-1", gpus="1xH100")
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    r = muster(cluster, srv.url, "job", "submit", "--gpus", "1", "--max-attempts", "1", "-o", "json", "long",
               "--", "sleep", "600")
    job = json.loads(r.stdout)["id"]
    api.wait_job(job, {"RUNNING"})
    r = muster(cluster, srv.url, "job", "requeue", job, "--reason", "bad node")
    assert r.returncode == 0 and "requeue requested" in r.stdout, r.stdout + r.stderr

    def tries() -> list[dict[str, Any]]:
        return api.job(job)["attempts"]

    wait_until(lambda: len(tries()) == 2 and tries()[1]["state"] == "RUNNING", timeout=60, what="the second try")
    assert tries()[0]["state"] == "KILLED" and tries()[0]["reason"] == "requeued by operator: bad node"
    r = muster(cluster, srv.url, "job", "requeue", job, "--hold")
    assert r.returncode == 0, r.stderr
    wait_until(lambda: api.job(job)["state"] == "QUEUED" and tries()[1]["state"] == "KILLED", timeout=60,
               what="queued again, held")
    assert "held by operator" in muster(cluster, srv.url, "job", "show", job).stdout
    r = muster(cluster, srv.url, "job", "requeue", job)
    assert r.returncode == 1 and "only a placed or running job is requeued" in r.stderr, r.stderr
    api.q('mutation($id: ID!) { cancelJob(id: $id) { job { id } } }', {"id": job})


def test_jobs_run_after_their_dependencies(cluster: Cluster) -> None:
    """`--after`: a job starts only once the job it runs after has ended (checked from the
    times the tasks write themselves); under afterok a failed dependency cancels it, under
    --after-any it runs all the same, under --after-notok it runs because of it (and a
    dependency that succeeds cancels it); an unknown or already failed dependency is
    refused."""
    srv = cluster.server()
    cluster.agent("dep-1", gpus="1xH100")
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    d = cluster.tmp

    def submit(name: str, script: str, *opts: str) -> subprocess.CompletedProcess[str]:
        return muster(cluster, srv.url, "job", "submit", *opts, "-o", "json", name, "--", "sh", "-c", script)

    r = submit("first", f"sleep 1; date +%s.%N > {d}/first.end", "--hold")
    assert r.returncode == 0, r.stderr
    a = json.loads(r.stdout)["id"]
    b = json.loads(submit("second", f"date +%s.%N > {d}/second.start", "--after", a).stdout)["id"]
    shown = muster(cluster, srv.url, "job", "show", b).stdout
    assert f"runs after: {a} (once they SUCCEEDED); waiting for {a}" in shown, shown
    assert f"pending: queue: waiting for other jobs ({a} to succeed" in shown, shown
    assert muster(cluster, srv.url, "job", "release", a).returncode == 0
    assert api.wait_job(b, {"SUCCEEDED"})["state"] == "SUCCEEDED"
    assert float((d / "second.start").read_text()) >= float((d / "first.end").read_text())
    # Held until its dependents are submitted: they must find it not ended yet.
    f = json.loads(submit("fails", "exit 3", "--max-attempts", "1", "--hold").stdout)["id"]
    c = json.loads(submit("after-ok", "true", "--after", f).stdout)["id"]
    e = json.loads(submit("after-any", "true", "--after", f, "--after-any").stdout)["id"]
    n = json.loads(submit("on-failure", "true", "--after", f, "--after-notok").stdout)["id"]
    shown = muster(cluster, srv.url, "job", "show", n).stdout
    assert f"runs after: {f} (once they ended otherwise than SUCCEEDED)" in shown, shown
    assert f"({f} to end otherwise than SUCCEEDED" in shown, shown
    assert api.q('query($id: ID!) { job(id: $id) { dependency } }', {"id": n})["job"]["dependency"] == "AFTER_NOT_OK"
    assert muster(cluster, srv.url, "job", "release", f).returncode == 0
    assert api.wait_job(f, {"FAILED"})["state"] == "FAILED"
    assert api.wait_job(c, {"CANCELLED"})["state"] == "CANCELLED"
    reason = api.q('query($id: ID!) { job(id: $id) { cancelReason } }', {"id": c})["job"]["cancelReason"]
    assert reason == f"dependency {f} ended FAILED: it could never run (afterok)"
    assert api.wait_job(e, {"SUCCEEDED"})["state"] == "SUCCEEDED"
    assert api.wait_job(n, {"SUCCEEDED"})["state"] == "SUCCEEDED"
    # afternotok after a job that succeeds: cancelled when it does, refused once it has.
    r = submit("late-notok", "true", "--after", a, "--after-notok")
    assert r.returncode == 1 and f"job {a} ended SUCCEEDED: this job could never run (afternotok" in r.stderr, \
        r.stderr
    ok = json.loads(submit("fine", "sleep 1", "--hold").stdout)["id"]
    skipped = json.loads(submit("on-fine-failing", "true", "--after", ok, "--after-notok").stdout)["id"]
    assert muster(cluster, srv.url, "job", "release", ok).returncode == 0
    assert api.wait_job(skipped, {"CANCELLED"})["state"] == "CANCELLED"
    reason = api.q('query($id: ID!) { job(id: $id) { cancelReason } }', {"id": skipped})["job"]["cancelReason"]
    assert reason == f"dependency {ok} ended SUCCEEDED: it could never run (afternotok)"
    r = submit("both", "true", "--after", ok, "--after-any", "--after-notok")
    assert r.returncode != 0 and "exclude each other" in r.stderr, r.stderr
    r = submit("late", "true", "--after", f)
    assert r.returncode == 1 and f"job {f} ended FAILED: this job could never run" in r.stderr, r.stderr
    r = submit("orphan", "true", "--after", "jnosuchjob1")
    assert r.returncode == 1 and "no job jnosuchjob1" in r.stderr, r.stderr


def test_alerts_tail_prints_new_alerts(cluster: Cluster) -> None:
    """`alerts tail -n 1` prints the last alert, then each new one. An alert published
    before the CLI starts is printed either way (the last one, or new after its first
    look); one published once that has been printed is new to it; older ones recorded
    before it started are not printed (they used to be, as new, at its first poll)."""
    srv = cluster.server()
    env = {**os.environ, "MUSTER_URL": srv.url, "MUSTER_TOKEN": cluster.token, "PYTHONUNBUFFERED": "1"}

    async def publish(host: str) -> None:
        nc = await nats_py.connect(cluster.nats_url)
        ev = Event(kind="host.lost", host_id=host, message="heartbeat key expired")
        await nc.publish("alerts.host.lost", encode(ev))
        await nc.flush()
        await nc.close()

    for host in ("tail-old-1", "tail-old-2"):
        asyncio.run(publish(host))
    api = Api(srv.url, cluster.token)
    wait_until(lambda: len(api.q('{ alerts(first: 10) { edges { node { id } } } }')["alerts"]["edges"]) == 2,
               timeout=60, what="the older alerts recorded")
    asyncio.run(publish("tail-before"))
    p = subprocess.Popen([sys.executable, "-m", "server.cli", "alerts", "tail", "-n", "1", "-o", "json",
                          "--interval", "0.5"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=ctrl_c_works)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()

    def printed(host: str) -> dict[str, Any] | None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            for line in list(lines):
                a = json.loads(line)
                if a["hostId"] == host:
                    return a
            if p.poll() is not None:
                break
            time.sleep(0.1)
        return None

    try:
        assert printed("tail-before") is not None, (lines, p.poll())  # its first look is behind it
        asyncio.run(publish("tail-host"))
        found = printed("tail-host")
        assert found is not None, (lines, p.poll())
        assert found["kind"] == "host.lost" and found["message"] == "heartbeat key expired"
        time.sleep(1.5)  # a few more polls
        assert [json.loads(line)["hostId"] for line in list(lines)] == ["tail-before", "tail-host"], lines
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


def test_bench_runs_as_a_subprocess_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    """`muster bench` runs `python -m bench` as a child (the CLI never imports bench), and
    a SIGINT sent to `muster` alone reaches the bench, which stops what it started; the
    exit code is the bench's own (ended by SIGINT: 130)."""
    work = tmp_path / "bench-work"
    log = open(tmp_path / "muster-bench.log", "wb")
    p = subprocess.Popen([sys.executable, "-m", "server.cli", "bench", "--hosts", "4", "--rate", "1",
                          "--duration", "600", "--work-dir", str(work), "--json", str(tmp_path / "b.json")],
                         cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, preexec_fn=ctrl_c_works)
    try:
        def bench_child() -> psutil.Process | None:
            for c in psutil.Process(p.pid).children():
                if c.cmdline()[1:3] == ["-m", "bench"]:
                    return c
            return None

        bench = wait_until(bench_child, timeout=60, what="the `python -m bench` child")
        # Wait until the bench has started something of its own (its nats-server) to stop.
        wait_until(lambda: bench.children(recursive=True), timeout=90, what="the bench's own children")
        started = [c.pid for c in bench.children(recursive=True)]
        p.send_signal(signal.SIGINT)
        p.wait(90)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        log.close()
    assert p.returncode == 130, (tmp_path / "muster-bench.log").read_text()
    assert process_gone(bench.pid)
    assert all(process_gone(pid) for pid in started), started


def test_agent_entry_points() -> None:
    """`muster-agent`, `python -m agent` and `muster agent` are one parser (agent.cli)."""
    script = Path(sys.executable).parent / "muster-agent"
    runs = {
        "muster-agent": [str(script)],
        "python -m agent": [sys.executable, "-m", "agent"],
        "muster agent": [sys.executable, "-m", "server.cli", "agent"],
    }
    helps = {}
    for name, argv in runs.items():
        r = subprocess.run([*argv, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert r.returncode == 0, (name, r.stderr)
        assert "--simulate-gpus" in r.stdout and "--fence-after" in r.stdout and "--creds" in r.stdout, r.stdout
        helps[name] = r.stdout.split("options:", 1)[1]
    assert "usage: muster agent" in subprocess.run(runs["muster agent"] + ["--help"], capture_output=True,
                                                   text=True, cwd=ROOT, timeout=60).stdout
    assert helps["muster-agent"] == helps["python -m agent"] == helps["muster agent"]
    # Bad labels are an error (exit 1) with a message, not a traceback; a bad option is argparse's 2.
    for name, argv in runs.items():
        r = subprocess.run([*argv, "--labels", "no-equals-sign"], capture_output=True, text=True, cwd=ROOT,
                           timeout=60)
        assert r.returncode == 1, (name, r.stdout, r.stderr)
        assert "error: label 'no-equals-sign' is not key=value" in r.stderr and "Traceback" not in r.stderr
        r = subprocess.run([*argv, "--no-such-option"], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert r.returncode == 2 and "unrecognized arguments: --no-such-option" in r.stderr, (name, r.stderr)


def test_a_host_short_of_disk_takes_no_new_work_and_says_why(cluster: Cluster) -> None:
    """An agent whose disk is below its `--min-free-disk-mb` (here: more than any disk has)
    is passed over: a job waits, saying why, and `host show` / `host list` say so."""
    srv = cluster.server()
    cluster.agent("tight", gpus="1xH100", min_free_disk_mb=10**9)
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    wait_until(lambda: api.q('{ host(id: "tight") { pressure } }')["host"]["pressure"], timeout=60,
               what="the host's pressure")
    r = muster(cluster, srv.url, "job", "submit", "--gpus", "1", "-o", "json", "waits", "--", "true")
    assert r.returncode == 0, r.stderr
    job_id = json.loads(r.stdout)["id"]
    wait_until(lambda: any(p["reason"] == "host asks for no new work" and p["hosts"] == 1
                           for p in api.job(job_id)["pendingReasons"]), timeout=60, what="the job's reason")
    assert api.job(job_id)["state"] == "QUEUED"
    shown = muster(cluster, srv.url, "host", "show", "tight").stdout
    assert "takes no new work: disk: less than 1000000000 MB free in its directory for attempts" in shown, shown
    assert "PRESSURE" in muster(cluster, srv.url, "host", "list").stdout
    assert "tight" in muster(cluster, srv.url, "host", "list", "--pressure").stdout
    assert "tight" not in muster(cluster, srv.url, "host", "list", "--no-pressure").stdout
    # A job no host could take however idle is still told so; this one is not.
    assert "could never run" not in muster(cluster, srv.url, "job", "why", job_id).stdout
    # The operators are told once (alerts.host.pressure, recorded).
    q = '{ alerts(first: 10, kind: "host.pressure") { edges { node { hostId message } } } }'
    wait_until(lambda: api.q(q)["alerts"]["edges"], timeout=60, what="the host.pressure alert")
    [alert] = [e["node"] for e in api.q(q)["alerts"]["edges"]]
    assert alert["hostId"] == "tight" and alert["message"].startswith("host tight takes no new work: disk: less than")
