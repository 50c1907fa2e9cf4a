"""How the API's heavy reads share the event loop (server.api.reads), with a fake clock
and a recorded sleep: on the leader a pass gives the loop three times each step's time
(reads take at most a quarter of it); on a follower it only yields."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any, cast

import pytest

from server.api.reads import LEADER_READ_SHARE, Reads


class FakeReplica:
    def __init__(self, role: str) -> None:
        self.role = role


def run_pass(role: str, step_costs: list[float]) -> tuple[str, list[float]]:
    now = [0.0]
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    def steps() -> Generator[None, None, str]:
        for cost in step_costs:
            now[0] += cost  # the step's work, on the fake clock
            yield
        return "done"

    reads = Reads(cast(Any, FakeReplica(role)), clock=lambda: now[0], sleep=sleep)
    return asyncio.run(reads.run(steps())), slept


def test_a_pass_on_the_leader_leaves_the_loop_three_quarters_of_its_time() -> None:
    result, slept = run_pass("leader", [0.02, 0.01, 0.04])
    assert result == "done"
    assert slept == pytest.approx([0.06, 0.03, 0.12])
    work = 0.07
    assert work / (work + sum(slept)) == pytest.approx(LEADER_READ_SHARE)


def test_a_pass_on_a_follower_only_yields() -> None:
    result, slept = run_pass("follower", [0.02, 0.01, 0.04])
    assert result == "done" and slept == [0.0, 0.0, 0.0]
