"""What a `muster` command raises, and the exit code each error becomes.

Commands raise errors of the project's one hierarchy (wire.errors) and never pick an
exit code themselves; `server.cli.entry.main` turns an error into its code with
`exit_code()`. The two errors below are the CLI's own, both still MusterErrors.
"""

from __future__ import annotations

import re

from wire.errors import AuthError, Forbidden, MusterError, NotFound

EXIT_OK = 0
EXIT_ERROR = 1  # any other MusterError
EXIT_PLACEMENT = 2  # JobFailed: the waited-for job FAILED, TIMEOUT or CANCELLED, or was not placed in --timeout
EXIT_NOT_FOUND = 3  # NotFound
EXIT_UNAUTHORISED = 4  # AuthError: no token, or the API refused it
EXIT_INTERRUPTED = 130  # Ctrl-C (outside --watch and `alerts tail`, where Ctrl-C is the way out: 0)


class ApiError(MusterError):
    """The API could not be reached, answered with errors, or rejected the input."""


class JobFailed(MusterError):
    """`job submit --wait`: the job FAILED, TIMEOUT or CANCELLED, or was still not placed when --timeout
    passed."""


# The first class that matches wins: subclasses before their bases.
_EXIT_CODES: tuple[tuple[type[MusterError], int], ...] = (
    (JobFailed, EXIT_PLACEMENT),
    (NotFound, EXIT_NOT_FOUND),
    (AuthError, EXIT_UNAUTHORISED),
    (MusterError, EXIT_ERROR),
)


def exit_code(exc: MusterError) -> int:
    for cls, code in _EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return EXIT_ERROR  # pragma: no cover - MusterError matches every MusterError


# The API's names, in its errors, for what a CLI user gives as an option or a command,
# and the CLI's words for each (found by exploring: `job submit --time-limit` was told
# `timeLimitSeconds: ...`, `queue create default` to "change it with updateQueue"). Put in
# when a command prints a mutation's userErrors; the server's message is otherwise as it
# is, and GraphQL clients get it unchanged.
CLI_WORDS: dict[str, str] = {
    # job submit, job set
    "timeLimitSeconds": "--time-limit", "dependsOn": "--after", "AFTER_ANY": "--after-any",
    "AFTER_NOT_OK": "--after-notok", "hostLabels": "--host-label", "excludeHosts": "--exclude",
    "maxAttempts": "--max-attempts", "memoryMb": "--memory-mb", "gpuMemoryMb": "--gpu-memory-mb",
    "gpuShare": "--gpu-share", "gpuModel": "--gpu-model", "gpuModels": "--gpu-model", "migProfile": "--mig-profile",
    "groupLimit": "--group-limit", "beginAt": "--begin",
    "retryFailures": "--retry-failures", "retryExitCodes": "--retry-exit-code", "retryTimeouts": "--retry-timeouts",
    "retryDelaySeconds": "--retry-delay", "replaceAfter": "--replace-after",
    "onDisconnect: KEEP_RUNNING": "--keep-running",
    # queue create, queue set
    "createQueue": "muster queue create", "updateQueue": "muster queue set", "preemptGraceSeconds": "--grace",
    "minRuntimeSeconds": "--min-runtime", "defaultTimeLimitSeconds": "--default-time-limit",
    "maxTimeLimitSeconds": "--max-time-limit", "maxPreemptions": "--max-preemptions",
    "maxGpusPerUser": "--max-gpus-per-user", "maxSubmittedJobs": "--max-submitted-jobs",
    "maxSubmittedJobsPerUser": "--max-submitted-jobs-per-user", "maxRunningJobsPerUser": "--max-running-jobs-per-user",
    # host drain, reservation create and set
    "deadlineSeconds": "--deadline", "startsAt": "--start", "endsAt": "--end",
}
_API_WORDS = re.compile(r"(?<![\w$-])(" + "|".join(map(re.escape, sorted(CLI_WORDS, key=len, reverse=True)))
                        + r")(?![\w-])")


def cli_words(text: str) -> str:
    """`text` (an API error's field or message) with the API's names in CLI_WORDS put in the CLI's words."""
    return _API_WORDS.sub(lambda m: CLI_WORDS[m.group(1)], text)


def user_errors(errors: list[dict[str, str]], line: str = "{field}: {message}") -> MusterError:
    """The error for a mutation's `userErrors` (a non-empty list): NotFound when the first
    is NOT_FOUND, Forbidden (exit 4) when it is FORBIDDEN, else ApiError; one message line
    per error, formatted by `line` (an error about no one field, such as a queue the token
    may not use, without it), in the CLI's words (`cli_words`)."""
    text = "\n".join(cli_words(line.format(**e) if e.get("field") else str(e.get("message", ""))) for e in errors)
    kind = {NotFound.code: NotFound, Forbidden.code: Forbidden}.get(errors[0].get("code", ""), ApiError)
    return kind(text)
