"""`python -m bench` / `muster-bench` / `muster bench`: load-test Muster with simulated hosts.

    python -m bench --hosts 50000 --rate 500 --duration 60 --json bench/results/50k-500.json
    python -m bench --hosts 50000 --rate 500 --duration 60 --trace
    python -m bench --nats-cluster 3 ...
    python -m bench plot bench/results/50k-500.json [-o 50k-500.png]
    python -m bench placement --pods PODS.csv --nodes NODES.csv [--policy fgd] [--seeds 10]
    python -m bench --tenants 4 --hosts 200 --rate 500 [--trace]   (fairness: bench/fairness.py)
    python -m bench backlog --hosts 50000 --queues 8   (plan_cycle with a long queue: bench/backlog.py)
    python -m bench api --clients 4 --seconds 8 --rounds 3   (what one submitJob costs: bench/apicost.py)
    python -m bench placer --hosts 50000 --jobs 50   (one cycle's placements: bench/placecycle.py)

See bench/run.py for what is measured, `python -m bench --help` for every option and
bench/results/README.md for the recorded runs.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # `muster bench -- --hosts ...`
        argv = argv[1:]
    if argv[:1] == ["placement"]:
        from bench.placement import main as placement_main

        return placement_main(argv[1:])
    if argv[:1] == ["backlog"]:
        from bench.backlog import main as backlog_main

        return backlog_main(argv[1:])
    if argv[:1] == ["placer"]:
        from bench.placecycle import main as placer_main

        return placer_main(argv[1:])
    if argv[:1] == ["api"]:
        from bench.apicost import main as api_main

        return api_main(argv[1:])
    if any(a == "--tenants" or a.startswith("--tenants=") for a in argv):
        from bench.fairness import run as fairness_run

        return fairness_run(argv)
    if argv[:1] == ["plot"]:
        from bench.cli import plot_command

        return plot_command(argv[1:])
    from bench.cli import run

    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
