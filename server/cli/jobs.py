"""`muster job submit|list|show|logs|why|cancel`, through the GraphQL API."""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import sys
import time
from typing import Any

from server.cli.client import (
    add_output,
    add_watch,
    finite_float,
    gql,
    key_values,
    labels_text,
    nonempty,
    out,
    watch,
    whole_number,
)
from server.cli.errors import ApiError, JobFailed, user_errors
from server.cli.times import ahead, when_text
from server.timefmt import duration_text
from wire.errors import Forbidden, NotFound, ValidationError

JOB_FIELDS = """id name state user queue timeLimitSeconds effectiveTimeLimitSeconds command replicas gpus gpuModel
gpuModels sameModel hostLabels { key value } gpuShare gpuMemoryMb migProfile gpuSharing cpus memoryMb priority
submittedAt updatedAt cancelReason endReason queuePosition hold dependsOn dependency waitingFor group groupLimit
beginAt notBefore retryFailures retryExitCodes retryTimeouts retryDelaySeconds checkpoints excludeHosts
pendingReasons { reason hosts kind detail }
attempts { id number task state host { id health } gpuIndices gpuShare migInstances exitCode startedAt finishedAt
outputTail reason gpuUtilPct gpuMemUsedMb gpuUtilAvgPct gpuIdleSince }"""


# Job fields a server of an earlier version lacks: list and show ask again without them.
NEWER_FIELDS = ("hold", "dependsOn", "dependency", "waitingFor", "reservation", "group", "groupLimit", "beginAt",
                "notBefore", "retryFailures", "retryExitCodes", "retryTimeouts", "checkpoints", "excludeHosts",
                "gpuUtilPct", "gpuMemUsedMb", "gpuUtilAvgPct", "gpuIdleSince", "retryDelaySeconds")


def register(sub: argparse._SubParsersAction) -> None:
    j = sub.add_parser("job", help="submit, list, show, hold, release, change and cancel jobs")
    jsub = j.add_subparsers(dest="job_cmd", required=True)

    js = jsub.add_parser("submit", help="submit a job (--wait, -f to follow its output)",
                         usage="%(prog)s [OPTIONS] NAME [OPTIONS --] COMMAND ...\n"
                               "       %(prog)s [OPTIONS] -- COMMAND ...",
                         description="Options may also follow NAME; then end them with --. Without NAME "
                                     "(options, then --), the job is named after its command's program, as "
                                     "sbatch names a job after its script.")
    js.add_argument("name", nargs="?")
    js.add_argument("command", nargs=argparse.REMAINDER)
    submit_options(js)
    js.set_defaults(fn=cmd_submit, after=None)

    jl = jsub.add_parser("list", help="jobs, newest first (filters: state, user, name, queue)")
    jl.add_argument("--state", type=nonempty, default=None, help="one state or several, comma-separated")
    jl.add_argument("--user", type=nonempty, default=None)
    jl.add_argument("--name", type=nonempty, default=None, help="name prefix")
    jl.add_argument("--queue", type=nonempty, default=None)
    jl.add_argument("--group", type=nonempty, default=None,
                    help="the jobs' group (--group's; an --array's is printed when it is submitted, and by job show)")
    jl.add_argument("--limit", type=whole_number, default=50)
    add_output(jl)
    add_watch(jl)
    jl.set_defaults(fn=cmd_list)

    jsh = jsub.add_parser("show", help="one job: its spec, why it waits, and each attempt")
    jsh.add_argument("id")
    add_output(jsh)
    add_watch(jsh)
    jsh.set_defaults(fn=cmd_show)

    jlg = jsub.add_parser("logs", help="the output of each attempt: its last 4 KB, asked of the agent while it runs")
    jlg.add_argument("id")
    jlg.add_argument("-f", "--follow", action="store_true",
                     help="keep printing new output every 2 s until the job ends (Ctrl-C to stop)")
    add_output(jlg)
    jlg.set_defaults(fn=cmd_logs)

    ji = jsub.add_parser("idle", help="running jobs holding GPUs that have all been idle for their agent's "
                                      "--gpu-idle-after, idle longest first")
    ji.add_argument("--limit", type=whole_number, default=100)
    add_output(ji)
    ji.set_defaults(fn=cmd_idle)

    jw = jsub.add_parser("why", help="why a job is still queued: rejecting hosts by reason, queue position")
    jw.add_argument("id")
    add_output(jw)
    jw.set_defaults(fn=cmd_why)

    for verb, held, what, after in (("hold", True, "queued jobs", "they stay queued, not placed until released"),
                                     ("release", False, "held jobs", "they take their place in their queue again")):
        jh = jsub.add_parser(verb, help=f"{verb} {what} (by id, or every one the filters match): {after}",
                             description=f"{verb.title()} the jobs given by id, or every "
                                         f"{'QUEUED job not held' if held else 'held job'} that matches all the "
                                         f"filters given (--name, --queue, --user, --group), as scontrol {verb} does.")
        jh.add_argument("ids", nargs="*", metavar="ID")
        add_job_filters(jh, states=False)
        if held:
            jh.add_argument("--reason", default="", help="why (shown with the job)")
        add_output(jh)
        jh.set_defaults(fn=cmd_update, change={"held": held}, matching=verb, **({} if held else {"reason": ""}))

    jq = jsub.add_parser("requeue", help="stop placed or running jobs and queue them again (not counted as a try)")
    jq.add_argument("ids", nargs="+", metavar="ID")
    jq.add_argument("--hold", action="store_true", help="and hold them once queued (scontrol requeuehold)")
    jq.add_argument("--reason", default="")
    add_output(jq)
    jq.set_defaults(fn=cmd_requeue)

    jp = jsub.add_parser("set", help="change a job that has not ended: its priority, its time limit")
    jp.add_argument("ids", nargs="+", metavar="ID")
    jp.add_argument("--priority", type=whole_number, default=None,
                    help="-1000 to 1000: its place in its queue, and as a preemption victim")
    jp.add_argument("--time-limit", type=finite_float, default=None, metavar="S", dest="time_limit",
                    help="a new time limit in seconds, its running try's too (one that ran longer is stopped); "
                         "0: none; only an admin may raise or remove one (scontrol update TimeLimit)")
    add_output(jp)
    jp.set_defaults(fn=cmd_update, reason="")

    jc = jsub.add_parser("cancel", help="cancel jobs: by id, or every job not ended that the filters match",
                         description="Cancel the jobs given by id, or every job that has not ended and matches "
                                     "all the filters given (--name, --state, --queue, --user, --group), as "
                                     "scancel does.")
    jc.add_argument("ids", nargs="*", metavar="ID")
    add_job_filters(jc, states=True)
    jc.add_argument("--reason", default="")
    add_output(jc)
    jc.set_defaults(fn=cmd_cancel)


