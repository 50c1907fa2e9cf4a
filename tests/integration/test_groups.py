"""Job groups with real processes: `muster job submit --array 6%2` runs six jobs, never more
than two at once, and `--singleton` jobs of one name never overlap, both read from the
tasks' own start and end records; the waiting jobs say why, and `job show` names the
group. The planner's logic is tested in tests/unit/test_groups.py."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import wait_until
from tests.integration.conftest import Api, Cluster, assert_invariants
from tests.integration.test_backfill import queue_reasons
from tests.integration.test_queues import events, muster, task


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most spans (start, end) open at one moment; one that ends as another starts does
    not overlap it."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = now = 0
    for _, d in edges:
        now += d
        most = max(most, now)
    return most


def spans(tmp: Path, names: list[str]) -> list[tuple[float, float]]:
    evs = events(tmp)
    out = []
    for name in names:
        start = next(e["t"] for e in evs if e["job"] == name and e["ev"] == "start")
        done = next(e["t"] for e in evs if e["job"] == name and e["ev"] == "done")
        out.append((start, done))
    return out


def queue_created(cluster: Cluster, url: str, name: str, *options: str) -> str:
    """Create a queue with `muster queue create`; what `muster queue show` prints of it."""
    r = muster(cluster, url, "queue", "create", name, *options)
    assert r.returncode == 0, r.stdout + r.stderr
    return muster(cluster, url, "queue", "show", name).stdout


def one_host_and_a_queue(cluster: Cluster, host_id: str, queue: str, *options: str) -> tuple[str, Api, str]:
    """A server, one agent with two GPUs and a queue made with `muster queue create`: the
    server's URL, its API and what `muster queue show` prints of the queue."""
    srv = cluster.server(heartbeat_interval=1)
    cluster.agent(host_id, gpus="2xH100", heartbeat_interval=1)
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    return srv.url, api, queue_created(cluster, srv.url, queue, *options)


def submitted(cluster: Cluster, url: str, *argv: str) -> str:
    """Submit one job with `muster job submit ARGV`; its id."""
    r = muster(cluster, url, "job", "submit", "-o", "json", *argv)
    assert r.returncode == 0, r.stderr
    return str(json.loads(r.stdout)["id"])


