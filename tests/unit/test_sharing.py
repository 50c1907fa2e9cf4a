"""GPU sharing outside the placement core: simulated and NVML MIG inventories (a fake NVML
library: no real GPU here), the environment a shared or MIG task gets (CUDA MPS limits
where MPS runs), and the overcommit checks of `muster check` and of the benchmark (shares
counted in integer thousandths, MIG instances once)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent.gpu import (
    NvmlBackend,
    SimulatedBackend,
    mig_profile_of,
    mps_reached,
    mps_running,
    parse_full_spec,
    parse_spec,
)
from agent.runner import gpu_env
from bench.observer import check_alloc
from bench.simhosts import SimHost, hold, unhold
from bench.workload import HostSpec
from server.state.invariants import Capacity, Hold, check, gpu_problems
from tests.factories import T0, host_alloc, job, job_spec, task
from tests.unit.test_gpu import FakeNvml
from wire.errors import ConfigError
from wire.messages import Attempt, AttemptState, JobState

# ---------------------------------------------------------------- simulated MIG


def test_simulated_spec_with_mig_clauses() -> None:
    count, model, mig = parse_full_spec("8xH100,mig=0-1:7*1g.10gb,mig=3:1*3g.40gb+2*2g.20gb")
    assert (count, model) == (8, "H100")
    assert mig == {0: ["1g.10gb"] * 7, 1: ["1g.10gb"] * 7, 3: ["3g.40gb", "2g.20gb", "2g.20gb"]}
    assert parse_spec("8xH100,mig=0:1*1g.10gb") == (8, "H100")


@pytest.mark.parametrize("spec", ["8xH100,mig=8:1*1g.10gb", "8xH100,mig=0:8*1g.10gb", "8xH100,mig=0:1*1g.10",
                                  "8xH100,mig=0", "8xH100,mig=1-0:1*1g.10gb", "8xH100,foo=1", "8xH100,mig=0:0*1g.10gb"])
def test_bad_mig_specs_are_refused(spec: str) -> None:
    with pytest.raises(ConfigError):
        parse_full_spec(spec)


def test_simulated_backend_reports_mig_instances_as_devices() -> None:
    b = SimulatedBackend("4xH100,mig=1:2*3g.40gb", seed=7)
    inv = b.inventory()
    assert [len(g.mig) for g in inv] == [0, 2, 0, 0]
    a, c = inv[1].mig
    assert (a.profile, a.memory_mb) == ("3g.40gb", 40 * 1024)
    assert a.uuid.startswith("MIG-") and a.uuid != c.uuid
    assert [m.uuid for m in SimulatedBackend("4xH100,mig=1:2*3g.40gb", seed=7).inventory()[1].mig] == \
        [a.uuid, c.uuid]  # seeded: the same instances every time


# ---------------------------------------------------------------- NVML MIG (fake library)


class MigNvml(FakeNvml):
    """FakeNvml with GPU 1 in MIG mode holding two instances (slots 0 and 2 of 7)."""

    NVML_DEVICE_MIG_ENABLE = 1

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        return (1, 1) if h == 1 else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, j: int) -> tuple[int, int]:
        if j not in (0, 2):
            raise self.NVMLError(6)  # NOT_FOUND: an empty slot
        return (h, j)

    def nvmlDeviceGetName(self, h: int | tuple[int, int]) -> str:
        if isinstance(h, tuple):
            return f"NVIDIA H100 80GB HBM3 MIG {'1g.10gb' if h[1] == 0 else '3g.40gb'}"
        return super().nvmlDeviceGetName(h)

    def nvmlDeviceGetUUID(self, h: int | tuple[int, int]) -> bytes:
        if isinstance(h, tuple):
            return f"MIG-aaaa{h[0]}{h[1]}".encode()
        return super().nvmlDeviceGetUUID(h)

    def nvmlDeviceGetMemoryInfo(self, h: int | tuple[int, int]) -> SimpleNamespace:
        if isinstance(h, tuple):
            return SimpleNamespace(total=(9856 if h[1] == 0 else 40192) * 1024 * 1024, used=0, free=0)
        return super().nvmlDeviceGetMemoryInfo(h)


def test_nvml_reports_mig_instances_read_only() -> None:
    fake = MigNvml(["NVIDIA H100 80GB HBM3"] * 2)
    backend = NvmlBackend(nvml=fake)
    g0, g1 = backend.inventory()
    assert g0.mig == []
    assert [(m.uuid, m.profile, m.memory_mb) for m in g1.mig] == [("MIG-aaaa10", "1g.10gb", 9856),
                                                                   ("MIG-aaaa12", "3g.40gb", 40192)]
    assert not [n for n in dir(fake) if n.startswith("nvmlDeviceSetMig")]  # nothing to change MIG mode with
    backend.close()


def test_nvml_without_mig_support_reports_none() -> None:
    backend = NvmlBackend(nvml=FakeNvml(["NVIDIA A100-SXM4-40GB"]))
    assert backend.inventory()[0].mig == []
    backend.close()


@pytest.mark.parametrize("name, profile", [("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "1g.10gb"),
                                           (b"NVIDIA A100-SXM4-40GB MIG 3g.20gb", "3g.20gb"),
                                           ("NVIDIA H100 MIG 1g.20gb+me", "1g.20gb+me"),
                                           ("NVIDIA H100 80GB HBM3", None)])
def test_mig_profile_from_the_device_name(name: str | bytes, profile: str | None) -> None:
    assert mig_profile_of(name) == profile


# ---------------------------------------------------------------- a task's environment


def test_whole_gpus_and_a_share_see_their_gpu_indices() -> None:
    assert gpu_env(task(gpu_indices=[2, 3]), mps=True)["CUDA_VISIBLE_DEVICES"] == "2,3"
    env = gpu_env(task(gpu_indices=[5], gpu_share=250, gpu_memory_mb=4096), mps=False)
    assert env["CUDA_VISIBLE_DEVICES"] == "5" and env["MUSTER_GPU_SHARE"] == "250"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env  # time-sliced: no limits without MPS


def test_under_mps_a_share_gets_its_thread_percentage_and_memory_limit() -> None:
    env = gpu_env(task(gpu_indices=[5], gpu_share=255, gpu_memory_mb=4096), mps=True)
    assert env["CUDA_VISIBLE_DEVICES"] == "5"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "26"  # 25.5 % rounded up
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert gpu_env(task(gpu_indices=[0], gpu_share=1), mps=True)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in gpu_env(task(gpu_indices=[0], gpu_share=500), mps=True)


def test_under_mps_a_share_is_told_the_pipe_directory_the_agent_found_mps_in() -> None:
    """The task's environment is clean: without the directory a task of an MPS daemon
    serving a pipe outside /tmp/nvidia-mps would run without MPS, its limits unenforced."""
    shared = task(gpu_indices=[0], gpu_share=500)
    assert gpu_env(shared, mps=True, agent_env={"CUDA_MPS_PIPE_DIRECTORY": "/run/mps"})[
        "CUDA_MPS_PIPE_DIRECTORY"] == "/run/mps"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in gpu_env(shared, mps=True, agent_env={})  # the default directory
    assert "CUDA_MPS_PIPE_DIRECTORY" not in gpu_env(shared, mps=False, agent_env={"CUDA_MPS_PIPE_DIRECTORY": "/x"})
    assert "CUDA_MPS_PIPE_DIRECTORY" not in gpu_env(task(gpu_indices=[0]), mps=True,
                                                    agent_env={"CUDA_MPS_PIPE_DIRECTORY": "/x"})


def test_a_mig_task_sees_its_instance() -> None:
    env = gpu_env(task(mig=["MIG-1234"]), mps=True)
    assert env["CUDA_VISIBLE_DEVICES"] == "MIG-1234"
    assert gpu_env(task(mig=["abcd"]), mps=False)["CUDA_VISIBLE_DEVICES"] == "MIG-abcd"


def test_mps_is_seen_by_its_control_pipe(tmp_path: Path) -> None:
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}
    assert not mps_running(env)
    (tmp_path / "control").touch()
    assert mps_running(env)


def test_which_tasks_reach_mps_and_so_run_as_one_uid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: with a uid per job, whole-GPU tasks of several jobs reached one MPS
    daemon (at the default pipe directory) as several uids, and waited on each other."""
    import agent.gpu as gpu

    monkeypatch.setattr(gpu, "MPS_PIPE_DEFAULT", str(tmp_path / "default"))
    (tmp_path / "default").mkdir()
    assert not mps_reached(250, True, {})  # no daemon
    (tmp_path / "default" / "control").touch()
    assert mps_reached(250, True, {}) and mps_reached(0, True, {})  # a share, a whole GPU: both
    assert not mps_reached(0, False, {})  # no GPU: its own uid
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "control").touch()
    elsewhere = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "elsewhere")}
    assert mps_reached(250, True, elsewhere)  # a share is told where it listens
    assert not mps_reached(0, True, elsewhere)  # a whole GPU's clean environment does not find it


