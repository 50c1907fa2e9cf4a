"""Validation of user input into a JobSpec: pure, with one error per bad field."""

from __future__ import annotations

import datetime as dt
import re
import unicodedata
from collections.abc import Iterable
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from wire.budgets import check_spec
from wire.errors import ValidationError
from wire.messages import (
    DEFAULT_QUEUE,
    HOST_ID_PATTERN,
    JOB_ID_PATTERN,
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    MAX_DEPENDENCIES,
    MAX_EPOCH_S,
    MAX_EXCLUDED_HOSTS,
    MAX_HOST_LABELS,
    MIG_PROFILE_PATTERN,
    QUEUE_NAME_PATTERN,
    AdvanceReservation,
    JobSpec,
    Queue,
)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
KNOWN_GPU_MODELS = frozenset(
    {"H100", "H200", "B200", "GB200", "A100", "A10", "A30", "A40", "L4", "L40", "L40S",
     "V100", "V100M16", "V100M32", "T4", "P100", "G2", "G3", "RTX6000", "RTX4090"}
)
MAX_GPUS = 64
# The last day a time may name (MAX_EPOCH_S), as told to whoever names a later one.
LATEST_DATE = dt.datetime.fromtimestamp(MAX_EPOCH_S, dt.UTC).date().isoformat()
MAX_CPUS = 1024.0
MIN_CPUS = 0.001  # a thousandth of a core, the least a CPU share can tell (Kubernetes' 1m)
MAX_SIGNAL = 64  # a task ended by signal N reports exit code -N (Linux signals go to 64)
MAX_MEMORY_MB = 16 * 1024 * 1024  # 16 TiB
MAX_COMMAND_BYTES = 64 * 1024
MAX_ENV_BYTES = 64 * 1024
MAX_ENV_VARS = 128
# The facts the scheduler and the agent give each task (docs/security.md): a job's own
# value would pass for theirs where they are read from the task's env.
RESERVED_ENV = frozenset({"MUSTER_JOB_ID", "MUSTER_ATTEMPT_ID", "MUSTER_ATTEMPT", "MUSTER_TASK_INDEX",
                          "MUSTER_GANG_SIZE", "MUSTER_GANG_TASK", "MUSTER_GANG_HOSTS", "MUSTER_HOST_ID",
                          "MUSTER_WORK_DIR", "MUSTER_PREEMPT_DEADLINE", "MUSTER_GPU_SHARE"})
MAX_REASON_CHARS = 512
MAX_GPU_MEMORY_MB = 1024 * 1024
MIG_PROFILE_RE = re.compile(MIG_PROFILE_PATTERN)
QUEUE_NAME_RE = re.compile(QUEUE_NAME_PATTERN)
JOB_ID_RE = re.compile(JOB_ID_PATTERN)
HOST_ID_RE = re.compile(HOST_ID_PATTERN)
MAX_TIME_LIMIT_S = 365 * 24 * 3600
MAX_GROUP_LIMIT = 100_000  # jobs of one group placed or running at once (wire.messages.JobSpec.group_limit)
MAX_RETRY_DELAY_S = 3600.0  # the first retry's wait (wire.messages.JobSpec.retry_delay_s)


def _whole(v: object, lo: int, hi: int) -> bool:
    """A whole number (not a bool) from `lo` to `hi`."""
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _real(v: object, lo: float, hi: float, *, above: bool = False) -> bool:
    """A number (not a bool, not NaN) from `lo` (or, `above`, more than it) to `hi`."""
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
            and (lo < v if above else lo <= v) and v <= hi)


def _given(data: dict[str, Any], key: str, default: Any) -> Any:
    """A field's value, `default` when it is absent or null; any other value is checked as
    given (found by exploring: `"time_limit_s": ""`, `"env": []`, `"gpu_share": false`
    were read as `... or 0` and taken silently as the defaults)."""
    value = data.get(key)
    return default if value is None else value


# The fields a job submitted over NATS may have: the stored spec's (but what only the
# control plane sets), its id, `held`, and `user` (which the subject overrides).
SUBMIT_FIELDS = frozenset(JobSpec.model_fields) - {"time_limit_exempt"} | {"id", "held", "user"}


