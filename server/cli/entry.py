"""`main()`: the boundary of the `muster` command, the one place where an error becomes
an exit code (see server.cli.errors) and a message on stderr."""

from __future__ import annotations

import os
import sys

from server.cli import passthrough
from server.cli.errors import EXIT_INTERRUPTED, EXIT_OK, exit_code
from server.cli.parser import parse_args
from wire.errors import MusterError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv[:1] and argv[0] in passthrough.COMMANDS:
            return passthrough.COMMANDS[argv[0]](argv[1:])
        args = parse_args(argv)
        return int(args.fn(args) or 0)
    except MusterError as exc:
        report(exc)
        return exit_code(exc)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader closed stdout (`muster job list --watch | head`): it wanted no more,
        # which is a clean end. Point stdout at /dev/null so that the interpreter's last
        # flush at exit does not fail on the closed pipe again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


def report(exc: MusterError) -> None:
    """`error: <line>` for each line of the message; indented lines are details of the
    error above them and are printed as they are."""
    for line in (str(exc) or type(exc).__name__).splitlines():
        print(line if line[:1].isspace() else f"error: {line}", file=sys.stderr)
