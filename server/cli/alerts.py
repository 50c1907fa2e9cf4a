"""`muster alerts tail`, through the GraphQL API."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from server.cli.client import add_output, gql

POLL = 100  # alerts each poll reads, the newest first


def register(sub: argparse._SubParsersAction) -> None:
    al = sub.add_parser("alerts", help="follow alerts")
    alsub = al.add_subparsers(dest="alerts_cmd", required=True)
    at = alsub.add_parser("tail", help="print the last alerts, then new ones until Ctrl-C")
    at.add_argument("-n", "--lines", type=int, default=10, help="recent alerts to print first")
    at.add_argument("--kind", default=None, help='only this kind, e.g. "host.lost"')
    at.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
    add_output(at)
    at.set_defaults(fn=cmd_tail)


def cmd_tail(args: argparse.Namespace) -> int:
    """The last --lines alerts, then new ones as they are recorded (polls the `alerts`
    query every --interval seconds; Ctrl-C exits 0)."""
    q = """query($first: Int, $kind: String) { alerts(first: $first, kind: $kind) {
           edges { node { id kind ts hostId jobId message } } } }"""
    seen: set[str] = set()

    def show(a: dict[str, Any]) -> None:
        if args.output == "json":
            print(json.dumps(a), flush=True)
        else:
            where = " ".join(
                x for x in (a["hostId"] and f"host={a['hostId']}", a["jobId"] and f"job={a['jobId']}") if x
            )
            print(f"{(a['ts'] or '')[:19]}  {a['kind']:<18} {where}  {a['message']}".rstrip(), flush=True)

    def fetch(n: int) -> list[dict[str, Any]]:
        return [e["node"] for e in gql(q, {"first": n, "kind": args.kind})["alerts"]["edges"]]

    try:
        # The newest POLL alerts are known at once, whatever --lines shows of them: each
        # later poll reads the newest POLL, and one of those older than what was shown is
        # not new (it used to be printed as new, out of order).
        first = fetch(max(args.lines, POLL))
        for a in reversed(first[: args.lines]):
            show(a)
        seen.update(a["id"] for a in first)
        while True:
            time.sleep(args.interval)
            new = [a for a in fetch(POLL) if a["id"] not in seen]
            for a in reversed(new):  # oldest first
                seen.add(a["id"])
                show(a)
    except KeyboardInterrupt:
        return 0
