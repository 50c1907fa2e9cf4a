"""Scheduling: what runs where.

Pure (a snapshot, inputs and a clock in; decisions out; no I/O):
    planner        one cycle: status reports, commands and submissions folded into job
                   and allocation records, lost work replaced, time limits enforced,
                   queued jobs admitted by fair share and placed, preemptions started
    placement      the feasibility checks with named rejection reasons (whole GPUs,
                   shares of one GPU, MIG instances), and the ranking
    capacity       the capacity index (hosts bucketed by free GPUs, shares and MIG
                   instances) and a cycle's Placer with its policies (fgd, binpack)
    fragmentation  FGD's expected fragmentation of a host under the recent task shapes
    queues         quota accounting: what a job costs, nominal quotas, cohort borrowing
    fairshare      DRF shares with decayed past use, the admission order
    backlog        each queue's queued jobs in order and its smallest job, kept by the
                   cluster state as job records arrive
    preemption     victims for priority, reclaim and fair-share preemption
    backfill       reservations for jobs that wait (the hosts where they start soonest,
                   from tasks' expected ends) and which jobs may backfill them
    deadlines      running tries' time-limit deadlines in time order
    dependencies   jobs waiting for others, and which waits the planner must look at
    queuewatch     preemption-storm and starved-queue alerts
    eviction       which lost hosts' work may be replaced now (failure domains, budgets)
    retry          whether an ended try is retried, and when
    delivery       which hosts' assignment records must be sent again (a task placed
                   and not started: its republish was lost)
    isolation      the narrowed cycles that find the input the store refuses (poison)

I/O:
    scheduler      the loop that runs while this replica leads: takes inputs, asks the
                   planner, commits each plan as one fenced atomic batch, acknowledges;
                   sends lost assignments again

The pure modules import `wire`, `server.state.cluster` and each other; never nats,
SQL, HTTP or subprocess libraries (checked by import-linter).
"""
