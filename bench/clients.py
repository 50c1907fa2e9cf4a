"""Many clients, one job each: `muster bench --clients N --one-per-request`.

N clients, each with one keep-alive HTTP/1.1 connection of its own, send `submitJob`
mutations of one job each, as real users' programs do, at the run's arrival rate (open
loop: a job arrives at its time whether or not a client is free; it waits for the next
free client, and its submit time is its arrival, so a slow API shows as dispatch
latency rather than as fewer submissions).

The requests are written and read over plain asyncio streams with the request line and
headers made once: the load generator runs on the same machine as what it measures, and
an HTTP client library would cost it more CPU than the server spends on some requests.
Only what the benchmark needs of HTTP is spoken (Content-Length bodies, keep-alive);
`connect()` refuses anything else.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from bench.errors import BenchError

SUBMIT_ONE = "mutation($input: SubmitJobInput!) { submitJob(input: $input) { job { id } userErrors { message } } }"


@dataclass
class Connection:
    """One client's keep-alive connection to the API."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    head: bytes  # request line and headers up to Content-Length

    async def post(self, body: bytes) -> tuple[int, bytes]:
        self.writer.write(self.head + str(len(body)).encode() + b"\r\n\r\n" + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise BenchError("the API closed the connection")
        status = int(status_line.split(b" ", 2)[1])
        length = None
        chunked = False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value.strip())
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if chunked or length is None:
            raise BenchError("the API answered without a Content-Length")
        return status, await self.reader.readexactly(length)

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass


async def connect(base_url: str, token: str, path: str = "/graphql") -> Connection:
    u = urlsplit(base_url)
    if u.scheme != "http" or not u.hostname:
        raise BenchError(f"--one-per-request speaks plain HTTP only, not {base_url}")
    port = u.port or 80
    reader, writer = await asyncio.open_connection(u.hostname, port)
    head = (f"POST {path} HTTP/1.1\r\nHost: {u.hostname}:{port}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nConnection: keep-alive\r\nContent-Length: ").encode()
    return Connection(reader, writer, head)


@dataclass
class Result:
    submitted: int = 0
    refused: int = 0
    failed: int = 0
    # Seconds each request took (from sending it to its answer), for the report.
    request_s: list[float] = field(default_factory=list)


async def run_clients(
    base_urls: list[str],
    token: str,
    clients: int,
    jobs: asyncio.Queue[tuple[float, dict[str, object], object] | None],
    on_submitted: Callable[[str, float, object], None],
    connect_to: Callable[[str, str], Awaitable[Connection]] = connect,
) -> Result:
    """Run `clients` clients until each takes a None from `jobs`. A queue item is
    (arrival time, the job's SubmitJobInput, what the caller tracks it by); each job
    submitted is handed to `on_submitted(job id, arrival time, tag)`. Client i talks to
    `base_urls[i % len(base_urls)]` (replicas of the API: any of them takes submissions);
    when a request fails it reconnects, to the next URL if its own refuses."""
    res = Result()

    async def reconnect(i: int) -> tuple[int, Connection]:
        for k in range(len(base_urls)):
            j = (i + k) % len(base_urls)
            try:
                return j, await connect_to(base_urls[j], token)
            except OSError:
                continue
        raise BenchError("no API replica accepts connections")

    async def client(n: int) -> None:
        at, conn = n % len(base_urls), await connect_to(base_urls[n % len(base_urls)], token)
        try:
            while True:
                item = await jobs.get()
                if item is None:
                    return
                arrived, inp, tag = item
                body = json.dumps({"query": SUBMIT_ONE, "variables": {"input": inp}}).encode()
                t = time.monotonic()
                try:
                    status, answer = await conn.post(body)
                except (OSError, asyncio.IncompleteReadError, BenchError):
                    res.failed += 1
                    await conn.close()
                    at, conn = await reconnect(at)
                    continue
                res.request_s.append(time.monotonic() - t)
                if status != 200:
                    res.failed += 1
                    continue
                data = json.loads(answer).get("data") or {}
                job = (data.get("submitJob") or {}).get("job")
                if job:
                    res.submitted += 1
                    on_submitted(job["id"], arrived, tag)
                else:
                    res.refused += 1
        finally:
            await conn.close()

    await asyncio.gather(*(client(n) for n in range(clients)))
    return res