# ---------------------------------------------------------------- overcommit checks


def test_gpu_problems_count_shares_in_thousandths() -> None:
    cap = Capacity(2, 8.0, 1000, {0: 1000, 1: 1000}, {"MIG-a": 1})
    assert gpu_problems([Hold((0,), 333, 300), Hold((0,), 333, 300), Hold((0,), 334, 400)], cap) == []
    assert gpu_problems([Hold((0,), 500), Hold((0,), 501)], cap) == ["GPU 0 shared 1001/1000"]
    assert gpu_problems([Hold((0,), 500, 600), Hold((0,), 400, 401)], cap) == \
        ["GPU 0 gives its shares 1001 MB of 1000 MB"]
    assert gpu_problems([Hold((1,)), Hold((1,), 10)], cap) == ["GPU 1 held whole and shared"]
    assert gpu_problems([Hold((), mig=("MIG-a",)), Hold((), mig=("MIG-a",))], cap) == \
        ["MIG instances held twice ['MIG-a']"]
    assert gpu_problems([Hold((), mig=("MIG-b",))], cap) == ["MIG instances ['MIG-b'] not on the host"]
    assert gpu_problems([Hold((0, 1)), Hold((2,))], cap) == ["GPUs [0, 1, 2] beyond 2"]
    # A GPU held whole or shared while a task holds a MIG instance on it (the host's MIG
    # layout changed under its tasks).
    assert gpu_problems([Hold((1,)), Hold((), mig=("MIG-a",))], cap) == \
        ["GPU 1 held whole and through its MIG instance MIG-a"]
    assert gpu_problems([Hold((1,), 300), Hold((), mig=("MIG-a",))], cap) == \
        ["GPU 1 held shared and through its MIG instance MIG-a"]