def validate_job(
    data: dict[str, Any], known_models: Iterable[str] = ()
) -> tuple[JobSpec | None, list[ValidationError]]:
    """Check a job submission; returns (spec, []) or (None, errors)."""
    unstorable = next((k for k, v in data.items() if not storable(v)), None)
    if unstorable is not None:  # (a JSON body may hold "\ud800": it cannot be written as UTF-8)
        field = unstorable.split("_")[0] + "".join(w.title() for w in unstorable.split("_")[1:])
        return None, [ValidationError(field, "must be Unicode text: it holds a lone surrogate", "INVALID")]
    errors: list[ValidationError] = []

    def err(field: str, message: str, code: str = "INVALID") -> None:
        errors.append(ValidationError(field, message, code))

    name = data.get("name") or ""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        err("name", "must be 1-128 characters: letters, digits, '_', '.', '-', starting with a letter or digit")
    command = data.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        err("command", "must be a non-empty list of strings", "EMPTY_COMMAND")
    elif not command[0].strip():
        err("command", "the program (first element) must not be empty", "EMPTY_COMMAND")
    elif sum(len(c.encode()) for c in command) > MAX_COMMAND_BYTES or len(command) > 256:
        err("command", f"must be at most 256 arguments and {MAX_COMMAND_BYTES} bytes", "TOO_LARGE")
    elif any("\x00" in c for c in command):
        err("command", "must not contain NUL characters")
    env = _given(data, "env", {})
    if not isinstance(env, dict):
        err("env", "must be a map of names to values")
    else:
        if len(env) > MAX_ENV_VARS or sum(len(str(k)) + len(str(v)) for k, v in env.items()) > MAX_ENV_BYTES:
            err("env", f"must be at most {MAX_ENV_VARS} variables and {MAX_ENV_BYTES} bytes", "TOO_LARGE")
        for k, v in env.items():
            if not isinstance(k, str) or not ENV_KEY_RE.fullmatch(k) or not isinstance(v, str) or "\x00" in v:
                err("env", f"invalid variable {str(k)[:40]!r}")
                break
            if k in RESERVED_ENV:
                err("env", f"{k} is set by Muster for each task; a job cannot set it")
                break
    gpus = data.get("gpus", 0)
    cpus = data.get("cpus", 1.0)
    memory_mb = data.get("memory_mb", 512)
    if not _whole(gpus, 0, MAX_GPUS):
        err("gpus", f"must be a whole number from 0 to {MAX_GPUS}", "OUT_OF_RANGE")
    if not _real(cpus, MIN_CPUS, MAX_CPUS):
        err("cpus", f"must be from {MIN_CPUS:g} to {MAX_CPUS:g}", "OUT_OF_RANGE")
    if not _whole(memory_mb, 1, MAX_MEMORY_MB):
        err("memoryMb", f"must be more than 0 and at most {MAX_MEMORY_MB} MB", "OUT_OF_RANGE")
    share = _given(data, "gpu_share", 0)
    gpu_memory = _given(data, "gpu_memory_mb", 0)
    mig_profile = None if data.get("mig_profile") == "" else data.get("mig_profile")  # "": none
    if not _whole(share, 0, 999):
        err("gpuShare", "must be a whole number of thousandths of one GPU, from 1 to 999", "OUT_OF_RANGE")
    elif share and isinstance(gpus, int) and gpus:
        err("gpuShare", "a share of one GPU goes with gpus: 0 (ask for whole GPUs or for a share, not both)")
    if not _whole(gpu_memory, 0, MAX_GPU_MEMORY_MB):
        err("gpuMemoryMb", f"must be from 0 to {MAX_GPU_MEMORY_MB} MB", "OUT_OF_RANGE")
    elif gpu_memory and not share:
        err("gpuMemoryMb", "GPU memory is asked for with a share of a GPU (gpuShare); whole GPUs come with theirs")
    if mig_profile is not None:
        if not isinstance(mig_profile, str) or not MIG_PROFILE_RE.fullmatch(mig_profile):
            err("migProfile", "must be a MIG profile such as 1g.10gb or 3g.40gb", "INVALID")
        elif (isinstance(gpus, int) and gpus) or share:
            err("migProfile", "a MIG instance goes with gpus: 0 and no gpuShare")
    wants_gpu = (isinstance(gpus, int) and gpus > 0) or bool(share) or mig_profile is not None
    model = None if data.get("gpu_model") == "" else data.get("gpu_model")  # "": any
    models = data.get("gpu_models")
    known = KNOWN_GPU_MODELS.union(known_models)
    if model is not None and models:
        err("gpuModels", "give gpuModel (one model) or gpuModels (any of several), not both")
    elif model is not None:
        if not isinstance(model, str) or model not in known:
            err("gpuModel", f"unknown GPU model {str(model)[:32]!r}", "UNKNOWN_GPU_MODEL")
        elif not wants_gpu:
            err("gpuModel", "a GPU model needs gpus of at least 1 (or a gpuShare or migProfile)")
    elif models is not None:
        if (not isinstance(models, list) or not models or len(models) > 32
                or not all(isinstance(m, str) for m in models)):
            err("gpuModels", "must be a list of 1 to 32 GPU models")
            models = None
        elif unknown := [m for m in models if m not in known]:
            err("gpuModels", f"unknown GPU model {str(unknown[0])[:32]!r}", "UNKNOWN_GPU_MODEL")
        elif not wants_gpu:
            err("gpuModels", "GPU models need gpus of at least 1 (or a gpuShare or migProfile)")
    same_model = data.get("same_model", False)
    if not isinstance(same_model, bool):
        err("sameModel", "must be true or false")
    priority = data.get("priority", 0)
    if not _whole(priority, -1000, 1000):
        err("priority", "must be from -1000 to 1000", "OUT_OF_RANGE")
    max_attempts = data.get("max_attempts", 3)
    if not _whole(max_attempts, 1, 100):
        err("maxAttempts", "must be from 1 to 100", "OUT_OF_RANGE")
    cwd = data.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or len(cwd) > 4096 or "\x00" in cwd
                            or (cwd and not cwd.startswith("/"))):
        err("cwd", "must be an absolute path of at most 4096 characters (a relative one would be the agent's)")
    on_disconnect = data.get("on_disconnect", "STOP")
    if on_disconnect not in ("STOP", "KEEP_RUNNING"):
        err("onDisconnect", "must be STOP or KEEP_RUNNING")
    replace_after = data.get("replace_after_s", 0.0)
    if not _real(replace_after, 0, 7 * 24 * 3600):
        err("replaceAfter", "must be from 0 to 604800 seconds", "OUT_OF_RANGE")
    elif replace_after and on_disconnect != "KEEP_RUNNING":
        err("replaceAfter", "only applies to onDisconnect: KEEP_RUNNING")
    replicas = data.get("replicas", 1)
    if not _whole(replicas, 1, 256):
        err("replicas", "must be a whole number from 1 to 256", "OUT_OF_RANGE")
    same_rack = data.get("same_rack", False)
    if not isinstance(same_rack, bool):
        err("sameRack", "must be true or false")
    queue = _given(data, "queue", "")
    queue = DEFAULT_QUEUE if queue == "" else queue
    if not isinstance(queue, str) or not QUEUE_NAME_RE.fullmatch(queue):
        err("queue", "must be 1-63 characters: lower-case letters, digits, '_', '-', starting with a letter or digit")
    host_labels = _given(data, "host_labels", {})
    if not isinstance(host_labels, dict) or len(host_labels) > MAX_HOST_LABELS:
        err("hostLabels", f"must be a map of at most {MAX_HOST_LABELS} labels", "TOO_LARGE")
    else:
        for k, v in host_labels.items():
            if not isinstance(k, str) or not LABEL_KEY_RE.fullmatch(k):
                err("hostLabels", f"invalid label key {str(k)[:64]!r}: lower-case letters, digits, '_', '.', "
                    "'-', starting with a letter")
                break
            if not isinstance(v, str) or not LABEL_VALUE_RE.fullmatch(v):
                err("hostLabels", f"invalid value for label {k!r}")
                break
    exclude_hosts = _given(data, "exclude_hosts", [])
    if (not isinstance(exclude_hosts, list) or len(exclude_hosts) > MAX_EXCLUDED_HOSTS
            or not all(isinstance(h, str) and HOST_ID_RE.fullmatch(h) for h in exclude_hosts)):
        err("excludeHosts", f"must be a list of at most {MAX_EXCLUDED_HOSTS} host ids", "INVALID")
        exclude_hosts = []
    depends_on = _given(data, "depends_on", [])
    if not isinstance(depends_on, list) or len(depends_on) > MAX_DEPENDENCIES:
        err("dependsOn", f"must be a list of at most {MAX_DEPENDENCIES} job ids", "INVALID")
        depends_on = []
    elif bad := next((d for d in depends_on if not isinstance(d, str) or not JOB_ID_RE.fullmatch(d)), None):
        err("dependsOn", f"{str(bad)[:64]!r} is not a job id", "INVALID")
        depends_on = []
    depend_any = data.get("depend_any", False)
    depend_not_ok = data.get("depend_not_ok", False)
    if not isinstance(depend_any, bool) or not isinstance(depend_not_ok, bool) or (depend_any and depend_not_ok):
        err("dependency", "must be one of AFTER_OK, AFTER_ANY and AFTER_NOT_OK")
    time_limit = _given(data, "time_limit_s", 0)
    if not _real(time_limit, 0, MAX_TIME_LIMIT_S):
        err("timeLimitSeconds", f"must be from 0 (none) to {MAX_TIME_LIMIT_S} seconds", "OUT_OF_RANGE")
    group = _given(data, "group", "")
    group_limit = _given(data, "group_limit", 0)
    if not isinstance(group, str) or len(group) > 128 or any(c < " " for c in group):
        err("group", "must be at most 128 characters, none of them control characters")
    if not _whole(group_limit, 0, MAX_GROUP_LIMIT):
        err("groupLimit", f"must be a whole number from 0 (none) to {MAX_GROUP_LIMIT}", "OUT_OF_RANGE")
    elif group_limit and not group:
        err("groupLimit", "a limit needs a group: the jobs it counts are those of the same user and group")
    retry_failures = _given(data, "retry_failures", 0)
    retry_codes = _given(data, "retry_exit_codes", [])
    retry_timeouts = data.get("retry_timeouts", False)
    retry_delay = _given(data, "retry_delay_s", 0)
    if not _whole(retry_failures, 0, 100):
        err("retryFailures", "must be a whole number from 0 to 100", "OUT_OF_RANGE")
    if (not isinstance(retry_codes, list) or len(retry_codes) > 16
            or not all(_whole(c, -MAX_SIGNAL, 255) for c in retry_codes)):
        err("retryExitCodes", f"must be a list of at most 16 exit codes: 0 to 255, or -1 to -{MAX_SIGNAL} for a "
            "task ended by that signal (as an attempt's exitCode tells it)")
        retry_codes = []
    if not isinstance(retry_timeouts, bool):
        err("retryTimeouts", "must be true or false")
    if (retry_codes or retry_timeouts is True) and not retry_failures:
        err("retryFailures", "retryExitCodes and retryTimeouts say which tries retryFailures retries: give it too")
    if not _real(retry_delay, 0, MAX_RETRY_DELAY_S):
        err("retryDelaySeconds", f"must be from 0 (the default backoff) to {MAX_RETRY_DELAY_S:g} seconds",
            "OUT_OF_RANGE")
    elif retry_delay and not retry_failures:
        err("retryFailures", "retryDelaySeconds is the wait before retryFailures' retries: give it too")
    checkpoints = data.get("checkpoints", False)
    if not isinstance(checkpoints, bool):
        err("checkpoints", "must be true or false")
    begin_at = _given(data, "begin_at", 0)
    if not _real(begin_at, 0, MAX_EPOCH_S):
        # (Found by exploring: a time in the year 3000 was told it was no time at all.)
        far = isinstance(begin_at, int | float) and not isinstance(begin_at, bool) and begin_at > MAX_EPOCH_S
        err("beginAt", f"must be before {LATEST_DATE}" if far else "must be a time (epoch seconds, or a date and time)",
            "OUT_OF_RANGE")
    if errors:
        return None, errors
    assert isinstance(command, list)
    spec = JobSpec(
        name=name,
        command=command,
        env=env,
        cwd=cwd,
        gpus=gpus,
        gpu_model=model,
        cpus=float(cpus),
        memory_mb=memory_mb,
        priority=priority,
        max_attempts=max_attempts,
        user=str(data.get("user") or "operator")[:64],
        on_disconnect=on_disconnect,
        replace_after_s=float(replace_after),
        replicas=replicas,
        same_rack=same_rack,
        gpu_models=sorted(set(models)) if models and not model else None,
        same_model=same_model,
        gpu_share=share,
        gpu_memory_mb=gpu_memory,
        mig_profile=mig_profile,
        queue=queue,
        time_limit_s=float(time_limit),
        host_labels=dict(host_labels),
        exclude_hosts=sorted(set(exclude_hosts)),
        depends_on=list(dict.fromkeys(depends_on)),
        depend_any=bool(depend_any) and bool(depends_on),
        depend_not_ok=bool(depend_not_ok) and bool(depends_on),
        group=group,
        group_limit=group_limit,
        begin_at=float(begin_at),
        retry_failures=retry_failures,
        retry_exit_codes=sorted(set(retry_codes)),
        retry_timeouts=retry_timeouts is True,
        retry_delay_s=float(retry_delay),
        checkpoints=checkpoints is True,
    )
    # The records the job will make must fit what NATS accepts (wire.budgets).
    too_large = [ValidationError(f, m, "TOO_LARGE") for f, m in check_spec(spec)]
    if too_large:
        return None, too_large
    return spec, []


