"""A host's labels as placement and failure domains read them: what its agent reports
(`Heartbeat.labels`, its `--labels`) and what the operators set (`HostConfig.labels`,
`muster host label`), with the keys only operators may set (`LabelTrust`). Pure.

An agent's NATS credentials are on its host: whoever holds that host can make its
heartbeat say anything. A label that decides whose jobs a host takes (`team=vision`, a
queue's `hostLabels`) or which failure domain it is in (`rack`, `zone`: the eviction
budgets) must not come from there. For a trusted key (MUSTER_OPERATOR_LABEL_KEYS, and
every key beginning `muster.`) the host has the operator's value, or none: what its
agent says of that key is ignored, and a differing claim is noted (`disputes`). Any
other key is the agent's, unless the operator set it too (the operator's value wins),
as Slurm's node features come from slurm.conf and Kubernetes' node labels from the
admin, the kubelet being kept off `node-restriction.kubernetes.io/`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Keys beginning with this are the operators' whatever MUSTER_OPERATOR_LABEL_KEYS says.
RESERVED_PREFIX = "muster."


@dataclass(frozen=True)
class LabelTrust:
    """The label keys only operators set: `keys`, and every key beginning RESERVED_PREFIX."""

    keys: frozenset[str] = frozenset()

    def operators(self, key: str) -> bool:
        """Whether `key` is one only operators set (its agent's value is never used)."""
        return key in self.keys or key.startswith(RESERVED_PREFIX)


@dataclass(frozen=True, order=True)
class Dispute:
    """An agent reporting a trusted key with a value other than the operator's: `operator`
    is the operator's value, None when the operator set none on the host."""

    key: str
    agent: str
    operator: str | None

    def text(self) -> str:
        theirs = "none" if self.operator is None else f"{self.key}={self.operator}"
        return f"{self.key}={self.agent} (the operator's: {theirs})"


def effective_labels(reported: Mapping[str, str], operator: Mapping[str, str], trust: LabelTrust) -> dict[str, str]:
    """The labels a host has: its agent's of keys not trusted, then the operator's (which
    win where both set a key)."""
    out = {k: v for k, v in reported.items() if not trust.operators(k)}
    out.update(operator)
    return out


def disputes(reported: Mapping[str, str], operator: Mapping[str, str], trust: LabelTrust) -> tuple[Dispute, ...]:
    """The trusted keys the agent reports with another value than the operator's (or that
    the operator did not set), by key."""
    return tuple(sorted(Dispute(k, v, operator.get(k)) for k, v in reported.items()
                        if trust.operators(k) and operator.get(k) != v))


def parse_keys(text: str) -> frozenset[str]:
    """The keys of a comma-separated list (MUSTER_OPERATOR_LABEL_KEYS), blanks left out."""
    return frozenset(k.strip() for k in text.split(",") if k.strip())


def changed_labels(current: Mapping[str, str], set_: Mapping[str, str], remove: Iterable[str]) -> dict[str, str]:
    """The operator's labels of a host after removing the keys `remove` and setting `set_`."""
    out = {k: v for k, v in current.items() if k not in set(remove)}
    out.update(set_)
    return out
