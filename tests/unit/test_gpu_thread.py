"""The agent never waits on NVML: its GPU watch (agent.gpuwatch) owns the backend on a
thread of its own, and the loop reads its snapshot.

The backend here stands in for NVML with a wedged driver: each call the test wedges waits
(as NVML's callers do, in D state) until the test lets it go. Each agent call under test is
made on a helper thread and must come back within a generous bound while the backend
waits for good: a call that waited on the backend would not come back at all.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

import agent.agent as agent_module
from agent.agent import Agent, AgentConfig
from agent.gpu import GpuFault
from tests.conftest import wait_until
from tests.factories import task
from wire.messages import AttemptState, GpuInfo, GpuUsage, HostAlloc, StatusReport, Task

T = TypeVar("T")
BOUND_S = 5.0  # generous: each call checked comes back in milliseconds
UTIL = 42.0  # what the backend reads for every GPU


class WedgedNvml:
    """Two GPUs whose NVML calls wait while the test holds them wedged (all of them, or
    those named): one call at a time, under one lock, as `NvmlBackend` makes them. The
    inventory is read without a call, as NvmlBackend's is (read when it started)."""

    simulated = False
    blocking = True

    def __init__(self, count: int = 2) -> None:
        self.count = count
        self.free = threading.Event()
        self.free.set()
        self.wedged: Collection[str] = ()
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.queued: list[GpuFault] = []
        self.marks: dict[int, str] = {}
        self.cleared: list[list[int]] = []
        self.closed_on = ""

    def wedge(self, *calls: str) -> None:
        self.wedged = calls or ("poll_faults", "usage", "clear_faults", "close")
        self.free.clear()

    def release(self) -> None:
        self.free.set()

    def inject(self, index: int) -> GpuFault:
        fault = GpuFault(index=index, kind="xid", code=79, message="GPU has fallen off the bus", ts=time.time())
        with self.lock:
            self.marks.setdefault(index, fault.describe())
            self.queued.append(fault)
        return fault

    def _call(self, what: str) -> None:
        self.calls[what] += 1
        if what in self.wedged:
            self.free.wait()

    def inventory(self) -> list[GpuInfo]:
        return [GpuInfo(index=i, model="H100", memory_mb=81559, uuid=f"GPU-{i}") for i in range(self.count)]

    def usage(self) -> list[GpuUsage]:
        with self.lock:
            self._call("usage")
            return [GpuUsage(index=i, util_pct=UTIL, healthy=i not in self.marks, fault=self.marks.get(i))
                    for i in range(self.count)]

    def poll_faults(self) -> list[GpuFault]:
        with self.lock:
            self._call("poll_faults")
            faults, self.queued = self.queued, []
            return faults

    def clear_faults(self, indices: Collection[int]) -> list[int]:
        with self.lock:
            self._call("clear_faults")
            self.cleared.append(sorted(indices))
            had = sorted(i for i in indices if i in self.marks)
            for i in had:
                del self.marks[i]
            return had

    def close(self) -> None:
        with self.lock:
            self._call("close")
            self.closed_on = threading.current_thread().name


def within(seconds: float, fn: Callable[[], T]) -> T:
    """`fn()` on a helper thread; fails unless it came back within `seconds` (a call that
    waits on the wedged backend is left behind, and let go when the test ends)."""
    out: list[T] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    helper = threading.Thread(target=call, daemon=True)
    helper.start()
    helper.join(seconds)
    assert not helper.is_alive(), f"still waiting after {seconds} s (on the GPU backend?)"
    if errors:
        raise errors[0]
    return out[0]


def in_a_loop(seconds: float, coro: Callable[[], Any]) -> Any:
    """A coroutine of the agent's, run in an event loop of its own on a helper thread."""
    return within(seconds, lambda: asyncio.run(coro()))


@pytest.fixture
def nvml() -> Iterator[WedgedNvml]:
    backend = WedgedNvml()
    yield backend
    backend.release()  # whatever still waits on it goes


