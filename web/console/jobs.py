"""Jobs: the jobs list (history rows overlaid with live ones, server.views.jobs), a job's
page and its forms (cancel, hold, release, priority), and the submit form."""

from __future__ import annotations

import asyncio
import math
import re
import shlex
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from server.api.reads import reads_for
from server.health.rules import Health
from server.operations.jobs import MAX_LIVE_OUTPUTS
from server.replica import Muster
from server.scheduling.retry import used_tries
from server.timefmt import parse_time
from server.views.jobs import reason_detail, time_limit
from web.console.errors import FORM_ERRORS, no_such_job, status_for
from web.console.render import PER_PAGE, clamp_page, is_htmx, muster_of, page_arg, render, url, wants_live_part
from web.console.session import Session, console, read_form
from wire.errors import Forbidden, ValidationError
from wire.messages import AttemptState, JobState
from wire.validation import KNOWN_GPU_MODELS

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

# Field names used by wire.validation -> names of the submit form's inputs.
SUBMIT_FIELDS = {"name": "name", "command": "command", "gpus": "gpus", "gpuModel": "gpu_model",
                 "gpu_model": "gpu_model", "gpuModels": "gpu_model", "cpus": "cpus", "memoryMb": "memory_mb",
                 "memory_mb": "memory_mb", "gpuShare": "gpu_share", "gpuMemoryMb": "gpu_memory_mb",
                 "migProfile": "mig_profile", "sameModel": "same_model", "queue": "queue",
                 "timeLimitSeconds": "time_limit", "time_limit_s": "time_limit", "replicas": "replicas",
                 "priority": "priority", "hostLabels": "host_labels", "host_labels": "host_labels",
                 "excludeHosts": "exclude_hosts",
                 "dependsOn": "after", "beginAt": "begin", "group": "group", "groupLimit": "group_limit",
                 "retryFailures": "retry_failures", "retryExitCodes": "retry_exit_codes",
                 "retryDelaySeconds": "retry_delay", "retry_delay_s": "retry_delay"}


# ---------------------------------------------------------------- the jobs list

# What the list says after a cancel, hold or release of the jobs its filters match.
MANY_NOTICES = {
    "cancel-many": "Cancel requested for {n} job(s) that the filters match and that had not ended. The leader "
                   "stops them shortly.",
    "hold-many": "Hold requested for {n} queued job(s) that the filters match and that were not held. They stay "
                 "queued, not placed until released.",
    "release-many": "Release requested for {n} held job(s) that the filters match.",
}


@console()
async def jobs(request: Request) -> Response:
    ctx = await _list_ctx(muster_of(request), request.query_params, page_arg(request))
    n = request.query_params.get("n", "")
    notice = request.query_params.get("notice")
    if notice in MANY_NOTICES and n.isdigit():
        ctx["notice"] = MANY_NOTICES[notice].format(n=int(n))
    return render(request, "_jobs.html" if is_htmx(request) else "jobs.html", ctx)


async def _list_ctx(m: Muster, params: Any, page: int) -> dict[str, Any]:
    """The jobs list's page for the filters in `params` (a query string or a form)."""
    states = [s.value for s in JobState]
    state = params.get("state", "").strip().upper()
    bad_state = bool(state) and state not in states
    if bad_state:
        state = ""
    queues = [q.name for q in m.queues()]
    f = _list_filters(params)
    filters: dict[str, Any] = dict(state=state or None, queue=f["queue"] or None, name=f["name"] or None,
                                   user=f["user"] or None, group=f["group"] or None)
    assert m.history is not None
    rows, total = await run_in_threadpool(m.history.list_jobs, **filters, limit=PER_PAGE,
                                          offset=(page - 1) * PER_PAGE)
    if not rows and total and page > 1:
        page, _ = clamp_page(total, page)
        rows, total = await run_in_threadpool(m.history.list_jobs, **filters, limit=PER_PAGE,
                                              offset=(page - 1) * PER_PAGE)
    # Live records laid over history's rows (a row's state may be behind: filtered again),
    # and on the first page the jobs history has not written yet.
    pairs, stale = m.jobs.overlay(rows, **filters)
    shown = [j for _, j in pairs]
    total -= stale
    if page == 1:
        fresh, count = m.jobs.unrecorded(rows, PER_PAGE, **filters)
        shown = (fresh + shown)[:PER_PAGE]
        total += count
    page, pages = clamp_page(total, page)
    keep = dict(state=state, **f)
    return {
        "rows": shown,
        "total": total,
        "state": state,
        "states": states,
        "bad_state": bad_state,
        "unknown_queue": bool(f["queue"]) and f["queue"] not in queues,
        # (`user` is the signed-in user's name on every page)
        "queue": f["queue"], "name_filter": f["name"], "user_filter": f["user"], "group_filter": f["group"],
        "filtered": any(keep.values()),
        "queues": queues,
        "page": page,
        "pages": pages,
        "prev_url": url("/jobs", **keep, page=page - 1) if page > 1 else None,
        "next_url": url("/jobs", **keep, page=page + 1) if page < pages else None,
        "first_url": url("/jobs", **keep, page=1) if page > 1 else None,
        "last_url": url("/jobs", **keep, page=pages) if page < pages else None,
        "live_url": url("/jobs", **keep, page=page),
        "sse_on": "job",
        "cancel_errors": [],
        "hold_errors": [],
    }


