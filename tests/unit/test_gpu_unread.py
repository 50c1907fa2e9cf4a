"""A GPU figure the agent could not read is unknown, not 0 (`GpuUsage.unread`): NVML
refuses utilisation for a GPU in MIG mode, a call fails, NVML hangs. The agent marks
each such figure, takes no idle sample from an unread utilisation, and the mark travels
between agents and servers of different versions during an upgrade."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pydantic import Field, create_model

from agent.agent import Agent, AgentConfig
from agent.gpu import NvmlBackend, SimulatedBackend
from agent.gpuwatch import GpuSnapshot, usage_to_report, util_by_index
from agent.runner import Run
from tests.factories import heartbeat, task
from tests.unit.test_gpu import FakeNvml
from wire.messages import GPU_FIGURES, GpuUsage, Heartbeat, _Model, decode, encode


def test_nvml_marks_the_figures_it_cannot_read_and_reads_the_rest() -> None:
    """GPU 0 in MIG mode: NVML refuses its utilisation (NOT_SUPPORTED), the rest is read.
    GPU 1: its temperature, power and memory calls fail. GPU 2 could not be opened: all
    four unread. Each unread figure still says 0, for servers older than the mark."""
    fake = FakeNvml(["NVIDIA H100 80GB HBM3"] * 3)
    fake.fail = {"util:0": fake.NVML_ERROR_NOT_SUPPORTED, "temp:1": 999, "power:1": 999,
                 "memory_v2:1": 999, "memory:1": 999, "handle:2": 999}
    backend = NvmlBackend(nvml=fake)
    u0, u1, u2 = backend.usage()
    assert u0.unread == ["util"] and u0.util_read is None and u0.util_pct == 0.0
    assert (u0.mem_used_read, u0.temp_read, u0.power_read) == (500, 40.0, 250.5)
    assert u1.unread == ["memory", "temperature", "power"] and u1.util_read == 20.0
    assert (u1.mem_used_read, u1.temp_read, u1.power_read) == (None, None, None)
    assert (u1.mem_used_mb, u1.temp_c, u1.power_w) == (0, 0.0, 0.0)
    assert u2.unread == list(GPU_FIGURES)
    fake.fail = {"handle:2": 999}
    assert [u.unread for u in backend.usage()][:2] == [[], []]  # read again: no mark
    backend.close()


def _snapshot() -> GpuSnapshot:
    return GpuSnapshot(usage=(GpuUsage(index=0, util_pct=97.0, mem_used_mb=70000, temp_c=61.0, power_w=650.0),
                              GpuUsage(index=1, util_pct=3.0, healthy=False, fault="xid 79", unread=["power"])),
                       inventory=(), taken_at=1.0)


def test_a_stale_snapshot_is_reported_with_every_figure_unread() -> None:
    """NVML hangs: numbers read long ago are not the GPUs' state; their faults stay known."""
    stale = usage_to_report(_snapshot(), stale=True)
    assert [(u.index, u.unread, u.healthy, u.fault) for u in stale] == [
        (0, list(GPU_FIGURES), True, None), (1, list(GPU_FIGURES), False, "xid 79")]
    assert all((u.util_read, u.mem_used_read, u.temp_read, u.power_read) == (None,) * 4 for u in stale)
    fresh = usage_to_report(_snapshot(), stale=False)
    assert [u.unread for u in fresh] == [[], ["power"]] and fresh[0].util_read == 97.0
    fresh[1].unread.append("util")  # a copy: the snapshot, shared with other readers, unchanged
    assert _snapshot().usage[1].unread == ["power"] and util_by_index(fresh) == {0: 97.0}


def test_an_older_agents_heartbeat_decodes_with_every_figure_read() -> None:
    raw = encode(heartbeat("h1", gpus=2, util=[40.0, 0.0]))
    old = raw.replace(b',"unread":[]', b"")
    assert b"unread" not in old
    hb = decode(Heartbeat, old)
    assert [(u.unread, u.util_read) for u in hb.gpu_usage] == [([], 40.0), ([], 0.0)]


# What a server older than the mark decodes a heartbeat into: GpuUsage without `unread`.
_OldGpuUsage: Any = create_model(
    "GpuUsage", __base__=_Model,
    **{name: (f.annotation, f) for name, f in GpuUsage.model_fields.items() if name != "unread"})
_OldHeartbeat: Any = create_model(
    "Heartbeat", __base__=Heartbeat,
    gpu_usage=(list[_OldGpuUsage], Field(default_factory=list, max_length=64)))


def test_a_newer_agents_heartbeat_decodes_on_an_older_server_with_zeros() -> None:
    """Mixed versions during an upgrade: the older server ignores the mark (its models
    ignore fields they do not know) and reads the zeros, as before the mark."""
    hb = heartbeat("h1", gpus=2, util=[97.0, 40.0], temp_c=60.0, power_w=500.0,
                   unread={0: ["util"], 1: ["util", "memory", "temperature", "power"]})
    old = decode(_OldHeartbeat, encode(hb))
    assert "unread" not in _OldGpuUsage.model_fields
    assert [(u.util_pct, u.temp_c, u.power_w) for u in old.gpu_usage] == [(0.0, 60.0, 500.0), (0.0, 0.0, 0.0)]


def test_names_a_newer_agent_may_add_are_dropped_not_refused() -> None:
    hb = heartbeat("h1", gpus=1)
    raw = encode(hb).replace(b'"unread":[]', b'"unread":["fan","power","util","power"]')
    [u] = decode(Heartbeat, raw).gpu_usage
    assert u.unread == ["util", "power"]  # known ones, once each, in their order


class _MigUtil(SimulatedBackend):
    """Simulated GPUs that stay idle, GPU 1's utilisation unread (as NVML in MIG mode)."""

    def set_busy(self, indices: set[int]) -> None:
        super().set_busy(set())


def test_no_idle_sample_is_taken_from_an_unread_utilisation() -> None:
    backend = _MigUtil("2xH100")
    backend.set_unreadable({1: ["util"]})
    agent = Agent(AgentConfig(nats_url="nats://127.0.0.1:4222", host_id="h1", gpu_idle_after_s=60.0), gpus=backend)

    async def noop(*_: Any) -> None:
        return None

    both = Run(task("jobmig01", gpu_indices=[0, 1]), on_state=noop)
    alone = Run(task("jobone01", gpu_indices=[0]), on_state=noop)
    for r in (both, alone):
        r.proc = SimpleNamespace(returncode=None)  # type: ignore[assignment]  # its process runs
        agent.runs[r.task.attempt_id] = r
    hb = agent.heartbeat()
    assert [u.unread for u in hb.gpu_usage] == [[], ["util"]] and hb.gpu_usage[1].util_pct == 0.0
    assert (both.gpu_util_samples, both.gpu_idle_since) == (0, None)  # unknown is not idle
    assert alone.gpu_util_samples == 1 and alone.gpu_idle_since is not None
    backend.set_unreadable({})
    agent.heartbeat()
    assert both.gpu_util_samples == 1 and both.gpu_idle_since is not None
    # Unread again: the idle stretch ends (a review: it grew on through unknown figures, and
    # raised job.gpus_idle once long enough); idle again from the next read sample.
    backend.set_unreadable({1: ["util"]})
    agent.heartbeat()
    assert both.gpu_util_samples == 1 and both.gpu_idle_since is None and alone.gpu_idle_since is not None