def test_muster_check_replays_shared_attempts() -> None:
    def attempt(i: int, share: int, end: float | None) -> Attempt:
        return Attempt(id=f"j{i}.1", number=1, host_id="h1", gpu_indices=[0], gpu_share=share, term=1,
                       state=AttemptState.SUCCEEDED if end else AttemptState.RUNNING, placed_at=T0 + i,
                       started_at=T0 + i, finished_at=end)

    cap = {"h1": Capacity(1, 8.0, 10_000, {0: 1000})}
    ok = [job(f"j{i}", state=JobState.SUCCEEDED, spec=job_spec(gpu_share=500, gpu_memory_mb=400),
              attempts=[attempt(i, 500, T0 + i + 1.5)]) for i in range(3)]
    assert check(ok, cap) == []  # at most two halves at once
    over = [job(f"j{i}", state=JobState.RUNNING, spec=job_spec(gpu_share=500), attempts=[attempt(i, 500, None)])
            for i in range(3)]
    assert any("GPU 0 shared 1500/1000" in p for p in check(over, cap))


def test_muster_check_judges_past_tries_by_no_capacity_of_now() -> None:
    """Found by exploring: a host restarted with 2 GPUs instead of 4 had every finished try
    on GPUs 2 and 3 called a violation ("GPUs [2, 3] beyond 2"). The capacity a host reports
    now holds for moments a live try is among; two tries holding one GPU at once are a
    violation whenever."""
    def attempt(i: int, gpus: list[int], end: float | None) -> Attempt:
        return Attempt(id=f"w{i}.1", number=1, host_id="h1", gpu_indices=gpus, term=1,
                       state=AttemptState.SUCCEEDED if end else AttemptState.RUNNING, placed_at=T0 + i,
                       started_at=T0 + i, finished_at=end)

    cap = {"h1": Capacity(2, 8.0, 10_000)}
    before = [job("w0", state=JobState.SUCCEEDED, spec=job_spec(gpus=2), attempts=[attempt(0, [2, 3], T0 + 5)])]
    assert check(before, cap) == []
    twice = before + [job("w1", state=JobState.SUCCEEDED, spec=job_spec(gpus=1), attempts=[attempt(1, [3], T0 + 4)])]
    assert any("a GPU held twice" in p for p in check(twice, cap))
    live = [job("w2", state=JobState.RUNNING, spec=job_spec(gpus=1), attempts=[attempt(10, [3], None)])]
    assert any("GPUs [3] beyond 2" in p for p in check(before + live, cap))


