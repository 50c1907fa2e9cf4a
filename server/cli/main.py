"""The `muster` command: run the parts (up, nats, server, agent) and operate the cluster
(job, host, alerts) through the GraphQL API. Exit codes: 0 ok, 1 error, 2 placement failure
(the job could not be placed or failed), 3 not found, 4 unauthorised."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

EXIT_ERROR = 1
EXIT_PLACEMENT = 2
EXIT_NOT_FOUND = 3
EXIT_UNAUTHORISED = 4


def _setup_logging(level: str = "INFO") -> None:
    from server.logs import setup

    setup(level)


# ---------------------------------------------------------------- processes


def _nats_tls(args: argparse.Namespace) -> Any:
    from server.broker.natsd import ServerTls

    if not args.tls_cert and not args.tls_key:
        return None
    if not (args.tls_cert and args.tls_key):
        raise ApiError("--tls-cert and --tls-key go together")
    return ServerTls(Path(args.tls_cert), Path(args.tls_key), Path(args.tls_ca) if args.tls_ca else None,
                     verify=bool(args.tls_verify))


def cmd_nats(args: argparse.Namespace) -> int:
    """The embedded nats-server: one node (exec'd), or `--cluster N` local nodes.
    Auth (nkey users, see server/natsauth.py) is on unless --no-auth or --config."""
    from server.broker.natsauth import AuthDir
    from server.broker.natsd import nats_server_binary, render_config, start_cluster

    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    tls = _nats_tls(args)
    auth = None
    if not args.no_auth and not args.config:
        auth = AuthDir(Path(args.auth_dir).resolve() if args.auth_dir else data_dir / "auth")
        if auth.ensure():
            print(f"NATS credentials created in {auth.path} (control plane: {auth.server_creds})",
                  file=sys.stderr, flush=True)
    if args.cluster:
        n = args.cluster
        client_ports = [args.port + i if args.port else 0 for i in range(n)]
        cluster_ports = [args.cluster_port + i if args.cluster_port else 0 for i in range(n)]
        http_ports = [args.http_port + i if args.http_port else 0 for i in range(n)]
        stopping = False

        def on_signal(signum: int, frame: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        cl = start_cluster(data_dir, n, host=args.host, client_ports=client_ports, cluster_ports=cluster_ports,
                           http_ports=http_ports, auth=auth, tls=tls)
        try:
            print(f"NATS JetStream cluster of {n} nodes is up (data in {data_dir})")
            for node in cl.nodes:
                print(f"  {node.data_dir.name}: {node.url}  (log {node.log_path})")
            print(f"  client URLs: {cl.url}")
            if auth is not None:
                print(f"  auth:        on; control-plane credentials {auth.server_creds}")
            print("Press Ctrl-C to stop.", flush=True)
            reported: set[str] = set()
            while not stopping:
                # A node that dies is reported; the others keep serving (that is the point
                # of a cluster). When none is left, stop.
                for node in cl.nodes:
                    if node.proc.poll() is not None and node.data_dir.name not in reported:
                        reported.add(node.data_dir.name)
                        print(f"{node.data_dir.name} exited with {node.proc.returncode}; see {node.log_path}",
                              file=sys.stderr, flush=True)
                if len(reported) == len(cl.nodes):
                    break
                time.sleep(0.2)
        finally:
            print("Stopping...", flush=True)
            cl.stop()
        return 0
    if auth is None and tls is None:
        argv = [nats_server_binary(), "-js", "-sd", str(data_dir), "-a", args.host, "-p", str(args.port)]
        if args.config:
            argv += ["-c", args.config]
    else:
        conf = data_dir / "nats-server.conf"
        conf.write_text(render_config(
            store_dir=data_dir, host=args.host, port=args.port, conf_dir=data_dir, auth=auth,
            pid_file=auth.pid_file(f"nats-{args.port}") if auth is not None else None, tls=tls))
        argv = [nats_server_binary(), "-c", str(conf)]
    os.execv(argv[0], argv)
    return 0  # pragma: no cover


def cmd_server(args: argparse.Namespace) -> int:
    import uvicorn

    from server.api.app import build_app
    from web.console import console_routes
    from server.replica import Muster, ServerConfig

    _setup_logging()
    cfg = ServerConfig()
    if args.nats:
        cfg.nats_url = args.nats
    if args.http_port is not None:
        cfg.http_port = args.http_port
    if args.http_host:
        cfg.http_host = args.http_host
    if args.data_dir:
        cfg.data_dir = Path(args.data_dir)
    if args.db_url:
        cfg.db_url = args.db_url
    if args.name:
        cfg.name = args.name
    if args.lease_ttl:
        cfg.lease_ttl_s = args.lease_ttl
    if args.heartbeat_interval:
        cfg.heartbeat_interval_s = args.heartbeat_interval
    for opt in ("nats_creds", "nats_ca", "nats_cert", "nats_key", "tls_cert", "tls_key"):
        if getattr(args, opt):
            setattr(cfg, opt, getattr(args, opt))
    scheme = "https" if cfg.tls_cert else "http"
    cfg.history_process = not args.history_in_process
    cfg.heartbeat_process = not args.heartbeats_in_process
    muster = Muster(cfg)
    app = build_app(muster, routes=console_routes())

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if muster.new_token:
                print(f"Operator token (shown once, also in {cfg.data_dir / 'token'}): {muster.new_token}",
                      flush=True)
            print(f"muster server {cfg.name} listening on {scheme}://{cfg.http_host}:{cfg.http_port}", flush=True)

    config = uvicorn.Config(app, host=cfg.http_host, port=cfg.http_port, log_level="warning",
                            lifespan="on", timeout_graceful_shutdown=10,
                            ssl_certfile=cfg.tls_cert, ssl_keyfile=cfg.tls_key)
    Server(config).run()
    return 0


def cmd_agent(args: argparse.Namespace) -> int:
    from agent.agent import Agent, AgentConfig, parse_labels

    _setup_logging()
    cfg = AgentConfig(
        nats_url=args.nats or os.environ.get("MUSTER_NATS_URL", "nats://127.0.0.1:4222"),
        host_id=args.host_id or os.environ.get("MUSTER_HOST_ID") or os.uname().nodename,
        labels=parse_labels(args.labels if args.labels is not None else os.environ.get("MUSTER_LABELS")),
        simulate_gpus=args.simulate_gpus or os.environ.get("MUSTER_SIMULATE_GPUS") or None,
        heartbeat_interval_s=args.heartbeat_interval,
        fence_after_s=args.fence_after,
        kill_grace_s=args.kill_grace,
        cpus=args.cpus,
        memory_mb=args.memory_mb,
        state_dir=Path(args.state_dir) if args.state_dir else None,
        fault_file=args.fault_file,
        nats_creds=args.creds or os.environ.get("MUSTER_NATS_CREDS") or None,
        nats_ca=args.nats_ca or os.environ.get("MUSTER_NATS_CA") or None,
        nats_cert=args.nats_cert or os.environ.get("MUSTER_NATS_CERT") or None,
        nats_key=args.nats_key or os.environ.get("MUSTER_NATS_KEY") or None,
    )
    agent = Agent(cfg)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await agent.run(stop)

    asyncio.run(main())
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    """Embedded NATS, one server and N local agents, until Ctrl-C. NATS auth is on unless
    --no-auth: each part gets its own credentials from <data-dir>/nats/auth."""
    from server.broker.natsauth import AuthDir
    from server.broker.natsd import wait_for_port

    data = Path(args.data_dir).resolve()
    data.mkdir(parents=True, exist_ok=True)
    first_start = not (data / "token").exists()
    exe = [sys.executable, "-m", "server.cli"]
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    logs = data / "logs"
    logs.mkdir(exist_ok=True)
    auth = None if args.no_auth else AuthDir(data / "nats" / "auth")
    if auth is not None:
        auth.ensure()
        for i in range(args.agents):
            auth.issue_agent(f"local-{i + 1}")
        auth.reload_servers()  # a NATS still running from before picks up new agents

    def spawn(name: str, argv: list[str], creds: Path | None = None) -> subprocess.Popen[bytes]:
        out = open(logs / f"{name}.log", "ab")
        env = {k: v for k, v in os.environ.items() if k != "MUSTER_NATS_CREDS"}
        if creds is not None:
            env["MUSTER_NATS_CREDS"] = str(creds)
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        out.close()
        procs.append((name, p))
        return p

    def stop_all() -> None:
        for name, p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    nats_url = f"nats://127.0.0.1:{args.nats_port}"
    stopping = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        nats_argv = exe + ["nats", "--port", str(args.nats_port), "--data-dir", str(data / "nats")]
        if auth is None:
            nats_argv.append("--no-auth")
        nats = spawn("nats", nats_argv)
        wait_for_port(args.nats_port, proc=nats)
        server = spawn("server", exe + ["server", "--nats", nats_url, "--http-port", str(args.http_port),
                                        "--data-dir", str(data)],
                       creds=auth.server_creds if auth is not None else None)
        wait_for_port(args.http_port, timeout=60, proc=server)
        gpus = args.simulate_gpus
        if gpus is None and not _has_nvidia():
            gpus = "8xH100"
        for i in range(args.agents):
            host = f"local-{i + 1}"
            argv = exe + ["agent", "--nats", nats_url, "--host-id", host,
                          "--labels", "rack=local,zone=local", "--state-dir", str(data / "agents")]
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
        if gpus:
            print(f"  agents:   {args.agents} local agents with SIMULATED GPUs ({gpus})")
        token_file = data / "token"
        deadline = time.monotonic() + 30
        while not token_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if first_start and token_file.exists():
            print(f"  token:    {token_file.read_text().strip()}  (saved in {token_file})")
        else:
            print(f"  token:    in {token_file}")
        print("Press Ctrl-C to stop.", flush=True)
        while not stopping:
            for name, p in procs:
                if p.poll() is not None:
                    print(f"{name} exited with {p.returncode}; see {logs / (name + '.log')}", file=sys.stderr)
                    stopping = True
                    break
            time.sleep(0.2)
    finally:
        print("Stopping...", flush=True)
        stop_all()
    return 0


def _has_nvidia() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return n > 0
    except Exception:  # noqa: BLE001
        return False


def cmd_bench(args: argparse.Namespace) -> int:
    from bench.__main__ import main as bench_main

    return int(bench_main(args.bench_args) or 0)


def cmd_check(args: argparse.Namespace) -> int:
    """Verify the invariants over the recorded state; exit 1 when any is broken."""
    from server.state.checker import run_check

    from server.broker.natsauth import find_auth_dir

    url = args.nats or os.environ.get("MUSTER_NATS_URL", "nats://127.0.0.1:4222")
    creds = args.creds or os.environ.get("MUSTER_NATS_CREDS")
    if not creds:  # as `muster token` does: the control plane's key under the data dir
        found = find_auth_dir(os.environ.get("MUSTER_DATA_DIR", ".muster")) / "server.nk"
        if found.exists():
            creds = str(found)
    if creds:
        os.environ["MUSTER_NATS_CREDS"] = creds
    problems = asyncio.run(run_check(url))
    for p in problems:
        print(p)
    print(f"{len(problems)} invariant violations")
    return 1 if problems else 0


def cmd_schema(args: argparse.Namespace) -> int:
    from server.api.schema import schema_sdl

    sys.stdout.write(schema_sdl())
    return 0


# ---------------------------------------------------------------- API client


class ApiError(Exception):
    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


def _token(args: argparse.Namespace) -> str:
    tok = os.environ.get("MUSTER_TOKEN")
    if tok:
        return tok
    path = Path(os.environ.get("MUSTER_DATA_DIR", ".muster")) / "token"
    if path.exists():
        return path.read_text().strip()
    raise ApiError("no token: set MUSTER_TOKEN (or run from the directory holding .muster/token)", EXIT_UNAUTHORISED)


def gql(args: argparse.Namespace, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    import httpx

    url = os.environ.get("MUSTER_URL", "http://127.0.0.1:8080").rstrip("/") + "/graphql"
    try:
        r = httpx.post(url, json={"query": query, "variables": variables or {}},
                       headers={"Authorization": f"Bearer {_token(args)}"}, timeout=30)
    except httpx.HTTPError as exc:
        raise ApiError(f"cannot reach {url}: {exc}") from exc
    if r.status_code == 401:
        raise ApiError("unauthorised: the token was refused", EXIT_UNAUTHORISED)
    body = r.json()
    if body.get("errors"):
        raise ApiError("; ".join(e.get("message", "?") for e in body["errors"]))
    return body["data"]


JOB_FIELDS = """id name state user command gpus gpuModel cpus memoryMb priority submittedAt updatedAt
cancelReason queuePosition pendingReasons { reason hosts }
attempts { id number state host { id } gpuIndices exitCode startedAt finishedAt outputTail reason }"""


def _out(args: argparse.Namespace, data: Any, table: list[list[str]] | None, headers: list[str] | None) -> None:
    if args.output == "json":
        print(json.dumps(data, indent=2))
        return
    if table is None or headers is None:
        print(data)
        return
    widths = [max(len(h), *(len(r[i]) for r in table)) if table else len(h) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))


def cmd_job(args: argparse.Namespace) -> int:
    if args.job_cmd == "submit":
        command = args.command
        if command and command[0] == "--":
            command = command[1:]
        if len(command) == 1 and " " in command[0]:
            command = shlex.split(command[0])
        q = f"""mutation($input: SubmitJobInput!) {{ submitJob(input: $input) {{
            job {{ {JOB_FIELDS} }} userErrors {{ field message code }} }} }}"""
        inp = {"name": args.name, "command": command, "gpus": args.gpus, "gpuModel": args.gpu_model,
               "cpus": args.cpus, "memoryMb": args.memory_mb, "priority": args.priority}
        if args.max_attempts is not None:
            inp["maxAttempts"] = args.max_attempts
        res = gql(args, q, {"input": inp})["submitJob"]
        if res["userErrors"]:
            for e in res["userErrors"]:
                print(f"error: {e['field']}: {e['message']} ({e['code']})", file=sys.stderr)
            return EXIT_ERROR
        job = res["job"]
        timed_out = False
        if args.wait:
            job, timed_out = _wait(args, job["id"], args.timeout)
        _out(args, job, [[job["id"], job["state"]]], ["ID", "STATE"])
        if job["state"] == "FAILED":
            return EXIT_PLACEMENT
        if timed_out:
            if job["state"] == "QUEUED":
                print(f"error: job {job['id']} was not placed within {args.timeout:g}s", file=sys.stderr)
                for r in job.get("pendingReasons") or []:
                    print(f"  {r['hosts']} hosts: {r['reason']}", file=sys.stderr)
                return EXIT_PLACEMENT
            print(f"error: job {job['id']} still {job['state']} after {args.timeout:g}s", file=sys.stderr)
            return EXIT_ERROR
        return 0
    if args.job_cmd == "list":
        q = """query($first: Int, $filter: JobFilter) { jobs(first: $first, filter: $filter) { totalCount
               edges { node { id name state user gpus gpuModel priority submittedAt } } } }"""
        flt = {k: v for k, v in (("state", [s.upper() for s in args.state.split(",")] if args.state else None),
                                  ("user", args.user), ("namePrefix", args.name)) if v}

        def render_jobs() -> int:
            data = gql(args, q, {"first": args.limit, "filter": flt or None})["jobs"]
            rows = [[n["id"], n["name"], n["state"], n["user"], str(n["gpus"]), n["gpuModel"] or "-",
                     str(n["priority"]), (n["submittedAt"] or "")[:19]] for n in (e["node"] for e in data["edges"])]
            _out(args, data, rows, ["ID", "NAME", "STATE", "USER", "GPUS", "MODEL", "PRIO", "SUBMITTED"])
            return 0

        return _watch(args, render_jobs)
    if args.job_cmd == "show":
        return _watch(args, lambda: _show_job(args))
    if args.job_cmd == "logs":
        job = gql(args, """query($id: ID!) { job(id: $id) { id state attempts { number task state host { id }
                           exitCode outputTail } } }""", {"id": args.id})["job"]
        if job is None:
            print(f"no job {args.id}", file=sys.stderr)
            return EXIT_NOT_FOUND
        if args.output == "json":
            _out(args, job["attempts"], None, None)
            return 0
        if not job["attempts"]:
            print(f"job {job['id']} is {job['state']} and has not run yet", file=sys.stderr)
        for a in job["attempts"]:
            task = f" task {a['task']}" if a["task"] else ""
            print(f"==> attempt {a['number']}{task} on {a['host']['id']}: {a['state']}"
                  + (f" (exit {a['exitCode']})" if a["exitCode"] is not None else "") + " <==")
            if a["outputTail"]:
                print(a["outputTail"].rstrip("\n"))
        return 0
    if args.job_cmd == "why":
        job = gql(args, """query($id: ID!) { job(id: $id) { id name state queuePosition
                           pendingReasons { reason hosts } } }""", {"id": args.id})["job"]
        if job is None:
            print(f"no job {args.id}", file=sys.stderr)
            return EXIT_NOT_FOUND
        if args.output == "json":
            _out(args, job, None, None)
            return 0
        if job["state"] != "QUEUED":
            print(f"{job['id']} is {job['state']}: it is not waiting for placement")
            return 0
        print(f"{job['id']} ({job['name']}) is QUEUED, position {job['queuePosition']} in the queue")
        if not job["pendingReasons"]:
            print("  no host rejects it: it should be placed in the next scheduling cycle")
        else:
            _out(args, job, [[str(r["hosts"]), r["reason"]] for r in job["pendingReasons"]], ["HOSTS", "REASON"])
        return 0
    if args.job_cmd == "cancel":
        return _cancel_job(args)
    return EXIT_ERROR


def _show_job(args: argparse.Namespace) -> int:
    job = gql(args, f"query($id: ID!) {{ job(id: $id) {{ {JOB_FIELDS} }} }}", {"id": args.id})["job"]
    if job is None:
        print(f"no job {args.id}", file=sys.stderr)
        return EXIT_NOT_FOUND
    if args.output == "json":
        _out(args, job, None, None)
        return 0
    print(f"{job['id']}  {job['name']}  {job['state']}")
    print(f"  command: {shlex.join(job['command'])}")
    print(f"  wants:   {job['gpus']} GPU {job['gpuModel'] or 'any'}, {job['cpus']} CPU, {job['memoryMb']} MB")
    if job["state"] == "QUEUED":
        print(f"  queue position: {job['queuePosition']}")
        for r in job["pendingReasons"]:
            print(f"  pending: {r['hosts']} hosts: {r['reason']}")
    for a in job["attempts"]:
        print(f"  attempt {a['number']} on {a['host']['id']} GPUs {a['gpuIndices']}: {a['state']}"
              f" exit={a['exitCode']} {a['reason']}")
        if a["outputTail"]:
            print("    " + a["outputTail"].rstrip().replace("\n", "\n    "))
    return 0


def _cancel_job(args: argparse.Namespace) -> int:
    q = """mutation($id: ID!, $reason: String!) { cancelJob(id: $id, reason: $reason) {
           job { id state } userErrors { field message code } } }"""
    res = gql(args, q, {"id": args.id, "reason": args.reason})["cancelJob"]
    if res["userErrors"]:
        for e in res["userErrors"]:
            print(f"error: {e['message']}", file=sys.stderr)
        return EXIT_NOT_FOUND if res["userErrors"][0]["code"] == "NOT_FOUND" else EXIT_ERROR
    _out(args, res["job"], [[res["job"]["id"], "cancel requested"]], ["ID", "STATUS"])
    return 0


def _wait(args: argparse.Namespace, job_id: str, timeout: float | None = None) -> tuple[dict[str, Any], bool]:
    """Poll until the job finishes: (job, False); or (job, True) once `timeout` s pass."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        job = gql(args, f"query($id: ID!) {{ job(id: $id) {{ {JOB_FIELDS} }} }}", {"id": job_id})["job"]
        if job is None:
            raise ApiError(f"job {job_id} is gone", EXIT_NOT_FOUND)
        if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return job, False
        if deadline is not None and time.monotonic() >= deadline:
            return job, True
        time.sleep(0.5)


def _watch(args: argparse.Namespace, render: Any, every_s: float = 2.0) -> int:
    """Render once; with --watch, re-render every `every_s` s until Ctrl-C (exit 0)."""
    if not getattr(args, "watch", False):
        return int(render() or 0)
    try:
        while True:
            if args.output != "json":
                if sys.stdout.isatty():
                    print("\033[H\033[2J", end="")
                print(f"every {every_s:g}s: {time.strftime('%H:%M:%S')}  (Ctrl-C to stop)")
            rc = int(render() or 0)
            if rc == EXIT_NOT_FOUND or rc == EXIT_UNAUTHORISED:
                return rc
            sys.stdout.flush()
            time.sleep(every_s)
    except KeyboardInterrupt:
        return 0


def cmd_host(args: argparse.Namespace) -> int:
    if args.host_cmd == "list":
        q = """query($first: Int, $filter: HostFilter) { hosts(first: $first, filter: $filter) { totalCount
               edges { node { id health cordoned simulated gpus gpuModel gpusAllocated gpuUtilPct cpus memoryMb
               labels { key value } } } } }"""
        flt: dict[str, Any] = {k: v for k, v in (
            ("health", [h.upper() for h in args.health.split(",")] if args.health else None),
            ("rack", args.rack), ("zone", args.zone), ("gpuModel", args.gpu_model), ("label", args.label),
            ("search", args.search)) if v}
        if args.cordoned is not None:
            flt["cordoned"] = args.cordoned

        def render_hosts() -> int:
            data = gql(args, q, {"first": args.limit, "filter": flt or None})["hosts"]
            rows = []
            for n in (e["node"] for e in data["edges"]):
                rows.append([n["id"], n["health"] + (" CORDONED" if n["cordoned"] else ""),
                             f"{n['gpusAllocated']}/{n['gpus']} {n['gpuModel']}" + (" (simulated)" if n["simulated"] else ""),
                             f"{n['gpuUtilPct']}%", str(n["cpus"]),
                             ",".join(f"{lb['key']}={lb['value']}" for lb in n["labels"])])
            _out(args, data, rows, ["ID", "HEALTH", "GPUS", "GPU UTIL", "CPUS", "LABELS"])
            return 0

        return _watch(args, render_hosts)
    if args.host_cmd == "show":
        q = """query($id: ID!) { host(id: $id) { id health cordoned draining simulated gpus gpuModel gpusAllocated
               gpusUnhealthy gpuUtilPct cpus cpuPct memoryMb memUsedMb lastSeen tasks labels { key value } }
               attempts(hostId: $id, first: 10, newestFirst: true) { totalCount edges { node {
               id jobId number state exitCode placedAt } } } }"""
        data = gql(args, q, {"id": args.id})
        h = data["host"]
        if h is None:
            print(f"no host {args.id}", file=sys.stderr)
            return EXIT_NOT_FOUND
        h["recentAttempts"] = [e["node"] for e in data["attempts"]["edges"]]
        if args.output == "json":
            _out(args, h, None, None)
            return 0
        flags = " ".join(f for f, on in (("CORDONED", h["cordoned"]), ("DRAINING", h["draining"]),
                                          ("SIMULATED", h["simulated"])) if on)
        print(f"{h['id']}  {h['health']}  {flags}".rstrip())
        print(f"  gpus:    {h['gpusAllocated']}/{h['gpus']} allocated, {h['gpusUnhealthy']} unhealthy,"
              f" {h['gpuModel']}, util {h['gpuUtilPct']}%")
        print(f"  cpus:    {h['cpus']} ({h['cpuPct']}% busy)")
        print(f"  memory:  {h['memUsedMb']}/{h['memoryMb']} MB")
        print(f"  tasks:   {h['tasks']}")
        labels = ",".join(f"{lb['key']}={lb['value']}" for lb in h["labels"]) or "-"
        print(f"  labels:  {labels}")
        print(f"  seen:    {(h['lastSeen'] or '-')[:19]}")
        if h["recentAttempts"]:
            print(f"  recent attempts ({data['attempts']['totalCount']} in all):")
            for a in h["recentAttempts"]:
                code = "" if a["exitCode"] is None else f" exit={a['exitCode']}"
                print(f"    {a['jobId']} #{a['number']} {a['state']}{code}  {(a['placedAt'] or '')[:19]}")
        return 0
    if args.host_cmd == "drain":
        q = """mutation($input: DrainHostInput!) { drainHost(input: $input) {
               host { id health cordoned draining } userErrors { field message code } } }"""
        res = gql(args, q, {"input": {"id": args.id, "reason": args.reason, "deadlineSeconds": args.deadline}})["drainHost"]
        if res["userErrors"]:
            for e in res["userErrors"]:
                print(f"error: {e['field']}: {e['message']}", file=sys.stderr)
            return EXIT_NOT_FOUND if res["userErrors"][0]["code"] == "NOT_FOUND" else EXIT_ERROR
        h = res["host"]
        _out(args, h, [[h["id"], h["health"], "draining"]], ["ID", "HEALTH", "STATE"])
        return 0
    if args.host_cmd in ("cordon", "uncordon"):
        field = "cordonHost" if args.host_cmd == "cordon" else "uncordonHost"
        q = f"""mutation($input: HostActionInput!) {{ {field}(input: $input) {{
                host {{ id health cordoned }} userErrors {{ field message code }} }} }}"""
        res = gql(args, q, {"input": {"id": args.id, "reason": args.reason}})[field]
        if res["userErrors"]:
            for e in res["userErrors"]:
                print(f"error: {e['field']}: {e['message']}", file=sys.stderr)
            return EXIT_NOT_FOUND if res["userErrors"][0]["code"] == "NOT_FOUND" else EXIT_ERROR
        h = res["host"]
        _out(args, h, [[h["id"], h["health"], str(h["cordoned"])]], ["ID", "HEALTH", "CORDONED"])
        return 0
    return EXIT_ERROR


def cmd_alerts(args: argparse.Namespace) -> int:
    """`muster alerts tail`: the last --lines alerts, then new ones as they are recorded
    (polls the `alerts` query every --interval seconds; Ctrl-C exits 0)."""
    q = """query($first: Int, $kind: String) { alerts(first: $first, kind: $kind) {
           edges { node { id kind ts hostId jobId message } } } }"""
    seen: set[str] = set()

    def show(a: dict[str, Any]) -> None:
        if args.output == "json":
            print(json.dumps(a), flush=True)
        else:
            where = " ".join(x for x in (a["hostId"] and f"host={a['hostId']}", a["jobId"] and f"job={a['jobId']}") if x)
            print(f"{(a['ts'] or '')[:19]}  {a['kind']:<18} {where}  {a['message']}".rstrip(), flush=True)

    def fetch(n: int) -> list[dict[str, Any]]:
        return [e["node"] for e in gql(args, q, {"first": n, "kind": args.kind})["alerts"]["edges"]]

    try:
        first = fetch(max(args.lines, 1))
        for a in reversed(first[: args.lines]):
            show(a)
        seen.update(a["id"] for a in first)
        while True:
            time.sleep(args.interval)
            new = [a for a in fetch(100) if a["id"] not in seen]
            for a in reversed(new):  # oldest first
                seen.add(a["id"])
                show(a)
    except KeyboardInterrupt:
        return 0


# ---------------------------------------------------------------- tokens and NATS credentials


def _admin_nats(args: argparse.Namespace) -> dict[str, Any]:
    """How `muster token` reaches NATS: --nats/MUSTER_NATS_URL with the control plane's
    credentials (--creds, MUSTER_NATS_CREDS, else server.nk found under --data-dir)."""
    from server.broker.natsauth import find_auth_dir

    creds = args.creds or os.environ.get("MUSTER_NATS_CREDS")
    if not creds:
        found = find_auth_dir(args.data_dir) / "server.nk"
        if found.exists():
            creds = str(found)
    return {"url": args.nats or os.environ.get("MUSTER_NATS_URL", "nats://127.0.0.1:4222"), "creds": creds,
            "tls_ca": args.nats_ca, "tls_cert": args.nats_cert, "tls_key": args.nats_key}


def cmd_token(args: argparse.Namespace) -> int:
    from wire.errors import MusterError
    from wire.kv import Store, connect
    from server.api.tokens import create_token, list_tokens, revoke_token

    opts = _admin_nats(args)

    async def run() -> int:
        nc = await connect(opts.pop("url"), name="muster-token-cli", max_reconnect_attempts=0,
                           allow_reconnect=False, **opts)
        try:
            store = Store(nc)
            if args.token_cmd == "create":
                token, info = await create_token(store, args.name, args.role)
                print(f"Token {info.name!r} ({info.role}) created; it is shown only this once:", file=sys.stderr)
                print(token, flush=True)
                return 0
            if args.token_cmd == "list":
                tokens = await list_tokens(store)
                rows = sorted(([i.name, i.role, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(i.created_at)),
                                h[:12]] for h, i in tokens.items()), key=lambda r: r[0])
                _out(args, [{"name": i.name, "role": i.role, "createdAt": i.created_at, "hash": h}
                            for h, i in tokens.items()], rows, ["NAME", "ROLE", "CREATED", "HASH"])
                return 0
            if args.token_cmd == "revoke":
                n = await revoke_token(store, args.name)
                if n == 0:
                    print(f"no token named {args.name!r}", file=sys.stderr)
                    return EXIT_NOT_FOUND
                print(f"revoked {n} token(s) named {args.name!r}")
                return 0
            return EXIT_ERROR
        finally:
            await nc.close()

    try:
        return asyncio.run(run())
    except MusterError as exc:
        raise ApiError(str(exc)) from exc


