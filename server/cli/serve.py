"""`muster server`: one control-plane replica (the API, the console, the scheduler when
it leads) under uvicorn until SIGINT/SIGTERM. Unset options come from ServerConfig, which
reads the MUSTER_* environment (server.replica)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any

from server.cli.client import finite_float, whole_number
from server.scheduling.capacity import POLICIES


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("server", help="run a control-plane replica")
    s.add_argument("--nats", default=None, help="NATS URL(s), comma-separated (MUSTER_NATS_URL)")
    s.add_argument("--http-port", type=whole_number, default=None)
    s.add_argument("--http-host", default=None)
    s.add_argument("--data-dir", default=None)
    s.add_argument("--db-url", default=None, help="SQLAlchemy URL of the history database (MUSTER_DB_URL)")
    s.add_argument("--name", default=None, help="replica name (default host-pid-random)")
    s.add_argument("--lease-ttl", type=whole_number, default=None, help="leader lease in seconds (default 5)")
    s.add_argument("--history-in-process", action="store_true",
                   help="write history from the server process instead of a historian process of its own")
    s.add_argument("--heartbeats-in-process", action="store_true",
                   help="read heartbeats in the server process instead of an ingest process of its own")
    s.add_argument("--heartbeat-interval", type=finite_float, default=None,
                   help="agents' heartbeat interval in seconds, for SUSPECT detection (default 5)")
    s.add_argument("--creds", dest="nats_creds", default=None,
                   help="NATS credentials: an nkey seed file (MUSTER_NATS_CREDS)")
    s.add_argument("--nats-ca", default=None, help="CA of the NATS servers' certificates (MUSTER_NATS_CA)")
    s.add_argument("--nats-cert", default=None, help="NATS client certificate (MUSTER_NATS_CERT)")
    s.add_argument("--nats-key", default=None, help="NATS client key (MUSTER_NATS_KEY)")
    s.add_argument("--tls-cert", default=None, help="serve HTTPS with this certificate (MUSTER_TLS_CERT)")
    s.add_argument("--tls-key", default=None, help="key of --tls-cert (MUSTER_TLS_KEY)")
    s.add_argument("--placement-policy", default=None, choices=POLICIES,
                   help="how a task's host is chosen: fgd (fragmentation-aware, the default) or binpack "
                        "(MUSTER_PLACEMENT_POLICY)")
    s.add_argument("--placement-candidates", type=whole_number, default=None,
                   help="fgd: feasible hosts compared per task (default 16; MUSTER_PLACEMENT_CANDIDATES)")
    s.set_defaults(fn=cmd_server)


def cmd_server(args: argparse.Namespace) -> int:
    import uvicorn

    from server.api.app import build_app
    from server.replica import Muster, ServerConfig
    from web.console import console_routes
    from wire.logs import setup as setup_logging

    setup_logging()
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
    if args.placement_candidates:
        cfg.placement_candidates = args.placement_candidates
    for opt in ("nats_creds", "nats_ca", "nats_cert", "nats_key", "tls_cert", "tls_key", "placement_policy"):
        if getattr(args, opt):
            setattr(cfg, opt, getattr(args, opt))
    scheme = "https" if cfg.tls_cert else "http"
    cfg.history_process = not args.history_in_process
    cfg.heartbeat_process = not args.heartbeats_in_process
    muster = Muster(cfg)
    # The replica is started and stopped here rather than in the app's lifespan, so that a
    # start still waiting for NATS can be given up.
    app = build_app(muster, routes=console_routes(), manage_lifecycle=False)
    started = False

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            nonlocal started
            # The replica's start waits for NATS for as long as it takes; a SIGTERM or
            # Ctrl-C meanwhile (uvicorn's handler sets should_exit) ends the wait and the
            # process (it used to be ignored until NATS answered: only kill -9 stopped it).
            starting = asyncio.ensure_future(muster.start())
            while not starting.done():
                if self.should_exit:
                    starting.cancel()
                    with contextlib.suppress(BaseException):
                        await starting
                    print("muster server: stopped before NATS could be reached", file=sys.stderr, flush=True)
                    return
                await asyncio.wait({starting}, timeout=0.2)
            starting.result()
            started = True
            await super().startup(sockets)
            if muster.new_token:
                # Its name is `operator`, as the docs call it, and its role admin (found by
                # exploring: announced as an "Operator token" alone, it read as the operator
                # role's).
                print(f"Operator token (its role is admin; shown once, also in {cfg.data_dir / 'token'}): "
                      f"{muster.new_token}", flush=True)
            print(f"muster server {cfg.name} listening on {scheme}://{cfg.http_host}:{cfg.http_port}", flush=True)

        async def shutdown(self, sockets: Any = None) -> None:
            await super().shutdown(sockets)
            if started:
                await muster.shutdown()

    config = uvicorn.Config(app, host=cfg.http_host, port=cfg.http_port, log_level="warning",
                            lifespan="on", timeout_graceful_shutdown=10,
                            proxy_headers=False,  # the app trusts MUSTER_TRUSTED_PROXIES (server.api.app)
                            ssl_certfile=cfg.tls_cert, ssl_keyfile=cfg.tls_key)
    Server(config).run()
    return 0
