"""Scheduling: what runs where.

Pure (a snapshot, inputs and a clock in; decisions out; no I/O):
    planner      one cycle: status reports, commands and submissions folded into job
                 and allocation records, lost work replaced, queued jobs placed
    placement    the feasibility checks with named rejection reasons, and the ranking
    capacity     the capacity index (hosts bucketed by free GPUs) and a cycle's Placer
    eviction     which lost hosts' work may be replaced now (failure domains, budgets)
    retry        whether an ended try is retried, and when

I/O:
    scheduler    the loop that runs while this replica leads: takes inputs, asks the
                 planner, commits each plan as one fenced atomic batch, acknowledges

The pure modules import `wire`, `server.state.cluster` and each other; never nats,
SQL, HTTP or subprocess libraries (checked by import-linter).
"""
