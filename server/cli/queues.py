"""`muster queue list|show|create|set|delete` and `muster usage`, through the GraphQL API
(managing queues needs an admin token)."""

from __future__ import annotations

import argparse
import math
from typing import Any

from server.cli.client import (
    add_output,
    add_watch,
    finite_float,
    gql,
    key_values,
    labels_text,
    out,
    watch,
    whole_number,
)
from server.cli.errors import user_errors
from server.cli.times import ago, when_text
from server.timefmt import duration_text
from wire.errors import ConfigError, NotFound
from wire.messages import Queue

QUEUE_FIELDS = """name description cohort weight pendingCount parkedCount runningCount fairShare dominantShare
entitledShare preemptWithin reclaim fairSharePreemption preemptGraceSeconds minRuntimeSeconds maxPreemptions
defaultTimeLimitSeconds maxTimeLimitSeconds maxGpusPerUser maxSubmittedJobs maxSubmittedJobsPerUser submittedJobs
maxRunningJobsPerUser fairShareUsers hostLabels { key value } submittedJobsByUser(first: 5) { user jobs }
users(first: 5) { user gpus jobs pastGpus pastJobs jobsNotEnded }
advanceReservations { name hostCount startsAt endsAt state }
resources { resource nominal borrowingLimit lendingLimit used borrowed lent }"""
# Fields a server of an earlier version lacks: asked again without them.
NEWER_QUEUE_FIELDS = ("parkedCount", "maxGpusPerUser", "maxSubmittedJobs", "maxSubmittedJobsPerUser", "submittedJobs",
                      "submittedJobsByUser", "maxRunningJobsPerUser", "hostLabels",
                      "fairShareUsers", "users", "advanceReservations")


def _default(field: str) -> str:
    """A queue setting's default as the help shows it (the record's own default)."""
    v = Queue.model_fields[field].default
    return ("on" if v else "off") if isinstance(v, bool) else f"{v:g}"


def register(sub: argparse._SubParsersAction) -> None:
    q = sub.add_parser("queue", help="list, show, create, change and delete queues")
    qsub = q.add_subparsers(dest="queue_cmd", required=True)
    ql = qsub.add_parser("list", help="queues with quota, use, borrowing and fair share")
    add_output(ql)
    add_watch(ql)
    ql.set_defaults(fn=cmd_list)
    qs = qsub.add_parser("show", help="one queue: its settings and each resource's quota and use")
    qs.add_argument("name")
    add_output(qs)
    qs.set_defaults(fn=cmd_show)
    for name, fn, text in (("create", cmd_create, "create a queue (admin)"),
                           ("set", cmd_set, "change a queue's settings (admin); only those given change")):
        p = qsub.add_parser(name, help=text)
        p.add_argument("name")
        p.add_argument("--quota", action="append", default=None, metavar="RESOURCE=NOMINAL[:BORROW[:LEND]]",
                       help="a resource's quota, e.g. gpu:H100=8:4:2 (borrow up to 4 more, lend at most 2; NOMINAL "
                            "a number, BORROW or LEND '-' for no limit); repeat for each resource (cpu, "
                            "memory_mb, gpu:<model>); with `set` the given quotas replace the whole quota "
                            "('--quota none' removes it)")
        p.add_argument("--cohort", default=None, help="the cohort to borrow and lend in ('' for none, with set)")
        p.add_argument("--weight", type=finite_float, default=None,
                       help=f"fair-share weight (default {_default('weight')})")
        p.add_argument("--description", default=None, help="what the queue is for (shown in listings)")
        p.add_argument("--preempt-within", choices=["on", "off"], default=None,
                       help=f"priority preemption within the queue (default {_default('preempt_within')})")
        p.add_argument("--reclaim", choices=["on", "off"], default=None,
                       help=f"take back what others borrowed of its nominal quota (default {_default('reclaim')})")
        p.add_argument("--fair-share-preemption", choices=["on", "off"], default=None,
                       help="preempt queues above their fair share for it "
                            f"(default {_default('fair_share_preemption')})")
        p.add_argument("--fair-share-users", choices=["on", "off"], default=None,
                       help="fair share between the queue's users: at equal priority, the user whose jobs hold "
                            "least (with past use, decayed) goes next "
                            f"(default {_default('fair_share_users')}: submission order)")
        p.add_argument("--grace", type=finite_float, default=None, metavar="S",
                       help=f"SIGTERM to SIGKILL when preempted: the victim's checkpoint window "
                            f"(default {_default('preempt_grace_s')})")
        p.add_argument("--min-runtime", type=finite_float, default=None, metavar="S",
                       help="a try runs at least this long before it may be preempted "
                            f"(default {_default('min_runtime_s')})")
        p.add_argument("--max-preemptions", type=whole_number, default=None, metavar="N",
                       help="the most victims stopping for the queue's jobs at once "
                            f"(default {_default('max_preemptions')})")
        p.add_argument("--default-time-limit", type=finite_float, default=None, metavar="S",
                       help="the time limit of a job that gives none (0: none)")
        p.add_argument("--max-time-limit", type=finite_float, default=None, metavar="S",
                       help="the longest time limit a job may ask (0: no maximum)")
        p.add_argument("--max-gpus-per-user", type=finite_float, default=None, metavar="N",
                       help="the most GPUs one user's jobs of the queue hold at once (0: no limit)")
        p.add_argument("--max-submitted-jobs", type=whole_number, default=None, metavar="N",
                       help="the most jobs not ended (queued, held, placed, running) the queue takes; a submission "
                            "past it is refused (0: no limit)")
        p.add_argument("--max-submitted-jobs-per-user", type=whole_number, default=None, metavar="N",
                       help="the same for one user's jobs of the queue (0: no limit)")
        p.add_argument("--max-running-jobs-per-user", type=whole_number, default=None, metavar="N",
                       help="the most jobs of one user's placed or running at once; the others wait (0: no limit)")
        p.add_argument("--host-label", action="append", default=None, metavar="KEY=VALUE", dest="host_labels",
                       help="a label every host that runs the queue's jobs has (repeat for more; replaces the "
                            "queue's labels; added to each job's host labels when it is placed)")
        if name == "set":
            p.add_argument("--no-host-labels", action="store_true", help="the queue's jobs run on any host")
        add_output(p)
        p.set_defaults(fn=fn)
    qd = qsub.add_parser("delete", help="delete a queue without work (admin)")
    qd.add_argument("name")
    add_output(qd)
    qd.set_defaults(fn=cmd_delete)

    u = sub.add_parser("usage", help="GPU-, CPU- and memory-seconds per queue and user, from history")
    u.add_argument("--queue", default=None)
    u.add_argument("--user", default=None)
    u.add_argument("--since", default=None, help="ISO date/time, or a duration like 24h, 7d (ago)")
    u.add_argument("--until", default=None, help="ISO date/time (default now)")
    add_output(u)
    u.set_defaults(fn=cmd_usage)


