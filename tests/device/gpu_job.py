"""A GPU job for the device check: says which GPU it was given, then runs bf16 matrix
products on it for argv[1] seconds (needs PyTorch with CUDA)."""

import os
import sys
import time

import torch

print("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"),
      "CUDA_DEVICE_ORDER=" + os.environ.get("CUDA_DEVICE_ORDER", "<unset>"), flush=True)
print("torch sees", torch.cuda.device_count(), "GPU(s):", torch.cuda.get_device_name(0), flush=True)
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(sys.argv[1])
n = 0
while time.time() < end:
    for _ in range(20):
        y = x @ x
    torch.cuda.synchronize()
    n += 20
print("matmuls", n, "ok", flush=True)