def _list_filters(params: Any) -> dict[str, str]:
    """The jobs list's filters besides the state, from a query string or a form: a queue,
    a name prefix, a user, a group. A queue that does not exist is kept, as GraphQL's
    filter keeps it: it matches the jobs recorded in it (none, or those of a queue deleted
    since). (Found by exploring: one was dropped, and a cancel of the jobs matching a
    misspelt queue and a name cancelled that name's jobs in every queue.)"""
    return {"queue": params.get("queue", "").strip()[:64],
            "name": params.get("name", "").strip()[:128], "user": params.get("user", "").strip()[:64],
            "group": params.get("group", "").strip()[:128]}


@console(csrf=True, action=True)
async def cancel_matching(request: Request) -> Response:
    """Cancel every job not ended that the list's filters match (Muster.act_on_matching:
    a team's token, its queues' only); a reason and at least one filter are required."""
    return await _on_matching(request, "cancel")


@console(csrf=True, action=True)
async def hold_matching(request: Request) -> Response:
    """Hold every queued job not held that the list's filters match."""
    return await _on_matching(request, "hold")


@console(csrf=True, action=True)
async def release_matching(request: Request) -> Response:
    """Release every held job that the list's filters match."""
    return await _on_matching(request, "release")


async def _on_matching(request: Request, action: str) -> Response:
    """Cancel, hold or release (`action`) the jobs the list's filters match; the list again
    with a notice, or with the refusal under the form."""
    m = muster_of(request)
    sess: Session = request.state.session
    form = await read_form(request)
    state = form.get("state", "").strip().upper()
    f = _list_filters(form)
    back = dict(state=state, **f)
    reason = form.get("reason", "").strip()[:512]
    try:
        if action == "cancel" and not reason:
            raise ValidationError("reason", "a reason is required to cancel jobs", "REQUIRED")
        if state and state not in {s.value for s in JobState}:
            raise ValidationError("state", f"no state {state[:32]!r}", "INVALID")
        filters: dict[str, Any] = dict(state=[state] if state else None, queue=f["queue"] or None,
                                       name=f["name"] or None, user=f["user"] or None, group=f["group"] or None)
        ids = await m.act_on_matching(action, sess.user, reason, sess.info.submit_queues, **filters)
    except FORM_ERRORS as exc:
        ctx = await _list_ctx(m, form, 1)
        ctx["cancel_errors" if action == "cancel" else "hold_errors"] = [e.message for e in exc.details()]
        return render(request, "jobs.html", ctx, status_for(exc))
    return RedirectResponse(url("/jobs", **back, notice=f"{action}-many", n=len(ids)), status_code=303)


# ---------------------------------------------------------------- one job


