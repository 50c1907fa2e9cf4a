"""MIG instances read from NVML (a fake library: no GPU here): the profile in a MIG device's
name read whole, and compute instances (a slice of a GPU instance, "1c.7g.80gb") never
reported as the GPU instance they are part of."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agent.gpu import NvmlBackend, is_compute_instance, mig_profile_of
from tests.unit.test_gpu import FakeNvml

# Per GPU, its MIG devices by slot: (name, MiB); a compute instance reports its GPU
# instance's memory.
LAYOUT: dict[int, list[tuple[str, int]]] = {
    # one 7g.80gb GPU instance split into seven compute instances
    0: [("NVIDIA H100 80GB HBM3 MIG 1c.7g.80gb", 80896)] * 7,
    # a 3g.40gb whole, and another split into three
    1: [("NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40448)] + [("NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb", 40448)] * 3,
}


class SplitMigNvml(FakeNvml):
    """FakeNvml with both GPUs in MIG mode, laid out as LAYOUT says."""

    NVML_DEVICE_MIG_ENABLE = 1

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        return (1, 1)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, j: int) -> tuple[int, int]:
        if j >= len(LAYOUT[h]):
            raise self.NVMLError(6)  # NOT_FOUND: an empty slot
        return (h, j)

    def nvmlDeviceGetName(self, h: int | tuple[int, int]) -> str:
        return LAYOUT[h[0]][h[1]][0] if isinstance(h, tuple) else super().nvmlDeviceGetName(h)

    def nvmlDeviceGetUUID(self, h: int | tuple[int, int]) -> bytes:
        return f"MIG-{h[0]}{h[1]}".encode() if isinstance(h, tuple) else super().nvmlDeviceGetUUID(h)

    def nvmlDeviceGetMemoryInfo(self, h: int | tuple[int, int], version: int | None = None) -> SimpleNamespace:
        if isinstance(h, tuple):
            return SimpleNamespace(total=LAYOUT[h[0]][h[1]][1] << 20, used=0, free=0)
        return super().nvmlDeviceGetMemoryInfo(h, version)


@pytest.mark.parametrize("name, profile, compute", [("NVIDIA H100 80GB HBM3 MIG 1c.7g.80gb", "1c.7g.80gb", True),
                                                    ("NVIDIA A100-SXM4-40GB MIG 2C.3g.20gb", "2c.3g.20gb", True),
                                                    (b"NVIDIA H100 80GB HBM3 MIG 7g.80gb", "7g.80gb", False),
                                                    ("NVIDIA H100 MIG 1g.20gb+me", "1g.20gb+me", False)])
def test_the_mig_profile_is_read_whole(name: str | bytes, profile: str, compute: bool) -> None:
    """Found by a review: a compute instance's name ("... MIG 1c.7g.80gb") parsed to the
    profile 7g.80gb, its GPU instance's, though it has one seventh of its compute."""
    assert mig_profile_of(name) == profile
    assert is_compute_instance(profile) is compute


def test_compute_instances_are_not_reported_as_their_gpu_instance(caplog: pytest.LogCaptureFixture) -> None:
    """Found by a review: seven compute instances of one 7g.80gb GPU instance were reported
    as seven 7g.80gb instances (each with the GPU instance's 80 GB): a job asking for a whole
    7g.80gb got one slice of it, and the host showed seven times the memory it has. The
    wire's profiles name GPU instances only: a compute instance is not reported (the GPU
    stays in MIG mode, not given whole), and a whole GPU instance beside it still is."""
    with caplog.at_level("WARNING", logger="agent.gpu"):
        backend = NvmlBackend(nvml=SplitMigNvml(["NVIDIA H100 80GB HBM3"] * 2))
    g0, g1 = backend.inventory()
    assert g0.in_mig_mode() and g0.mig == []
    assert [(m.uuid, m.profile, m.memory_mb) for m in g1.mig] == [("MIG-10", "3g.40gb", 40448)]
    assert sum(m.memory_mb for g in (g0, g1) for m in g.mig) <= g0.memory_mb
    assert any("compute instances" in r.getMessage() for r in caplog.records)
    backend.close()
