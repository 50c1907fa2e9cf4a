"""`python -m bench.operator`: see bench/operator/__init__.py."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["simulate"]:  # the simulator process the run starts: no need for the rest
        from bench.operator.fleet import simulate

        return simulate(argv[1:])
    from bench.operator.run import main as run_main

    return run_main(argv)


if __name__ == "__main__":
    sys.exit(main())
