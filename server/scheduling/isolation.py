"""Finding the input the store refuses, so that one bad input cannot stop scheduling.

The byte budgets (wire.budgets) keep every record the scheduler writes within what NATS
takes, so a commit refused for its content (wire.errors.RejectedError) should not
happen; if it does, retrying the same cycle would fail for ever and nothing else would
be placed. Instead, the cycles after a refused one are narrowed: each takes one input
of the refused cycle (a status report, a command, a submission), then one placement at
a time, then the evictions, until everything the refused cycle held has been tried
alone. Whatever is refused alone is the poison:

- a status report is tried once more without the text its process produced (output
  tail and reason), then dropped;
- a command or a submission is dropped (a submission's jobs are rejected);
- a cycle without an input (a placement, evictions) fails the jobs it changed, with the
  store's reason; if even that is refused, those jobs are left alone from then on.

Every drop is logged, counted (`muster_poison_total`) and alerted (`alerts.input.rejected`).
Pure: the scheduler asks `next()` what a cycle may take and reports each narrowed
cycle's outcome with `settle()`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Narrowing:
    """What one cycle may take while isolating: `inputs` inputs (0 or 1), at most
    `placements` placements, and evictions only if `evict`."""

    inputs: int
    placements: int
    evict: bool


INPUT = Narrowing(inputs=1, placements=0, evict=False)
PLACEMENT = Narrowing(inputs=0, placements=1, evict=False)
EVICTIONS = Narrowing(inputs=0, placements=0, evict=True)


@dataclass
class Isolation:
    """The refused cycle's contents still to try alone."""

    inputs: int
    placements: int
    evictions: bool

    def next(self) -> Narrowing | None:
        """What the next cycle may take, or None when everything has been tried."""
        if self.inputs > 0:
            return INPUT
        if self.placements > 0:
            return PLACEMENT
        if self.evictions:
            return EVICTIONS
        return None

    def settle(self, took: Narrowing, used_input: bool, placed: int) -> None:
        """A narrowed cycle is over (committed, or its poison dealt with): what it tried
        is no longer to be tried."""
        if took is INPUT:
            self.inputs -= 1 if used_input else self.inputs  # no input left to take: none to try
        elif took is PLACEMENT:
            self.placements -= 1 if placed else self.placements
        else:
            self.evictions = False
