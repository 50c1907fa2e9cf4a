"""Host health: a pure function of the last heartbeat and the clock."""

from __future__ import annotations

import enum


class Health(str, enum.Enum):
    HEALTHY = "HEALTHY"
    SUSPECT = "SUSPECT"
    LOST = "LOST"


def host_health(*, present: bool, last_seen: float, now: float, interval_s: float) -> Health:
    """HEALTHY while heartbeats arrive; SUSPECT after 2 missed ones; LOST once the
    heartbeat key has expired (the store's TTL decides, not our clock)."""
    if not present:
        return Health.LOST
    if now - last_seen > 2 * interval_s:
        return Health.SUSPECT
    return Health.HEALTHY


def transitions(
    before: dict[str, Health], after: dict[str, Health]
) -> list[tuple[str, Health | None, Health]]:
    """Hosts whose health changed (None = not known before), in host order."""
    changed = [(h, before.get(h), new) for h, new in after.items() if before.get(h) is not new]
    changed.sort(key=lambda x: x[0])
    return changed
