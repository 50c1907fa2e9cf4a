"""A maintenance window with real processes: `muster host drain --at` schedules a drain
ahead; until it begins the host takes only a job whose time limit ends it by the drain's
deadline (one without a limit waits, and says why); from its start the host is draining;
at its deadline the job that ran there from before is stopped (SIGTERM, from the task's
own record) and runs again elsewhere, not counted as a try. The planner's logic is tested
in tests/unit/test_maintenance.py."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from tests.conftest import wait_until
from tests.integration.conftest import Api, Cluster, assert_invariants
from tests.integration.test_advance import alerts
from tests.integration.test_backfill import queue_reasons
from tests.integration.test_queues import attempts, events, muster, settled, submit, task

HOST_Q = """query($id: ID!) { host(id: $id) { cordoned draining drainAt drainDeadline } }"""


def host(api: Api, host_id: str) -> dict[str, Any]:
    return api.q(HOST_Q, {"id": host_id})["host"]


def epoch(iso: str) -> float:
    return dt.datetime.fromisoformat(iso).timestamp()


def test_a_maintenance_window_takes_only_work_that_ends_by_it_then_drains(cluster: Cluster, tmp_path: Path) -> None:
    srv = cluster.server(heartbeat_interval=1)
    cluster.agent("mw-a", gpus="2xH100", labels="rack=ra", heartbeat_interval=1, kill_grace=2)
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    early = submit(api, "early", task(tmp_path, "early", 600, ckpt=0.1))["job"]["id"]  # no time limit
    api.wait_job(early, {"RUNNING"})

    # The drain of rack ra begins in 30 s; what still runs 5 s later is stopped.
    scheduled = muster(cluster, srv.url, "host", "drain", "--rack", "ra", "--reason", "driver update", "--at", "30s",
                       "--deadline", "5")
    assert scheduled.returncode == 0, scheduled.stderr
    assert "mw-a" in scheduled.stdout and "drain from" in scheduled.stdout, scheduled.stdout
    nobody = muster(cluster, srv.url, "host", "drain", "--rack", "nope", "--reason", "x")
    assert nobody.returncode != 0 and "no host with rack nope" in nobody.stderr, nobody.stderr
    h = host(api, "mw-a")
    assert h["cordoned"] is False and h["draining"] is False and h["drainAt"] is not None
    starts, stops = epoch(h["drainAt"]), epoch(h["drainDeadline"])
    assert stops == starts + 5
    listed = muster(cluster, srv.url, "host", "list", "--drain-scheduled")
    assert listed.returncode == 0 and "mw-a" in listed.stdout and "DRAIN AT" in listed.stdout, listed.stdout
    shown = muster(cluster, srv.url, "host", "show", "mw-a")
    assert "drain scheduled from" in shown.stdout, shown.stdout

    # A job with no time limit could still run at the deadline: it waits, and says why.
    open_ = submit(api, "open", task(tmp_path, "open", 0.2))["job"]["id"]
    wait_until(lambda: "hosts closing for maintenance" in queue_reasons(api, open_), timeout=30,
               what="the job without a limit says the host closes for maintenance")
    assert "it has no time limit" in queue_reasons(api, open_)["hosts closing for maintenance"]
    why = muster(cluster, srv.url, "job", "why", open_)
    assert "drained for maintenance" in why.stdout, why.stdout
    # One whose limit ends it by the deadline (with 10 s to start) runs there now.
    short = submit(api, "short", task(tmp_path, "short", 0.2), timeLimitSeconds=10)["job"]["id"]
    done = api.wait_job(short, {"SUCCEEDED", "FAILED"}, timeout=60)
    assert done["state"] == "SUCCEEDED" and done["attempts"][0]["host"]["id"] == "mw-a"

    # From the start the host is draining; at the deadline `early` is stopped.
    wait_until(lambda: host(api, "mw-a")["draining"], timeout=60, what="the drain begins")
    wait_until(lambda: alerts(api, "maintenance.began"), timeout=30, what="the window's start alerted")
    assert "maintenance window began: 1 host(s) draining (mw-a)" in alerts(api, "maintenance.began")[0]
    assert host(api, "mw-a")["cordoned"] is True and host(api, "mw-a")["drainAt"] is None
    wait_until(lambda: any(a["state"] != "RUNNING" for a in attempts(api, early)), timeout=60,
               what="the drain stops the job that ran there from before")
    first = attempts(api, early)[0]
    assert first["state"] == "KILLED" and "driver update" in first["reason"], first
    term = next(e for e in events(tmp_path) if e["job"] == "early" and e["ev"] == "term")
    assert term["t"] >= stops  # stopped at the deadline, not at the start
    assert api.job(open_)["state"] == "QUEUED"  # nothing new on the drained host

    # A host without a window takes both; the stopped try is not counted (a drain's).
    cluster.agent("mw-b", gpus="2xH100", labels="rack=rb", heartbeat_interval=1)
    api.wait_hosts(2)
    for job_id in (early, open_):
        wait_until(lambda j=job_id: any(a["state"] == "RUNNING" or a["state"] == "SUCCEEDED"  # type: ignore[misc]
                                        for a in attempts(api, j)), timeout=60, what=f"{job_id} runs on mw-b")
    assert api.job(early)["attempts"][-1]["host"]["id"] == "mw-b"
    assert api.wait_job(open_, {"SUCCEEDED"})["attempts"][0]["host"]["id"] == "mw-b"
    history = api.q("""query($id: ID!) { job(id: $id) { state attempts { number state } } }""", {"id": early})["job"]
    assert history["state"] in ("PLACED", "RUNNING") and [a["number"] for a in history["attempts"]] == [1, 2]
    # The drain's event (in history) names the window.
    wait_until(lambda: any("drain from" in e["node"]["message"] and "driver update" in e["node"]["message"]
                           for e in api.q("""{ events(first: 20, kind: "host.drain") { edges { node {
                               message } } } }""")["events"]["edges"]),
               timeout=30, what="the drain's event in history")
    api.q("mutation($id: ID!) { cancelJob(id: $id) { job { id } } }", {"id": early})
    settled(api, early)  # a cancelled job's try stops after it
    assert_invariants(cluster.nats_url)
