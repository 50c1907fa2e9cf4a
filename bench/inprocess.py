"""The report of a scenario run in process (`python -m bench backlog`, `placer`): the
machine's Python speed taken just before, the command, and the scenario's own figures,
written to a JSON file (by default its file in bench/results) and printed."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.calibration import python_speed


def run_and_report(name: str, argv: list[str], measure: Callable[[], dict[str, Any]], json_path: str | None,
                   default_file: str) -> int:
    """Take the machine's speed, run `measure`, write and print the report; exit 0 when
    its `correctness.ok`, else 1."""
    speed = python_speed()  # the same workload as every run's machine_speed: runs are compared by it
    rep = {"when": datetime.now(UTC).isoformat(timespec="seconds"),
           "command": f"python -m bench {name} " + " ".join(argv),
           "machine": f"{os.cpu_count()} CPUs, one process", "machine_speed": speed, **measure()}
    path = Path(json_path) if json_path else Path(__file__).resolve().parent / "results" / default_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rep, indent=2) + "\n")
    print(json.dumps(rep, indent=1))
    print(f"report: {path}", file=sys.stderr)
    return 0 if rep["correctness"]["ok"] else 1
