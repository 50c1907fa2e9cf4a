"""The benchmark's parts that need no cluster: the dispatch checks (`bench.verdict.judge`),
the plot from a report's series, a histogram's window, the simulator's prebuilt heartbeat
frames, `--preload`'s plan, and the rendered 3-node NATS configs (written, not started).
The runs themselves are in tests/integration/test_bench.py."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

import bench
from bench.__main__ import main
from bench.natscluster import write_cluster_configs
from bench.stats import histogram_window
from bench.verdict import judge

PNG = b"\x89PNG\r\n\x1a\n"


def test_judge_complete_gang_is_dispatched_when_its_last_task_arrives() -> None:
    arr = [("j1.1.0", "h1", 10.0, 0), ("j1.1.2", "h3", 10.5, 2), ("j1.1.1", "h2", 10.2, 1)]
    v = judge("j1", 3, arr, {}, None, exclusive=True)
    assert v.dispatched_at == 10.5 and v.tasks_seen == 3 and v.tries == 1
    assert not (v.twice or v.partial or v.shared_host), v.problems


def test_judge_flags_a_partial_gang_a_shared_host_and_a_task_twice() -> None:
    v = judge("j1", 3, [("j1.1.0", "h1", 1.0, 0), ("j1.1.1", "h2", 1.0, 1)], {}, None, exclusive=True)
    assert v.partial and v.dispatched_at is None and v.tasks_seen == 2
    v = judge("j1", 2, [("j1.1.0", "h1", 1.0, 0), ("j1.1.1", "h1", 1.0, 1)], {}, None, exclusive=True)
    assert v.shared_host and v.dispatched_at == 1.0
    assert not judge("j1", 2, [("j1.1.0", "h1", 1.0, 0), ("j1.1.1", "h1", 1.0, 1)], {}, None,
                     exclusive=False).shared_host  # small tasks may share a host
    v = judge("j1", 2, [("j1.1.0", "h1", 1.0, 0), ("j1.1.0", "h2", 1.1, 0), ("j1.1.1", "h3", 1.0, 1)], {}, None,
              exclusive=True)
    assert v.twice


def test_judge_accepts_a_second_try_only_after_the_killed_host() -> None:
    first = [("j1.1.0", "h1", 1.0, 0), ("j1.1.1", "dead", 1.0, 1)]
    second = [("j1.2.0", "h4", 20.0, 0), ("j1.2.1", "h5", 20.1, 1)]
    v = judge("j1", 2, first + second, {}, "dead", exclusive=True)
    assert not v.twice and v.dispatched_at == 1.0 and v.tries == 2, v.problems
    v = judge("j1", 2, first + second, {"j1.1.0": "h1", "j1.1.1": "dead"}, "elsewhere", exclusive=True,
              ended={"j1.1.0": "LOST: host lost", "j1.2.0": "SUCCEEDED: -"})
    assert v.twice and "j1.1.0 on h1 ended LOST: host lost" in v.problems[-1], v.problems  # how the first ended
    assert "j1.2.0" not in v.problems[-1]
    # The killed host ignored its task: the try is incomplete, but not split by the server.
    partial = [("j1.1.0", "h1", 1.0, 0)]
    placed = {"j1.1.0": "h1", "j1.1.1": "dead", "j1.2.0": "h4", "j1.2.1": "h5"}
    v = judge("j1", 2, partial + second, placed, "dead", exclusive=True)
    assert not v.partial and not v.twice and v.dispatched_at == 20.1, v.problems
    assert judge("j1", 2, partial + second, {}, "dead", exclusive=True).partial
    # Single jobs: `<job>.<try>` ids.
    v = judge("j2", 1, [("j2.1", "dead", 1.0, 0), ("j2.2", "h2", 9.0, 0)], {}, "dead", exclusive=False)
    assert not v.twice and v.dispatched_at == 1.0


def test_judge_accepts_a_later_try_only_after_a_fence_stopped_the_one_before() -> None:
    """A simulator that could not store a heartbeat fences itself, as an agent does: the
    try it stopped may be replaced, but only once every attempt of it was stopped."""
    first = [("j1.1.0", "h1", 1.0, 0), ("j1.1.1", "h2", 1.0, 1)]
    second = [("j1.2.0", "h4", 20.0, 0), ("j1.2.1", "h5", 20.1, 1)]
    v = judge("j1", 2, first + second, {}, None, exclusive=True, fenced={"j1.1.0": 12.0, "j1.1.1": 12.0})
    assert not v.twice and v.retried_after_fence and v.dispatched_at == 1.0, v.problems
    # One task of the first try was never stopped: both ran at once.
    v = judge("j1", 2, first + second, {}, None, exclusive=True, fenced={"j1.1.0": 12.0})
    assert v.twice and not v.retried_after_fence and "try 1 of 2" in v.problems[0], v.problems
    # The problem says how each attempt of that try ended, in the job's record and on its
    # host, timed from the retry's arrival.
    v = judge("j1", 2, first + second, {"j1.1.0": "h1", "j1.1.1": "h2"}, None, exclusive=True,
              ended={"j1.1.0": "KILLED: fenced", "j1.1.1": "LOST: host h2 lost"}, fenced={"j1.1.0": 12.0},
              host_ends={"j1.1.0": ["KILLED", 12.0, 12.5], "j1.1.1": ["SUCCEEDED", 8.0, None]})
    assert ("j1.1.1 on h2 ended LOST: host h2 lost, on its host: SUCCEEDED at -12.0 s, its report not stored"
            in v.problems[0]), v.problems
    assert "j1.1.0 on h1 ended KILLED: fenced, on its host: KILLED at -8.0 s, its report stored at -7.5 s" \
        in v.problems[0], v.problems
    # Stopped only after the next try had reached a host.
    assert judge("j1", 2, first + second, {}, None, exclusive=True,
                 fenced={"j1.1.0": 12.0, "j1.1.1": 25.0}).twice
    # A third try needs a cause for the second as well.
    third = [("j1.3.0", "h6", 40.0, 0), ("j1.3.1", "h7", 40.0, 1)]
    fenced = {"j1.1.0": 12.0, "j1.1.1": 12.0}
    assert judge("j1", 2, first + second + third, {}, None, exclusive=True, fenced=fenced).twice
    v = judge("j1", 2, first + second + third, {"j1.2.1": "dead"}, "dead", exclusive=True, fenced=fenced)
    assert not v.twice, v.problems


def test_plot_command_draws_a_png_from_a_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m bench plot REPORT.json [-o PNG]`: the plot from the `series` a report
    keeps (bench.plot.plot_series of a run's raw samples), by default beside the report."""
    from bench.plot import plot_series

    t0 = 1764547200.0
    ticks = [{"t": t0 + i, "phase": "run", "submitted": 50 * i, "dispatched_live": 50 * i - 3 * (i > 0),
              "placements": 50.0 * i, "hb_received": 400.0 * i, "running": 40 * i, "queue_depth": 3.0,
              "hb_pending": 2.0, "tasks_submitted": 50 * i} for i in range(6)]
    dispatch = [(t0 + j / 50, t0 + j / 50 + 0.004 + (j % 7) / 1000) for j in range(250)]
    running = [(sub, disp + 0.05) for sub, disp in dispatch[::2]]
    series = plot_series({"ticks": ticks, "dispatch": dispatch, "running": running, "samples": [], "t0": t0})
    assert [row[0] for row in series["dispatch_ms_by_second"]] == [0, 1, 2, 3, 4]
    assert sum(row[1] for row in series["dispatch_ms_by_second"]) == 250
    assert all(4.0 <= row[2] <= row[3] <= row[4] <= 10.0 for row in series["dispatch_ms_by_second"])
    rep = {"config": {"hosts": 100, "rate": 50.0, "burst": None, "workload": "synthetic", "nats_cluster": 1},
           "series": series}
    report = tmp_path / "small.json"
    report.write_text(json.dumps(rep))
    assert main(["plot", str(report), "-o", str(tmp_path / "out" / "small.png")]) == 0
    assert (tmp_path / "out" / "small.png").read_bytes()[:8] == PNG
    assert main(["plot", str(report)]) == 0
    assert (tmp_path / "small.png").read_bytes()[:8] == PNG
    # A report written before reports kept their series cannot be plotted: said, not a traceback.
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"config": rep["config"], "dispatch_latency_ms": {}}))
    capsys.readouterr()
    assert main(["plot", str(old)]) == 1 and not (tmp_path / "old.png").exists()
    assert "has no `series`" in capsys.readouterr().err


