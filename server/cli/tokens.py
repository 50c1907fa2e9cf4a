"""`muster token create|list|revoke`: API tokens, written to NATS directly (no server
needed), with the control plane's NATS credentials."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from server.cli.client import add_output, out
from server.timefmt import duration_s as seconds
from server.timefmt import iso_utc
from wire import subjects
from wire.errors import ConfigError, NotFound, StoreError

# The file in its data dir where `muster up` writes the URL of the NATS it started.
NATS_URL_FILE = "nats-url"


def register(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("token", help="create, list and revoke API tokens (talks to NATS directly)")
    tsub = t.add_subparsers(dest="token_cmd", required=True)
    tc = tsub.add_parser("create", help="a new token, printed once (only its hash is stored)")
    tc.add_argument("name")
    tc.add_argument("--role", choices=["viewer", "operator", "admin"], required=True)
    tc.add_argument("--queues", default=None, help="comma-separated queues the token may submit to and cancel in; "
                    "a token bound to queues cannot act on hosts (default: any queue, and hosts)")
    tc.add_argument("--expires", default=None, metavar="DURATION",
                    help="how long it works, such as 90d, 12h or 30m (default: until revoked); its key expires then "
                         "too, and every replica refuses it")
    add_admin_nats(tc)
    tc.set_defaults(fn=cmd_token)
    tl = tsub.add_parser("list", help="API tokens: name, role, queues (never the secret)")
    add_admin_nats(tl)
    add_output(tl)
    tl.set_defaults(fn=cmd_token)
    tr = tsub.add_parser("revoke", help="a token no longer works, from its next request on")
    tr.add_argument("name")
    add_admin_nats(tr)
    tr.set_defaults(fn=cmd_token)


def add_admin_nats(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--nats", default=None, help="NATS URL(s) (MUSTER_NATS_URL)")
    sp.add_argument("--creds", default=None, help="control-plane credentials (MUSTER_NATS_CREDS)")
    sp.add_argument("--nats-ca", default=os.environ.get("MUSTER_NATS_CA"))
    sp.add_argument("--nats-cert", default=os.environ.get("MUSTER_NATS_CERT"))
    sp.add_argument("--nats-key", default=os.environ.get("MUSTER_NATS_KEY"))
    sp.add_argument("--data-dir", default=os.environ.get("MUSTER_DATA_DIR", ".muster"),
                    help="where to find the credentials when --creds is not given, and the NATS URL of a "
                         "`muster up` there when --nats is not")


def admin_nats(args: argparse.Namespace) -> dict[str, Any]:
    """How `muster token` reaches NATS: --nats, MUSTER_NATS_URL, else the URL a `muster up`
    wrote in --data-dir, else the default; with the control plane's credentials (--creds,
    MUSTER_NATS_CREDS, else server.nk found under --data-dir)."""
    from server.broker.natsauth import find_auth_dir

    creds = args.creds or os.environ.get("MUSTER_NATS_CREDS")
    if not creds:
        found = find_auth_dir(args.data_dir) / "server.nk"
        if found.exists():
            creds = str(found)
    url = args.nats or os.environ.get("MUSTER_NATS_URL")
    if not url:
        written = Path(args.data_dir) / NATS_URL_FILE
        url = written.read_text().strip() if written.exists() else "nats://127.0.0.1:4222"
    return {"url": url, "creds": creds,
            "tls_ca": args.nats_ca, "tls_cert": args.nats_cert, "tls_key": args.nats_key}


def cmd_token(args: argparse.Namespace) -> int:
    from server.api.tokens import create_token, list_tokens, revoke_token
    from wire.kv import Store, connect_once
    from wire.messages import DEFAULT_QUEUE

    opts = admin_nats(args)

    async def run() -> int:
        nc = await connect_once(opts.pop("url"), "muster-token-cli", **opts)
        try:
            store = Store(nc)
            if args.token_cmd == "create":
                queues = [q.strip() for q in args.queues.split(",") if q.strip()] if args.queues is not None else None
                expires_s = None
                if args.expires is not None and (expires_s := seconds(args.expires)) is None:
                    raise ConfigError(f"--expires {args.expires!r} is not a duration such as 90d, 12h or 30m")
                token, info = await create_token(store, args.name, args.role, queues, expires_s)
                bound = f", queues {', '.join(info.queues)}" if info.queues else ""
                if info.expires_at:
                    bound += f", expires {iso_utc(info.expires_at)[:19]} UTC"
                print(f"Token {info.name!r} ({info.role}{bound}) created; it is shown only this once:",
                      file=sys.stderr)
                print(token, flush=True)
                # After the token, which is shown only once (a review: a failed look here lost it).
                for q in info.queues or ():
                    try:
                        missing = q != DEFAULT_QUEUE and (await store.get(subjects.queue_key(q))).value is None
                    except StoreError:
                        break
                    if missing:
                        print(f"warning: there is no queue {q!r} (yet): the token cannot submit to it until one is "
                              "created", file=sys.stderr)
            elif args.token_cmd == "list":
                tokens = await list_tokens(store)
                rows = sorted(([i.name, i.role, ",".join(i.queues) if i.queues else "*",
                                iso_utc(i.created_at)[:19],  # UTC, as every other list prints times
                                iso_utc(i.expires_at)[:19] if i.expires_at else "-",
                                h[:12]] for h, i in tokens.items() if not i.expired()), key=lambda r: r[0])
                out(args, [{"name": i.name, "role": i.role, "queues": i.queues, "createdAt": iso_utc(i.created_at),
                            "expiresAt": iso_utc(i.expires_at) if i.expires_at else None, "hash": h}
                           for h, i in tokens.items() if not i.expired()], rows,
                    ["NAME", "ROLE", "QUEUES", "CREATED", "EXPIRES", "HASH"])
            else:  # revoke
                n = await revoke_token(store, args.name)
                if n == 0:
                    raise NotFound(f"no token named {args.name!r}")
                print(f"revoked {n} token(s) named {args.name!r}")
            return 0
        finally:
            await nc.close()

    return asyncio.run(run())