def parse_quota(items: list[str]) -> list[dict[str, Any]]:
    """`RESOURCE=NOMINAL[:BORROW[:LEND]]` items as QueueResourceInput values."""
    out_: list[dict[str, Any]] = []
    for item in items:
        if item == "none":
            continue
        res, sep, rest = item.partition("=")
        if not sep or not res:
            raise ConfigError(f"quota {item!r} is not RESOURCE=NOMINAL[:BORROW[:LEND]]")
        parts = rest.split(":")
        if len(parts) > 3:
            raise ConfigError(f"quota {item!r} has more than three numbers")

        def num(x: str, item: str = item) -> float | None:
            if x in ("", "-"):
                return None
            try:
                v = float(x) if x.isascii() else math.nan
            except ValueError:
                raise ConfigError(f"quota {item!r}: {x!r} is not a number") from None
            if not math.isfinite(v):  # (found by exploring: nan, inf and 1e400 ended in a traceback)
                raise ConfigError(f"quota {item!r}: {x!r} is not a finite number")
            return v

        nominal = num(parts[0])
        if nominal is None:
            # The API has no unlimited nominal quota: '-' was sent as 0 (found by exploring).
            raise ConfigError(f"quota {item!r}: NOMINAL is a number, the amount guaranteed (0 for none); "
                              "'-' or empty, no limit, is for BORROW and LEND")
        out_.append({"resource": res, "nominal": nominal,
                     "borrowingLimit": num(parts[1]) if len(parts) > 1 else None,
                     "lendingLimit": num(parts[2]) if len(parts) > 2 else None})
    return out_


