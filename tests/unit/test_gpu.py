"""Tests for agent.gpu (no GPU needed: simulated backend and a fake NVML module)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent import gpu as gpu_mod
from agent.gpu import (
    EmptyBackend,
    GpuBackend,
    GpuFault,
    NvmlBackend,
    NvmlUnavailable,
    SimulatedBackend,
    normalise_model,
    open_backend,
    parse_fault_line,
    parse_spec,
)
from agent.hostinfo import boot_id, host_capacity, host_usage
from wire.errors import ConfigError
from wire.messages import GpuInfo, GpuUsage

# ---------------------------------------------------------------- pure functions


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 PCIe", "H100"),
        ("Tesla T4", "T4"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("NVIDIA RTX A6000", "A6000"),
        (b"NVIDIA A100-PCIE-40GB", "A100"),
        ("", "UNKNOWN"),
        ("NVIDIA", "UNKNOWN"),
        # Names that share their first words (a review: each pair below became one model,
        # so a job asking for a 96 GB RTX PRO 6000 could be given a 24 GB RTX PRO 4000).
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTXPRO6000"),
        ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "RTXPRO6000"),
        ("NVIDIA RTX PRO 4000 Blackwell", "RTXPRO4000"),
        ("Quadro RTX 6000", "RTX6000"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX6000ADA"),
        ("NVIDIA RTX 5000 Ada Generation", "RTX5000ADA"),
        ("NVIDIA TITAN RTX", "TITANRTX"),
        ("NVIDIA TITAN V", "TITANV"),
        ("NVIDIA TITAN Xp", "TITANXP"),
        ("NVIDIA GeForce GTX TITAN X", "TITANX"),
        ("NVIDIA GeForce RTX 3090 Ti", "RTX3090TI"),
        ("NVIDIA GeForce RTX 4070 Ti SUPER", "RTX4070TISUPER"),
        ("NVIDIA GeForce RTX 4070", "RTX4070"),
        ("NVIDIA H100 NVL", "H100"),
        ("NVIDIA L40S", "L40S"),
    ],
)
def test_normalise_model(name: str | bytes, model: str) -> None:
    assert normalise_model(name) == model


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("8xH100", (8, "H100")),
        ("4xA100", (4, "A100")),
        ("2xT4", (2, "T4")),
        (" 1 X l4 ", (1, "L4")),
        ("64xH200", (64, "H200")),
    ],
)
def test_parse_spec_good(spec: str, expected: tuple[int, str]) -> None:
    assert parse_spec(spec) == expected


@pytest.mark.parametrize(
    "spec", ["", "H100", "8x", "x8", "0xH100", "65xH100", "8*H100", "8xH100,2xT4", "-1xT4", "8x H 100"]
)
def test_parse_spec_bad(spec: str) -> None:
    with pytest.raises(ConfigError):
        parse_spec(spec)


def test_bad_spec_raises_config_error_from_open_backend() -> None:
    with pytest.raises(ConfigError):
        open_backend("lots of GPUs")


def test_parse_fault_line() -> None:
    fault = parse_fault_line('{"index":3,"kind":"xid","code":79,"message":"off the bus"}', ts=5.0)
    assert fault == GpuFault(index=3, kind="xid", code=79, message="off the bus", ts=5.0)
    bad_lines = [
        '{"index":-1}',
        '{"index":"3"}',
        '{"index":1,"kind":"meltdown"}',
        "[1]",
        "nonsense",
        '{"index":1,"code":"x"}',
    ]
    for bad in bad_lines:
        with pytest.raises(ValueError):
            parse_fault_line(bad, ts=0.0)


# ---------------------------------------------------------------- simulated backend


def test_simulated_inventory_and_usage_shape() -> None:
    backend = SimulatedBackend("8xH100", seed=1)
    assert isinstance(backend, GpuBackend)
    assert backend.simulated is True
    inv = backend.inventory()
    assert [g.index for g in inv] == list(range(8))
    assert all(isinstance(g, GpuInfo) and g.model == "H100" and g.memory_mb == 81559 for g in inv)
    assert len({g.uuid for g in inv}) == 8 and all(g.uuid.startswith("GPU-") for g in inv)
    usage = backend.usage()
    assert [u.index for u in usage] == list(range(8))
    for u in usage:
        assert isinstance(u, GpuUsage)
        assert 0.0 <= u.util_pct <= 100.0
        assert 0 <= u.mem_used_mb <= 81559
        assert 0.0 < u.temp_c < 100.0
        assert 0.0 < u.power_w <= 700.0 * 1.05
        assert u.healthy is True and u.fault is None


@pytest.mark.parametrize(
    ("spec", "memory"),
    [("4xA100", 40960), ("2xT4", 15360), ("1xH200", 143771), ("3xL4", 23034), ("2xMI300", 16384)],
)
def test_simulated_memory_table(spec: str, memory: int) -> None:
    assert {g.memory_mb for g in SimulatedBackend(spec, seed=0).inventory()} == {memory}


def test_simulated_seed_is_reproducible() -> None:
    a, b = SimulatedBackend("4xA100", seed=7), SimulatedBackend("4xA100", seed=7)
    a.set_busy({1})
    b.set_busy({1})
    assert a.inventory() == b.inventory()
    assert [a.usage() for _ in range(3)] == [b.usage() for _ in range(3)]


def test_set_busy_raises_utilisation_power_and_memory() -> None:
    backend = SimulatedBackend("4xA100", seed=3)
    idle = backend.usage()
    assert all(u.util_pct < 10.0 for u in idle)
    backend.set_busy({0, 2, 99})  # out-of-range indices are ignored
    for _ in range(5):
        usage = backend.usage()
        busy, quiet = [usage[0], usage[2]], [usage[1], usage[3]]
        assert min(u.util_pct for u in busy) > max(u.util_pct for u in quiet) + 40.0
        assert min(u.power_w for u in busy) > max(u.power_w for u in quiet)
        assert min(u.mem_used_mb for u in busy) > max(u.mem_used_mb for u in quiet)
    hot = backend.usage()[0].temp_c
    backend.set_busy(set())
    for _ in range(10):
        usage = backend.usage()
    assert all(u.util_pct < 10.0 for u in usage)
    assert usage[0].temp_c < hot


def test_inject_fault_in_process() -> None:
    backend = SimulatedBackend("4xH100", seed=2)
    assert backend.poll_faults() == []
    injected = backend.inject_fault(2, kind="xid", code=79, message="GPU has fallen off the bus")
    faults = backend.poll_faults()
    assert faults == [injected]
    assert (faults[0].index, faults[0].kind, faults[0].code) == (2, "xid", 79)
    assert backend.poll_faults() == []  # reported once
    for _ in range(3):  # ... but the GPU stays unhealthy
        usage = backend.usage()
        assert [u.healthy for u in usage] == [True, True, False, True]
        assert usage[2].fault is not None and "79" in usage[2].fault and "fallen off the bus" in usage[2].fault
        assert all(u.fault is None for i, u in enumerate(usage) if i != 2)


def test_inject_fault_rejects_bad_arguments() -> None:
    backend = SimulatedBackend("2xT4", seed=0)
    with pytest.raises(ValueError):
        backend.inject_fault(2)
    with pytest.raises(ValueError):
        backend.inject_fault(0, kind="melted")
    assert all(u.healthy for u in backend.usage())


def _append(path: Path, *lines: str) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.writelines(line + "\n" for line in lines)


def test_inject_fault_through_fault_file(tmp_path: Path) -> None:
    path = tmp_path / "faults.jsonl"
    backend = open_backend("4xA100", fault_file=str(path))
    assert isinstance(backend, SimulatedBackend)
    assert backend.poll_faults() == []  # file does not exist yet
    _append(path, json.dumps({"index": 3, "kind": "xid", "code": 79, "message": "fell off the bus"}))
    faults = backend.poll_faults()
    assert [(f.index, f.kind, f.code, f.message) for f in faults] == [(3, "xid", 79, "fell off the bus")]
    assert backend.poll_faults() == []  # each line applied once
    assert [u.healthy for u in backend.usage()] == [True, True, True, False]

    # Bad lines and unknown GPUs are skipped; later good lines still apply, once.
    _append(path, "not json", json.dumps({"index": 9, "kind": "xid", "code": 79}))
    _append(path, json.dumps({"index": 1, "kind": "ecc_uncorrectable", "code": 2, "message": "DBE"}))
    faults = backend.poll_faults()
    assert [(f.index, f.kind) for f in faults] == [(1, "ecc_uncorrectable")]
    assert backend.poll_faults() == []
    usage = backend.usage()
    assert [u.healthy for u in usage] == [True, False, True, False]
    assert usage[1].fault is not None and "DBE" in usage[1].fault


def test_fault_file_partial_line_waits_for_newline(tmp_path: Path) -> None:
    path = tmp_path / "faults.jsonl"
    backend = SimulatedBackend("2xT4", fault_file=str(path), seed=0)
    path.write_text('{"index":0,"kind":"xid","code":48')
    assert backend.poll_faults() == []
    with path.open("a") as fh:
        fh.write(',"message":"DBE"}\n')
    assert [(f.index, f.code) for f in backend.poll_faults()] == [(0, 48)]
    assert backend.poll_faults() == []


def test_fault_file_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "env-faults.jsonl"
    monkeypatch.setenv(gpu_mod.FAULT_FILE_ENV, str(path))
    backend = open_backend("2xL4")
    _append(path, json.dumps({"index": 0, "kind": "xid", "code": 63}))
    assert [(f.index, f.code) for f in backend.poll_faults()] == [(0, 63)]
    assert [u.healthy for u in backend.usage()] == [False, True]


# ---------------------------------------------------------------- no driver


def test_open_backend_without_driver_returns_zero_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable(fault_file: str | None = None) -> NvmlBackend:
        raise NvmlUnavailable("nvmlInit failed: NVML Shared Library Not Found")

    monkeypatch.setattr(gpu_mod, "NvmlBackend", unavailable)
    backend = open_backend(None)
    assert isinstance(backend, EmptyBackend)
    assert backend.simulated is False
    assert backend.inventory() == [] and backend.usage() == [] and backend.poll_faults() == []
    backend.close()


def test_open_backend_on_this_host_never_raises() -> None:
    backend = open_backend(None)  # real NVML where there is one, else empty
    try:
        assert backend.simulated is False
        assert len(backend.usage()) == len(backend.inventory())
        assert isinstance(backend.poll_faults(), list)
    finally:
        backend.close()


# ---------------------------------------------------------------- NVML logic, fake library


class FakeNvml:
    """Just enough of pynvml for NvmlBackend; `fail` maps 'fn:index' to an error code."""

    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_RESET_REQUIRED = 16
    nvmlEventTypeDoubleBitEccError = 0x2
    nvmlEventTypeXidCriticalError = 0x8

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(f"NVML error {value}")
            self.value = value

    def __init__(self, names: list[str], init_error: int | None = None) -> None:
        self.names = names
        self.init_error = init_error
        self.fail: dict[str, int] = {}
        self.ecc = [0] * len(names)
        self.ecc_calls = [0] * len(names)
        self.minors = list(range(len(names)))  # N of each GPU's /dev/nvidiaN
        self.events: list[SimpleNamespace] = []
        self.registered: dict[int, int] = {}
        self.shutdown_calls = 0

    def _check(self, fn: str, index: int | None = None) -> None:
        code = self.fail.get(f"{fn}:{index}") if index is not None else None
        code = code if code is not None else self.fail.get(fn)
        if code is not None:
            raise self.NVMLError(code)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        self._check("handle", i)
        return i

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetName(self, h: int) -> str:
        self._check("name", h)
        return self.names[h]

    nvmlMemory_v2 = 0x02000028

    def nvmlDeviceGetMemoryInfo(self, h: int, version: int | None = None) -> SimpleNamespace:
        """Version 1's `used` counts the driver's reserved 500 MB, version 2's does not."""
        if version is not None:
            self._check("memory_v2", h)
            return SimpleNamespace(total=81559 * 1024 * 1024, reserved=500 * 1024 * 1024,
                                   used=(500 + h) * 1024 * 1024, free=0)
        self._check("memory", h)
        return SimpleNamespace(total=81559 * 1024 * 1024, used=(1000 + h) * 1024 * 1024, free=0)

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        self._check("uuid", h)
        return f"GPU-0000000{h}".encode()

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        self._check("util", h)
        return SimpleNamespace(gpu=10 * (h + 1), memory=5)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        self._check("temp", h)
        return 40 + h

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        self._check("power", h)
        return 250_500 + h

    def nvmlDeviceGetTotalEccErrors(self, h: int, error_type: int, counter: int) -> int:
        self.ecc_calls[h] += 1
        self._check("ecc", h)
        return self.ecc[h]

    def nvmlDeviceGetMinorNumber(self, h: int) -> int:
        self._check("minor", h)
        return self.minors[h]

    def nvmlDeviceGetSupportedEventTypes(self, h: int) -> int:
        self._check("supported", h)
        return 0xFF

    def nvmlEventSetCreate(self) -> str:
        self._check("eventSetCreate")
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: int, mask: int, event_set: str) -> None:
        self._check("register", h)
        self.registered[h] = mask

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        assert timeout_ms == 0  # never block the agent
        self._check("wait")
        if not self.events:
            raise self.NVMLError(self.NVML_ERROR_TIMEOUT)
        return self.events.pop(0)

    def nvmlEventSetFree(self, event_set: str) -> None:
        return None

    def event(self, h: int, kind: int, data: int = 0) -> None:
        self.events.append(SimpleNamespace(device=h, eventType=kind, eventData=data))