def submit_options(js: argparse.ArgumentParser) -> None:
    """The options of `job submit`: on its parser, and on the one `submit_command` reads
    options given after the job's name with."""
    js.add_argument("--gpus", type=whole_number, default=0)
    js.add_argument("--gpu-model", action="append", default=None, metavar="MODEL[,MODEL...]",
                    help="one GPU model, or several, comma-separated (or repeated): any of them will do")
    js.add_argument("--same-model", action="store_true", help="a gang's tasks all on one of the models")
    js.add_argument("--gpu-share", type=whole_number, default=0, metavar="THOUSANDTHS",
                    help="a share of ONE GPU in thousandths, 1-999 (with --gpus 0); shared, not isolated")
    js.add_argument("--gpu-memory-mb", type=whole_number, default=0, help="GPU memory a --gpu-share task needs")
    js.add_argument("--mig-profile", default=None, metavar="PROFILE",
                    help="one MIG instance of this profile, e.g. 1g.10gb (with --gpus 0)")
    js.add_argument("--replicas", type=whole_number, default=1,
                    help="gang size: tasks placed all at once or not at all")
    js.add_argument("--same-rack", action="store_true", help="a gang's tasks all in one rack")
    js.add_argument("--host-label", action="append", default=None, metavar="KEY=VALUE", dest="host_labels",
                    help="a label the host must have, as its agent reports it (repeat for more: all must match)")
    js.add_argument("--exclude", action="append", default=None, metavar="HOST[,HOST...]", dest="exclude_hosts",
                    help="hosts it must not run on (repeat for more), as Slurm's --exclude")
    js.add_argument("--cpus", type=finite_float, default=1.0)
    js.add_argument("--memory-mb", type=whole_number, default=512)
    js.add_argument("--priority", type=whole_number, default=0)
    js.add_argument("--max-attempts", type=whole_number, default=None, help="tries when hosts are lost (default 3)")
    js.add_argument("--queue", default=None, help="the queue to run in (default: default, or the first of the "
                    "token's queues when it is bound to queues that leave default out)")
    js.add_argument("--time-limit", type=finite_float, default=None, metavar="S",
                    help="stop the job after S seconds of running; it ends TIMEOUT (default: the queue's)")
    js.add_argument("--env", action="append", default=None, metavar="KEY=VALUE",
                    help="an environment variable of the task (repeat for more)")
    js.add_argument("--cwd", default=None, help="the task's working directory (default: a directory of its own)")
    js.add_argument("--keep-running", action="store_true",
                    help="keep running when the host is cut off from the control plane (KEEP_RUNNING)")
    js.add_argument("--replace-after", type=finite_float, default=None, metavar="S",
                    help="with --keep-running: seconds after the host is lost before the work is replaced")
    js.add_argument("--hold", action="store_true", help="submit it held: queued, not placed until `job release`")
    js.add_argument("--retry-failures", type=whole_number, default=None, metavar="N",
                    help="try a failed try again, up to N times (its own code exited nonzero; a gang as a whole)")
    js.add_argument("--retry-exit-code", action="append", type=whole_number, default=None, metavar="CODE",
                    dest="retry_exit_codes", help="with --retry-failures: only these exit codes (repeat for more)")
    js.add_argument("--retry-timeouts", action="store_true",
                    help="with --retry-failures: a try stopped at its time limit is retried too")
    js.add_argument("--retry-delay", type=finite_float, default=None, metavar="S",
                    help="with --retry-failures: wait S seconds before the first retry, doubling for each one "
                         "after it, at most an hour (default: 1, 2, 4 ... s, at most a minute)")
    js.add_argument("--checkpoints", action="store_true",
                    help="it saves its state on SIGTERM (within its queue's grace, MUSTER_PREEMPT_DEADLINE) and "
                         "resumes from it: a preemption costs it the grace only, and such jobs are stopped first")
    js.add_argument("--begin", default=None, metavar="WHEN",
                    help="not placed before this time: ISO 8601 (UTC unless it names an offset) or a time from now "
                         "(90m, 2h, 1d), as Slurm's --begin")
    js.add_argument("--after", action="append", default=None, metavar="ID[,ID...]", dest="depends_on",
                    help="run after this job SUCCEEDED (several, comma-separated or repeated: after all of them); "
                         "one that ends otherwise cancels this job")
    js.add_argument("--after-any", action="store_true",
                    help="with --after: run once they ended, whatever their end (afterany)")
    js.add_argument("--after-notok", action="store_true",
                    help="with --after: run once they ended otherwise than SUCCEEDED (FAILED, CANCELLED, TIMEOUT), "
                         "to clean up or report; one that SUCCEEDED cancels this job (afternotok)")
    js.add_argument("--array", default=None, metavar="N[%K]|INDICES[%K]",
                    help="submit N jobs (1-1000) named NAME-0 ... NAME-<N-1>, or one per index of a list "
                         "as Slurm writes it (0-15, 1,3,5-9, 0-99:10; a lone number is N, not an index), each "
                         "told its index (MUSTER_ARRAY_INDEX) and the number of jobs (MUSTER_ARRAY_SIZE), in one "
                         "group of their own; with %%K, at most K of them placed or running at once; not with "
                         "--wait or -f")
    js.add_argument("--singleton", action="store_true",
                    help="run only when no other job of yours with this name is placed or running (Slurm's "
                         "singleton: the group NAME, limit 1)")
    js.add_argument("--group", default=None, metavar="G",
                    help="a group of your jobs this one is in (with --group-limit)")
    js.add_argument("--group-limit", type=whole_number, default=None, metavar="K",
                    help="with --group: at most K jobs of the group placed or running at once")
    js.add_argument("--wait", action="store_true", help="wait until the job finishes")
    js.add_argument("-f", "--follow", action="store_true",
                    help="wait, printing the job's output as it runs (as job logs -f); exit as --wait does")
    js.add_argument("--timeout", type=finite_float, default=None, metavar="S",
                    help="with --wait or -f: give up after S seconds (exit 2 if the job was never placed, 1 if it "
                         "still runs)")
    add_output(js)