def test_the_benchmark_checks_shares_exactly() -> None:
    shared = [{"gpu_indices": [0], "gpu_share": 300, "gpu_memory_mb": 100, "cpus": 1, "memory_mb": 1}] * 3
    assert check_alloc({"tasks": shared}, (1, 8.0, 100, 300)) == []
    assert check_alloc({"tasks": shared + [{"gpu_indices": [0], "gpu_share": 101}]}, (1, 8.0, 100, 300)) == \
        ["GPU 0 shared 1001/1000"]
    assert check_alloc({"tasks": shared + [{"gpu_indices": [0]}]}, (1, 8.0, 100, 300))[0] == "GPU 0 used twice"
    assert check_alloc({"tasks": [{"mig": ["MIG-a"]}, {"mig": ["MIG-a"]}]}, (1, 8.0, 100)) == \
        ["MIG instance MIG-a used twice"]


def test_the_host_simulator_holds_shares_and_releases_them() -> None:
    h = SimHost(HostSpec("sim-0", 1, "A10", 8, 1000), "boot")
    a, b, c = ({"gpu_indices": [0], "gpu_share": 600}, {"gpu_indices": [0], "gpu_share": 400},
               {"gpu_indices": [0], "gpu_share": 1})
    assert hold(h, a) and hold(h, b)
    assert not hold(h, c)  # 1,001 thousandths: a collision
    unhold(h, c)
    unhold(h, a)
    assert h.gpu_milli == {0: 400}
    assert not hold(h, {"gpu_indices": [0]})  # whole while shared


def test_allocation_records_are_checked_too() -> None:
    alloc = host_alloc("h1", [task(attempt_id=f"j{i}.1.0", job_id=f"j{i}", gpu_indices=[0], gpu_share=600)
                              for i in range(2)])
    problems = check([], {"h1": Capacity(1, 64.0, 100_000)}, [alloc])
    assert problems == ["allocation of h1: GPU 0 shared 1200/1000"]


# ---------------------------------------------------------------- MIG layout changes and model sets


class _Cluster:
    """A ClusterState fed heartbeats and state records as its watches would, and planned
    as the leader plans (found by exploring: the three defects below)."""

    NOW = 1_000_000.0

    def __init__(self) -> None:
        import itertools

        from server.state.cluster import ClusterState

        self.state = ClusterState(heartbeat_interval_s=3600.0)
        self.rev = itertools.count(1)
        self.seq = itertools.count(1)

    def heartbeat(self, host: str, gpus: list[Any]) -> None:
        from tests.factories import heartbeat_record
        from wire.messages import GpuUsage, Heartbeat

        hb = Heartbeat(host_id=host, boot_id="b", seq=next(self.seq), ts=self.NOW, cpus=16, memory_mb=64000,
                       gpus=gpus, gpu_usage=[GpuUsage(index=g.index) for g in gpus])
        self.state.apply_host_record(heartbeat_record(hb, next(self.rev), shape=False), now=self.NOW)

    def record(self, key: str, obj: Any) -> None:
        from wire.messages import encode
        from wire.records import Record

        self.state.apply_state_record(Record(key, next(self.rev), encode(obj)))

    def submit(self, job_id: str, **spec: Any) -> None:
        self.record(f"job.{job_id}", job(job_id, spec=job_spec(job_id, **spec), submitted_at=self.NOW - 100))

    def cycle(self) -> None:
        from server.scheduling.planner import plan_cycle

        plan = plan_cycle(self.state, reports=[], commands=[], now=self.NOW, term=7, max_keys=900)
        for j in plan.jobs.values():
            self.record(f"job.{j.id}", j)
        for a in plan.allocs.values():
            self.record(f"alloc.{a.host_id}", a)

    def tasks(self) -> list[tuple[str, Any]]:
        """(job id, attempt) of every live task."""
        return [(j.id, a) for j in self.state.jobs.values() for a in j.current_tasks()]


