"""What storing heartbeats costs NATS, per way of keeping the `hosts` bucket: CPU
microseconds of every nats-server together per heartbeat.

    python -m bench.hbcost --variants r3-file,r3-memory,r1-file,r1-memory --n 30000 --hosts 10000 --rate 3000

A fresh 3-node cluster (`sync_interval: always`, as production runs it, rendered by
bench/natscluster.py) per variant; the `hosts` bucket's stream made as the variant says
(replicas, storage; otherwise as server.state.streams makes it: per-message TTL, one value
per key); `--n` heartbeat-sized records (700 bytes, `Nats-TTL: 15s`) published by this
process at `--rate` a second to `--hosts` keys, as agents do (core publish); then the CPU
time the three nats-servers used (from /proc), divided by the records. Prints one JSON
line per variant and, with `--json`, writes them all.

The variants (the state bucket, which needs fsync on every write, is not involved):
r3-file (replicated, fsync'd on every write, as the state bucket), r3-memory (replicated,
never on disk: survives the loss of a node, not a restart of all three), r1-file and
r1-memory (one copy on one node). NATS refuses `persist_mode: async` on replicated streams
(err 10052), so "replicated without fsync" is not a choice on 2.15.

`--accounts` runs each variant with the NATS accounts of an authenticated deployment
(server.broker.natsauth: the streams in the control plane's account, agents in their own,
publishing through a service import) and measures it twice: published by a user of the
control plane's account, and by a user of the agents' account, as agents publish (what the
import costs). Users have passwords here (one user publishing for every host), not nkeys.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from nats.js import api as jsapi

import nats
from server.broker.natsauth import ACCOUNT_LINKS, AGENTS_ACCOUNT, CONTROL_ACCOUNT, AuthDir
from server.broker.natsd import start_cluster
from server.state.streams import kv_stream
from wire import subjects

VARIANTS = {
    "r3-file": (3, jsapi.StorageType.FILE),
    "r3-memory": (3, jsapi.StorageType.MEMORY),
    "r1-file": (1, jsapi.StorageType.FILE),
    "r1-memory": (1, jsapi.StorageType.MEMORY),
}


class _Accounts(AuthDir):
    """The accounts the generated auth.conf has, with one password user in the control
    plane's account and one in the agents' (allowed every host's heartbeat)."""

    def render(self, users: dict[str, dict[str, Any]] | None = None) -> str:
        blocks = []
        for name, links in ACCOUNT_LINKS.items():
            user = {CONTROL_ACCOUNT: ["ctl"], AGENTS_ACCOUNT: ["agent"]}.get(name, [])
            body = [f"    users = {json.dumps([{'user': u, 'password': 'bench'} for u in user])}"]
            if name == CONTROL_ACCOUNT:
                body.insert(0, "    jetstream: enabled")
            body += [f"    {k} = {json.dumps(v)}" for k, v in links.items()]
            blocks.append(f"  {name}: {{\n" + "\n".join(body) + "\n  }")
        return "accounts {\n" + "\n".join(blocks) + "\n}\n"


async def measure(variant: str, n: int, hosts: int, rate: float, size: int = 700,
                  publisher: str | None = None) -> dict[str, Any]:
    """`publisher`: None, no accounts; "ctl" or "agent", the user (and account) that
    publishes, with accounts."""
    replicas, storage = VARIANTS[variant]
    work = Path(tempfile.mkdtemp(prefix=f"muster-hbcost-{variant}-"))
    cluster = start_cluster(work, 3, auth=_Accounts(work / "auth") if publisher else None)
    try:
        creds = {"user": "ctl", "password": "bench"} if publisher else {}
        nc = await nats.connect(cluster.urls, **creds)
        js = nc.jetstream()
        cfg = kv_stream(subjects.HOSTS_BUCKET, replicas, duplicate_window=5)
        cfg.storage = storage
        deadline = time.monotonic() + 60
        while True:
            try:
                await js.add_stream(cfg)
                break
            except Exception:  # noqa: BLE001 - a cluster still electing its meta leader
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.3)
        await asyncio.sleep(2)  # the stream's leader placed
        procs = [psutil.Process(node.proc.pid) for node in cluster.nodes]

        def cpu() -> float:
            return sum(sum(p.cpu_times()[:2]) for p in procs)

        body = b'{"x":"' + b"y" * (size - 8) + b'"}'
        headers = {"Nats-TTL": "15s"}
        pub = nc if publisher in (None, "ctl") else await nats.connect(cluster.urls, user=publisher, password="bench")
        before, t0 = cpu(), time.monotonic()
        batch = max(1, int(rate / 20))
        sent = 0
        while sent < n:
            for _ in range(min(batch, n - sent)):
                await pub.publish(f"$KV.{subjects.HOSTS_BUCKET}.h{sent % hosts}", body, headers=headers)
                sent += 1
            await pub.flush()
            ahead = sent / rate - (time.monotonic() - t0)
            if ahead > 0:
                await asyncio.sleep(ahead)
        await asyncio.sleep(2)  # what was sent is stored and replicated
        used, elapsed = cpu() - before, time.monotonic() - t0
        info = await js.stream_info(f"KV_{subjects.HOSTS_BUCKET}")
        if pub is not nc:
            await pub.close()
        await nc.close()
        account = {"publisher_account": CONTROL_ACCOUNT if publisher == "ctl" else AGENTS_ACCOUNT} if publisher else {}
        return {"variant": variant, **account, "replicas": replicas, "storage": storage.value, "sent": n,
                "keys_stored": info.state.messages, "seconds": round(elapsed, 1),
                "nats_cpu_s": round(used, 3), "cpu_us_per_heartbeat": round(used / n * 1e6, 1),
                "cores_at_10000_per_s": round(used / n * 10_000, 2)}
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.hbcost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--n", type=int, default=30_000, help="heartbeats per variant")
    ap.add_argument("--hosts", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=3_000.0, help="heartbeats a second")
    ap.add_argument("--accounts", action="store_true",
                    help="with accounts: each variant published from the control plane's account and the agents'")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    out = []
    for v in a.variants.split(","):
        if v not in VARIANTS:
            print(f"unknown variant {v!r}: one of {', '.join(VARIANTS)}", file=sys.stderr)
            return 2
        for publisher in ("ctl", "agent") if a.accounts else (None,):
            res = asyncio.run(measure(v, a.n, a.hosts, a.rate, publisher=publisher))
            print(json.dumps(res), flush=True)
            out.append(res)
    if a.json:
        Path(a.json).write_text(json.dumps({"command": "python -m bench.hbcost " + " ".join(argv or sys.argv[1:]),
                                            "results": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