def submit_command(args: argparse.Namespace) -> list[str]:
    """The command of `job submit NAME ...`: what follows the first `--` (`args.after`,
    see `parser.parse_args`), word for word, with options given between NAME and that
    `--` read into `args`; without a `--`, the words after NAME, one string of them split
    as a shell would. Options after NAME with no `--` are refused rather than taken as the
    command: `job submit train --gpus 1 python t.py` would otherwise run the command
    `--gpus 1 python t.py` on no GPU."""
    words = list(args.command)
    after: list[str] | None = getattr(args, "after", None)
    if after is None:
        if words[:1] and words[0].startswith("-"):
            raise ValidationError("command", f"{words[0]} after the job's name: put options before the name, "
                                  "or end them with -- (muster job submit NAME --gpus 1 -- COMMAND ...)")
        command = words
        if len(command) == 1 and " " in command[0]:
            try:
                command = shlex.split(command[0])
            except ValueError as exc:  # (found by exploring: a traceback)
                raise ValidationError("command", f"{command[0]!r}: {exc}; quote it whole, or give its words "
                                      "after --") from None
    else:
        if words:
            late = argparse.ArgumentParser(prog="muster job submit NAME", add_help=False)
            submit_options(late)
            late.parse_args(words, namespace=args)
        # Word for word, one word with spaces too (found by exploring: `-- "/tmp/sp ace/run.sh"`
        # was split in two).
        command = list(after)
    if args.name is None:
        if after is None:
            raise ValidationError("name", "a job name, or options ended with -- before the command "
                                  "(muster job submit [NAME] [OPTIONS] -- COMMAND ...)")
        args.name = command_name(command)
    return command


def command_name(command: list[str]) -> str:
    """The name of a job submitted without one: its command's program (the last part of
    its path), in the characters a name may have (others become '-'), or `job`."""
    program = os.path.basename(command[0]) if command else ""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", program).lstrip("_.-")[:128] or "job"


def submit_input(args: argparse.Namespace, command: list[str]) -> dict[str, Any]:
    """`SubmitJobInput` from `job submit`'s options: what was given, the rest left to the
    API's defaults."""
    inp: dict[str, Any] = {"name": args.name, "command": command, "gpus": args.gpus,
                           "cpus": args.cpus, "memoryMb": args.memory_mb, "priority": args.priority}
    models = list(dict.fromkeys(m.strip() for given in args.gpu_model or () for m in given.split(",") if m.strip()))
    if len(models) == 1:
        inp["gpuModel"] = models[0]
    elif models:
        inp["gpuModels"] = models
    for key, value, default in (("sameModel", args.same_model, False), ("gpuShare", args.gpu_share, 0),
                                ("gpuMemoryMb", args.gpu_memory_mb, 0), ("migProfile", args.mig_profile, None),
                                ("replicas", args.replicas, 1), ("sameRack", args.same_rack, False),
                                ("cwd", args.cwd, None), ("maxAttempts", args.max_attempts, None),
                                ("queue", args.queue or None, None), ("timeLimitSeconds", args.time_limit, None),
                                ("replaceAfter", args.replace_after, None)):
        if value != default:
            inp[key] = value
    if args.keep_running:
        inp["onDisconnect"] = "KEEP_RUNNING"
    if args.hold:
        inp["held"] = True
    if args.begin:
        inp["beginAt"] = ahead(args.begin)
    if args.retry_failures is not None:
        inp["retryFailures"] = args.retry_failures
    if args.retry_exit_codes:
        inp["retryExitCodes"] = args.retry_exit_codes
    if args.retry_timeouts:
        inp["retryTimeouts"] = True
    if args.retry_delay is not None:
        inp["retryDelaySeconds"] = args.retry_delay
    if args.checkpoints:
        inp["checkpoints"] = True
    if args.exclude_hosts:
        inp["excludeHosts"] = [h.strip() for given in args.exclude_hosts for h in given.split(",") if h.strip()]
    if args.after_any and args.after_notok:
        raise ValidationError("after-any", "--after-any and --after-notok exclude each other")
    if args.depends_on:
        # Comma-separated or repeated, as --exclude (found by exploring: `--after A,B` was one id).
        inp["dependsOn"] = list(dict.fromkeys(j.strip() for given in args.depends_on for j in given.split(",")
                                              if j.strip()))
        if args.after_any:
            inp["dependency"] = "AFTER_ANY"
        elif args.after_notok:
            inp["dependency"] = "AFTER_NOT_OK"
    elif args.after_any or args.after_notok:
        raise ValidationError("after-any" if args.after_any else "after-notok", "goes with --after ID")
    if args.singleton and (args.group or args.group_limit or args.array):
        raise ValidationError("singleton", "--singleton is a group of its own: not with --group, --group-limit "
                              "or --array")
    if args.singleton:
        inp["group"], inp["groupLimit"] = args.name, 1
    if args.group_limit is not None and not args.group:
        raise ValidationError("group-limit", "goes with --group G")
    if args.group:
        inp["group"] = args.group
        if args.group_limit is not None:
            inp["groupLimit"] = args.group_limit
    for option, field, given in (("env", "env", args.env), ("host-label", "hostLabels", args.host_labels)):
        if given:
            inp[field] = key_values(option, given)
    return inp


MAX_ARRAY = 1000  # jobs of one array: one submitJobs request


def array_indices(text: str) -> tuple[list[int], int]:
    """`--array N[%K]` (indices 0 ... N-1) or a list of indices as Slurm writes one:
    `A-B`, `A-B:S` (every S-th from A), single indices, comma-separated (`1,3,5-9%2`).
    Returns the indices, ascending and each once, and how many may run at once (0: no
    limit). A lone number is a count, as Muster always read it (Slurm's `--array 16` is
    the one index 16: write `16-16`)."""
    spec, pct, k_text = text.partition("%")
    bad = ValidationError("array", f"{text!r}: expected N, N%K or indices such as 0-15, 1,3,5-9 or 0-99:10 "
                                   "(with %K: at most K at once)")
    if pct and not _digits(k_text):
        raise bad
    k = int(k_text) if pct else 0
    if pct and k < 1:
        raise ValidationError("array", "the K of %K must be at least 1")
    if _digits(spec):
        if not 1 <= int(spec) <= MAX_ARRAY:  # (before the list: found by exploring, a huge N ate the memory)
            raise ValidationError("array", f"must be from 1 to {MAX_ARRAY} jobs")
        return list(range(int(spec))), k
    indices: set[int] = set()
    for item in spec.split(","):
        first, dash, rest = item.partition("-")
        last, colon, step_text = rest.partition(":")
        if not _digits(first) or (dash and not _digits(last)) or (colon and not _digits(step_text)) \
                or (not dash and colon):
            raise bad
        lo, hi, step = int(first), int(last) if dash else int(first), int(step_text) if colon else 1
        if hi < lo or step < 1:
            raise ValidationError("array", f"{item!r}: a range runs up, by a step of at least 1")
        if (hi - lo) // step + 1 > MAX_ARRAY:
            raise ValidationError("array", f"must be from 1 to {MAX_ARRAY} jobs")
        indices.update(range(lo, hi + 1, step))
    return sorted(indices), k


