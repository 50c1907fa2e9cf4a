"""The device check's job when rehearsed without a GPU (LOCAL=1): says which GPU it was
given and sleeps a quarter of argv[1] seconds."""

import os
import sys
import time

print("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"), flush=True)
time.sleep(float(sys.argv[1]) / 4)
print("ok", flush=True)
