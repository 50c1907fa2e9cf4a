"""The `muster` argument parser: each command family adds its own subcommands."""

from __future__ import annotations

import argparse

from server.cli import alerts, check, creds, hosts, jobs, nats, passthrough, queues, reservations, serve, tokens, up

DESCRIPTION = (
    "The `muster` command: run the parts (up, nats, server, agent) and operate the cluster "
    "(job, host, alerts) through the GraphQL API. Exit codes: 0 ok, 1 error, 2 the job waited for "
    "did not succeed (it failed, timed out, was cancelled or could not be placed), 3 not found, "
    "4 unauthorised, 130 interrupted (Ctrl-C)."
)

# In the order `muster --help` lists them.
FAMILIES = (
    up,  # up
    nats,  # nats
    serve,  # server
    passthrough,  # agent, bench
    check,  # check, schema
    jobs,  # job
    queues,  # queue, usage
    hosts,  # host
    reservations,  # reservation
    alerts,  # alerts
    tokens,  # token
    creds,  # creds
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """`argv` parsed. For `job submit`, everything after the first `--` is the job's
    command word for word (argparse would drop one `--` and read a command beginning
    with `-` as options): it goes to `args.after`, for `jobs.submit_command`."""
    if argv[:2] == ["job", "submit"] and "--" in argv:
        end = argv.index("--")
        args = _parse(build_parser(), argv[:end])
        args.after = argv[end + 1:]
        return args
    return _parse(build_parser(), argv)


def _parse(p: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`p.parse_args(argv)`, but arguments none of the parsers knows are refused by the
    subcommand they were given to, with its usage (argparse's own refusal shows the usage
    of `muster` itself)."""
    args, extra = p.parse_known_args(argv)
    if extra:
        _chosen(p, args).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _chosen(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost subcommand's parser that `args` went through."""
    while True:
        subs = next((a for a in p._actions if isinstance(a, argparse._SubParsersAction)), None)
        if subs is None or getattr(args, subs.dest, None) not in subs.choices:
            return p
        p = subs.choices[getattr(args, subs.dest)]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="muster", description=DESCRIPTION)
    sub = p.add_subparsers(dest="cmd", required=True)
    for family in FAMILIES:
        family.register(sub)
    return p