def _input(args: argparse.Namespace) -> dict[str, Any]:
    inp: dict[str, Any] = {"name": args.name}
    if args.quota is not None:
        inp["quota"] = parse_quota(args.quota)
    onoff = {"on": True, "off": False}
    for key, value in (("cohort", args.cohort), ("weight", args.weight), ("description", args.description),
                       ("preemptWithin", onoff.get(args.preempt_within or "")),
                       ("reclaim", onoff.get(args.reclaim or "")),
                       ("fairSharePreemption", onoff.get(args.fair_share_preemption or "")),
                       ("fairShareUsers", onoff.get(args.fair_share_users or "")),
                       ("preemptGraceSeconds", args.grace), ("minRuntimeSeconds", args.min_runtime),
                       ("maxPreemptions", args.max_preemptions),
                       ("defaultTimeLimitSeconds", args.default_time_limit),
                       ("maxTimeLimitSeconds", args.max_time_limit), ("maxGpusPerUser", args.max_gpus_per_user),
                       ("maxSubmittedJobs", args.max_submitted_jobs),
                       ("maxSubmittedJobsPerUser", args.max_submitted_jobs_per_user),
                       ("maxRunningJobsPerUser", args.max_running_jobs_per_user)):
        if value is not None:
            inp[key] = value
    if args.host_labels:
        inp["hostLabels"] = key_values("host-label", args.host_labels)
    elif getattr(args, "no_host_labels", False):
        inp["hostLabels"] = {}
    return inp


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def _gpus(q: dict[str, Any]) -> tuple[str, str, str]:
    """GPU nominal, used and borrowed summed over models."""
    rs = [r for r in q["resources"] if r["resource"].startswith("gpu:")]
    nominal = [r["nominal"] for r in rs if r["nominal"] is not None]
    return (_fmt(sum(nominal)) if nominal else "-", _fmt(sum(r["used"] for r in rs)),
            _fmt(sum(r["borrowed"] for r in rs)))


def cmd_list(args: argparse.Namespace) -> int:
    def render() -> None:
        data = gql(f"{{ queues(first: 500) {{ totalCount edges {{ node {{ {QUEUE_FIELDS} }} }} }} }}",
                   optional=NEWER_QUEUE_FIELDS)["queues"]
        rows = []
        for q in (e["node"] for e in data["edges"]):
            nominal, used, borrowed = _gpus(q)
            rows.append([q["name"], q["cohort"] or "-", f"{q['weight']:g}", nominal, used, borrowed,
                         str(q["pendingCount"]), str(q["runningCount"]), f"{q['dominantShare']:.3f}",
                         f"{q['entitledShare']:.3f}", f"{q['fairShare']:.3f}"])
        out(args, data, rows, ["QUEUE", "COHORT", "WEIGHT", "GPU QUOTA", "GPUS USED", "BORROWED", "PENDING",
                               "RUNNING", "SHARE", "ENTITLED", "RANK"])

    return watch(args, render)


def cmd_show(args: argparse.Namespace) -> int:
    q = gql(f"query($n: String!) {{ queue(name: $n) {{ {QUEUE_FIELDS} }} }}", {"n": args.name},
            optional=NEWER_QUEUE_FIELDS)["queue"]
    if q is None:
        raise NotFound(f"no queue {args.name}")
    _show(args, q)
    return 0


def _show(args: argparse.Namespace, q: dict[str, Any]) -> None:
    if args.output == "json":
        out(args, q)
        return
    print(f"{q['name']}  cohort {q['cohort'] or '-'}  weight {q['weight']:g}  {q['description']}")
    parked = (f" (and {q['parkedCount']} held, waiting for other jobs or for a time ahead)"
              if q.get("parkedCount") else "")
    print(f"  pending {q['pendingCount']}{parked}, running {q['runningCount']}; "
          f"dominant share {q['dominantShare']:.3f}, entitled {q['entitledShare']:.3f}; "
          f"fair-share rank {q['fairShare']:.3f} (share / weight: lowest first)")
    print(f"  preemption: within {'on' if q['preemptWithin'] else 'off'}, reclaim {'on' if q['reclaim'] else 'off'}"
          f", fair share {'on' if q['fairSharePreemption'] else 'off'}; grace {q['preemptGraceSeconds']:g} s, "
          f"min runtime {q['minRuntimeSeconds']:g} s, at most {q['maxPreemptions']} at once")
    print(f"  time limit: {time_limits(q['defaultTimeLimitSeconds'], q['maxTimeLimitSeconds'])}")
    per_user = [f"{q['maxGpusPerUser']:g} GPUs held" if q.get("maxGpusPerUser") else "",
                f"{q['maxRunningJobsPerUser']} jobs placed or running" if q.get("maxRunningJobsPerUser") else ""]
    if any(per_user):
        print(f"  per user: at most {' and '.join(p for p in per_user if p)} at once")
    if q.get("fairShareUsers"):
        print("  users:   fair share (at equal priority, the user holding least goes next)")
    for r in q.get("advanceReservations") or []:
        print(f"  hosts set aside: {r['hostCount']} by advance reservation {r['name']} ({r['state'].lower()}), from "
              f"{when_text(r['startsAt'])} to {when_text(r['endsAt'])}")
    if q.get("users"):
        label = "next first" if q.get("fairShareUsers") else "least held first"
        print(f"  by user ({label}): " + "; ".join(
            f"{u['user']} {u['gpus']:g} GPUs, {u['jobs']} running, {u['jobsNotEnded']} not ended"
            + (f" (past use {u['pastGpus']:.1f} GPUs, {u['pastJobs']:.1f} jobs)" if u["pastGpus"] or u["pastJobs"]
               else "") for u in q["users"]))
    if "submittedJobs" in q:
        print(f"  jobs not ended: {submission_limits(q)}")
    if q.get("hostLabels"):
        print(f"  hosts:   only those labelled {labels_text(q['hostLabels'])}")
    out(args, q, [[r["resource"], _fmt(r["nominal"]), _fmt(r["borrowingLimit"]), _fmt(r["lendingLimit"]),
                   _fmt(r["used"]), _fmt(r["borrowed"]), _fmt(r["lent"])] for r in q["resources"]],
        ["RESOURCE", "NOMINAL", "BORROW LIMIT", "LEND LIMIT", "USED", "BORROWED", "LENT"])


