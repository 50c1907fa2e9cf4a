"""`muster agent ...` and `muster bench ...`: commands whose arguments belong to another
program's own parser. `server.cli.entry.main` hands everything after the command word
over untouched (argparse's REMAINDER would not take a leading option such as `--hosts`);
the subparsers here only list the two commands in `muster --help`.

    muster agent ...   agent.cli.main, in this process: the same as `muster-agent ...`
                       or `python -m agent ...` (server may import agent, never the reverse)
    muster bench ...   `python -m bench ...` in a subprocess, its exit code returned (the
                       control plane never imports bench)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    a = sub.add_parser("agent", help="run a host agent (the same as `muster-agent`)", add_help=False)
    a.add_argument("agent_args", nargs=argparse.REMAINDER)
    b = sub.add_parser("bench", help="run the scale benchmark (see `muster bench --help`)", add_help=False)
    b.add_argument("bench_args", nargs=argparse.REMAINDER)


def run_agent(argv: list[str]) -> int:
    from agent.cli import main

    return main(argv, prog="muster agent")


def run_bench(argv: list[str]) -> int:
    if argv[:1] == ["--"]:  # `muster bench -- --hosts 10` as well as `muster bench --hosts 10`
        argv = argv[1:]
    return run_child([sys.executable, "-m", "bench", *argv])


COMMANDS: dict[str, Callable[[list[str]], int]] = {"agent": run_agent, "bench": run_bench}


def run_child(argv: list[str]) -> int:
    """Run `argv` until it exits and return its exit code (128 + N when signal N ended it).

    The child stays in this process group, so a Ctrl-C typed at the terminal reaches it
    directly (and only once: it is not forwarded again). A SIGINT sent to this process
    alone (`kill -INT`, a supervisor) is forwarded, and so is SIGTERM. While the child
    runs, neither ends this process: it waits for the child to finish its own clean-up."""
    children: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and _terminal_in_foreground():
            return  # the terminal sent it to the whole process group: the child has it
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:  # ignored (a background job): leave it so
            previous[sig] = signal.signal(sig, forward)
    try:
        children.append(subprocess.Popen(argv))
        rc = children[0].wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return rc if rc >= 0 else 128 - rc


def _terminal_in_foreground() -> bool:
    """Whether this process group is the foreground group of the controlling terminal,
    the group a Ctrl-C at that terminal is sent to."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False  # no controlling terminal: a SIGINT came from a process
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)