def test_nvml_inventory_and_usage_with_fake_library() -> None:
    fake = FakeNvml(["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"])
    backend = NvmlBackend(nvml=fake)
    assert backend.simulated is False
    assert backend.inventory() == [
        GpuInfo(index=0, model="H100", memory_mb=81559, uuid="GPU-00000000"),
        GpuInfo(index=1, model="H100", memory_mb=81559, uuid="GPU-00000001"),
    ]
    assert fake.registered == {0: 0xA, 1: 0xA}
    u0, u1 = backend.usage()
    # memory in use as nvidia-smi counts it: NVML's version 2, without the driver's reserve
    assert (u0.util_pct, u0.mem_used_mb, u0.temp_c, u0.power_w, u0.healthy) == (10.0, 500, 40.0, 250.5, True)
    assert (u1.util_pct, u1.mem_used_mb, u1.temp_c) == (20.0, 501, 41.0)
    assert backend.poll_faults() == []
    backend.close()
    backend.close()
    assert fake.shutdown_calls == 1


def test_nvml_failing_queries_report_what_worked() -> None:
    fake = FakeNvml(["NVIDIA A100-SXM4-40GB"] * 3)
    fake.fail = {"util:0": 3, "power": 3, "name:1": 999, "handle:2": 999, "ecc": 3, "register": 3}
    backend = NvmlBackend(nvml=fake)
    inv = backend.inventory()
    assert [g.model for g in inv] == ["A100", "UNKNOWN", "UNKNOWN"]
    assert inv[1].memory_mb == 81559 and inv[2].memory_mb == 0
    usage = backend.usage()
    assert usage[0].util_pct == 0.0 and usage[0].temp_c == 40.0 and usage[0].power_w == 0.0
    assert usage[1].util_pct == 20.0
    assert [u.healthy for u in usage] == [True, True, False]  # GPU 2 could not be opened
    assert [f.index for f in backend.poll_faults()] == [2]
    assert backend.poll_faults() == []
    backend.close()


