"""Control groups for task attempts: one cgroup per attempt, created by the agent under
its own cgroup, with the attempt's CPU, memory and pids limits and (cgroup v1) its GPU
device access, killed as a whole when the attempt is stopped.

Two kinds of host:

- **cgroup v2** (one unified hierarchy, `cgroup2` mount): a directory per attempt under
  `<agent's cgroup>/muster-<host>/`, with `cpu.max`, `memory.max` (no swap,
  `memory.oom.group`), `pids.max` where those controllers are available to the agent, and
  `cgroup.kill` (or freeze, kill, thaw) to end everything in it. Device access is limited
  the way cgroup v2 does it, with a BPF program (`BPF_PROG_TYPE_CGROUP_DEVICE`, attached
  with `BPF_F_ALLOW_MULTI` so that programs above it, systemd's, still apply) refusing
  the GPUs the attempt was not given; where the kernel refuses to load one (no
  `CAP_BPF`/`CAP_SYS_ADMIN`, no BPF cgroup support) devices are not limited, and the
  host says so.
- **cgroup v1** (a mount per controller): a directory per attempt in each of the `cpu`,
  `memory`, `pids`, `devices` and `freezer` hierarchies that are mounted and writable,
  with `cpu.cfs_quota_us`, `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes`),
  `pids.max` and `devices.deny` for the GPUs the attempt was not given; the freezer
  makes the kill atomic (freeze, SIGKILL every process, thaw).

A host with both (a v2 `unified` hierarchy beside v1 controllers) uses the one that has
the memory controller. `detect()` says which one the agent can use, or why none.

Standard library only, and no import of the rest of Muster: the agent's watchdog
(agent/watchdog.py, run with `python -I -S`) loads this file by its path to kill the
cgroups of the attempts it stops (`kill_paths`).
"""

from __future__ import annotations

import errno
import math
import os
import platform
import signal
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

CGROUP_FS = "/sys/fs/cgroup"
V1_CONTROLLERS = ("cpu", "memory", "pids", "devices", "freezer")
V2_CONTROLLERS = ("cpu", "memory", "pids")
CPU_PERIOD_US = 100_000
MIN_CPU_QUOTA_US = 1_000  # the kernel's least quota
MAX_CPU_PERIOD_US = 1_000_000  # the kernel's longest period


def cpu_quota(cpus: float) -> tuple[int, int]:
    """The CFS quota and period (µs) that hold a task to `cpus` cores (0, 0: no limit).
    Under 0.01 core the quota would be below the kernel's least, so the period is made
    longer, up to a second (found by exploring: 0.001 core got 1 % of one)."""
    if cpus <= 0:
        return 0, 0
    period = CPU_PERIOD_US
    if cpus * period < MIN_CPU_QUOTA_US:
        period = min(MAX_CPU_PERIOD_US, math.ceil(MIN_CPU_QUOTA_US / cpus))
    return max(MIN_CPU_QUOTA_US, int(cpus * period)), period
MB = 1024 * 1024


class CgroupError(OSError):
    """A cgroup could not be created, limited, joined or removed."""


@dataclass(frozen=True)
class Limits:
    """What one attempt may use (0: no limit)."""

    cpus: float = 0.0
    memory_mb: int = 0
    pids: int = 0
    # Character devices the attempt may not open: (major, minor).
    deny_devices: tuple[tuple[int, int], ...] = ()


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _pids(directory: str) -> list[int]:
    try:
        return [int(x) for x in _read(os.path.join(directory, "cgroup.procs")).split()]
    except (OSError, ValueError):
        return []


def _counter(path: str, key: str) -> int:
    """`key N` from a flat keyed file such as memory.events (0 when absent)."""
    try:
        for line in _read(path).splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        pass
    return 0


# ---------------------------------------------------------------- killing (also the watchdog's)


def signal_paths(paths: Iterable[str], sig: int) -> int:
    """Send `sig` to every process in the cgroups `paths`; how many were signalled."""
    n = 0
    for pid in {p for d in paths for p in _pids(d)}:
        try:
            os.kill(pid, sig)
            n += 1
        except OSError:
            pass
    return n


def signal_attempt(paths: Iterable[str], group: int, sig: int) -> None:
    """`sig` to every process of one attempt, once each: the processes in its cgroups
    (every descendant), or, when those hold none, its process group `group`. SIGKILL,
    SIGSTOP and SIGCONT (which no handler sees twice) go to both. The agent's stop,
    freeze and thaw and the watchdog's stop all send signals this way. Raises
    PermissionError (from `killpg`)."""
    if signal_paths(paths, sig) and sig not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT):
        return
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        pass


