"""What a KV read or watch yields, and how to read JetStream's delivery metadata: plain
data and string parsing, no I/O, so that pure code (the cluster view, the decisions) can
name a record without importing the NATS client."""

from __future__ import annotations

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