def test_nvml_xid_event_marks_gpu_unhealthy_once() -> None:
    fake = FakeNvml(["Tesla V100-SXM2-16GB"] * 2)
    backend = NvmlBackend(nvml=fake)
    fake.event(1, fake.nvmlEventTypeXidCriticalError, 79)
    fake.event(0, fake.nvmlEventTypeXidCriticalError, 43)  # application error: ignored
    faults = backend.poll_faults()
    assert [(f.index, f.kind, f.code) for f in faults] == [(1, "xid", 79)]
    assert backend.poll_faults() == []
    fake.event(1, fake.nvmlEventTypeXidCriticalError, 48)  # already faulty: not re-reported
    assert backend.poll_faults() == []
    usage = backend.usage()
    assert [u.healthy for u in usage] == [True, False]
    assert usage[1].fault is not None and "79" in usage[1].fault


def test_nvml_ecc_counter_increase_is_a_fault() -> None:
    fake = FakeNvml(["NVIDIA H200"] * 2)
    fake.ecc = [5, 0]  # pre-existing errors are the baseline, not a fault
    backend = NvmlBackend(nvml=fake)
    assert backend.poll_faults() == []
    fake.ecc[0] = 7
    faults = backend.poll_faults()
    assert [(f.index, f.kind, f.code) for f in faults] == [(0, "ecc_uncorrectable", 7)]
    assert backend.poll_faults() == []
    assert [u.healthy for u in backend.usage()] == [False, True]


