"""`muster nats --cluster 3`: three local nats-servers form a JetStream cluster; an R3
KV bucket keeps taking writes after one node is killed with SIGKILL."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from nats.js.api import KeyValueConfig

from server.broker.natsauth import AuthDir
from server.state.streams import ensure_streams
from tests.conftest import ROOT
from wire.kv import Store, connect

T = TypeVar("T")


def start_cli_cluster(data: Path) -> tuple[subprocess.Popen[str], list[str]]:
    p = subprocess.Popen(
        [sys.executable, "-m", "server.cli", "nats", "--cluster", "3", "--data-dir", str(data),
         "--port", "0", "--cluster-port", "0", "--http-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )
    lines: list[str] = []
    assert p.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip())
        if "Press Ctrl-C" in line:
            return p, lines
    p.kill()
    raise AssertionError("cluster did not come up:\n" + "\n".join(lines))


async def retrying(call: Callable[[], Awaitable[T]], timeout: float = 30) -> T:
    """`call()` until it answers: a stream just made, or whose leader was just killed,
    has no leader for a while (no responders), longer on a loaded machine."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except Exception:  # noqa: BLE001 - leader election in progress
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def put_retrying(kv: Any, key: str, value: bytes, timeout: float = 30) -> int:
    """A put (nats-py's KV or Muster's Store) retried until the stream answers."""
    return int(await retrying(lambda: kv.put(key, value), timeout))


