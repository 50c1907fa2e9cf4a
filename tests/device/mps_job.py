"""A share job for the MPS check: the limits it was given, what CUDA reports under them,
and its matrix-product rate for argv[1] seconds (needs PyTorch with CUDA)."""

import os
import sys
import time

import torch

for var in ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"):
    print(f"{var}={os.environ.get(var, '<unset>')}", flush=True)
free, total = torch.cuda.mem_get_info()
print(f"CUDA memory: {total // 2**20} MB total, {free // 2**20} MB free;",
      f"{torch.cuda.get_device_properties(0).multi_processor_count} SMs", flush=True)
x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(sys.argv[1])
n = 0
while time.time() < end:
    for _ in range(20):
        x @ x
    torch.cuda.synchronize()
    n += 20
print(f"matmuls/s {n / float(sys.argv[1]):.0f}", flush=True)
try:
    torch.empty(int(10e9), dtype=torch.uint8, device="cuda")
    print("allocated 10 GB: over the pinned limit", flush=True)
except RuntimeError as exc:
    print("10 GB refused:", str(exc).splitlines()[0][:120], flush=True)
