"""GPU telemetry for the agent: inventory, usage and fault detection.

Three backends share one protocol (`GpuBackend`):

* `NvmlBackend`      real GPUs through nvidia-ml-py (`pynvml`); every NVML query is
                     guarded so one failing call never takes the agent down.
* `SimulatedBackend` a fake host ("8xH100") with plausible, seeded telemetry and fault
                     injection, in-process (`inject_fault`) or from outside through a
                     JSON-lines fault file.
* `EmptyBackend`     no GPUs (no driver on this host).

`open_backend()` picks one; the agent makes the calls of a backend whose calls may block
(`GpuBackend.blocking`: NVML) on a thread of its own, never on its loop (`agent.gpuwatch`).
GPU indices are NVML enumeration order (PCI bus order); a
process that runs work on them should set CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA agrees.

Fault semantics: `poll_faults()` returns each fault once; from then on the GPU's
`usage()` entry stays `healthy=False` with the first fault's text, for the life of the
backend.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol, TypeVar, runtime_checkable

from wire.errors import ConfigError
from wire.messages import GPU_FIGURE_FIELDS, GPU_FIGURES, MIG_PROFILE_PATTERN, GpuFigure, GpuInfo, GpuUsage, MigInstance

log = logging.getLogger(__name__)

MAX_GPUS = 64
FAULT_FILE_ENV = "MUSTER_FAULT_FILE"
FAULT_KINDS = ("xid", "ecc_uncorrectable")

# Memory (MiB) per simulated model, as NVML reports it for the common SKU.
MODEL_MEMORY_MB: dict[str, int] = {
    "H100": 81559,
    "H200": 143771,
    "A100": 40960,
    "V100": 16384,
    "T4": 15360,
    "L4": 23034,
    "A10": 23028,
}
DEFAULT_MEMORY_MB = 16384

# Board power limit (W) per simulated model; drives the simulated power draw.
MODEL_POWER_W: dict[str, float] = {
    "H100": 700.0,
    "H200": 700.0,
    "A100": 400.0,
    "V100": 300.0,
    "T4": 70.0,
    "L4": 72.0,
    "A10": 150.0,
}
DEFAULT_POWER_W = 250.0

# Xids that are almost always caused by the application, not the hardware (e.g. 45 is
# logged whenever a CUDA process is killed). They are logged, not reported as faults. The
# list NVIDIA's Kubernetes device plugin skips too (68: a video processor exception, 109:
# a context switch timeout, both a program's doing).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
# NVML errors that say a GPU is gone until it is reset: GPU_IS_LOST (15), RESET_REQUIRED (16).
_LOST_ERRORS = (("NVML_ERROR_GPU_IS_LOST", 15, "is lost"), ("NVML_ERROR_RESET_REQUIRED", 16, "needs a reset"))
# A failing event wait is logged the first time and then every this many times: Xid watching
# that keeps failing stays visible in the log without filling it.
EVENT_WAIT_LOG_EVERY = 100

_SPEC_RE = re.compile(r"^\s*(\d{1,3})\s*[xX]\s*([A-Za-z0-9][A-Za-z0-9_.-]{0,31})\s*$")
_BRAND_TOKENS = frozenset({"NVIDIA", "TESLA", "GEFORCE", "QUADRO"})
# Words after an RTX or GTX number that make another product: the architecture some
# workstation names add ("RTX 6000 Ada Generation", a generation after the Quadro RTX 6000)
# and the consumer variants ("RTX 4070 Ti SUPER"), often with other memory.
_VARIANT_TOKENS = frozenset({"ADA", "BLACKWELL", "HOPPER", "AMPERE", "TURING", "TI", "SUPER"})


@dataclass
class GpuFault:
    """A critical fault on one GPU, reported once by `poll_faults()`."""

    index: int
    kind: str  # "xid" or "ecc_uncorrectable"
    code: int
    message: str
    ts: float

    def describe(self) -> str:
        """Short text for `GpuUsage.fault`."""
        label = f"xid {self.code}" if self.kind == "xid" else f"{self.kind} ({self.code})"
        return f"{label}: {self.message}" if self.message else label


@runtime_checkable
class GpuBackend(Protocol):
    """What the agent needs from a GPU telemetry source. `blocking`: whether its calls may
    wait on a device (NVML: tens of milliseconds, or for good with a wedged driver); the
    agent then makes them on a thread of its own (`agent.gpuwatch`), else on its loop."""

    simulated: bool
    blocking: bool

    def inventory(self) -> list[GpuInfo]:
        """Static description of every GPU on the host."""
        ...

    def usage(self) -> list[GpuUsage]:
        """Current utilisation, memory, temperature, power and health per GPU."""
        ...

    def poll_faults(self) -> list[GpuFault]:
        """Faults that appeared since the previous call; never blocks."""
        ...

    def clear_faults(self, indices: Collection[int]) -> list[int]:
        """Forget these GPUs' fault marks (an operator cleared them, after a reset or a
        repair): they report healthy until a new fault. Returns the indices that had one."""
        ...

    def close(self) -> None:
        """Release the backend's resources; safe to call twice."""
        ...