def test_an_arrays_throttle_and_a_singleton_hold_with_real_tasks(cluster: Cluster, tmp_path: Path) -> None:
    srv = cluster.server(heartbeat_interval=1)
    cluster.agent("gr-a", gpus="8xH100", heartbeat_interval=1)
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    # Six jobs with room for all of them on the host; at most two placed or running at once.
    # Each task names itself from its index (the TASK script's second argument).
    script = task(tmp_path, "x", 1.5)
    r = muster(cluster, srv.url, "job", "submit", "--gpus", "1", "--array", "6%2", "-o", "json", "sweep", "--",
               "sh", "-c", 'exec "$0" "$1" "$2" "sweep-$MUSTER_ARRAY_INDEX" "$4" "$5"', *script)
    assert r.returncode == 0, r.stderr
    ids = [j["id"] for j in json.loads(r.stdout)]
    assert len(ids) == 6
    group = r.stderr.split("array group ", 1)[1].split(":", 1)[0]
    assert group.startswith("sweep#"), r.stderr
    wait_until(lambda: "waiting for its group" in queue_reasons(api, ids[-1]), timeout=30,
               what="a job of the array says it waits for its group")
    assert "its limit 2" in queue_reasons(api, ids[-1])["waiting for its group"]
    shown = muster(cluster, srv.url, "job", "show", ids[0])
    assert "group: sweep#" in shown.stdout and "at most 2 of its jobs" in shown.stdout, shown.stdout
    for j in ids:
        assert api.wait_job(j, {"SUCCEEDED", "FAILED"}, timeout=120)["state"] == "SUCCEEDED"
    assert most_at_once(spans(tmp_path, [f"sweep-{i}" for i in range(6)])) == 2
    listed = muster(cluster, srv.url, "job", "list", "--group", group, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(e["node"]["id"] for e in json.loads(listed.stdout)["edges"]) == sorted(ids)

    # Two singletons of one name, submitted together: one after the other.
    single = task(tmp_path, "nightly", 1.0)
    first = muster(cluster, srv.url, "job", "submit", "--gpus", "1", "--singleton", "-o", "json", "nightly", "--",
                   *single)
    second = muster(cluster, srv.url, "job", "submit", "--gpus", "1", "--singleton", "-o", "json", "nightly", "--",
                    *[a if a != "nightly" else "nightly-2" for a in single])
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    nightly = [json.loads(first.stdout)["id"], json.loads(second.stdout)["id"]]
    for j in nightly:
        assert api.wait_job(j, {"SUCCEEDED", "FAILED"}, timeout=120)["state"] == "SUCCEEDED"
    (a_start, a_done), (b_start, b_done) = spans(tmp_path, ["nightly", "nightly-2"])
    assert a_done <= b_start or b_done <= a_start
    listed = muster(cluster, srv.url, "job", "list", "--group", "nightly", "-o", "json")  # a singleton's group
    assert sorted(e["node"]["id"] for e in json.loads(listed.stdout)["edges"]) == sorted(nightly)
    assert_invariants(cluster.nats_url)


def test_a_queues_running_jobs_limit_runs_one_users_jobs_one_at_a_time(cluster: Cluster, tmp_path: Path) -> None:
    url, api, shown = one_host_and_a_queue(cluster, "gr-b", "etl", "--max-running-jobs-per-user", "1")
    assert "per user: at most 1 jobs placed or running at once" in shown, shown
    # CPU-only work, room for all three at once. Each runs 10 s (found in a clean clone's
    # run: at 3 s, the first two had ended before a loaded machine had submitted the
    # third, which then never waited for its user's limit to be seen doing so).
    ids = [submitted(cluster, url, "--queue", "etl", name, "--", *task(tmp_path, name, 10.0))
           for name in ("load-0", "load-1", "load-2")]
    wait_until(lambda: "user at its queue's per-user limit" in queue_reasons(api, ids[-1]), timeout=30,
               what="a waiting job says it is at its user's limit")
    for j in ids:
        assert api.wait_job(j, {"SUCCEEDED", "FAILED"}, timeout=120)["state"] == "SUCCEEDED"
    assert most_at_once(spans(tmp_path, ["load-0", "load-1", "load-2"])) == 1
    assert_invariants(cluster.nats_url)


def test_a_queues_host_labels_keep_its_jobs_on_its_hosts(cluster: Cluster, tmp_path: Path) -> None:
    srv = cluster.server(heartbeat_interval=1)
    cluster.agent("ql-a", gpus="2xH100", labels="rack=ra", heartbeat_interval=1)
    cluster.agent("ql-b", gpus="2xH100", labels="rack=rb", heartbeat_interval=1)
    api = Api(srv.url, cluster.token)
    api.wait_hosts(2)
    shown = queue_created(cluster, srv.url, "bought", "--host-label", "rack=rb")
    assert "hosts:   only those labelled rack=rb" in shown, shown
    ids = [submitted(cluster, srv.url, "--queue", "bought", "--gpus", "1", f"b{i}", "--", "true") for i in range(3)]
    for j in ids:
        done = api.wait_job(j, {"SUCCEEDED", "FAILED"}, timeout=60)
        assert done["state"] == "SUCCEEDED" and done["attempts"][0]["host"]["id"] == "ql-b", done
    refused = muster(cluster, srv.url, "job", "submit", "--queue", "bought", "--host-label", "rack=ra", "x", "--",
                     "true")
    assert refused.returncode != 0 and "queue 'bought' runs on hosts with rack=rb" in refused.stderr, refused.stderr
    # A job that waits while the queue moves to the other rack runs there (the queue's labels
    # apply when a job is placed, not when it was submitted).
    moved = submitted(cluster, srv.url, "--queue", "bought", "--gpus", "1", "--hold", "moved", "--", "true")
    r = muster(cluster, srv.url, "queue", "set", "bought", "--host-label", "rack=ra")
    assert r.returncode == 0 and "only those labelled rack=ra" in r.stdout + muster(
        cluster, srv.url, "queue", "show", "bought").stdout, r.stderr
    assert muster(cluster, srv.url, "job", "release", moved).returncode == 0
    done = api.wait_job(moved, {"SUCCEEDED", "FAILED"}, timeout=60)
    assert done["state"] == "SUCCEEDED" and done["attempts"][0]["host"]["id"] == "ql-a", done
    r = muster(cluster, srv.url, "queue", "set", "bought", "--no-host-labels")
    assert r.returncode == 0 and "hosts:" not in muster(cluster, srv.url, "queue", "show", "bought").stdout
    assert_invariants(cluster.nats_url)


def test_a_queue_with_fair_share_between_users_starts_a_teammates_job_before_one_users_backlog(
        cluster: Cluster, tmp_path: Path) -> None:
    url, api, shown = one_host_and_a_queue(cluster, "uf-a", "team", "--fair-share-users", "on")
    assert "users:   fair share" in shown, shown
    r = muster(cluster, url, "token", "create", "bo", "--role", "operator", "--queues", "team", "--nats",
               cluster.nats_url)
    assert r.returncode == 0, r.stderr
    bo = r.stdout.strip().splitlines()[-1]
    wait_until(lambda: api.raw("{ ping }", token=bo).status_code == 200, timeout=10, what="bo's token")
    # The host takes nothing while both users' jobs arrive: one user's four first, then
    # the teammate's two.
    assert muster(cluster, url, "host", "cordon", "uf-a", "--reason", "test").returncode == 0
    mine = [submitted(cluster, url, "--queue", "team", "--gpus", "1", f"mine-{i}", "--",
                      *task(tmp_path, f"mine-{i}", 1.0)) for i in range(4)]
    r = muster(cluster, url, "job", "submit", "-o", "json", "--queue", "team", "--gpus", "1", "theirs-0", "--",
               *task(tmp_path, "theirs-0", 1.0), token=bo)
    assert r.returncode == 0, r.stderr
    theirs = json.loads(r.stdout)["id"]

    def position(job_id: str) -> int | None:
        return api.q('query($id: ID!) { job(id: $id) { queuePosition } }', {"id": job_id})["job"]["queuePosition"]

    # Second in the queue's order, though submitted last: its user holds nothing, as the first's.
    wait_until(lambda: position(theirs) == 2, timeout=30, what="the teammate's job second in the queue's order")
    assert position(mine[1]) == 3
    shown = muster(cluster, url, "queue", "show", "team").stdout
    assert "by user (next first): " in shown and "bo 0 GPUs, 0 running, 1 not ended" in shown, shown
    assert muster(cluster, url, "host", "uncordon", "uf-a").returncode == 0
    for j in [*mine, theirs]:
        assert api.wait_job(j, {"SUCCEEDED", "FAILED"}, timeout=120)["state"] == "SUCCEEDED"
    # The host's two GPUs went to one job of each user first (from the tasks' own records).
    started = sorted((e["t"], e["job"]) for e in events(tmp_path) if e["ev"] == "start")
    assert {name for _, name in started[:2]} == {"mine-0", "theirs-0"}, started
    assert_invariants(cluster.nats_url)
