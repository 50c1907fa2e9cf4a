"""Eviction policy for work on lost hosts: pure, a function of a snapshot and a clock.

Rescheduling out of each failure domain (a `rack` or `zone` label) is paced by its own
token bucket, and a global budget bounds all of it. When a large share of one domain is
lost within a short window, the loss is treated as a suspected partition rather than as
many independent failures (an alert says so): the pacing means a switch blip does not
turn into a rescheduling storm, and work that was not yet replaced when its host comes
back stays there (for STOP jobs the agent has already stopped it by then; KEEP_RUNNING
jobs simply continue). Work elsewhere draws on its own domains' buckets, so it is unaffected.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

DOMAIN_LABELS = ("rack", "zone")


@dataclass(frozen=True)
class EvictionConfig:
    domain_share: float = 0.5  # more than this share of a domain lost ...
    domain_window_s: float = 30.0  # ... within this window = suspected partition
    domain_min_hosts: int = 2  # domains smaller than this are never "disrupted"
    domain_rate_per_s: float = 20.0  # reschedules per second out of a disrupted domain
    domain_burst: float = 20.0
    global_rate_per_s: float = 200.0  # all reschedules, everywhere
    global_burst: float = 400.0


@dataclass(frozen=True)
class HostLoss:
    host_id: str
    labels: dict[str, str]
    lost_at: float


@dataclass
class Bucket:
    """A token bucket; `take()` is deterministic given the clock passed in."""

    rate: float
    burst: float
    tokens: float = -1.0
    at: float = 0.0

    def refill(self, now: float) -> None:
        if self.tokens < 0:
            self.tokens, self.at = self.burst, now
            return
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = now

    def take(self, now: float) -> bool:
        self.refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def disrupted_domains(
    losses: Iterable[HostLoss],
    domain_sizes: dict[tuple[str, str], int],
    now: float,
    config: EvictionConfig,
) -> dict[tuple[str, str], int]:
    """Domains (label, value) where more than `domain_share` of the hosts were lost
    within the last `domain_window_s`; value = hosts lost in the window."""
    recent: dict[tuple[str, str], int] = defaultdict(int)
    for loss in losses:
        if now - loss.lost_at > config.domain_window_s:
            continue
        for label in DOMAIN_LABELS:
            v = loss.labels.get(label)
            if v:
                recent[(label, v)] += 1
    out = {}
    for dom, n in recent.items():
        size = domain_sizes.get(dom, 0)
        if size >= config.domain_min_hosts and n > config.domain_share * size:
            out[dom] = n
    return out


@dataclass
class EvictionBudget:
    """The buckets that pace rescheduling, kept by the leader between cycles."""

    config: EvictionConfig = field(default_factory=EvictionConfig)
    domains: dict[tuple[str, str], Bucket] = field(default_factory=dict)
    global_bucket: Bucket | None = None
    # What `allow` spent since the last `taken()`: the domains of each reschedule allowed.
    spent: list[tuple[tuple[str, str], ...]] = field(default_factory=list)

    def allow(self, host_domains: list[tuple[str, str]], disrupted: dict[tuple[str, str], int], now: float) -> bool:  # noqa: ARG002
        """One reschedule out of a host in `host_domains`: within every budget?"""
        if self.global_bucket is None:
            self.global_bucket = Bucket(self.config.global_rate_per_s, self.config.global_burst)
        # Every domain has its own bucket: a lone failed host is far below the pace, and
        # a domain failing host by host is paced before it crosses the partition line.
        paced = list(host_domains)
        buckets = [
            self.domains.setdefault(d, Bucket(self.config.domain_rate_per_s, self.config.domain_burst))
            for d in paced
        ]
        for b in (*buckets, self.global_bucket):
            b.refill(now)
        if all(b.tokens >= 1.0 for b in (*buckets, self.global_bucket)):
            for b in (*buckets, self.global_bucket):
                b.tokens -= 1.0
            self.spent.append(tuple(paced))
            return True
        return False

    def taken(self) -> list[tuple[tuple[str, str], ...]]:
        """What was spent since the last call: one cycle's reschedules, to be given back
        (`refund`) if that cycle's commit does not land."""
        spent, self.spent = self.spent, []
        return spent

    def refund(self, spent: Iterable[tuple[tuple[str, str], ...]], now: float) -> None:
        """Give back what a cycle spent whose reschedules did not happen (its commit was
        refused, fenced or lost, or it was planned again): a failed commit does not slow the
        next cycle's rescheduling."""
        for domains in spent:
            buckets = [self.domains[d] for d in domains if d in self.domains]
            if self.global_bucket is not None:
                buckets.append(self.global_bucket)
            for b in buckets:
                b.refill(now)
                b.tokens = min(b.burst, b.tokens + 1.0)


def host_domains(labels: dict[str, str]) -> list[tuple[str, str]]:
    return [(label, labels[label]) for label in DOMAIN_LABELS if labels.get(label)]