def _digits(text: str) -> bool:
    """ASCII digits only: str.isdigit() takes '²' (which int() refuses: a traceback) and
    '٣' (which int() reads as 3), found by exploring."""
    return text.isascii() and text.isdigit()


def array_inputs(inp: dict[str, Any], indices: list[int], limit: int = 0,
                 group: str | None = None) -> list[dict[str, Any]]:
    """The jobs of an `--array`: NAME-i for each index i, each with MUSTER_ARRAY_INDEX=i
    and MUSTER_ARRAY_SIZE (how many jobs) in its environment, all in one group of their
    own (`group`, by default NAME and a random suffix) with `limit` of them placed or
    running at once."""
    if not 1 <= len(indices) <= MAX_ARRAY:
        raise ValidationError("array", f"must be from 1 to {MAX_ARRAY} jobs")
    widest = max(len(str(i)) for i in indices)
    if len(inp["name"]) + 1 + widest > 128:
        raise ValidationError("name", f"at most {128 - widest - 1} characters with --array indices up to "
                                      f"{max(indices)}")
    group = group or f"{inp['name'][:110]}#{secrets.token_hex(4)}"
    size = str(len(indices))
    return [{**inp, "name": f"{inp['name']}-{i}", "group": group, **({"groupLimit": limit} if limit else {}),
             "env": {**inp.get("env", {}), "MUSTER_ARRAY_INDEX": str(i), "MUSTER_ARRAY_SIZE": size}}
            for i in indices]


def cmd_submit(args: argparse.Namespace) -> int:
    """Submit; with --wait poll until the job ends. JobFailed (exit 2) when it ended
    otherwise than SUCCEEDED (FAILED, TIMEOUT, CANCELLED: found by exploring, a cancelled
    job exited 0, as if it had done its work) or was never placed within --timeout;
    ApiError (exit 1) when it still runs by then."""
    inp = submit_input(args, submit_command(args))
    if args.timeout is not None and not (args.wait or args.follow):
        # It would bound nothing (found by exploring: ignored without a word).
        raise ValidationError("timeout", "--timeout goes with --wait or -f: it bounds the wait")
    if args.array is not None:
        if args.wait or args.follow:
            raise ValidationError("array", "--array submits many jobs: follow them with job list --name NAME-")
        indices, limit = array_indices(args.array)
        return submit_array(args, array_inputs(inp, indices, limit, args.group))
    q = f"""mutation($input: SubmitJobInput!) {{ submitJob(input: $input) {{
        job {{ {JOB_FIELDS} }} userErrors {{ field message code }} warnings }} }}"""
    res = gql(q, {"input": inp}, optional=(*NEWER_FIELDS, "warnings"))["submitJob"]
    if res["userErrors"]:
        raise user_errors(res["userErrors"], "{field}: {message} ({code})")
    warn(res.get("warnings") or [])
    job = res["job"]
    timed_out = False
    if args.follow:
        print(f"{job['id']} submitted", file=sys.stderr)
        deadline = None if args.timeout is None else time.monotonic() + args.timeout
        try:
            job = print_output(_logs(job["id"]), follow=True, deadline=deadline)
        except KeyboardInterrupt:
            return 0  # the job goes on; `muster job logs -f ID` follows it again
        if job["state"] in NOT_OK:
            raise JobFailed(ended(job))
        if job["state"] not in TERMINAL:  # --timeout passed: as --wait's (found by exploring: not bounded)
            gave_up(job, args.timeout)
        return 0
    if args.wait:
        # Said before the wait: should the API be lost meanwhile, the job stays stored and
        # runs, and submitting it again would run it twice.
        print(f"{job['id']} submitted; waiting for it to end", file=sys.stderr, flush=True)
        job, timed_out = wait_for(job["id"], args.timeout)
    out(args, job, [[job["id"], job["state"]]], ["ID", "STATE"])
    if job["state"] in NOT_OK:
        raise JobFailed(ended(job))
    if timed_out:
        gave_up(job, args.timeout)
    return 0


def gave_up(job: dict[str, Any], timeout: float) -> None:
    """`--timeout` passed before the job ended: JobFailed (exit 2) when it was never
    placed, ApiError (exit 1) when it was and still runs."""
    if job["state"] == "QUEUED":
        reasons = "".join(f"\n  {_reason(r)}" for r in job.get("pendingReasons") or [])
        raise JobFailed(f"job {job['id']} was not placed within {timeout:g}s{reasons}")
    raise ApiError(f"job {job['id']} still {job['state']} after {timeout:g}s")


# The most bytes of jobs one `submitJobs` request of an array carries: the API takes a body
# of at most 1 MiB (server.api.app.MAX_BODY_BYTES), with room for the query.
ARRAY_REQUEST_BYTES = 768 * 1024


def array_requests(inputs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """An array's jobs in as few requests as the API's body limit allows (found by
    exploring: 600 jobs of a 2,000-character command were refused whole, "request body
    too large")."""
    out: list[list[dict[str, Any]]] = [[]]
    size = 0
    for inp in inputs:
        n = len(json.dumps(inp)) + 1
        if out[-1] and size + n > ARRAY_REQUEST_BYTES:
            out.append([])
            size = 0
        out[-1].append(inp)
        size += n
    return out


def submit_array(args: argparse.Namespace, inputs: list[dict[str, Any]]) -> int:
    """The jobs of an array, in one request, or a few where they would not fit in one
    (`array_requests`). The jobs differ only in name and index, so a refusal is normally
    every job's; the jobs stored, if any were, are listed before the first refusal is
    raised (and no later request is sent)."""
    q = """mutation($input: [SubmitJobInput!]!) { submitJobs(input: $input) {
        job { id name state } userErrors { field message code } warnings } }"""
    res: list[dict[str, Any]] = []
    failed: Exception | None = None
    for part in array_requests(inputs):
        try:
            res += gql(q, {"input": part}, optional=("warnings",))["submitJobs"]
        except Exception as exc:  # noqa: BLE001 - said after the jobs stored by the requests before
            # (a review: a later request's failure hid the jobs the earlier ones stored, and
            # the command run again would have run them twice)
            failed = exc
            break
        if any(r["userErrors"] for r in res):
            break
    jobs = [r["job"] for r in res if r["job"]]
    warn(list(dict.fromkeys(w for r in res for w in r.get("warnings") or [])))  # an array's jobs share theirs
    if jobs:
        out(args, jobs, [[j["id"], j["name"], j["state"]] for j in jobs], ["ID", "NAME", "STATE"])
        print(f"array group {inputs[0]['group']}: muster job list --group '{inputs[0]['group']}' lists it, "
              f"job cancel --group cancels it", file=sys.stderr)
    if failed is not None:
        if jobs:
            print(f"{len(jobs)} of the array's {len(inputs)} jobs were stored (above) before this:", file=sys.stderr)
        raise failed
    refused = [r for r in res if r["userErrors"]]
    if refused:
        raise user_errors(refused[0]["userErrors"], "{field}: {message} ({code})")
    return 0


def warn(warnings: list[str]) -> None:
    """A submission's warnings (why the job could never run as the cluster stands), on stderr."""
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)


