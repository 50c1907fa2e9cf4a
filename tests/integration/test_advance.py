"""An advance reservation with real processes: `muster reservation create --rack` sets a
rack's host aside for one queue from a time ahead; until then a job of another queue
without a time limit waits and says why; from its start the work of another queue that
ran there from before is stopped (SIGTERM, from the task's own record) and requeued, not
counted as a try, while the queue's own job runs there; an overlapping reservation and an
unknown host are refused; deleting it gives the host back. The planner's logic is tested
in tests/unit/test_advance.py."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from tests.conftest import wait_until
from tests.integration.conftest import Api, Cluster, assert_invariants
from tests.integration.test_backfill import queue_reasons
from tests.integration.test_queues import attempts, events, muster, settled, submit, task

REASON = "hosts set aside for others"


def alerts(api: Api, kind: str) -> list[str]:
    """The messages of the alerts of `kind` in history."""
    got = api.q("query($k: String) { alerts(kind: $k) { edges { node { message } } } }", {"k": kind})["alerts"]
    return [e["node"]["message"] for e in got["edges"]]


def test_an_advance_reservation_sets_a_rack_aside_for_a_queue(cluster: Cluster, tmp_path: Path) -> None:
    srv = cluster.server(heartbeat_interval=1)
    cluster.agent("ar-a", gpus="2xH100", labels="rack=ra", heartbeat_interval=1, kill_grace=2)
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    assert muster(cluster, srv.url, "queue", "create", "launch").returncode == 0
    early = submit(api, "early", task(tmp_path, "early", 600, ckpt=0.1))["job"]["id"]  # no time limit
    api.wait_job(early, {"RUNNING"})

    # Rack ra is the launch queue's from 20 s from now, for an hour.
    made = muster(cluster, srv.url, "reservation", "create", "launch-run", "--rack", "ra", "--queues", "launch",
                  "--start", "20s", "--duration", "1h", "-o", "json")
    assert made.returncode == 0, made.stderr
    r = json.loads(made.stdout)
    assert (r["hosts"], r["queues"], r["state"], r["hostCount"]) == (["ar-a"], ["launch"], "UPCOMING", 1), r
    listed = muster(cluster, srv.url, "reservation", "list")
    assert "launch-run" in listed.stdout and "UPCOMING" in listed.stdout, listed.stdout
    shown = muster(cluster, srv.url, "host", "show", "ar-a")
    assert "set aside for launch from" in shown.stdout and "advance reservation launch-run" in shown.stdout, \
        shown.stdout
    # A host is set aside by one reservation at a time; hosts must exist.
    again = muster(cluster, srv.url, "reservation", "create", "other", "ar-a", "--users", "bo", "--duration", "2h")
    assert again.returncode != 0 and "set aside by advance reservation launch-run" in again.stderr, again.stderr
    unknown = muster(cluster, srv.url, "reservation", "create", "other", "nope", "--queues", "launch", "--duration",
                     "2h")
    assert unknown.returncode != 0 and "no host nope" in unknown.stderr, unknown.stderr
    nobody = muster(cluster, srv.url, "reservation", "create", "other", "ar-a", "--duration", "2h")
    assert nobody.returncode != 0 and "queues: name queues or users whose jobs may use the hosts" in nobody.stderr, \
        nobody.stderr
    mutation = """mutation($input: AdvanceReservationInput!) { createAdvanceReservation(input: $input) {
                  reservation { name } userErrors { field code } } }"""
    for starts, ends, code in (("2030-01-02T00:00:00Z", "2030-01-01T00:00:00Z", "INVALID"),  # ends first
                               (None, "2030-01-01T00:00:00Z", "OUT_OF_RANGE")):  # over a year ahead
        got = api.q(mutation, {"input": {"name": "bad", "hosts": ["ar-a"], "queues": ["launch"], "startsAt": starts,
                                         "endsAt": ends}})["createAdvanceReservation"]
        assert got["reservation"] is None and got["userErrors"] == [{"field": "endsAt", "code": code}], got
    # A start well past is refused (a wrong year set the hosts aside at once, stopping what
    # ran there: found by a review), not taken as now.
    got = api.q(mutation, {"input": {"name": "bad", "hosts": ["ar-a"], "queues": ["launch"],
                                     "startsAt": "2025-01-01T00:00:00Z", "endsAt": "2027-01-01T00:00:00Z"}}
                )["createAdvanceReservation"]
    assert got["reservation"] is None and got["userErrors"] == [{"field": "startsAt", "code": "OUT_OF_RANGE"}], got
    long_names = [f"{i:04d}" + "h" * 59 for i in range(4096)]  # a record past what one may hold
    got = api.q(mutation, {"input": {"name": "huge", "hosts": long_names, "queues": ["launch"],
                                     "endsAt": "2027-01-01T00:00:00Z"}})["createAdvanceReservation"]
    assert got["userErrors"] == [{"field": "hosts", "code": "TOO_LARGE"}], got

    # The queue shows it; a queue a reservation names is not deleted under it.
    queue = muster(cluster, srv.url, "queue", "show", "launch").stdout
    assert "hosts set aside: 1 by advance reservation launch-run (upcoming), from" in queue, queue
    kept = muster(cluster, srv.url, "queue", "delete", "launch")
    assert kept.returncode != 0 and "named by advance reservation launch-run" in kept.stderr, kept.stderr
    # A job of another queue with no time limit could run into it: it waits, and says why.
    open_ = submit(api, "open", task(tmp_path, "open", 0.2))["job"]["id"]
    wait_until(lambda: REASON in queue_reasons(api, open_), timeout=30, what="the job says the host is set aside")
    assert "launch-run" in queue_reasons(api, open_)[REASON] and "it has no time limit" in queue_reasons(
        api, open_)[REASON]

    # From its start the other queue's work there is stopped; the queue's own job runs there.
    wait_until(lambda: any(a["state"] != "RUNNING" for a in attempts(api, early)), timeout=60,
               what="the reservation stops the job that ran there from before")
    first = attempts(api, early)[0]
    assert first["state"] == "KILLED" and "advance reservation launch-run" in first["reason"], first
    term = next(e for e in events(tmp_path) if e["job"] == "early" and e["ev"] == "term")
    assert term["t"] >= dt.datetime.fromisoformat(r["startsAt"]).timestamp()  # at its start, not when it was made
    wait_until(lambda: alerts(api, "reservation.opened"), timeout=30, what="the reservation's opening alerted")
    opened = alerts(api, "reservation.opened")[0]
    assert "advance reservation launch-run opened: 1 host(s) set aside for queue launch" in opened, opened
    ours = submit(api, "ours", task(tmp_path, "ours", 0.2), queue="launch")["job"]["id"]
    done = api.wait_job(ours, {"SUCCEEDED", "FAILED"}, timeout=60)
    assert done["state"] == "SUCCEEDED" and done["attempts"][0]["host"]["id"] == "ar-a"
    assert api.job(early)["state"] == "QUEUED" and api.job(open_)["state"] == "QUEUED"

    # Changed in place: two hours from its start, and a user's jobs admitted too.
    changed = muster(cluster, srv.url, "reservation", "set", "launch-run", "--duration", "2h", "--users", "bo",
                     "-o", "json")
    assert changed.returncode == 0, changed.stderr
    c = json.loads(changed.stdout)
    starts, ends = (dt.datetime.fromisoformat(c[k]).timestamp() for k in ("startsAt", "endsAt"))
    assert (c["state"], c["users"], c["queues"], ends - starts) == ("ACTIVE", ["bo"], ["launch"], 7200), c
    assert starts == dt.datetime.fromisoformat(r["startsAt"]).timestamp()  # open: its start kept
    shown = muster(cluster, srv.url, "reservation", "show", "launch-run")
    assert shown.returncode == 0 and "ACTIVE  for queues launch and users bo" in shown.stdout, shown
    assert "1 host(s): ar-a" in shown.stdout, shown.stdout
    # Deleted: the host is every queue's again; the stopped try was not counted.
    deleted = muster(cluster, srv.url, "reservation", "delete", "launch-run")
    assert deleted.returncode == 0, deleted.stderr
    assert api.wait_job(open_, {"SUCCEEDED", "FAILED"}, timeout=60)["state"] == "SUCCEEDED"
    wait_until(lambda: any(a["state"] == "RUNNING" for a in attempts(api, early)), timeout=60,
               what="the stopped job runs again")
    job = api.q("""query($id: ID!) { job(id: $id) { attempts { number } } }""", {"id": early})["job"]
    assert [a["number"] for a in job["attempts"]] == [1, 2]
    assert "launch-run" not in muster(cluster, srv.url, "reservation", "list").stdout
    gone = muster(cluster, srv.url, "reservation", "show", "launch-run")
    assert gone.returncode != 0 and "no advance reservation launch-run" in gone.stderr, gone
    wait_until(lambda: alerts(api, "reservation.ended"), timeout=30, what="the reservation's end alerted")
    # One that has ended is not opened again by a change of its end (found by exploring: it
    # opened at once at its old start, stopping what ran on its hosts).
    made = muster(cluster, srv.url, "reservation", "create", "brief", "ar-a", "--queues", "launch", "--duration", "2s")
    assert made.returncode == 0, made.stderr
    wait_until(lambda: "OVER" in muster(cluster, srv.url, "reservation", "show", "brief").stdout, timeout=60,
               what="the brief reservation over")
    revived = muster(cluster, srv.url, "reservation", "set", "brief", "--end", "2m")
    assert revived.returncode != 0 and "has ended: give it a new start too" in revived.stderr, revived
    assert "OVER" in muster(cluster, srv.url, "reservation", "show", "brief").stdout
    api.q("mutation($id: ID!) { cancelJob(id: $id) { job { id } } }", {"id": early})
    settled(api, early)
    assert_invariants(cluster.nats_url)
