"""Host health: a pure function of the last heartbeat and the clock."""

from __future__ import annotations

import enum


class Health(str, enum.Enum):
    HEALTHY = "HEALTHY"
    SUSPECT = "SUSPECT"
    LOST = "LOST"


def host_health(*, present: bool, last_seen: float, now: float, interval_s: float) -> Health:
    """HEALTHY while heartbeats arrive; SUSPECT after 2 missed ones; LOST once the
    heartbeat key has expired (the store's TTL decides, not our clock; or, where its
    marker never came, `key_overdue` on the store's clock)."""
    if not present:
        return Health.LOST
    if now - last_seen > 2 * interval_s:
        return Health.SUSPECT
    return Health.HEALTHY


# A heartbeat key the store should have expired is taken as expired this long after its
# TTL (beyond ClusterState's heartbeat interval): the store expires keys on a one-second
# tick, so its marker may come that much after the TTL.
EXPIRY_TICK_S = 1.0


def key_overdue(*, last_seen: float, ttl_s: float, now: float, margin_s: float) -> bool:
    """Whether a host's heartbeat key, last stored at `last_seen` with a TTL of `ttl_s`,
    should have expired `margin_s` before `now` (both the store's clock: `now` the time
    every host's heartbeats have been read up to) though no expiry marker came: the
    bucket was purged (a heartbeat published with `Nats-Rollup: all`, or an operator),
    which removes records without a marker. Such a host is taken as LOST like one whose
    key expired."""
    return now - last_seen > ttl_s + margin_s


def transitions(
    before: dict[str, Health], after: dict[str, Health]
) -> list[tuple[str, Health | None, Health]]:
    """Hosts whose health changed (None = not known before), in host order."""
    changed = [(h, before.get(h), new) for h, new in after.items() if before.get(h) is not new]
    changed.sort(key=lambda x: x[0])
    return changed