async def _job_ctx(m: Muster, job_id: str) -> dict[str, Any] | None:
    if not ID_RE.fullmatch(job_id):
        return None
    job = m.state.jobs.get(job_id)
    if job is None:
        job = await run_in_threadpool(m.jobs.get, job_id)
    if job is None:
        return None
    reads = reads_for(m)
    why = [(reason, n, reason_detail(reason))
           for reason, n in sorted((await reads.why_pending(job)).items(), key=lambda kv: (-kv[1], kv[0]))]
    now = time.time()
    queue_why = m.jobs.queue_reasons(job, now)
    never = await reads.never_runs(job) if job.state is JobState.QUEUED else []
    recorded: list[Any] = []
    history_error = False
    if m.history is not None:
        try:
            recorded = await run_in_threadpool(m.history.list_events, job_id=job_id, limit=500)
        except Exception:  # noqa: BLE001 - history is a convenience here
            history_error = True
    # Live tries on a LOST host: replaced only once another host can take them.
    on_lost = {a.id for a in job.attempts if a.state in (AttemptState.PLACED, AttemptState.RUNNING)
               and m.state.health(a.host_id, now) is Health.LOST}
    running = [a for a in job.attempts if a.state is AttemptState.RUNNING]
    # A running try's output so far, from its agent (None: it did not answer), for the
    # first MAX_LIVE_OUTPUTS running tasks; the agents of the others are not asked.
    asked = running[:MAX_LIVE_OUTPUTS]
    outputs = await asyncio.gather(*(m.live_output(a.host_id, a.id) for a in asked))
    live = {a.id: out for a, out in zip(asked, outputs, strict=True)}
    # How busy a running try's GPUs are, from its host's latest heartbeat (none on MIG).
    use = {a.id: u for a in running if not a.mig and (u := m.hosts.gpu_use(a.host_id, a.gpu_indices)) is not None}
    return {
        "job": job,
        "now": now,
        "live": live,
        "gpu_use": use,
        "gpu_idle": {a.id: since for a in running if (since := m.state.gpu_idle_since(a.host_id, a.id)) is not None},
        "unasked": {a.id for a in running[MAX_LIVE_OUTPUTS:]},
        "max_live": MAX_LIVE_OUTPUTS,
        "on_lost": on_lost,
        "limit": time_limit(job.spec, m.queue(job.spec.queue), job),
        "why": why,
        "queue_why": queue_why,
        "never": never,
        "last_try": sorted(job.pending_reasons.items(), key=lambda kv: (-kv[1], kv[0])),
        "hosts_known": len(m.state.hosts),
        "position": reads.queue_position(job),
        "queued_in_queue": m.state.backlog.count(job.spec.queue),
        # What the attempt limit counts: not preempted tries, those a drain, a shutdown or a
        # requeue stopped, nor failed ones (they count against its retries). Found by
        # exploring: a preempted job's page said "2 tries of at most 1" while the scheduler
        # rightly ran it again.
        "tries_counted": used_tries(job),
        "events": m.jobs.timeline(job, recorded),
        "history_error": history_error,
        "gang": job.spec.replicas > 1,
        "live_url": f"/jobs/{job_id}",
        "sse_on": "job",
        "sse_id": job_id,
        # While a try runs, its output so far and how busy its GPUs are change with no job
        # event: live.js polls the page every 2 s even with the event stream open (found by
        # exploring: neither moved while the stream was open).
        "poll": bool(running),
        # What the action forms depend on: when a refresh of the live part says otherwise,
        # live.js fetches the forms again (found by exploring: forms of a job that had
        # ended, or been held, were still offered).
        "actions_version": "|".join(map(str, (
            job.state.value, job.hold, len(job.preempting), job.tries,
            sum(1 for t in job.current_tasks() if not t.state.terminal and t.stop_kind)))),
    }


@console()
async def job_detail(request: Request) -> Response:
    job_id = request.path_params["job_id"]
    ctx = await _job_ctx(muster_of(request), job_id)
    if ctx is None:
        raise no_such_job(job_id)
    ctx["errors"] = []
    return render(request, "_job.html" if wants_live_part(request) else "job.html", ctx)


@console(csrf=True, action=True)
async def cancel_job(request: Request) -> Response:
    async def act(m: Muster, job_id: str, sess: Session, form: dict[str, str]) -> None:
        reason = form.get("reason", "").strip()[:512]
        if not reason:
            raise ValidationError("reason", "a reason is required", "REQUIRED")
        await m.cancel(job_id, by=sess.user, reason=reason, queues=sess.info.submit_queues)

    return await _job_action(request, "cancel", act, cancel_card=True)


async def _job_action(request: Request, notice: str,
                      act: Callable[[Muster, str, Session, dict[str, str]], Awaitable[object]],
                      cancel_card: bool = False) -> Response:
    """A form on a job's page: `act(muster, job id, session, form)`, then the job's page
    with `notice`, or the page again with the error at the change card (at the cancel
    card, with the reason given, for `cancel_card`)."""
    m = muster_of(request)
    job_id = request.path_params["job_id"]
    sess: Session = request.state.session
    form = await read_form(request)
    ctx = await _job_ctx(m, job_id)
    if ctx is None:
        raise no_such_job(job_id)
    try:
        await act(m, job_id, sess, form)
    except FORM_ERRORS as exc:
        errors = [e.message for e in exc.details()]
        if cancel_card:
            ctx["errors"], ctx["reason_value"] = errors, form.get("reason", "").strip()[:512]
        elif notice == "time-limit":
            ctx["limit_errors"], ctx["limit_value"] = errors, form.get("time_limit", "").strip()[:32]
        else:
            ctx["change_errors"] = errors
        return render(request, "job.html", ctx, status_for(exc))
    return RedirectResponse(url(f"/jobs/{job_id}", notice=notice), status_code=303)