def test_histogram_window_counts_only_what_the_window_observed() -> None:
    def scrape(fast: float, slow: float, gen1: float = 0.0) -> dict[str, float]:
        m = {'h_bucket{le="0.1"}': fast, 'h_bucket{le="0.5"}': fast, 'h_bucket{le="1.0"}': fast + slow,
             'h_bucket{le="+Inf"}': fast + slow, "h_count": fast + slow, "h_sum": 0.01 * fast + 0.9 * slow}
        # A labelled histogram (GC pauses by generation) is summed over its labels.
        m.update({'g_bucket{generation="1",le="0.1"}': gen1, 'g_bucket{generation="1",le="+Inf"}': gen1,
                  'g_count{generation="1"}': gen1, 'g_bucket{generation="2",le="0.1"}': 0.0,
                  'g_bucket{generation="2",le="+Inf"}': slow, 'g_count{generation="2"}': slow})
        return m

    w = histogram_window(scrape(100, 1), scrape(150, 3), "h")
    assert w == {"count": 52, "sum_s": 2.3, "over_0.1_s": 2, "over_0.5_s": 2, "over_1_s": 0, "max_le_s": 1.0}
    assert histogram_window(scrape(5, 0), scrape(9, 0), "h")["max_le_s"] == 0.1
    assert histogram_window(scrape(5, 0), scrape(5, 0), "h") == {
        "count": 0, "sum_s": 0.0, "over_0.1_s": 0, "over_0.5_s": 0, "over_1_s": 0, "max_le_s": None}
    g = histogram_window(scrape(0, 0, gen1=2), scrape(0, 1, gen1=5), "g")
    assert g["count"] == 4 and g["over_1_s"] == 1 and g["max_le_s"] == "+Inf"


