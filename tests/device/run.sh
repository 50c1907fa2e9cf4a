#!/bin/bash
# The check on a real NVIDIA GPU (docs/testing.md, "On a real GPU"). On the device machine:
#   bash tests/device/run.sh        (with .dev/wheels from tests/device/wheels.sh carried)
# It reads the GPUs and never changes their settings. Steps: the NVML backend beside raw
# pynvml and nvidia-smi; `muster up` with this machine's GPUs; a 1-GPU job running bf16
# matrix products while nvidia-smi, the backend and the API are read side by side; two
# half-GPU shares at once; a job too big for the host waits and says why; an injected Xid
# takes the GPU out of service until an operator clears it. LOCAL=1 rehearses the same
# steps here with a simulated H200 (no probe, a sleeping job); PROBE_ONLY=1 stops after the probe.
set -u
export PYTHONUNBUFFERED=1
R=$PWD
OUT=${OUT:-/tmp/device-check}; mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
step() { echo; echo "=== $* ($(date +%T))"; }
if [ "${LOCAL:-0}" = 1 ]; then
  V=$R/.venv/bin/python; TASKPY=/usr/bin/python3; UPARGS="--simulate-gpus 1xH200 --agents 1"
  JOB=tests/device/fake_job.py
else
  step nvidia-smi
  nvidia-smi -L
  nvidia-smi --query-gpu=name,mig.mode.current,mig.mode.pending,ecc.mode.current,driver_version --format=csv
  TASKPY=$(command -v python3); echo "python3: $TASKPY $($TASKPY --version)"
  step install
  $TASKPY -m venv --system-site-packages /tmp/v &&
    /tmp/v/bin/pip install -q --no-index --find-links .dev/wheels -r .dev/reqs.txt || { echo "INSTALL FAILED"; exit 1; }
  V=/tmp/v/bin/python; UPARGS=""; JOB=tests/device/gpu_job.py
  step NVML probe
  OUT=$OUT PYTHONPATH=$R $V tests/device/nvml_probe.py | tail -n 30
  [ "${PROBE_ONLY:-0}" = 1 ] && exit 0
fi
install -m 0644 $JOB /tmp/gpu_job.py
: > /tmp/faults; export MUSTER_FAULT_FILE=/tmp/faults
export MUSTER_URL=http://127.0.0.1:18080
M="$V -m server.cli"
jid() { $V -c "import json,sys; print(json.JSONDecoder().raw_decode(sys.stdin.read())[0]['id'])"; }

step muster up
rm -rf /tmp/m
$M up --data-dir /tmp/m --http-port 18080 --nats-port 14222 $UPARGS > /tmp/up.log 2>&1 &
UP=$!
for _ in $(seq 60); do [ -s /tmp/m/token ] && break; sleep 1; done
cat /tmp/up.log
[ -s /tmp/m/token ] || { echo "NO TOKEN"; tail -n 20 /tmp/m/logs/*.log; exit 1; }
export MUSTER_TOKEN=$(cat /tmp/m/token)
for _ in $(seq 60); do $M host list 2>/dev/null | grep -q HEALTHY && break; sleep 1; done
$M host list; $M host show local-1

step one whole GPU: bf16 matrix products for 30 s, telemetry read three ways
$M job submit -o json --gpus 1 --gpu-model H200 --cpus 2 --memory-mb 16000 --wait --timeout 240 \
  whole -- $TASKPY /tmp/gpu_job.py 30 > /tmp/whole.out 2>&1 &
W=$!
for i in $(seq 12); do sleep 3; echo "--- t=$((i * 3)) s"
  command -v nvidia-smi > /dev/null && echo "nvidia-smi: $(nvidia-smi --query-gpu=utilization.gpu,memory.used,temperature.gpu,power.draw --format=csv,noheader)"
  $M host show local-1 -o json | $V -c "import json, sys; h = json.load(sys.stdin); g = h['gpuDevices'][0]
print(f\"api: util {g['utilPct']} %, {g['memUsedMb']} MB used, {g['tempC']} C, {g['powerW']} W, {g['shareAllocated']}/1000 allocated\")"
done
wait $W; echo "submit --wait: exit $?"
ID=$(jid < /tmp/whole.out); $M job show "$ID"

step two half-GPU shares at once
A=$($M job submit -o json --gpus 0 --gpu-share 500 --gpu-memory-mb 8000 --cpus 1 --memory-mb 12000 shareA -- $TASKPY /tmp/gpu_job.py 12 | jid)
B=$($M job submit -o json --gpus 0 --gpu-share 500 --gpu-memory-mb 8000 --cpus 1 --memory-mb 12000 shareB -- $TASKPY /tmp/gpu_job.py 12 | jid)
sleep 8; $M host show local-1
$M job submit --wait --timeout 240 --gpus 0 --gpu-share 500 after-shares -- /bin/true
$M job logs "$A"; $M job logs "$B"

step a job wanting 2 GPUs waits, and says why
T=$($M job submit -o json --gpus 2 two -- /bin/true | jid); sleep 6
$M job why "$T"; $M job cancel "$T"

step an injected Xid on GPU 0, then an operator clears it
echo '{"index":0,"kind":"xid","code":79,"message":"device check: injected"}' >> /tmp/faults
for _ in $(seq 20); do sleep 1; $M host list --gpu-faults | grep -q local-1 && break; done
$M host show local-1
F=$($M job submit -o json --gpus 1 after-fault -- /bin/true | jid); sleep 6; $M job why "$F"
$M host clear-gpu-faults local-1 --reason "device check"
for _ in $(seq 30); do $M job show "$F" | grep -q SUCCEEDED && break; sleep 1; done
$M job show "$F" | head -n 3; $M job list

step stop
kill -TERM $UP; wait $UP; echo "muster up: exit $?"
tail -n 12 /tmp/m/logs/agent-1.log
tar czf "$OUT/logs.tgz" -C /tmp/m logs
echo DONE
