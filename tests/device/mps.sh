#!/bin/bash
# CUDA MPS on a real GPU (docs/testing.md, "On a real GPU"): starts an MPS control daemon
# (no GPU setting changes; it is stopped at the end), then `muster up` and two half-GPU
# shares with 8000 MB each: do the limits the agent sets (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,
# CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) reach CUDA? Needs .dev/wheels (tests/device/wheels.sh).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/device-mps}; mkdir -p "$OUT"
exec > >(tee "$OUT/mps.log") 2>&1
TASKPY=$(command -v python3)
$TASKPY -m venv --system-site-packages /tmp/v &&
  /tmp/v/bin/pip install -q --no-index --find-links .dev/wheels -r .dev/reqs.txt || { echo "INSTALL FAILED"; exit 1; }
V=/tmp/v/bin/python; M="$V -m server.cli"
install -m 0644 tests/device/mps_job.py /tmp/mps_job.py
echo "=== without MPS, as root"; timeout 60 $TASKPY /tmp/mps_job.py 3
echo "=== MPS control daemon"
command -v nvidia-cuda-mps-control || { echo "NO MPS CONTROL"; exit 1; }
nvidia-cuda-mps-control -d; echo "started: exit $?"; sleep 1; ls -la /tmp/nvidia-mps
export MUSTER_URL=http://127.0.0.1:18080
$M up --data-dir /tmp/m --http-port 18080 --nats-port 14222 > /tmp/up.log 2>&1 &
UP=$!
for _ in $(seq 60); do [ -s /tmp/m/token ] && break; sleep 1; done
export MUSTER_TOKEN=$(cat /tmp/m/token)
for _ in $(seq 60); do $M host list 2>/dev/null | grep -q HEALTHY && break; sleep 1; done
for n in A B; do
  $M job submit --gpus 0 --gpu-share 500 --gpu-memory-mb 8000 --memory-mb 12000 "share$n" -- timeout 90 $TASKPY /tmp/mps_job.py 8
done
$M job submit --wait --timeout 150 --gpus 0 --gpu-share 500 --gpu-memory-mb 8000 after -- /bin/true
$M job list
$M job list | awk 'NR>1 {print $1}' | while read -r id; do $M job logs "$id"; done
kill -TERM $UP; wait $UP
echo quit | nvidia-cuda-mps-control; echo "MPS stopped: exit $?"
tail -n 20 /var/log/nvidia-mps/control.log 2>/dev/null || true
