"""Read models: what GraphQL and the console show, computed in one place.

    hosts   HostTable (one row per host, kept by the cluster view), HostQuery (filters),
            ORDERS (sorts), FleetSummary (the fleet's totals)
    jobs    JobView: a job's live record or its history row, pages of jobs, why a job
            is pending, its queue position and timeline

Pure (no I/O of their own; JobView calls the history database it is given): they
import `wire`, `server.state` and the pure decision modules (why pending), never NATS,
SQL, HTTP or GraphQL libraries (import-linter). GraphQL types and console pages are
thin layers over them.
"""
