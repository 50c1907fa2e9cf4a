"""The benchmark's host simulator (bench.simhosts) fences itself as an agent does: a real
simulator process against a real nats-server frozen with SIGSTOP, so that no heartbeat
is stored. Without this a benchmark that loses a NATS node would count a try the control
plane correctly replaced (its host unheard past the TTL) as a job dispatched twice. A
short stop freezes the host's tasks and they go on; a long one stops them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent.agent import FENCED_REASON
from bench.workload import synthetic_fleet, write_fleet
from server.broker.natsd import NatsProcess
from server.state.streams import ensure_streams
from tests.conftest import eventually
from wire import subjects
from wire.kv import Store, connect


@pytest.mark.timeout(180)
async def test_the_host_simulator_freezes_its_tasks_when_no_heartbeat_is_stored(nats: NatsProcess,
                                                                                 tmp_path: Path) -> None:
    nc = await connect(nats.url, name="test")
    await ensure_streams(Store(nc))
    fleet = synthetic_fleet(1)
    host = fleet[0].id
    write_fleet(fleet, tmp_path / "fleet.json")
    reports: list[dict] = []
    stats: list[dict] = []

    async def on_report(msg) -> None:  # type: ignore[no-untyped-def]
        reports.append(json.loads(msg.data))

    async def on_stats(msg) -> None:  # type: ignore[no-untyped-def]
        stats.append(json.loads(msg.data))

    await nc.subscribe("muster.status.>", cb=on_report)
    await nc.subscribe("bench.stats.0", cb=on_stats)
    log = tmp_path / "sim.log"
    out = tmp_path / "sim.json"
    with log.open("wb") as err:
        sim = subprocess.Popen([sys.executable, "-m", "bench.simhosts", "--nats", nats.url, "--fleet",
                                str(tmp_path / "fleet.json"), "--idx", "0", "--out", str(out)], stderr=err)
    try:
        await eventually(lambda: any(s["ready"] for s in stats), timeout=60, what="the simulator ready")
        task = {"attempt_id": "j1.1", "job_id": "j1", "command": ["sleep", "600"], "gpu_indices": [0], "term": 1}
        await nc.publish(f"muster.assign.{host}", json.dumps({"host_id": host, "term": 1, "tasks": [task]}).encode(),
                         headers={"Nats-Sequence": "1"})
        await eventually(lambda: any(r["attempt_id"] == "j1.1" and r["state"] == "RUNNING" for r in reports),
                         timeout=60, what="the task running")

        nats.proc.send_signal(signal.SIGSTOP)  # nothing is stored, nothing answers
        try:
            await eventually(lambda: b"1 hosts fenced, 1 tasks frozen" in log.read_bytes(), timeout=90,
                             what="the simulator fenced", interval=0.5)
        finally:
            nats.proc.send_signal(signal.SIGCONT)
        # Stored again well before the key could expire: the frozen task goes on.
        await eventually(lambda: b"1 frozen tasks continued" in log.read_bytes(), timeout=60,
                         what="the frozen task continued", interval=0.5)
        assert not any(r["state"] == "KILLED" for r in reports)

        nats.proc.send_signal(signal.SIGSTOP)
        try:
            await eventually(lambda: b"1 frozen tasks stopped" in log.read_bytes(), timeout=90,
                             what="the frozen task stopped", interval=0.5)
        finally:
            nats.proc.send_signal(signal.SIGCONT)
        # Its report, held while NATS was frozen, is stored (read from the stream: this
        # test's own connection may have been reconnecting when it was sent); the fence
        # lifts at the next heartbeat stored.
        js = nc.jetstream()

        async def last_report() -> dict | None:
            try:
                r = json.loads((await js.get_last_msg(subjects.STATUS_STREAM, f"muster.status.{host}")).data)
            except Exception:  # noqa: BLE001 - not stored yet, or NATS still waking
                return None
            return r if r["state"] == "KILLED" else None

        killed = await eventually(last_report, timeout=60, what="the fenced task's report", interval=0.5)
        assert killed["attempt_id"] == "j1.1" and killed["reason"] == FENCED_REASON
        await eventually(lambda: log.read_bytes().count(b"fence lifted on 1 hosts") == 2, timeout=60,
                         what="the second fence lifted", interval=0.5)

        # Its heartbeat carries the fence counters, as an agent's, with its shape header.
        from wire.messages import SHAPE_HEADER, Heartbeat, shape_digest

        async def counted() -> tuple[Heartbeat, str] | None:
            try:
                m = await js.get_last_msg(subjects.HOSTS_STREAM, subjects.kv_subject(subjects.HOSTS_BUCKET, host))
            except Exception:  # noqa: BLE001
                return None
            hb = Heartbeat.model_validate_json(m.data)
            return (hb, (m.headers or {}).get(SHAPE_HEADER, "")) if hb.fences == 2 else None

        hb, shape = await eventually(counted, timeout=60, what="the fence counters heartbeated", interval=0.5)
        assert (hb.fence_continued, hb.fence_stopped) == (1, 1) and hb.last_fence_s > 0
        assert shape == shape_digest(hb)

        # A task assigned after the fence lifted starts.
        task2 = {**task, "attempt_id": "j2.1", "job_id": "j2"}
        await nc.publish(f"muster.assign.{host}", json.dumps({"host_id": host, "term": 1, "tasks": [task2]}).encode(),
                         headers={"Nats-Sequence": "2"})
        await eventually(lambda: any(r["attempt_id"] == "j2.1" and r["state"] == "RUNNING" for r in reports),
                         timeout=60, what="a task started after the fence")

        answer = await nc.request("bench.ctl.0", json.dumps({"cmd": "finish", "flush_s": 10}).encode(), timeout=30)
        assert json.loads(answer.data)["ok"]
        assert sim.wait(30) == 0
    finally:
        if sim.poll() is None:
            sim.kill()
            sim.wait()
        await nc.close()
    result = json.loads(out.read_text())
    assert list(result["fenced"]) == ["j1.1"]  # what the benchmark's verdict reads (bench.verdict.judge)
    assert result["counters"]["fences"] == 2 and result["counters"]["fenced_kills"] == 1
    assert result["counters"]["fenced_thawed"] == 1
    assert result["counters"]["acked_hb_failures"] > 0
    # How it ended on its host: killed by the fence, its report stored once the server
    # ran again (after the fence, which was while the server was stopped).
    state, ended_at, stored_at = result["host_ends"]["j1.1"]
    assert state == "KILLED" and stored_at is not None and stored_at > ended_at >= result["fenced"]["j1.1"]