def freezer_file(paths: Iterable[str]) -> tuple[str, str, str] | None:
    """The attempt's freezer, if it has one: (file, frozen value, thawed value); v1
    `freezer.state`, v2 `cgroup.freeze`."""
    for d in paths:
        if os.path.exists(os.path.join(d, "freezer.state")):
            return os.path.join(d, "freezer.state"), "FROZEN", "THAWED"
        if os.path.exists(os.path.join(d, "cgroup.freeze")):
            return os.path.join(d, "cgroup.freeze"), "1", "0"
    return None


def set_frozen(paths: Iterable[str], frozen: bool) -> bool:
    """Freeze (or thaw) the attempt's cgroup with the kernel's freezer: a frozen process
    runs nothing whoever signals it (a SIGCONT from a process of the same user included),
    and every process forked into the cgroup is frozen too. False when the attempt has no
    freezer, or it could not be written."""
    found = freezer_file(paths)
    if found is None:
        return False
    path, on, off = found
    try:
        _write(path, on if frozen else off)
    except OSError:
        return False
    return True


def attempt_cgroups(paths: Iterable[str], base_names: Iterable[str], found: list[Mount] | None = None,
                    bases: Iterable[str] | None = None) -> tuple[list[str], list[str]]:
    """(the attempt cgroups among `paths`, the others): an attempt cgroup is a directory
    right under a base named as one of `base_names`, on a cgroup mount, and, given the
    `bases` themselves (the watchdog is given its agent's), under one of them: not another
    directory of that name elsewhere in the hierarchy. What a run record names is killed
    only when it is one (a record is a file: a cgroup it names must not be any cgroup of
    the machine)."""
    names = set(base_names)
    within = None if bases is None else {os.path.normpath(b) for b in bases}
    points = [m.point.rstrip("/") + "/" for m in (mounts() if found is None else found)
              if m.fstype in ("cgroup", "cgroup2")]
    ours: list[str] = []
    others: list[str] = []
    for path in paths:
        p = os.path.normpath(path)
        attempt = (os.path.isabs(p) and os.path.basename(os.path.dirname(p)) in names
                   and any(p.startswith(m) for m in points)
                   and (within is None or os.path.dirname(p) in within))
        (ours if attempt else others).append(path)
    return ours, others


def populated(paths: Iterable[str]) -> bool:
    return any(_pids(d) for d in paths)


def kill_paths(paths: list[str], wait_s: float = 5.0) -> bool:
    """SIGKILL every process in the cgroups `paths` (one attempt's: its v2 directory, or
    its directories in the v1 hierarchies), including those forked meanwhile; True once
    none is left, False if some are still there after `wait_s` seconds."""
    existing = [d for d in paths if os.path.isdir(d)]
    if not existing:
        return True
    killed = False
    for d in existing:
        if os.path.exists(os.path.join(d, "cgroup.kill")):  # v2, Linux 5.14+: atomic
            try:
                _write(os.path.join(d, "cgroup.kill"), "1")
                killed = True
            except OSError:
                pass
    if not killed:
        freezer = next((d for d in existing if os.path.exists(os.path.join(d, "freezer.state"))), None)
        if freezer is not None:
            _freeze_and_kill(freezer, existing)
        elif any(os.path.exists(os.path.join(d, "cgroup.freeze")) for d in existing):
            d2 = next(d for d in existing if os.path.exists(os.path.join(d, "cgroup.freeze")))
            try:
                _write(os.path.join(d2, "cgroup.freeze"), "1")
                signal_paths(existing, signal.SIGKILL)  # v2 kills frozen tasks
            finally:
                try:
                    _write(os.path.join(d2, "cgroup.freeze"), "0")
                except OSError:
                    pass
    deadline = time.monotonic() + wait_s
    while True:
        # Without a freezer a process may fork between the listing and the kill: go on
        # until the listing is empty.
        signal_paths(existing, signal.SIGKILL)
        if not populated(existing):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _freeze_and_kill(freezer: str, paths: list[str]) -> None:
    state = os.path.join(freezer, "freezer.state")
    try:
        _write(state, "FROZEN")
        deadline = time.monotonic() + 2.0
        while _read(state).strip() != "FROZEN" and time.monotonic() < deadline:
            time.sleep(0.005)
        signal_paths(paths, signal.SIGKILL)  # v1: frozen tasks die once thawed
    except OSError:
        pass
    finally:
        try:
            _write(state, "THAWED")
        except OSError:
            pass