@pytest.mark.parametrize("kind", ["plain", "varied"])
def test_simulated_heartbeat_frame_is_what_nats_py_publish_sends(kind: str) -> None:
    """The simulator writes heartbeats as prebuilt HPUB frames: byte for byte what nats-py's
    publish() sends for the same subject, body and headers (its own code builds the
    reference); also for the operator bench's hosts (a subclass), and after a shape change."""
    from nats.aio.client import Client

    from bench.operator.fleet import VariedSimHost
    from bench.simhosts import SimHost
    from bench.workload import HostSpec
    from wire.messages import SHAPE_HEADER

    cls = SimHost if kind == "plain" else VariedSimHost
    h = cls(HostSpec(id="host-00042", gpus=8, model="A100", cpus=64, memory_mb=512_000,
                     labels={"rack": "r1"}), "b00t", "15s")
    sent: list[bytes] = []

    async def capture(cmd: bytes, priority: bool = False) -> None:
        sent.append(cmd)

    nc = Client()
    nc._send_command = capture  # type: ignore[method-assign]
    # The second frame reuses the first's header block; before the third the shape changes
    # (as the operator bench's hosts set theirs after the base class built its own).
    for now, shape in ((1764547200.25, h.shape), (1764547205.5, h.shape), (1764547210.75, "f" * 24)):
        h.shape = shape
        frame = h.heartbeat_frame(now)
        h.seq -= 1
        body = h.heartbeat(now)
        sent.clear()
        asyncio.run(nc._send_publish(h.subject, "", body, len(body), {"Nats-TTL": "15s", SHAPE_HEADER: h.shape}))
        assert sent == [frame]
        assert frame.startswith(b"HPUB $KV.hosts.host-00042 ") and b"Muster-Shape: " + h.shape.encode() in frame


def test_preload_plan_spreads_running_jobs_and_refuses_what_does_not_fit() -> None:
    from bench.preload import is_preloaded_attempt, plan
    from bench.workload import synthetic_fleet
    from wire.messages import AttemptState, JobState

    fleet = synthetic_fleet(10)
    jobs, allocs = plan(fleet, 35, now=1000.0)
    assert len({j.id for j in jobs}) == 35
    assert all(j.state is JobState.RUNNING and j.attempts[0].state is AttemptState.RUNNING for j in jobs)
    assert sorted(len(a.tasks) for a in allocs) == [3] * 5 + [4] * 5
    where = {j.attempts[0].id: j.attempts[0].host_id for j in jobs}
    assert {t.attempt_id: a.host_id for a in allocs for t in a.tasks} == where
    assert all(is_preloaded_attempt(aid) for aid in where)
    assert not is_preloaded_attempt("preload-0000001.2")  # a rerun is simulated like any task
    assert not is_preloaded_attempt("job-0000001.1")
    with pytest.raises(ValueError):
        plan(fleet[:1], 100_000, now=1000.0)  # 10,000 CPUs' worth on one host


