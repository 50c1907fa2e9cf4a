"""Reads the recorded state from NATS and runs the invariant checks (`muster check`)."""

from __future__ import annotations

import asyncio

from server.state.cluster import ClusterState
from server.state.invariants import Capacity, check
from wire import subjects
from wire.kv import Store, connect_once


async def load(store: Store) -> ClusterState:
    """A full snapshot of the state and hosts buckets."""
    state = ClusterState()
    watches = [
        await store.watch(">", state.apply_state_record),
        await store.watch(">", state.apply_host_record, bucket=subjects.HOSTS_BUCKET),
    ]
    for w in watches:
        await asyncio.wait_for(w.synced.wait(), timeout=60)
        await w.stop()
    return state


def violations(state: ClusterState) -> list[str]:
    capacity = {
        h: Capacity(len(e.heartbeat.gpus), float(e.heartbeat.cpus), e.heartbeat.memory_mb,
                    {g.index: g.memory_mb for g in e.heartbeat.gpus},
                    {m.uuid: g.index for g in e.heartbeat.gpus for m in g.mig})
        for h, e in state.hosts.items()
        if e.heartbeat is not None
    }
    return check(state.jobs.values(), capacity, state.allocs.values(), current_term=state.term)


async def run_check(nats_url: str, **connection: str | None) -> list[str]:
    """The broken invariants of the recorded state; `connection`: connect_once's
    credentials and TLS files."""
    nc = await connect_once(nats_url, "muster-check", **connection)
    try:
        return violations(await load(Store(nc)))
    finally:
        await nc.close()