def test_cleared_fault_marks_report_healthy_until_a_new_fault() -> None:
    sim = SimulatedBackend("2xH100", seed=1)
    sim.inject_fault(0)
    sim.inject_fault(1)
    sim.poll_faults()
    assert sim.clear_faults([1, 5]) == [1]  # only the GPUs named; one without a mark is no error
    assert [u.healthy for u in sim.usage()] == [False, True] and sim.clear_faults([1]) == []
    sim.inject_fault(1, code=48, message="DBE")
    assert [(f.index, f.code) for f in sim.poll_faults()] == [(1, 48)]
    assert [u.healthy for u in sim.usage()] == [False, False]
    # NVML: the ECC baseline stays, so only errors counted after the clear are a new fault.
    fake = FakeNvml(["NVIDIA H200"] * 2)
    nv = NvmlBackend(nvml=fake)
    fake.ecc[0] = 3
    assert [f.index for f in nv.poll_faults()] == [0]
    assert nv.clear_faults([0, 1]) == [0]
    assert nv.poll_faults() == [] and [u.healthy for u in nv.usage()] == [True, True]
    fake.ecc[0] = 4
    assert [(f.index, f.code) for f in nv.poll_faults()] == [(0, 4)]
    assert [u.healthy for u in nv.usage()] == [False, True]


