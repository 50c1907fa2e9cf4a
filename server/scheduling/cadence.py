"""How long the scheduler leaves the event loop to everything else between cycles.

The leader's replica also serves the API, applies the state watch and finishes the
commits in flight on the same event loop, and every new job and every state record
wakes the scheduler. While cycles place work they run back to back: the placements are
what everything waits for. A cycle that placed nothing, over a queue that cannot be
placed now, only finds that again for each new job, and each such cycle walks the whole
queue: one job per HTTP request against thousands waiting would leave the loop little
else. After such a cycle, which planned for `took` seconds, the next waits so that
planning takes at most `share` of the time; what arrives meanwhile is taken in by that
next cycle at once.
"""

from __future__ import annotations


def cycle_gap(took: float, share: float, placed: int = 0) -> float:
    """Seconds between the end of a cycle that planned for `took` seconds and placed
    `placed` jobs and the start of the next: none after a cycle that placed work, else
    enough for planning to take at most `share` (0 < share <= 1) of the time."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"plan share {share} is not in (0, 1]")
    if placed > 0:
        return 0.0
    return max(0.0, took) * (1.0 - share) / share
