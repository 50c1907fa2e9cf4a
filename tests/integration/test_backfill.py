"""Reservations and backfill with real processes: a 2-GPU job that waits holds the host
where it will start, a job with no time limit is kept off it (and says why), a job whose
time limit ends it in time runs there meanwhile, and the reserved job starts once the
host frees. The planner's logic is tested in tests/unit/test_backfill.py."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import wait_until
from tests.integration.conftest import Api, Cluster, assert_invariants
from tests.integration.test_queues import cancel, muster, settled, submit, task

JOB_Q = """query($id: ID!) { job(id: $id) { state reservation { hosts hostCount start since }
           pendingReasons { reason kind detail } } }"""


def job(api: Api, job_id: str) -> dict[str, Any]:
    return api.q(JOB_Q, {"id": job_id})["job"]


def queue_reasons(api: Api, job_id: str) -> dict[str, str]:
    return {r["reason"]: r["detail"] for r in job(api, job_id)["pendingReasons"] if r["kind"] == "queue"}


def test_a_waiting_job_holds_its_host_and_only_jobs_that_end_in_time_use_it(cluster: Cluster,
                                                                            tmp_path: Path) -> None:
    srv = cluster.server(env={"MUSTER_RESERVE_AFTER": "1"})
    cluster.agent("b1", gpus="2xH100")
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    long = submit(api, "long", task(tmp_path, "long", 300), timeLimitSeconds=600)["job"]["id"]
    api.wait_job(long, {"RUNNING"})
    big = submit(api, "big", task(tmp_path, "big", 0.2), gpus=2)["job"]["id"]
    wait_until(lambda: job(api, big)["reservation"] is not None, timeout=30, what="big holds a reservation")
    r = job(api, big)["reservation"]
    assert r["hosts"] == ["b1"] and r["hostCount"] == 1
    # It could start when `long` reaches its limit: about 600 s from its start.
    start = dt.datetime.fromisoformat(r["start"]).timestamp()
    assert start > dt.datetime.now(dt.UTC).timestamp() + 500
    assert "1 host(s) held for it (b1)" in queue_reasons(api, big)["holds a reservation"]
    # A job with no time limit may not use the reserved host, and says so.
    open_ = submit(api, "open", task(tmp_path, "open", 300))["job"]["id"]
    wait_until(lambda: "hosts reserved for another job" in queue_reasons(api, open_), timeout=30,
               what="the job without a limit says the host is reserved")
    assert f"held for job {big}" in queue_reasons(api, open_)["hosts reserved for another job"]
    assert "no time limit" in queue_reasons(api, open_)["hosts reserved for another job"]
    # One whose limit ends it well before the reserved start runs there meanwhile.
    short = submit(api, "short", task(tmp_path, "short", 0.2), timeLimitSeconds=30)["job"]["id"]
    api.wait_job(short, {"SUCCEEDED"}, timeout=60)
    assert job(api, open_)["state"] == "QUEUED"
    why = muster(cluster, srv.url, "job", "why", big)
    assert why.returncode == 0 and "holds a reservation" in why.stdout, why.stdout + why.stderr
    listed = muster(cluster, srv.url, "job", "list", "--state", "QUEUED")
    row = next((line for line in listed.stdout.splitlines() if line.startswith(big)), "")
    assert "QUEUED reserved" in row and "QUEUED reserved" not in listed.stdout.replace(row, ""), listed.stdout
    # The host says whom it is held for: GraphQL, the CLI, the console's host page.
    assert api.q('query { host(id: "b1") { reservedFor } }')["host"]["reservedFor"] == big
    shown = muster(cluster, srv.url, "host", "show", "b1")
    assert shown.returncode == 0 and f"reserved for job {big}" in shown.stdout, shown.stdout + shown.stderr
    with httpx.Client(base_url=srv.url, timeout=30) as web:
        assert web.post("/login", data={"token": cluster.token}).status_code in (200, 303)
        page = web.get("/hosts/b1")
        assert page.status_code == 200 and f'href="/jobs/{big}"' in page.text and "which could start here at" \
            in page.text, page.text[:2000]
        listed = web.get("/jobs?state=QUEUED").text  # the jobs list marks the job that holds it
        assert listed.count(">reserved</span>") == 1 and "1 host(s) held for it" in listed, listed[:3000]
    # The host frees: big runs there before the older job that was kept off it.
    cancel(api, long)
    api.wait_job(big, {"SUCCEEDED"}, timeout=60)
    assert job(api, big)["reservation"] is None
    wait_until(lambda: job(api, open_)["state"] == "RUNNING", timeout=60, what="the job kept off runs after")
    cancel(api, open_)
    settled(api, long, big, short, open_)
    assert_invariants(cluster.nats_url)