def test_nvml_double_bit_event_is_not_double_counted() -> None:
    fake = FakeNvml(["NVIDIA H200"])
    backend = NvmlBackend(nvml=fake)
    fake.ecc[0] = 1
    fake.event(0, fake.nvmlEventTypeDoubleBitEccError)
    faults = backend.poll_faults()
    assert [(f.index, f.kind) for f in faults] == [(0, "ecc_uncorrectable")]
    assert backend.poll_faults() == []


def test_nvml_event_wait_error_does_not_raise() -> None:
    fake = FakeNvml(["NVIDIA H100 80GB HBM3"])
    backend = NvmlBackend(nvml=fake)
    fake.fail["wait"] = 999
    assert backend.poll_faults() == []
    assert backend.usage()[0].healthy is True


def test_nvml_memory_falls_back_to_version_1_once_where_version_2_is_missing() -> None:
    """Version 1 counts the driver's reserve (1000 MB and up here), version 2 does not
    (500 and up); a GPU whose driver refuses version 2 is read with version 1 from then
    on, and the host's other GPUs still with version 2."""
    fake = FakeNvml(["NVIDIA H100 80GB HBM3"] * 3)
    fake.fail["memory_v2:0"] = fake.NVML_ERROR_NOT_SUPPORTED
    backend = NvmlBackend(nvml=fake)
    assert [u.mem_used_mb for u in backend.usage()] == [1000, 501, 502]
    del fake.fail["memory_v2:0"]
    assert [u.mem_used_mb for u in backend.usage()] == [1000, 501, 502]  # version 2 not asked again of GPU 0
    fake.fail["memory_v2"] = fake.NVML_ERROR_NOT_SUPPORTED
    assert [u.mem_used_mb for u in NvmlBackend(nvml=fake).usage()] == [1000, 1001, 1002]
    old = FakeNvml(["NVIDIA H100 80GB HBM3"])
    old.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(total=81559 << 20, used=(1000 + h) << 20, free=0)
    assert [u.mem_used_mb for u in NvmlBackend(nvml=old).usage()] == [1000]  # a pynvml without versions


