"""Submission limits with real processes: a queue's maxSubmittedJobs and
maxSubmittedJobsPerUser refuse submitJob, submitJobs, `muster job submit` and NATS
submissions past them, say why, and take jobs again once some end. The counting and the
leader's check are tested in tests/unit/test_submitlimits.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import httpx

import nats as natslib
from tests.conftest import ROOT, wait_until
from tests.integration.conftest import Api, Cluster, assert_invariants
from tests.integration.test_queues import cancel, muster, submit
from wire.submit import submit_over_nats

QUEUE_Q = """{ queue(name: "team") { submittedJobs maxSubmittedJobs maxSubmittedJobsPerUser
               submittedJobsByUser { user jobs } } }"""


def _token(cluster: Cluster, api: Api, name: str) -> str:
    r = subprocess.run([sys.executable, "-m", "server.cli", "token", "create", name, "--role", "operator",
                        "--queues", "team", "--nats", cluster.nats_url], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip().splitlines()[-1]
    wait_until(lambda: api.raw("{ ping }", token=token).status_code == 200, timeout=10, what=f"{name}'s token")
    return token


def _submit_many(api: Api, token: str, names: list[str]) -> list[dict[str, Any]]:
    q = """mutation($input: [SubmitJobInput!]!) { submitJobs(input: $input) {
           job { id } userErrors { field message code } } }"""
    r = api.raw(q, {"input": [{"name": n, "command": ["true"], "queue": "team"} for n in names]}, token=token)
    assert r.status_code == 200, r.text
    return r.json()["data"]["submitJobs"]


def test_a_queue_refuses_submissions_past_its_limits_and_takes_them_again_once_jobs_end(cluster: Cluster) -> None:
    srv = cluster.server()  # no agents: every job accepted stays queued
    api = Api(srv.url, cluster.token)
    r = muster(cluster, srv.url, "queue", "create", "team", "--max-submitted-jobs", "3",
               "--max-submitted-jobs-per-user", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    alice, bob = _token(cluster, api, "alice"), _token(cluster, api, "bob")
    a1 = submit(api, "a1", ["true"], token=alice, queue="team", gpus=0)["job"]["id"]
    # One request of two: the first is alice's second job, the second is past her limit.
    res = _submit_many(api, alice, ["a2", "a3"])
    assert res[0]["job"] and not res[0]["userErrors"], res
    assert res[1]["job"] is None and res[1]["userErrors"][0]["code"] == "JOB_LIMIT", res
    assert "alice has 2 jobs not ended in queue 'team'" in res[1]["userErrors"][0]["message"]
    # Bob is under his own limit; his second job is past the queue's.
    assert submit(api, "b1", ["true"], token=bob, queue="team", gpus=0)["job"]
    refused = submit(api, "b2", ["true"], token=bob, queue="team", gpus=0)
    assert refused["job"] is None and refused["userErrors"][0]["code"] == "JOB_LIMIT"
    assert "queue 'team' has 3 jobs not ended" in refused["userErrors"][0]["message"]
    cli = muster(cluster, srv.url, "job", "submit", "a5", "--queue", "team", "--gpus", "0", "--", "true",
                 token=alice)
    assert cli.returncode != 0 and "JOB_LIMIT" in cli.stderr, cli.stdout + cli.stderr
    # What the queue shows: GraphQL and `muster queue show`.
    q = api.q(QUEUE_Q)["queue"]
    assert q["submittedJobs"] == 3 and (q["maxSubmittedJobs"], q["maxSubmittedJobsPerUser"]) == (3, 2)
    assert q["submittedJobsByUser"] == [{"user": "alice", "jobs": 2}, {"user": "bob", "jobs": 1}]
    shown = muster(cluster, srv.url, "queue", "show", "team")
    assert shown.returncode == 0 and "jobs not ended: 3 (limit 3; per user: limit 2, most: alice 2, bob 1)" \
        in shown.stdout, shown.stdout + shown.stderr

    # Over NATS the leader refuses it, and says so on muster.events.job.rejected.
    async def over_nats() -> list[dict[str, Any]]:
        nc = await natslib.connect(cluster.nats_url)
        seen: list[dict[str, Any]] = []
        sub = await nc.subscribe("muster.events.job.rejected")
        await submit_over_nats(nc.jetstream(), [{"id": "nats-job-01", "name": "n", "command": ["true"],
                                                 "queue": "team"}], user="pipeline")
        while not seen:
            msg = await sub.next_msg(timeout=30)
            seen.append(json.loads(msg.data))
        await nc.close()
        return seen

    rejected = asyncio.run(over_nats())
    assert rejected[0]["job_id"] == "nats-job-01" and "JOB_LIMIT: queue 'team' has 3" in rejected[0]["message"]
    # Counted for operators: a3, b2, the CLI's a5 and the NATS job.
    scraped = httpx.get(srv.url + "/metrics", timeout=30).text
    assert 'muster_submissions_refused_total{queue="team"} 4.0' in scraped, [
        x for x in scraped.splitlines() if "refused" in x]
    assert api.job("nats-job-01") is None
    # A job that ends makes room: alice submits again.
    cancel(api, a1)
    wait_until(lambda: api.q(QUEUE_Q)["queue"]["submittedJobs"] == 2, timeout=30, what="a1 counted as ended")
    again = submit(api, "a4", ["true"], token=alice, queue="team", gpus=0)
    assert again["job"] and not again["userErrors"], again
    # A limit lowered under the jobs there refuses new ones and touches none of them.
    r = muster(cluster, srv.url, "queue", "set", "team", "--max-submitted-jobs", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert submit(api, "b3", ["true"], token=bob, queue="team", gpus=0)["userErrors"][0]["code"] == "JOB_LIMIT"
    assert api.q('{ queue(name: "team") { submittedJobs pendingCount } }')["queue"] == {"submittedJobs": 3,
                                                                                   "pendingCount": 3}
    assert_invariants(cluster.nats_url)
