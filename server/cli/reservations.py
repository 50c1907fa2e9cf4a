"""`muster reservation`: advance reservations, hosts set aside for some queues' jobs over
a time window (list, show; create and delete: admin)."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from server.cli.client import add_output, gql, nonempty, out
from server.cli.errors import user_errors
from server.cli.hosts import selected_hosts
from server.cli.times import ahead, seconds, when_text
from server.timefmt import parse_time
from wire.errors import ConfigError, NotFound, ValidationError

FIELDS = "name description hosts hostCount queues users startsAt endsAt state by createdAt"


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("reservation", help="advance reservations: hosts set aside for queues over a time window")
    rsub = r.add_subparsers(dest="reservation_cmd", required=True)
    rl = rsub.add_parser("list", help="advance reservations, soonest first")
    add_output(rl)
    rl.set_defaults(fn=cmd_list)
    rs = rsub.add_parser("show", help="one advance reservation and its hosts")
    rs.add_argument("name")
    add_output(rs)
    rs.set_defaults(fn=cmd_show)
    rc = rsub.add_parser("create", help="set hosts aside for some queues' jobs from --start to --end (admin); "
                         "until it starts, other jobs take them only if their time limit ends them by then")
    rc.add_argument("name")
    rc.add_argument("ids", nargs="*", metavar="HOST", help="a host to set aside")
    rc.add_argument("--rack", type=nonempty, default=None, help="also every host of this rack (its `rack` label)")
    rc.add_argument("--label", type=nonempty, default=None, metavar="KEY=VALUE",
                    help="also every host with this label")
    rc.add_argument("--queues", default="", metavar="A,B", help="the queues whose jobs may use the hosts")
    rc.add_argument("--users", default="", metavar="U,V",
                    help="the users whose jobs, of any queue, may use them (queues, users or both)")
    rc.add_argument("--start", default=None, metavar="WHEN",
                    help="when it opens: ISO 8601 (UTC unless it names an offset) or a time from now (90m, 2h, "
                    "1d); default now")
    end = rc.add_mutually_exclusive_group(required=True)
    end.add_argument("--end", default=None, metavar="WHEN", help="when the hosts go back to every queue")
    end.add_argument("--duration", default=None, metavar="D", help="how long it lasts from its start (8h, 2d)")
    rc.add_argument("--description", default="")
    add_output(rc)
    rc.set_defaults(fn=cmd_create)
    rs2 = rsub.add_parser("set", help="change an advance reservation (admin); only what is given changes")
    rs2.add_argument("name")
    rs2.add_argument("--end", default=None, metavar="WHEN", help="a new end")
    rs2.add_argument("--duration", default=None, metavar="D", help="a new end, this long after its start (8h, 2d)")
    rs2.add_argument("--queues", default=None, metavar="A,B", help="the queues whose jobs may use the hosts ('' none)")
    rs2.add_argument("--users", default=None, metavar="U,V", help="the users whose jobs may use them ('' none)")
    rs2.add_argument("--description", default=None)
    add_output(rs2)
    rs2.set_defaults(fn=cmd_set)
    rd = rsub.add_parser("delete", help="give the hosts back to every queue (admin)")
    rd.add_argument("name")
    add_output(rd)
    rd.set_defaults(fn=cmd_delete)


def _row(r: dict[str, Any]) -> list[str]:
    return [r["name"], r["state"], str(r["hostCount"]), ",".join(r["queues"]) or "-", ",".join(r["users"]) or "-",
            when_text(r["startsAt"]), when_text(r["endsAt"]), r["by"]]


HEADERS = ["NAME", "STATE", "HOSTS", "QUEUES", "USERS", "STARTS", "ENDS", "BY"]


def cmd_list(args: argparse.Namespace) -> int:
    rs = gql(f"{{ advanceReservations {{ {FIELDS} }} }}")["advanceReservations"]
    out(args, rs, [_row(r) for r in rs], HEADERS)
    return 0


def _one(name: str) -> dict[str, Any]:
    r: dict[str, Any] | None = gql(f"query($n: String!) {{ advanceReservation(name: $n) {{ {FIELDS} }} }}",
                                   {"n": name})["advanceReservation"]
    if r is None:
        raise NotFound(f"no advance reservation {name}")
    return r


def cmd_show(args: argparse.Namespace) -> int:
    r = _one(args.name)
    if args.output == "json":
        out(args, r)
        return 0
    whom = " and ".join(x for x in (f"queues {', '.join(r['queues'])}" if r["queues"] else "",
                                    f"users {', '.join(r['users'])}" if r["users"] else "") if x)
    print(f"{r['name']}  {r['state']}  for {whom}  {r['description']}")
    print(f"  from {when_text(r['startsAt'])} to {when_text(r['endsAt'])}; made by {r['by']}")
    print(f"  {r['hostCount']} host(s): {' '.join(r['hosts'])}")
    return 0


MAX_DURATION_S = 10 * 365 * 86400.0  # what --duration takes


def _duration(text: str) -> float:
    got = seconds(text)
    if got is None:
        raise ConfigError(f"--duration {text!r}: a duration like 8h or 2d")
    if got > MAX_DURATION_S:  # (found by exploring: a traceback; the API takes much less anyway)
        raise ConfigError(f"--duration {text!r}: at most {MAX_DURATION_S // 86400:.0f}d")
    return got


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [x.strip() for x in text.split(",") if x.strip()]


def _send(args: argparse.Namespace, mutation: str, input_type: str, given: dict[str, Any]) -> int:
    """One reservation mutation with `given`; the reservation it returns, printed."""
    res = gql(f"""mutation($input: {input_type}!) {{ {mutation}(input: $input) {{
              reservation {{ {FIELDS} }} userErrors {{ field message code }} }} }}""", {"input": given})[mutation]
    if res["userErrors"]:
        raise user_errors(res["userErrors"])
    r = res["reservation"]
    out(args, r, [_row(r)], HEADERS)
    return 0


def cmd_create(args: argparse.Namespace) -> int:
    hosts = list(dict.fromkeys([*args.ids, *selected_hosts(args.rack, args.label)]))
    if not hosts:
        raise ValidationError("hosts", "name the hosts to set aside: ids, --rack R or --label KEY=VALUE")
    start = ahead(args.start)
    if args.end is not None:
        end = ahead(args.end)
    else:
        # From its start, or from now for one just past, which the server takes as now (found
        # by exploring: "4 minutes ago for 10 minutes" lasted 6).
        now = dt.datetime.now(dt.UTC)
        begins = max(parse_time(start), now) if start else now
        end = (begins + dt.timedelta(seconds=_duration(args.duration))).isoformat()
    given: dict[str, Any] = {"name": args.name, "hosts": hosts, "endsAt": end, "description": args.description,
                             "queues": _names(args.queues)}
    users = _names(args.users)
    if users:
        given["users"] = users
    if start is not None:
        given["startsAt"] = start
    return _send(args, "createAdvanceReservation", "AdvanceReservationInput", given)


def cmd_set(args: argparse.Namespace) -> int:
    given: dict[str, Any] = {"name": args.name}
    if args.end is not None and args.duration is not None:
        raise ConfigError("give --end or --duration, not both")
    if args.end is not None:
        given["endsAt"] = ahead(args.end)
    if args.duration is not None:
        cur = _one(args.name)
        given["endsAt"] = (parse_time(cur["startsAt"]) + dt.timedelta(seconds=_duration(args.duration))).isoformat()
    for key, value in (("queues", _names(args.queues)), ("users", _names(args.users)),
                       ("description", args.description)):
        if value is not None:
            given[key] = value
    return _send(args, "updateAdvanceReservation", "AdvanceReservationUpdate", given)


def cmd_delete(args: argparse.Namespace) -> int:
    res = gql("""mutation($n: String!) { deleteAdvanceReservation(name: $n) { deleted
              userErrors { field message code } } }""", {"n": args.name})["deleteAdvanceReservation"]
    if res["userErrors"]:
        raise user_errors(res["userErrors"])
    out(args, res, [[args.name, "deleted"]], ["NAME", "STATE"])
    return 0
