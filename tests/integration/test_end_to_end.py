"""End to end: real nats-server, a real `muster server` and real `muster agent`
processes, driven through the GraphQL API and the CLI."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_until
from tests.integration.conftest import Api, Cluster, assert_invariants
from wire.kv import Store, connect
from wire.messages import HostAlloc, decode
from wire.records import Record

PY = sys.executable


@pytest.fixture
def two_hosts(cluster: Cluster) -> tuple[Cluster, Api]:
    srv = cluster.server()
    cluster.agent("host-a", gpus="8xH100", labels="rack=r1,zone=z1")
    cluster.agent("host-b", gpus="8xH100", labels="rack=r2,zone=z1")
    api = Api(srv.url, cluster.token)
    api.wait_hosts(2)
    return cluster, api


def test_job_runs_on_a_gpu_and_succeeds_with_output(two_hosts: tuple[Cluster, Api]) -> None:
    cluster, api = two_hosts
    res = api.submit(
        name="hello",
        command=[PY, "-c", "import os; print('hello from', os.environ['CUDA_VISIBLE_DEVICES'])"],
        gpus=1,
        cpus=1,
        memoryMb=256,
    )
    assert res["userErrors"] == []
    assert res["job"]["state"] == "QUEUED"
    job = api.wait_job(res["job"]["id"], {"SUCCEEDED", "FAILED"}, timeout=60)
    assert job["state"] == "SUCCEEDED"
    [attempt] = job["attempts"]
    assert attempt["exitCode"] == 0
    assert attempt["host"]["id"] in ("host-a", "host-b")
    assert len(attempt["gpuIndices"]) == 1
    assert f"hello from {attempt['gpuIndices'][0]}" in attempt["outputTail"]
    # The cluster view and the history agree.
    c = api.q("{ cluster { hosts { total healthy lost } gpus { total allocated } jobs { succeeded failed } } }")[
        "cluster"
    ]
    assert c["hosts"] == {"total": 2, "healthy": 2, "lost": 0}
    assert c["gpus"]["total"] == 16
    assert c["jobs"]["succeeded"] == 1
    wait_until(lambda: api.q("{ jobs(first: 10) { totalCount } }")["jobs"]["totalCount"] == 1, what="history row")
    listing = api.q("{ jobs(first: 10) { totalCount edges { node { id state } } } }")["jobs"]
    assert [e["node"] for e in listing["edges"]] == [{"id": res["job"]["id"], "state": "SUCCEEDED"}]


def test_failing_job_reports_its_exit_code(two_hosts: tuple[Cluster, Api]) -> None:
    cluster, api = two_hosts
    res = api.submit(name="fails", command=[PY, "-c", "import sys; print('bad'); sys.exit(3)"], cpus=1, memoryMb=64)
    job = api.wait_job(res["job"]["id"], {"SUCCEEDED", "FAILED"})
    assert job["state"] == "FAILED"
    assert job["attempts"][0]["exitCode"] == 3
    assert "bad" in job["attempts"][0]["outputTail"]


def test_job_that_cannot_fit_waits_with_reasons_then_runs(cluster: Cluster, tmp_path: Path) -> None:
    srv = cluster.server()
    cluster.agent("small", gpus="2xH100")
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    gate = tmp_path / "gate"
    hold = api.submit(
        name="hold",
        command=[PY, "-c", f"import os,time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)"],
        gpus=2,
        cpus=1,
        memoryMb=64,
    )
    api.wait_job(hold["job"]["id"], {"RUNNING"})
    waiting = api.submit(name="waits", command=[PY, "-c", "print('ran')"], gpus=2, cpus=1, memoryMb=64)
    too_big = api.submit(name="never", command=["true"], gpus=4, cpus=1, memoryMb=64)
    wrong = api.submit(name="wrong", command=["true"], gpus=1, gpuModel="A100", cpus=1, memoryMb=64)
    w = api.job(waiting["job"]["id"])
    assert w["state"] == "QUEUED"
    assert w["queuePosition"] >= 1
    assert {"reason": "not enough free GPUs", "hosts": 1} in w["pendingReasons"]
    assert api.job(too_big["job"]["id"])["pendingReasons"] == [{"reason": "not enough GPUs on host", "hosts": 1}]
    assert api.job(wrong["job"]["id"])["pendingReasons"] == [{"reason": "wrong GPU model", "hosts": 1}]
    # More CPUs or memory than the host has at all, against more than it has free: the
    # host could not take the first even idle, and says so.
    many = api.submit(name="many-cpus", command=["true"], gpus=0, cpus=1024, memoryMb=64)
    busy = api.submit(name="busy", command=["true"], gpus=1, cpus=1, memoryMb=64)
    assert many["job"] and busy["job"], (many, busy)
    reasons = """query($id: ID!) { job(id: $id) { pendingReasons { reason hosts kind detail } } }"""
    assert api.q(reasons, {"id": many["job"]["id"]})["job"]["pendingReasons"] == [
        {"reason": "not enough CPUs on host", "hosts": 1, "kind": "host",
         "detail": "these hosts could not take it even idle"}]
    assert api.q(reasons, {"id": too_big["job"]["id"]})["job"]["pendingReasons"][0]["detail"] \
        == "these hosts could not take it even idle"
    assert {"reason": "not enough free GPUs", "hosts": 1, "kind": "host", "detail": ""} \
        in api.q(reasons, {"id": busy["job"]["id"]})["job"]["pendingReasons"]
    for j in (many, busy):
        api.q("mutation($id: ID!) { cancelJob(id: $id) { userErrors { message } } }", {"id": j["job"]["id"]})
    gate.write_text("go")
    done = api.wait_job(waiting["job"]["id"], {"SUCCEEDED", "FAILED"})
    assert done["state"] == "SUCCEEDED"
    assert api.job(hold["job"]["id"])["state"] == "SUCCEEDED"
    assert api.job(too_big["job"]["id"])["state"] == "QUEUED"


def test_cancel_stops_a_running_job(two_hosts: tuple[Cluster, Api]) -> None:
    cluster, api = two_hosts
    res = api.submit(name="sleeper", command=[PY, "-c", "import time; print('started', flush=True); time.sleep(600)"],
                     gpus=1, cpus=1, memoryMb=64)
    api.wait_job(res["job"]["id"], {"RUNNING"})
    r = api.q('mutation($id: ID!) { cancelJob(id: $id, reason: "test") { job { id } userErrors { code } } }',
              {"id": res["job"]["id"]})
    assert r["cancelJob"]["userErrors"] == []
    job = api.wait_job(res["job"]["id"], {"CANCELLED"})
    # The attempt is reported stopped by the agent, and its GPUs are freed.
    wait_until(lambda: api.job(res["job"]["id"])["attempts"][0]["state"] == "KILLED", what="attempt killed")
    wait_until(lambda: api.q("{ cluster { gpus { allocated } } }")["cluster"]["gpus"]["allocated"] == 0,
               what="GPUs freed")
    assert job["state"] == "CANCELLED"


def test_bad_input_is_rejected_and_nothing_is_stored(two_hosts: tuple[Cluster, Api]) -> None:
    cluster, api = two_hosts
    cases = [
        (dict(name="neg", command=["true"], gpus=-1), "gpus", "OUT_OF_RANGE"),
        (dict(name="zero", command=["true"], gpus=0, cpus=0, memoryMb=0), "cpus", "OUT_OF_RANGE"),
        (dict(name="absurd", command=["true"], gpus=100000), "gpus", "OUT_OF_RANGE"),
        (dict(name="mem", command=["true"], memoryMb=2**31 - 1), "memoryMb", "OUT_OF_RANGE"),
        (dict(name="empty", command=[]), "command", "EMPTY_COMMAND"),
        (dict(name="blank", command=[""]), "command", "EMPTY_COMMAND"),
        (dict(name="model", command=["true"], gpus=1, gpuModel="NOPE9000"), "gpuModel", "UNKNOWN_GPU_MODEL"),
        (dict(name="bad name!", command=["true"]), "name", "INVALID"),
    ]
    for inp, field, code in cases:
        res = api.submit(**inp)
        assert res["job"] is None, inp
        assert any(e["field"] == field and e["code"] == code for e in res["userErrors"]), (inp, res)
    assert api.q("{ cluster { jobs { queued placed running succeeded failed } } }")["cluster"]["jobs"] == {
        "queued": 0, "placed": 0, "running": 0, "succeeded": 0, "failed": 0}
    assert api.q("{ jobs(first: 5) { totalCount } }")["jobs"]["totalCount"] == 0


def test_requests_without_a_valid_token_get_401(two_hosts: tuple[Cluster, Api]) -> None:
    cluster, api = two_hosts
    assert api.raw("{ ping }", token="").status_code == 401
    assert api.raw("{ ping }", token="wrong-token").status_code == 401
    assert api.raw("{ ping }").status_code == 200
    q = 'mutation { submitJob(input: {name: "x", command: ["true"]}) { job { id } } }'
    assert api.raw(q, token="wrong-token").status_code == 401
    assert api.q("{ jobs(first: 5) { totalCount } }")["jobs"]["totalCount"] == 0


def test_many_jobs_at_once_never_overcommit(cluster: Cluster, nats_url: str) -> None:
    """60 jobs of 1-3 GPUs onto two 4-GPU hosts; every revision of every allocation
    record, watched live from the store, stays within capacity."""
    srv = cluster.server()
    cluster.agent("c1", gpus="4xH100", cpus=8, memory_mb=4096)
    cluster.agent("c2", gpus="4xH100", cpus=8, memory_mb=4096)
    api = Api(srv.url, cluster.token)
    api.wait_hosts(2)
    seen: list[HostAlloc] = []
    stop = threading.Event()
    ready = threading.Event()

    def watcher() -> None:
        async def main() -> None:
            nc = await connect(nats_url, name="checker")
            store = Store(nc)

            def on(rec: Record) -> None:
                if rec.key.startswith("alloc.") and rec.value:
                    seen.append(decode(HostAlloc, rec.value))

            w = await store.watch("alloc.>", on)
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            await w.stop()
            await nc.close()

        asyncio.run(main())

    t = threading.Thread(target=watcher)
    t.start()
    ready.wait(30)
    ids = []
    for i in range(60):
        res = api.submit(name=f"burst-{i}", command=[PY, "-c", "import time; time.sleep(0.2)"],
                         gpus=1 + i % 3, cpus=1 + i % 4, memoryMb=512 + 100 * (i % 5))
        assert res["userErrors"] == []
        ids.append(res["job"]["id"])
    for jid in ids:
        assert api.wait_job(jid, {"SUCCEEDED", "FAILED"}, timeout=180)["state"] == "SUCCEEDED"
    stop.set()
    t.join(30)
    assert seen, "the allocation watch saw nothing"
    for alloc in seen:
        gpus = [i for task in alloc.tasks for i in task.gpu_indices]
        assert len(gpus) == len(set(gpus)), f"GPU given twice on {alloc.host_id}: {alloc}"
        assert all(0 <= i < 4 for i in gpus)
        assert sum(task.cpus for task in alloc.tasks) <= 8
        assert sum(task.memory_mb for task in alloc.tasks) <= 4096
    # Each job ran exactly once: one attempt, one placement.
    placed = defaultdict(set)
    for alloc in seen:
        for task in alloc.tasks:
            placed[task.job_id].add(task.attempt_id)
    assert set(placed) == set(ids)
    assert all(len(v) == 1 for v in placed.values())


def test_cli_submit_list_show_cancel(two_hosts: tuple[Cluster, Api]) -> None:
    cluster, api = two_hosts
    env = {**os.environ, "MUSTER_URL": api.url.removesuffix("/graphql"), "MUSTER_TOKEN": cluster.token}

    def muster(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PY, "-m", "server.cli", *args], capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=120)

    r = muster("job", "submit", "--gpus", "1", "--wait", "-o", "json", "cli-job", "--", PY, "-c", "print(42)")
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert job["state"] == "SUCCEEDED"
    assert "42" in job["attempts"][0]["outputTail"]
    # The list reads the history database, which the historian process fills
    # asynchronously (at nice +10): wait for the row rather than race it.
    wait_until(lambda: job["id"] in muster("job", "list", "-o", "json").stdout, what="the job in `job list`")
    r = muster("job", "show", job["id"])
    assert "SUCCEEDED" in r.stdout and "42" in r.stdout
    r = muster("job", "show", "j-does-not-exist")
    assert r.returncode == 3
    r = muster("job", "submit", "bad", "--", "")
    assert r.returncode == 1 and "command" in r.stderr
    r = muster("host", "list", "-o", "json")
    hosts = json.loads(r.stdout)
    assert hosts["totalCount"] == 2
    r = muster("host", "cordon", "host-a", "--reason", "maintenance")
    assert r.returncode == 0, r.stderr
    assert api.q('{ host(id: "host-a") { cordoned } }')["host"]["cordoned"] is True
    r = muster("job", "cancel", job["id"])
    assert r.returncode == 1 and "already" in r.stderr
    env["MUSTER_TOKEN"] = "nope"
    assert muster("job", "list").returncode == 4


def test_cordoned_host_gets_no_new_work(two_hosts: tuple[Cluster, Api]) -> None:
    cluster, api = two_hosts
    r = api.q('mutation { cordonHost(input: {id: "host-a", reason: "disk"}) '
              '{ host { cordoned } userErrors { code } } }')
    assert r["cordonHost"]["host"]["cordoned"] is True
    ids = [api.submit(name=f"c{i}", command=["true"], gpus=1, cpus=1, memoryMb=64)["job"]["id"] for i in range(6)]
    for jid in ids:
        job = api.wait_job(jid, {"SUCCEEDED", "FAILED"})
        assert job["attempts"][0]["host"]["id"] == "host-b"
    r = api.q('mutation { uncordonHost(input: {id: "host-a"}) { host { cordoned } } }')
    assert r["uncordonHost"]["host"]["cordoned"] is False


def test_a_job_runs_only_on_hosts_with_its_labels(two_hosts: tuple[Cluster, Api]) -> None:
    """host-a is in rack r1, host-b in r2: a job that requires rack=r2 runs on host-b every
    time; one that requires a label no host has waits, and says why."""
    cluster, api = two_hosts
    ids = [api.submit(name=f"l{i}", command=["true"], gpus=1, cpus=1, memoryMb=64,
                      hostLabels={"rack": "r2", "zone": "z1"})["job"]["id"] for i in range(4)]
    for jid in ids:
        job = api.wait_job(jid, {"SUCCEEDED", "FAILED"})
        assert job["state"] == "SUCCEEDED" and job["attempts"][0]["host"]["id"] == "host-b", job
    nowhere = api.submit(name="nowhere", command=["true"], gpus=1, cpus=1, memoryMb=64,
                         hostLabels={"net": "ib"})["job"]["id"]
    wait_until(lambda: api.job(nowhere)["pendingReasons"] == [{"reason": "host lacks a required label", "hosts": 2}],
               timeout=60, what="the reason in why pending")
    got = api.q('query($id: ID!) { job(id: $id) { state hostLabels { key value } } }', {"id": nowhere})["job"]
    assert got == {"state": "QUEUED", "hostLabels": [{"key": "net", "value": "ib"}]}


def test_a_job_never_runs_on_a_host_it_excludes(two_hosts: tuple[Cluster, Api]) -> None:
    """`excludeHosts` (`muster job submit --exclude`, Slurm's --exclude): jobs that exclude
    host-a all run on host-b, one that excludes both waits and says why, and `job show`
    lists the hosts."""
    cluster, api = two_hosts
    env = {**os.environ, "MUSTER_URL": api.url.removesuffix("/graphql"), "MUSTER_TOKEN": cluster.token}
    ids = [api.submit(name=f"x{i}", command=["true"], gpus=1, cpus=1, memoryMb=64,
                      excludeHosts=["host-a"])["job"]["id"] for i in range(4)]
    r = subprocess.run([PY, "-m", "server.cli", "job", "submit", "--gpus", "1", "--exclude", "host-a", "-o", "json",
                        "x-cli", "--", "true"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    ids.append(json.loads(r.stdout)["id"])
    for jid in ids:
        job = api.wait_job(jid, {"SUCCEEDED", "FAILED"})
        assert job["state"] == "SUCCEEDED" and job["attempts"][0]["host"]["id"] == "host-b", job
    nowhere = api.submit(name="nowhere", command=["true"], gpus=1, cpus=1, memoryMb=64,
                         excludeHosts=["host-b", "host-a"])["job"]["id"]
    wait_until(lambda: api.job(nowhere)["pendingReasons"] == [{"reason": "host excluded by the job", "hosts": 2}],
               timeout=60, what="the reason in why pending")
    got = api.q('query($id: ID!) { job(id: $id) { state excludeHosts } }', {"id": nowhere})["job"]
    assert got == {"state": "QUEUED", "excludeHosts": ["host-a", "host-b"]}
    r = subprocess.run([PY, "-m", "server.cli", "job", "show", nowhere], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0 and "not on:  host-a, host-b" in r.stdout, r.stdout + r.stderr


def test_nothing_more_is_placed_on_a_host_whose_agent_shuts_down(cluster: Cluster) -> None:
    """An agent stopped with SIGTERM stops its attempts and reports them KILLED by its
    shutdown; the leader places nothing more on that host from the first such report, even
    before it reads the heartbeat saying the host is leaving. It used to place the job
    there again at once, each try coming back unstarted, seven in a second, the last left
    PLACED once the agent had exited (and ended LOST, counted, when the key expired)."""
    srv = cluster.server()
    cluster.agent("sd-a", gpus="2xH100", labels="rack=r1,zone=z1")
    b = cluster.agent("sd-b", gpus="2xH100", labels="rack=r2,zone=z1")
    api = Api(srv.url, cluster.token)
    api.wait_hosts(2)
    jid = api.submit(name="only-b", command=["sleep", "300"], gpus=1, cpus=1, memoryMb=64,
                     excludeHosts=["sd-a"])["job"]["id"]
    api.wait_job(jid, {"RUNNING"})
    assert b.stop() == 0
    wait_until(lambda: api.job(jid)["state"] == "QUEUED", timeout=60, what="the job requeued")
    # A few cycles later: still queued, its one try stopped by the shutdown (not counted).
    time.sleep(2)
    got = api.q('query($id: ID!) { job(id: $id) { state attempts { state stopKind reason } } }', {"id": jid})["job"]
    assert got["state"] == "QUEUED", got
    assert [(a["state"], a["stopKind"]) for a in got["attempts"]] == [("KILLED", "shutdown")], got


def test_a_running_attempt_tells_how_busy_its_gpus_are(two_hosts: tuple[Cluster, Api]) -> None:
    """`Attempt.gpuUtilPct` and `gpuMemUsedMb`: its GPUs as its host's latest heartbeat
    reports them (the same figures as the host's own GPUs in the same read); null once it
    has ended. `muster job show` prints them."""
    cluster, api = two_hosts
    jid = api.submit(name="busy", command=["sleep", "300"], gpus=2, cpus=1, memoryMb=64)["job"]["id"]
    api.wait_job(jid, {"RUNNING"})
    q = """query($id: ID!) { job(id: $id) { attempts { state gpuIndices gpuUtilPct gpuMemUsedMb
           host { gpuDevices { index utilPct memUsedMb } } } } }"""
    [a] = api.q(q, {"id": jid})["job"]["attempts"]
    mine = [d for d in a["host"]["gpuDevices"] if d["index"] in a["gpuIndices"]]
    assert len(mine) == 2 and a["state"] == "RUNNING", a
    assert a["gpuUtilPct"] == round(sum(d["utilPct"] for d in mine) / 2, 1), a
    assert a["gpuMemUsedMb"] == sum(d["memUsedMb"] for d in mine), a
    env = {**os.environ, "MUSTER_URL": api.url.removesuffix("/graphql"), "MUSTER_TOKEN": cluster.token}
    r = subprocess.run([PY, "-m", "server.cli", "job", "show", jid], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0 and re.search(r"GPUs now: [0-9.]+ % busy, [0-9,]+ MB in use", r.stdout), r.stdout
    # Once its host has sent a heartbeat since it started, its agent has sampled its GPUs:
    # its end reports how busy they were over its run (busy simulated GPUs: 60-100 %).
    seen = 'query($id: ID!) { job(id: $id) { attempts { startedAt host { lastSeen } } } }'

    def heard_since_start() -> bool:
        [now] = api.q(seen, {"id": jid})["job"]["attempts"]
        return dt.datetime.fromisoformat(now["host"]["lastSeen"]) > dt.datetime.fromisoformat(now["startedAt"])

    wait_until(heard_since_start, timeout=30, what="a heartbeat after the attempt started")
    api.q('mutation($id: ID!) { cancelJob(id: $id) { job { id } } }', {"id": jid})
    api.wait_job(jid, {"CANCELLED"})
    wait_until(lambda: api.q(q, {"id": jid})["job"]["attempts"][0]["gpuUtilPct"] is None, timeout=60,
               what="no figures once the attempt ended")
    [ended] = api.q('query($id: ID!) { job(id: $id) { attempts { state gpuUtilAvgPct } } }', {"id": jid})["job"][
        "attempts"]
    assert ended["state"] == "KILLED" and 60 <= ended["gpuUtilAvgPct"] <= 100, ended
    r = subprocess.run([PY, "-m", "server.cli", "job", "show", jid], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=120)
    assert f"GPUs over its run: {ended['gpuUtilAvgPct']:g} % busy on average" in r.stdout, r.stdout
    # And in the usage of its queue and user, once history has the attempt.
    wait_until(lambda: any(u["gpuUtilPct"] is not None for u in api.q("{ usage { gpuUtilPct } }")["usage"]),
               timeout=60, what="the attempt in history")
    [u] = api.q("{ usage { gpuUtilPct } }")["usage"]
    assert u["gpuUtilPct"] == ended["gpuUtilAvgPct"], u


def test_one_request_asks_at_most_32_agents_for_live_output(two_hosts: tuple[Cluster, Api]) -> None:
    """40 running tasks (20 gangs of 2, one task on each host) asked for their output in one
    query: 32 answers, the rest null (a query cannot turn into a request to every agent of
    the cluster)."""
    cluster, api = two_hosts
    ids = [api.submit(name=f"talk{i}", command=["sh", "-c", "echo hi; sleep 300"], cpus=0.01, memoryMb=16,
                      replicas=2)["job"]["id"] for i in range(20)]
    for jid in ids:
        api.wait_job(jid, {"RUNNING"}, timeout=120)
    query = "{ " + " ".join(f'j{i}: job(id: "{jid}") {{ attempts {{ state liveOutput }} }}'
                            for i, jid in enumerate(ids)) + " }"

    def outputs() -> list[str | None]:
        data = api.q(query)
        return [a["liveOutput"] for i in range(len(ids)) for a in data[f"j{i}"]["attempts"]]

    wait_until(lambda: outputs().count("hi\n") == 32, timeout=60, what="32 outputs")
    got = outputs()
    assert len(got) == 40 and got.count("hi\n") == 32 and got.count(None) == 8, got
    for jid in ids:
        api.q('mutation($id: ID!) { cancelJob(id: $id, reason: "done") { job { id } } }', {"id": jid})


def test_gang_job_runs_all_tasks_at_once(two_hosts: tuple[Cluster, Api]) -> None:
    cluster, api = two_hosts
    q = """mutation($input: SubmitJobInput!) { submitJob(input: $input) { job { id } userErrors { message } } }"""
    cmd = [PY, "-c", "import os; print('task', os.environ['MUSTER_GANG_TASK'], 'of', os.environ['MUSTER_GANG_SIZE'])"]
    res = api.q(q, {"input": {"name": "gang", "command": cmd, "gpus": 8, "replicas": 2, "sameRack": False,
                              "cpus": 1, "memoryMb": 64}})["submitJob"]
    assert res["userErrors"] == []
    jid = res["job"]["id"]
    job = api.wait_job(jid, {"SUCCEEDED", "FAILED"})
    assert job["state"] == "SUCCEEDED"
    assert len(job["attempts"]) == 2
    assert {a["host"]["id"] for a in job["attempts"]} == {"host-a", "host-b"}
    assert sorted(a["outputTail"].strip() for a in job["attempts"]) == ["task 0 of 2", "task 1 of 2"]
    # A gang that cannot fit whole places nothing.
    res = api.q(q, {"input": {"name": "too-big", "command": ["true"], "gpus": 8, "replicas": 3,
                              "cpus": 1, "memoryMb": 64}})["submitJob"]
    big = api.job(res["job"]["id"])
    assert big["state"] == "QUEUED" and big["attempts"] == []
    assert_invariants(cluster.nats_url)
