"""Retries of a job's own failures with real processes: a task that exits 3 the first time
and 0 the second, submitted `--retry-failures 1 --retry-exit-code 3 --retry-delay 2`,
succeeds on its second try, started no sooner than the delay after the first ended; one
whose exit code is not listed fails at once."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

from tests.integration.conftest import Api, Cluster, assert_invariants
from tests.integration.test_queues import muster


def test_a_failure_asked_to_be_retried_is_tried_again_and_succeeds(cluster: Cluster, tmp_path: Path) -> None:
    srv = cluster.server(heartbeat_interval=1)
    cluster.agent("rt-a", gpus="1xH100", heartbeat_interval=1)
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    marker = tmp_path / "tried"
    flaky = f'if [ -e {marker} ]; then exit 0; fi; touch {marker}; exit 3'
    r = muster(cluster, srv.url, "job", "submit", "--retry-failures", "1", "--retry-exit-code", "3",
               "--retry-delay", "2", "-o", "json", "flaky", "--", "sh", "-c", flaky)
    assert r.returncode == 0, r.stderr
    job_id = json.loads(r.stdout)["id"]
    done = api.wait_job(job_id, {"SUCCEEDED", "FAILED"}, timeout=60)
    assert done["state"] == "SUCCEEDED", done
    assert [(a["number"], a["state"], a["exitCode"]) for a in done["attempts"]] == [(1, "FAILED", 3),
                                                                                   (2, "SUCCEEDED", 0)]
    # The delay asked for was waited (the agent's own times: the try's end, the next's start).
    first, second = done["attempts"]
    assert datetime.fromisoformat(second["startedAt"]) - datetime.fromisoformat(first["finishedAt"]) \
        >= timedelta(seconds=2), done["attempts"]
    shown = muster(cluster, srv.url, "job", "show", job_id)
    assert "retries: up to 1 failed tries exiting 3, 2 s before the first, doubling (at most an hour)" \
        in shown.stdout, shown.stdout
    # An exit code it did not ask to retry ends it at once.
    r = muster(cluster, srv.url, "job", "submit", "--retry-failures", "1", "--retry-exit-code", "3", "-o", "json",
               "broken", "--", "sh", "-c", "exit 1")
    broken = api.wait_job(json.loads(r.stdout)["id"], {"SUCCEEDED", "FAILED"}, timeout=60)
    assert broken["state"] == "FAILED" and len(broken["attempts"]) == 1
    assert_invariants(cluster.nats_url)
