"""NATS authentication and per-party permissions, API tokens through the CLI, and TLS.

Every test here runs a real nats-server with the users Muster generates (nkeys), and
checks what NATS itself refuses."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import os
import re
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError

from server.broker.natsauth import AuthDir
from server.broker.natsd import NatsProcess, ServerTls, free_port, start_nats, wait_for_port
from server.cli import build_parser
from server.state.streams import ensure_streams
from tests.conftest import ROOT, A, B, eventually, wait_until
from tests.integration.conftest import Api, Cluster
from wire import subjects
from wire.errors import StoreError
from wire.kv import Store, connect
from wire.subjects import agent_inbox_prefix


def cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "server.cli", *argv], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=60)


@pytest.fixture
def secure_nats(tmp_path: Path, auth: AuthDir) -> Any:
    proc = start_nats(tmp_path / "nats", port=0, auth=auth)
    try:
        yield proc
    finally:
        proc.stop()


class Errors:
    """Collects the asynchronous errors (permission violations) NATS sends a client."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def cb(self, exc: Exception) -> None:
        self.seen.append(str(exc).lower())

    def has(self, text: str) -> bool:
        return any(text.lower() in e for e in self.seen)

    async def wait_for(self, text: str, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while not self.has(text):
            if time.monotonic() > deadline:
                raise AssertionError(f"no error containing {text!r}; got {self.seen}")
            await asyncio.sleep(0.02)


def test_no_credentials_no_connection(secure_nats: NatsProcess, auth: AuthDir, tmp_path: Path) -> None:
    async def main() -> None:
        with pytest.raises(StoreError, match="(?i)authorization"):
            await connect(secure_nats.url, "anonymous", allow_reconnect=False, max_reconnect_attempts=0)
        other = AuthDir(tmp_path / "other")
        other.ensure()  # a well-formed key the server does not know
        with pytest.raises(StoreError, match="(?i)authorization"):
            await connect(secure_nats.url, "stranger", creds=str(other.server_creds), allow_reconnect=False,
                          max_reconnect_attempts=0)

    asyncio.run(main())


def test_rogue_agent_cannot_touch_another_host(secure_nats: NatsProcess, auth: AuthDir) -> None:
    async def main() -> None:
        srv = await connect(secure_nats.url, "server", creds=str(auth.server_creds))
        store = Store(srv)
        await ensure_streams(store)
        await store.put(subjects.alloc_key(A), b'{"host_id": "host-a", "tasks": []}')
        b_alloc = await store.put(subjects.alloc_key(B), b'{"host_id": "host-b", "tasks": ["secret"]}')
        b_hb = await store.put(B, b'{"host_id": "host-b"}', bucket=subjects.HOSTS_BUCKET)

        errors = Errors()
        nc = await connect(secure_nats.url, "rogue", creds=str(auth.agent_creds(A)),
                           inbox_prefix=agent_inbox_prefix(A), error_cb=errors.cb)
        # Allowed calls get a generous bound (the machine is shared); refused ones get no reply at
        # all, so they wait out a short one.
        own_store = Store(nc, timeout=15)
        rogue = Store(nc, timeout=1)
        # What host A may do works: its heartbeat, its assignments, its status reports.
        await own_store.js.publish(subjects.kv_subject(subjects.HOSTS_BUCKET, A), b"{}", timeout=15,
                                   headers={"Nats-TTL": "15s"})
        assert (await own_store.get(subjects.alloc_key(A))).value is not None
        assert (await own_store.get(A, bucket=subjects.HOSTS_BUCKET)).value == b"{}"  # its own heartbeat key
        await own_store.js.publish(subjects.status_subject(A), b"{}", timeout=15)
        own_sub = await nc.subscribe(subjects.assign_subject(A))
        assert errors.seen == []

        status_before = (await store.js.stream_info(subjects.STATUS_STREAM)).state.messages
        hosts_before = (await store.js.stream_info(subjects.HOSTS_STREAM)).state.last_seq
        state_before = (await store.js.stream_info(subjects.STATE_STREAM)).state.last_seq

        # 1. B's heartbeat.
        with pytest.raises((NatsError, TimeoutError)):
            await rogue.js.publish(subjects.kv_subject(subjects.HOSTS_BUCKET, B), b'{"forged": 1}', timeout=1)
        await errors.wait_for(f'permissions violation for publish to "$kv.hosts.{B}"')
        with pytest.raises(StoreError):
            await rogue.get(B, bucket=subjects.HOSTS_BUCKET)
        await errors.wait_for(f"publish to \"$js.api.direct.get.kv_hosts.$kv.hosts.{B}\"")
        # 2. B's assignments: the direct get, the stream API get, the live subject.
        with pytest.raises(StoreError):
            await rogue.get(subjects.alloc_key(B))
        await errors.wait_for(f"publish to \"$js.api.direct.get.kv_state.$kv.state.alloc.{B}\"")
        with pytest.raises((NatsError, TimeoutError)):
            await rogue.js.get_msg(subjects.STATE_STREAM, subject=f"$KV.state.alloc.{B}")
        await errors.wait_for('publish to "$js.api.stream.msg.get.kv_state"')
        got: list[bytes] = []

        async def on_msg(msg: Any) -> None:
            got.append(msg.data)

        await nc.subscribe(subjects.assign_subject(B), cb=on_msg)
        await errors.wait_for(f'permissions violation for subscription to "muster.assign.{B}"')
        await nc.subscribe("$KV.state.>", cb=on_msg)
        await errors.wait_for('subscription to "$kv.state.>"')
        # ... and writing B's (or anyone's) state directly.
        with pytest.raises((NatsError, TimeoutError)):
            await rogue.js.publish(subjects.kv_subject(subjects.STATE_BUCKET, subjects.alloc_key(B)), b"{}",
                                   timeout=1)
        await errors.wait_for(f'publish to "$kv.state.alloc.{B}"')
        # 3. A status report for B's task.
        with pytest.raises((NatsError, TimeoutError)):
            await rogue.js.publish(subjects.status_subject(B), b'{"host_id": "host-b", "state": "SUCCEEDED"}',
                                   timeout=1)
        await errors.wait_for(f'publish to "muster.status.{B}"')
        # 4. JetStream management.
        with pytest.raises((NatsError, TimeoutError)):
            await rogue.js.delete_stream(subjects.STATUS_STREAM)
        await errors.wait_for('publish to "$js.api.stream.delete.status"')

        # The server changes B's assignment: it is republished, and the rogue hears nothing.
        await store.put(subjects.alloc_key(B), b'{"host_id": "host-b", "tasks": ["new"]}')
        await store.put(subjects.alloc_key(A), b'{"host_id": "host-a", "tasks": ["mine"]}')
        own = await own_sub.next_msg(timeout=15)
        assert b"mine" in own.data
        await asyncio.sleep(0.3)
        assert got == []

        # Nothing the rogue tried changed anything.
        assert (await store.js.stream_info(subjects.STATUS_STREAM)).state.messages == status_before
        assert (await store.js.stream_info(subjects.HOSTS_STREAM)).state.last_seq == hosts_before
        hb = await store.get(B, bucket=subjects.HOSTS_BUCKET)
        assert (hb.revision, hb.value) == (b_hb, b'{"host_id": "host-b"}')
        alloc = await store.get(subjects.alloc_key(B))
        assert alloc.revision > b_alloc and b"new" in (alloc.value or b"")
        assert (await store.js.stream_info(subjects.STATE_STREAM)).state.last_seq == state_before + 2
        assert nc.is_connected  # violations are refused, the agent's own link stays up
        await nc.close()
        await srv.close()

    asyncio.run(main())


def test_an_agent_answers_requests_for_its_output_and_may_publish_no_other_reply(
        secure_nats: NatsProcess, auth: AuthDir) -> None:
    """An agent may take requests on its own `muster.output.<host>` and answer each once
    (`allow_responses`); it may not listen on another host's, nor publish to an inbox
    no request of its own named."""
    async def main() -> None:
        srv = await connect(secure_nats.url, "server", creds=str(auth.server_creds))
        errors = Errors()
        nc = await connect(secure_nats.url, "agent-a", creds=str(auth.agent_creds(A)),
                           inbox_prefix=agent_inbox_prefix(A), error_cb=errors.cb)

        async def answer(msg: Any) -> None:
            await msg.respond(b"output of " + msg.data)

        await nc.subscribe(subjects.output_subject(A), cb=answer)
        await nc.flush()
        # Asked again while nats-server has no responder on record: a clean-clone run once
        # saw "no responders" right after the agent's subscription was flushed (not seen here
        # in 30 runs under load); what is checked is the answer and its permissions.
        unanswered = 0
        deadline = time.monotonic() + 15
        while True:
            try:
                reply = await srv.request(subjects.output_subject(A), b"j1.1", timeout=15)
                break
            except NoRespondersError:
                unanswered += 1
                assert time.monotonic() < deadline, (f"no responder on {subjects.output_subject(A)} "
                                                     f"after {unanswered} requests; errors {errors.seen}, "
                                                     f"agent connected {nc.is_connected}")
                await asyncio.sleep(0.1)
        assert reply.data == b"output of j1.1" and errors.seen == []

        await nc.subscribe(subjects.output_subject(B), cb=answer)
        await errors.wait_for(f'permissions violation for subscription to "muster.output.{B}"')
        heard: list[bytes] = []

        async def on_reply(msg: Any) -> None:
            heard.append(msg.data)

        await srv.subscribe("_INBOX.forged", cb=on_reply)
        await srv.flush()
        await nc.publish("_INBOX.forged", b"unasked")
        await errors.wait_for('permissions violation for publish to "_inbox.forged"')
        assert heard == [] and nc.is_connected
        await nc.close()
        await srv.close()

    asyncio.run(main())


def test_alert_subscriber_may_only_subscribe(secure_nats: NatsProcess, auth: AuthDir) -> None:
    async def main() -> None:
        srv = await connect(secure_nats.url, "server", creds=str(auth.server_creds))
        await ensure_streams(Store(srv))
        errors = Errors()
        sub_nc = await connect(secure_nats.url, "pager", creds=str(auth.subscriber_creds("pager")), error_cb=errors.cb)
        alerts = await sub_nc.subscribe("alerts.>")
        events = await sub_nc.subscribe("muster.events.>")
        await sub_nc.flush()

        async def delivered(sub: Any, subject: str, data: bytes) -> int:
            """Publish `data` from the server's connection until the subscriber has it, for
            up to 15 s; how many were published. (Once, in a clean clone's run on a loaded
            machine, the one message sent never arrived, for a reason not found; a client
            that reconnects, after missed pings for one, loses what was sent meanwhile.
            What is checked is that it may receive.)"""
            sent, deadline = 0, time.monotonic() + 15
            while True:
                await srv.publish(subject, data)
                await srv.flush()
                sent += 1
                try:
                    got = await sub.next_msg(timeout=1.0)
                except NatsError:
                    if time.monotonic() > deadline:
                        raise
                    continue
                assert got.data == data
                return sent

        sent_alerts = await delivered(alerts, "alerts.host.lost", b"lost")
        await delivered(events, "muster.events.host.LOST", b"event")
        assert errors.seen == []

        heard = await srv.subscribe(">")
        await srv.flush()
        for subject in ("alerts.host.lost", "muster.events.host.LOST", "muster.cmd.cancel",
                        "$KV.hosts.host-a", "muster.status.host-a"):
            await sub_nc.publish(subject, b"forged")
            await sub_nc.flush()
            await errors.wait_for(f'permissions violation for publish to "{subject.lower()}"')
        await sub_nc.subscribe("muster.assign.>")
        await errors.wait_for('subscription to "muster.assign.>"')
        await asyncio.sleep(0.3)
        forged = []
        while True:
            try:
                m = await heard.next_msg(timeout=0.1)
            except Exception:  # noqa: BLE001
                break
            if m.data == b"forged":
                forged.append(m.subject)
        assert forged == []
        for stream in (subjects.ALERTS_STREAM, subjects.CMDS_STREAM, subjects.STATUS_STREAM):
            info = await Store(srv).js.stream_info(stream)
            assert info.state.messages == (sent_alerts if stream == subjects.ALERTS_STREAM else 0), stream
        await sub_nc.close()
        await srv.close()

    asyncio.run(main())


def test_revoked_agent_can_no_longer_connect(secure_nats: NatsProcess, auth: AuthDir) -> None:
    async def main() -> None:
        closed = asyncio.Event()

        async def on_closed() -> None:
            closed.set()

        async def quiet(exc: Exception) -> None:
            pass

        nc = await connect(secure_nats.url, "agent-a", creds=str(auth.agent_creds(A)),
                           inbox_prefix=agent_inbox_prefix(A), closed_cb=on_closed, error_cb=quiet,
                           max_reconnect_attempts=3, reconnect_time_wait=0.2)
        assert nc.is_connected
        creds_a = auth.agent_creds(A).read_text()

        r = await asyncio.to_thread(cli, "creds", "revoke-agent", A, "--auth-dir", str(auth.path))
        assert r.returncode == 0, r.stderr
        assert "1 nats-server(s) reloaded" in r.stdout
        assert not auth.agent_creds(A).exists()
        assert A not in auth.conf_file.read_text()
        # The live connection is dropped and cannot come back.
        await asyncio.wait_for(closed.wait(), timeout=15)
        assert not nc.is_connected
        kept = auth.path / "kept-a.nk"
        kept.write_text(creds_a)
        with pytest.raises(StoreError, match="(?i)authorization"):
            await connect(secure_nats.url, "agent-a", creds=str(kept), allow_reconnect=False,
                          max_reconnect_attempts=0)
        # Other agents are unaffected, and a newly issued agent works without a restart.
        b = await connect(secure_nats.url, "agent-b", creds=str(auth.agent_creds(B)),
                          inbox_prefix=agent_inbox_prefix(B))
        r = await asyncio.to_thread(cli, "creds", "issue-agent", "host-c", "--auth-dir", str(auth.path))
        assert r.returncode == 0, r.stderr
        path = r.stdout.strip()
        assert Path(path) == auth.agent_creds("host-c")
        c = None
        for _ in range(300):
            try:
                c = await connect(secure_nats.url, "agent-c", creds=path, inbox_prefix=agent_inbox_prefix("host-c"),
                                  allow_reconnect=False, max_reconnect_attempts=0)
                break
            except StoreError:
                await asyncio.sleep(0.1)  # the reload is asynchronous
        assert c is not None and c.is_connected
        r = await asyncio.to_thread(cli, "creds", "list", "--auth-dir", str(auth.path))
        assert "host-c" in r.stdout and "host-b" in r.stdout and "host-a" not in r.stdout
        await b.close()
        await c.close()

    asyncio.run(main())


def test_a_submitter_may_submit_as_its_user_only(secure_nats: NatsProcess, auth: AuthDir, tmp_path: Path) -> None:
    """A batch client's credentials (`muster creds issue-submitter USER`): it publishes
    submissions on its own subject and gets their acknowledgements in its own inbox; another
    user's subject, another inbox and everything else are refused (found by exploring: only
    the control plane's credentials could submit over NATS, and they can do anything).
    Issuing into a directory that is not a credentials directory is refused."""
    from wire.subjects import submitter_inbox_prefix
    from wire.submit import submit_over_nats

    async def main() -> None:
        srv = await connect(secure_nats.url, "server", creds=str(auth.server_creds))
        await ensure_streams(Store(srv))
        async def submitter(user: str, *issue: str) -> tuple[Any, Errors]:
            """`muster creds issue-submitter USER ...`, and a connection with those credentials."""
            r = await asyncio.to_thread(cli, "creds", "issue-submitter", user, *issue, "--auth-dir", str(auth.path))
            assert r.returncode == 0, r.stderr
            errors = Errors()
            for _ in range(300):
                try:
                    return await connect(secure_nats.url, user, creds=r.stdout.strip(), error_cb=errors.cb,
                                         inbox_prefix=submitter_inbox_prefix(user), allow_reconnect=False,
                                         max_reconnect_attempts=0), errors
                except StoreError:
                    await asyncio.sleep(0.1)  # the reload is asynchronous
            raise AssertionError(f"{user}'s credentials were never taken")

        nc, errors = await submitter("alice")
        ids = await submit_over_nats(nc.jetstream(), [{"name": "t", "command": ["true"]}], user="alice",
                                     within_s=0)
        assert len(ids) == 1
        info = await Store(srv).js.stream_info(subjects.SUBMIT_STREAM)
        assert info.state.messages == 1
        await nc.publish(f"{subjects.SUBMIT_PREFIX}.bob", b"{}")
        await nc.flush()
        await errors.wait_for(f'permissions violation for publish to "{subjects.SUBMIT_PREFIX}.bob"')
        for subject in ("_INBOX.>", "muster.assign.>", "alerts.>"):
            await nc.subscribe(subject)
            await errors.wait_for(f'subscription to "{subject.lower()}"')
        assert (await Store(srv).js.stream_info(subjects.SUBMIT_STREAM)).state.messages == 1
        await nc.close()
        # Bound to queues (as a team's token is; found by exploring: a submitter put jobs in
        # any queue): it publishes on muster.submit.<user>.<queue> of those only.
        nc, errors = await submitter("carol", "--queues", "research,vision")
        await submit_over_nats(nc.jetstream(), [{"name": "t", "command": ["true"]}], user="carol",
                               queue="research", within_s=0)
        assert (await Store(srv).js.stream_info(subjects.SUBMIT_STREAM)).state.messages == 2
        with pytest.raises(TimeoutError) as refused:  # the server tells only the error callback
            await submit_over_nats(nc.jetstream(), [{"name": "t", "command": ["true"]}], user="carol",
                                   queue="prod", timeout=1.0, within_s=0)
        assert "these credentials may not publish there" in "".join(refused.value.__notes__)
        for subject in (subjects.submit_subject("carol"), subjects.submit_subject("carol", "prod")):
            await nc.publish(subject, b"{}")
            await nc.flush()
            await errors.wait_for(f'permissions violation for publish to "{subject}"')
        assert (await Store(srv).js.stream_info(subjects.SUBMIT_STREAM)).state.messages == 2
        await nc.close()
        await srv.close()

    asyncio.run(main())
    listed = cli("creds", "list", "--auth-dir", str(auth.path))
    assert re.search(r"submitter +carol +research,vision ", listed.stdout), listed.stdout
    bad = cli("creds", "issue-submitter", "dave", "--queues", "Prod", "--auth-dir", str(auth.path))
    assert bad.returncode != 0 and "invalid queue name 'Prod'" in bad.stderr, bad.stderr
    nowhere = cli("creds", "issue-submitter", "bob", "--data-dir", str(tmp_path / "not-a-data-dir"))
    assert nowhere.returncode != 0 and "no NATS credentials directory" in nowhere.stderr, nowhere.stderr
    assert not (tmp_path / "not-a-data-dir").exists()
    # A directory named with --auth-dir is made on first use (compose's nats-auth makes its registry so).
    made = cli("creds", "issue-agent", "host-z", "--auth-dir", str(tmp_path / "registry"))
    assert made.returncode == 0 and AuthDir(tmp_path / "registry").agent_creds("host-z").exists(), made.stderr


def test_an_acknowledgement_cannot_be_sent_over_the_control_planes_keys(secure_nats: NatsProcess,
                                                                       auth: AuthDir) -> None:
    """Found by exploring: JetStream acknowledges a publish on the reply subject its
    publisher chose, whatever that publisher may publish. With every party in one NATS
    account, an agent's heartbeat or status report, or a submitter's submission, with the
    reply `$KV.state.lease` had its acknowledgement written over the leader's lease (no
    replica led again), over another host's configuration (a drain undone) or heartbeat.
    Agents and submitters are in accounts of their own now: a reply they choose stays in
    their account."""
    from wire.subjects import submitter_inbox_prefix

    async def main() -> None:
        srv = await connect(secure_nats.url, "server", creds=str(auth.server_creds))
        store = Store(srv)
        await ensure_streams(store)
        await store.put("lease", b'{"holder": "s1"}')
        await store.put(subjects.hostcfg_key(B), b'{"draining": true}')
        await store.put(B, b'{"host_id": "host-b"}', bucket=subjects.HOSTS_BUCKET)
        await store.put(subjects.alloc_key(A), b'{"host_id": "host-a", "tasks": []}')
        targets = ["$KV.state.lease", subjects.kv_subject(subjects.STATE_BUCKET, subjects.hostcfg_key(B)),
                   subjects.kv_subject(subjects.HOSTS_BUCKET, B), "$KV.state.job.forged"]

        async def written() -> tuple[int, int]:
            return ((await store.js.stream_info(subjects.STATE_STREAM)).state.last_seq,
                    (await store.js.stream_info(subjects.HOSTS_STREAM)).state.last_seq)

        before = await written()
        errors = Errors()
        agent = await connect(secure_nats.url, "rogue", creds=str(auth.agent_creds(A)),
                              inbox_prefix=agent_inbox_prefix(A), error_cb=errors.cb)
        auth.issue_submitter("alice")
        auth.reload_servers()
        for _ in range(300):
            try:
                submitter = await connect(secure_nats.url, "alice", creds=str(auth.submitter_creds("alice")),
                                          inbox_prefix=submitter_inbox_prefix("alice"), error_cb=errors.cb,
                                          allow_reconnect=False, max_reconnect_attempts=0)
                break
            except StoreError:
                await asyncio.sleep(0.1)  # the reload is asynchronous
        else:
            raise AssertionError("alice's credentials were never taken")
        errors.seen.clear()  # alice's refusals before the reload
        own_get = (f"$JS.API.DIRECT.GET.{subjects.STATE_STREAM}."
                   + subjects.kv_subject(subjects.STATE_BUCKET, subjects.alloc_key(A)))
        for reply in targets:
            await agent.publish(subjects.kv_subject(subjects.HOSTS_BUCKET, A), b"{}", reply=reply)
            await agent.publish(subjects.status_subject(A), b"{}", reply=reply)
            await agent.publish(own_get, b"", reply=reply)
            await submitter.publish(subjects.submit_subject("alice"), b"{}", reply=reply)
        await agent.flush()
        await submitter.flush()
        # What each party may do still works, through its account's imports, and comes after
        # the publishes above on the same connections.
        own = Store(agent, timeout=15)
        await own.js.publish(subjects.kv_subject(subjects.HOSTS_BUCKET, A), b"{}", timeout=15,
                             headers={"Nats-TTL": "15s"})
        await own.js.publish(subjects.status_subject(A), b"{}", timeout=15)
        assert (await own.get(subjects.alloc_key(A))).value is not None
        await submitter.jetstream().publish(subjects.submit_subject("alice"), b"{}", timeout=15)
        await asyncio.sleep(0.5)  # what a misdirected acknowledgement would write is written by now
        assert (await store.get("lease")).value == b'{"holder": "s1"}'
        assert (await store.get(subjects.hostcfg_key(B))).value == b'{"draining": true}'
        assert (await store.get(B, bucket=subjects.HOSTS_BUCKET)).value == b'{"host_id": "host-b"}'
        assert (await store.get("job.forged")).value is None
        after = await written()
        assert after[0] == before[0], "nothing written to the state bucket"
        assert after[1] == before[1] + 5, "host A's five heartbeats only"  # 4 with a reply, one acknowledged
        assert errors.seen == [], errors.seen
        await agent.close()
        await submitter.close()
        await srv.close()

    asyncio.run(main())


def test_an_agent_that_purges_the_hosts_bucket_leaves_no_dead_host_suspect_for_good(secure_nats: NatsProcess,
                                                                                     auth: AuthDir) -> None:
    """Found by exploring: an agent's credentials publish its own heartbeat with
    `Nats-Rollup: all`, which the hosts bucket's stream allows (nats-server forces it on
    where expiry markers are kept) and which removes every other host's heartbeat, without
    an expiry marker. A host whose agent had died stayed SUSPECT for good and its work was
    never replaced. The server's view (fed by the real ingest process) takes the dead host
    as expired once its last heartbeat is a TTL and an interval old on the store's clock,
    keeps the hosts that heartbeat on, and is told whose heartbeat purged the bucket."""
    from server.health.ingest import HeartbeatIngest, IngestConfig
    from server.state.cluster import ClusterState
    from tests.factories import heartbeat
    from wire.messages import SHAPE_HEADER, encode, shape_digest

    async def main() -> None:
        srv = await connect(secure_nats.url, "server", creds=str(auth.server_creds))
        store = Store(srv)
        await ensure_streams(store)
        state = ClusterState(heartbeat_interval_s=1.0)
        lost: list[str] = []
        rolled: list[str] = []
        state.listeners.append(lambda kind, obj: lost.append(obj.host_id) if kind == "host_lost" else None)
        state.listeners.append(lambda kind, obj: rolled.append(obj[0]) if kind == "host_rollup" else None)
        ingest = HeartbeatIngest(IngestConfig(nats_url=secure_nats.url, nats_creds=str(auth.server_creds),
                                              flush_s=0.05),
                                 state.apply_heartbeat, state.clock.advance, state.hosts_renumbered, state.rolled_up)
        stop = asyncio.Event()
        ingest.start()
        supervisor = asyncio.create_task(ingest.run(stop, check_s=0.1))
        agents = {h: await connect(secure_nats.url, h, creds=str(auth.agent_creds(h)),
                                   inbox_prefix=agent_inbox_prefix(h)) for h in (A, B)}

        async def beat(host: str, seq: int, **headers: str) -> None:
            hb = heartbeat(host, seq=seq, ts=time.time(), boot_id="b1")
            await Store(agents[host], timeout=15).js.publish(
                subjects.kv_subject(subjects.HOSTS_BUCKET, host), encode(hb), timeout=15,
                headers={"Nats-TTL": "2s", SHAPE_HEADER: shape_digest(hb), **headers})

        try:
            await asyncio.wait_for(ingest.synced.wait(), timeout=60)
            await beat(B, 1)  # host B's last heartbeat: its agent dies
            await beat(A, 1)
            await eventually(lambda: B in state.hosts and A in state.hosts, 60, "both hosts")
            await beat(A, 2, **{"Nats-Rollup": "all"})
            assert (await store.get(B, bucket=subjects.HOSTS_BUCKET)).value is None  # gone, with no marker
            stored = await store.get(A, bucket=subjects.HOSTS_BUCKET, with_headers=True)
            assert stored.headers is not None and stored.headers.get("Nats-Rollup") == "all"

            async def a_lives() -> None:
                for seq in range(3, 10_000):
                    await beat(A, seq)
                    await asyncio.sleep(0.3)

            living = asyncio.create_task(a_lives())
            try:
                def b_lost() -> bool:
                    state.refresh_health(time.time())
                    return not state.hosts[B].present

                await eventually(b_lost, 60, "host B taken as expired")
            finally:
                living.cancel()
            assert lost == [B] and state.hosts[A].present and state.hosts[B].lost_unmarked
            assert rolled == [A]
        finally:
            stop.set()
            await asyncio.wait_for(supervisor, timeout=10)
            await asyncio.to_thread(ingest.stop)
            for nc in agents.values():
                await nc.close()
            await srv.close()

    asyncio.run(main())


def test_a_node_made_without_accounts_keeps_its_streams_once_its_users_have_them(tmp_path: Path, auth: AuthDir) -> None:
    """A single node's store made before its users had NATS accounts (its streams in the
    global account) is moved to the control plane's account at its next start with an
    auth directory: the state written before is read after."""
    data = tmp_path / "node"
    plain = start_nats(data, port=0)
    try:
        async def write() -> None:
            nc = await connect(plain.url, "server")
            store = Store(nc)
            await ensure_streams(store)
            await store.put(subjects.job_key("j-before"), b'{"id": "j-before"}')
            await nc.close()

        asyncio.run(write())
    finally:
        plain.stop()
    assert (data / "jetstream" / "$G").is_dir()
    secure = start_nats(data, port=0, auth=auth)
    try:
        async def read() -> bytes | None:
            nc = await connect(secure.url, "server", creds=str(auth.server_creds))
            value = (await Store(nc).get(subjects.job_key("j-before"))).value
            await nc.close()
            return value

        assert asyncio.run(read()) == b'{"id": "j-before"}'
    finally:
        secure.stop()


def _spawn_agent(c: Cluster, auth: AuthDir, host: str) -> Any:
    argv = ["agent", "--nats", c.nats_url, "--host-id", host, "--labels", "rack=r1,zone=z1",
            "--state-dir", str(c.tmp / "agents"), "--simulate-gpus", "2xH100"]
    return c._spawn(f"agent-{host}", argv, env={"MUSTER_NATS_CREDS": str(auth.agent_creds(host))})


def test_tokens_through_the_cli_and_roles_in_the_api(secure_nats: NatsProcess, auth: AuthDir,
                                                     tmp_path: Path) -> None:
    c = Cluster(secure_nats.url, tmp_path)
    try:
        srv = c.server(env={"MUSTER_NATS_CREDS": str(auth.server_creds)})
        assert c.token, srv.output()
        agent = _spawn_agent(c, auth, A)  # a real agent with its own, narrow credentials
        admin = ["--nats", secure_nats.url, "--creds", str(auth.server_creds)]

        r = cli("token", "create", "--role", "viewer", "vera", *admin)
        assert r.returncode == 0, r.stderr
        viewer = r.stdout.strip()
        assert viewer.startswith("mst_") and len(r.stdout.strip().splitlines()) == 1
        r = cli("token", "create", "--role", "operator", "otto", *admin)
        assert r.returncode == 0, r.stderr
        operator = r.stdout.strip()
        assert cli("token", "create", "--role", "viewer", "vera", *admin).returncode != 0  # name taken
        # An admin acts on every queue and on hosts: a binding to queues would be ignored.
        r = cli("token", "create", "--role", "admin", "ada", "--queues", "team-a", *admin)
        assert r.returncode != 0 and "bind an operator or viewer token to queues instead" in r.stderr, r.stderr
        # Bound to no queue (a script's empty list): refused, not a token for every queue
        # and the hosts (found by exploring); a queue not there yet is warned of.
        for empty in ("", ","):
            r = cli("token", "create", "--role", "operator", "nobody", "--queues", empty, *admin)
            assert r.returncode != 0 and "needs at least one" in r.stderr, r.stderr
        r = cli("token", "create", "--role", "viewer", "later", "--queues", "not-yet", *admin)
        assert r.returncode == 0 and "there is no queue 'not-yet' (yet)" in r.stderr, r.stderr
        r = cli("token", "create", "--role", "viewer", "nobody", "--nats", secure_nats.url,
                "--data-dir", str(tmp_path / "elsewhere"))  # no credentials: refused by NATS
        assert r.returncode != 0 and "uthorization" in r.stderr

        r = cli("token", "list", "-o", "json", *admin)
        assert r.returncode == 0, r.stderr
        listed = {t["name"]: t for t in json.loads(r.stdout)}
        assert listed["vera"]["role"] == "viewer" and listed["otto"]["role"] == "operator"
        assert listed["operator"]["role"] == "admin"  # the bootstrap token
        # Times in UTC, as every list prints them (it printed the local time, an epoch in JSON).
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", listed["vera"]["createdAt"])
        assert listed["vera"]["createdAt"][:19] in cli("token", "list", *admin, env={"TZ": "Asia/Tokyo"}).stdout
        assert viewer not in r.stdout and operator not in r.stdout  # only hashes are stored

        job_input = {"name": "hello", "command": ["true"], "gpus": 1, "cpus": 1, "memoryMb": 64}
        v = Api(srv.url, viewer)
        wait_until(lambda: v.raw("{ cluster { hosts { total } } }").status_code == 200, timeout=30,
                   what="viewer token accepted")
        res = v.submit(**job_input)
        assert res["job"] is None and res["userErrors"][0]["code"] == "FORBIDDEN"
        o = Api(srv.url, operator)
        wait_until(lambda: o.raw("{ cluster { hosts { total } } }").status_code == 200, timeout=30,
                   what="operator token accepted")
        o.wait_hosts(1)
        res = o.submit(**job_input)
        assert not res["userErrors"], res
        assert o.wait_job(res["job"]["id"], {"SUCCEEDED", "FAILED"})["state"] == "SUCCEEDED"

        r = cli("token", "revoke", "vera", *admin)
        assert r.returncode == 0, r.stderr
        wait_until(lambda: v.raw("{ cluster { hosts { total } } }").status_code == 401, timeout=30,
                   what="revoked token refused")
        assert o.raw("{ cluster { hosts { total } } }").status_code == 200
        assert cli("token", "revoke", "vera", *admin).returncode == 3
        assert "vera" not in cli("token", "list", *admin).stdout
        # A token that expires (found by exploring: tokens worked until revoked, a CI
        # job's too): it works until then, its key expires with it, and it is refused.
        assert cli("token", "create", "--role", "viewer", "ci", "--expires", "soon", *admin).returncode != 0
        r = cli("token", "create", "--role", "viewer", "ci", "--expires", "15s", *admin)
        assert r.returncode == 0 and "expires 20" in r.stderr, r.stderr
        ci = Api(srv.url, r.stdout.strip())
        wait_until(lambda: ci.raw("{ cluster { hosts { total } } }").status_code == 200, timeout=10,
                   what="the token accepted")
        listed = {t["name"]: t for t in json.loads(cli("token", "list", "-o", "json", *admin).stdout)}
        assert listed["ci"]["expiresAt"] is not None and listed["otto"]["expiresAt"] is None
        wait_until(lambda: ci.raw("{ cluster { hosts { total } } }").status_code == 401, timeout=60,
                   what="the expired token refused")
        assert "ci" not in cli("token", "list", *admin).stdout
        assert agent.alive()
        # `muster check` reaches NATS as `muster token` does: the control plane's key found
        # under --data-dir; without credentials NATS refuses it.
        r = cli("check", "--nats", secure_nats.url, "--data-dir", str(tmp_path))
        assert r.returncode == 0 and r.stdout.strip().endswith("0 invariant violations"), r.stdout + r.stderr
        r = cli("check", "--nats", secure_nats.url, "--data-dir", str(tmp_path / "none"),
                env={"MUSTER_NATS_CREDS": ""})
        assert r.returncode != 0 and "invariant violations" not in r.stdout, r.stdout + r.stderr
    finally:
        c.stop_all()


# ---------------------------------------------------------------- TLS


def make_pki(d: Path) -> dict[str, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost, signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    d.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def write_key(key: Any, path: Path) -> None:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        path.chmod(0o600)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "muster test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    out = {"ca": d / "ca.pem", "cert": d / "server.pem", "key": d / "server-key.pem"}
    out["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    out["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    write_key(key, out["key"])
    return out


def test_nats_over_tls(tmp_path: Path, auth: AuthDir) -> None:
    pki = make_pki(tmp_path / "pki")
    proc = start_nats(tmp_path / "nats", port=0, auth=auth, tls=ServerTls(pki["cert"], pki["key"]))
    try:
        assert proc.url.startswith("tls://")

        async def main() -> None:
            nc = await connect(proc.url, "tls-client", creds=str(auth.server_creds), tls_ca=str(pki["ca"]))
            store = Store(nc)
            await ensure_streams(store)
            rev = await store.put("probe", b"over tls")
            assert (await store.get("probe")) .value == b"over tls" and rev > 0
            assert nc.connected_server_version.major >= 2
            await nc.close()
            plain = f"nats://127.0.0.1:{proc.port}"
            with pytest.raises(StoreError):  # no TLS: refused
                await connect(plain, "plain", creds=str(auth.server_creds), allow_reconnect=False,
                              max_reconnect_attempts=0, connect_timeout=2)
            with pytest.raises(StoreError):  # TLS, but not trusting our CA: refused
                await connect(proc.url, "untrusting", creds=str(auth.server_creds),
                              tls_ca=str(make_pki(tmp_path / "other")["ca"]), allow_reconnect=False,
                              max_reconnect_attempts=0, connect_timeout=2)

        asyncio.run(main())
    finally:
        proc.stop()


def _server_has_https_flags() -> bool:
    p = build_parser()
    try:
        p.parse_args(["server", "--tls-cert", "x", "--tls-key", "y"])
        return True
    except SystemExit:
        return False


@pytest.mark.skipif(not _server_has_https_flags(), reason="`muster server --tls-cert/--tls-key` not wired yet")
def test_server_https_with_nats_tls(tmp_path: Path, auth: AuthDir) -> None:
    pki = make_pki(tmp_path / "pki")
    nats = start_nats(tmp_path / "nats", port=0, auth=auth, tls=ServerTls(pki["cert"], pki["key"]))
    c = Cluster(nats.url, tmp_path)
    try:
        srv = c.server(env={"MUSTER_NATS_CREDS": str(auth.server_creds), "MUSTER_NATS_CA": str(pki["ca"])},
                       tls_cert=pki["cert"], tls_key=pki["key"])
        assert c.token, srv.output()
        base = srv.url.replace("http://", "https://")
        with httpx.Client(verify=ssl.create_default_context(cafile=str(pki["ca"])), timeout=10) as h:
            wait_until(lambda: h.get(base + "/readyz").status_code == 200, timeout=20, what="ready over https")
            r = h.post(base + "/graphql", json={"query": "{ cluster { hosts { total } } }"},
                       headers={"Authorization": f"Bearer {c.token}"})
            assert r.status_code == 200 and not r.json().get("errors"), r.text
        with pytest.raises(httpx.HTTPError):  # not trusting the CA
            httpx.get(base + "/livez", timeout=5)
        with pytest.raises(httpx.HTTPError):  # plain http on the https port
            httpx.get(srv.url + "/livez", timeout=5)
        assert "https://" in srv.output()
    finally:
        c.stop_all()
        nats.stop()


def test_muster_nats_cli_enables_auth_by_default(tmp_path: Path) -> None:
    data = tmp_path / "nd"
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "server.cli", "nats", "--port", str(port), "--data-dir", str(data)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, proc=p)  # type: ignore[arg-type]
        auth = AuthDir(data / "auth")
        assert auth.server_creds.exists()

        async def main() -> None:
            with pytest.raises(StoreError):
                await connect(f"nats://127.0.0.1:{port}", "anon", allow_reconnect=False, max_reconnect_attempts=0)
            nc = await connect(f"nats://127.0.0.1:{port}", "srv", creds=str(auth.server_creds))
            await ensure_streams(Store(nc))
            await nc.close()

        asyncio.run(main())
        # `muster creds` finds the credentials from the data directory, and reloads the server.
        r = cli("creds", "issue-subscriber", "ops", "--data-dir", str(data))
        assert r.returncode == 0 and "1 nats-server(s) reloaded" in r.stderr, r.stderr
    finally:
        p.terminate()
        p.wait(10)