async def _update_job(request: Request, notice: str, **change: Any) -> Response:
    """Hold, release or reprioritise the job (Muster.update_job)."""
    async def act(m: Muster, job_id: str, sess: Session, form: dict[str, str]) -> None:
        if "priority" in change:
            raw = form.get("priority", "").strip()
            if not re.fullmatch(r"-?\d{1,4}", raw):
                raise ValidationError("priority", "must be a whole number from -1000 to 1000", "INVALID")
            change["priority"] = int(raw)
        if "time_limit_s" in change:
            raw = form.get("time_limit", "").strip()
            if not re.fullmatch(r"\d{1,8}(\.\d{1,3})?", raw):
                raise ValidationError("timeLimitSeconds", "must be a number of seconds", "INVALID")
            change["time_limit_s"] = float(raw)
            change["may_raise"] = sess.is_admin
        reason = form.get("reason", "").strip()[:200] if change.get("hold") else ""
        await m.update_job(job_id, sess.user, reason=reason, queues=sess.info.submit_queues, **change)

    return await _job_action(request, notice, act)


@console(csrf=True, action=True)
async def hold_job(request: Request) -> Response:
    return await _update_job(request, "held", hold=True)


@console(csrf=True, action=True)
async def release_job(request: Request) -> Response:
    return await _update_job(request, "released", hold=False)


@console(csrf=True, action=True)
async def set_priority(request: Request) -> Response:
    return await _update_job(request, "priority", priority=None)


@console(csrf=True, action=True)
async def set_time_limit(request: Request) -> Response:
    return await _update_job(request, "time-limit", time_limit_s=None)


@console(csrf=True, action=True)
async def requeue_job(request: Request) -> Response:
    """Stop the job's try and queue it again (Muster.requeue), held if the box was ticked."""
    return await _job_action(request, "requeued", lambda m, job_id, sess, form: m.requeue(
        job_id, sess.user, form.get("reason", "").strip()[:200], bool(form.get("hold")), sess.info.submit_queues))


# ---------------------------------------------------------------- submit


def _submit_ctx(m: Muster, sess: Session, values: dict[str, str], errors: dict[str, list[str]],
                other: list[str] | None = None) -> dict[str, Any]:
    bound = sess.info.submit_queues
    return {
        # The queues offered: those the session's token may submit to.
        "queues": [q.name for q in m.queues() if bound is None or q.name in bound],
        "default_queue": Muster.default_queue(bound),
        "values": values,
        "errors": errors,
        "other_errors": other or [],
        "models": sorted(KNOWN_GPU_MODELS | m.known_gpu_models()),
    }


SUBMIT_DEFAULTS = {"name": "", "command": "", "gpus": "0", "gpu_model": "", "gpu_share": "", "gpu_memory_mb": "",
                   "mig_profile": "", "cpus": "1", "memory_mb": "512", "replicas": "1", "priority": "0",
                   "host_labels": "", "exclude_hosts": "", "queue": "", "time_limit": "", "after": "",
                   "after_rule": "ok", "held": "", "begin": "", "group": "", "group_limit": "", "retry_failures": "",
                   "retry_exit_codes": "", "retry_delay": "", "checkpoints": ""}


@console()
async def submit_form(request: Request) -> Response:
    m = muster_of(request)
    return render(request, "submit.html", _submit_ctx(m, request.state.session, dict(SUBMIT_DEFAULTS), {}))


def _number(raw: str, kind: type) -> Any:
    """The parsed number, or the raw text (which validation then rejects)."""
    try:
        return kind(raw)
    except (TypeError, ValueError):
        return raw


