"""A begin time with real processes: a job submitted `--begin 3s` starts no earlier than
its begin time (from the task's own record), and one `--begin 1h` waits on a free host and
says why (`pendingReasons`, `muster job why`, `job show`)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from tests.integration.conftest import Api, Cluster, assert_invariants
from tests.integration.test_backfill import queue_reasons
from tests.integration.test_queues import events, muster, task


def test_a_job_starts_no_earlier_than_its_begin_time(cluster: Cluster, tmp_path: Path) -> None:
    srv = cluster.server(heartbeat_interval=1)
    cluster.agent("bg-a", gpus="1xH100", heartbeat_interval=1)
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    far = muster(cluster, srv.url, "job", "submit", "--gpus", "1", "--begin", "1h", "-o", "json", "far", "--",
                 *task(tmp_path, "far", 0.1))
    r = muster(cluster, srv.url, "job", "submit", "--gpus", "1", "--begin", "3s", "-o", "json", "later", "--",
               *task(tmp_path, "later", 0.1))
    assert far.returncode == 0 and r.returncode == 0, far.stderr + r.stderr
    far_id, job_id = json.loads(far.stdout)["id"], json.loads(r.stdout)["id"]
    got = api.q("query($id: ID!) { job(id: $id) { state beginAt notBefore } }", {"id": job_id})["job"]
    begin = dt.datetime.fromisoformat(got["beginAt"]).timestamp()
    assert api.wait_job(job_id, {"SUCCEEDED", "FAILED"}, timeout=60)["state"] == "SUCCEEDED"
    start = next(e["t"] for e in events(tmp_path) if e["job"] == "later" and e["ev"] == "start")
    assert start >= begin
    # The one an hour ahead waits, with the host free, and says why.
    far_job = api.q("query($id: ID!) { job(id: $id) { state beginAt notBefore } }", {"id": far_id})["job"]
    assert far_job["state"] == "QUEUED" and far_job["notBefore"] == far_job["beginAt"]
    assert "not placed before its begin time" in queue_reasons(api, far_id)["waiting for its start time"]
    shown = muster(cluster, srv.url, "job", "show", far_id)
    assert "begins:" in shown.stdout and "(not yet)" in shown.stdout, shown.stdout
    why = muster(cluster, srv.url, "job", "why", far_id)
    assert "waiting for its start time" in why.stdout, why.stdout
    api.q("mutation($id: ID!) { cancelJob(id: $id) { job { id } } }", {"id": far_id})
    assert_invariants(cluster.nats_url)
