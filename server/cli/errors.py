"""What a `muster` command raises, and the exit code each error becomes.

Commands raise errors of the project's one hierarchy (wire.errors) and never pick an
exit code themselves; `server.cli.entry.main` turns an error into its code with
`exit_code()`. The two errors below are the CLI's own, both still MusterErrors.
"""

from __future__ import annotations

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


def user_errors(errors: list[dict[str, str]], line: str = "{field}: {message}") -> MusterError:
    """The error for a mutation's `userErrors` (a non-empty list): NotFound when the first
    is NOT_FOUND, Forbidden (exit 4) when it is FORBIDDEN, else ApiError; one message line
    per error, formatted by `line` (an error about no one field, such as a queue the token
    may not use, without it)."""
    text = "\n".join(line.format(**e) if e.get("field") else str(e.get("message", "")) for e in errors)
    kind = {NotFound.code: NotFound, Forbidden.code: Forbidden}.get(errors[0].get("code", ""), ApiError)
    return kind(text)