async def stream_with_leader(js: object, name: str, timeout: float = 30) -> object:
    """The stream's info once its replicas have elected a leader (a new R3 stream has none
    for a moment; its replicas are not all listed until then)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            info = await js.stream_info(name)  # type: ignore[attr-defined]
            if info.cluster is not None and info.cluster.leader:
                return info
            last = info.cluster
        except Exception as exc:  # noqa: BLE001 - no leader to answer yet
            last = exc
        await asyncio.sleep(0.2)
    raise AssertionError(f"stream {name} has no leader after {timeout} s ({last})")


def test_three_node_cluster_survives_a_killed_node(tmp_path: Path) -> None:
    data = tmp_path / "nats"
    p, lines = start_cli_cluster(data)
    try:
        out = "\n".join(lines)
        m = re.search(r"client URLs:\s+(\S+)", out)
        assert m, out
        urls = m.group(1).split(",")
        assert len(urls) == 3 and all(u.startswith("nats://127.0.0.1:") for u in urls)
        auth = AuthDir(data / "auth")
        assert auth.server_creds.exists()  # auth is on by default
        for n in ("n1", "n2", "n3"):
            conf = (data / n / "nats-server.conf").read_text()
            assert "sync_interval: always" in conf and "cluster {" in conf

        async def main() -> None:
            nc = await connect(m.group(1), "cluster-test", creds=str(auth.server_creds))
            js = nc.jetstream(timeout=5)
            kv = None
            deadline = time.monotonic() + 30
            while kv is None:
                try:
                    kv = await js.create_key_value(KeyValueConfig(bucket="r3", replicas=3))
                except Exception:  # noqa: BLE001 - meta leader still settling
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.3)
            info = await stream_with_leader(js, "KV_r3")
            assert info.config.num_replicas == 3
            assert info.cluster is not None and len(info.cluster.replicas or []) == 2
            await put_retrying(kv, "k0", b"before")
            # Muster's own streams and buckets are created R3 on this cluster too.
            store = Store(nc, replicas=3)
            await ensure_streams(store)
            await put_retrying(store, "probe", b"r3")

            # Kill the bucket's stream leader.
            leader = (await js.stream_info("KV_r3")).cluster.leader  # type: ignore[union-attr]
            pid = int((auth.pids_dir / f"{leader}.pid").read_text())
            import os

            os.kill(pid, signal.SIGKILL)
            t0 = time.monotonic()
            await put_retrying(kv, "k1", b"after-kill")
            failover_s = time.monotonic() - t0
            for i in range(20):
                await kv.put(f"k{i + 2}", f"v{i}".encode())
            assert (await kv.get("k0")).value == b"before"
            assert (await kv.get("k1")).value == b"after-kill"
            assert (await kv.get("k21")).value == b"v19"
            new_leader = (await js.stream_info("KV_r3")).cluster.leader  # type: ignore[union-attr]
            assert new_leader and new_leader != leader
            assert (await retrying(lambda: store.get("probe"))).value == b"r3"
            print(f"failover after SIGKILL of {leader}: {failover_s:.2f} s; new leader {new_leader}")
            await nc.close()

        asyncio.run(main())
    finally:
        p.send_signal(signal.SIGINT)
        rc = p.wait(30)
    assert rc == 0
    # Ctrl-C stopped the surviving nodes too.
    for n in ("n1", "n2", "n3"):
        pidf = data / "auth" / "pids" / f"{n}.pid"
        if pidf.exists():
            pid = int(pidf.read_text())
            assert not Path(f"/proc/{pid}").exists() or "nats-server" not in Path(f"/proc/{pid}/cmdline").read_text()


def test_concurrent_fenced_commits_need_a_fence_slot_each_on_a_clustered_stream(tmp_path: Path) -> None:
    """On an R3 stream nats-server lets one batch at a time be in flight with a revision
    check on a given key and refuses the others (err_code 10164): commits in flight
    together that all checked the `term` key conflicted although they wrote disjoint
    records. With a fence slot each they all commit; a new term still fences every slot."""
    import pytest

    from server.broker.natsd import start_cluster
    from server.state.lease import FENCE_SLOTS, Leadership, LeaseConfig
    from wire.errors import ConflictError, FencedError
    from wire.kv import Write

    cluster = start_cluster(tmp_path / "nats", size=3)

    async def go() -> None:
        nc = await connect(cluster.url, name="slots")
        try:
            store = Store(nc, replicas=3)
            await ensure_streams(store)
            a = Leadership(store, "a", LeaseConfig(ttl_s=2, renew_every_s=0.5))
            assert await retrying(a.try_acquire)
            n = 0

            async def commit(slot: int) -> str:
                nonlocal n
                n += 1
                try:
                    await store.commit([Write(f"job.s{n}", b"x" * 2000, expected=0),
                                        Write(f"alloc.s{n}", b"y" * 2000, expected=0)], fence=a.fence(slot))
                    return "ok"
                except ConflictError:
                    return "conflict"

            same = []
            for _ in range(20):  # the store's rule, seen: one fence key, several in flight
                same += await asyncio.gather(*(commit(0) for _ in range(FENCE_SLOTS)))
                if "conflict" in same:
                    break
            assert "conflict" in same, "nats-server accepted concurrent checks on one key"
            slotted = []
            for _ in range(20):
                slotted += await asyncio.gather(*(commit(s) for s in range(FENCE_SLOTS)))
            assert slotted == ["ok"] * len(slotted)

            # A new leader: every slot of the old term is fenced.
            old = [a.fence(s) for s in range(FENCE_SLOTS)]
            await a.resign()
            b = Leadership(store, "b", LeaseConfig(ttl_s=2, renew_every_s=0.5))
            while not await b.try_acquire():
                await asyncio.sleep(0.2)
            for s in range(FENCE_SLOTS):
                with pytest.raises(FencedError):
                    await store.commit([Write(f"job.late{s}", b"z", expected=0)], fence=old[s])
        finally:
            await nc.close()

    try:
        asyncio.run(go())
    finally:
        cluster.stop()


def test_replicated_hosts_bucket_is_kept_in_memory_and_an_old_file_one_is_kept_as_it_is(tmp_path: Path,
                                                                                         caplog) -> None:
    """On 3 nodes the `hosts` bucket is R3 in memory (heartbeats are ephemeral) and the
    state bucket R3 on file; a `hosts` bucket an earlier version made on file is left on
    file (JetStream cannot change a stream's storage), with a warning, and start-up goes on.
    A server started with fewer replicas than the streams have leaves them as they are."""
    import dataclasses
    import logging

    from nats.js import api as jsapi

    from server.broker.natsd import start_cluster
    from server.state.streams import stream_configs
    from wire import subjects

    async def storages(url: str, before: list[jsapi.StreamConfig] | None = None) -> dict[str, str]:
        nc = await connect(url, name="storage")
        try:
            store = Store(nc, replicas=3)
            for cfg in before or []:
                await store.js.add_stream(cfg)
            await ensure_streams(store)
            out = {}
            for name in (subjects.HOSTS_STREAM, subjects.STATE_STREAM):
                info = await store.js.stream_info(name)
                assert info.config.num_replicas == 3
                out[name] = jsapi.StorageType(info.config.storage).value
            await store.js.delete_stream(subjects.HOSTS_STREAM)
            await store.js.delete_stream(subjects.STATE_STREAM)
            return out
        finally:
            await nc.close()

    cluster = start_cluster(tmp_path / "nats", size=3)
    try:
        assert asyncio.run(storages(cluster.url)) == {subjects.HOSTS_STREAM: "memory", subjects.STATE_STREAM: "file"}
        old_hosts = dataclasses.replace(stream_configs(3)[1], storage=jsapi.StorageType.FILE)
        assert old_hosts.name == subjects.HOSTS_STREAM
        with caplog.at_level(logging.WARNING, logger="server.state.streams"):
            assert asyncio.run(storages(cluster.url, [old_hosts])) == {subjects.HOSTS_STREAM: "file",
                                                                        subjects.STATE_STREAM: "file"}
        assert any("KV_hosts is kept on file storage" in r.getMessage() for r in caplog.records), caplog.text

        async def replicas_after_a_server_of_one(url: str) -> dict[str, int]:
            """Found by exploring: a replica started without MUSTER_REPLICAS=3 (so 1) beside
            one with it cut every stream to one copy."""
            nc = await connect(url, name="replicas")
            try:
                await ensure_streams(Store(nc, replicas=3))
                await ensure_streams(Store(nc, replicas=1))
                return {cfg.name or "": (await nc.jetstream().stream_info(cfg.name or "")).config.num_replicas or 1
                        for cfg in stream_configs(3)}
            finally:
                await nc.close()

        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="server.state.streams"):
            kept = asyncio.run(replicas_after_a_server_of_one(cluster.url))
        assert set(kept.values()) == {3}, kept
        assert any("keeps its 3 replicas" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        cluster.stop()


def test_a_restart_of_every_node_empties_the_hosts_bucket_but_keeps_it(tmp_path: Path) -> None:
    """The `hosts` bucket in memory, after all three nodes are stopped and started again:
    the bucket is still there (its configuration lives in the cluster's metadata, on
    disk) and takes heartbeats at once, its old ones are gone (the leader's grace for
    unheard hosts covers that, docs/failures.md), and the state bucket kept its records."""
    from server.broker.natsd import free_port, start_cluster
    from wire import subjects

    ports = [[free_port() for _ in range(3)] for _ in range(3)]

    def cluster():  # the same nodes, ports and data each time
        return start_cluster(tmp_path / "nats", size=3, client_ports=ports[0], cluster_ports=ports[1],
                             http_ports=ports[2])

    async def write(url: str) -> None:
        nc = await connect(url, name="before")
        try:
            store = Store(nc, replicas=3)
            await ensure_streams(store)
            await retrying(lambda: store.put("h1", b"heartbeat", bucket=subjects.HOSTS_BUCKET, ttl="15s"))
            await retrying(lambda: store.put("job.j1", b"job", expected=0, msg_id="job.j1"))
        finally:
            await nc.close()

    async def after(url: str) -> tuple[str, bytes | None, bytes | None, int]:
        nc = await connect(url, name="after")
        try:
            store = Store(nc, replicas=3)
            deadline = time.monotonic() + 60
            while True:  # the streams elect their leaders again
                try:
                    info = await store.js.stream_info(subjects.HOSTS_STREAM)
                    rev = await store.put("h2", b"heartbeat", bucket=subjects.HOSTS_BUCKET, ttl="15s")
                    old = (await store.get("h1", bucket=subjects.HOSTS_BUCKET)).value
                    job = (await store.get("job.j1")).value
                    return str(info.config.storage), old, job, rev
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)
        finally:
            await nc.close()

    c = cluster()
    try:
        asyncio.run(write(c.url))
    finally:
        c.stop()
    c = cluster()
    try:
        storage, old, job, rev = asyncio.run(after(c.url))
    finally:
        c.stop()
    assert "memory" in storage
    assert old is None and rev > 0
    assert job == b"job"