def test_nvml_gpu_lost_during_usage_is_a_fault() -> None:
    fake = FakeNvml(["NVIDIA H100 80GB HBM3"] * 2)
    backend = NvmlBackend(nvml=fake)
    fake.fail["util:0"] = fake.NVML_ERROR_GPU_IS_LOST
    usage = backend.usage()
    assert [u.healthy for u in usage] == [False, True]
    assert [(f.index, f.code) for f in backend.poll_faults()] == [(0, 79)]
    fake.fail = {"memory_v2:1": fake.NVML_ERROR_GPU_IS_LOST}
    assert [u.healthy for u in backend.usage()] == [False, False]
    assert [(f.index, f.code) for f in backend.poll_faults()] == [(1, 79)]


def test_nvml_device_minors_are_read_per_gpu(caplog: pytest.LogCaptureFixture) -> None:
    """Found by a review: the NVML backend had no device_minors(), so the agent took
    /dev/nvidiaN for GPU index N, which NVIDIA does not promise; a task was then let open
    another GPU's device file and kept from its own. A GPU whose minor cannot be read is
    left out (its index stands for it), said once."""
    fake = FakeNvml(["NVIDIA H100 80GB HBM3"] * 3)
    fake.minors = [2, 0, 1]
    fake.fail["minor:2"] = 999
    backend = NvmlBackend(nvml=fake)
    with caplog.at_level("WARNING", logger="agent.gpu"):
        assert backend.device_minors() == {0: 2, 1: 0}
        assert backend.device_minors() == {0: 2, 1: 0}
    assert sum("/dev/nvidia2 assumed" in r.getMessage() for r in caplog.records) == 1
    backend.close()


def test_nvml_ecc_query_is_given_up_only_when_not_supported() -> None:
    """Found by a review: one failed ECC query (any error) stopped ECC checking of that GPU
    for good, so its uncorrectable errors counted later were never a fault. Only
    NOT_SUPPORTED stops the asking; a failure at the start leaves the baseline to the next
    count read."""
    fake = FakeNvml(["NVIDIA H200"] * 3)
    fake.fail = {"ecc:1": 999, "ecc:2": fake.NVML_ERROR_NOT_SUPPORTED}
    backend = NvmlBackend(nvml=fake)
    fake.fail["ecc:0"] = 999  # a passing failure
    assert backend.poll_faults() == []
    del fake.fail["ecc:0"], fake.fail["ecc:1"]
    fake.ecc = [5, 3, 0]
    # GPU 0: 5 new errors; GPU 1: its first count read, the baseline (not a fault)
    assert [(f.index, f.code) for f in backend.poll_faults()] == [(0, 5)]
    fake.ecc[1] = 4
    assert [(f.index, f.code) for f in backend.poll_faults()] == [(1, 4)]
    assert [u.healthy for u in backend.usage()] == [False, False, True]
    calls = fake.ecc_calls[2]
    backend.poll_faults()
    assert fake.ecc_calls[2] == calls == 1  # NOT_SUPPORTED: asked once, at the start
    backend.close()