@pytest.fixture
def make_agent(tmp_path: Path) -> Iterator[Callable[..., Agent]]:
    made: list[Agent] = []

    def make(backend: WedgedNvml, heartbeat_interval_s: float = 0.2) -> Agent:
        a = Agent(AgentConfig(nats_url="nats://127.0.0.1:1", host_id="w-1", state_dir=tmp_path / f"a{len(made)}",
                              cgroups="off", run_as=str(os.geteuid()), heartbeat_interval_s=heartbeat_interval_s),
                  gpus=backend)  # type: ignore[arg-type]
        made.append(a)
        return a

    yield make
    for a in made:
        watch = getattr(a, "gpu_watch", None)
        if watch is not None:
            watch.close()
        a.isolation.close()


def fault_lines(caplog: pytest.LogCaptureFixture, index: int) -> int:
    return sum(1 for r in caplog.records if r.getMessage().startswith(f"GPU {index} fault:"))


def test_heartbeats_go_on_while_nvml_hangs_without_its_telemetry(
        nvml: WedgedNvml, make_agent: Callable[..., Agent], caplog: pytest.LogCaptureFixture) -> None:
    """A heartbeat built while every NVML call hangs comes back at once: the inventory, each
    GPU without telemetry, and the host asking for no new work, said once in the log. Once
    NVML answers, the telemetry is back; hung again for longer than three heartbeat
    intervals, it is gone again."""
    caplog.set_level(logging.INFO)
    nvml.wedge()
    agent = make_agent(nvml)
    hb = within(BOUND_S, agent.heartbeat)
    assert [g.uuid for g in hb.gpus] == ["GPU-0", "GPU-1"]
    assert [(u.index, u.util_pct, u.healthy) for u in hb.gpu_usage] == [(0, 0.0, True), (1, 0.0, True)]
    assert hb.pressure == "GPU telemetry: no NVML reading yet"
    for _ in range(3):
        assert within(BOUND_S, agent.heartbeat).pressure == hb.pressure
    stalls = [r for r in caplog.records if "heartbeats go on without GPU telemetry" in r.getMessage()]
    assert len(stalls) == 1 and stalls[0].levelno == logging.ERROR

    nvml.release()
    hb = wait_until(lambda: (h := within(BOUND_S, agent.heartbeat)).gpu_usage[0].util_pct == UTIL and h,
                    timeout=30, what="the telemetry back")
    assert hb.pressure == "" and [u.util_pct for u in hb.gpu_usage] == [UTIL, UTIL]
    assert any("NVML answers again" in r.getMessage() for r in caplog.records)

    nvml.wedge("usage")
    hb = wait_until(lambda: (h := within(BOUND_S, agent.heartbeat)).pressure and h, timeout=30,
                    what="the telemetry taken as stale")
    assert hb.pressure == "GPU telemetry: NVML has not answered for over 0.6 s"
    assert [u.util_pct for u in hb.gpu_usage] == [0.0, 0.0]  # (for servers older than the mark)
    assert all(u.unread == ["util", "memory", "temperature", "power"] for u in hb.gpu_usage)


def test_a_fault_reaches_the_agent_once_while_nvml_hangs_after_finding_it(
        nvml: WedgedNvml, make_agent: Callable[..., Agent], caplog: pytest.LogCaptureFixture) -> None:
    """The backend finds a fault, then its next call hangs: the agent has the fault at once
    (its heartbeats show the GPU faulted), takes it once, and once only after NVML answers
    again and is read many times more."""
    agent = make_agent(nvml)
    nvml.inject(1)
    nvml.wedge("usage")
    hb = wait_until(lambda: (h := within(BOUND_S, agent.heartbeat)).gpu_usage[1].healthy is False and h,
                    timeout=30, what="the fault in a heartbeat")
    assert hb.gpu_usage[1].fault == "xid 79: GPU has fallen off the bus" and hb.gpu_usage[0].healthy
    assert agent.gpu_faults == {1: "xid 79: GPU has fallen off the bus"} and agent._fault_at > 0
    assert fault_lines(caplog, 1) == 1
    nvml.release()
    polls = nvml.calls["poll_faults"]
    for _ in range(5):
        agent.gpu_watch.poke()
        within(BOUND_S, agent.heartbeat)
    wait_until(lambda: nvml.calls["poll_faults"] >= polls + 3, timeout=30, what="more rounds")
    hb = within(BOUND_S, agent.heartbeat)
    assert [u.healthy for u in hb.gpu_usage] == [True, False] and hb.gpu_usage[1].util_pct == UTIL
    assert fault_lines(caplog, 1) == 1 and not agent.gpu_watch.take_faults()