def test_a_heartbeat_that_changes_only_a_gpus_mig_layout_or_memory_reaches_placement() -> None:
    """A heartbeat whose GPUs changed only in MIG layout or memory was not taken as a new
    shape: placement kept the GPU as it was (a whole-GPU job went onto a GPU in MIG mode,
    a task was given an instance that no longer existed)."""
    from wire.messages import GpuInfo, MigInstance

    c = _Cluster()
    c.heartbeat("h1", [GpuInfo(index=0, model="H100", memory_mb=80000)])
    assert c.state.index.caps["h1"].mig_gpus == frozenset()
    c.heartbeat("h1", [GpuInfo(index=0, model="H100", memory_mb=80000, mig_mode=True,
                               mig=[MigInstance(uuid="MIG-x", profile="1g.10gb", memory_mb=10240)])])
    cap = c.state.index.caps["h1"]
    assert cap.mig_gpus == frozenset({0}) and set(cap.mig) == {"MIG-x"}
    c.heartbeat("h1", [GpuInfo(index=0, model="H100", memory_mb=80000, mig_mode=True,
                               mig=[MigInstance(uuid="MIG-y", profile="3g.40gb", memory_mb=40960)])])
    assert set(c.state.index.caps["h1"].mig) == {"MIG-y"}
    c.heartbeat("h2", [GpuInfo(index=0, model="H100", memory_mb=0)])
    c.heartbeat("h2", [GpuInfo(index=0, model="H100", memory_mb=80000)])
    assert c.state.index.caps["h2"].gpu_memory == {0: 80000}
    # Placed as the new layout says: the whole GPU on h2, the instance that exists on h1.
    c.submit("whole", gpus=1)
    c.submit("slice", mig_profile="3g.40gb")
    c.cycle()
    placed = {j: (a.host_id, a.gpu_indices, a.mig) for j, a in c.tasks()}
    assert placed == {"whole": ("h2", [0], []), "slice": ("h1", [], ["MIG-y"])}, placed


def test_a_gpu_in_mig_mode_with_no_instance_made_yet_is_not_given_whole() -> None:
    """NVML's MIG mode on and no instance made (as right after `nvidia-smi -mig 1`) was
    reported as an ordinary GPU, and placement gave it whole: CUDA cannot use it so."""
    from server.scheduling.placement import TOO_FEW_GPUS
    from server.scheduling.placement import check as place_check
    from wire.messages import GpuInfo

    class NoInstances(MigNvml):
        def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, j: int) -> tuple[int, int]:
            raise self.NVMLError(6)

    backend = NvmlBackend(nvml=NoInstances(["NVIDIA H100 80GB HBM3"] * 2))
    g0, g1 = backend.inventory()
    backend.close()
    assert (g0.mig_mode, g1.mig_mode, g1.mig) == (False, True, [])
    assert [g.mig_mode for g in NvmlBackend(nvml=MigNvml(["NVIDIA H100 80GB HBM3"] * 2)).inventory()] == [False, True]
    sim = SimulatedBackend("2xH100,mig=1:2*1g.10gb")
    assert [g.mig_mode for g in sim.inventory()] == [False, True]
    c = _Cluster()
    c.heartbeat("h1", [g0, g1])
    cap = c.state.index.caps["h1"]
    assert cap.mig_gpus == frozenset({1})
    assert place_check(job_spec(gpus=2), cap)[0] == TOO_FEW_GPUS
    assert place_check(job_spec(gpu_share=100), cap)[1] == [0]
    # Older agents say nothing of the mode: a GPU with instances is in MIG mode still.
    assert not GpuInfo(index=0, model="H100", memory_mb=1).in_mig_mode()
    assert GpuInfo.model_validate({"index": 0, "model": "H100", "memory_mb": 1,
                                   "mig": [{"uuid": "MIG-a", "profile": "1g.10gb", "memory_mb": 1}]}).in_mig_mode()


