"""Times as the CLI takes and prints them: ISO 8601 (UTC unless it names an offset) or a
duration from now (`90m`, `2h`, `1d`), ahead of now or ago."""

from __future__ import annotations

import datetime as dt

from server.timefmt import duration_s as seconds
from server.timefmt import parse_time
from wire.errors import ConfigError

__all__ = ["ago", "ahead", "seconds", "when_text"]


def _parse(text: str, sign: int, example: str) -> str:
    if (s := seconds(text)) is not None:
        try:
            return (dt.datetime.now(dt.UTC) + sign * dt.timedelta(seconds=s)).isoformat()
        except (OverflowError, ValueError):  # (found by exploring: a traceback)
            raise ConfigError(f"{text!r} is too far from now") from None
    try:
        return parse_time(text).isoformat()
    except ValueError:
        raise ConfigError(f"{text!r} is neither an ISO date/time nor a {example}") from None


def ahead(text: str | None) -> str | None:
    """A time given as ISO 8601 or as a time from now (`2h`), as ISO 8601."""
    return _parse(text, 1, "time from now like 2h") if text else None


def ago(text: str | None) -> str | None:
    """A time given as ISO 8601 or as a time before now (`24h`: a day ago), as ISO 8601."""
    return _parse(text, -1, "duration like 24h") if text else None


def when_text(iso: str | None) -> str:
    """A time from the API in words: to the minute, in UTC."""
    if not iso:
        return "-"
    return parse_time(iso).astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
