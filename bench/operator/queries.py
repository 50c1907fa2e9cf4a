"""The requests the operator benchmark times: console pages (GET) and GraphQL queries
(POST), each with the check its answer must pass (rows listed, totalCount, filters
honoured), built from what the fleet plan and the history filler made (`Plan`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from bench.operator.fleet import FleetPlan
from bench.operator.history import Filled

PER_PAGE = 50  # console page size (web.console.PER_PAGE) and the GraphQL page asked for

HOSTS_Q = """query($first: Int, $after: String, $filter: HostFilter, $sort: HostSort) {
  hosts(first: $first, after: $after, filter: $filter, sort: $sort) { totalCount pageInfo { hasNextPage endCursor }
    edges { cursor node { id health cordoned draining simulated gpus gpuModel gpusAllocated gpusUnhealthy gpuUtilPct
      cpus cpuPct memoryMb memUsedMb lastSeen tasks labels { key value } } } } }"""
JOBS_Q = """query($first: Int, $after: String, $filter: JobFilter, $sort: JobSort) {
  jobs(first: $first, after: $after, filter: $filter, sort: $sort) { totalCount pageInfo { hasNextPage endCursor }
    edges { cursor node { id name user state priority gpus gpuModel replicas submittedAt updatedAt } } } }"""
CLUSTER_Q = """{ cluster { hosts { total healthy suspect lost } gpus { total allocated }
  gpusByModel { model total allocated healthy } gpusByRack { rack total allocated healthy }
  cpu { total allocated } memoryMb { total allocated } jobsByState { state count } } }"""
JOB_Q = """query($id: ID!) { job(id: $id) { id name user state priority submittedAt updatedAt cancelReason
  attempts { id number task state host { id health } gpuIndices exitCode placedAt startedAt finishedAt
  outputTail reason } } }"""
WHY_Q = """query($id: ID!) { job(id: $id) { id state queuePosition pendingReasons { reason hosts } } }"""


@dataclass
class Req:
    name: str
    kind: str  # "console" (GET path) or "graphql" (POST query)
    target: str
    check: Callable[[httpx.Response], str | None]
    variables: dict[str, Any] | None = None
    times: list[float] = field(default_factory=list)
    server_cpu: list[float] = field(default_factory=list)
    ok: int = 0
    failures: int = 0
    first_failure: str | None = None

    def label(self) -> str:
        if self.kind == "console":
            return f"GET {self.target}"
        return "POST /graphql " + json.dumps(self.variables or {}, separators=(",", ":"))[:160]


def _html(*needles: str, rows: tuple[str, int] | None = None) -> Callable[[httpx.Response], str | None]:
    def check(r: httpx.Response) -> str | None:
        if r.status_code != 200:
            return f"HTTP {r.status_code} {r.headers.get('location', '')}"
        for s in needles:
            if s not in r.text:
                return f"missing {s!r}"
        if rows is not None and r.text.count(rows[0]) != rows[1]:
            return f"{r.text.count(rows[0])} rows ({rows[0]!r}), expected {rows[1]}"
        return None

    return check


def _gql(pick: Callable[[dict[str, Any]], str | None]) -> Callable[[httpx.Response], str | None]:
    def check(r: httpx.Response) -> str | None:
        if r.status_code != 200:
            return f"HTTP {r.status_code}"
        body = r.json()
        if body.get("errors"):
            return str(body["errors"])[:300]
        try:
            return pick(body["data"])
        except (KeyError, TypeError, IndexError) as exc:
            return f"unexpected data: {exc!r}"

    return check


def _conn(key: str, total: int | None = None, edges: int | None = PER_PAGE,
          each: Callable[[dict[str, Any]], bool] | None = None) -> Callable[[httpx.Response], str | None]:
    def pick(d: dict[str, Any]) -> str | None:
        c = d[key]
        if total is not None and c["totalCount"] != total:
            return f"totalCount {c['totalCount']}, expected {total}"
        n = len(c["edges"])
        if (edges is not None and n != edges) or n == 0:
            return f"{n} edges, expected {edges}"
        if each is not None and not all(each(e["node"]) for e in c["edges"]):
            return "an edge does not match the filter"
        return None

    return _gql(pick)


@dataclass
class Plan:
    """What the requests ask for and what their answers must hold."""

    fleet: FleetPlan
    filled: Filled
    jobs_total: int
    queued_job: str
    host_cursor: str
    job_cursor: str


def requests_for(p: Plan) -> list[Req]:
    f, h = p.fleet, p.filled
    n_hosts = len(f.hosts)
    mid = f.live[len(f.live) // 2]
    rack, zone = mid.labels["rack"], mid.labels["zone"]
    in_rack = sum(1 for x in f.hosts if x.labels["rack"] == rack)
    a100_in_zone = sum(1 for x in f.hosts if x.labels["zone"] == zone and x.model == "A100")
    prefix = mid.id[:-2]
    matching = sum(1 for x in f.hosts if x.id.startswith(prefix))
    cordoned = len(f.cordoned) + len(f.drained)
    user = min(h.by_user, key=lambda u: (abs(h.by_user[u] - h.jobs / 100), u))  # about 1 % of the jobs
    w0, w1 = (datetime.fromtimestamp(t, UTC).isoformat() for t in h.window)
    hosts_page = max(1, n_hosts // PER_PAGE // 2)
    jobs_page = max(1, p.jobs_total // PER_PAGE // 2)
    first_rows = min(PER_PAGE, n_hosts)
    host_row = 'id="host-'
    job_row = 'id="job-'
    console = [
        Req("console / (overview, heat map)", "console", "/",
            _html("Cluster overview", "heat-", f"<dd>{n_hosts}</dd>")),
        Req("console /hosts", "console", "/hosts", _html(f"{n_hosts} hosts", rows=(host_row, first_rows))),
        Req("console /hosts?health=SUSPECT", "console", "/hosts?health=SUSPECT", _html("health SUSPECT", host_row)),
        Req("console /hosts?rack=", "console", f"/hosts?rack={rack}",
            _html(f"{in_rack} host", rows=(host_row, min(PER_PAGE, in_rack)))),
        Req("console /hosts?model=A100&zone=", "console", f"/hosts?zone={zone}&model=A100",
            _html(f"{a100_in_zone} host", rows=(host_row, min(PER_PAGE, a100_in_zone)))),
        Req("console /hosts?q= (search)", "console", f"/hosts?q={prefix}",
            _html(f"{matching} host", rows=(host_row, min(PER_PAGE, matching)))),
        Req("console /hosts?sort=-util", "console", "/hosts?sort=-util", _html(rows=(host_row, first_rows))),
        Req(f"console /hosts?page={hosts_page}", "console", f"/hosts?page={hosts_page}",
            _html(f"{n_hosts} hosts", rows=(host_row, PER_PAGE if n_hosts >= 2 * PER_PAGE else first_rows))),
        Req("console /hosts/{id}", "console", f"/hosts/{mid.id}", _html(mid.id, "GPU")),
        Req("console /jobs", "console", "/jobs", _html(f"{p.jobs_total} jobs", rows=(job_row, PER_PAGE))),
        Req("console /jobs?state=FAILED", "console", "/jobs?state=FAILED",
            _html(f"{h.by_state['FAILED']} jobs FAILED", rows=(job_row, PER_PAGE))),
        Req("console /jobs?state=RUNNING", "console", "/jobs?state=RUNNING", _html("jobs RUNNING", job_row)),
        Req(f"console /jobs?page={jobs_page}", "console", f"/jobs?page={jobs_page}",
            _html(f"{p.jobs_total} jobs", rows=(job_row, PER_PAGE))),
        Req("console /jobs/{id} (history, retried)", "console", f"/jobs/{h.retried_job}",
            _html(h.retried_job, f"{h.retried_job}.{h.retried_attempts}")),
        Req("console /jobs/{id} (queued, why pending)", "console", f"/jobs/{p.queued_job}", _html(p.queued_job)),
        Req("console /alerts", "console", "/alerts", _html("alerts, newest first", "<td>")),
    ]
    graphql = [
        Req("graphql hosts first:50", "graphql", HOSTS_Q, _conn("hosts", n_hosts), {"first": PER_PAGE}),
        Req(
            "graphql hosts health SUSPECT",
            "graphql",
            HOSTS_Q,
            _conn("hosts", None, None, lambda n: n["health"] == "SUSPECT"),
            {"first": PER_PAGE, "filter": {"health": ["SUSPECT"]}},
        ),
        Req(
            "graphql hosts zone + gpuModel",
            "graphql",
            HOSTS_Q,
            _conn("hosts", a100_in_zone, min(PER_PAGE, a100_in_zone)),
            {"first": PER_PAGE, "filter": {"zone": zone, "gpuModel": "A100"}},
        ),
        Req(
            "graphql hosts rack",
            "graphql",
            HOSTS_Q,
            _conn("hosts", in_rack, min(PER_PAGE, in_rack)),
            {"first": PER_PAGE, "filter": {"rack": rack}},
        ),
        Req(
            "graphql hosts search",
            "graphql",
            HOSTS_Q,
            _conn("hosts", matching, min(PER_PAGE, matching)),
            {"first": PER_PAGE, "filter": {"search": prefix}},
        ),
        Req(
            "graphql hosts cordoned",
            "graphql",
            HOSTS_Q,
            _conn("hosts", cordoned, min(PER_PAGE, cordoned)),
            {"first": PER_PAGE, "filter": {"cordoned": True}},
        ),
        Req(
            "graphql hosts sort GPUS_FREE_DESC",
            "graphql",
            HOSTS_Q,
            _conn("hosts", n_hosts, first_rows),
            {"first": PER_PAGE, "sort": "GPUS_FREE_DESC"},
        ),
        Req(
            "graphql hosts sort HEALTH",
            "graphql",
            HOSTS_Q,
            _conn("hosts", n_hosts, first_rows),
            {"first": PER_PAGE, "sort": "HEALTH"},
        ),
        Req(
            f"graphql hosts after cursor at {n_hosts // 2:,}",
            "graphql",
            HOSTS_Q,
            _conn("hosts", n_hosts, PER_PAGE if n_hosts >= 2 * PER_PAGE else None),
            {"first": PER_PAGE, "after": p.host_cursor},
        ),
        Req("graphql jobs first:50", "graphql", JOBS_Q, _conn("jobs", p.jobs_total), {"first": PER_PAGE}),
        Req(
            "graphql jobs state FAILED",
            "graphql",
            JOBS_Q,
            _conn("jobs", h.by_state["FAILED"], each=lambda n: n["state"] == "FAILED"),
            {"first": PER_PAGE, "filter": {"state": ["FAILED"]}},
        ),
        Req(
            "graphql jobs state RUNNING",
            "graphql",
            JOBS_Q,
            _conn("jobs", None, None, lambda n: n["state"] == "RUNNING"),
            {"first": PER_PAGE, "filter": {"state": ["RUNNING"]}},
        ),
        Req(
            "graphql jobs user",
            "graphql",
            JOBS_Q,
            _conn("jobs", h.by_user[user], min(PER_PAGE, h.by_user[user]), lambda n: n["user"] == user),
            {"first": PER_PAGE, "filter": {"user": user}},
        ),
        Req(
            "graphql jobs submitted in one day",
            "graphql",
            JOBS_Q,
            _conn("jobs", h.in_window, min(PER_PAGE, h.in_window)),
            {"first": PER_PAGE, "filter": {"submittedAfter": w0, "submittedBefore": w1}},
        ),
        Req(
            "graphql jobs namePrefix",
            "graphql",
            JOBS_Q,
            _conn("jobs", None, None, lambda n: n["name"].startswith("train-llama-70b")),
            {"first": PER_PAGE, "filter": {"namePrefix": "train-llama-70b"}},
        ),
        Req(
            "graphql jobs sort PRIORITY_DESC",
            "graphql",
            JOBS_Q,
            _conn("jobs", p.jobs_total),
            {"first": PER_PAGE, "sort": "PRIORITY_DESC"},
        ),
        Req(
            f"graphql jobs after cursor at {p.jobs_total // 2:,}",
            "graphql",
            JOBS_Q,
            _conn("jobs", p.jobs_total),
            {"first": PER_PAGE, "after": p.job_cursor},
        ),
        Req(
            "graphql cluster aggregates",
            "graphql",
            CLUSTER_Q,
            _gql(
                lambda d: (
                    None
                    if (
                        d["cluster"]["hosts"]["total"] == n_hosts
                        and d["cluster"]["gpusByModel"]
                        and d["cluster"]["gpusByRack"]
                    )
                    else f"cluster: {str(d)[:200]}"
                )
            ),
        ),
        Req(
            "graphql job with attempts",
            "graphql",
            JOB_Q,
            _gql(
                lambda d: (
                    None if len(d["job"]["attempts"]) == h.retried_attempts else f"{len(d['job']['attempts'])} attempts"
                )
            ),
            {"id": h.retried_job},
        ),
        Req(
            "graphql job pendingReasons, queuePosition",
            "graphql",
            WHY_Q,
            _gql(
                lambda d: None if (d["job"]["state"] == "QUEUED" and d["job"]["pendingReasons"]) else f"job: {d['job']}"
            ),
            {"id": p.queued_job},
        ),
    ]
    return console + graphql
