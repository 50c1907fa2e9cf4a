"""A follower's deferred placement index (ClusterState.defer_index): following a leader's
records, it builds a host's entry when the index is read, not at each allocation, and then
sees what the leader's index holds."""

from __future__ import annotations

from server.state.cluster import ClusterState
from tests.unit.test_gpu_faults import fault, running
from tests.unit.test_planner import World, report
from wire.messages import AttemptState
from wire.records import Record


def held(state: ClusterState) -> dict[str, tuple[object, ...]]:
    """What each host's index entry holds."""
    return {h: (sorted(c.used_gpus), c.used_cpus, c.used_memory_mb, c.tasks, c.record_bytes, c.schedulable)
            for h, c in sorted(state.index.caps.items())}


def follower_of(w: World) -> ClusterState:
    """A state with indexing deferred, fed every record the world's state is fed."""
    f = ClusterState(heartbeat_interval_s=w.state.heartbeat_interval_s)
    f.defer_index = True
    lead_state, lead_host = w.state.apply_state_record, w.state.apply_host_record

    def state_record(rec: Record) -> None:
        lead_state(rec)
        f.apply_state_record(rec)

    def host_record(rec: Record, now: float | None = None) -> None:
        lead_host(rec, now)
        f.apply_host_record(rec, now)

    w.state.apply_state_record = state_record  # type: ignore[method-assign]
    w.state.apply_host_record = host_record  # type: ignore[method-assign]
    return f


def test_a_deferred_index_is_built_when_read_and_holds_what_the_leaders_holds() -> None:
    w = World(interval_s=3600.0)
    f = follower_of(w)
    w.host("h1", gpus=2)
    w.host("h2", gpus=4)
    for j in ("a", "b", "c"):
        w.submit(j, gpus=1)
    w.cycle()
    running(w, "a", "b", "c")
    assert f._stale  # allocations followed, entries not yet rebuilt
    assert f.gpu_models() == w.state.gpu_models() == {"H100"} and f._stale  # asked by every submission
    assert held(f) == held(w.state) and any(v[3] for v in held(f).values())
    assert not f._stale  # reading the index built them
    # A faulted GPU under a task: the faulted work is read through the same index.
    host = w.job("a").current.host_id
    fault(w, host, 2 if host == "h1" else 4, tuple(w.job("a").current.gpu_indices))
    w.cycle(reports=[report(w, "b", AttemptState.SUCCEEDED)])
    assert f._stale
    assert f.faulted_work == w.state.faulted_work
    assert held(f) == held(w.state)


def test_leading_again_builds_every_stale_entry_and_then_each_at_once() -> None:
    w = World(interval_s=3600.0)
    f = follower_of(w)
    w.host("h1", gpus=2)
    w.submit("a", gpus=1)
    w.cycle()
    assert f._stale == {"h1"}
    f.defer_index = False
    assert not f._stale and held(f) == held(w.state)
    w.submit("b", gpus=1)
    w.cycle()
    assert not f._stale and held(f) == held(w.state)
