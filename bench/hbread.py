"""What reading one heartbeat costs a Python process: CPU microseconds per heartbeat for
the `hosts` watch the heartbeat ingest process runs (`--mode watch`, an ordered
JetStream consumer through wire.kv.Watch) and, for comparison, a plain core NATS
subscription to the same subjects (`--mode core`, which would miss TTL expiry markers
and revisions).

    .venv/bin/python -m bench.hbread --mode watch --n 50000

A nats-server is started on a free port with a temporary store; a separate process
publishes `--n` heartbeat-sized records with the agents' headers (Nats-TTL,
Muster-Shape) to `$KV.hosts.<host>` for `--hosts` hosts, so the reader's CPU is its own.
Prints one JSON line: records read, CPU seconds and microseconds per record.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from server.broker.natsd import start_nats
from server.state.streams import ensure_streams
from wire import subjects
from wire.kv import Store, connect
from wire.messages import SHAPE_HEADER
from wire.records import Record

PUBLISHER = """
import asyncio, sys
import nats
async def main(url, n, hosts, size):
    nc = await nats.connect(url)
    body = b"x" * size
    headers = {"Nats-TTL": "15s", "SHAPE_HEADER": "shape"}
    for i in range(n):
        await nc.publish(f"$KV.hosts.h{i % hosts}", body, headers=headers)
        if i % 1000 == 0:
            await nc.flush()
    await nc.flush()
    await nc.close()
asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
""".replace("SHAPE_HEADER", SHAPE_HEADER)


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(url: str, mode: str, n: int, hosts: int, size: int) -> dict[str, Any]:
    nc = await connect(url, name="hbread")
    await ensure_streams(Store(nc))
    got = 0
    done = asyncio.Event()

    def count() -> None:
        nonlocal got
        got += 1
        if got >= n:
            done.set()

    if mode == "watch":
        def on_record(rec: Record) -> None:
            _ = (rec.headers or {}).get(SHAPE_HEADER)
            count()

        watch = await Store(nc).watch(">", on_record, bucket=subjects.HOSTS_BUCKET)
    else:
        async def on_msg(msg: Any) -> None:
            _ = (msg.headers or {}).get(SHAPE_HEADER)
            count()

        await nc.subscribe(f"$KV.{subjects.HOSTS_BUCKET}.>", cb=on_msg, pending_msgs_limit=n + 1,
                           pending_bytes_limit=(n + 1) * (size + 512))
        await nc.flush()
    t0, c0 = time.monotonic(), cpu_s()
    pub = await asyncio.create_subprocess_exec(sys.executable, "-c", PUBLISHER, url, str(n), str(hosts), str(size))
    await pub.wait()
    await asyncio.wait_for(done.wait(), timeout=300)
    took_cpu, took = cpu_s() - c0, time.monotonic() - t0
    if mode == "watch":
        await watch.stop()
    await nc.close()
    return {"mode": mode, "records": got, "record_bytes": size, "cpu_s": round(took_cpu, 3),
            "cpu_us_per_record": round(1e6 * took_cpu / max(got, 1), 1), "wall_s": round(took, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hbread", description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("watch", "core"), default="watch")
    p.add_argument("--n", type=int, default=50_000, help="heartbeats to publish and read")
    p.add_argument("--hosts", type=int, default=50_000)
    p.add_argument("--size", type=int, default=700, help="bytes of each heartbeat")
    a = p.parse_args(argv)
    if a.mode == "watch" and a.n > a.hosts:
        # The bucket keeps one record per host: a watch that falls behind would never
        # see the ones superseded before it got to them.
        p.error("--mode watch needs --n <= --hosts")
    with tempfile.TemporaryDirectory(prefix="hbread-") as d:
        nats = start_nats(Path(d) / "nats", port=0)
        try:
            print(json.dumps(asyncio.run(measure(nats.url, a.mode, a.n, a.hosts, a.size))), flush=True)
        finally:
            nats.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