# ---------------------------------------------------------------- pure helpers


def normalise_model(name: str | bytes) -> str:
    """Reduce an NVML product name to the short model used for scheduling.

    "NVIDIA H100 80GB HBM3" -> "H100", "NVIDIA A100-SXM4-40GB" -> "A100",
    "Tesla V100-SXM2-16GB" -> "V100", "NVIDIA GeForce RTX 4090" -> "RTX4090",
    "NVIDIA RTX A6000" -> "A6000". Names that share their first words keep the words that
    tell them apart: "NVIDIA RTX 6000 Ada Generation" -> "RTX6000ADA" (not the Quadro RTX
    6000's "RTX6000"), "NVIDIA RTX PRO 6000 Blackwell ..." -> "RTXPRO6000" (not the RTX
    PRO 4000's), "NVIDIA GeForce RTX 4070 Ti SUPER" -> "RTX4070TISUPER", "NVIDIA TITAN
    RTX" -> "TITANRTX", "NVIDIA TITAN V" -> "TITANV".
    Unrecognisable input gives "UNKNOWN".
    """
    if isinstance(name, bytes):
        name = name.decode("utf-8", "replace")
    tokens = [t for t in name.upper().split() if t not in _BRAND_TOKENS]
    if not tokens:
        return "UNKNOWN"
    first, rest = tokens[0], tokens[1:]
    if first in ("RTX", "GTX") and rest:
        following = rest.pop(0)
        if following == "PRO" and rest and rest[0][:1].isdigit():  # RTX PRO 6000 Blackwell
            first = "RTXPRO" + rest.pop(0)
        elif following[:1].isdigit():
            first = first + following
            while rest and rest[0] in _VARIANT_TOKENS:  # RTX 6000 Ada Generation, RTX 4070 Ti SUPER
                first += rest.pop(0)
        else:
            first = following  # RTX A6000; GTX TITAN X
    if first == "TITAN" and rest and re.fullmatch(r"[A-Z0-9]{1,4}", rest[0]):
        first += rest.pop(0)  # TITAN RTX, TITAN V, TITAN XP
    model = first.split("-", 1)[0]
    model = re.sub(r"[^A-Z0-9_.]", "", model)[:64]
    return model or "UNKNOWN"


_MIG_PROFILE_RE = re.compile(MIG_PROFILE_PATTERN)
# The profile word after "MIG " in an NVML MIG device name, whole: "1g.10gb", "1g.20gb+me",
# and for a compute instance smaller than its GPU instance "1c.7g.80gb" (so that it is not
# taken for a 7g.80gb).
_MIG_IN_NAME_RE = re.compile(r"(?:^|\s)MIG\s+(\S{1,32})", re.IGNORECASE)
_COMPUTE_INSTANCE_RE = re.compile(r"^[1-9]c\.", re.IGNORECASE)
MAX_MIG_PER_GPU = 7


def parse_mig(clause: str, count: int) -> dict[int, list[str]]:
    """The MIG part of a simulated-host spec: `mig=GPUS:N*PROFILE[+N*PROFILE...]`, GPUS an
    index or a range (`0`, `0-3`), e.g. `mig=0-1:7*1g.10gb` or `mig=2:1*3g.40gb+2*2g.20gb`.
    Returns GPU index -> the profiles of its instances, in order. ConfigError otherwise."""
    where, _, layout = clause.partition(":")
    bad = f"bad MIG spec {clause!r}: expected mig=GPUS:N*PROFILE[+N*PROFILE...], e.g. mig=0-1:7*1g.10gb"
    m = re.fullmatch(r"(\d{1,2})(?:-(\d{1,2}))?", where.strip())
    if not m or not layout:
        raise ConfigError(bad)
    first, last = int(m.group(1)), int(m.group(2) or m.group(1))
    if not 0 <= first <= last < count:
        raise ConfigError(f"{bad} (GPUs 0-{count - 1} on this host)")
    profiles: list[str] = []
    for part in layout.split("+"):
        n, star, profile = part.strip().partition("*")
        if not star or not n.isdigit() or not _MIG_PROFILE_RE.fullmatch(profile.strip()):
            raise ConfigError(bad)
        profiles += [profile.strip()] * int(n)
    if not 1 <= len(profiles) <= MAX_MIG_PER_GPU:
        raise ConfigError(f"{bad} (1 to {MAX_MIG_PER_GPU} instances per GPU)")
    return {i: list(profiles) for i in range(first, last + 1)}


def mig_profile_of(name: str | bytes) -> str | None:
    """The MIG profile in an NVML MIG device name, the whole word after "MIG " ("NVIDIA H100
    80GB HBM3 MIG 1g.10gb" -> "1g.10gb", "... MIG 1c.7g.80gb" -> "1c.7g.80gb"), or None.
    Only a profile matching `MIG_PROFILE_PATTERN` can be reported and scheduled."""
    if isinstance(name, bytes):
        name = name.decode("utf-8", "replace")
    m = _MIG_IN_NAME_RE.search(name)
    return m.group(1).lower() if m else None