def _cluster_settings(text: str) -> dict:
    text = re.sub(r"#.*", "", text)
    cluster = re.search(r"cluster\s*\{(.*?)\}", text, re.S)
    assert cluster, text
    return {"server_name": re.search(r'server_name:\s*"?([\w-]+)', text).group(1),
            "cluster": re.search(r'name:\s*"?([\w-]+)', cluster.group(1)).group(1),
            "routes": len(re.findall(r"nats-route://127\.0\.0\.1:\d+", cluster.group(1))),
            "http": bool(re.search(r"^\s*http:", text, re.M)),
            "store_dir": bool(re.search(r"^\s*store_dir:", text, re.M)),
            "sync_always": bool(re.search(r"^\s*sync_interval:\s*always\s*$", text, re.M))}


def test_rendered_cluster_has_the_settings_of_nats_cluster_confs(tmp_path: Path) -> None:
    """The benchmark's 3-node cluster is the one nats/cluster/n*.conf describes (names,
    cluster, routes, monitoring, fsync), on its own ports and stores; `--nats-sync default`
    drops only the fsync setting."""
    shipped = Path(bench.__file__).resolve().parent.parent / "nats" / "cluster"
    if not (shipped / "n1.conf").exists():
        pytest.skip(f"no {shipped} (not a checkout)")
    nodes = write_cluster_configs(tmp_path / "a", sync_always=True)
    for i, node in enumerate(nodes, start=1):
        assert _cluster_settings(node.config.read_text()) == _cluster_settings((shipped / f"n{i}.conf").read_text())
        assert str((tmp_path / "a" / "nats" / f"n{i}").resolve()) in node.config.read_text()
    ports = {n.port for n in nodes} | {n.http_port for n in nodes}
    assert len(ports) == 6 and not ports & {4222, 4223, 4224, 8222, 8223, 8224}
    for node in write_cluster_configs(tmp_path / "b", sync_always=False):
        assert not _cluster_settings(node.config.read_text())["sync_always"]


@pytest.mark.parametrize("argv", [
    ["--one-per-request"],  # NATS submission is batched by nature
    ["--one-per-request", "--submit-via", "graphql", "--burst", "10"],
    ["--one-per-request", "--submit-via", "graphql", "--clients", "0"],
])
def test_one_per_request_needs_graphql_clients_and_arrivals(argv: list[str], capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    assert main([*argv, "--work-dir", str(tmp_path)]) == 1
    assert "--one-per-request needs" in capsys.readouterr().err


async def _api_replica(requests: list[dict], connections: list[int], close_after: int | None = None
                       ) -> asyncio.Server:
    """A small HTTP/1.1 server in this process answering submitJob (names starting `bad`
    refused); with `close_after`, it stops listening and drops the connection after that
    many requests, as a replica that dies does."""
    server: asyncio.Server

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        while True:
            line = await reader.readline()
            if not line:
                break
            length = 0
            while (h := await reader.readline()) not in (b"\r\n", b""):
                if h.lower().startswith(b"content-length:"):
                    length = int(h.split(b":")[1])
            body = json.loads(await reader.readexactly(length))
            if close_after is not None and len(requests) >= close_after:
                server.close()
                break
            requests.append(body)
            inp = body["variables"]["input"]
            answer = {"data": {"submitJob": {"job": None, "userErrors": [{"message": "no"}]}}} \
                if inp["name"].startswith("bad") else {"data": {"submitJob": {"job": {"id": "j-" + inp["name"]},
                                                                              "userErrors": []}}}
            data = json.dumps(answer).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(data)).encode() + b"\r\n\r\n" + data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server