def test_nvml_reset_required_is_a_lost_gpu() -> None:
    """Found by a review: only GPU_IS_LOST marked a GPU faulty; NVML_ERROR_RESET_REQUIRED
    (the GPU unusable until reset) left it taking work."""
    fake = FakeNvml(["NVIDIA H100 80GB HBM3"] * 2)
    backend = NvmlBackend(nvml=fake)
    fake.fail["util:1"] = fake.NVML_ERROR_RESET_REQUIRED
    assert [u.healthy for u in backend.usage()] == [True, False]
    assert [(f.index, f.code) for f in backend.poll_faults()] == [(1, 79)]
    backend.close()


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_are_not_faults(xid: int) -> None:
    """Found by a review: Xids 68 and 109, which NVIDIA's Kubernetes device plugin skips as
    the application's doing, marked the GPU faulty."""
    fake = FakeNvml(["NVIDIA H100 80GB HBM3"])
    backend = NvmlBackend(nvml=fake)
    fake.event(0, fake.nvmlEventTypeXidCriticalError, xid)
    assert backend.poll_faults() == [] and backend.usage()[0].healthy is True
    backend.close()


def test_a_lasting_event_wait_failure_is_logged_again(caplog: pytest.LogCaptureFixture) -> None:
    """Found by a review: an event wait failing every time was logged once, so that Xid
    watching dead for days was one line at its start. Logged the first time and every
    100th after; no GPU is marked for it."""
    fake = FakeNvml(["NVIDIA H100 80GB HBM3"])
    backend = NvmlBackend(nvml=fake)
    fake.fail["wait"] = 999
    with caplog.at_level("WARNING", logger="agent.gpu"):
        for _ in range(201):
            assert backend.poll_faults() == []
    assert sum("event wait failed" in r.getMessage() for r in caplog.records) == 3
    assert backend.usage()[0].healthy is True
    backend.close()


def test_nvml_init_failure_raises_unavailable() -> None:
    with pytest.raises(NvmlUnavailable):
        NvmlBackend(nvml=FakeNvml([], init_error=FakeNvml.NVML_ERROR_LIBRARY_NOT_FOUND))


def test_nvml_fault_file_applies_to_real_backend(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    backend = NvmlBackend(fault_file=str(path), nvml=FakeNvml(["Tesla T4"] * 2))
    _append(path, json.dumps({"index": 1, "kind": "xid", "code": 79, "message": "drill"}))
    assert [f.index for f in backend.poll_faults()] == [1]
    assert [u.healthy for u in backend.usage()] == [True, False]


# ---------------------------------------------------------------- hostinfo


def test_hostinfo() -> None:
    cpus, mem_mb = host_capacity()
    assert cpus >= 1 and mem_mb > 0
    cpu_pct, used_mb = host_usage()
    assert 0.0 <= cpu_pct <= 100.0 * cpus
    assert 0 < used_mb <= mem_mb
    first = boot_id()
    assert first and first == boot_id()


def test_boot_id_fallback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from agent import hostinfo

    monkeypatch.setattr(hostinfo, "BOOT_ID_PATH", str(tmp_path / "missing"))
    monkeypatch.setattr(hostinfo, "_fallback_boot_id", None)
    first = hostinfo.boot_id()
    assert len(first) == 36 and first == hostinfo.boot_id()