def validate_reason(reason: str, field: str = "reason", required: bool = False) -> str:
    """An operator's reason (cancel, cordon, drain): at most 512 characters, no control
    characters but tab and newline (`has_control`). Returns it stripped; raises
    ValidationError."""
    text = reason.strip()
    if required and not text:
        raise ValidationError(field, "a reason is required", "REQUIRED")
    if len(text) > MAX_REASON_CHARS:
        raise ValidationError(field, f"must be at most {MAX_REASON_CHARS} characters", "TOO_LARGE")
    if has_control(text):
        raise ValidationError(field, "must not contain control characters", "INVALID")
    return text


def storable(value: object) -> bool:
    """Whether every string in a decoded JSON value (keys too) can be written as UTF-8:
    JSON's escapes can name a lone surrogate, which no record can hold."""
    if isinstance(value, str):
        if value.isascii():
            return True
        try:
            value.encode()
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(storable(k) and storable(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(storable(v) for v in value)
    return True


def has_control(text: str, allowed: str = "\t\n") -> bool:
    """Whether an operator's text holds a character that is not text to show (other than
    those `allowed`): a control character (Unicode category Cc: the C0 controls, DEL and
    the C1 controls; PostgreSQL refuses a NUL, escapes break logs and terminals), a lone
    surrogate (Cs: it cannot be written as UTF-8, so a record holding one cannot be
    stored), a line or paragraph separator (Zl, Zp: a line break to some readers), or a
    bidirectional embedding, override or isolate (U+202A-202E, U+2066-2069: they reorder
    what a log line or a terminal shows after them). Other characters are text, whatever
    their category (an emoji sequence's joiner, a right-to-left mark)."""
    return any((unicodedata.category(c) in _NOT_TEXT or c in _BIDI_CONTROLS) and c not in allowed for c in text)


_NOT_TEXT = frozenset(("Cc", "Cs", "Zl", "Zp"))
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


LABEL_KEY_RE = re.compile(LABEL_KEY_PATTERN)
LABEL_VALUE_RE = re.compile(LABEL_VALUE_PATTERN)
MAX_LABELS = 32


def validate_labels(labels: dict[str, str]) -> list[ValidationError]:
    """Host labels: at most 32, keys like `rack` or `zone`, short plain values."""
    errors: list[ValidationError] = []
    if len(labels) > MAX_LABELS:
        errors.append(ValidationError("labels", f"at most {MAX_LABELS} labels"))
    for k, v in labels.items():
        if not LABEL_KEY_RE.fullmatch(k):
            errors.append(ValidationError("labels", f"invalid label key {k[:64]!r}"))
        elif not LABEL_VALUE_RE.fullmatch(v):
            errors.append(ValidationError("labels", f"invalid value for label {k!r}"))
    return errors


_QUEUE_FIELDS = {"preempt_grace_s": "preemptGraceSeconds", "min_runtime_s": "minRuntimeSeconds",
                 "default_time_limit_s": "defaultTimeLimitSeconds", "max_time_limit_s": "maxTimeLimitSeconds",
                 "max_preemptions": "maxPreemptions", "preempt_within": "preemptWithin",
                 "fair_share_preemption": "fairSharePreemption", "max_gpus_per_user": "maxGpusPerUser",
                 "max_submitted_jobs": "maxSubmittedJobs", "max_submitted_jobs_per_user": "maxSubmittedJobsPerUser",
                 "max_running_jobs_per_user": "maxRunningJobsPerUser",
                 "fair_share_users": "fairShareUsers", "host_labels": "hostLabels"}


_R = TypeVar("_R", bound=BaseModel)


def _record(cls: type[_R], data: dict[str, Any], names: dict[str, str], whole: str = "input") -> _R:
    """A record from an operator's input (snake_case fields of `cls`); raises
    InvalidInput with one error per bad field, each named as the API names it (`names`;
    `whole`: an error of the record as a whole)."""
    from wire.errors import InvalidInput

    try:
        return cls.model_validate(data)
    except PydanticValidationError as exc:
        errors = []
        for e in exc.errors():
            loc = [str(x) for x in e["loc"]]
            field = names.get(loc[0], loc[0]) if loc else whole
            where = f" ({'.'.join(loc[1:])})" if len(loc) > 1 else ""
            msg = str(e["msg"]).removeprefix("Value error, ")  # pydantic's prefix for a validator's own words
            errors.append(ValidationError(field, f"{msg}{where}", "INVALID"))
        raise InvalidInput(errors) from exc


_ADVRES_FIELDS = {"starts": "startsAt", "ends": "endsAt"}


def validate_advance_reservation(data: dict[str, Any]) -> AdvanceReservation:
    """An advance reservation's record from an operator's input (wire.messages.AdvanceReservation
    fields); raises InvalidInput with one error per bad field."""
    _check_name(data.get("name"))
    _check_description(data.get("description"))
    if not data.get("queues") and not data.get("users"):
        raise ValidationError("queues", "name queues or users whose jobs may use the hosts", "REQUIRED")
    return _record(AdvanceReservation, data, _ADVRES_FIELDS, whole="endsAt")


def _check_name(name: object) -> None:
    """A queue's or an advance reservation's name, told in words (not as the pattern)."""
    if not isinstance(name, str) or not QUEUE_NAME_RE.fullmatch(name):
        raise ValidationError("name", "must be 1-63 characters: lower-case letters, digits, '_', '-', starting with a "
                                      "letter or digit", "INVALID")


def _check_description(text: object) -> None:
    """A queue's or an advance reservation's description: no control characters but tab,
    newline and carriage return (`has_control`). Its length is the record's rule."""
    if isinstance(text, str) and has_control(text, "\t\n\r"):
        raise ValidationError("description", "must not contain control characters", "INVALID")


def validate_queue(data: dict[str, Any], known_models: set[str] | frozenset[str] = frozenset(),
                   kept: set[str] | frozenset[str] = frozenset()) -> Queue:
    """A queue's record from an operator's input (snake_case fields of wire.messages.Queue);
    raises InvalidInput with one error per bad field. A quota of a GPU model is refused
    unless the model is known (KNOWN_GPU_MODELS, `known_models`: the fleet's) or the
    queue had it before (`kept`) (found by exploring: `gpu:h100` was taken, and every GPU
    job of the queue waited for good, metered at 0 for the models it runs on)."""
    _check_name(data.get("name"))
    _check_description(data.get("description"))
    q = _record(Queue, data, _QUEUE_FIELDS)
    known = KNOWN_GPU_MODELS.union(known_models)
    for resource in q.quota:
        model = resource.partition(":")[2] if resource.startswith("gpu:") else None
        if model and model not in known and resource not in kept:
            raise ValidationError("quota", f"unknown GPU model {model[:32]!r} (GPU models are named as the hosts "
                                           "report them, such as H100)", "UNKNOWN_GPU_MODEL")
    for resource, rq in q.quota.items():
        # (Checked on input only: a record stored before this rule still reads.)
        if rq.lending_limit is not None and rq.lending_limit > rq.nominal:
            raise ValidationError("quota", f"{resource}: it lends at most its nominal quota ({rq.nominal:g}), not "
                                           f"{rq.lending_limit:g}", "OUT_OF_RANGE")
    if q.max_time_limit_s and q.default_time_limit_s > q.max_time_limit_s:
        raise ValidationError("defaultTimeLimitSeconds", "must not exceed maxTimeLimitSeconds", "OUT_OF_RANGE")
    return q