def is_compute_instance(profile: str) -> bool:
    """Whether a MIG profile names a compute instance smaller than its GPU instance
    ("1c.7g.80gb": one of the 7g.80gb's seven slices, its memory shared with the others)."""
    return bool(_COMPUTE_INSTANCE_RE.match(profile))


def mig_memory_mb(profile: str) -> int:
    """A simulated MIG instance's memory: the profile's gigabytes (1g.10gb -> 10,240 MiB)."""
    return int(profile.split(".")[1].split("gb")[0]) * 1024


def parse_spec(spec: str) -> tuple[int, str]:
    """Parse a simulated-host spec such as "8xH100" into (count, model); a spec with MIG
    clauses ("8xH100,mig=0-1:7*1g.10gb") gives the same, see `parse_full_spec`.

    Raises ConfigError for anything else, or a count outside 1..64.
    """
    count, model, _ = parse_full_spec(spec)
    return count, model


def parse_full_spec(spec: str) -> tuple[int, str, dict[int, list[str]]]:
    """`COUNTxMODEL[,mig=GPUS:N*PROFILE[+...]]...` -> (count, model, GPU -> MIG profiles)."""
    head, *clauses = (spec or "").split(",")
    count, model = _parse_count_model(head)
    mig: dict[int, list[str]] = {}
    for clause in clauses:
        key, eq, value = clause.strip().partition("=")
        if key != "mig" or not eq:
            raise ConfigError(f"bad GPU simulation spec {spec!r}: after COUNTxMODEL only mig=... clauses "
                              "(e.g. 8xH100,mig=0-1:7*1g.10gb)")
        mig.update(parse_mig(value, count))
    return count, model, mig


def _parse_count_model(spec: str) -> tuple[int, str]:
    match = _SPEC_RE.match(spec or "")
    if not match:
        raise ConfigError(f"bad GPU simulation spec {spec!r}: expected COUNTxMODEL, e.g. 8xH100")
    count = int(match.group(1))
    if not 1 <= count <= MAX_GPUS:
        raise ConfigError(f"bad GPU simulation spec {spec!r}: count must be 1..{MAX_GPUS}")
    return count, match.group(2).upper()


def is_critical_xid(code: int) -> bool:
    """Whether an Xid should mark the GPU unhealthy (application-caused ones do not)."""
    return code not in APPLICATION_XIDS


def parse_fault_line(line: str, ts: float) -> GpuFault:
    """Decode one fault-file line ({"index":3,"kind":"xid","code":79,"message":"..."}).

    Raises ValueError when the line is not a valid fault.
    """
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    index = data.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ValueError(f"bad index {index!r}")
    kind = data.get("kind", "xid")
    if kind not in FAULT_KINDS:
        raise ValueError(f"bad kind {kind!r}")
    code = data.get("code", 79 if kind == "xid" else 1)
    if not isinstance(code, int) or isinstance(code, bool):
        raise ValueError(f"bad code {code!r}")
    message = str(data.get("message", "injected fault"))[:256]
    return GpuFault(index=index, kind=kind, code=code, message=message, ts=ts)


