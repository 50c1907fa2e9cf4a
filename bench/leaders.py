"""Runs with more than one `muster server`, and runs that kill something on purpose.

* `LeaderScrapes` turns each second's scrapes of every replica's /metrics into one
  series, that of whichever replica leads, with the counters the report turns into rates
  (placements, heartbeats read) continued across a change of leader: each scrape
  adds the followed replica's own increase since its previous scrape. Without this, a
  rate over a window in which the leader changed would subtract one process's counter
  from another's.
* `failover_figures` is what a kill did to the run, from the run's own records: time from
  the kill to the first placement after it, dispatch latency of the jobs submitted before
  the kill, while nothing was placed, and after.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.stats import summary_ms

# Counters the report makes rates of (bench/report.py): continued across a leader change.
CONTINUED = ("muster_placements_total", "muster_heartbeats_received_total")
LEADER_GAUGE = "muster_leader"


@dataclass
class LeaderScrapes:
    last: dict[str, dict[str, float]] = field(default_factory=dict)  # replica -> its previous scrape
    totals: dict[str, float] = field(default_factory=dict)
    leader: str | None = None
    changes: list[tuple[float, str | None, str]] = field(default_factory=list)  # (t, from, to)
    started: bool = False

    def add(self, t: float, scrapes: Mapping[str, dict[str, float]], order: list[str]) -> tuple[str, dict[str, float]]:
        """One second's scrapes (replica -> its metrics; replicas that did not answer
        left out), `order` the replicas in start order. Returns the replica the series
        follows now (the leader; with none, between a leader's death and the next
        takeover, the first replica that answered) and its metrics with the CONTINUED
        counters replaced by the series' totals: the first replica followed counts from
        its start, each later scrape adds the followed replica's increase since its own
        previous scrape (a follower places nothing; it does read heartbeats)."""
        leader = next((n for n in order if scrapes.get(n, {}).get(LEADER_GAUGE, 0) >= 1), None)
        follow = leader or next((n for n in order if n in scrapes), None)
        if follow is None:
            raise ValueError("no scrape to follow")
        m = dict(scrapes[follow])
        if leader is not None:
            if self.leader is not None and leader != self.leader:
                self.changes.append((t, self.leader, leader))
            self.leader = leader
        prev = self.last.get(follow)
        for k in CONTINUED:
            cur = m.get(k, 0.0)
            if not self.started:
                self.totals[k] = cur
            elif prev is not None:
                self.totals[k] = self.totals.get(k, 0.0) + max(0.0, cur - prev.get(k, cur))
            m[k] = self.totals.get(k, 0.0)
        self.started = True
        self.last.update(scrapes)
        return follow, m


def failover_figures(killed_at: float, what: str, submitted: Mapping[str, float],
                     dispatched: Mapping[str, float], placed_at: Mapping[str, float]) -> dict[str, Any]:
    """What a kill at `killed_at` did: `submitted` job -> submit time, `dispatched` job ->
    when it reached its host(s), `placed_at` job -> the leader's placement time of its
    first try. Phases by submit time: before the kill, during (until the first placement
    after it), after."""
    after = sorted(t for j, t in placed_at.items() if j in submitted and t > killed_at)
    first = after[0] - killed_at if after else None
    phases: dict[str, list[float]] = {"before": [], "during": [], "after": []}
    for j, ts in submitted.items():
        d = dispatched.get(j)
        if d is None:
            continue
        key = ("before" if ts < killed_at else
               "during" if first is not None and ts < killed_at + first else "after")
        phases[key].append(d - ts)
    placed_in_5s = sum(1 for t in after if t <= killed_at + (first or 0) + 5)
    return {"killed": what, "killed_at": round(killed_at, 3),
            "kill_to_first_placement_s": round(first, 3) if first is not None else None,
            "placements_in_5_s_after_the_first": placed_in_5s,
            "dispatch_latency_ms": {k: summary_ms(v) for k, v in phases.items()}}
