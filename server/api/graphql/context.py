"""What resolvers take from the request context, and the conversions they share."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

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
