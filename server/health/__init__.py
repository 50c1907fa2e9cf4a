"""Host health: is a host heartbeating, and what to do when it stops.

Pure:
    rules        a host's health from its heartbeat's age (HEALTHY, SUSPECT, LOST), and
                 the transitions between two judgements
    index        every host's health kept as heartbeats and expiries arrive, so a
                 question about the fleet does not walk 50,000 hosts
    readclock    the time heartbeats have been read up to (health is judged at it, so a
                 reader that falls behind never calls healthy hosts lost)

I/O:
    ingest       the heartbeat reader process: reads the `hosts` bucket, hands batches
    monitor      publishes transitions as events and alerts (leader only)

The pure modules import `wire` and each other only (import-linter: no NATS, SQL, HTTP,
asyncio or subprocess); `ingest` and `monitor` add `wire.kv` and `server.state`.
"""
