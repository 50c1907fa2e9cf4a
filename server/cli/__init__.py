"""The `muster` command (console script `muster`, or `python -m server.cli`): run the
parts and operate the cluster. One module per command family:

    entry        main(argv): dispatch, and the one place an error becomes an exit code
    errors       the exit codes, the CLI's errors (ApiError, JobFailed) and exit_code()
    parser       build_parser(): the top-level parser; each family adds its subcommands
    client       the GraphQL-over-HTTP client (MUSTER_URL, MUSTER_TOKEN or <data dir>/token),
                 `-o table|json` output and `--watch`
    jobs         job submit|list|show|logs|why|cancel
    hosts        host list|show|cordon|uncordon|drain
    alerts       alerts tail
    tokens       token create|list|revoke (API tokens, written to NATS directly)
    creds        creds issue-agent|revoke-agent|issue-subscriber|revoke-subscriber|list
    nats         nats: the embedded nats-server (one node, or --cluster N)
    serve        server: one control-plane replica
    up           up: NATS, a server and local agents as subprocesses, until Ctrl-C
    check        check (the invariants over the recorded state) and schema (the SDL)
    passthrough  agent (agent.cli, also the `muster-agent` script) and bench
                 (`python -m bench` in a subprocess): their arguments go to their own parsers

Exit codes: 0 ok; 1 error (any other MusterError); 2 the waited-for job FAILED or was not
placed within --timeout (JobFailed); 3 not found (NotFound); 4 unauthorised: no token or a
refused one (AuthError); 130 Ctrl-C, except in --watch and `alerts tail`, which it ends with
0. `muster bench` returns the benchmark's own exit code, `muster agent` the agent's.
"""

from server.cli.entry import main
from server.cli.parser import build_parser

__all__ = ["build_parser", "main"]