def submission_limits(q: dict[str, Any]) -> str:
    """The queue's jobs not ended against its submission limits, with the users that have
    the most, in words."""
    cap, per_user = q.get("maxSubmittedJobs") or 0, q.get("maxSubmittedJobsPerUser") or 0
    users = ", ".join(f"{u['user']} {u['jobs']}" for u in q.get("submittedJobsByUser") or [])
    return (f"{q['submittedJobs']} (limit {cap or 'none'}; per user: limit {per_user or 'none'}"
            + (f", most: {users})" if users else ")"))


def time_limits(default: float, maximum: float) -> str:
    """A queue's time limits in words (0 is none)."""
    return (f"{duration_text(default) if default else 'none'} by default, "
            f"{f'at most {duration_text(maximum)}' if maximum else 'no maximum'}")


def _mutate(args: argparse.Namespace, name: str) -> int:
    q = f"""mutation($input: QueueInput!) {{ {name}(input: $input) {{ queue {{ {QUEUE_FIELDS} }}
            userErrors {{ field message code }} }} }}"""
    res = gql(q, {"input": _input(args)})[name]
    if res["userErrors"]:
        raise user_errors(res["userErrors"], "{field}: {message} ({code})")
    _show(args, res["queue"])
    return 0


def cmd_create(args: argparse.Namespace) -> int:
    return _mutate(args, "createQueue")


def cmd_set(args: argparse.Namespace) -> int:
    return _mutate(args, "updateQueue")


def cmd_delete(args: argparse.Namespace) -> int:
    res = gql("""mutation($n: String!) { deleteQueue(name: $n) { deleted userErrors { field message code } } }""",
              {"n": args.name})["deleteQueue"]
    if res["userErrors"]:
        raise user_errors(res["userErrors"], "{message} ({code})")
    out(args, res, [[args.name, "deleted"]], ["QUEUE", "STATUS"])
    return 0


def cmd_usage(args: argparse.Namespace) -> int:
    q = """query($q: String, $u: String, $s: DateTime, $t: DateTime) { usage(queue: $q, user: $u, since: $s,
           until: $t) { queue user gpuModel gpuSeconds cpuSeconds memoryMbSeconds attempts
           gpuSecondsLostToPreemption gpuUtilPct } }"""
    rows = gql(q, {"q": args.queue, "u": args.user, "s": ago(args.since), "t": ago(args.until)},
               optional=("gpuSecondsLostToPreemption", "gpuUtilPct"))["usage"]
    out(args, rows, [[r["queue"], r["user"], r["gpuModel"] or "-", f"{r['gpuSeconds'] / 3600:.2f}",
                      f"{r['cpuSeconds'] / 3600:.2f}", f"{r['memoryMbSeconds'] / 3600 / 1024:.2f}", str(r["attempts"]),
                      f"{r.get('gpuSecondsLostToPreemption', 0) / 3600:.2f}",
                      "-" if r.get("gpuUtilPct") is None else f"{r['gpuUtilPct']:g} %"]
                     for r in rows],
        ["QUEUE", "USER", "GPU MODEL", "GPU-HOURS", "CPU-HOURS", "GB-HOURS", "ATTEMPTS", "LOST GPU-HOURS",
         "GPU UTIL"])
    return 0
