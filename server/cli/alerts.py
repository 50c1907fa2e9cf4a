"""`muster alerts tail`, through the GraphQL API."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from server.cli.client import add_output, finite_float, gql, whole_number
from server.cli.errors import ApiError
from wire import subjects

POLL = 100  # alerts each poll reads, the newest first
MAX_LINES = 500  # the API's largest page
MIN_INTERVAL_S = 0.2


def _lines(text: str) -> int:
    n = whole_number(text)
    if not 0 <= n <= MAX_LINES:
        raise argparse.ArgumentTypeError(f"must be from 0 to {MAX_LINES}")
    return n


def _interval(text: str) -> float:
    v = finite_float(text)
    if v < MIN_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_INTERVAL_S:g} s")
    return v


def register(sub: argparse._SubParsersAction) -> None:
    al = sub.add_parser("alerts", help="follow alerts")
    alsub = al.add_subparsers(dest="alerts_cmd", required=True)
    at = alsub.add_parser("tail", help="print the last alerts, then new ones until Ctrl-C")
    # Each checked here (found by exploring: -n -1 printed all but one, --kind nope printed
    # nothing and exited 0, --interval 0 polled in a tight loop).
    at.add_argument("-n", "--lines", type=_lines, default=10, help=f"recent alerts to print first (0-{MAX_LINES})")
    at.add_argument("--kind", default=None, choices=sorted(subjects.ALERT_KINDS), metavar="KIND",
                    help=f'only this kind: {", ".join(sorted(subjects.ALERT_KINDS))}')
    at.add_argument("--interval", type=_interval, default=1.0,
                    help=f"seconds between polls (at least {MIN_INTERVAL_S:g})")
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
        failing = ""
        while True:
            time.sleep(args.interval)
            try:
                got = fetch(POLL)
            except ApiError as exc:
                # Followed through an outage (the server restarting, its history database
                # down): said once, and asked again (found by exploring: it exited at the
                # first error). A refused token still ends it (AuthError is not caught).
                if str(exc) != failing:
                    print(f"warning: {exc}; asking again every {args.interval:g} s", file=sys.stderr, flush=True)
                    failing = str(exc)
                continue
            if failing:
                print("alerts answer again", file=sys.stderr, flush=True)
                failing = ""
            new = [a for a in got if a["id"] not in seen]
            for a in reversed(new):  # oldest first
                seen.add(a["id"])
                show(a)
    except KeyboardInterrupt:
        return 0
