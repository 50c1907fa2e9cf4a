"""`muster host list|show|cordon|uncordon|drain|clear-gpu-faults|label`, through the GraphQL API."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import sys
import time
from collections.abc import Iterator
from typing import Any

from server.cli.client import (
    add_output,
    add_watch,
    finite_float,
    gql,
    labels_text,
    nonempty,
    out,
    watch,
    whole_number,
)
from server.cli.errors import user_errors
from server.cli.times import ahead, when_text
from server.timefmt import DRAIN_DEADLINE_S, PAST_START_SLACK_S, parse_time
from wire.errors import MusterError, NotFound, ValidationError


def register(sub: argparse._SubParsersAction) -> None:
    h = sub.add_parser("host", help="list and show hosts; cordon, drain and uncordon them; clear GPU faults; label "
                       "them")
    hsub = h.add_subparsers(dest="host_cmd", required=True)

    hl = hsub.add_parser("list", help="hosts with health, GPUs, utilisation and labels")
    hl.add_argument("--limit", type=whole_number, default=500)
    hl.add_argument("--health", default=None, help="HEALTHY, SUSPECT, LOST (comma-separated)")
    hl.add_argument("--rack", type=nonempty, default=None)
    hl.add_argument("--zone", type=nonempty, default=None)
    hl.add_argument("--gpu-model", type=nonempty, default=None)
    hl.add_argument("--label", type=nonempty, default=None, help="key=value (or key)")
    hl.add_argument("--search", type=nonempty, default=None, help="part of the host id, in any case")
    hl.add_argument("--cordoned", default=None, action=argparse.BooleanOptionalAction)
    hl.add_argument("--draining", default=None, action=argparse.BooleanOptionalAction,
                    help="hosts whose drain has begun (or, --no-draining, has not)")
    hl.add_argument("--drain-scheduled", default=None, action=argparse.BooleanOptionalAction,
                    help="hosts with a drain scheduled ahead (drain --at) that has not begun")
    hl.add_argument("--gpu-faults", default=None, action=argparse.BooleanOptionalAction,
                    help="hosts with (or, --no-gpu-faults, without) a faulted GPU")
    hl.add_argument("--pressure", default=None, action=argparse.BooleanOptionalAction,
                    help="hosts whose agent asks for no new work (or, --no-pressure, not)")
    add_output(hl)
    add_watch(hl)
    hl.set_defaults(fn=cmd_list)

    hs = hsub.add_parser("show", help="one host: its GPUs, telemetry and tasks")
    hs.add_argument("id")
    add_output(hs)
    hs.set_defaults(fn=cmd_show)

    for name, what in (("cordon", "no new work on the host; what runs there goes on"),
                       ("uncordon", "the host takes new work again (also ends a drain)")):
        hc = hsub.add_parser(name, help=what)
        hc.add_argument("ids", nargs="*", metavar="ID", help="host id (several: each alike)")
        hc.add_argument("--rack", type=nonempty, default=None,
                        help="also every host of this rack (its `rack` label)")
        hc.add_argument("--label", type=nonempty, default=None, metavar="KEY=VALUE",
                        help="also every host with this label")
        hc.add_argument("--reason", default="", required=(name == "cordon"))
        add_output(hc)
        hc.set_defaults(fn=cmd_cordon)

    hd = hsub.add_parser("drain", help="cordon, then stop what still runs after --deadline seconds; with --at, "
                         "from a time ahead (a maintenance window)")
    hd.add_argument("ids", nargs="*", metavar="ID", help="host id (several: each drained alike)")
    hd.add_argument("--rack", type=nonempty, default=None, help="also every host of this rack (its `rack` label)")
    hd.add_argument("--label", type=nonempty, default=None, metavar="KEY=VALUE",
                    help="also every host with this label")
    hd.add_argument("--reason", required=True)
    hd.add_argument("--deadline", type=finite_float, default=DRAIN_DEADLINE_S,
                    help=f"seconds before running work is stopped ({DRAIN_DEADLINE_S:g})")
    hd.add_argument("--at", default=None, metavar="WHEN",
                    help="when the drain begins: ISO 8601 (UTC unless it names an offset) or a time from now "
                    "(90m, 2h, 1d); until then the host takes only jobs whose time limit ends them by the deadline")
    add_output(hd)
    hd.set_defaults(fn=cmd_drain)

    hg = hsub.add_parser("clear-gpu-faults",
                         help="clear GPU fault marks of a host after those GPUs were reset or replaced")
    hg.add_argument("id")
    hg.add_argument("--reason", required=True)
    hg.add_argument("--gpu", type=whole_number, action="append", default=None, dest="gpus",
                    help="a GPU index to clear (repeat for more; default: every faulted GPU)")
    add_output(hg)
    hg.set_defaults(fn=cmd_clear_gpu_faults)

    hb = hsub.add_parser("label", help="set or remove the operator's labels of hosts (admin): they override what "
                         "agents report, and are the only source of the keys only operators set")
    hb.add_argument("items", nargs="*", metavar="HOST|KEY=VALUE",
                    help="host ids and the labels to set on each (KEY=VALUE)")
    hb.add_argument("--remove", action="append", default=[], metavar="KEY",
                    help="a key of the operator's labels to remove (repeat, or comma-separated)")
    hb.add_argument("--rack", type=nonempty, default=None, help="also every host of this rack (its `rack` label)")
    hb.add_argument("--label", type=nonempty, default=None, metavar="KEY=VALUE",
                    help="also every host with this label")
    hb.add_argument("--reason", default="")
    add_output(hb)
    hb.set_defaults(fn=cmd_label)


def cmd_list(args: argparse.Namespace) -> int:
    q = """query($first: Int, $filter: HostFilter) { hosts(first: $first, filter: $filter) { totalCount
           edges { node { id health cordoned draining drainAt leaving pressure simulated gpus gpuModel gpusAllocated
           gpuUtilPct cpus memoryMb labels { key value } } } } }"""
    flt: dict[str, Any] = {k: v for k, v in (
        # Stripped, as job list's --state is: "HEALTHY, LOST" was refused (found by exploring).
        ("health", [h.strip().upper() for h in args.health.split(",") if h.strip()] if args.health else None),
        ("rack", args.rack), ("zone", args.zone), ("gpuModel", args.gpu_model), ("label", args.label),
        ("search", args.search)) if v}
    for key, value in (("cordoned", args.cordoned), ("draining", args.draining),
                       ("drainScheduled", args.drain_scheduled)):
        if value is not None:
            flt[key] = value
    if args.gpu_faults is not None:
        flt["gpuFaults"] = args.gpu_faults
    if args.pressure is not None:
        flt["pressure"] = args.pressure

    def render() -> None:
        data = gql(q, {"first": args.limit, "filter": flt or None}, optional=("drainAt", "pressure"))["hosts"]
        rows = [host_row(e["node"]) for e in data["edges"]]
        out(args, data, rows, ["ID", "HEALTH", "GPUS", "GPU UTIL", "CPUS", "LABELS"])
        if args.output != "json" and data["totalCount"] > len(rows):
            # As job list says it (found by exploring: host list stopped at --limit silently).
            print(f"{len(rows)} of {data['totalCount']} hosts shown (--limit N for more)", file=sys.stderr)

    return watch(args, render)


def cmd_show(args: argparse.Namespace) -> int:
    q = """query($id: ID!) { host(id: $id) { id health cordoned draining leaving pressure simulated gpus gpuModel
           gpusAllocated
           gpusUnhealthy gpuUtilPct cpus cpuPct memoryMb memUsedMb lastSeen tasks labels { key value }
           operatorLabels { key value } agentLabels { key value }
           gpuDevices { index model memoryMb healthy fault shareAllocated memAllocatedMb tasks sharing
           utilPct memUsedMb tempC powerW migInstances { uuid profile memoryMb allocated } } isolated isolation
           fences lastFenceSeconds fenceContinued fenceStopped reservedFor drainAt drainDeadline
           setAside { name queues users startsAt endsAt state } }
           attempts(hostId: $id, first: 10, newestFirst: true) { totalCount edges { node {
           id jobId number state exitCode placedAt } } } }"""
    data = gql(q, {"id": args.id}, optional=("reservedFor", "drainAt", "drainDeadline", "setAside", "pressure",
                                             "operatorLabels", "agentLabels"))
    h = data["host"]
    if h is None:
        raise NotFound(f"no host {args.id}")
    h["recentAttempts"] = [e["node"] for e in data["attempts"]["edges"]]
    if args.output == "json":
        out(args, h)
        return 0
    flags = " ".join(f for f, on in (("CORDONED", h["cordoned"]), ("DRAINING", h["draining"]),
                                      ("LEAVING", h["leaving"]),
                                      ("SIMULATED", h["simulated"]), ("NOT-ISOLATED", h["isolated"] is False))
                     if on)
    print(f"{h['id']}  {h['health']}  {flags}".rstrip())
    if h.get("pressure"):
        print(f"  takes no new work: {h['pressure']}")
    if h.get("drainAt"):
        print(f"  drain scheduled from {when_text(h['drainAt'])}, what still runs then stopped at "
              f"{when_text(h['drainDeadline'])}: until then only jobs whose time limit ends them by then are placed "
              "here")
    elif h["draining"] and h.get("drainDeadline"):
        print(f"  draining: what still runs is stopped at {when_text(h['drainDeadline'])}")
    for r in h.get("setAside") or []:
        whom = ", ".join([*r["queues"], *(f"user {u}" for u in r.get("users") or [])])
        print(f"  set aside for {whom} from {when_text(r['startsAt'])} to {when_text(r['endsAt'])} "
              f"(advance reservation {r['name']}, {r['state'].lower()})")
    if h.get("reservedFor"):
        print(f"  reserved for job {h['reservedFor']}: other jobs are placed here only if their time limit ends "
              "them before it could start (muster job why " + h["reservedFor"] + ")")
    lost = h["health"] == "LOST"  # its telemetry is its last heartbeat's, stale: not shown
    print(f"  gpus:    {h['gpusAllocated']}/{h['gpus']} allocated, {h['gpusUnhealthy']} unhealthy, {h['gpuModel']}"
          + (f", util {figure(h['gpuUtilPct'], '{}%')}" if not lost else " (LOST: no telemetry)"))
    for g in h["gpuDevices"]:
        print(f"    GPU {g['index']} {g['model']} {g['memoryMb']} MB: {gpu_line(g)}")
        if not lost:  # (a figure its agent could not read: "-")
            print(f"      util {figure(g['utilPct'], '{:.0f}%')}, memory {figure(g['memUsedMb'], '{}')}/"
                  f"{g['memoryMb']} MB, {figure(g['tempC'], '{:.0f} °C')}, {figure(g['powerW'], '{:.0f} W')}")
    print(f"  cpus:    {h['cpus']}" + (f" ({h['cpuPct']}% busy)" if not lost else ""))
    print("  memory:  " + (f"{h['memUsedMb']}/{h['memoryMb']} MB" if not lost else f"{h['memoryMb']} MB"))
    print(f"  tasks:   {h['tasks']}")
    for line in labels_lines(h):
        print(line)
    print(f"  isolation: {h['isolation'] or '-'}")
    if h["fences"]:
        print(f"  fences:  {h['fences']} since the agent started, the last {h['lastFenceSeconds']:.1f} s;"
              f" frozen attempts continued {h['fenceContinued']}, stopped {h['fenceStopped']}")
    print(f"  seen:    {(h['lastSeen'] or '-')[:19]}")
    if h["recentAttempts"]:
        print(f"  recent attempts ({data['attempts']['totalCount']} in all):")
        for a in h["recentAttempts"]:
            code = "" if a["exitCode"] is None else f" exit={a['exitCode']}"
            print(f"    {a['jobId']} #{a['number']} {a['state']}{code}  {(a['placedAt'] or '')[:19]}")
    return 0


def targets_of(args: argparse.Namespace, verb: str) -> list[str]:
    """The hosts a command names: its ids, then those `--rack` and `--label` select, each once."""
    targets = list(dict.fromkeys([*args.ids, *selected_hosts(args.rack, args.label)]))
    if not targets:
        raise ValidationError("id", f"name the hosts to {verb}: ids, --rack R or --label KEY=VALUE")
    return targets


def cmd_cordon(args: argparse.Namespace) -> int:
    """`cordon` and `uncordon` each host named; stops at the first host refused."""
    field = "cordonHost" if args.host_cmd == "cordon" else "uncordonHost"
    q = f"""mutation($input: HostActionInput!) {{ {field}(input: $input) {{
            host {{ id health cordoned }} userErrors {{ field message code }} }} }}"""
    hosts: list[dict[str, Any]] = []
    with changed_before_refusal(f"{args.host_cmd}ed", hosts):
        for host_id in targets_of(args, args.host_cmd):
            res = gql(q, {"input": {"id": host_id, "reason": args.reason}})[field]
            if res["userErrors"]:
                raise user_errors(res["userErrors"])
            hosts.append(res["host"])
    rows = [[h["id"], h["health"], "yes" if h["cordoned"] else "no"] for h in hosts]
    out(args, hosts if len(hosts) > 1 else hosts[0], rows, ["ID", "HEALTH", "CORDONED"])
    return 0


def cmd_clear_gpu_faults(args: argparse.Namespace) -> int:
    q = """mutation($input: ClearGpuFaultsInput!) { clearGpuFaults(input: $input) {
           host { id health gpusUnhealthy } userErrors { field message code } } }"""
    res = gql(q, {"input": {"id": args.id, "reason": args.reason, "gpus": args.gpus}})["clearGpuFaults"]
    if res["userErrors"]:
        raise user_errors(res["userErrors"])
    h = res["host"]
    # The agent clears its marks once the leader has passed the clear on: a heartbeat later.
    out(args, h, [[h["id"], h["health"], str(h["gpusUnhealthy"])]], ["ID", "HEALTH", "GPUS UNHEALTHY (BEFORE)"])
    return 0


def cmd_label(args: argparse.Namespace) -> int:
    """Set and remove the operator's labels of each host named; stops at the first host
    refused. Items with `=` are labels, the others host ids (a host id has no `=`)."""
    labels: dict[str, str] = {}
    ids: list[str] = []
    for item in args.items:
        key, eq, value = item.partition("=")
        if not eq:
            ids.append(item)
        elif not key.strip():
            raise ValidationError("labels", f"{item!r} is not KEY=VALUE")
        elif key.strip() in labels and labels[key.strip()] != value.strip():
            raise ValidationError("labels", f"{key.strip()} is given twice")
        else:
            labels[key.strip()] = value.strip()
    remove = list(dict.fromkeys(k.strip() for r in args.remove for k in r.split(",") if k.strip()))
    if not labels and not remove:
        raise ValidationError("labels", "give labels to set (KEY=VALUE) or keys to remove (--remove KEY)")
    args.ids = ids
    q = """mutation($input: SetHostLabelsInput!) { setHostLabels(input: $input) {
           host { id health labels { key value } operatorLabels { key value } } userErrors { field message code } } }"""
    hosts: list[dict[str, Any]] = []
    with changed_before_refusal("labelled", hosts):
        for host_id in targets_of(args, "label"):
            res = gql(q, {"input": {"id": host_id, "labels": labels, "remove": remove, "reason": args.reason}})
            res = res["setHostLabels"]
            if res["userErrors"]:
                raise user_errors(res["userErrors"])
            hosts.append(res["host"])
    rows = [[h["id"], labels_text(h["operatorLabels"]) or "-", labels_text(h["labels"]) or "-"] for h in hosts]
    out(args, hosts if len(hosts) > 1 else hosts[0], rows, ["ID", "OPERATOR'S LABELS", "LABELS"])
    return 0


# How long past the start of a drain of many hosts the hosts left are still given that
# start (the server takes one up to PAST_START_SLACK_S past as now, its deadline reckoned
# from it); later ones are drained from now, their deadline later (never earlier).
DRAIN_START_KEPT_S = PAST_START_SLACK_S / 2


def cmd_drain(args: argparse.Namespace) -> int:
    """Drain each host named, now or from `--at`; stops at the first host refused. Every
    host is given one start, so that they share one deadline (found by exploring: a rack
    drained `--at` a few seconds ahead got deadlines that differed host to host, those
    drained once the start had passed reckoned from when each was): the time given, or,
    without `--at`, the time the server drained the first host at."""
    q = """mutation($input: DrainHostInput!) { drainHost(input: $input) {
           host { id health cordoned draining drainAt drainDeadline } userErrors { field message code } } }"""
    at = ahead(args.at)
    start = parse_time(at).timestamp() if at is not None else None
    begun: float | None = None  # (time.monotonic()) when the server told the start of a drain now
    hosts: list[dict[str, Any]] = []
    late: list[str] = []
    with changed_before_refusal("drained", hosts):
        for host_id in targets_of(args, "drain"):
            given: dict[str, Any] = {"id": host_id, "reason": args.reason, "deadlineSeconds": args.deadline}
            # The first host is sent the time as given, which the server judges.
            past = (time.time() - start) if start is not None else \
                (time.monotonic() - begun) if begun is not None else 0.0
            if at is not None and (not hosts or past <= DRAIN_START_KEPT_S):
                given["at"] = at
            elif at is not None:
                late.append(host_id)
            res = gql(q, {"input": given}, optional=("drainAt", "drainDeadline"))["drainHost"]
            if res["userErrors"]:
                raise user_errors(res["userErrors"])
            hosts.append(res["host"])
            if at is None and res["host"].get("drainDeadline"):
                # Drained now: the others are given the start the server took.
                at = (parse_time(res["host"]["drainDeadline"]) - dt.timedelta(seconds=args.deadline)).isoformat()
                begun = time.monotonic()
    if late:
        print(f"drained from when each was, the start {DRAIN_START_KEPT_S:g} s and more past, their deadline later: "
              f"{', '.join(late)}", file=sys.stderr)
    rows = [[h["id"], h["health"], f"drain from {when_text(h['drainAt'])}" if h.get("drainAt") else "draining",
             when_text(h.get("drainDeadline"))] for h in hosts]
    out(args, hosts if len(hosts) > 1 else hosts[0], rows, ["ID", "HEALTH", "STATE", "RUNNING WORK STOPPED AT"])
    return 0


@contextlib.contextmanager
def changed_before_refusal(done: str, hosts: list[dict[str, Any]]) -> Iterator[None]:
    """A command acting on hosts one by one that stops at an error says on stderr which
    hosts it had already changed (`done`: cordoned, drained ...), before the error (found
    by exploring: `host cordon ex-2 nosuch` said only `no host nosuch`, ex-2 cordoned)."""
    try:
        yield
    except (MusterError, KeyboardInterrupt) as exc:
        if hosts:
            when = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else "the refusal"
            print(f"{done} before {when}: {', '.join(h['id'] for h in hosts)}", file=sys.stderr)
        raise


MAX_SELECTED_HOSTS = 10_000  # hosts one drain by --rack or --label takes in (a rack, a zone's racks)


def selected_hosts(rack: str | None, label: str | None) -> list[str]:
    """The ids of the hosts a --rack or --label selects (none when neither is given), read
    a page of 500 at a time."""
    if rack is None and label is None:
        return []
    for option, value in (("rack", rack), ("label", label)):
        if value is not None and not value.strip():  # (taken for no filter, it selected every host)
            raise ValidationError(option, f"--{option} is empty: it would select every host")
    q = """query($first: Int, $after: String, $filter: HostFilter) { hosts(first: $first, after: $after,
           filter: $filter) { totalCount edges { node { id } } pageInfo { hasNextPage endCursor } } }"""
    flt = {k: v for k, v in (("rack", rack), ("label", label)) if v is not None}
    ids: list[str] = []
    after = None
    while True:
        data = gql(q, {"first": 500, "after": after, "filter": flt})["hosts"]
        if data["totalCount"] > MAX_SELECTED_HOSTS:
            raise ValidationError("rack" if rack else "label", f"selects {data['totalCount']} hosts, more than "
                                  f"{MAX_SELECTED_HOSTS} at once: narrow it")
        ids += [e["node"]["id"] for e in data["edges"]]
        if not data["pageInfo"]["hasNextPage"]:
            break
        after = data["pageInfo"]["endCursor"]
    if not ids:
        raise NotFound(f"no host with {' and '.join(f'{k} {v}' for k, v in flt.items())}")
    return ids


def labels_lines(h: dict[str, Any]) -> list[str]:
    """`host show`'s labels: those placement reads, each the operator's marked `*`, then
    what the agent reports that is not in effect (a key only operators set, or one the
    operator set otherwise)."""
    ops = {lb["key"] for lb in h.get("operatorLabels") or []}
    shown = ",".join(f"{lb['key']}={lb['value']}{'*' if lb['key'] in ops else ''}" for lb in h["labels"]) or "-"
    lines = [f"  labels:  {shown}" + ("  (* the operator's)" if ops else "")]
    have = {lb["key"]: lb["value"] for lb in h["labels"]}
    ignored = [lb for lb in h.get("agentLabels") or [] if have.get(lb["key"]) != lb["value"]]
    if ignored:
        lines.append(f"  agent's labels not in effect: {labels_text(ignored)}")
    return lines


def host_row(n: dict[str, Any]) -> list[str]:
    """One host of `host list`: a draining host says DRAINING (it is cordoned too); one whose
    agent is shutting down, LEAVING."""
    return [
        n["id"],
        n["health"] + (" DRAINING" if n.get("draining") else " CORDONED" if n["cordoned"] else "")
        + (f" DRAIN AT {when_text(n['drainAt'])}" if n.get("drainAt") else "")
        + (" LEAVING" if n.get("leaving") else "") + (" PRESSURE" if n.get("pressure") else ""),
        f"{n['gpusAllocated']}/{n['gpus']} {n['gpuModel']}" + (" (simulated)" if n["simulated"] else ""),
        figure(n["gpuUtilPct"], "{}%") if n["health"] != "LOST" else "-",  # a lost host's last figure is stale
        str(n["cpus"]),
        labels_text(n["labels"]),
    ]


def figure(value: float | None, fmt: str) -> str:
    """A telemetry figure as `fmt` shows it; "-" for null (no GPUs, or not read)."""
    return "-" if value is None else fmt.format(value)


def gpu_line(g: dict[str, Any]) -> str:
    """What is allocated of one GPU, in words."""
    health = "" if g["healthy"] else f" (faulty: {g.get('fault') or 'unhealthy'})"
    if g["migInstances"]:
        used = sum(m["allocated"] for m in g["migInstances"])
        names = ", ".join(f"{m['profile']}{'*' if m['allocated'] else ''}" for m in g["migInstances"])
        return f"MIG mode, {used}/{len(g['migInstances'])} instances allocated ({names}){health}"
    if g["sharing"]:
        return (f"{g['shareAllocated']}/1000 allocated to {g['tasks']} tasks, {g['memAllocatedMb']} MB of its "
                f"memory ({g['sharing']}){health}")
    return ("allocated whole" if g["shareAllocated"] else "free") + health
