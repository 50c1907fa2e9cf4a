"""What a KV read or watch yields, and how to read JetStream's delivery metadata: plain
data and string parsing, no I/O, so that pure code (the cluster view, the decisions) can
name a record without importing the NATS client."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Record:
    """One KV value as read or watched: key, revision and payload (None when deleted)."""

    key: str
    revision: int
    value: bytes | None
    headers: dict[str, str] | None = None
    # From a watch: when the store stored it (its clock, seconds; 0.0 unknown), and how
    # many records were still pending in the stream after it.
    stamp: float = 0.0
    behind: int = 0
    # Records the watch never saw just before this one (removed from the stream first:
    # a newer value of their key replaced them, or they expired), once synced.
    skipped: int = 0


def is_tombstone(headers: dict[str, str] | None) -> bool:
    """A KV record's headers say it is a deletion: DEL/PURGE, or a TTL expiry marker."""
    if not headers:
        return False
    if headers.get("KV-Operation") in ("DEL", "PURGE"):
        return True
    return "Nats-Marker-Reason" in headers


_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s|m|h)?")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


@functools.lru_cache(maxsize=64)
def _duration_s(text: str) -> float | None:
    """A `Nats-TTL` value in seconds: a number of seconds ("15"), or a duration as Go writes
    one ("15s", "1m0s", "500ms"); None for anything else ("never" included)."""
    text = text.strip().lower()
    if not text:
        return None
    total, at = 0.0, 0
    while at < len(text):
        m = _DURATION_PART.match(text, at)
        if m is None or (m.group(2) is None and (at or m.end() < len(text))):
            return None  # (a bare number only alone)
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        at = m.end()
    return total


def stored_ttl_s(headers: Mapping[str, str] | None) -> float | None:
    """The TTL a record was stored with (its `Nats-TTL` header: "15s", "15", "1m"), in
    seconds; None when it has none that reads (the store keeps it until it is replaced)."""
    text = (headers or {}).get("Nats-TTL")
    return _duration_s(text) if text else None


def rolls_up_all(headers: Mapping[str, str] | None) -> bool:
    """Whether a record was published with `Nats-Rollup: all`: the store removed every
    other record of its stream as it stored it (in the `hosts` bucket, every host's
    heartbeat, without an expiry marker)."""
    return (headers or {}).get("Nats-Rollup", "").strip().lower() == "all"


def ack_position(reply: str | None) -> tuple[int, int, float] | None:
    """(stream sequence, messages pending, stored at in seconds) of a JetStream delivery,
    read from its reply subject: `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.
    <ts>.<pending>`, or the form with `<domain>.<account hash>` after `ACK` (and a
    trailing token). The same fields nats-py's `Msg.metadata` parses; building the whole
    metadata (objects, a datetime) was an eighth of the heartbeat ingest process's CPU
    at 10,000 heartbeats/s. None when the subject is neither form."""
    if not reply:
        return None
    tokens = reply.split(".")
    if tokens[0] != "$JS" or len(tokens) < 9 or tokens[1] != "ACK":
        return None
    try:
        if len(tokens) == 9:
            return int(tokens[5]), int(tokens[8]), int(tokens[7]) / 1e9
        if len(tokens) >= 11:
            return int(tokens[7]), int(tokens[10]), int(tokens[9]) / 1e9
    except ValueError:
        return None
    return None
