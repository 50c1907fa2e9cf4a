"""The operators' host labels through the real server, agent and CLI: with `team` a key
only operators set (MUSTER_OPERATOR_LABEL_KEYS), an agent started with `--labels
team=vision` (its credentials are on its host: anyone holding the host can say so) does
not get the jobs of a queue that runs on `team=vision` hosts, until an admin labels the
host (`muster host label`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests.conftest import ROOT, wait_until
from tests.integration.conftest import Api, Cluster


def muster(c: Cluster, url: str, *argv: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MUSTER_URL": url, "MUSTER_TOKEN": token or c.token}
    return subprocess.run([sys.executable, "-m", "server.cli", *argv], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=60)


HOST_Q = """query($id: ID!) { host(id: $id) { labels { key value } operatorLabels { key value }
            agentLabels { key value } cordoned } }"""


def _labels(pairs: list[dict[str, str]]) -> dict[str, str]:
    return {p["key"]: p["value"] for p in pairs}


def _job(api: Api, job_id: str) -> dict[str, Any]:
    q = """query($id: ID!) { job(id: $id) { state pendingReasons { reason hosts } attempts { host { id } } } }"""
    return api.q(q, {"id": job_id})["job"]


def test_an_agents_claim_of_a_trusted_label_gets_no_jobs_until_an_admin_labels_the_host(cluster: Cluster) -> None:
    srv = cluster.server(env={"MUSTER_OPERATOR_LABEL_KEYS": "team,rack"})
    api = Api(srv.url, cluster.token)
    wait_until(lambda: api.q("{ cluster { leadership { role } } }")["cluster"]["leadership"]["role"] == "leader",
               timeout=60, what="the server to lead")
    cluster.agent("rogue", gpus="2xH100", labels="team=vision,rack=r7,net=ib")
    api.wait_hosts(1)
    assert api.q("{ cluster { operatorLabelKeys } }")["cluster"]["operatorLabelKeys"] == ["rack", "team"]
    h = api.q(HOST_Q, {"id": "rogue"})["host"]
    assert _labels(h["labels"]) == {"net": "ib"} and h["operatorLabels"] == []
    assert _labels(h["agentLabels"]) == {"team": "vision", "rack": "r7", "net": "ib"}
    # The leader alerts the claim (recorded by the historian).
    q = '{ alerts(kind: "host.labels_disputed") { edges { node { hostId message } } } }'
    alerts = wait_until(lambda: api.q(q)["alerts"]["edges"], timeout=60, what="the host.labels_disputed alert")
    alert = alerts[0]["node"]
    assert alert["hostId"] == "rogue" and "team=vision (the operator's: none)" in alert["message"], alert

    r = api.q("""mutation { createQueue(input: {name: "vision", hostLabels: {team: "vision"}}) {
                 userErrors { message } } }""")
    assert r["createQueue"]["userErrors"] == []
    vision = api.submit(name="v", command=["true"], gpus=1, queue="vision")["job"]["id"]
    # A job stored after it, that the host takes: once it is placed, the leader has looked
    # at the team's job too (stored before it), and left it waiting.
    other = api.submit(name="o", command=["true"], gpus=0, cpus=0.1, memoryMb=64)["job"]["id"]
    api.wait_job(other, {"SUCCEEDED"})
    job = _job(api, vision)
    assert job["state"] == "QUEUED" and job["attempts"] == [], job
    assert {"reason": "host lacks a required label", "hosts": 1} in job["pendingReasons"], job

    show = muster(cluster, srv.url, "host", "show", "rogue")
    assert show.returncode == 0 and "labels:  net=ib\n" in show.stdout, show.stdout + show.stderr
    assert "agent's labels not in effect: rack=r7,team=vision" in show.stdout, show.stdout

    # Neither an operator's token nor a team's may label hosts: an admin's.
    r = muster(cluster, srv.url, "token", "create", "ops", "--role", "operator", "--nats", cluster.nats_url)
    assert r.returncode == 0, r.stderr
    op_token = r.stdout.strip().splitlines()[-1]
    wait_until(lambda: api.raw("{ ping }", token=op_token).status_code == 200, timeout=10, what="the token")
    r = muster(cluster, srv.url, "host", "label", "rogue", "team=vision", token=op_token)
    assert r.returncode == 4 and "admin" in r.stderr, (r.returncode, r.stderr)
    r = muster(cluster, srv.url, "host", "label", "rogue", "Team=x")
    assert r.returncode != 0 and "invalid label key 'Team'" in r.stderr, r.stderr
    r = muster(cluster, srv.url, "host", "label", "nope", "team=vision")
    assert r.returncode == 3, r.stderr
    r = api.q("""mutation { setHostLabels(input: {id: "rogue", labels: {team: "x"}, remove: ["team"]}) {
                 host { id } userErrors { field message } } }""")["setHostLabels"]
    assert r["userErrors"] == [{"field": "remove", "message": "team is both set and removed"}], r

    r = muster(cluster, srv.url, "host", "label", "rogue", "team=vision", "rack=r1", "--reason", "bought by vision",
               "-o", "json")
    assert r.returncode == 0, r.stderr
    assert _labels(json.loads(r.stdout)["operatorLabels"]) == {"team": "vision", "rack": "r1"}
    api.wait_job(vision, {"SUCCEEDED"})
    assert [a["host"]["id"] for a in _job(api, vision)["attempts"]] == ["rogue"]
    show = muster(cluster, srv.url, "host", "show", "rogue")
    assert "labels:  net=ib,rack=r1*,team=vision*  (* the operator's)" in show.stdout, show.stdout
    assert "not in effect: rack=r7\n" in show.stdout, show.stdout
    # A cordon keeps them; --remove takes one away (team: the agent's claim is not taken again).
    assert muster(cluster, srv.url, "host", "cordon", "rogue", "--reason", "check").returncode == 0
    h = api.q(HOST_Q, {"id": "rogue"})["host"]
    assert h["cordoned"] and _labels(h["operatorLabels"]) == {"team": "vision", "rack": "r1"}
    r = muster(cluster, srv.url, "host", "label", "rogue", "--remove", "team")
    assert r.returncode == 0, r.stderr
    h = api.q(HOST_Q, {"id": "rogue"})["host"]
    assert _labels(h["labels"]) == {"net": "ib", "rack": "r1"} and h["cordoned"]
    # Each change is an event (host.labels), with who and what.
    q = '{ events(kind: "host.labels", hostId: "rogue") { edges { node { message } } } }'
    events = wait_until(lambda: len(edges := api.q(q)["events"]["edges"]) == 2 and edges, timeout=60,
                        what="two host.labels events")
    assert [e["node"]["message"] for e in events] == [
        "labels by operator: bought by vision (rack=r1, team=vision)", "labels by operator: -team"], events
