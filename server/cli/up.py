"""`muster up` (what `make run` runs): embedded NATS, one server and N local agents, each
a subprocess with its log in <data-dir>/logs, until Ctrl-C. NATS auth is on unless
--no-auth: each part gets its own credentials from <data-dir>/nats/auth."""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from server.cli.client import whole_number
from server.cli.tokens import NATS_URL_FILE
from wire.errors import ConfigError
from wire.owndir import own_dir

MUSTER = [sys.executable, "-m", "server.cli"]
# How long Ctrl-C waits for the agents: an agent's default kill grace (10 s), then up to
# 10 s to deliver its last reports (agent.agent.REPORTS_AT_SHUTDOWN_S), and a margin.
AGENT_STOP_S = 25.0
AGENT = [sys.executable, "-m", "agent"]




def port_free(port: int) -> bool:
    """Whether nothing listens on `port` here (0: any port is free)."""
    if not port:
        return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True

def cgroup_tag(data: Path) -> str:
    """A short tag of a data directory, the same at each start: its agents' cgroups."""
    return hashlib.sha256(str(data.resolve()).encode()).hexdigest()[:8]

def register(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("up", help="start NATS, a server and local agents (Ctrl-C stops)")
    up.add_argument("--data-dir", default=os.environ.get("MUSTER_DATA_DIR", ".muster"))
    up.add_argument("--http-port", type=whole_number, default=int(os.environ.get("MUSTER_HTTP_PORT", "8080")))
    up.add_argument("--nats-port", type=whole_number, default=4222)
    up.add_argument("--agents", type=whole_number, default=None,
                    help="local agents (default 2 with simulated GPUs; 1 on this machine's NVIDIA GPUs)")
    up.add_argument("--simulate-gpus", default=os.environ.get("MUSTER_SIMULATE_GPUS"), metavar="SPEC",
                    help="each agent's simulated GPUs: COUNTxMODEL[,mig=GPUS:N*PROFILE], e.g. 4xH100")
    up.add_argument("--no-auth", action="store_true", help="run NATS without authentication")
    up.set_defaults(fn=cmd_up)


def cmd_up(args: argparse.Namespace) -> int:
    from server.broker.natsauth import AuthDir
    from server.broker.natsd import wait_for_port

    data = Path(args.data_dir).resolve()
    # Everything under it (NATS seeds, the operator token, the job history and NATS's own
    # store, which hold jobs' env, the agents' state) is for this user only: tasks run as
    # another user when this runs as root (docs/security.md); nor may another user have
    # made it first (wire.owndir).
    try:
        own_dir(data, "data directory")
    except OSError as exc:
        print(f"muster up: {exc}", file=sys.stderr)
        return 2
    try:
        agent_gpus = plan_agents(args.agents, args.simulate_gpus, nvidia=args.simulate_gpus is None and has_nvidia())
    except ValueError as e:
        print(f"muster up: {e}", file=sys.stderr)
        return 2
    first_start = not (data / "token").exists()
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    logs = data / "logs"
    logs.mkdir(exist_ok=True, mode=0o700)
    logs.chmod(0o700)  # the server's log holds the operator token it prints on a first start
    auth = None if args.no_auth else AuthDir(data / "nats" / "auth")
    if auth is not None:
        auth.ensure()
        for i in range(len(agent_gpus)):
            auth.issue_agent(f"local-{i + 1}")
        auth.reload_servers()  # a NATS still running from before picks up new agents

    def spawn(name: str, argv: list[str], creds: Path | None = None) -> subprocess.Popen[bytes]:
        out = open(os.open(logs / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")
        env = {k: v for k, v in os.environ.items() if k != "MUSTER_NATS_CREDS"}
        if creds is not None:
            env["MUSTER_NATS_CREDS"] = str(creds)
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        out.close()
        procs.append((name, p))
        return p

    def stop_all() -> None:
        """The agents together (each stops its attempts within their grace and delivers
        its last reports while NATS and the server still run), then the server, then NATS;
        what has not exited in time is killed."""
        agents = [p for name, p in procs if name.startswith("agent-")]
        others = [p for name, p in reversed(procs) if not name.startswith("agent-")]
        for group, wait_s in ((agents, AGENT_STOP_S), *(([p], 15.0) for p in others)):
            running = [p for p in group if p.poll() is None]
            for p in running:
                p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + wait_s
            for p in running:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    # A port another process listens on would be taken for ours (found by exploring: with
    # the NATS port in use, its nats-server died and the server joined the other NATS).
    for port, flag in ((args.nats_port, "--nats-port"), (args.http_port, "--http-port")):
        if not port_free(port):
            raise ConfigError(f"port {port} is in use (another `muster up`?): choose another with {flag}")
    nats_url = f"nats://127.0.0.1:{args.nats_port}"
    # Where `muster token` and `muster check` find this NATS when given --data-dir alone.
    (data / NATS_URL_FILE).write_text(nats_url + "\n")
    stopping = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        nats_argv = MUSTER + ["nats", "--port", str(args.nats_port), "--data-dir", str(data / "nats")]
        if auth is None:
            nats_argv.append("--no-auth")
        nats = spawn("nats", nats_argv)
        wait_for_port(args.nats_port, proc=nats)
        server = spawn("server", MUSTER + ["server", "--nats", nats_url, "--http-port", str(args.http_port),
                                           "--data-dir", str(data)],
                       creds=auth.server_creds if auth is not None else None)
        wait_for_port(args.http_port, timeout=60, proc=server)
        for i, gpus in enumerate(agent_gpus):
            host = f"local-{i + 1}"
            # Each `muster up`'s agents under cgroups of their own (another `muster up` on
            # this machine names its hosts local-1 ... too, and an agent removes the empty
            # attempt cgroups it finds under its base).
            argv = AGENT + ["--nats", nats_url, "--host-id", host,
                            "--labels", "rack=local,zone=local", "--state-dir", str(data / "agents"),
                            "--cgroup-name", f"muster-{cgroup_tag(data)}-{host}"]
            if gpus:
                argv += ["--simulate-gpus", gpus]
            spawn(f"agent-{i + 1}", argv, creds=auth.agent_creds(host) if auth is not None else None)
        base = f"http://127.0.0.1:{args.http_port}"
        print(f"Muster is up (data in {data}, logs in {logs})")
        print(f"  console:  {base}/")
        print(f"  GraphQL:  {base}/graphql")
        if auth is not None:
            print(f"  NATS:     {nats_url} (auth on; credentials in {auth.path})")
        else:
            print(f"  NATS:     {nats_url} (NO AUTH)")
        if agent_gpus[:1] == [None]:
            print("  agent:    local-1 with this machine's NVIDIA GPUs (NVML)")
        elif agent_gpus:
            print(f"  agents:   {len(agent_gpus)} local agents with SIMULATED GPUs ({agent_gpus[0]})")
        token_file = data / "token"
        deadline = time.monotonic() + 30
        while not token_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if first_start and token_file.exists():
            print(f"  token:    {token_file.read_text().strip()}  (saved in {token_file})")
        else:
            print(f"  token:    in {token_file}")
        print("Press Ctrl-C to stop.", flush=True)
        gone: set[str] = set()
        while not stopping:
            for name, p in procs:
                if p.poll() is None or name in gone:
                    continue
                gone.add(name)
                if name.startswith("agent-"):
                    # As a host of a real cluster: its host is lost and its work replaced; the
                    # rest keeps running (kill -9 an agent to watch that happen).
                    print(f"{name} exited with {p.returncode}; its host will be LOST and its work requeued, the "
                          f"rest keeps running; see {logs / (name + '.log')}", file=sys.stderr, flush=True)
                    continue
                print(f"{name} exited with {p.returncode}; see {logs / (name + '.log')}", file=sys.stderr)
                stopping = True
                break
            time.sleep(0.2)
    finally:
        print("Stopping...", flush=True)
        stop_all()
    return 0


def plan_agents(agents: int | None, simulate: str | None, nvidia: bool) -> list[str | None]:
    """The GPUs of each local agent: a simulated spec, or None for this machine's GPUs.

    Simulated GPUs (asked for, or no NVIDIA driver): `agents` agents, 2 by default. Real
    GPUs: one agent, since every agent on a machine would report the same physical GPUs
    and the cluster would count each of them once per agent.
    """
    if agents is not None and agents < 0:
        raise ValueError("--agents must be 0 or more")
    if simulate is not None or not nvidia:
        if simulate is not None:
            from agent.gpu import parse_full_spec
            try:
                parse_full_spec(simulate)  # refused here, before anything starts, not by each agent
            except ConfigError as e:
                raise ValueError(f"--simulate-gpus: {e}") from e
        return [simulate or "8xH100"] * (2 if agents is None else agents)
    if agents is not None and agents > 1:
        raise ValueError(f"--agents {agents}: this machine's GPUs can back one agent only "
                         "(each would report the same GPUs); add --simulate-gpus SPEC for more")
    return [None] * (1 if agents is None else agents)


def has_nvidia() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return n > 0
    except Exception:  # noqa: BLE001
        return False
