"""Readers beside a benchmark run: operators browsing the console and clients flooding the
API with the heaviest queries it allows, while the run measures dispatch latency.

    python -m bench.readers --url URL --token T --browse 1 --flood 4 --duration 60 --out reads.json

- `--browse N`: N operators, each signed in to the console, opening the overview, the
  hosts table (sorted by utilisation), the jobs list, a job's page and the alerts page
  in turn, a second apart (htmx refreshes included: each page is fetched whole).
- `--flood N`: N clients sending, back to back, the heaviest GraphQL requests within the
  API's limits: the fleet's totals by GPU model and rack, a 500-host page sorted by
  health with a search, a 100-job page with each job's pending reasons and queue
  position, and history counts.

Each reader goes once through all its requests whatever `--duration` says (on a slow
machine a round can outlast a short run), then goes on until the duration is over, so
every kind of request is in the report. Runs in a process of its own (a load generator,
like the host simulators), so the measured processes are only Muster's. Writes, per request kind: count, errors, latency
percentiles (ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx

from bench.stats import summary_ms

FLOOD = {
    "cluster totals": "{ cluster { gpusByModel { model total allocated healthy } "
                      "gpusByRack { rack total allocated healthy } cpu { total allocated } "
                      "memoryMb { total allocated } hosts { total healthy } } }",
    "hosts 500 by health": "{ hosts(first: 500, sort: HEALTH, filter: {search: \"1\"}) { totalCount "
                           "edges { node { id health gpus gpusAllocated gpuUtilPct } } } }",
    "queued jobs with reasons": "{ jobs(first: 100, state: QUEUED) { totalCount edges { node { id "
                                "pendingReasons { reason hosts } queuePosition } } } }",
    "history counts": "{ attempts(first: 50) { totalCount } events(first: 50) { totalCount } "
                      "alerts(first: 50) { totalCount } }",
}
BROWSE = ["/", "/hosts?sort=util", "/jobs", "JOB", "/alerts"]


class Tally:
    def __init__(self) -> None:
        self.ms: dict[str, list[float]] = {}
        self.errors: dict[str, int] = {}
        self.first_error: dict[str, str] = {}

    def add(self, kind: str, started: float, error: str | None) -> None:
        self.ms.setdefault(kind, []).append(time.perf_counter() - started)
        if error:
            self.errors[kind] = self.errors.get(kind, 0) + 1
            self.first_error.setdefault(kind, error[:300])

    def report(self) -> dict[str, Any]:
        return {k: {"requests": len(v), "errors": self.errors.get(k, 0), "first_error": self.first_error.get(k),
                    "latency_ms": summary_ms(v)} for k, v in sorted(self.ms.items())}


async def flood(url: str, token: str, until: float, tally: Tally) -> None:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
        rounds = 0
        while rounds == 0 or time.monotonic() < until:
            rounds += 1
            for kind, query in FLOOD.items():
                if rounds > 1 and time.monotonic() >= until:
                    return
                t = time.perf_counter()
                try:
                    r = await c.post("/graphql", json={"query": query})
                    body = r.json()
                    err = None if r.status_code == 200 and not body.get("errors") else f"{r.status_code} {r.text}"
                except (httpx.HTTPError, ValueError) as exc:
                    err = f"{type(exc).__name__}: {exc}"
                tally.add(kind, t, err)


async def browse(url: str, token: str, until: float, tally: Tally, pause_s: float) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60, follow_redirects=False) as c:
        r = await c.post("/login", data={"token": token})
        if r.status_code != 303:
            tally.add("console login", time.perf_counter(), f"{r.status_code} {r.text[:200]}")
            return
        job_url = "/jobs"
        rounds = 0
        while rounds == 0 or time.monotonic() < until:
            rounds += 1
            for page in BROWSE:
                if rounds > 1 and time.monotonic() >= until:
                    return
                path = job_url if page == "JOB" else page
                t = time.perf_counter()
                try:
                    r = await c.get(path)
                    err = None if r.status_code == 200 else f"{r.status_code} {r.text[:200]}"
                    if page == "/jobs" and r.status_code == 200:
                        m = re.search(r'href="(/jobs/[A-Za-z0-9_-]+)"', r.text)
                        job_url = m.group(1) if m else "/jobs"
                except httpx.HTTPError as exc:
                    err = f"{type(exc).__name__}: {exc}"
                tally.add(f"console {page if page != 'JOB' else '/jobs/<id>'}", t, err)
                await asyncio.sleep(pause_s)


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    tally = Tally()
    until = time.monotonic() + a.duration
    tasks = [flood(a.url, a.token, until, tally) for _ in range(a.flood)]
    tasks += [browse(a.url, a.token, until, tally, a.pause) for _ in range(a.browse)]
    started = time.time()
    await asyncio.gather(*tasks)
    return {"flood_clients": a.flood, "browsers": a.browse, "started": started, "seconds": a.duration,
            "requests": tally.report()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.readers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--flood", type=int, default=0)
    ap.add_argument("--browse", type=int, default=0)
    ap.add_argument("--pause", type=float, default=1.0, help="seconds between an operator's pages")
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    Path(a.out).write_text(json.dumps(asyncio.run(main_async(a)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
