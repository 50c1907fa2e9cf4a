"""Host (non-GPU) capacity and usage for the agent's heartbeats."""

from __future__ import annotations

import os
import uuid

import psutil

from agent.watchdog import BOOT_ID_PATH, kernel_boot_id

_MIB = 1024 * 1024
_fallback_boot_id: str | None = None


def host_capacity() -> tuple[int, int]:
    """(CPU cores usable by this process, total RAM in MiB)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    return max(1, cpus), int(psutil.virtual_memory().total // _MIB)


def host_usage() -> tuple[float, int]:
    """(CPU % since the previous call, RAM in use in MiB). Never blocks.

    The first call's CPU figure is 0.0 (psutil has no earlier sample). RAM in use is
    total minus available, which counts neither page cache nor free memory.
    """
    vm = psutil.virtual_memory()
    return float(psutil.cpu_percent(interval=None)), int((vm.total - vm.available) // _MIB)


def boot_id() -> str:
    """The kernel's boot id, or a random id fixed for this process where there is none."""
    global _fallback_boot_id
    value = kernel_boot_id(BOOT_ID_PATH)
    if value:
        return value
    if _fallback_boot_id is None:
        _fallback_boot_id = str(uuid.uuid4())
    return _fallback_boot_id
