"""What unit and integration tests share: the checkout's paths, the polling helpers, a
credentials directory. Fixtures that start real processes are in tests/integration/conftest.py."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from server.broker import natsd
from server.broker.natsauth import AuthDir

ROOT = Path(__file__).resolve().parent.parent

# Each test worker (pytest-xdist) and the processes it starts pick free ports from a range
# of its own (server.broker.natsd.free_port): two workers once picked the same port and a
# server could not listen on it.
def worker_ports(worker: str, workers: int, whole: tuple[int, int]) -> str:
    """The slice of the port range `whole` for xdist worker `worker` ("gw<i>") of `workers`."""
    n = max(1, workers)
    i = int(worker[2:]) % n
    span = (whole[1] - whole[0]) // n
    return f"{whole[0] + i * span}-{whole[0] + (i + 1) * span}"


if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw") and natsd.PORTS_ENV not in os.environ:
    os.environ[natsd.PORTS_ENV] = worker_ports(os.environ["PYTEST_XDIST_WORKER"],
                                               int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")),
                                               natsd.port_range())

# The agents and the subscriber of the `auth` fixture.
A, B = "host-a", "host-b"


def wait_until(pred: Any, timeout: float = 30, interval: float = 0.05, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


async def eventually(pred: Any, timeout: float = 10.0, what: str = "condition", interval: float = 0.05) -> Any:
    """`wait_until` for async tests: poll `pred` (a function, or a coroutine function)
    without blocking the event loop; returns its first truthy value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if inspect.isawaitable(v):
            v = await v
        if v:
            return v
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def frozen(*pids: int) -> Iterator[None]:
    """The processes stopped (SIGSTOP) for the block and continued (SIGCONT) after it,
    whatever happens in it: a server that stops answering without closing anything. The
    block starts once each process is seen stopped (`T` in /proc/<pid>/stat), not merely
    signalled."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        for pid in pids:
            wait_until(lambda pid=pid: _state(pid) in ("T", "t"), timeout=10, interval=0.01,
                       what=f"process {pid} stopped")
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def proc_stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command's parentheses (state, ppid,
    process group, ...). Raises OSError when there is no such process. Read as bytes: a
    process's name may be any bytes (a test of the watchdog names one b"\\xff\\xfe", and
    a test looking over every process failed on it)."""
    return Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].decode("ascii", errors="replace").split()


def _state(pid: int) -> str:
    """A process's state letter."""
    return proc_stat(pid)[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `heavy` (long runs of many processes: benchmarks, clusters under load)
    share one xdist group, so that with `-n N --dist loadgroup` (make test) they run on one
    worker one after another, never two at once on a 2-core machine."""
    for item in items:
        if item.get_closest_marker("heavy") is not None:
            item.add_marker(pytest.mark.xdist_group("heavy"))


@pytest.fixture
def auth(tmp_path: Path) -> AuthDir:
    """A credentials directory as Muster makes it (nkey seeds, the nats-server users and
    config): agents A and B, subscriber "pager". Files only: no nats-server runs."""
    a = AuthDir(tmp_path / "auth")
    a.ensure()
    a.issue_agent(A)
    a.issue_agent(B)
    a.issue_subscriber("pager")
    return a
