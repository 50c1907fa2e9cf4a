"""scheduling.cadence: planning takes at most its share of the leader's event loop."""

from __future__ import annotations

import asyncio
import time

import pytest

from server.scheduling import scheduler as scheduler_module
from server.scheduling.cadence import cycle_gap
from server.scheduling.scheduler import Scheduler, SchedulerConfig
from server.state.cluster import ClusterState


def test_the_gap_keeps_planning_to_its_share() -> None:
    assert cycle_gap(0.2, 0.5) == pytest.approx(0.2)  # as long again: half the time
    assert cycle_gap(0.2, 0.25) == pytest.approx(0.6)  # a quarter of the time
    took = 0.2
    assert took / (took + cycle_gap(took, 0.8)) == pytest.approx(0.8)


def test_no_gap_after_a_cycle_that_placed_work() -> None:
    assert cycle_gap(0.2, 0.5, placed=1) == 0.0
    assert cycle_gap(0.2, 0.5, placed=0) == pytest.approx(0.2)


def test_share_one_plans_back_to_back() -> None:
    assert cycle_gap(0.5, 1.0) == 0.0
    assert cycle_gap(-0.001, 0.5) == 0.0  # a clock that went back is no cycle


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_a_share_outside_zero_to_one_is_refused(share: float) -> None:
    with pytest.raises(ValueError):
        cycle_gap(0.1, share)


class _Leading:
    leading = True
    term = 1
    changed = asyncio.Event()


def test_a_cycle_sets_when_the_next_may_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler asks cadence for the gap with its configured share, the cycle's
    planning time and what it placed (nothing, in an empty cluster), and holds the next
    cycle until then."""
    asked: list[tuple[float, float, int]] = []

    def gap(took: float, share: float, placed: int = 0) -> float:
        asked.append((took, share, placed))
        return 3600.0

    monkeypatch.setattr(scheduler_module, "cycle_gap", gap)
    sched = Scheduler(None, ClusterState(), _Leading(), SchedulerConfig(plan_share=0.3))  # type: ignore[arg-type]
    before = time.monotonic()
    assert sched._plan_next() is not None
    assert len(asked) == 1 and asked[0][1] == 0.3 and asked[0][0] >= 0 and asked[0][2] == 0
    assert sched._plan_after >= before + 3600


@pytest.mark.timeout(60)
async def test_waiting_for_the_turn_ends_when_stopped() -> None:
    sched = Scheduler(None, ClusterState(), _Leading())  # type: ignore[arg-type]
    stop = asyncio.Event()
    assert await sched._wait_for_turn(stop) is False  # no cycle yet: no wait
    sched._plan_after = time.monotonic() + 3600  # would outlast the test's timeout
    waiting = asyncio.create_task(sched._wait_for_turn(stop))
    await asyncio.sleep(0)
    assert not waiting.done()
    stop.set()
    assert await waiting is True