class FaultFile:
    """Reads faults appended to a JSON-lines file, each line applied once.

    Only complete (newline-terminated) lines are consumed, so a writer caught mid-line
    is read on the next poll. If the file shrinks below what was consumed it is taken
    as a fresh file and read from the start.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.consumed = 0

    def read_new(self) -> list[GpuFault]:
        """Faults on lines not seen before; bad lines are logged and skipped."""
        try:
            with open(self.path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.warning("cannot read fault file %s: %s", self.path, exc)
            return []
        lines = text.split("\n")[:-1]  # drop the unterminated tail (or the "" after \n)
        if len(lines) < self.consumed:
            self.consumed = 0
        faults: list[GpuFault] = []
        now = time.time()
        for number, line in enumerate(lines[self.consumed :], start=self.consumed + 1):
            if not line.strip():
                continue
            try:
                faults.append(parse_fault_line(line, now))
            except ValueError as exc:
                log.warning("fault file %s line %d ignored: %s", self.path, number, exc)
        self.consumed = len(lines)
        return faults


class _Health:
    """Per-GPU sticky health shared by the backends (callers hold their own lock)."""

    def __init__(self, count: int) -> None:
        self.fault_text: dict[int, str] = {}
        self.count = count

    def record(self, fault: GpuFault) -> bool:
        """Mark the GPU faulty; False if the index does not exist on this host."""
        if not 0 <= fault.index < self.count:
            log.warning("ignoring fault for unknown GPU %d: %s", fault.index, fault.describe())
            return False
        self.fault_text.setdefault(fault.index, fault.describe())
        return True

    def clear(self, indices: Collection[int]) -> list[int]:
        """Forget the marks of `indices`; those that had one."""
        cleared = sorted(i for i in set(indices) if i in self.fault_text)
        for i in cleared:
            del self.fault_text[i]
        return cleared

    def apply(self, entry: GpuUsage) -> GpuUsage:
        """Set healthy/fault on a usage entry from the sticky state."""
        text = self.fault_text.get(entry.index)
        if text is not None:
            entry.healthy = False
            entry.fault = text
        return entry


# ---------------------------------------------------------------- empty


class EmptyBackend:
    """A host without GPUs (or without a working driver)."""

    simulated = False
    blocking = False

    def inventory(self) -> list[GpuInfo]:
        return []

    def usage(self) -> list[GpuUsage]:
        return []

    def poll_faults(self) -> list[GpuFault]:
        return []

    def clear_faults(self, indices: Collection[int]) -> list[int]:  # noqa: ARG002 - no GPUs
        return []

    def close(self) -> None:
        return None


# ---------------------------------------------------------------- simulated


@dataclass
class _SimGpu:
    util: float = 0.0
    mem_used: int = 0
    temp: float = 32.0


class SimulatedBackend:
    """Fake GPUs from a spec like "8xH100", with telemetry that follows `set_busy`.

    `seed` makes telemetry and UUIDs reproducible; without it UUIDs are random per
    instance (so several simulated agents on one machine do not collide). `fault_file`
    defaults to the MUSTER_FAULT_FILE environment variable.
    """

    simulated = True
    blocking = False  # in-process: read on the agent's loop, deterministically

    def __init__(self, spec: str, fault_file: str | None = None, seed: int | None = None) -> None:
        self.count, self.model, mig = parse_full_spec(spec)
        self.memory_mb = MODEL_MEMORY_MB.get(self.model, DEFAULT_MEMORY_MB)
        self.power_limit_w = MODEL_POWER_W.get(self.model, DEFAULT_POWER_W)
        self._rng = random.Random(seed if seed is not None else zlib.crc32(spec.encode()))
        uuid_rng = random.Random(seed) if seed is not None else None
        self._uuids = [
            f"GPU-{uuid.UUID(int=uuid_rng.getrandbits(128), version=4) if uuid_rng else uuid.uuid4()}"
            for _ in range(self.count)
        ]
        # MIG instances of the GPUs in MIG mode (the spec's mig= clauses), with UUIDs as
        # NVML gives them ("MIG-<uuid>").
        self.mig: dict[int, list[MigInstance]] = {
            i: [MigInstance(uuid="MIG-" + str(uuid.UUID(int=uuid_rng.getrandbits(128), version=4) if uuid_rng
                                              else uuid.uuid4()),
                            profile=p, memory_mb=mig_memory_mb(p)) for p in profiles]
            for i, profiles in sorted(mig.items())}
        self._gpus = [_SimGpu() for _ in range(self.count)]
        self._busy: set[int] = set()
        self._unreadable: dict[int, list[GpuFigure]] = {}
        self._health = _Health(self.count)
        self._pending: list[GpuFault] = []
        path = fault_file if fault_file is not None else os.environ.get(FAULT_FILE_ENV)
        self._fault_file = FaultFile(path) if path else None
        self._lock = threading.Lock()

    def inventory(self) -> list[GpuInfo]:
        return [
            GpuInfo(index=i, model=self.model, memory_mb=self.memory_mb, uuid=self._uuids[i],
                    mig=[m.model_copy() for m in self.mig.get(i, ())], mig_mode=i in self.mig)
            for i in range(self.count)
        ]

    def set_busy(self, indices: set[int]) -> None:
        """Hint which GPUs are running work; their telemetry rises, the others idle."""
        with self._lock:
            self._busy = {i for i in indices if 0 <= i < self.count}

    def set_unreadable(self, figures: Mapping[int, Iterable[GpuFigure]]) -> None:
        """Have these GPUs' figures reported unread from now on (as NVML refuses
        utilisation for a GPU in MIG mode), replacing any set before."""
        with self._lock:
            self._unreadable = {i: list(f) for i, f in figures.items() if 0 <= i < self.count}

    def usage(self) -> list[GpuUsage]:
        """Advance the simulation one step and report it."""
        out: list[GpuUsage] = []
        with self._lock:
            for i, gpu in enumerate(self._gpus):
                self._step(gpu, busy=i in self._busy)
                power = self.power_limit_w * (0.08 + 0.85 * gpu.util / 100.0)
                power *= 1.0 + self._rng.uniform(-0.03, 0.03)
                figures: dict[str, Any] = {"util_pct": round(gpu.util, 1), "mem_used_mb": gpu.mem_used,
                                           "temp_c": round(gpu.temp, 1), "power_w": round(power, 1)}
                unread = self._unreadable.get(i, [])
                for f in unread:  # (0 where not read, as NVML's backend says it)
                    figures[GPU_FIGURE_FIELDS[f]] = 0
                entry = GpuUsage(index=i, unread=unread, **figures)
                out.append(self._health.apply(entry))
        return out

    def _step(self, gpu: _SimGpu, busy: bool) -> None:
        """Move one GPU's state towards its busy or idle level, with noise."""
        rng = self._rng
        if busy:
            gpu.util = min(100.0, max(60.0, rng.gauss(90.0, 8.0)))
            target_mem = int(self.memory_mb * rng.uniform(0.55, 0.9))
            target_temp = 68.0 + gpu.util / 10.0
        else:
            gpu.util = rng.uniform(0.0, 3.0)
            target_mem = int(self.memory_mb * 0.005)
            target_temp = 32.0
        if busy and gpu.mem_used >= self.memory_mb // 2:
            target_mem = gpu.mem_used + rng.randint(-64, 64)  # a running job keeps its memory
        gpu.mem_used = max(0, min(self.memory_mb, target_mem))
        gpu.temp += (target_temp - gpu.temp) * 0.5 + rng.uniform(-0.5, 0.5)

    def inject_fault(
        self, index: int, kind: str = "xid", code: int = 79, message: str = "GPU has fallen off the bus"
    ) -> GpuFault:
        """Fault one GPU: poll_faults() reports it once, the GPU stays unhealthy."""
        if not 0 <= index < self.count:
            raise ValueError(f"no GPU {index} on this simulated host ({self.count} GPUs)")
        if kind not in FAULT_KINDS:
            raise ValueError(f"fault kind must be one of {FAULT_KINDS}, not {kind!r}")
        fault = GpuFault(index=index, kind=kind, code=code, message=message, ts=time.time())
        with self._lock:
            self._health.record(fault)
            self._pending.append(fault)
        return fault

    def poll_faults(self) -> list[GpuFault]:
        with self._lock:
            faults, self._pending = self._pending, []
            if self._fault_file is not None:
                faults += [f for f in self._fault_file.read_new() if self._health.record(f)]
        return faults

    def clear_faults(self, indices: Collection[int]) -> list[int]:
        with self._lock:
            return self._health.clear(indices)

    def close(self) -> None:
        return None