def remove_paths(paths: Iterable[str]) -> bool:
    """rmdir each cgroup (their processes must be gone); True when all are gone."""
    ok = True
    for d in paths:
        try:
            os.rmdir(d)
        except FileNotFoundError:
            pass
        except OSError:
            ok = False
    return ok


# ---------------------------------------------------------------- one attempt's cgroup


@dataclass
class Group:
    """One attempt's cgroup: a directory (v2) or one per controller (v1)."""

    name: str
    version: int
    paths: list[str]
    memory: str | None = None  # the directory whose memory counters tell an OOM kill

    def procs_files(self) -> list[str]:
        """What the attempt's first process writes its pid to (agent.launch)."""
        return [os.path.join(d, "cgroup.procs") for d in self.paths]

    def pids(self) -> list[int]:
        return sorted({p for d in self.paths for p in _pids(d)})

    def kill(self, wait_s: float = 5.0) -> bool:
        return kill_paths(self.paths, wait_s)

    def oom_kills(self) -> int:
        """Processes the kernel killed for going over the memory limit."""
        if self.memory is None:
            return 0
        if self.version == 2:
            return _counter(os.path.join(self.memory, "memory.events"), "oom_kill")
        return _counter(os.path.join(self.memory, "memory.oom_control"), "oom_kill")

    def reached_limit(self) -> bool:
        """Whether the group's memory use ever reached its own limit: its count of hitting
        it (v2 memory.events `max`, v1 `failcnt`), or its peak at it (some kernels count
        no hit: found here). An OOM kill in a group that never did came from an enclosing
        group's limit or the host's memory running out. True when it cannot be told."""
        if self.memory is None:
            return True
        if self.version == 2:
            if _counter(os.path.join(self.memory, "memory.events"), "max") > 0:
                return True
            try:  # (memory.peak: kernels from 5.19; without it, it cannot be told apart)
                peak = int(_read(os.path.join(self.memory, "memory.peak")).strip())
                limit = _read(os.path.join(self.memory, "memory.max")).strip()
                return limit == "max" or peak >= int(limit) - MB
            except (OSError, ValueError):
                return True
        for kind in ("memory", "memory.memsw"):  # (memory, and memory with swap)
            try:
                if int(_read(os.path.join(self.memory, f"{kind}.failcnt")).strip() or 0) > 0:
                    return True
                # (Some kernels count no failure at the limit: the peak tells.)
                peak = int(_read(os.path.join(self.memory, f"{kind}.max_usage_in_bytes")).strip())
                if peak >= int(_read(os.path.join(self.memory, f"{kind}.limit_in_bytes")).strip()) - MB:
                    return True
            except FileNotFoundError:
                continue
            except (OSError, ValueError):
                return True
        return False

    def remove(self, wait_s: float = 2.0) -> bool:
        """Remove the (empty) cgroup; the kernel may take a moment after the last exit."""
        deadline = time.monotonic() + wait_s
        while not remove_paths(self.paths):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True


# ---------------------------------------------------------------- hierarchies


