"""The cluster's state as this replica knows it, and how it is kept.

    cluster      ClusterState: every heartbeat, job, allocation, host setting and token
                 hash with its store revision, fed by KV watches; pure (no I/O)
    invariants   the safety properties, checked over recorded job histories; pure
    streams      the JetStream streams and buckets, created and waited for at start-up
    lease        the leader lease and the leadership term that fences every commit
    consumers    durable pull consumers feeding the leader its inputs
    checker      `muster check`: loads the state from NATS and runs the invariants

`cluster` and `invariants` are pure: they import `wire`, the indexes they keep
(`server.scheduling.capacity`, `server.health.index`, `server.views.hosts`) and nothing
that does I/O (import-linter). The others add `wire.kv` (the JetStream adapter).
"""
