"""Muster's one error hierarchy.

    MusterError                  every error Muster raises on purpose; `field` and `code`
    │                            say what a client shows (GraphQL userErrors, CLI)
    ├── ConfigError              bad settings or command-line options
    ├── ValidationError          a user's input was rejected (field, message, code)
    │   └── InvalidInput         several of them at once (`errors`)
    ├── NotFound                 a job, host, queue or token that does not exist
    ├── AuthError                missing, wrong or revoked credentials
    │   └── Forbidden            valid credentials whose role may not do this
    ├── StoreError               the NATS store failed (foreign exceptions translated here)
    │   ├── ConflictError        a revision-checked write lost a race (retry from a fresh view)
    │   ├── FencedError          the write carried a stale leadership term (step down)
    │   ├── RejectedError        the store refused the write for what it holds (too large, ...):
    │   │                        sending it again unchanged cannot succeed
    │   ├── SubmissionsWaiting   the SUBMIT stream holds as many messages not yet taken by the
    │   │                        leader as it may (of the subject, or in all): send again later
    │   └── HistoryUnavailable   the history database did not answer a read
    └── DecodeError              an untrusted message could not be decoded

Each boundary maps them once: GraphQL (server.api.graphql.errors: userErrors on
mutations, errors with a code on queries), HTTP (the console's error pages), the CLI
(exit codes, server.cli).
"""

from __future__ import annotations


class MusterError(Exception):
    """Base of every error Muster raises on purpose."""

    code = "ERROR"
    field = ""

    def __init__(self, message: str = "", *, field: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if field is not None:
            self.field = field
        if code is not None:
            self.code = code

    def details(self) -> list[MusterError]:
        """The individual errors this one stands for (itself, unless it groups several)."""
        return [self]


class ConfigError(MusterError):
    code = "CONFIG"


class ValidationError(MusterError):
    code = "INVALID"

    def __init__(self, field: str, message: str, code: str = "INVALID") -> None:
        super().__init__(message, field=field, code=code)

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class InvalidInput(ValidationError):
    """Several validation errors at once (a job submission with more than one bad field)."""

    def __init__(self, errors: list[ValidationError]) -> None:
        first = errors[0] if errors else ValidationError("", "invalid input")
        super().__init__(first.field, "; ".join(str(e) for e in errors) or first.message, first.code)
        self.errors = list(errors) or [first]

    def details(self) -> list[MusterError]:
        return list(self.errors)


class NotFound(MusterError):
    code = "NOT_FOUND"
    field = "id"


class AuthError(MusterError):
    code = "UNAUTHORISED"


class Forbidden(AuthError):
    code = "FORBIDDEN"


class StoreError(MusterError):
    code = "UNAVAILABLE"


class ConflictError(StoreError):
    code = "CONFLICT"


class FencedError(StoreError):
    code = "FENCED"


class HistoryUnavailable(StoreError):
    code = "HISTORY_UNAVAILABLE"


class RejectedError(StoreError):
    code = "REJECTED"

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key  # the record the store refused, when known


class SubmissionsWaiting(StoreError):
    code = "TOO_MANY_WAITING"


class DecodeError(MusterError):
    code = "MALFORMED"