def ended(job: dict[str, Any]) -> str:
    """'job ID FAILED', with why: the end reason, else each ended task of the last try
    that did not succeed (where, its exit code and reason)."""
    line = f"job {job['id']} {job['state']}"
    if job.get("endReason"):
        return f"{line}: {job['endReason']}"
    last = [a for a in job.get("attempts") or [] if a["number"] == job["attempts"][-1]["number"]]
    why = [f"attempt {a['number']}{task_of(job, a)} on {a['host']['id']}: "
           + (f"exit {a['exitCode']}" if a.get("exitCode") is not None else a["state"])
           + (f" ({a['reason']})" if a.get("reason") else "")
           for a in last if a["state"] != "SUCCEEDED"]
    return line + "".join(f"\n  {w}" for w in why)


def wait_for(job_id: str, timeout: float | None = None) -> tuple[dict[str, Any], bool]:
    """Poll until the job finishes: (job, False); or (job, True) once `timeout` s pass."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        job = gql(f"query($id: ID!) {{ job(id: $id) {{ {JOB_FIELDS} }} }}", {"id": job_id},
                  optional=NEWER_FIELDS)["job"]
        if job is None:
            raise NotFound(f"job {job_id} is gone")
        if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"):
            return job, False
        if deadline is not None and time.monotonic() >= deadline:
            return job, True
        time.sleep(0.5)


def cmd_list(args: argparse.Namespace) -> int:
    q = """query($first: Int, $filter: JobFilter) { jobs(first: $first, filter: $filter) { totalCount
           edges { node { id name state user queue gpus gpuModel gpuModels gpuShare migProfile replicas priority
           submittedAt hold waitingFor reservation { hostCount } } } } }"""
    flt = job_filter(args)

    def render() -> None:
        data = gql(q, {"first": args.limit, "filter": flt or None}, optional=NEWER_FIELDS)["jobs"]
        rows = [[n["id"], n["name"], n["state"] + (" held" if n.get("hold") else " after" if n.get("waitingFor")
                                                     else " reserved" if n.get("reservation") else ""),
                 n["user"], n["queue"],
                 gpus_cell(n),
                 n["gpuModel"] or ",".join(n.get("gpuModels") or []) or "-",
                 str(n["priority"]), (n["submittedAt"] or "")[:19]] for n in (e["node"] for e in data["edges"])]
        out(args, data, rows, ["ID", "NAME", "STATE", "USER", "QUEUE", "GPUS", "MODEL", "PRIO", "SUBMITTED"])
        if args.output != "json" and data["totalCount"] > len(rows):
            # (found by exploring: 50 rows of 336, nothing said there were more)
            print(f"{len(rows)} of {data['totalCount']} jobs shown (--limit N for more)", file=sys.stderr)

    return watch(args, render)


def gpus_cell(job: dict[str, Any]) -> str:
    """A job's GPUs in a list's cell: whole GPUs, a share of one in thousandths, or a MIG
    instance; a gang's as each task's times its tasks ("2 x4" is four tasks of two)."""
    what = (f"MIG {job['migProfile']}" if job.get("migProfile") else
            f"{job['gpuShare']}/1000" if job.get("gpuShare") else str(job["gpus"]))
    return what + (f" x{job['replicas']}" if (job.get("replicas") or 1) > 1 else "")


def cmd_show(args: argparse.Namespace) -> int:
    return watch(args, lambda: show(args))


def show(args: argparse.Namespace) -> None:
    job = gql(f"query($id: ID!) {{ job(id: $id) {{ {JOB_FIELDS} }} }}", {"id": args.id}, optional=NEWER_FIELDS)["job"]
    if job is None:
        raise NotFound(f"no job {args.id}")
    if args.output == "json":
        out(args, job)
        return
    print(f"{job['id']}  {job['name']}  {job['state']}  queue {job['queue']}  priority {job['priority']}")
    print(f"  command: {for_terminal(shlex.join(job['command']), one_line=True)}")
    if job.get("hold"):
        print(f"  {job['hold']} (muster job release {job['id']})")
    if job.get("retryFailures"):
        codes = f" exiting {', '.join(map(str, job['retryExitCodes']))}" if job.get("retryExitCodes") else ""
        also = " (and tries that reach the time limit)" if job.get("retryTimeouts") else ""
        delay = job.get("retryDelaySeconds") or 0
        wait = f", {delay:g} s before the first, doubling (at most an hour)" if delay else ""
        print(f"  retries: up to {job['retryFailures']} failed tries{codes}{also}{wait}")
    if job.get("checkpoints"):
        print("  checkpoints: saves its state when stopped and resumes from it")
    if job.get("beginAt"):
        print(f"  begins:  {when_text(job['beginAt'])}" + (" (not yet)" if job.get("notBefore") else ""))
    if job.get("group"):
        limit = f" (at most {job['groupLimit']} of its jobs placed or running at once)" if job.get("groupLimit") \
            else ""
        print(f"  group: {job['group']}{limit}")
    if job.get("dependsOn"):
        kind = {"AFTER_ANY": "they ended", "AFTER_NOT_OK": "they ended otherwise than SUCCEEDED"}.get(
            job.get("dependency") or "", "they SUCCEEDED")
        waiting = f"; waiting for {', '.join(job['waitingFor'])}" if job.get("waitingFor") else ""
        print(f"  runs after: {', '.join(job['dependsOn'])} (once {kind}){waiting}")
    if job.get("cancelReason"):
        print(f"  cancelled: {job['cancelReason']}")
    if job.get("endReason"):
        print(f"  ended:   {job['endReason']}")
    print(f"  wants:   {wants(job)}")
    if job.get("hostLabels"):
        print(f"  on hosts labelled: {labels_text(job['hostLabels'])}")
    if job.get("excludeHosts"):
        print(f"  not on:  {', '.join(job['excludeHosts'])}")
    if job["effectiveTimeLimitSeconds"]:
        whose = "its own" if job["effectiveTimeLimitSeconds"] == job["timeLimitSeconds"] else f"queue {job['queue']}"
        print(f"  time limit: {duration_text(job['effectiveTimeLimitSeconds'])} ({whose})")
    if job["state"] == "QUEUED":
        if job["queuePosition"] is not None:
            print(f"  queue position: {job['queuePosition']}")
        for r in job["pendingReasons"]:
            print(f"  pending: {_reason(r)}")
    for a in job["attempts"]:
        where = (f"MIG {','.join(a['migInstances'])}" if a["migInstances"] else
                 f"GPU {a['gpuIndices'][0]} ({a['gpuShare']}/1000, shared, not isolated)" if a["gpuShare"] else
                 f"GPUs {a['gpuIndices']}" if a["gpuIndices"] else "no GPU")
        code = f" exit={a['exitCode']}" if a["exitCode"] is not None else ""  # none yet while it runs
        print(f"  attempt {a['number']}{task_of(job, a)} on {a['host']['id']} {where}: {a['state']}"
              f"{code} {for_terminal(a['reason'], one_line=True)}".rstrip() + lost_note(a))
        util, mem = a.get("gpuUtilPct"), a.get("gpuMemUsedMb")
        if util is not None or mem is not None:  # (a figure its agent could not read: "-")
            shared = " (the whole GPU's: shared)" if a["gpuShare"] else ""
            print(f"    GPUs now: {'-' if util is None else format(util, 'g')} % busy, "
                  f"{'-' if mem is None else format(mem, ',')} MB in use{shared}")
        if a.get("gpuIdleSince"):
            print(f"    GPUs idle since {when_text(a['gpuIdleSince'])}: it holds GPUs it does not use")
        if a.get("gpuUtilAvgPct") is not None:
            shared = " (the whole GPU's: shared)" if a["gpuShare"] else ""
            print(f"    GPUs over its run: {a['gpuUtilAvgPct']:g} % busy on average{shared}")
        if a["outputTail"]:
            print("    " + for_terminal(a["outputTail"].rstrip()).replace("\n", "\n    "))


def lost_note(attempt: dict[str, Any]) -> str:
    """For a live attempt on a LOST host: its work is replaced only when a healthy host can
    take it (failures.md, never evict work with nowhere to go)."""
    if attempt["state"] in ("PLACED", "RUNNING") and attempt["host"].get("health") == "LOST":
        return " (its host is LOST: replaced once another host has room)"
    return ""


def task_of(job: dict[str, Any], attempt: dict[str, Any]) -> str:
    """' task N' for an attempt of a gang's task (numbered from 0), '' for a single task."""
    return f" task {attempt['task']}" if job.get("replicas", 1) > 1 else ""


