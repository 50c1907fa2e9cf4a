"""The Muster control plane.

    scheduling/  where a placement is decided (planner, placement, capacity index,
                 eviction, retry: pure) and where it is committed (scheduler: the loop)
    health/      where a heartbeat is judged (rules, index, read clock: pure), the
                 heartbeat ingest process and the monitor that publishes transitions
    state/       the in-memory cluster view fed by KV watches, the streams it needs,
                 the leader lease, the input consumers, invariants and `muster check`
    views/       the read models shown by GraphQL and the console (hosts, jobs)
    history/     the SQL history: models, database, recorder, historian, migrations
    api/         HTTP: the Starlette app, GraphQL schema, auth, tokens, subscriptions
    broker/      the embedded nats-server and its credentials (nkeys, permissions)
    cli/         the `muster` command (one module per command family)
    replica.py   one control-plane replica: wires the parts and offers the operations
    metrics, logs, memory, childproc: process-wide concerns

Imports: `wire` and the libraries; never `bench`. Only `server.cli` (the composition
root of the processes) imports `agent` and `web`. See docs/architecture.md.
"""
