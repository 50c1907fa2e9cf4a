"""The agent's NVML backend against this machine's real GPUs, beside raw pynvml and
nvidia-smi. It only reads the GPUs (and marks and clears a fault in the backend's own
memory, through a fault file): it never changes a GPU's settings. Writes
$OUT/nvml_probe.json and prints PROBE OK or PROBE FAILED with each check."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from typing import Any

import pynvml

from agent.gpu import NvmlBackend, mps_running, normalise_model, open_backend


def _read(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - an NVMLError, or a call this pynvml lacks
        return f"{type(exc).__name__}: {exc}"


def raw_nvml() -> tuple[list[dict[str, Any]], Any]:
    """What pynvml itself reports of each GPU, and the driver version."""
    nv = pynvml
    nv.nvmlInit()
    gpus = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        gpus.append({
            "name": nv.nvmlDeviceGetName(h), "uuid": nv.nvmlDeviceGetUUID(h),
            "mem_total_mb": nv.nvmlDeviceGetMemoryInfo(h).total // 2**20,
            "mig_mode": _read(lambda h=h: nv.nvmlDeviceGetMigMode(h)),
            "max_mig": _read(lambda h=h: nv.nvmlDeviceGetMaxMigDeviceCount(h)),
            "supported_events": _read(lambda h=h: hex(nv.nvmlDeviceGetSupportedEventTypes(h))),
            "ecc_mode": _read(lambda h=h: nv.nvmlDeviceGetEccMode(h)),
            "ecc_uncorrected_volatile": _read(lambda h=h: nv.nvmlDeviceGetTotalEccErrors(
                h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)),
        })
    driver = _read(nv.nvmlSystemGetDriverVersion)
    nv.nvmlShutdown()
    return gpus, driver


def main() -> int:
    raw, driver = raw_nvml()
    rep: dict[str, Any] = {"pynvml": pynvml.__file__, "driver": driver, "raw": raw}
    fault_file = os.path.join(tempfile.mkdtemp(), "faults")
    open(fault_file, "w").close()
    b = open_backend(None, fault_file=fault_file)
    rep["backend"] = type(b).__name__
    if not isinstance(b, NvmlBackend):
        print("PROBE FAILED: no NVML backend", rep)
        return 1
    rep["inventory"] = [g.model_dump() for g in b.inventory()]
    rep["events_registered"] = b._events is not None
    rep["ecc_baseline"] = b._ecc_baseline
    rep["nvml_calls_failed"] = sorted(b._logged)
    rep["usage"] = [u.model_dump() for u in b.usage()]
    rep["faults_at_start"] = [f.describe() for f in b.poll_faults()]
    with open(fault_file, "a") as f:
        f.write(json.dumps({"index": 0, "kind": "xid", "code": 79, "message": "device check"}) + "\n")
    rep["faults_injected"] = [f.describe() for f in b.poll_faults()]
    rep["usage_after_fault"] = [u.model_dump() for u in b.usage()]
    rep["cleared"] = b.clear_faults([0])
    rep["usage_after_clear"] = [u.model_dump() for u in b.usage()]
    rep["faults_after_clear"] = [f.describe() for f in b.poll_faults()]
    rep["mps_running"] = mps_running()
    b.close()
    rep["usage_after_close"] = b.usage()
    if shutil.which("nvidia-smi"):
        rep["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,uuid,memory.total,mig.mode.current,mig.mode.pending,"
             "temperature.gpu,power.draw,utilization.gpu,memory.used", "--format=csv,noheader"],
            capture_output=True, text=True, check=False).stdout.strip()
    pairs = list(zip(rep["inventory"], raw, strict=False))
    checks = {
        "count": len(rep["inventory"]) == len(raw),
        "model": all(g["model"] == normalise_model(r["name"]) != "UNKNOWN" for g, r in pairs),
        "uuid": all(g["uuid"] == r["uuid"] for g, r in pairs),
        "memory": all(g["memory_mb"] == r["mem_total_mb"] > 0 for g, r in pairs),
        "telemetry": all(u["temp_c"] > 0 and u["power_w"] > 0 and u["healthy"] for u in rep["usage"]),
        # every figure read (none marked unread) where NVML gives it: GPUs not in MIG mode
        "telemetry_read": all(not u["unread"] for u, r in zip(rep["usage"], raw, strict=False)
                              if not isinstance(r["mig_mode"], list) or r["mig_mode"][0] != 1),
        "no_mig_instances_when_mig_is_off": all(not g["mig"] for g, r in pairs
                                                if not isinstance(r["mig_mode"], list) or r["mig_mode"][0] != 1),
        "fault_marks_the_gpu": rep["usage_after_fault"][0]["healthy"] is False,
        "clear_restores_it": rep["cleared"] == [0] and rep["usage_after_clear"][0]["healthy"] is True,
        "closed_reads_nothing": rep["usage_after_close"] == [],
    }
    if rep.get("nvidia_smi"):  # memory in use as nvidia-smi counts it (within 16 MB: read apart in time)
        smi_used = [int(line.rsplit(",", 1)[1].split()[0]) for line in rep["nvidia_smi"].splitlines()]
        checks["memory_used_as_nvidia_smi"] = all(abs(u["mem_used_mb"] - m) <= 16
                                                  for u, m in zip(rep["usage"], smi_used, strict=False))
    rep["checks"] = checks
    with open(os.path.join(os.environ.get("OUT", tempfile.gettempdir()), "nvml_probe.json"), "w") as f:
        json.dump(rep, f, indent=1, default=str)
    print(json.dumps(rep, indent=1, default=str))
    print("PROBE", "OK" if all(checks.values()) else "FAILED", checks)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
