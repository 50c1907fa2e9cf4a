"""The NATS submission path: jobs published on `muster.submit.<user>` run once each."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from nats.errors import MaxPayloadError

import nats as natslib
from server.broker.natsd import NatsProcess
from server.state.streams import ensure_streams
from tests.conftest import eventually, frozen, wait_until
from tests.integration.conftest import Api, Cluster, assert_invariants
from wire import subjects
from wire.kv import Store, connect
from wire.submit import submit_over_nats

PY = sys.executable


def test_a_submissions_user_is_its_subjects_and_its_time_when_stored(cluster: Cluster) -> None:
    """Found by exploring: the job's user was the one the message's body named (any, with
    any characters), and its submission time the client's (dated back, it went to the head
    of its queue). The subject names the user (what a submitter's credentials allow), and
    the queue when it names one, and the stream's clock dates it; a subject that names no
    user is dropped."""
    import time

    from wire.messages import SubmitRequest, encode

    srv = cluster.server()
    api = Api(srv.url, cluster.token)
    made = api.q('mutation { createQueue(input: {name: "research"}) { userErrors { message } } }')
    assert made["createQueue"]["userErrors"] == [], made

    async def publish() -> float:
        nc = await natslib.connect(cluster.nats_url)
        js = nc.jetstream()
        before = time.time()
        forged = SubmitRequest(user="root\x1b[2J", ts=1000.0, jobs=[{"id": "forged-user-1", "name": "f",
                                                                       "command": ["true"], "held": True}])
        await js.publish(f"{subjects.SUBMIT_PREFIX}.alice", encode(forged))
        nobody = SubmitRequest(user="bob", jobs=[{"id": "no-user-1", "name": "n", "command": ["true"]}])
        await js.publish(f"{subjects.SUBMIT_PREFIX}.a.b.c", encode(nobody))
        queued = SubmitRequest(user="bob", queue="prod", jobs=[{"id": "to-research-1", "name": "r",
                                                                 "command": ["true"]}])
        await js.publish(subjects.submit_subject("carol", "research"), encode(queued))
        await nc.close()
        return before

    before = asyncio.run(publish())
    job = wait_until(lambda: api.job("forged-user-1"), timeout=60, what="the job created")
    full = api.q('query { job(id: "forged-user-1") { user submittedAt } }')["job"]
    assert full["user"] == "alice", full
    import datetime as dt

    submitted = dt.datetime.fromisoformat(full["submittedAt"]).timestamp()
    assert before - 1 <= submitted <= time.time(), (before, full)
    async def left() -> int:  # messages not yet taken (and acknowledged) by the leader
        nc = await natslib.connect(cluster.nats_url)
        try:
            return (await nc.jetstream().stream_info(subjects.SUBMIT_STREAM)).state.messages
        finally:
            await nc.close()

    wait_until(lambda: asyncio.run(left()) == 0, timeout=60, what="the submissions taken")
    assert job["state"] == "QUEUED" and api.job("no-user-1") is None
    research = api.q('query { job(id: "to-research-1") { user queue } }')["job"]
    assert research == {"user": "carol", "queue": "research"}, research


def test_jobs_submitted_over_nats_run_once(cluster: Cluster) -> None:
    srv = cluster.server()
    cluster.agent("ns-a", gpus="4xH100")
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    jobs = [{"name": f"n{i}", "command": [PY, "-c", f"print({i})"], "gpus": 1, "cpus": 1, "memory_mb": 64}
            for i in range(20)]
    bad = [{"id": "bad-job-0001", "name": "bad", "command": [], "gpus": 1}]

    async def publish() -> list[str]:
        nc = await natslib.connect(cluster.nats_url)
        js = nc.jetstream()
        ids = await submit_over_nats(js, jobs, user="pipeline")
        # The same batch again (a retry after a lost ack): nothing is created twice.
        again = await submit_over_nats(js, [dict(j, id=i) for j, i in zip(jobs, ids, strict=True)], user="pipeline")
        assert again == ids
        await submit_over_nats(js, bad, user="pipeline")
        await nc.close()
        return ids

    ids = asyncio.run(publish())
    for i, jid in enumerate(ids):
        wait_until(lambda jid=jid: api.job(jid), timeout=60, what=f"job {jid} created")
        job = api.wait_job(jid, {"SUCCEEDED", "FAILED"}, timeout=120)
        assert job["state"] == "SUCCEEDED"
        assert len(job["attempts"]) == 1 and job["attempts"][0]["outputTail"].strip() == str(i)
    assert api.job("bad-job-0001") is None
    wait_until(lambda: api.q('{ jobs(first: 100) { totalCount } }')["jobs"]["totalCount"] == 20,
               what="history holds exactly the 20 jobs")
    assert api.q('query($id: ID!) { job(id: $id) { user } }', {"id": ids[0]})["job"]["user"] == "pipeline"
    assert_invariants(cluster.nats_url)


def test_a_large_nats_submission_is_split_and_nothing_behind_it_waits(cluster: Cluster) -> None:
    from wire.messages import MAX_SUBMIT_JOBS

    srv = cluster.server()
    api = Api(srv.url, cluster.token)
    n = 2 * MAX_SUBMIT_JOBS + 100  # three messages
    jobs = [{"name": f"big{i}", "command": ["true"], "gpus": 1, "cpus": 1, "memory_mb": 64} for i in range(n)]

    async def publish() -> tuple[list[str], list[str]]:
        nc = await natslib.connect(cluster.nats_url)
        js = nc.jetstream()
        ids = await submit_over_nats(js, jobs, user="bulk")
        later = await submit_over_nats(js, [dict(jobs[0], name="after")], user="bulk")
        await nc.close()
        return ids, later

    ids, later = asyncio.run(publish())
    assert len(set(ids)) == n
    # No agents: every job is queued, none placed, and the one sent after them is created too.
    wait_until(lambda: api.job(later[0]), timeout=60, what="the job sent after the big batch")
    wait_until(lambda: api.q("{ cluster { jobs { queued } } }")["cluster"]["jobs"]["queued"] == n + 1,
               timeout=60, what="every job queued")


async def test_a_submission_rides_out_a_nats_server_that_stops_answering(nats: NatsProcess) -> None:
    """nats-server frozen (SIGSTOP) for longer than a publish's timeout, as while the
    submission stream elects a leader: `submit_over_nats` sends the batch again until it
    answers, and the stream stores it once (the tries that waited in the socket are
    duplicates of the first). Without a retry window it fails at once; a batch NATS
    refuses (past max_payload) is refused at once, not tried again for the window."""
    nc = await connect(nats.url, name="test")
    try:
        await ensure_streams(Store(nc, timeout=1.0))
        js = nc.jetstream()

        async def stored() -> int:
            return (await js.stream_info(subjects.SUBMIT_STREAM)).state.messages

        jobs = [{"name": f"r{i}", "command": ["true"], "gpus": 1} for i in range(3)]
        with frozen(nats.proc.pid):
            sent = asyncio.create_task(submit_over_nats(js, jobs, user="r", timeout=1.0, within_s=120, every_s=0.2))
            await asyncio.sleep(2.5)  # at least two tries have timed out
            assert not sent.done()
        ids = await asyncio.wait_for(sent, timeout=120)
        assert len(set(ids)) == 3
        assert await stored() == 1
        with frozen(nats.proc.pid), pytest.raises(Exception) as failed:  # noqa: B017, PT011 - whatever the client raises for a timeout
            await submit_over_nats(js, jobs[:1], user="r", timeout=1.0, within_s=0)
        # That try reached the server when it ran again (its outcome was unknown to the
        # client): it is stored, once the server has read it.
        async def stored_two() -> bool:
            return await stored() == 2

        await eventually(stored_two, timeout=30, what="the timed-out try stored")
        # Sent again with the ids the exception carries (found by exploring: the ids were
        # lost with the exception, and a retry made new jobs): another call, so another
        # message, stored; the leader skips the jobs it has already (test_nats_intake.py).
        assert "id" not in jobs[0] and len(failed.value.job_ids) == 1  # the caller's dicts are not changed
        again = [dict(j, id=i) for j, i in zip(jobs[:1], failed.value.job_ids, strict=True)]
        assert await submit_over_nats(js, again, user="r") == failed.value.job_ids
        assert await stored() == 3
        fat = [{"name": "fat", "command": ["true"], "env": {"DATA": "y" * (nc.max_payload + 1)}}]
        with pytest.raises(MaxPayloadError):
            await asyncio.wait_for(submit_over_nats(js, fat, user="r", within_s=120), timeout=60)
        assert await stored() == 3
    finally:
        await nc.close()


def test_an_id_an_earlier_job_had_is_refused_after_its_record_expired(cluster: Cluster) -> None:
    """Found by exploring: once a finished job's record had expired and the server had
    restarted, a submission over NATS naming its id created a second job under it (another
    user's too), which ran again, and whose history row replaced the first's. History knows
    the id: the leader refuses it (muster.events.job.rejected) and the first job stays; a
    job that runs after it is judged by the end history holds."""
    import json

    from server.history.database import DB_FILE, History
    from wire.messages import SubmitRequest, encode

    srv = cluster.server()
    cluster.agent("reuse-1", gpus="1xH100")
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)

    async def publish(job: dict[str, object], user: str) -> None:
        nc = await natslib.connect(cluster.nats_url)
        await nc.jetstream().publish(f"{subjects.SUBMIT_PREFIX}.{user}", encode(SubmitRequest(jobs=[job])))
        await nc.close()

    asyncio.run(publish({"id": "nightly-etl-01", "name": "first", "command": ["true"], "gpus": 1}, "alice"))
    wait_until(lambda: api.job("nightly-etl-01"), timeout=60, what="the job created")
    assert api.wait_job("nightly-etl-01", {"SUCCEEDED", "FAILED"}, timeout=60)["state"] == "SUCCEEDED"
    history = History(f"sqlite:///{cluster.tmp / 'server' / DB_FILE}")
    try:
        wait_until(lambda: (lambda j: j is not None and j.state.value == "SUCCEEDED")(
            history.get_job("nightly-etl-01")), timeout=60, what="the ended job in history")
    finally:
        history.close()
    srv.stop()

    async def record_gone() -> None:
        """As the finished record's TTL (MUSTER_FINISHED_JOB_TTL), then its expiry marker's
        (60 s), would have it: nothing of the key is left in the stream."""
        nc = await natslib.connect(cluster.nats_url)
        await nc.jetstream().purge_stream(f"KV_{subjects.STATE_BUCKET}",
                                          subject=subjects.kv_subject(subjects.STATE_BUCKET,
                                                                      subjects.job_key("nightly-etl-01")))
        try:
            assert (await Store(nc).get(subjects.job_key("nightly-etl-01"))).value is None
        finally:
            await nc.close()

    asyncio.run(record_gone())
    srv = cluster.server()  # a new leader: its view has no trace of the record
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    # History answers (its first read opens the database): the leader asks it within
    # USED_IDS_WAIT_S, and takes the ids when it does not answer in time.
    assert api.q('query { job(id: "nightly-etl-01") { name } }')["job"] == {"name": "first"}

    async def again() -> list[dict[str, object]]:
        nc = await natslib.connect(cluster.nats_url)
        sub = await nc.subscribe(f"{subjects.EVENTS_PREFIX}.job.rejected")
        seen = []
        for user in ("alice", "bob"):
            await nc.jetstream().publish(f"{subjects.SUBMIT_PREFIX}.{user}", encode(SubmitRequest(jobs=[
                {"id": "nightly-etl-01", "name": "second", "command": ["true"], "gpus": 1}])))
            seen.append(json.loads((await sub.next_msg(timeout=60)).data))
        await nc.close()
        return seen

    for event in asyncio.run(again()):
        assert event["job_id"] == "nightly-etl-01" and "ids are never reused" in str(event["message"]), event
    job = api.q('query { job(id: "nightly-etl-01") { name user attempts { id } } }')["job"]
    assert job == {"name": "first", "user": "alice", "attempts": [{"id": "nightly-etl-01.1"}]}, job
    # A job that runs after it, known to history only, is taken over NATS as the API takes
    # it (found by exploring: refused there as depending on no known job), and runs.
    asyncio.run(publish({"id": "etl-report-01", "name": "report", "command": ["true"],
                         "depends_on": ["nightly-etl-01"]}, "alice"))
    wait_until(lambda: api.job("etl-report-01"), timeout=60, what="the job that runs after it created")
    assert api.wait_job("etl-report-01", {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=60)["state"] == "SUCCEEDED"


async def test_a_submission_that_cannot_be_read_has_its_jobs_said_rejected(nats_url: str, tmp_path: Path) -> None:
    """Found by exploring: a malformed submission (too many jobs, an element that is not
    a job, a field of the wrong type) was acknowledged and dropped with a log line only:
    its client, watching muster.events.job.rejected, never heard of its jobs again."""
    import json

    from server.replica import Muster, ServerConfig

    mu = Muster(ServerConfig(nats_url=nats_url, data_dir=tmp_path / "data", name="unread-test",
                             heartbeat_interval_s=5.0))
    await mu.start()
    try:
        assert mu.store is not None
        rejected: list[dict[str, object]] = []

        async def on_rejected(msg) -> None:  # type: ignore[no-untyped-def]
            rejected.append(json.loads(msg.data))

        await mu.store.nc.subscribe(f"{subjects.EVENTS_PREFIX}.job.rejected", cb=on_rejected)
        body = {"v": 1, "ts": "now", "jobs": [{"id": "unread-job-1", "name": "a", "command": ["true"]}, 7,
                                               {"id": "unread-job-2", "name": "b", "command": ["true"]}]}
        await mu.store.js.publish(subjects.submit_subject("alice"), json.dumps(body).encode())
        await eventually(lambda: len(rejected) == 2, what="both jobs said rejected")
        assert [e["job_id"] for e in rejected] == ["unread-job-1", "unread-job-2"]
        assert all(str(e["message"]).startswith("the submission could not be read: ") for e in rejected), rejected
        assert "unread-job-1" not in mu.state.jobs
        # Nested past the JSON parser's depth (a review: RecursionError escaped, the message
        # was never acknowledged and came back for ever): acknowledged, no id to tell.
        deep = b'{"jobs":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        await mu.store.js.publish(subjects.submit_subject("alice"), deep)

        async def taken() -> bool:
            assert mu.store is not None
            return (await mu.store.js.stream_info(subjects.SUBMIT_STREAM)).state.messages == 0

        await eventually(taken, what="the nested submission acknowledged")
    finally:
        await mu.shutdown()