@console(csrf=True, action=True)
async def submit(request: Request) -> Response:
    m = muster_of(request)
    sess: Session = request.state.session
    form = await read_form(request)
    values = {k: form.get(k, "").strip() for k in SUBMIT_DEFAULTS}
    data: dict[str, Any] = {"name": values["name"]}
    local: dict[str, list[str]] = {}
    try:
        data["command"] = shlex.split(values["command"])
        if not data["command"]:
            local["command"] = ["is required: the program to run and its arguments"]
    except ValueError as exc:
        data["command"] = None
        local["command"] = [f"cannot be split into arguments: {exc}"]
    if values["gpus"]:
        data["gpus"] = _number(values["gpus"], int)
    if values["cpus"]:
        cpus = _number(values["cpus"], float)
        data["cpus"] = cpus if not isinstance(cpus, float) or math.isfinite(cpus) else values["cpus"]
    if values["memory_mb"]:
        data["memory_mb"] = _number(values["memory_mb"], int)
    models = [x.strip() for x in values["gpu_model"].split(",") if x.strip()]
    if len(models) == 1:
        data["gpu_model"] = models[0]
    elif models:
        data["gpu_models"] = models  # any of them
    for key in ("gpu_share", "gpu_memory_mb"):
        if values[key]:
            data[key] = _number(values[key], int)
    if values["mig_profile"]:
        data["mig_profile"] = values["mig_profile"]
    for key in ("replicas", "priority"):
        if values[key]:
            data[key] = _number(values[key], int)
    if values["host_labels"]:
        pairs = [p.strip().partition("=") for p in values["host_labels"].split(",") if p.strip()]
        if any(not eq or not k.strip() for k, eq, _v in pairs):
            local["host_labels"] = ["expected KEY=VALUE pairs, comma-separated (zone=eu-1,net=ib)"]
            data["host_labels"] = values["host_labels"]  # which validation refuses too
        else:
            data["host_labels"] = {k.strip(): v.strip() for k, _eq, v in pairs}
    if values["exclude_hosts"]:
        data["exclude_hosts"] = [x.strip() for x in re.split(r"[\s,]+", values["exclude_hosts"]) if x.strip()]
    if values["queue"]:
        data["queue"] = values["queue"]
    if values["after"]:
        data["depends_on"] = [x.strip() for x in re.split(r"[\s,]+", values["after"]) if x.strip()]
        data["depend_any"] = values["after_rule"] == "any"
        data["depend_not_ok"] = values["after_rule"] == "notok"
    if values["after_rule"] not in ("", "ok", "any", "notok"):
        local["after_rule"] = ["expected ok, any or notok"]
    if values["held"]:
        data["held"] = True
    if values["checkpoints"]:
        data["checkpoints"] = True
    if values["begin"]:
        try:  # the form's date and time, in UTC
            data["begin_at"] = parse_time(values["begin"]).timestamp()
        except ValueError:
            local["begin"] = ["must be a date and time, such as 2026-12-24T06:00"]
            data["begin_at"] = values["begin"]  # which validation refuses too
    if values["group"]:
        data["group"] = values["group"]
    if values["group_limit"]:
        data["group_limit"] = _number(values["group_limit"], int)
    if values["retry_failures"]:
        data["retry_failures"] = _number(values["retry_failures"], int)
    if values["retry_exit_codes"]:
        codes = [_number(c.strip(), int) for c in values["retry_exit_codes"].split(",") if c.strip()]
        data["retry_exit_codes"] = codes  # a code that is not a number is refused by validation
    if values["retry_delay"]:
        delay = _number(values["retry_delay"], float)
        data["retry_delay_s"] = delay if not isinstance(delay, float) or math.isfinite(delay) else values["retry_delay"]
    if values["time_limit"]:
        limit = _number(values["time_limit"], float)
        data["time_limit_s"] = limit if not isinstance(limit, float) or math.isfinite(limit) else values["time_limit"]
    if "after_rule" in local:  # no value of the job's own says so: validation would take it
        return render(request, "submit.html", _submit_ctx(m, sess, values, dict(local)), 422)
    try:
        job = await m.submit(data, sess.user, sess.info.submit_queues)
    except (ValidationError, Forbidden) as exc:
        errors: dict[str, list[str]] = dict(local)
        other: list[str] = []
        if isinstance(exc, Forbidden):  # a queue the session's token may not submit to
            errors["queue"] = [exc.message]
        else:
            for p in exc.details():
                field = SUBMIT_FIELDS.get(p.field)
                if field is None:
                    other.append(f"{p.field}: {p.message}")
                elif field not in local:
                    errors.setdefault(field, []).append(p.message)
        return render(request, "submit.html", _submit_ctx(m, sess, values, errors, other), status_for(exc))
    return RedirectResponse(url(f"/jobs/{job.id}", notice="submitted"), status_code=303)
