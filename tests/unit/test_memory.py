"""The server's garbage-collector policy (server.memory)."""

from __future__ import annotations

import asyncio
import gc
import weakref

from server import memory


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector can free it


async def test_survivors_are_frozen_young_garbage_is_not_and_the_loop_stops() -> None:
    try:
        gc.collect()
        kept = [Node() for _ in range(100)]
        garbage = [Node() for _ in range(100)]
        refs = [weakref.ref(g) for g in garbage]
        del garbage  # cyclic garbage in the young generation
        assert all(r() is not None for r in refs)  # reference counting alone cannot free it
        before = gc.get_freeze_count()
        memory.freeze_survivors()
        assert gc.get_freeze_count() >= before + len(kept)
        # The cycles dropped before the freeze were collected, not frozen with the rest.
        assert all(r() is None for r in refs)
        gc.unfreeze()

        stop = asyncio.Event()
        task = asyncio.create_task(memory.keep_frozen(stop, every_s=0.05))
        for _ in range(1000):
            if gc.get_freeze_count():
                break
            await asyncio.sleep(0.01)
        assert gc.get_freeze_count() > 0
        stop.set()
        await asyncio.wait_for(task, timeout=5)  # stops without being cancelled
        assert kept[0].me is kept[0]
    finally:
        gc.unfreeze()


async def test_loop_lag_is_recorded_and_the_watcher_stops() -> None:
    """server.metrics.watch_loop_lag: a callback that holds the loop shows as lag."""
    import time

    from server import metrics

    def count() -> float:
        return metrics.REGISTRY.get_sample_value("muster_event_loop_lag_seconds_count") or 0.0

    def over_quarter_second() -> float:
        total = count()
        within = metrics.REGISTRY.get_sample_value("muster_event_loop_lag_seconds_bucket", {"le": "0.25"}) or 0.0
        return total - within

    stop = asyncio.Event()
    before, slow_before = count(), over_quarter_second()
    task = asyncio.create_task(metrics.watch_loop_lag(stop, every_s=0.01))
    await asyncio.sleep(0.05)
    time.sleep(0.4)  # hold the loop
    for _ in range(500):
        if over_quarter_second() > slow_before:
            break
        await asyncio.sleep(0.01)
    assert count() > before
    assert over_quarter_second() > slow_before
    stop.set()
    await asyncio.wait_for(task, timeout=5)  # stops without being cancelled
    assert task.result() is None
