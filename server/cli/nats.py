"""`muster nats`: the embedded nats-server with JetStream, one node (exec'd in place of
this process) or `--cluster N` local nodes (watched until Ctrl-C). Auth (nkey users, see
server.broker.natsauth) is on unless --no-auth or --config."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from server.cli.client import whole_number
from wire.errors import ConfigError

if TYPE_CHECKING:
    from server.broker.natsauth import AuthDir
    from server.broker.natsd import ServerTls


def register(sub: argparse._SubParsersAction) -> None:
    n = sub.add_parser("nats", help="run the embedded nats-server with JetStream (auth on by default)")
    n.add_argument("--port", type=whole_number, default=4222, help="client port (of the first node with --cluster)")
    n.add_argument("--host", default="127.0.0.1")
    n.add_argument("--data-dir", default=".muster/nats")
    n.add_argument("--config", default=None,
                   help="run nats-server with your own config as it is (its address, store and JetStream "
                        "settings; no generated auth; not with --cluster or TLS options)")
    n.add_argument("--no-auth", action="store_true", help="no authentication (anyone may connect)")
    n.add_argument("--auth-dir", default=None, help="credentials directory (default <data-dir>/auth)")
    n.add_argument("--tls-cert", default=None, help="server certificate: clients must use TLS")
    n.add_argument("--tls-key", default=None)
    n.add_argument("--tls-ca", default=None, help="CA for client certificates")
    n.add_argument("--tls-verify", action="store_true", help="require client certificates")
    n.add_argument("--cluster", type=whole_number, default=0, metavar="N",
                   help="start N local nodes forming a JetStream cluster (Ctrl-C stops all)")
    n.add_argument("--cluster-port", type=whole_number, default=6222,
                   help="with --cluster: route port of the first node (0: free)")
    n.add_argument("--http-port", type=whole_number, default=None,
                   help="monitoring port (/healthz, /varz): a single node's, off unless given; with --cluster the "
                        "first node's (default 8222, 0: free)")
    n.set_defaults(fn=cmd_nats)


def server_tls(args: argparse.Namespace) -> ServerTls | None:
    from server.broker.natsd import ServerTls

    if not args.tls_cert and not args.tls_key:
        return None
    if not (args.tls_cert and args.tls_key):
        raise ConfigError("--tls-cert and --tls-key go together")
    return ServerTls(Path(args.tls_cert), Path(args.tls_key), Path(args.tls_ca) if args.tls_ca else None,
                     verify=bool(args.tls_verify))


def cmd_nats(args: argparse.Namespace) -> int:
    from server.broker.natsauth import AuthDir, private_dir
    from server.broker.natsd import adopt_global_streams, nats_server_binary, render_config

    tls = server_tls(args)
    if args.config:
        # The file says everything (a store directory given beside its own store_dir is
        # refused by nats-server as a duplicate).
        if args.cluster or tls is not None:
            raise ConfigError("--config runs your own nats-server config as it is: set a cluster or TLS there")
        argv = [nats_server_binary(), "-c", str(Path(args.config).resolve())]
        os.execv(argv[0], argv)
    data_dir = Path(args.data_dir).resolve()
    # NATS's store (every job's env), its config and the default credentials directory:
    # this user's alone, or refused (found by exploring: one another user made first).
    private_dir(data_dir, "NATS data directory")
    auth = None
    if not args.no_auth:
        auth = AuthDir(Path(args.auth_dir).resolve() if args.auth_dir else data_dir / "auth")
        if auth.ensure():
            print(f"NATS credentials created in {auth.path} (control plane: {auth.server_creds})",
                  file=sys.stderr, flush=True)
    if args.cluster:
        return run_cluster(args, data_dir, auth, tls)
    if auth is None and tls is None:
        argv = [nats_server_binary(), "-js", "-sd", str(data_dir), "-a", args.host, "-p", str(args.port)]
        if args.http_port:
            argv += ["-m", str(args.http_port)]
    else:
        if auth is not None and adopt_global_streams(data_dir):
            print(f"streams moved to the control plane's NATS account ({data_dir / 'jetstream'})",
                  file=sys.stderr, flush=True)
        conf = data_dir / "nats-server.conf"
        conf.write_text(render_config(
            store_dir=data_dir, host=args.host, port=args.port, conf_dir=data_dir, auth=auth,
            pid_file=auth.pid_file(f"nats-{args.port}") if auth is not None else None, tls=tls,
            http_port=args.http_port or None))
        argv = [nats_server_binary(), "-c", str(conf)]
    os.execv(argv[0], argv)
    return 0  # pragma: no cover


def run_cluster(args: argparse.Namespace, data_dir: Path, auth: AuthDir | None, tls: ServerTls | None) -> int:
    """`--cluster N`: start the nodes, report each one that dies, stop all on Ctrl-C/SIGTERM
    (or when none is left)."""
    from server.broker.natsd import start_cluster

    n = args.cluster
    client_ports = [args.port + i if args.port else 0 for i in range(n)]
    cluster_ports = [args.cluster_port + i if args.cluster_port else 0 for i in range(n)]
    first_http = 8222 if args.http_port is None else args.http_port
    http_ports = [first_http + i if first_http else 0 for i in range(n)]
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