@dataclass
class Hierarchy:
    """Where this agent makes its attempts' cgroups, and which limits it can set."""

    version: int
    # v2: {"": <base dir>}; v1: controller -> <base dir> in that controller's hierarchy.
    bases: dict[str, str]
    controllers: tuple[str, ...]
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        what = ", ".join(self.controllers) if self.controllers else "no resource controllers"
        return f"cgroup v{self.version} ({what})"

    def cap_pids(self, most: int) -> None:
        """At most `most` processes and threads in all the attempts together (the base's
        `pids.max`): a few fork bombs, each within its own attempt's limit, cannot take every
        process id of the host, the agent's and the system's included."""
        base = self.bases.get("pids" if self.version == 1 else "")
        if "pids" not in self.controllers or base is None or most <= 0:
            return
        try:
            _write(os.path.join(base, "pids.max"), str(most))
        except OSError as exc:
            self.notes.append(f"cannot limit the attempts' processes together: {exc}")

    def limits_missing(self) -> list[str]:
        """The controllers this host lacks for full isolation (devices: on v2, BPF)."""
        return [c for c in ("cpu", "memory", "pids", "devices") if c not in self.controllers]

    def create(self, name: str, limits: Limits) -> Group:
        """The cgroup for attempt `name`, limits applied. Raises CgroupError."""
        paths = [os.path.join(base, name) for base in self.bases.values()]
        try:
            for d in paths:
                os.makedirs(d, exist_ok=True)
        except OSError as exc:
            remove_paths(paths)
            raise CgroupError(f"cannot create cgroup {name}: {exc}") from exc
        if self.version == 2:
            group = Group(name, 2, paths, paths[0] if "memory" in self.controllers else None)
        else:
            mem = self.bases.get("memory")
            group = Group(name, 1, paths, os.path.join(mem, name) if mem else None)
        try:
            self._limit(group, limits)
        except OSError as exc:
            remove_paths(paths)
            raise CgroupError(f"cannot set the limits of cgroup {name}: {exc}") from exc
        return group

    def _limit(self, group: Group, limits: Limits) -> None:
        quota, period = cpu_quota(limits.cpus)
        if self.version == 2:
            d = group.paths[0]
            if quota and "cpu" in self.controllers:
                _write(os.path.join(d, "cpu.max"), f"{quota} {period}")
            if limits.memory_mb > 0 and "memory" in self.controllers:
                _write(os.path.join(d, "memory.max"), str(limits.memory_mb * MB))
                if os.path.exists(os.path.join(d, "memory.swap.max")):
                    _write(os.path.join(d, "memory.swap.max"), "0")
                _write(os.path.join(d, "memory.oom.group"), "1")
            if limits.pids > 0 and "pids" in self.controllers:
                _write(os.path.join(d, "pids.max"), str(limits.pids))
            if limits.deny_devices and "devices" in self.controllers:
                attach_device_program(d, limits.deny_devices)
            return
        at = {c: os.path.join(base, group.name) for c, base in self.bases.items()}
        if quota and "cpu" in at:
            _write(os.path.join(at["cpu"], "cpu.cfs_period_us"), str(period))
            _write(os.path.join(at["cpu"], "cpu.cfs_quota_us"), str(quota))
        if limits.memory_mb > 0 and "memory" in at:
            _write(os.path.join(at["memory"], "memory.limit_in_bytes"), str(limits.memory_mb * MB))
            memsw = os.path.join(at["memory"], "memory.memsw.limit_in_bytes")
            if os.path.exists(memsw):  # no swap beyond the limit
                _write(memsw, str(limits.memory_mb * MB))
        if limits.pids > 0 and "pids" in at:
            _write(os.path.join(at["pids"], "pids.max"), str(limits.pids))
        if limits.deny_devices and "devices" in at:
            for major, minor in limits.deny_devices:
                _write(os.path.join(at["devices"], "devices.deny"), f"c {major}:{minor} rwm")

    def leftovers(self) -> list[Group]:
        """Attempt cgroups left under the bases (by an agent that was killed)."""
        names: set[str] = set()
        for base in self.bases.values():
            try:
                names.update(e.name for e in os.scandir(base) if e.is_dir())
            except OSError:
                pass
        out = []
        for name in sorted(names):
            paths = [os.path.join(b, name) for b in self.bases.values() if os.path.isdir(os.path.join(b, name))]
            out.append(Group(name, self.version, paths))
        return out


# ---------------------------------------------------------------- finding the hierarchies


@dataclass(frozen=True)
class Mount:
    point: str
    root: str  # the part of the hierarchy mounted there
    fstype: str  # cgroup or cgroup2
    options: frozenset[str]


def mounts(mountinfo: str = "/proc/self/mountinfo") -> list[Mount]:
    out: list[Mount] = []
    try:
        text = _read(mountinfo)
    except OSError:
        return out
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3 or rest[0] not in ("cgroup", "cgroup2"):
            continue
        out.append(Mount(_unescape(fields[4]), _unescape(fields[3]), rest[0], frozenset(rest[2].split(","))))
    return out


