"""Alerts of one kind noticed together: one a host, a GPU or a job as they are, or past
a few one alert standing for them all (storm control). Pure."""

from __future__ import annotations

from wire.messages import Event

# Alerts of one kind noticed in one check beyond which one alert stands for them all (the
# first hosts named): a NATS node's loss can fence most of the fleet at once, a switch or
# a rack's power take hundreds of hosts, a driver fault every GPU of a rack, and 50,000
# alerts would bury everything else.
ALERTS_ONE_BY_ONE = 5
ALERT_HOSTS_NAMED = 20


def summarized(events: list[Event], now: float, head: str, totals: dict[str, object], of: str = "host") -> list[Event]:
    """Alerts of one kind noticed together (one a host, a GPU or a job) as they are, or
    past ALERTS_ONE_BY_ONE one alert standing for them all: `head`, the first hosts (or
    jobs, `of="job"`) by name, and in its data how many there are, their first names
    (`hosts` and `host_ids`, or `jobs` and `job_ids`) and `totals`."""
    if len(events) <= ALERTS_ONE_BY_ONE:
        return events
    return [summary(events, now, head, totals, of)]


def summary(events: list[Event], now: float, head: str, totals: dict[str, object], of: str = "host") -> Event:
    """One alert standing for `events` (see `summarized`)."""
    ids = list(dict.fromkeys(getattr(e, f"{of}_id") or "?" for e in events))
    names = ids[:ALERT_HOSTS_NAMED]
    more = f" and {len(ids) - len(names)} more" if len(ids) > len(names) else ""
    return Event(kind=events[0].kind, ts=now, message=f"{head}: {', '.join(names)}{more}",
                 data={f"{of}s": len(ids), f"{of}_ids": names, **totals})