def wants(job: dict[str, Any]) -> str:
    """What a job asks for, in words; a gang's is per task."""
    gang = f"a gang of {job['replicas']} tasks, each " if job.get("replicas", 1) > 1 else ""
    return f"{gang}{wants_gpu(job)}, {job['cpus']} CPU, {job['memoryMb']} MB"


def wants_gpu(job: dict[str, Any]) -> str:
    """What a job asks of GPUs, in words: '2 GPU H100', '250/1000 of one GPU A10|T4 (shared,
    not isolated), 4096 MB GPU memory', 'MIG 1g.10gb', '0 GPU any'."""
    models = "|".join(job.get("gpuModels") or []) or "any"
    if job.get("migProfile"):
        what = f"MIG {job['migProfile']} {models}"
    elif job.get("gpuShare"):
        what = f"{job['gpuShare']}/1000 of one GPU {models} ({job['gpuSharing']})"
        if job.get("gpuMemoryMb"):
            what += f", {job['gpuMemoryMb']} MB GPU memory"
    else:
        what = f"{job['gpus']} GPU {models}"
    return what + (" (one model for the gang)" if job.get("sameModel") else "")


LOGS_QUERY = """query($id: ID!) { job(id: $id) { id state replicas endReason attempts { number task state
                host { id } exitCode reason outputTail liveOutput liveOutputBytes } } }"""
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT")
NOT_OK = ("FAILED", "CANCELLED", "TIMEOUT")  # the ends `--wait` and `-f` exit 2 for


def cmd_logs(args: argparse.Namespace) -> int:
    """Each attempt's output: the tail its final report kept, or, while it runs, what its
    agent has so far. With --follow, the new output every 2 s until the job ends."""
    job = _logs(args.id)
    if args.output == "json":
        out(args, job["attempts"])
        return 0
    if not job["attempts"] and not args.follow:
        print(f"job {job['id']} is {job['state']} and has not run yet", file=sys.stderr)
    try:
        print_output(job, args.follow)
    except KeyboardInterrupt:
        pass
    return 0


def print_output(job: dict[str, Any], follow: bool, deadline: float | None = None) -> dict[str, Any]:
    """Print each attempt's output (LOGS_QUERY's `job`) under a header; with `follow`, ask
    again every 2 s and print what is new, and each attempt's end, until the job ends or
    `deadline` (time.monotonic()) passes. The job as last read."""
    # attempt (number, task) -> (state, output shown, bytes written by then when known)
    shown: dict[tuple[int, int], tuple[str, str, float | None]] = {}
    # The attempt whose last output printed did not end its line (a job's progress, written
    # bit by bit), if one: another's output, or a header, first ends that line.
    mid_line: tuple[int, int] | None = None
    # Whose header or output was printed last: another's output is headed again, as
    # `tail -f` heads each file's (found by exploring: a gang's tasks' lines were mixed,
    # nothing saying which task wrote which).
    last: tuple[int, int] | None = None

    def put(text: str, owner: tuple[int, int] | None = None, open_line: bool = False) -> None:
        nonlocal mid_line
        if mid_line is not None and mid_line != owner:  # (another task's line still open: a review)
            print()
        print(text, end="" if open_line or text.endswith("\n") else "\n")
        mid_line = owner if open_line else None

    while True:
        for a in job["attempts"]:
            key = (a["number"], a["task"])
            before = shown.get(key)
            live = a["state"] in ("PLACED", "RUNNING")
            written = a.get("liveOutputBytes") if live else None
            if live and a["liveOutput"] is None:  # no answer (yet): keep what was shown
                text, written = (before[1], before[2]) if before else ("", None)
            else:
                text = a["liveOutput"] if live else a["outputTail"]
            if before is None:
                put(header(job, a, f" on {a['host']['id']}"))
                last = key
                if a["state"] == "RUNNING" and a["liveOutput"] is None:
                    print("(its agent did not answer: no output yet)", file=sys.stderr)
            more = new_output(before[1] if before else "", text, before[2] if before else None, written)
            if more:
                more = for_terminal(more)
                if last != key:
                    put(header(job, a, f" on {a['host']['id']}"))
                # Followed, output is printed as it was written: a line written in parts is
                # one line (found by exploring: each part was printed on a line of its own).
                put(more, key, open_line=follow and live and not more.endswith("\n"))
                last = key
            if before is not None and before[0] != a["state"] and not live:
                put(header(job, a))
                last = key
            shown[key] = (a["state"], text, written)
        sys.stdout.flush()
        left = None if deadline is None else deadline - time.monotonic()
        if not follow or job["state"] in TERMINAL or (left is not None and left <= 0):
            if mid_line is not None:
                print()
            return job
        time.sleep(2 if left is None else min(2, left))
        job = _logs(job["id"])


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_CONTROL_ALL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def for_terminal(text: str, tty: bool | None = None, one_line: bool = False) -> str:
    """A job's output as it may reach an operator's terminal: written to one (`tty`, by
    default whether stdout is), its control characters but newline, tab and carriage
    return (with `one_line`, those too: a command's arguments) are shown escaped
    (\\x1b ...), so that a job cannot clear the screen, set the window's title or the
    clipboard, or hide text; piped or redirected, as it is."""
    if tty is None:
        tty = sys.stdout.isatty()
    pattern = _CONTROL_ALL if one_line else _CONTROL
    return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}", text) if tty else text


