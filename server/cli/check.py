"""`muster check` (the invariants over the recorded state, read from NATS) and `muster
schema` (the GraphQL SDL)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys


def register(sub: argparse._SubParsersAction) -> None:
    ck = sub.add_parser("check", help="verify the invariants over the recorded state")
    ck.add_argument("--nats", default=None)
    ck.add_argument("--creds", default=None, help="NATS credentials (MUSTER_NATS_CREDS)")
    ck.set_defaults(fn=cmd_check)

    sc = sub.add_parser("schema", help="print the GraphQL schema (SDL)")
    sc.set_defaults(fn=cmd_schema)


def cmd_check(args: argparse.Namespace) -> int:
    """Print each broken invariant and their count; exit 1 when any is broken."""
    from server.broker.natsauth import find_auth_dir
    from server.state.checker import run_check

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
    from server.api.graphql import schema_sdl

    sys.stdout.write(schema_sdl())
    return 0