def test_an_operators_clear_reaches_the_backend_without_the_loop_waiting(
        nvml: WedgedNvml, make_agent: Callable[..., Agent]) -> None:
    """An assignment that clears a GPU's fault mark is applied at once while NVML hangs;
    the clear reaches the backend when it answers, and the GPU is healthy again."""
    agent = make_agent(nvml)
    nvml.inject(0)
    wait_until(lambda: within(BOUND_S, agent.heartbeat).gpu_usage[0].healthy is False, timeout=30,
               what="the fault read")
    agent._gpu_clears = {}  # an assignment was read
    nvml.wedge()
    in_a_loop(BOUND_S, lambda: agent.reconcile(HostAlloc(host_id="w-1", gpu_clears={0: 1}), 1))
    assert agent._gpu_clears == {0: 1} and nvml.cleared == []
    nvml.release()
    wait_until(lambda: nvml.cleared == [[0]], timeout=30, what="the clear made")
    wait_until(lambda: within(BOUND_S, agent.heartbeat).gpu_usage[0].healthy, timeout=30,
               what="the GPU healthy again")
    assert agent.gpu_faults == {}


def test_a_failed_tries_look_at_its_gpus_reads_them_afresh_with_a_bound(
        nvml: WedgedNvml, make_agent: Callable[..., Agent], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a failed try's GPU faulted is judged on a reading begun after it ended (the
    watch reads every 60 s here, unasked): a fault a moment old is in its report. With
    NVML hung the look comes back after its bound, judged on the last reading."""
    monkeypatch.setattr(agent_module, "GPU_LOOK_S", 0.5, raising=False)
    agent = make_agent(nvml, heartbeat_interval_s=60.0)
    agent.last_heartbeat_ok = float("inf")  # a heartbeat stored since any fault (none is sent here)
    within(BOUND_S, agent.heartbeat)  # the watch starts
    wait_until(lambda: nvml.calls["usage"] >= 1, timeout=30, what="the first reading")

    def failed(t: Task) -> StatusReport:
        in_a_loop(BOUND_S, lambda: agent._on_run_state(t, AttemptState.FAILED, 1, "", "exit 1"))
        return agent._reports[-1][0]

    nvml.inject(0)
    assert failed(task("j-f", gpu_indices=[0])).gpu_fault == "GPU 0 faulted (xid 79: GPU has fallen off the bus)"
    nvml.wedge()
    nvml.inject(1)  # found by no reading: NVML hangs
    r = failed(task("j-g", gpu_indices=[1]))
    assert (r.attempt_id, r.gpu_fault) == ("j-g.1", "")
    assert any("no GPU reading within 0.5 s" in r.getMessage() for r in caplog.records)


class _Link:
    """The NATS connection a shutdown drains."""

    async def drain(self) -> None:
        return None

    async def close(self) -> None:
        return None


def _linked(agent: Agent) -> None:
    agent.store = type("StoreStandIn", (), {"nc": _Link()})()  # type: ignore[assignment]


def test_the_shutdown_returns_while_an_nvml_call_hangs(
        nvml: WedgedNvml, make_agent: Callable[..., Agent], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent whose GPU watch is stuck in NVML shuts down all the same: it waits for the
    watch a bounded time, says so, and leaves the thread (a daemon) behind; the thread
    closes the backend when NVML answers."""
    monkeypatch.setattr(agent_module, "GPU_CLOSE_S", 1.0, raising=False)
    agent = make_agent(nvml)
    nvml.wedge()
    threading.Thread(target=agent.heartbeat, daemon=True).start()  # NVML read, and hanging
    wait_until(lambda: sum(nvml.calls.values()) >= 1, timeout=30, what="a call hanging")
    _linked(agent)
    in_a_loop(15.0, lambda: agent.shutdown([], None))
    assert any("GPU watch did not stop within 1.0 s" in r.getMessage() for r in caplog.records)
    assert agent.gpu_watch.alive and not nvml.closed_on
    nvml.release()
    wait_until(lambda: not agent.gpu_watch.alive, timeout=30, what="the watch ended")
    assert nvml.closed_on == "gpu-watch"