def _unescape(path: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        path = path.replace(code, ch)
    return path


def own_cgroups(proc_cgroup: str = "/proc/self/cgroup") -> dict[str, str]:
    """controller (or "" for v2) -> this process's cgroup path in that hierarchy."""
    out: dict[str, str] = {}
    try:
        text = _read(proc_cgroup)
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            out[""] = path
        for c in controllers.split(","):
            if c:
                out[c] = path
    return out


def under(mount: Mount, path: str) -> str:
    """The directory of cgroup `path` under `mount`."""
    rel = path
    if mount.root != "/" and (path == mount.root or path.startswith(mount.root + "/")):
        rel = path[len(mount.root):]
    return os.path.join(mount.point, rel.lstrip("/"))


def _try_base(base: str) -> str | None:
    """Make the base directory; None when it cannot be made (no permission)."""
    try:
        os.makedirs(base, exist_ok=True)
        return base if os.access(base, os.W_OK) else None
    except OSError:
        return None


def detect_v2(base_name: str, found: list[Mount] | None = None,
              own: dict[str, str] | None = None) -> tuple[Hierarchy | None, str]:
    """The v2 hierarchy, with the controllers that can be enabled for attempts, or why not."""
    found = mounts() if found is None else found
    own = own_cgroups() if own is None else own
    v2 = next((m for m in found if m.fstype == "cgroup2"), None)
    if v2 is None or "" not in own:
        return None, "no cgroup v2 hierarchy"
    mine = under(v2, own[""])
    base = _try_base(os.path.join(mine, base_name))
    if base is None:
        return None, f"cgroup v2 at {mine} is not writable by the agent"
    try:
        available = set(_read(os.path.join(mine, "cgroup.controllers")).split())
    except OSError:
        available = set()
    wanted = [c for c in V2_CONTROLLERS if c in available]
    notes: list[str] = []
    if wanted and own[""] != "/" and _pids(mine) == [os.getpid()]:
        # cgroup v2 enables controllers for children only in a cgroup without processes
        # of its own: the agent (alone in its cgroup, e.g. a systemd service with
        # Delegate=yes) moves into a leaf beside its attempts' base.
        leaf = os.path.join(mine, f"{base_name}.agent")
        try:
            os.makedirs(leaf, exist_ok=True)
            _write(os.path.join(leaf, "cgroup.procs"), str(os.getpid()))
        except OSError as exc:
            notes.append(f"cannot move the agent into {leaf}: {exc}")
    enabled = _enable(mine, wanted, notes) and _enable(base, wanted, notes)
    controllers = tuple(wanted) if enabled else ()
    if not enabled:
        notes.append(f"cgroup v2 controllers {', '.join(wanted)} cannot be enabled under {mine}")
    why = _probe_device_program(base)
    if why:
        notes.append(f"GPU device files not limited: {why}")
    else:
        controllers += ("devices",)
    return Hierarchy(2, {"": base}, controllers, notes), ""


# ---------------------------------------------------------------- cgroup v2 device access (BPF)

_BPF_SYSCALL = {"x86_64": 321, "aarch64": 280}  # bpf(2)'s number
BPF_PROG_LOAD, BPF_PROG_ATTACH = 5, 8
BPF_PROG_TYPE_CGROUP_DEVICE, BPF_CGROUP_DEVICE = 15, 6
BPF_F_ALLOW_MULTI = 2
BPF_DEVCG_DEV_CHAR = 2


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def device_program(deny: Iterable[tuple[int, int]]) -> bytes:
    """A `BPF_PROG_TYPE_CGROUP_DEVICE` program: 0 (refused) for any access to one of the
    character devices `deny` (major, minor), 1 (allowed) for everything else. Its context
    is `struct bpf_cgroup_dev_ctx {u32 access_type; u32 major; u32 minor;}`, the device
    type in the low 16 bits of `access_type`."""
    ldx_w, and_k, jne_k, mov_k, exit_ = 0x61, 0x57, 0x55, 0xB7, 0x95
    p = [_insn(ldx_w, 2, 1, 0), _insn(and_k, 2, imm=0xFFFF), _insn(ldx_w, 3, 1, 4), _insn(ldx_w, 4, 1, 8)]
    for major, minor in deny:
        p += [_insn(jne_k, 2, off=4, imm=BPF_DEVCG_DEV_CHAR), _insn(jne_k, 3, off=3, imm=major),
              _insn(jne_k, 4, off=2, imm=minor), _insn(mov_k, 0, imm=0), _insn(exit_)]
    p += [_insn(mov_k, 0, imm=1), _insn(exit_)]
    return b"".join(p)


def attach_device_program(directory: str, deny: Iterable[tuple[int, int]]) -> None:
    """Load `device_program(deny)` and attach it to the cgroup v2 `directory`, before any
    process joins it. The attachment keeps the program; it goes with the cgroup. Raises
    OSError."""
    import ctypes  # here, not at the top: the watchdog loads this file and never needs it

    nr = _BPF_SYSCALL.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"bpf(2) not known on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    prog = device_program(deny)
    insns = ctypes.create_string_buffer(prog, len(prog))
    license_ = ctypes.create_string_buffer(b"GPL")
    load = ctypes.create_string_buffer(struct.pack(
        "<IIQQIIQII16sII", BPF_PROG_TYPE_CGROUP_DEVICE, len(prog) // 8, ctypes.addressof(insns),
        ctypes.addressof(license_), 0, 0, 0, 0, 0, b"muster_devices", 0, BPF_CGROUP_DEVICE), 128)
    fd = libc.syscall(nr, BPF_PROG_LOAD, load, 128)
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"bpf(BPF_PROG_LOAD): {os.strerror(e)}")
    try:
        cg = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            attach = ctypes.create_string_buffer(struct.pack("<IIII", cg, fd, BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI),
                                                 128)
            if libc.syscall(nr, BPF_PROG_ATTACH, attach, 128) < 0:
                e = ctypes.get_errno()
                raise OSError(e, f"bpf(BPF_PROG_ATTACH) to {directory}: {os.strerror(e)}")
        finally:
            os.close(cg)
    finally:
        os.close(fd)