def header(job: dict[str, Any], a: dict[str, Any], where: str = "") -> str:
    """`==> attempt N[ task T][ on HOST]: STATE[ (exit C)] <==`, above an attempt's output."""
    code = f" (exit {a['exitCode']})" if a["exitCode"] is not None else ""
    return f"==> attempt {a['number']}{task_of(job, a)}{where}: {a['state']}{code} <=="


def _logs(job_id: str) -> dict[str, Any]:
    job = gql(LOGS_QUERY, {"id": job_id}, optional=("liveOutputBytes",))["job"]
    if job is None:
        raise NotFound(f"no job {job_id}")
    return job


def new_output(before: str, now: str, before_bytes: float | None = None, now_bytes: float | None = None) -> str:
    """What `now` (an output tail: the last few KB of a process's output) adds to `before`
    (an earlier tail of the same output). With the bytes the process had written in all at
    each look (`liveOutputBytes`), exactly the last `now_bytes - before_bytes` bytes of
    `now`. Without them (an ended attempt's final tail, an older agent), the part after
    where `before` ends in `now`, so that output repeating itself exactly for a kilobyte
    may be taken as already shown. When more was written between the two looks than a
    tail holds, a line says so, then the whole of `now`."""
    skipped = "[... output skipped: more than a tail was written meanwhile ...]\n"
    if now_bytes is not None and before_bytes is not None and now_bytes >= before_bytes:
        new = int(now_bytes - before_bytes)
        raw = now.encode()
        if new == 0:
            return ""
        return raw[-new:].decode(errors="replace") if new <= len(raw) else skipped + now
    if not before:
        return now
    if now == before:
        return ""
    for n in (1024, 128):  # the end of what was shown; a shorter one when the tail slid far
        anchor = before[-n:]
        at = now.rfind(anchor)
        if at >= 0:
            return now[at + len(anchor):]
    return skipped + now


IDLE_QUERY = """query($n: Int!) { idleGpus(first: $n) { host since job { id name queue user }
                attempt { gpuIndices gpuShare } } }"""


def cmd_idle(args: argparse.Namespace) -> int:
    rows = gql(IDLE_QUERY, {"n": args.limit})["idleGpus"]
    out(args, rows, [[r["job"]["id"], r["job"]["name"], r["job"]["queue"], r["job"]["user"], r["host"],
                      f"{r['attempt']['gpuShare']}/1000 of {r['attempt']['gpuIndices'][0]}" if r["attempt"]["gpuShare"]
                      else ",".join(str(i) for i in r["attempt"]["gpuIndices"]), when_text(r["since"])]
                     for r in rows],
        ["JOB", "NAME", "QUEUE", "USER", "HOST", "GPUS", "IDLE SINCE"])
    return 0


def cmd_why(args: argparse.Namespace) -> int:
    job = gql("""query($id: ID!) { job(id: $id) { id name state queue queuePosition couldNeverRun
                 pendingReasons { reason hosts kind detail } } }""", {"id": args.id},
              optional=("couldNeverRun",))["job"]
    if job is None:
        raise NotFound(f"no job {args.id}")
    if args.output == "json":
        out(args, job)
        return 0
    if job["state"] != "QUEUED":
        print(f"{job['id']} is {job['state']}: it is not waiting for placement")
        return 0
    where = (f"position {job['queuePosition']}" if job["queuePosition"] is not None
             else "out of the order") + f" in queue {job['queue']}"
    print(f"{job['id']} ({job['name']}) is QUEUED, {where}")
    for w in job.get("couldNeverRun") or []:
        print(f"  it could never run as the cluster stands: {w}")
    if not job["pendingReasons"]:
        print("  no host rejects it: it should be placed in the next scheduling cycle")
    else:
        out(args, job, [[r.get("kind") or "host", str(r["hosts"]) if (r.get("kind") or "host") == "host" else "-",
                         r["reason"], r.get("detail") or ""] for r in job["pendingReasons"]],
            ["KIND", "HOSTS", "REASON", "DETAIL"])
    return 0


def _reason(r: dict[str, Any]) -> str:
    if r.get("kind") == "queue":
        return f"queue: {r['reason']}" + (f" ({r['detail']})" if r.get("detail") else "")
    return f"{r['hosts']} {'host' if r['hosts'] == 1 else 'hosts'}: {r['reason']}"


def add_job_filters(p: argparse.ArgumentParser, states: bool) -> None:
    """The filters `job cancel`, `job hold` and `job release` take instead of ids."""
    p.add_argument("--name", type=nonempty, help="filter: name prefix (an --array's NAME- matches the array)")
    if states:
        p.add_argument("--state", type=nonempty,
                       help="filter: QUEUED, PLACED or RUNNING, or several, comma-separated")
    p.add_argument("--queue", type=nonempty, help="filter: queue")
    p.add_argument("--user", type=nonempty, help="filter: the user who submitted")
    p.add_argument("--group", type=nonempty,
                   help="filter: a group of your jobs (--group's; an --array's is printed when it is submitted, and "
                        "by job show); with --user, that user's group of that name")