def _url(server: asyncio.Server) -> str:
    return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_one_job_per_request_clients_submit_every_job_and_count_refusals() -> None:
    """bench.clients against two API replicas in this process: every job goes in a request
    of its own on each client's keep-alive connection, the clients spread over both
    replicas; refusals are counted."""
    from bench.clients import run_clients

    requests: list[dict] = []
    conns_a: list[int] = []
    conns_b: list[int] = []
    a = await _api_replica(requests, conns_a)
    b = await _api_replica(requests, conns_b)
    jobs: asyncio.Queue = asyncio.Queue()
    names = [f"ok{i}" for i in range(20)] + ["bad1", "bad2"]
    for i, name in enumerate(names):
        jobs.put_nowait((1000.0 + i, {"name": name, "command": ["true"]}, name))
    for _ in range(3):
        jobs.put_nowait(None)
    seen: dict[str, tuple[float, object]] = {}
    res = await run_clients([_url(a), _url(b)], "tok", 3, jobs,
                            lambda job_id, arrived, tag: seen.__setitem__(job_id, (arrived, tag)))
    for srv in (a, b):
        srv.close()
        await srv.wait_closed()
    assert (res.submitted, res.refused, res.failed) == (20, 2, 0)
    assert len(res.request_s) == 22 and (len(conns_a), len(conns_b)) == (2, 1)
    assert seen == {f"j-ok{i}": (1000.0 + i, f"ok{i}") for i in range(20)}
    assert sorted(r["variables"]["input"]["name"] for r in requests) == sorted(names)
    assert all("submitJob(input: $input)" in r["query"] for r in requests)


async def test_one_job_per_request_client_moves_to_the_next_replica_when_its_own_dies() -> None:
    from bench.clients import run_clients

    requests: list[dict] = []
    conns_a: list[int] = []
    conns_b: list[int] = []
    a = await _api_replica(requests, conns_a, close_after=3)
    b = await _api_replica(requests, conns_b)
    jobs: asyncio.Queue = asyncio.Queue()
    for i in range(10):
        jobs.put_nowait((float(i), {"name": f"ok{i}", "command": ["true"]}, i))
    jobs.put_nowait(None)
    seen: list[str] = []
    res = await run_clients([_url(a), _url(b)], "tok", 1, jobs, lambda job_id, arrived, tag: seen.append(job_id))
    b.close()
    await b.wait_closed()
    # The request the dying replica dropped is counted failed; the rest went to the other.
    assert (res.submitted, res.failed) == (9, 1)
    assert len(conns_a) == 1 and len(conns_b) == 1
    assert len(seen) == 9 and len(set(seen)) == 9


def test_preloaded_jobs_are_counted_in_the_history_database_the_servers_were_given(tmp_path: Path) -> None:
    """With --db-url (or --postgres) the start waits on that database, not on a SQLite
    file in the first server's data directory (which then never appears)."""
    import argparse
    import sqlite3

    from bench.preload import PREFIX
    from bench.run import Bench

    db = tmp_path / "shared.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY)")
    con.executemany("INSERT INTO jobs VALUES (?)", [(f"{PREFIX}{i}",) for i in range(3)] + [("j-other",)])
    con.commit()
    con.close()
    assert Bench(argparse.Namespace(db_url=f"sqlite:///{db}"), tmp_path / "work").preloaded_in_history() == 3
    assert Bench(argparse.Namespace(db_url=None), tmp_path / "work").preloaded_in_history() == 0
    assert Bench(argparse.Namespace(db_url=f"sqlite:///{tmp_path / 'none' / 'x.db'}"),
                 tmp_path / "work").preloaded_in_history() == 0


def test_a_job_never_dispatched_is_queued_waiting_placed_or_lost_at_the_end() -> None:
    from bench.verdict import undispatched

    jobs = {"j1": {"state": "QUEUED"}, "j2": {"state": "CANCELLED"}, "j4": {"state": "RUNNING"},
            "j6": {"state": "PLACED"}}
    assert undispatched(["j1", "j2", "j3", "j5", "j6"], jobs, {"j5", "j2"}) == (["j1"], ["j5"], ["j6"], ["j2", "j3"])
    assert undispatched(["j1", "j3", "j4"], jobs) == (["j1"], [], ["j4"], ["j3"])
    assert undispatched([], jobs) == ([], [], [], [])
