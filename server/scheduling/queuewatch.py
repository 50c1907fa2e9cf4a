"""Queue alerts: preemption storms and starved queues. Pure: what each cycle did and the
queues' figures in, alert events out (the scheduler publishes them on `alerts.>`).

- A preemption storm: at least `storm_count` jobs preempted within `storm_window_s`;
  alerted once, then not again until a window has passed without one; it says what the
  stops cost, as the victims' cost estimates it (runtime x GPUs, the grace for a job
  that checkpoints).
- A starved queue: a queue with jobs waiting, below its entitled share, that has had no
  job placed for `starved_after_s`, and a job waiting that could ever run; alerted once
  until it gets a placement, has nothing waiting, or reaches its entitled share.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from wire.messages import Event
from wire.subjects import ALERT_PREEMPTION_STORM, ALERT_QUEUE_STARVED


@dataclass
class QueueWatch:
    storm_count: int = 50
    storm_window_s: float = 60.0
    starved_after_s: float = 600.0
    _preemptions: deque[tuple[float, int, float]] = field(default_factory=deque)
    _storming: bool = False
    _waiting_since: dict[str, float] = field(default_factory=dict)
    _starved: set[str] = field(default_factory=set)

    def preempted(self, now: float, n: int, cost_gpu_s: float = 0.0) -> list[Event]:
        """`n` jobs were preempted at `now` (0: none), their stops costing `cost_gpu_s`
        GPU-seconds of work by the victims' cost; a storm alert when one begins."""
        if n:
            self._preemptions.append((now, n, cost_gpu_s))
        while self._preemptions and self._preemptions[0][0] <= now - self.storm_window_s:
            self._preemptions.popleft()
        total = sum(k for _t, k, _c in self._preemptions)
        if total >= self.storm_count and not self._storming:
            self._storming = True
            cost_h = sum(c for _t, _k, c in self._preemptions) / 3600
            return [Event(kind=ALERT_PREEMPTION_STORM, ts=now,
                          message=f"{total} jobs preempted within {self.storm_window_s:g} s (threshold "
                                  f"{self.storm_count}), at least {cost_h:.2f} GPU-hours of work lost (what they "
                                  "had run x GPUs when stopped, the grace for jobs that checkpoint; their graces "
                                  "add more, which `usage` counts once they end): check queue quotas, weights and "
                                  "minimum runtimes",
                          data={"preempted": total, "window_s": self.storm_window_s,
                                "gpu_hours_lost": round(cost_h, 3)})]
        if not self._preemptions:
            self._storming = False
        return []

    def queues(self, now: float, pending: Mapping[str, int], placed: Collection[str],
               below_entitled: Collection[str], shares: Mapping[str, tuple[float, float]],
               runnable: Callable[[str], bool] | None = None) -> list[Event]:
        """The queues' state at `now`: jobs waiting per queue, the queues that got a job
        placed since the last call, those below their entitled share, and each queue's
        (share, entitled share) for the message. `runnable(queue)`, asked only of a queue
        about to be alerted: whether a job of it waiting could ever run as the cluster
        stands; a queue none of whose jobs could is not starved but waits for a host or a
        quota (its submitters were told so), and is not alerted."""
        out: list[Event] = []
        for q in list(self._waiting_since):
            if pending.get(q, 0) <= 0 or q in placed or q not in below_entitled:
                del self._waiting_since[q]
                self._starved.discard(q)
        for q, n in pending.items():
            if n <= 0 or q in placed or q not in below_entitled:
                continue
            since = self._waiting_since.setdefault(q, now)
            if now - since >= self.starved_after_s and q not in self._starved:
                if runnable is not None and not runnable(q):
                    continue
                self._starved.add(q)
                share, entitled = shares.get(q, (0.0, 0.0))
                out.append(Event(kind=ALERT_QUEUE_STARVED, ts=now,
                                 message=f"queue {q}: {n} jobs waiting and none placed for {now - since:.0f} s while "
                                         f"below its entitled share ({share:.3f} of {entitled:.3f})",
                                 data={"queue": q, "pending": n, "waiting_s": round(now - since, 1),
                                       "share": share, "entitled": entitled}))
        return out
