"""The wire contract: everything the control plane and the agents agree on.

    subjects     bucket, stream and subject names, record keys, the agent's inbox prefix
    messages     every message and KV record (pydantic models) and `decode()`, the one
                 entry point for untrusted bytes
    validation   checks of user input (job submissions, host labels)
    records      what a KV read or watch yields (`Record`), delivery metadata: no I/O
    kv           the JetStream adapter: `connect()`, `Store` (reads, watches,
                 revision-checked writes, atomic fenced commits)
    natsclient   the faster NATS header parser every Muster client installs
    tls          client TLS settings
    submit       submitting jobs over NATS (`muster.submit.<user>`)
    logs         the log format every Muster process writes (text, or JSON lines)
    errors       the one error hierarchy (`MusterError` and its subclasses)

Imports: the standard library, pydantic and nats-py only; never `server`, `agent`,
`web` or `bench` (checked by import-linter, see pyproject.toml). A GPU host runs
`agent` and `wire` and nothing else of Muster.
"""