def test_a_model_set_job_is_booked_on_its_queues_quota_as_the_model_it_runs_on() -> None:
    """A 2-GPU task accepting {A100, H100} on a host of one of each got both, booked as two
    A100s: the queue then ran three H100s on a quota of two."""
    from wire.messages import GpuInfo, Queue, ResourceQuota

    c = _Cluster()
    c.heartbeat("h1", [GpuInfo(index=0, model="A100", memory_mb=40000), GpuInfo(index=1, model="H100",
                                                                                 memory_mb=80000)])
    c.heartbeat("h2", [GpuInfo(index=i, model="H100", memory_mb=80000) for i in range(2)])
    c.record("queue.q", Queue(name="q", quota={"gpu:A100": ResourceQuota(nominal=2),
                                               "gpu:H100": ResourceQuota(nominal=2)}))
    c.submit("x", gpus=2, gpu_models=["A100", "H100"], queue="q")
    c.cycle()
    c.submit("y", gpus=2, gpu_model="H100", queue="q")
    c.cycle()
    caps = c.state.index.caps
    held = [(j, [caps[a.host_id].gpu_models[g] for g in a.gpu_indices]) for j, a in c.tasks()]
    assert held == [("x", ["H100", "H100"])], held  # y waits: the quota's two H100s are x's
    assert all(len(set(models)) == 1 for _j, models in held)


def test_an_a30s_mig_instances_are_booked_recorded_and_given_back_as_quarters() -> None:
    """Found by exploring: an A30's MIG instances (4 compute slices) were counted in
    sevenths, its whole-GPU 4g.24gb as 4/7 of a GPU, so a queue with a quota of one A30 ran
    it and a quarter more. The whole-GPU instance takes the quota's one A30; the quota is
    given back whole when it ends (nothing left over), and the history records a GPU."""
    from server.history.database import attempt_rows
    from server.scheduling.planner import plan_cycle
    from wire.messages import GpuInfo, MigInstance, Queue, ResourceQuota, StatusReport

    c = _Cluster()
    c.heartbeat("h1", [GpuInfo(index=0, model="A30", memory_mb=24000, mig_mode=True,
                               mig=[MigInstance(uuid="MIG-whole", profile="4g.24gb", memory_mb=24000)]),
                       GpuInfo(index=1, model="A30", memory_mb=24000, mig_mode=True,
                               mig=[MigInstance(uuid=f"MIG-q{i}", profile="1g.6gb", memory_mb=6000)
                                    for i in range(4)])])
    c.record("queue.q", Queue(name="q", quota={"gpu:A30": ResourceQuota(nominal=1)}))
    c.submit("whole", mig_profile="4g.24gb", queue="q")
    c.cycle()
    c.submit("quarter", mig_profile="1g.6gb", queue="q", gpu_model="A30")
    c.cycle()
    assert [j for j, _a in c.tasks()] == ["whole"]  # the quarter waits: the quota's one A30 is taken
    assert c.state.queue_usage["q"]["gpu:A30"] == pytest.approx(1.0)
    a = c.state.jobs["whole"].attempts[0]
    assert (a.gpu_model, a.mig) == ("A30", ["MIG-whole"])
    done = StatusReport(host_id="h1", attempt_id=a.id, job_id="whole", state=AttemptState.SUCCEEDED, exit_code=0,
                        ts=c.NOW)
    plan = plan_cycle(c.state, reports=[done], commands=[], now=c.NOW, term=7, max_keys=900, placements=0)
    for j in plan.jobs.values():
        c.record(f"job.{j.id}", j)
    for alloc in plan.allocs.values():
        c.record(f"alloc.{alloc.host_id}", alloc)
    assert "gpu:A30" not in c.state.queue_usage.get("q", {})  # given back whole
    assert [r["gpus"] for r in attempt_rows(c.state.jobs["whole"])] == [1.0]
    c.cycle()
    assert [j for j, a in c.tasks() if not a.state.terminal] == ["quarter"]
    assert c.state.queue_usage["q"]["gpu:A30"] == pytest.approx(0.25)
