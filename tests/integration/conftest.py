"""Fixtures and helpers of the integration tests: a real nats-server per test, real
`muster server` and `muster agent` subprocesses, a GraphQL client, the invariant check."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.broker.natsd import NatsProcess, free_port, start_nats, wait_for_port
from tests.conftest import ROOT, proc_stat, wait_until

ARTIFACTS = ROOT / "test-artifacts"


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[NatsProcess]:
    proc = start_nats(tmp_path / "nats", port=0)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def nats_url(nats: NatsProcess) -> str:
    return nats.url


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    url: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.popen.send_signal(sig)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(10)

    def stop(self, timeout: float = 20) -> int:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            self.wait_or_kill(timeout)
        return self.popen.returncode

    def wait_or_kill(self, timeout: float) -> None:
        """Wait for the process to exit; SIGKILL it after `timeout`."""
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class Cluster:
    """Real `muster` processes started the way operators start them."""

    def __init__(self, nats_url: str, tmp: Path) -> None:
        self.nats_url = nats_url
        self.tmp = tmp
        self.procs: list[Proc] = []
        self.token = ""

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        log = self.tmp / f"{name}.log"
        out = open(log, "ab")
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        p = subprocess.Popen([sys.executable, "-m", "server.cli", *argv], stdout=out,
                             stderr=subprocess.STDOUT, cwd=ROOT, env=full_env)
        out.close()
        proc = Proc(name, p, log)
        self.procs.append(proc)
        return proc

    def server(self, name: str = "server", env: dict[str, str] | None = None, wait_token: bool = True,
               **opts: Any) -> Proc:
        port = free_port()
        data = self.tmp / name
        argv = ["server", "--nats", self.nats_url, "--http-port", str(port), "--data-dir", str(data),
                "--name", name]
        for k, v in opts.items():
            argv += [f"--{k.replace('_', '-')}", str(v)]
        proc = self._spawn(name, argv, env)
        wait_for_port(port, timeout=60)
        proc.url = f"http://127.0.0.1:{port}"
        token_file = data / "token"
        deadline = time.monotonic() + 30
        while wait_token and not self.token and time.monotonic() < deadline:
            if token_file.exists() and token_file.read_text().strip():
                self.token = token_file.read_text().strip()
                break
            time.sleep(0.05)
        return proc

    def agent(self, host_id: str, gpus: str | None = "8xH100", labels: str = "rack=r1,zone=z1",
              env: dict[str, str] | None = None, isolate: bool = False, **opts: Any) -> Proc:
        """An agent. Unless `isolate`, its tasks run as the test's own user (`--run-as`),
        so that they may use the test's files and interpreter; cgroups apply either way."""
        argv = ["agent", "--nats", self.nats_url, "--host-id", host_id, "--labels", labels,
                "--state-dir", str(self.tmp / "agents")]
        if not isolate and "run_as" not in opts:
            argv += ["--run-as", pwd.getpwuid(os.geteuid()).pw_name]
        if not isolate and "cgroup_name" not in opts:
            # Host ids repeat between tests that may run at once (pytest-xdist): each
            # agent's attempts get cgroups under a name of this test's own.
            argv += ["--cgroup-name", f"muster-{host_id}-{zlib.crc32(str(self.tmp).encode()):08x}"]
        if gpus:
            argv += ["--simulate-gpus", gpus]
        for k, v in opts.items():
            argv += [f"--{k.replace('_', '-')}", str(v)]
        return self._spawn(f"agent-{host_id}", argv, env)

    def stop_all(self, timeout: float = 20) -> None:
        """SIGTERM every process at once (each shuts down on its own: agents report
        what they stop to NATS, not to a server), then wait for each; SIGKILL after
        `timeout`."""
        live = [p for p in reversed(self.procs) if p.alive()]
        for p in live:
            p.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in live:
            p.wait_or_kill(max(0.1, deadline - time.monotonic()))


