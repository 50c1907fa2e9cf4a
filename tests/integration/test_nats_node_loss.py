"""One of three NATS nodes killed (SIGKILL) while the whole system runs under load:
nothing acknowledged is lost, every job runs exactly once, scheduling resumes."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import pytest

from server.broker.natsd import start_cluster
from tests.conftest import wait_until
from tests.integration.conftest import Api, Cluster, assert_invariants, stored_jobs, wait_all_finished
from tests.integration.test_ha import Submitter
from wire.kv import connect

# Starts many processes for a long time: runs on one test worker, one heavy test at a time.
pytestmark = pytest.mark.heavy


async def stream_leader(url: str, stream: str) -> str:
    nc = await connect(url, name="probe")
    try:
        info = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=5)
        return json.loads(info.data)["cluster"]["leader"]
    finally:
        await nc.close()


@pytest.mark.timeout(600)
def test_killing_a_nats_node_under_load_loses_nothing(tmp_path: Path) -> None:
    nats = start_cluster(tmp_path / "nats", size=3)
    c = Cluster(nats.url, tmp_path)
    try:
        srv = c.server(env={"MUSTER_REPLICAS": "3"})
        c.agent("nl-a", gpus="8xH100", cpus=1000, memory_mb=10**6)
        c.agent("nl-b", gpus="8xH100", cpus=1000, memory_mb=10**6)
        api = Api(srv.url, c.token)
        api.wait_hosts(2)
        marks = tmp_path / "runs"
        sub = Submitter([srv], c.token, rate=50, command=["sh", "-c", f'echo "$MUSTER_JOB_ID" >> {marks}'])
        sub.start()
        time.sleep(4)
        # Kill the node that leads the durable state stream: the hardest one to lose.
        leader = asyncio.run(stream_leader(nats.url, "KV_state"))
        victim = next(n for n in nats.nodes if n.data_dir.name == leader)
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(10)
        killed_at = time.monotonic()
        time.sleep(8)
        sub.stop()
        # Scheduling resumed: jobs acknowledged after the kill were placed and ran.
        late = sub.ids[-20:]
        for jid in late:
            assert api.wait_job(jid, {"SUCCEEDED", "FAILED"}, timeout=120)["state"] == "SUCCEEDED"
        print(f"killed NATS node {leader}; {len(sub.ids)} jobs acknowledged, "
              f"{sub.failed_requests} requests failed while the cluster re-elected "
              f"({time.monotonic() - killed_at:.1f} s after the kill)")

        wait_all_finished(api)
        in_store = set(stored_jobs(nats.url))
        assert set(sub.ids) <= in_store, f"{len(set(sub.ids) - in_store)} acknowledged jobs lost"
        runs = [r for r in marks.read_text().split() if r] if marks.exists() else []
        assert sorted(runs) == sorted(in_store), "a job ran twice or never"
        assert_invariants(nats.url)
    finally:
        c.stop_all()
        nats.stop()


@pytest.mark.timeout(600)
def test_losing_the_node_that_leads_the_hosts_stream_costs_running_work_nothing(tmp_path: Path) -> None:
    """The NATS node leading the `hosts` stream killed (SIGKILL): no heartbeat is stored
    until the other two elect a leader, longer than the agent's fence delay here (1 s), so
    the agent freezes its running attempt. Its key (TTL 15 s) outlives the election, the
    first heartbeat after it is stored over the last one before, and the attempt goes on:
    one attempt, never SIGTERMed, the job ends SUCCEEDED."""
    from tests.integration.test_failures import marker_command, marks_by_attempt, read_marks

    nats = start_cluster(tmp_path / "nats", size=3)
    c = Cluster(nats.url, tmp_path)
    try:
        srv = c.server(heartbeat_interval=1, env={"MUSTER_REPLICAS": "3"})
        agent = c.agent("hl-a", gpus="2xH100", heartbeat_interval=1, ttl_intervals=15, fence_after=1, kill_grace=2)
        api = Api(srv.url, c.token)
        api.wait_hosts(1)
        gate, log = tmp_path / "gate", tmp_path / "marks"
        jid = api.submit(name="long", command=marker_command(log, gate), gpus=1, cpus=1, memoryMb=64)["job"]["id"]
        api.wait_job(jid, {"RUNNING"}, timeout=120)
        wait_until(lambda: any(m[0] == "start" for m in read_marks(log)), timeout=60, what="the task started")
        leader = asyncio.run(stream_leader(nats.url, "KV_hosts"))
        victim = next(n for n in nats.nodes if n.data_dir.name == leader)
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(10)
        deadline = time.monotonic() + 120
        while "frozen attempts continued" not in agent.output():
            assert "frozen attempts (SIGKILL" not in agent.output(), agent.output()[-3000:]
            assert time.monotonic() < deadline, "the agent did not fence and continue:\n" + agent.output()[-3000:]
            time.sleep(0.2)
        assert "fencing myself, 1 attempts frozen" in agent.output()
        gate.write_text("go")
        j = api.wait_job(jid, {"SUCCEEDED", "FAILED"}, timeout=120)
        assert j["state"] == "SUCCEEDED" and len(j["attempts"]) == 1, j
        assert marks_by_attempt(log) == {f"{jid}.1": ["start", "end"]}
        assert_invariants(nats.url)
    finally:
        c.stop_all()
        nats.stop()
