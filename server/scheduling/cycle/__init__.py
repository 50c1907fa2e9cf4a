"""The parts of one scheduling cycle's plan, each a pure function of the cycle's working
copy (`work.Work`) and a clock; `server.scheduling.planner.plan_cycle` runs them in order:

    work         the working copy, the plan, the stop and event helpers
    reports      status reports and operators' commands folded into records
    submissions  NATS submissions, dependencies released
    stops        lost hosts' work, drains, set-aside hosts, GPU faults, time limits
    admission    the queue book and fair shares of the cycle, queue order
    victims      preemption: candidates, pacing, the stops
    placing      admission and placement in fair-share order, reservations, usage
"""
