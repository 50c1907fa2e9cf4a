"""`muster check` (the invariants over the recorded state, read from NATS) and `muster
schema` (the GraphQL SDL)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from server.cli.tokens import add_admin_nats, admin_nats


def register(sub: argparse._SubParsersAction) -> None:
    ck = sub.add_parser("check", help="verify the invariants over the recorded state")
    add_admin_nats(ck)
    ck.set_defaults(fn=cmd_check)

    sc = sub.add_parser("schema", help="print the GraphQL schema (SDL)")
    sc.set_defaults(fn=cmd_schema)


def cmd_check(args: argparse.Namespace) -> int:
    """Print each broken invariant and their count; exit 1 when any is broken. Reaches
    NATS as `muster token` does (the control plane's credentials, found under --data-dir
    when not given)."""
    from server.state.checker import run_check

    conn = admin_nats(args)
    problems = asyncio.run(run_check(conn.pop("url"), **conn))
    for p in problems:
        print(p)
    print(f"{len(problems)} invariant violations")
    return 1 if problems else 0


def cmd_schema(args: argparse.Namespace) -> int:
    from server.api.graphql import schema_sdl

    sys.stdout.write(schema_sdl())
    return 0
