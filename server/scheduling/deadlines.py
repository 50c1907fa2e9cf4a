"""Deadlines index: when each running try with a time limit reaches it, kept in time
order as records arrive, so that the leader finds the tries due (`due`) and the hosts
that free up soonest (`earliest`, for reservations: scheduling.backfill) without sorting
every running job each cycle."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from sortedcontainers import SortedList

from wire.messages import Attempt, AttemptState


def try_deadline(tasks: Sequence[Attempt], ended_end: bool = True) -> float | None:
    """When a try (its tasks: one, or a gang's) reaches its time limit: its first task's
    start plus the limit its tasks still live hold (a change of the limit reaches only
    those: found by exploring, a gang whose first task had ended kept that task's limit,
    and took the start of the tasks still running only). None without a limit or a task
    running, once it is being stopped, or once a task of it ended other than SUCCEEDED: the
    rest are being stopped for that, and the try keeps that end (found by exploring: a
    limit passing meanwhile made the gang of a lost task TIMEOUT, not retried); with
    `ended_end` False such a try has its deadline all the same (for the leader to tell which
    came first)."""
    live = [t for t in tasks if not t.state.terminal]
    if (not any(t.state is AttemptState.RUNNING for t in live) or any(t.stop_kind for t in tasks)
            or (ended_end and any(t.state.terminal and t.state is not AttemptState.SUCCEEDED for t in tasks))):
        return None
    return limit_at(tasks)


def limit_at(tasks: Sequence[Attempt]) -> float | None:
    """When a try (its tasks) reaches its time limit, whether or not it is being stopped:
    its first task's start plus the limit its tasks still live hold. None without a limit,
    a start or a task still live."""
    live = [t for t in tasks if not t.state.terminal]
    limit = live[0].time_limit_s if live else 0.0
    started = [t.started_at for t in tasks if t.started_at is not None]
    if not started or limit <= 0:
        return None
    return min(started) + limit


class Deadlines:
    def __init__(self) -> None:
        self._at: dict[str, float] = {}
        self._order: SortedList = SortedList()  # (deadline, job id)

    def set(self, job_id: str, deadline: float) -> None:
        old = self._at.get(job_id)
        if old == deadline:
            return
        if old is not None:
            self._order.remove((old, job_id))
        self._at[job_id] = deadline
        self._order.add((deadline, job_id))

    def drop(self, job_id: str) -> None:
        old = self._at.pop(job_id, None)
        if old is not None:
            self._order.remove((old, job_id))

    def get(self, job_id: str) -> float | None:
        return self._at.get(job_id)

    def due(self, now: float) -> list[str]:
        """Jobs whose deadline is `now` or earlier, earliest first."""
        return [j for _d, j in self._order.irange(maximum=(now, "\U0010ffff"))]

    def until(self, at: float) -> Iterator[tuple[str, float]]:
        """(job id, deadline) of the jobs whose deadline is `at` or earlier, earliest first."""
        for d, j in self._order.irange(maximum=(at, "\U0010ffff")):
            yield j, d

    def earliest(self, n: int) -> Iterator[tuple[float, str]]:
        """The first `n` (deadline, job id), earliest first."""
        got: Iterator[tuple[float, str]] = self._order.islice(0, n)
        return got

    def __len__(self) -> int:
        return len(self._at)

    def __eq__(self, other: object) -> bool:
        """Equal to another index, or to a plain {job id: deadline} mapping."""
        if isinstance(other, Deadlines):
            return self._at == other._at
        return isinstance(other, dict) and self._at == other

    __hash__ = None  # type: ignore[assignment]
