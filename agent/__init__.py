"""Muster agent: runs on each GPU host, reports telemetry and runs assigned tasks.

    agent      heartbeats, reconciling assignments, reports, self-fencing, restart clean-up
    gpu        NVML, simulated and empty GPU backends, fault detection
    hostinfo   CPU and memory of the host
    runner     one attempt as a subprocess with a staged stop
    watchdog   the process that stops the agent's attempts once the agent stops
    cli        the entry point (`muster-agent`, `python -m agent`, `muster agent`)

May import: `wire` (the contract), the standard library, nats-py, pydantic and NVML.
Never `server`, `web` or `bench` (import-linter): a GPU host needs only `agent` and
`wire`.
"""