@pytest.fixture
def cluster(nats_url: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(nats_url, tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


class Api:
    """A small GraphQL client for tests."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/") + "/graphql"
        self.token = token
        self.http = httpx.Client(timeout=30)

    def raw(self, query: str, variables: dict[str, Any] | None = None, token: str | None = None) -> httpx.Response:
        tok = self.token if token is None else token
        headers = {"Authorization": f"Bearer {tok}"} if tok else {}
        return self.http.post(self.url, json={"query": query, "variables": variables or {}}, headers=headers)

    def q(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        r = self.raw(query, variables)
        assert r.status_code == 200, r.text
        body = r.json()
        assert not body.get("errors"), body["errors"]
        return body["data"]

    def submit(self, **inp: Any) -> dict[str, Any]:
        q = """mutation($input: SubmitJobInput!) { submitJob(input: $input) {
               job { id state } userErrors { field message code } } }"""
        return self.q(q, {"input": inp})["submitJob"]

    def job(self, job_id: str) -> dict[str, Any]:
        q = """query($id: ID!) { job(id: $id) { id state queuePosition pendingReasons { reason hosts }
               attempts { id number state host { id } gpuIndices exitCode outputTail reason startedAt
                          finishedAt } } }"""
        return self.q(q, {"id": job_id})["job"]

    def wait_job(self, job_id: str, states: set[str], timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        job = self.job(job_id)
        while job["state"] not in states:
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still {job['state']} after {timeout}s: {job}")
            time.sleep(0.1)
            job = self.job(job_id)
        return job

    def wait_hosts(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            c = self.q("{ cluster { hosts { healthy } } }")["cluster"]["hosts"]["healthy"]
            if c >= n:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"only {c} of {n} hosts healthy after {timeout}s")
            time.sleep(0.1)


def ctrl_c_works() -> None:
    """Popen preexec_fn for a child the test stops with SIGINT (Ctrl-C): a suite started
    in the background by a shell without job control runs with SIGINT ignored, children
    inherit that, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def group_states(group: int) -> list[str]:
    """The state letter of every process in process group `group` ('T': stopped)."""
    return [x for _, x in _group_pids(group)]


# How /proc shows a process the fence froze (agent.runner.Run.freeze: SIGSTOP, and the
# cgroup's freezer where the attempt has one): stopped ('T'), or held by the v1 freezer
# ('D'); the v2 freezer's processes show as sleeping, so its own `cgroup.events` is read.
FROZEN_STATES = ("T", "D")


def _v2_frozen(pid: int) -> bool:
    from agent import cgroups

    path = cgroups.own_cgroups(f"/proc/{pid}/cgroup").get("")
    if path is None:
        return False
    for m in cgroups.mounts():
        if m.fstype == "cgroup2":
            try:
                return "frozen 1" in Path(cgroups.under(m, path), "cgroup.events").read_text().splitlines()
            except OSError:
                continue
    return False


def _group_pids(group: int) -> list[tuple[int, str]]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = proc_stat(int(d.name))
            except OSError:
                continue
            if int(fields[2]) == group:
                out.append((int(d.name), fields[0]))
    return out


def group_frozen(group: int) -> bool:
    """Every process of process group `group` is frozen (and there is one)."""
    st = _group_pids(group)
    return bool(st) and all(x in FROZEN_STATES or _v2_frozen(pid) for pid, x in st)


def group_running(group: int) -> bool:
    """No process of process group `group` is frozen (and there is one)."""
    st = _group_pids(group)
    return bool(st) and not any(x in FROZEN_STATES or _v2_frozen(pid) for pid, x in st)


def process_gone(pid: int) -> bool:
    """No such process, or a zombie nobody has reaped yet (it runs no more code)."""
    try:
        return proc_stat(pid)[0] == "Z"
    except OSError:
        return True


def wait_all_finished(api: Api, timeout: float = 300) -> None:
    """Wait until no job is queued, placed or running (as the replica behind `api` sees it)."""

    def done() -> bool:
        j = api.q("{ cluster { jobs { queued placed running } } }")["cluster"]["jobs"]
        return j == {"queued": 0, "placed": 0, "running": 0}

    try:
        wait_until(done, timeout=timeout, interval=0.5, what="every job finished")
    except AssertionError:
        # Say which jobs did not finish and where their tries stand, for the log.
        left = []
        for st in ("QUEUED", "PLACED", "RUNNING"):
            page = api.q("query($s: JobState) { jobs(state: $s, first: 5) { totalCount edges { node { id state "
                         "attempts { id state host { id } } } } } }", {"s": st})["jobs"]
            left.append(f"{page['totalCount']} {st}: {[e['node'] for e in page['edges']]}")
        raise AssertionError("timed out waiting for every job finished; " + "; ".join(left)) from None


def stored_jobs(nats_url: str) -> dict[str, Any]:
    """Every job record in the store, by id (credentials from MUSTER_NATS_CREDS if set)."""
    import asyncio

    from server.state.checker import load
    from wire.kv import Store, connect

    async def go() -> dict[str, Any]:
        nc = await connect(nats_url, name="test-check")
        try:
            return dict((await load(Store(nc))).jobs)
        finally:
            await nc.close()

    return asyncio.run(go())


def assert_invariants(nats_url: str) -> None:
    """Run the invariant checker over everything recorded in the store. A read that times
    out (a cluster still settling after a node was killed) is tried again, up to three
    times."""
    import asyncio

    from nats.errors import TimeoutError as NatsTimeout

    from server.state.checker import run_check

    for attempt in range(3):
        try:
            problems = asyncio.run(run_check(nats_url))
            break
        except NatsTimeout:
            if attempt == 2:
                raise
            time.sleep(2)
    assert problems == [], "\n".join(problems[:50])
