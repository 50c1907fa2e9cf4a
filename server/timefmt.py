"""Times as people give and read them: ISO 8601 in UTC. A time given without an offset is
taken as UTC (GraphQL's DateTime inputs, the console's forms and the CLI alike)."""

from __future__ import annotations

import datetime as dt
import re


def iso_utc(t: float) -> str:
    """A Unix time as ISO 8601 in UTC, to the second (`2026-12-24T06:00:00Z`)."""
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def as_utc(t: dt.datetime) -> dt.datetime:
    """`t`, taken as UTC when it names no offset."""
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)


# A start (a drain's, an advance reservation's) up to this far past is taken as now (a
# script's "at 06:00" sent at 06:00:05); further past is refused as a mistake (a wrong day
# or year would act at once).
PAST_START_SLACK_S = 300.0
# What still runs this long after a drain begins is stopped, unless the drain says otherwise
# (the API, the CLI and the console alike: the console's was 600 s, found by a review).
DRAIN_DEADLINE_S = 300.0

DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


# ASCII digits only: str.isdigit() took '²' (float() refused it: a traceback) and '٣' (read
# as 3), found by exploring.
_DURATION = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)([smhd])")


def duration_s(text: str) -> float | None:
    """A duration such as `90m`, `2h`, `1d` in seconds (None: not one)."""
    m = _DURATION.fullmatch(text)
    return float(m.group(1)) * DURATION_UNITS[m.group(2)] if m else None


def duration_text(s: float) -> str:
    """A duration in seconds as people read it (a time limit, in messages, the CLI and the
    console): seconds under a day (`90 s`, `7200 s`, as other durations are shown); from a
    day up, a whole number of days or hours as `duration_s` reads them (`30d`, `36h`), or
    else seconds; never with an exponent (`:g` wrote 30 days as `2.592e+06 s`)."""
    if s >= DURATION_UNITS["d"]:
        for unit in ("d", "h"):
            if s % DURATION_UNITS[unit] == 0:
                return f"{s // DURATION_UNITS[unit]:.0f}{unit}"
    return f"{s:g} s" if abs(s) < 1e6 else f"{s:.0f} s" if s == int(s) else f"{s:.1f} s"


def parse_time(text: str) -> dt.datetime:
    """An ISO 8601 date and time, UTC unless it names an offset; raises ValueError."""
    return as_utc(dt.datetime.fromisoformat(text))