# ---------------------------------------------------------------- NVML

T = TypeVar("T")


class NvmlUnavailable(Exception):
    """NVML could not be initialised on this host (no library, no driver, no GPU access)."""


class NvmlBackend:
    """Real GPUs through NVML. Construction raises NvmlUnavailable if NVML cannot start.

    `nvml` is the pynvml module (injectable for tests). A GPU whose handle cannot be
    obtained is still listed (model "UNKNOWN") and reported unhealthy. Its calls block
    (`blocking`): the agent makes them on its GPU watch's thread (`agent.gpuwatch`).
    """

    simulated = False
    blocking = True

    def __init__(self, fault_file: str | None = None, nvml: ModuleType | Any | None = None) -> None:
        if nvml is None:
            try:
                import pynvml
            except ImportError as exc:
                raise NvmlUnavailable(f"nvidia-ml-py is not installed: {exc}") from exc
            nvml = pynvml
        self._nv: Any = nvml
        self._lock = threading.Lock()
        self._logged: set[str] = set()
        self._closed = False
        self._memory_v2 = hasattr(nvml, "nvmlMemory_v2")  # the library has version 2
        self._memory_v1_only: set[int] = set()  # GPUs whose driver answered version 2 with an error
        self._ecc_unsupported: set[int] = set()  # GPUs whose ECC counters NVML does not offer
        self._wait_failures = 0  # event waits failed other than by timing out
        self._minors: dict[int, int] | None = None  # device_minors(), read once
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(f"nvmlInit failed: {exc}") from exc
        try:
            count = min(int(nvml.nvmlDeviceGetCount()), MAX_GPUS)
        except nvml.NVMLError as exc:
            self._shutdown()
            raise NvmlUnavailable(f"nvmlDeviceGetCount failed: {exc}") from exc
        self._handles: list[Any | None] = []
        self._inventory: list[GpuInfo] = []
        self._health = _Health(count)
        self._pending: list[GpuFault] = []
        for i in range(count):
            handle = self._try(f"handle{i}", nvml.nvmlDeviceGetHandleByIndex, i, gpu=i)
            self._handles.append(handle)
            self._inventory.append(self._describe(i, handle))
            if handle is None:
                self._raise_fault(i, "xid", 79, "NVML cannot open this GPU")
        self._ecc_baseline: dict[int, int] = {}
        for i, handle in enumerate(self._handles):
            total = self._ecc_total(i, handle)
            if total is not None:
                self._ecc_baseline[i] = total
        self._events = self._register_events()
        path = fault_file if fault_file is not None else os.environ.get(FAULT_FILE_ENV)
        self._fault_file = FaultFile(path) if path else None

    # -- guarded calls

    def _try(self, what: str, fn: Callable[..., T], *args: Any, gpu: int | None = None) -> T | None:
        """Call an NVML function; on NVMLError log once per `what` and return None.

        An error saying the GPU is lost also raises a fault on `gpu`.
        """
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            if what not in self._logged:
                self._logged.add(what)
                log.warning("NVML %s failed: %s", what, exc)
            if gpu is not None:
                self._fault_if_lost(gpu, exc)
            return None

    def _fault_if_lost(self, gpu: int, exc: Exception) -> bool:
        """Raise a fault on `gpu` when `exc` says NVML lost it, or that it needs a reset
        before it is usable again; whether it did."""
        value = getattr(exc, "value", None)
        for name, default, what in _LOST_ERRORS:
            if value is not None and value == getattr(self._nv, name, default):
                self._raise_fault(gpu, "xid", 79, f"NVML reports the GPU {what}")
                return True
        return False

    def _raise_fault(self, index: int, kind: str, code: int, message: str) -> None:
        """Queue a fault for poll_faults() unless this GPU already has one."""
        if index in self._health.fault_text:
            return
        fault = GpuFault(index=index, kind=kind, code=code, message=message, ts=time.time())
        self._health.record(fault)
        self._pending.append(fault)

    # -- inventory

    def _describe(self, i: int, handle: Any | None) -> GpuInfo:
        nv = self._nv
        if handle is None:
            return GpuInfo(index=i, model="UNKNOWN", memory_mb=0)
        name = self._try(f"name{i}", nv.nvmlDeviceGetName, handle, gpu=i)
        mem = self._try(f"memory{i}", nv.nvmlDeviceGetMemoryInfo, handle, gpu=i)
        raw_uuid = self._try(f"uuid{i}", nv.nvmlDeviceGetUUID, handle, gpu=i)
        if isinstance(raw_uuid, bytes):
            raw_uuid = raw_uuid.decode("ascii", "replace")
        mig_mode = self._mig_mode(i, handle)
        return GpuInfo(
            index=i,
            model=normalise_model(name) if name is not None else "UNKNOWN",
            memory_mb=int(mem.total) // (1024 * 1024) if mem is not None else 0,
            uuid=(raw_uuid or "")[:96],
            mig=self._mig_instances(i, handle) if mig_mode else [],
            mig_mode=mig_mode,
        )

    def _mig_mode(self, i: int, handle: Any) -> bool:
        """Whether GPU `i` is in MIG mode now (CUDA cannot use it whole then, whatever
        instances it has)."""
        nv = self._nv
        if not hasattr(nv, "nvmlDeviceGetMigMode"):
            return False
        mode = self._try(f"migMode{i}", nv.nvmlDeviceGetMigMode, handle)
        return mode is not None and bool(mode) and mode[0] == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1)

    def _mig_instances(self, i: int, handle: Any) -> list[MigInstance]:
        """The MIG instances of GPU `i`, in MIG mode, as NVML reports them. The agent only
        reads MIG state; it never changes a GPU's MIG mode."""
        nv = self._nv
        slots = self._try(f"migCount{i}", nv.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        out: list[MigInstance] = []
        parts: list[str] = []  # compute instances, not reported
        for j in range(min(int(slots), MAX_MIG_PER_GPU + 1)):
            try:  # an empty slot raises NOT_FOUND: not an error
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
            except nv.NVMLError:
                continue
            name = self._try(f"migName{i}.{j}", nv.nvmlDeviceGetName, mh)
            raw_uuid = self._try(f"migUuid{i}.{j}", nv.nvmlDeviceGetUUID, mh)
            mem = self._try(f"migMemory{i}.{j}", nv.nvmlDeviceGetMemoryInfo, mh)
            if isinstance(raw_uuid, bytes):
                raw_uuid = raw_uuid.decode("ascii", "replace")
            profile = mig_profile_of(name) if name is not None else None
            if profile is not None and is_compute_instance(profile):
                # A slice of a GPU instance shared with its other compute instances (and its
                # memory with them): the scheduler places whole GPU instances only, and a job
                # asking for the GPU instance's profile must not get a slice of it.
                parts.append(f"{j} ({profile})")
                continue
            if not raw_uuid or profile is None or not _MIG_PROFILE_RE.fullmatch(profile) \
                    or len(out) >= MAX_MIG_PER_GPU:
                log.warning("GPU %d: MIG device %d not reported (name %r, uuid %r)", i, j, name, raw_uuid)
                continue
            out.append(MigInstance(uuid=raw_uuid[:96], profile=profile,
                                   memory_mb=int(mem.total) // (1024 * 1024) if mem is not None else 0))
        if parts:
            log.warning("GPU %d: MIG devices %s are compute instances sharing a GPU instance: not reported "
                        "(only whole GPU instances are scheduled)", i, ", ".join(parts))
        return out

    def inventory(self) -> list[GpuInfo]:
        return [g.model_copy() for g in self._inventory]

    def device_minors(self) -> dict[int, int]:
        """GPU index -> N of its /dev/nvidiaN (NVIDIA does not promise N is the NVML index).
        A GPU whose minor number cannot be read is left out (its index is taken for N) and
        said once in the log."""
        with self._lock:
            if self._minors is None:
                self._minors = {}
                read = getattr(self._nv, "nvmlDeviceGetMinorNumber", None)
                for i, handle in enumerate(self._handles):
                    minor = self._try(f"minor{i}", read, handle) if read is not None and handle is not None \
                        else None
                    if minor is None:
                        log.warning("GPU %d: its device file's minor number is unknown: /dev/nvidia%d assumed", i, i)
                    else:
                        self._minors[i] = int(minor)
            return dict(self._minors)

    # -- usage

    def usage(self) -> list[GpuUsage]:
        nv = self._nv
        out: list[GpuUsage] = []
        with self._lock:
            if self._closed:
                return []
            for i, handle in enumerate(self._handles):
                # A figure NVML does not give (it refuses utilisation for a GPU in MIG mode;
                # a call fails; the GPU could not be opened: all four) is marked unread, its
                # 0 not a reading.
                entry = GpuUsage(index=i, unread=list(GPU_FIGURES))
                if handle is not None:
                    unread: list[GpuFigure] = []
                    rates = self._try(f"utilization{i}", nv.nvmlDeviceGetUtilizationRates, handle, gpu=i)
                    if rates is not None:
                        entry.util_pct = float(rates.gpu)
                    else:
                        unread.append("util")
                    used = self._memory_used(i, handle)
                    if used is not None:
                        entry.mem_used_mb = used // (1024 * 1024)
                    else:
                        unread.append("memory")
                    temp = self._try(
                        f"temperature{i}", nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU, gpu=i
                    )
                    if temp is not None:
                        entry.temp_c = float(temp)
                    else:
                        unread.append("temperature")
                    milliwatts = self._try(f"power{i}", nv.nvmlDeviceGetPowerUsage, handle, gpu=i)
                    if milliwatts is not None:
                        entry.power_w = round(float(milliwatts) / 1000.0, 1)
                    else:
                        unread.append("power")
                    entry.unread = unread
                out.append(self._health.apply(entry))
        return out

    def _memory_used(self, i: int, handle: Any) -> int | None:
        """Bytes of GPU memory in use, as nvidia-smi counts them: NVML's version 2 figure,
        without the memory the driver reserves (version 1's `used` includes it: 615 MB on
        an idle H200). Falls back to version 1 where the library lacks version 2 (for every
        GPU) or the driver refuses it for a GPU (for that GPU: a host may mix GPUs)."""
        nv = self._nv
        if self._memory_v2 and i not in self._memory_v1_only:
            try:
                return int(nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2).used)
            except TypeError:  # a pynvml without the version argument
                self._memory_v2 = False
            except nv.NVMLError as exc:
                if self._fault_if_lost(i, exc):
                    return None
                log.info("NVML memory info version 2 unavailable for GPU %d (%s): reading version 1", i, exc)
                self._memory_v1_only.add(i)
        mem = self._try(f"memory{i}", nv.nvmlDeviceGetMemoryInfo, handle, gpu=i)
        return int(mem.used) if mem is not None else None

    # -- faults

    def _register_events(self) -> Any | None:
        """Create an event set for Xid and double-bit ECC events where supported."""
        nv = self._nv
        if not hasattr(nv, "nvmlEventSetCreate"):
            return None
        event_set = self._try("eventSetCreate", nv.nvmlEventSetCreate)
        if event_set is None:
            return None
        wanted = nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError
        registered = 0
        for i, handle in enumerate(self._handles):
            if handle is None:
                continue
            supported = self._try(f"supportedEvents{i}", nv.nvmlDeviceGetSupportedEventTypes, handle)
            mask = wanted & int(supported) if supported is not None else 0
            if mask and self._try(f"registerEvents{i}", self._register, handle, mask, event_set) is not None:
                registered += 1
        if not registered:
            self._try("eventSetFree", nv.nvmlEventSetFree, event_set)
            return None
        return event_set

    def _register(self, handle: Any, mask: int, event_set: Any) -> bool:
        self._nv.nvmlDeviceRegisterEvents(handle, mask, event_set)
        return True

    def _event_index(self, device: Any) -> int | None:
        """The index of an event's device: by NVML index, else by handle identity."""
        index = self._try("eventDeviceIndex", self._nv.nvmlDeviceGetIndex, device)
        if index is not None:
            return int(index)
        for i, handle in enumerate(self._handles):
            if handle is device:
                return i
        return 0 if len(self._handles) == 1 else None

    def _drain_events(self) -> None:
        """Read every waiting event without blocking (timeout 0)."""
        nv = self._nv
        if self._events is None:
            return
        for _ in range(256):
            try:
                data = nv.nvmlEventSetWait(self._events, 0)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) != nv.NVML_ERROR_TIMEOUT:
                    # No GPU is marked for it (the GPUs may be fine), but while it lasts no Xid
                    # is seen: said again every so often, not once for good.
                    if self._wait_failures % EVENT_WAIT_LOG_EVERY == 0:
                        log.warning("NVML event wait failed (failure %d): %s: Xid and ECC events are not "
                                    "seen meanwhile", self._wait_failures + 1, exc)
                    self._wait_failures += 1
                return
            index = self._event_index(data.device)
            if index is None:
                log.warning("NVML event 0x%x for an unknown device dropped", int(data.eventType))
                continue
            if int(data.eventType) & nv.nvmlEventTypeDoubleBitEccError:
                total = self._ecc_total(index, self._handles[index])
                if total is not None:
                    self._ecc_baseline[index] = total
                self._raise_fault(index, "ecc_uncorrectable", int(total or 1), "double-bit ECC error")
            elif int(data.eventType) & nv.nvmlEventTypeXidCriticalError:
                xid = int(data.eventData)
                if is_critical_xid(xid):
                    self._raise_fault(index, "xid", xid, f"NVML critical Xid {xid}")
                else:
                    log.info("GPU %d: application Xid %d (not a hardware fault)", index, xid)

    def _ecc_total(self, i: int, handle: Any | None) -> int | None:
        """GPU `i`'s uncorrected ECC errors, or None. Only NOT_SUPPORTED stops the asking
        (no ECC, or ECC off); any other error is asked again next time (logged once a kind)."""
        nv = self._nv
        if handle is None or i in self._ecc_unsupported:
            return None
        try:
            total = nv.nvmlDeviceGetTotalEccErrors(handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                   nv.NVML_VOLATILE_ECC)
        except nv.NVMLError as exc:
            value = getattr(exc, "value", None)
            if value == getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3):
                self._ecc_unsupported.add(i)
            key = f"ecc{i}:{value}"
            if key not in self._logged:
                self._logged.add(key)
                log.warning("NVML ecc%d failed: %s%s", i, exc,
                            " (not asked again)" if i in self._ecc_unsupported else "")
            self._fault_if_lost(i, exc)
            return None
        return int(total)

    def _check_ecc_counters(self) -> None:
        for i, handle in enumerate(self._handles):
            total = self._ecc_total(i, handle)
            if total is not None and i not in self._ecc_baseline:
                self._ecc_baseline[i] = total  # the first count read (the one at the start failed)
            elif total is not None and total > self._ecc_baseline[i]:
                new = total - self._ecc_baseline[i]
                self._ecc_baseline[i] = total
                self._raise_fault(i, "ecc_uncorrectable", total, f"{new} new uncorrectable ECC errors")

    def poll_faults(self) -> list[GpuFault]:
        with self._lock:
            if self._closed:
                return []
            self._drain_events()
            self._check_ecc_counters()
            faults, self._pending = self._pending, []
            if self._fault_file is not None:
                faults += [f for f in self._fault_file.read_new() if self._health.record(f)]
        return faults

    def clear_faults(self, indices: Collection[int]) -> list[int]:
        """The ECC baselines stay where they are: only errors counted after the clear
        are a new fault. A GPU still unreachable is marked again at the next read."""
        with self._lock:
            return self._health.clear(indices)

    def _shutdown(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except self._nv.NVMLError as exc:
            log.debug("nvmlShutdown failed: %s", exc)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._events is not None:
                self._try("eventSetFree", self._nv.nvmlEventSetFree, self._events)
                self._events = None
            self._shutdown()


# ---------------------------------------------------------------- CUDA MPS

MPS_PIPE_DEFAULT = "/tmp/nvidia-mps"


def mps_running(env: dict[str, str] | None = None) -> bool:
    """Whether a CUDA MPS control daemon serves this host: its control pipe exists in
    CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps). The agent never starts MPS."""
    pipe_dir = (env if env is not None else os.environ).get("CUDA_MPS_PIPE_DIRECTORY") or MPS_PIPE_DEFAULT
    return os.path.exists(os.path.join(pipe_dir, "control"))


def mps_reached(gpu_share: int, uses_gpu: bool, env: dict[str, str] | None = None) -> bool:
    """Whether a task's CUDA calls reach the host's MPS daemon: a GPU share where MPS runs
    (it is told the daemon's pipe directory), or any task using a GPU where MPS runs at the
    default directory (its clean environment finds that one). Such tasks run as one uid:
    an MPS server serves one uid at a time, and tasks of another wait for it to end."""
    if not uses_gpu or not mps_running(env):
        return False
    return bool(gpu_share) or not (env if env is not None else os.environ).get("CUDA_MPS_PIPE_DIRECTORY")


# ---------------------------------------------------------------- selection

_warned_no_nvml = False


def open_backend(simulate: str | None, fault_file: str | None = None) -> GpuBackend:
    """The backend for this host: simulated if a spec is given, else NVML, else empty.

    A bad spec raises ConfigError. Without a usable NVML, returns an EmptyBackend and
    logs a warning (once per process).
    """
    global _warned_no_nvml
    if simulate is not None:
        return SimulatedBackend(simulate, fault_file=fault_file)
    try:
        return NvmlBackend(fault_file=fault_file)
    except NvmlUnavailable as exc:
        if not _warned_no_nvml:
            _warned_no_nvml = True
            log.warning("no NVIDIA GPUs available (%s); reporting zero GPUs", exc)
        return EmptyBackend()
