"""The deployment files run for real, without Docker: compose.yaml validated against the
Compose Specification schema (check-jsonschema's vendored copy), the NATS configs checked
by the real nats-server binary (`nats-server -t`), the compose node config run with its
generated users, and the loopback 3-node cluster config started once on free ports to
prove it forms a JetStream cluster that accepts an R3 key-value bucket. (The static
checks of the same files: tests/unit/test_compose.py.)"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from server.broker.natsauth import AuthDir
from server.broker.natsd import free_port
from tests.conftest import ROOT
from tests.unit.test_compose import (
    COMPOSE,
    JS_HEALTH_PATH,
    NATS_CLUSTER_CONFS,
    NATS_COMPOSE_CONF,
    NATS_DEV_CONF,
    NATS_SERVICES,
)


def _venv_tool(name: str) -> str:
    """A console script installed next to the running interpreter."""
    bindir = Path(sys.executable).parent
    for candidate in (bindir / name, bindir / f"{name}.exe"):
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    pytest.fail(
        f"{name} not found next to {sys.executable}; install the test extras "
        f"(pip install -e '.[test]')"
    )


def test_compose_matches_compose_spec_schema():
    exe = _venv_tool("check-jsonschema")
    proc = subprocess.run(
        [exe, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _nats_server() -> str:
    return _venv_tool("nats-server")


@pytest.mark.parametrize(
    "conf", [NATS_DEV_CONF, *NATS_CLUSTER_CONFS], ids=lambda p: str(p.relative_to(ROOT))
)
def test_nats_config_valid(conf):
    proc = subprocess.run(
        [_nats_server(), "-t", "-c", str(conf)], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"sync_interval:\s*always", conf.read_text())


def _compose_conf_with_auth(tmp_path: Path, hosts: tuple[str, ...] = ("gpu-host-1",)) -> tuple[Path, AuthDir]:
    """The compose NATS config beside an `auth/auth.conf` made the way compose's nats-auth
    service makes it (`muster creds issue-agent HOST --auth-dir ...`, through the CLI)."""
    registry = AuthDir(tmp_path / "registry")
    for h in hosts:
        proc = subprocess.run([sys.executable, "-m", "server.cli", "creds", "issue-agent", h,
                               "--auth-dir", str(registry.path)], capture_output=True, text=True,
                              timeout=60, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
    etc = tmp_path / "etc-nats"
    (etc / "auth").mkdir(parents=True)
    shutil.copy(registry.conf_file, etc / "auth" / "auth.conf")
    conf = etc / "nats-cluster.conf"
    text = NATS_COMPOSE_CONF.read_text()
    assert 'store_dir: "/data"' in text
    # The container's /data volume becomes a directory of this test.
    conf.write_text(text.replace('store_dir: "/data"', f'store_dir: "{tmp_path / "js"}"'))
    return conf, registry


def _route_env(password: str = "0123abcd", ports: tuple[int, ...] = (1, 2, 3)) -> dict[str, str]:
    """What the compose NATS services' command exports: the route password and the three
    route URLs that carry it (here to loopback ports)."""
    env = {"NATS_ROUTE_PASSWORD": password}
    for i, port in enumerate(ports, start=1):
        env[f"NATS_ROUTE_{i}"] = f"nats-route://muster-route:{password}@127.0.0.1:{port}"
    return env


def test_nats_compose_config_valid(tmp_path):
    conf, _ = _compose_conf_with_auth(tmp_path)
    env = {**os.environ, "SERVER_NAME": "nats1", **_route_env()}
    proc = subprocess.run(
        [_nats_server(), "-t", "-c", str(conf)],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = NATS_COMPOSE_CONF.read_text()
    assert re.search(r"server_name:\s*\$SERVER_NAME", text)
    assert re.search(r"sync_interval:\s*always", text)
    assert re.search(r'^include\s+"auth/auth.conf"', text, re.M)
    for i, _ in enumerate(NATS_SERVICES, start=1):
        assert f"$NATS_ROUTE_{i}" in text
    # the routes' password really comes from the environment
    proc = subprocess.run([_nats_server(), "-t", "-c", str(conf)], capture_output=True, text=True, timeout=30,
                          env={k: v for k, v in env.items() if k != "NATS_ROUTE_PASSWORD"})
    assert proc.returncode != 0 and "NATS_ROUTE_PASSWORD" in proc.stdout + proc.stderr
    # the server name really comes from the environment
    env.pop("SERVER_NAME")
    proc = subprocess.run(
        [_nats_server(), "-t", "-c", str(conf)],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert proc.returncode != 0
    # and without the generated users the config is refused (no silent open door)
    (conf.parent / "auth" / "auth.conf").unlink()
    proc = subprocess.run([_nats_server(), "-t", "-c", str(conf)], capture_output=True, text=True,
                          timeout=30, env={**os.environ, "SERVER_NAME": "nats1", **_route_env()})
    assert proc.returncode != 0


@pytest.mark.timeout(120)
def test_compose_nats_config_refuses_anonymous_and_scopes_agents(tmp_path):
    """The compose node config, run for real (ports moved to free ones, routes unreachable
    here): only the generated nkey users get in, and an agent only on its own subjects."""
    conf, registry = _compose_conf_with_auth(tmp_path, ("gpu-host-1", "gpu-host-2"))
    port, cport, mport = _free_ports(3)
    log = open(tmp_path / "nats.log", "wb")
    proc = subprocess.Popen(
        [_nats_server(), "-c", str(conf), "-a", "127.0.0.1", "-p", str(port), "-m", str(mport),
         "--cluster", f"nats://127.0.0.1:{cport}"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "SERVER_NAME": "nats1", **_route_env()})
    try:
        from server.broker.natsd import wait_for_port

        wait_for_port(port, proc=proc)
        asyncio.run(_probe_auth(f"nats://127.0.0.1:{port}", registry))
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@pytest.mark.timeout(120)
def test_compose_nats_routes_need_the_route_password(tmp_path):
    """Two nodes of the compose config (on free ports) route to each other with the
    password; a node that offers a route without it is refused."""
    conf, _ = _compose_conf_with_auth(tmp_path)
    ports = _free_ports(10)
    clients, routes, monitors, nobody = ports[0:3], ports[3:6], ports[6:9], ports[9]
    procs = []
    logs = []
    try:
        for i, name in enumerate(("nats1", "nats2", "intruder")):
            # The config's own listen addresses, moved to free ports (the `--cluster` flag
            # would replace the cluster block's authorization).
            text = conf.read_text().replace(str(tmp_path / "js"), str(tmp_path / f"js-{name}"))
            text = text.replace('listen: "0.0.0.0:4222"', f'listen: "127.0.0.1:{clients[i]}"')
            text = text.replace('listen: "0.0.0.0:6222"', f'listen: "127.0.0.1:{routes[i]}"')
            text = text.replace('http: "127.0.0.1:8222"', f'http: "127.0.0.1:{monitors[i]}"')
            node_conf = tmp_path / f"{name}.conf"
            node_conf.write_text(text)
            shutil.copytree(conf.parent / "auth", tmp_path / "auth", dirs_exist_ok=True)
            password = "wrong" if name == "intruder" else "0123abcd"
            env = {**os.environ, "SERVER_NAME": name, **_route_env(password, (routes[0], routes[1], nobody))}
            log = tmp_path / f"{name}.log"
            logs.append(log)
            procs.append(subprocess.Popen([_nats_server(), "-c", str(node_conf)],
                                          stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env))

        def routes_of(i: int) -> set[str]:
            _, routez = _http_json(f"http://127.0.0.1:{monitors[i]}/routez")
            return {r.get("remote_name") or r.get("remote_id") for r in routez.get("routes") or []}

        _wait(lambda: "nats2" in routes_of(0) and "nats1" in routes_of(1), 30, "the two nodes routed", procs, logs)
        _wait(lambda: "Authentication Failure" in logs[0].read_text(), 30, "the intruder's route refused",
              procs, logs)
        assert "intruder" not in routes_of(0) | routes_of(1) and routes_of(2) == set()
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


async def _probe_auth(url: str, registry: AuthDir) -> None:
    import nats as natspy
    from wire.kv import connect

    with pytest.raises((natspy.errors.Error, OSError)):
        nc = await natspy.connect(url, connect_timeout=2, max_reconnect_attempts=0, allow_reconnect=False)
        await nc.close()
    srv = await connect(url, name="probe-server", creds=str(registry.server_creds))
    got: list[bytes] = []

    async def on_msg(msg) -> None:  # type: ignore[no-untyped-def]
        got.append(msg.data)

    sub = await srv.subscribe("muster.assign.>", cb=on_msg)
    await srv.flush()
    errors: list[Exception] = []

    async def on_error(e: Exception) -> None:
        errors.append(e)

    agent = await natspy.connect(url, nkeys_seed=str(registry.agent_creds("gpu-host-1")),
                                 error_cb=on_error, allow_reconnect=False)
    # Allowed: nothing to check beyond acceptance. Forbidden: publishing as the control
    # plane to another host's assignment subject.
    await agent.publish("muster.assign.gpu-host-2", b"forged")
    await agent.flush()
    await asyncio.sleep(0.5)
    assert got == [], "an agent published on another host's assignment subject"
    assert any("permissions violation" in str(e).lower() for e in errors), errors
    await agent.close()
    await sub.unsubscribe()
    await srv.close()


def _free_ports(n: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:  # outside the ephemeral range (server.broker.natsd.free_port), distinct
        p = free_port()
        if p not in ports:
            ports.append(p)
    return ports


def _http_json(url: str):
    with urllib.request.urlopen(url, timeout=2) as resp:
        return resp.status, json.loads(resp.read() or b"{}")


def _wait(pred, timeout: float, what: str, procs, logs):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        for p, log in zip(procs, logs, strict=True):
            if p.poll() is not None:
                pytest.fail(f"nats-server exited ({p.returncode}) while waiting for {what}:\n"
                            + log.read_text()[-3000:])
        try:
            if pred():
                return
        except (OSError, urllib.error.URLError, ValueError) as exc:
            last = exc
        time.sleep(0.2)
    tails = "\n".join(log.read_text()[-2000:] for log in logs)
    pytest.fail(f"timed out waiting for {what} (last error: {last})\n{tails}")


def test_loopback_cluster_forms(tmp_path):
    default_ports = [4222, 4223, 4224, 6222, 6223, 6224, 8222, 8223, 8224]
    mapping = dict(zip(default_ports, _free_ports(len(default_ports)), strict=True))
    confs = []
    for src in NATS_CLUSTER_CONFS:
        text = re.sub(
            r"127\.0\.0\.1:(\d+)",
            lambda m: f"127.0.0.1:{mapping.get(int(m.group(1)), int(m.group(1)))}",
            src.read_text(),
        )
        dst = tmp_path / src.name
        dst.write_text(text)
        confs.append(dst)

    procs, logs = [], []
    try:
        for conf in confs:
            log = tmp_path / f"{conf.stem}.log"
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    [_nats_server(), "-c", str(conf)],
                    cwd=tmp_path,
                    stdout=log.open("wb"),
                    stderr=subprocess.STDOUT,
                )
            )
        monitor = [mapping[p] for p in (8222, 8223, 8224)]
        clients = [mapping[p] for p in (4222, 4223, 4224)]

        def healthy():
            return all(
                _http_json(f"http://127.0.0.1:{m}{JS_HEALTH_PATH}")[0] == 200 for m in monitor
            )

        _wait(healthy, 30, "healthz?js-enabled-only=true on all nodes", procs, logs)

        def meta_leader():
            for m in monitor:
                _, jsz = _http_json(f"http://127.0.0.1:{m}/jsz")
                meta = jsz.get("meta_cluster") or {}
                if meta.get("name") != "muster" or not meta.get("leader"):
                    return False
                if meta.get("cluster_size") != 3:
                    return False
            return True

        _wait(meta_leader, 30, "a JetStream meta leader on a 3-node cluster", procs, logs)

        for i, _ in enumerate(confs, start=1):
            assert (tmp_path / "data" / f"n{i}" / "jetstream").is_dir()

        nats = pytest.importorskip("nats")

        async def r3_bucket():
            nc = await nats.connect(
                servers=[f"nats://127.0.0.1:{p}" for p in clients], connect_timeout=5
            )
            try:
                js = nc.jetstream()
                from nats.errors import NoRespondersError
                from nats.js.api import KeyValueConfig
                from nats.js.errors import BadRequestError, NoStreamResponseError

                # A cluster that has just elected its meta leader may still not answer
                # JetStream requests (a request times out): retried until it does, as
                # Muster's ensure_streams does.
                deadline = time.monotonic() + 20
                while True:
                    try:
                        kv = await js.create_key_value(KeyValueConfig(bucket="probe", replicas=3))
                        break
                    except BadRequestError:
                        raise
                    except Exception:  # noqa: BLE001 - timeouts, no responders, 503: not ready yet
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.25)
                # A new R3 stream answers once its replicas have elected a leader: until
                # then a publish gets no response (seen once in a full suite run).
                for attempt in range(20):
                    try:
                        await kv.put("k", b"v")
                        break
                    except (NoStreamResponseError, NoRespondersError):
                        if attempt == 19:
                            raise
                        await asyncio.sleep(0.5)
                entry = await kv.get("k")
                assert entry.value == b"v"
                info = await js.stream_info("KV_probe")
                assert info.config.num_replicas == 3
                assert info.cluster is not None and len(info.cluster.replicas or []) == 2
            finally:
                await nc.close()

        asyncio.run(asyncio.wait_for(r3_bucket(), 30))
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
