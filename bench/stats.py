"""Figures from samples and from Prometheus scrapes: nearest-rank percentiles, latency
summaries in milliseconds, the text exposition format parsed into a dict, and the
server's histograms read back (over the whole run, or between two scrapes)."""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from typing import Any


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))
    return xs[k]


def summary_ms(xs: list[float]) -> dict[str, Any]:
    ms = [x * 1000 for x in xs]
    r = lambda v: None if v is None else round(v, 1)  # noqa: E731
    return {"n": len(ms), "p50": r(pct(ms, 50)), "p95": r(pct(ms, 95)), "p99": r(pct(ms, 99)),
            "max": r(max(ms)) if ms else None, "mean": r(statistics.fmean(ms)) if ms else None}


# The server's gauge of hosts it sees as SUSPECT (no heartbeat applied for two intervals).
SUSPECT_GAUGE = 'muster_hosts{health="SUSPECT"}'


def max_in(samples: list[tuple[float, dict[str, float]]], name: str) -> float | None:
    """The largest value of metric `name` in scraped `samples`; None if it never appeared."""
    values = [m[name] for _, m in samples if name in m]
    return max(values) if values else None


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


def _histogram(first: dict[str, float], end: dict[str, float], name: str
               ) -> tuple[list[tuple[float, float]], float, float]:
    """A Prometheus histogram between two scrapes (`first` empty: since the start),
    summed over its labels: (cumulative count by bucket bound, ascending), count, sum."""
    by_le: dict[float, float] = defaultdict(float)
    total = sum_s = 0.0
    for k, v in end.items():
        if not k.startswith(name):
            continue
        mm = re.match(rf'{name}_bucket\{{(?:[^}}]*,)?le="([^"]+)"\}}', k)
        if mm:
            by_le[float("inf") if mm.group(1) == "+Inf" else float(mm.group(1))] += v - first.get(k, 0.0)
        elif re.match(rf"{name}_count(\{{|$)", k):
            total += v - first.get(k, 0.0)
        elif re.match(rf"{name}_sum(\{{|$)", k):
            sum_s += v - first.get(k, 0.0)
    return sorted(by_le.items()), total, sum_s


def histogram_quantiles(m: dict[str, float], name: str) -> dict[str, Any]:
    """p50/p95/p99 upper bounds from a Prometheus histogram's cumulative buckets."""
    buckets, total, sum_s = _histogram({}, m, name)
    out: dict[str, Any] = {"count": int(total), "sum_s": round(sum_s, 3)}
    for p in (50, 95, 99):
        le = None
        for b, c in buckets:
            if total and c >= total * p / 100:
                le = b
                break
        out[f"p{p}_le_s"] = le if le != float("inf") else "+Inf"
    return out


def histogram_window(first: dict[str, float], end: dict[str, float], name: str) -> dict[str, Any]:
    """Observations of a Prometheus histogram between two scrapes: how many, how many
    longer than 0.1, 0.5 and 1 s, and the bucket the longest fell in."""
    cum, total, sum_s = _histogram(first, end, name)
    out: dict[str, Any] = {"count": int(total), "sum_s": round(sum_s, 3)}
    for limit in (0.1, 0.5, 1.0):
        within = max((c for b, c in cum if b <= limit), default=0.0)
        out[f"over_{limit:g}_s"] = int(total - within)
    longest = next((b for b, c in cum if c >= total), None) if total else None
    out["max_le_s"] = "+Inf" if longest == float("inf") else longest
    return out