def test_a_clean_shutdown_stops_the_watch_which_closes_the_backend(
        nvml: WedgedNvml, make_agent: Callable[..., Agent]) -> None:
    agent = make_agent(nvml)
    within(BOUND_S, agent.heartbeat)
    wait_until(lambda: nvml.calls["usage"] >= 1, timeout=30, what="the first reading")
    _linked(agent)
    in_a_loop(15.0, lambda: agent.shutdown([], None))
    assert nvml.closed_on == "gpu-watch" and not agent.gpu_watch.alive
    calls = sum(nvml.calls.values())
    agent.gpu_watch.poke()  # closed: no more calls
    time.sleep(0.2)
    assert sum(nvml.calls.values()) == calls


def test_faults_found_while_the_loop_takes_them_are_each_handed_over_once() -> None:
    """Faults the backend finds on the watch's thread, as fast as it can, while the loop
    takes them as fast as it can: each is taken once, none lost."""
    from agent.gpuwatch import GpuWatch

    backend = WedgedNvml(count=8)
    watch = GpuWatch(backend, period_s=0.0001)  # type: ignore[arg-type]
    made: list[GpuFault] = []
    taken: list[GpuFault] = []

    def produce() -> None:
        for n in range(2000):
            made.append(backend.inject(n % 8))

    watch.start()
    producer = threading.Thread(target=produce)
    producer.start()
    while producer.is_alive():
        taken += watch.take_faults()
    producer.join()
    wait_until(lambda: not backend.queued, timeout=30, what="every fault polled")
    time.sleep(0.05)  # the round that polled the last ones has published them
    taken += watch.take_faults()
    watch.close()
    assert len(taken) == len(made) == 2000 and {id(f) for f in taken} == {id(f) for f in made}


def test_a_backend_read_in_line_is_read_for_each_heartbeat_on_the_callers_thread() -> None:
    """The simulated backend declares that it never blocks: read in line, no thread, one
    reading per heartbeat, its faults and clears taken at once."""
    from agent.gpu import SimulatedBackend
    from agent.gpuwatch import GpuWatch

    sim = SimulatedBackend("2xH100", seed=1)
    watch = GpuWatch(sim, period_s=5.0)
    assert not watch.threaded
    first = watch.current()
    assert first.number == 1 and not watch.alive
    sim.inject_fault(1)
    assert watch.current().faulted() == {1: "xid 79: GPU has fallen off the bus"}
    assert [f.index for f in watch.take_faults()] == [1] and watch.take_faults() == []
    assert watch.clear([1]).result(timeout=0) == [1] and watch.snapshot().faulted() == {}
    watch.close()


def test_a_watch_that_never_ran_closes_a_blocking_backend_on_its_own_thread(nvml: WedgedNvml) -> None:
    from agent.gpuwatch import GpuWatch

    watch = GpuWatch(nvml, period_s=5.0)  # type: ignore[arg-type]
    nvml.wedge()
    within(BOUND_S, watch.close)
    nvml.release()
    wait_until(lambda: nvml.closed_on, timeout=30, what="the backend closed")
    assert nvml.closed_on == "gpu-watch" and nvml.calls["usage"] == 0