def cmd_creds(args: argparse.Namespace) -> int:
    from wire.errors import ConfigError
    from server.broker.natsauth import AuthDir, find_auth_dir

    auth = AuthDir(Path(args.auth_dir) if args.auth_dir else find_auth_dir(args.data_dir))
    try:
        if args.creds_cmd in ("issue-agent", "issue-subscriber"):
            if args.creds_cmd == "issue-agent":
                path = auth.issue_agent(args.name)
            else:
                path = auth.issue_subscriber(args.name)
            reloaded = auth.reload_servers()
            print(path)
            print(f"credentials for {args.name} in {path} (give the process MUSTER_NATS_CREDS={path});"
                  f" {len(reloaded)} nats-server(s) reloaded", file=sys.stderr)
            return 0
        if args.creds_cmd in ("revoke-agent", "revoke-subscriber"):
            kind = "agent" if args.creds_cmd == "revoke-agent" else "subscriber"
            if not auth.revoke(kind, args.name):
                print(f"no {kind} credentials for {args.name!r} in {auth.path}", file=sys.stderr)
                return EXIT_NOT_FOUND
            reloaded = auth.reload_servers()
            print(f"revoked {kind} {args.name}; {len(reloaded)} nats-server(s) reloaded")
            return 0
        if args.creds_cmd == "list":
            users = auth.users()
            _out(args, users, [[u["kind"], u["name"], u["public"]] for u in users], ["KIND", "NAME", "PUBLIC KEY"])
            return 0
    except ConfigError as exc:
        raise ApiError(str(exc)) from exc
    return EXIT_ERROR


# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="muster", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    up = sub.add_parser("up", help="start NATS, a server and local agents (Ctrl-C stops)")
    up.add_argument("--data-dir", default=os.environ.get("MUSTER_DATA_DIR", ".muster"))
    up.add_argument("--http-port", type=int, default=int(os.environ.get("MUSTER_HTTP_PORT", "8080")))
    up.add_argument("--nats-port", type=int, default=4222)
    up.add_argument("--agents", type=int, default=2)
    up.add_argument("--simulate-gpus", default=os.environ.get("MUSTER_SIMULATE_GPUS"))
    up.add_argument("--no-auth", action="store_true", help="run NATS without authentication")
    up.set_defaults(fn=cmd_up)

    n = sub.add_parser("nats", help="run the embedded nats-server with JetStream (auth on by default)")
    n.add_argument("--port", type=int, default=4222, help="client port (of the first node with --cluster)")
    n.add_argument("--host", default="127.0.0.1")
    n.add_argument("--data-dir", default=".muster/nats")
    n.add_argument("--config", default=None, help="your own nats-server config (no generated auth)")
    n.add_argument("--no-auth", action="store_true", help="no authentication (anyone may connect)")
    n.add_argument("--auth-dir", default=None, help="credentials directory (default <data-dir>/auth)")
    n.add_argument("--tls-cert", default=None, help="server certificate: clients must use TLS")
    n.add_argument("--tls-key", default=None)
    n.add_argument("--tls-ca", default=None, help="CA for client certificates")
    n.add_argument("--tls-verify", action="store_true", help="require client certificates")
    n.add_argument("--cluster", type=int, default=0, metavar="N",
                   help="start N local nodes forming a JetStream cluster (Ctrl-C stops all)")
    n.add_argument("--cluster-port", type=int, default=6222, help="route port of the first node (0: free)")
    n.add_argument("--http-port", type=int, default=8222, help="monitoring port of the first node (0: free)")
    n.set_defaults(fn=cmd_nats)

    s = sub.add_parser("server", help="run a control-plane replica")
    s.add_argument("--nats", default=None, help="NATS URL(s), comma-separated (MUSTER_NATS_URL)")
    s.add_argument("--http-port", type=int, default=None)
    s.add_argument("--http-host", default=None)
    s.add_argument("--data-dir", default=None)
    s.add_argument("--db-url", default=None, help="SQLAlchemy URL of the history database (MUSTER_DB_URL)")
    s.add_argument("--name", default=None, help="replica name (default host-pid-random)")
    s.add_argument("--lease-ttl", type=int, default=None, help="leader lease in seconds (default 5)")
    s.add_argument("--history-in-process", action="store_true",
                   help="write history from the server process instead of a historian process of its own")
    s.add_argument("--heartbeats-in-process", action="store_true",
                   help="read heartbeats in the server process instead of an ingest process of its own")
    s.add_argument("--heartbeat-interval", type=float, default=None,
                   help="agents' heartbeat interval in seconds, for SUSPECT detection (default 5)")
    s.add_argument("--creds", dest="nats_creds", default=None,
                   help="NATS credentials: an nkey seed file (MUSTER_NATS_CREDS)")
    s.add_argument("--nats-ca", default=None, help="CA of the NATS servers' certificates (MUSTER_NATS_CA)")
    s.add_argument("--nats-cert", default=None, help="NATS client certificate (MUSTER_NATS_CERT)")
    s.add_argument("--nats-key", default=None, help="NATS client key (MUSTER_NATS_KEY)")
    s.add_argument("--tls-cert", default=None, help="serve HTTPS with this certificate (MUSTER_TLS_CERT)")
    s.add_argument("--tls-key", default=None, help="key of --tls-cert (MUSTER_TLS_KEY)")
    s.set_defaults(fn=cmd_server)

    a = sub.add_parser("agent", help="run a host agent")
    a.add_argument("--nats", default=None)
    a.add_argument("--host-id", default=None)
    a.add_argument("--labels", default=None, help="rack=r1,zone=z1")
    a.add_argument("--simulate-gpus", default=None, help="e.g. 8xH100")
    a.add_argument("--heartbeat-interval", type=float, default=5.0)
    a.add_argument("--fence-after", type=float, default=10.0)
    a.add_argument("--kill-grace", type=float, default=10.0)
    a.add_argument("--cpus", type=int, default=None)
    a.add_argument("--memory-mb", type=int, default=None)
    a.add_argument("--state-dir", default=os.environ.get("MUSTER_AGENT_STATE_DIR"))
    a.add_argument("--fault-file", default=None)
    a.add_argument("--creds", default=None, help="this agent's NATS credentials (MUSTER_NATS_CREDS)")
    a.add_argument("--nats-ca", default=None, help="CA of the NATS servers' certificates (MUSTER_NATS_CA)")
    a.add_argument("--nats-cert", default=None, help="NATS client certificate (MUSTER_NATS_CERT)")
    a.add_argument("--nats-key", default=None, help="NATS client key (MUSTER_NATS_KEY)")
    a.set_defaults(fn=cmd_agent)

    b = sub.add_parser("bench", help="run the scale benchmark (see `muster bench --help`)", add_help=False)
    b.add_argument("bench_args", nargs=argparse.REMAINDER)
    b.set_defaults(fn=cmd_bench)

    ck = sub.add_parser("check", help="verify the invariants over the recorded state")
    ck.add_argument("--nats", default=None)
    ck.add_argument("--creds", default=None, help="NATS credentials (MUSTER_NATS_CREDS)")
    ck.set_defaults(fn=cmd_check)

    sc = sub.add_parser("schema", help="print the GraphQL schema (SDL)")
    sc.set_defaults(fn=cmd_schema)

    def output(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("-o", "--output", choices=["table", "json"], default="table")

    j = sub.add_parser("job", help="submit, list, show and cancel jobs")
    jsub = j.add_subparsers(dest="job_cmd", required=True)
    js = jsub.add_parser("submit")
    js.add_argument("name")
    js.add_argument("command", nargs=argparse.REMAINDER)
    js.add_argument("--gpus", type=int, default=0)
    js.add_argument("--gpu-model", default=None)
    js.add_argument("--cpus", type=float, default=1.0)
    js.add_argument("--memory-mb", type=int, default=512)
    js.add_argument("--priority", type=int, default=0)
    js.add_argument("--max-attempts", type=int, default=None, help="tries when hosts are lost (default 3)")
    js.add_argument("--wait", action="store_true", help="wait until the job finishes")
    js.add_argument("--timeout", type=float, default=None, metavar="S",
                    help="with --wait: give up after S seconds (exit 2 if the job was never placed)")
    output(js)

    def watch(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("-w", "--watch", action="store_true", help="re-render every 2 s until Ctrl-C")

    jl = jsub.add_parser("list")
    jl.add_argument("--state", default=None, help="one state or several, comma-separated")
    jl.add_argument("--user", default=None)
    jl.add_argument("--name", default=None, help="name prefix")
    jl.add_argument("--limit", type=int, default=50)
    output(jl)
    watch(jl)
    jsh = jsub.add_parser("show")
    jsh.add_argument("id")
    output(jsh)
    watch(jsh)
    jlg = jsub.add_parser("logs", help="the output tail of each attempt")
    jlg.add_argument("id")
    output(jlg)
    jw = jsub.add_parser("why", help="why a job is still queued: rejecting hosts by reason, queue position")
    jw.add_argument("id")
    output(jw)
    jc = jsub.add_parser("cancel")
    jc.add_argument("id")
    jc.add_argument("--reason", default="")
    output(jc)
    j.set_defaults(fn=cmd_job)

    h = sub.add_parser("host", help="list, cordon and uncordon hosts")
    hsub = h.add_subparsers(dest="host_cmd", required=True)
    hl = hsub.add_parser("list")
    hl.add_argument("--limit", type=int, default=500)
    hl.add_argument("--health", default=None, help="HEALTHY, SUSPECT, LOST (comma-separated)")
    hl.add_argument("--rack", default=None)
    hl.add_argument("--zone", default=None)
    hl.add_argument("--gpu-model", default=None)
    hl.add_argument("--label", default=None, help="key=value (or key)")
    hl.add_argument("--search", default=None, help="host id prefix")
    hl.add_argument("--cordoned", default=None, action=argparse.BooleanOptionalAction)
    output(hl)
    watch(hl)
    hs = hsub.add_parser("show")
    hs.add_argument("id")
    output(hs)
    for name in ("cordon", "uncordon"):
        hc = hsub.add_parser(name)
        hc.add_argument("id")
        hc.add_argument("--reason", default="", required=(name == "cordon"))
        output(hc)
    hd = hsub.add_parser("drain", help="cordon, then stop what still runs after --deadline seconds")
    hd.add_argument("id")
    hd.add_argument("--reason", required=True)
    hd.add_argument("--deadline", type=float, default=300.0, help="seconds before running work is stopped")
    output(hd)
    h.set_defaults(fn=cmd_host)

    al = sub.add_parser("alerts", help="follow alerts")
    alsub = al.add_subparsers(dest="alerts_cmd", required=True)
    at = alsub.add_parser("tail", help="print the last alerts, then new ones until Ctrl-C")
    at.add_argument("-n", "--lines", type=int, default=10, help="recent alerts to print first")
    at.add_argument("--kind", default=None, help='only this kind, e.g. "host.lost"')
    at.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
    output(at)
    al.set_defaults(fn=cmd_alerts)

    def admin_nats(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--nats", default=None, help="NATS URL(s) (MUSTER_NATS_URL)")
        sp.add_argument("--creds", default=None, help="control-plane credentials (MUSTER_NATS_CREDS)")
        sp.add_argument("--nats-ca", default=os.environ.get("MUSTER_NATS_CA"))
        sp.add_argument("--nats-cert", default=os.environ.get("MUSTER_NATS_CERT"))
        sp.add_argument("--nats-key", default=os.environ.get("MUSTER_NATS_KEY"))
        sp.add_argument("--data-dir", default=os.environ.get("MUSTER_DATA_DIR", ".muster"),
                        help="where to find the credentials when --creds is not given")

    t = sub.add_parser("token", help="create, list and revoke API tokens (talks to NATS directly)")
    tsub = t.add_subparsers(dest="token_cmd", required=True)
    tc = tsub.add_parser("create")
    tc.add_argument("name")
    tc.add_argument("--role", choices=["viewer", "operator", "admin"], required=True)
    admin_nats(tc)
    tl = tsub.add_parser("list")
    admin_nats(tl)
    output(tl)
    tr = tsub.add_parser("revoke")
    tr.add_argument("name")
    admin_nats(tr)
    t.set_defaults(fn=cmd_token)

    cr = sub.add_parser("creds", help="issue and revoke NATS credentials of agents and subscribers")
    crsub = cr.add_subparsers(dest="creds_cmd", required=True)
    for name in ("issue-agent", "revoke-agent", "issue-subscriber", "revoke-subscriber", "list"):
        c = crsub.add_parser(name)
        if name != "list":
            c.add_argument("name", metavar="HOST" if "agent" in name else "NAME")
        c.add_argument("--data-dir", default=os.environ.get("MUSTER_DATA_DIR", ".muster"))
        c.add_argument("--auth-dir", default=None, help="credentials directory (default: found in --data-dir)")
        if name == "list":
            output(c)
    cr.set_defaults(fn=cmd_creds)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:
        # Everything after `bench` belongs to the benchmark's own parser (argparse's
        # REMAINDER would not take a leading `--hosts ...`).
        from bench.__main__ import main as bench_main

        rest = argv[1:]
        return int(bench_main(rest[1:] if rest[:1] == ["--"] else rest) or 0)
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