def cmd_update(args: argparse.Namespace) -> int:
    """Hold, release or change the priority of each job given (`updateJob`), as cancel
    does: the refused ones listed with why, the first refusal's error ends the command.
    `job hold` and `job release` take filters instead of ids (holdJobs, releaseJobs)."""
    matching = getattr(args, "matching", None)
    if matching is not None:
        flt = job_filter(args)
        if bool(flt) == bool(args.ids):
            raise ValidationError("ids", "give job ids, or filters (--name, --queue, --user, --group), not both")
        if flt:
            return _on_matching(args, matching, flt)
    q = """mutation($input: UpdateJobInput!) { updateJob(input: $input) {
           job { id state priority hold } userErrors { field message code } } }"""
    change = dict(getattr(args, "change", {}))
    if getattr(args, "priority", None) is not None:
        change["priority"] = args.priority
    if getattr(args, "time_limit", None) is not None:
        change["timeLimitSeconds"] = args.time_limit
    if not change:
        raise ValidationError("input", "give --priority, --time-limit or both")
    return _each(args, lambda job_id: gql(q, {"input": {"id": job_id, "reason": args.reason, **change}})["updateJob"],
                 "change requested")


def cmd_requeue(args: argparse.Namespace) -> int:
    q = """mutation($id: ID!, $reason: String!, $hold: Boolean!) { requeueJob(id: $id, reason: $reason, hold: $hold) {
           job { id state } userErrors { field message code } } }"""
    return _each(args, lambda job_id: gql(q, {"id": job_id, "reason": args.reason, "hold": args.hold})["requeueJob"],
                 "requeue requested")


def _each(args: argparse.Namespace, act: Any, done_text: str) -> int:
    """`act(id)` (a mutation's payload: job, userErrors) for each of `args.ids`; the
    refused ones listed with why (in JSON, `{"id", "error"}` among the jobs), and the
    first refusal's error (its exit code) ends the command."""
    done: list[dict[str, Any]] = []
    rows: list[list[str]] = []
    first: Exception | None = None
    for job_id in args.ids:
        res = act(job_id)
        if res["userErrors"]:
            err = user_errors(res["userErrors"], "{message}")
            first = first or err
            rows.append([job_id, f"refused: {err}"])
            # In the JSON too, in order (found by exploring: only the jobs acted on were in it).
            done.append({"id": job_id, "error": str(err)})
        else:
            done.append(res["job"])
            rows.append([res["job"]["id"], done_text])
    if len(args.ids) == 1:
        if first is not None:
            raise first
        out(args, done[0], rows, ["ID", "STATUS"])
        return 0
    out(args, done, rows, ["ID", "STATUS"])
    if first is not None:
        raise first
    return 0


JOB_STATES = ("QUEUED", "PLACED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT")  # GraphQL's JobState


def job_filter(args: argparse.Namespace) -> dict[str, Any]:
    """The GraphQL JobFilter of `job list`'s, `job cancel`'s, `job hold`'s and `job release`'s
    filter options. An option given empty is refused, not dropped: dropped, it widened a
    bulk action to every job the other filters match (found by exploring: `job hold --name
    '' --queue default` held every queued job of default)."""
    flt: dict[str, Any] = {}
    for option, key in (("state", "state"), ("user", "user"), ("name", "namePrefix"), ("queue", "queue"),
                        ("group", "group")):
        value = getattr(args, option, None)
        if value is None:
            continue
        if not value.strip():
            raise ValidationError(option, f"--{option} is empty: it would match every job; give a value or leave "
                                  "it out")
        flt[key] = value
    if "state" in flt:
        states = [s.strip() for s in flt["state"].split(",") if s.strip()]
        if not states:
            raise ValidationError("state", "--state names no state: give one or several, comma-separated")
        # Said here, with the states there are (found by exploring: GraphQL's enum error).
        for s in states:
            if s.upper() not in JOB_STATES:
                raise ValidationError("state", f"{s!r} is not a job state: one of {', '.join(JOB_STATES)}")
        flt["state"] = [s.upper() for s in states]
    return flt


def _on_matching(args: argparse.Namespace, verb: str, flt: dict[str, Any]) -> int:
    """cancelJobs, holdJobs or releaseJobs (`verb`: cancel, hold, release) over the filter
    `flt`, in one request: the count on stderr, the ids on stdout. Jobs that match but are
    of queues the token may not act on (a token bound to queues) are said so: when they are
    all that match, it is a refusal (Forbidden, exit 4), not "no job matches" (found by
    exploring)."""
    mutation, with_reason = f"{verb}Jobs", verb != "release"
    q = f"""mutation($f: JobFilter!{", $reason: String!" if with_reason else ""}) {{
           {mutation}(filter: $f{", reason: $reason" if with_reason else ""}) {{
           count jobIds outsideTokenQueues tokenQueues userErrors {{ field message code }} }} }}"""
    res = gql(q, {"f": flt, **({"reason": args.reason} if with_reason else {})},
              optional=("outsideTokenQueues", "tokenQueues"))[mutation]  # (an older server has neither)
    if res["userErrors"]:
        raise user_errors(res["userErrors"])
    done = f"{verb} requested"
    outside = res.get("outsideTokenQueues") or 0
    queues = f" ({', '.join(res['tokenQueues'])})" if res.get("tokenQueues") else ""
    left_alone = (f"{outside} job(s) that match are of other queues, and this token acts only on jobs of its "
                  f"queues{queues}")
    if not res["count"]:
        if outside:
            if args.output == "json":
                out(args, res)
            raise Forbidden(f"no job of this token's queues{queues} matches: nothing to {verb}; {left_alone}")
        if args.output != "json":
            # (A group is its user's: without --user, the caller's own.)
            whose = " of yours" if "group" in flt and "user" not in flt else ""
            hint = " (--group is a group of your jobs: add --user U for another user's)" if whose else ""
            print(f"no job{whose} matches: nothing to {verb}{hint}", file=sys.stderr)
            return 0
    print(f"{done} for {res['count']} job(s)", file=sys.stderr)
    if outside:
        print(f"left alone: {left_alone}", file=sys.stderr)
    out(args, res, [[i, done] for i in res["jobIds"]], ["ID", "STATUS"])
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel each job given, or every job the filters match (`cancelJobs`, one request).
    Of jobs given by id, the ones refused (not found, already finished) are listed with
    why, and the first refusal's error (its exit code) ends the command."""
    flt = job_filter(args)
    if bool(flt) == bool(args.ids):
        raise ValidationError("ids", "give job ids, or filters (--name, --state, --queue, --user, --group), not both")
    if flt:
        return _on_matching(args, "cancel", flt)
    q = """mutation($id: ID!, $reason: String!) { cancelJob(id: $id, reason: $reason) {
           job { id state } userErrors { field message code } } }"""
    return _each(args, lambda job_id: gql(q, {"id": job_id, "reason": args.reason})["cancelJob"],
                 "cancel requested")
