"""The benchmark's child processes: nats-server (one node, or a 3-node cluster), one
`muster server` or more, and whatever else a run spawns (simulators, the observer), each
sampled for CPU time and peak RSS; the server's own helper processes are adopted.

`Processes` is what `muster bench` (bench.run.Bench) and `python -m bench.operator`
share. It reads `args.nats_cluster` (1 or 3), `args.nats_sync` (`always` or `default`),
`args.replicas` (MUSTER_REPLICAS for the server) and, if present, `args.preload`,
`args.servers` (replicas of `muster server`) and `args.db_url` (their history database).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from bench.errors import BenchError
from bench.natscluster import write_cluster_configs
from server.broker.natsd import free_port, nats_server_binary, start_nats, wait_for_port

# The directory that holds the `bench` package: the checkout, or site-packages when
# installed. Child processes run there (`python -m server.cli` and `python -m bench.*`
# import from either).
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Child:
    name: str
    popen: subprocess.Popen | None
    proc: psutil.Process
    log: Path | None = None
    peak_rss: int = 0
    cpu: float = 0.0
    cpu_at_start: float | None = None
    cpu_at_end: float | None = None
    finite: bool = False  # a load generator that ends on its own (exit 0 is no failure)
    killed: bool = False  # killed on purpose by the run (its exit is no failure)
    tree: bool = False  # count its child processes too (PostgreSQL's backends)

    def sample(self) -> None:
        try:
            t = self.proc.cpu_times()
            cpu = t.user + t.system
            rss = self.proc.memory_info().rss
            if self.tree:
                # Children it has reaped are in children_*; those alive are added one by one.
                cpu += t.children_user + t.children_system
                for k in self.proc.children(recursive=True):
                    try:
                        kt = k.cpu_times()
                        cpu += kt.user + kt.system
                        rss += k.memory_info().rss
                    except psutil.Error:
                        pass
            self.cpu = max(self.cpu, cpu)
            self.peak_rss = max(self.peak_rss, rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass

    def alive(self) -> bool:
        return self.popen.poll() is None if self.popen is not None else self.proc.is_running()

    def stop(self, timeout: float = 15) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


@dataclass
class Processes:
    args: argparse.Namespace
    work: Path
    children: list[Child] = field(default_factory=list)
    nats_url: str = ""
    http: str = ""  # the first server's API
    token: str = ""
    servers: list[tuple[Child, str]] = field(default_factory=list)  # each replica and its API

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        log = self.work / f"{name}.log"
        out = open(log, "ab")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        out.close()
        c = Child(name, p, psutil.Process(p.pid), log)
        self.children.append(c)
        return c

    def start_nats(self) -> None:
        if self.args.nats_cluster == 1:
            conf = None
            if self.args.nats_sync == "always":
                conf = self.work / "sync.conf"
                conf.write_text("jetstream { sync_interval: always }\n")
            n = start_nats(self.work / "nats", port=0, config=conf)
            self.children.append(Child("nats-server", n.proc, psutil.Process(n.proc.pid), n.log_path))
            self.nats_url = n.url
            return
        if self.args.nats_cluster != 3:
            raise BenchError("--nats-cluster must be 1 or 3")
        nodes = write_cluster_configs(self.work, sync_always=self.args.nats_sync == "always")
        started: list[Child] = []
        for node in nodes:
            log = self.work / f"nats-{node.name}.log"
            out = open(log, "ab")
            p = subprocess.Popen([nats_server_binary(), "-c", str(node.config)], stdout=out, stderr=subprocess.STDOUT,
                                 cwd=self.work, start_new_session=True)
            out.close()
            c = Child(f"nats-server-{node.name}", p, psutil.Process(p.pid), log)
            self.children.append(c)
            started.append(c)
        for node, c in zip(nodes, started, strict=True):
            try:
                wait_for_port(node.port, timeout=30, proc=c.popen)
            except Exception as exc:
                raise BenchError(f"{c.name} did not start: {exc}; see {c.log}") from exc
        deadline = time.monotonic() + 60
        for node in nodes:
            while True:
                try:
                    if httpx.get(f"http://{node.host}:{node.http_port}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise BenchError("the 3-node NATS cluster did not become ready (JetStream) within 60 s")
                time.sleep(0.5)
        self.nats_url = ",".join(n.url for n in nodes)

    @property
    def server_data_dir(self) -> Path:
        """The first server's --data-dir (its history database lives there without --db-url)."""
        return self.work / "server"

    def start_server(self, env: dict[str, str] | None = None) -> None:
        """Start `args.servers` (default 1) `muster server` replicas, one after another:
        the first is named `server`, the others `server-2`...; each has a data directory
        of its own, and with `args.db_url` they share that history database. `env` adds
        to each server's environment (its MUSTER_* settings)."""
        for i in range(getattr(self.args, "servers", 1) or 1):
            self._start_one_server(i, env or {})

    def _start_one_server(self, i: int, extra_env: dict[str, str]) -> None:
        port = free_port()
        name = "server" if i == 0 else f"server-{i + 1}"
        # Set either way, so that a MUSTER_REPLICAS in the caller's environment cannot leak in.
        env = {**extra_env, "MUSTER_REPLICAS": str(self.args.replicas)}
        if getattr(self.args, "follower_heartbeats_every", None) is not None:
            env["MUSTER_FOLLOWER_HEARTBEATS_EVERY"] = str(self.args.follower_heartbeats_every)
        data = self.work / name
        argv = [sys.executable, "-m", "server.cli", "server", "--nats", self.nats_url,
                "--http-port", str(port), "--data-dir", str(data), "--name", f"bench-{name}"]
        if getattr(self.args, "db_url", None):
            argv += ["--db-url", self.args.db_url]
        c = self.spawn(name, argv, env)
        try:
            # A server loads the whole state before it listens (about 90 s for 500,000 jobs).
            wait_for_port(port, timeout=90 + getattr(self.args, "preload", 0) / 2000, proc=c.popen)
        except Exception as exc:
            raise BenchError(f"muster server did not start: {exc}; see {c.log}") from exc
        self.servers.append((c, f"http://127.0.0.1:{port}"))
        if not self.http:
            self.http = f"http://127.0.0.1:{port}"
        if self.token:
            return
        # The replica that bootstrapped the cluster writes the operator token.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for d in (self.work / (c.name) for c, _ in self.servers):
                tf = d / "token"
                if tf.exists() and tf.read_text().strip():
                    self.token = tf.read_text().strip()
                    return
            time.sleep(0.1)
        if i == 0 and getattr(self.args, "servers", 1) > 1:
            return  # the token may come from the next replica
        raise BenchError("muster server wrote no token")

    def stop_all(self) -> None:
        for c in reversed(self.children):
            c.stop()

    def adopt_server_children(self) -> None:
        """Processes the server started itself (historian, heartbeat ingest) count too."""
        for srv in [c for c in self.children if c.name.startswith("server")]:
            try:
                kids = srv.proc.children(recursive=True)
            except psutil.Error:
                continue
            known = {c.proc.pid for c in self.children}
            for p in (k for k in kids if k.pid not in known):
                try:
                    cmd = " ".join(p.cmdline())
                    name = p.name()
                except psutil.Error:
                    continue
                # The server names its helper processes (wire.logs.name_this_process).
                what = ("historian" if name == "muster-history" else
                        "heartbeat ingest" if name == "muster-ingest" else
                        "multiprocessing resource tracker" if "resource_tracker" in cmd else f"child {p.pid}")
                self.children.append(Child(f"{srv.name}: {what}", None, p))

    def check_children(self) -> None:
        for c in self.children:
            if c.killed:
                continue
            if c.popen is not None and c.popen.poll() is not None and not (c.finite and c.popen.returncode == 0):
                raise BenchError(f"{c.name} exited with {c.popen.returncode}; see {c.log}")