def _probe_device_program(base: str) -> str:
    """Why device access cannot be limited under `base` ("" when it can): a program that
    allows everything is attached to a cgroup made for the probe, then removed."""
    probe = os.path.join(base, f".probe-{os.getpid()}")
    try:
        os.makedirs(probe, exist_ok=True)
        attach_device_program(probe, ())
        return ""
    except OSError as exc:
        return str(exc)
    finally:
        try:
            os.rmdir(probe)
        except OSError:
            pass


def _enable(directory: str, controllers: list[str], notes: list[str]) -> bool:
    """Enable `controllers` for the children of `directory` (cgroup.subtree_control)."""
    if not controllers:
        return True
    path = os.path.join(directory, "cgroup.subtree_control")
    try:
        have = set(_read(path).split())
    except OSError as exc:
        notes.append(f"{path}: {exc}")
        return False
    missing = [c for c in controllers if c not in have]
    if not missing:
        return True
    try:
        _write(path, " ".join(f"+{c}" for c in missing))
        return True
    except OSError as exc:
        # EBUSY: the directory holds processes (cgroup v2 lets only leaves hold them).
        why = "it holds processes" if exc.errno == errno.EBUSY else str(exc)
        notes.append(f"cannot enable {', '.join(missing)} in {directory}: {why}")
        return False


def detect_v1(base_name: str, found: list[Mount] | None = None,
              own: dict[str, str] | None = None) -> tuple[Hierarchy | None, str]:
    """The v1 controllers the agent can make cgroups in, or why none."""
    found = mounts() if found is None else found
    own = own_cgroups() if own is None else own
    bases: dict[str, str] = {}
    notes: list[str] = []
    for c in V1_CONTROLLERS:
        m = next((m for m in found if m.fstype == "cgroup" and c in m.options), None)
        if m is None or c not in own:
            continue
        base = _try_base(os.path.join(under(m, own[c]), base_name))
        if base is None:
            notes.append(f"cgroup v1 {c} at {m.point} is not writable by the agent")
            continue
        bases[c] = base
    if not bases:
        return None, "; ".join(notes) or "no cgroup v1 controllers mounted"
    return Hierarchy(1, bases, tuple(c for c in V1_CONTROLLERS if c in bases), notes), ""


def detect(mode: str, base_name: str) -> tuple[Hierarchy | None, str]:
    """The hierarchy to use: `mode` is auto, v2, v1 or off. Returns (hierarchy, "") or
    (None, why none can be used)."""
    if mode == "off":
        return None, "cgroups turned off (--cgroups off)"
    found, own = mounts(), own_cgroups()
    if mode == "v2":
        return detect_v2(base_name, found, own)
    if mode == "v1":
        return detect_v1(base_name, found, own)
    h2, why2 = detect_v2(base_name, found, own)
    if h2 is not None and "memory" in h2.controllers:
        return h2, ""
    h1, why1 = detect_v1(base_name, found, own)
    if h1 is not None and "memory" in h1.controllers:
        if h2 is not None:
            remove_paths(h2.bases.values())
        return h1, ""
    if h2 is not None:
        if h1 is not None:
            remove_paths(h1.bases.values())
        return h2, ""
    if h1 is not None:
        return h1, ""
    return None, "; ".join(w for w in (why2, why1) if w)
