"""What resolvers take from the request context, and the conversions they share."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING

from strawberry.extensions import SchemaExtension
from strawberry.types import Info

from server.api.auth import allows
from server.timefmt import as_utc
from wire.errors import Forbidden

if TYPE_CHECKING:
    from server.replica import Muster


def muster(info: Info) -> Muster:
    return info.context["muster"]


def require(info: Info, role: str = "operator") -> None:
    """Raise Forbidden unless the caller's token has `role` (or a higher one)."""
    if not allows(info.context.get("token"), role):
        raise Forbidden(f"this needs the {role} role")


def user(info: Info) -> str:
    tok = info.context.get("token")
    return tok.name if tok else "anonymous"


def ts(t: float | None) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC) if t else None


def epoch(t: dt.datetime | None) -> float | None:
    return as_utc(t).timestamp() if t is not None else None


# What one operation has done so far (jobs submitted, cancelled), for the limits per
# request: the context is one per HTTP request, but one per connection on a WebSocket,
# whose operations (mutations too) run each in a task of its own (a review: the limits
# became the connection's). Set by PerOperation for the task an operation runs in.
_OPERATION_COUNTS: ContextVar[dict[str, int] | None] = ContextVar("muster_operation_counts", default=None)


class PerOperation(SchemaExtension):
    """A fresh count for each operation (`operation_counts`)."""

    def on_operation(self) -> Iterator[None]:
        token = _OPERATION_COUNTS.set({})
        try:
            yield
        finally:
            try:
                _OPERATION_COUNTS.reset(token)
            except ValueError:  # (ended in another context: nothing of it is read there)
                pass


def operation_counts(info: Info) -> dict[str, int]:
    """The counts of the operation `info` belongs to (the request's context's, where no
    PerOperation extension runs)."""
    counts = _OPERATION_COUNTS.get()
    if counts is None:
        counts = info.context.setdefault("operation_counts", {})
    return counts
