"""`muster-agent` (also `python -m agent`, and `muster agent` on a machine with the whole
of Muster): run the host agent until SIGINT/SIGTERM.

Each option falls back to an environment variable: MUSTER_NATS_URL, MUSTER_HOST_ID,
MUSTER_LABELS, MUSTER_SIMULATE_GPUS, MUSTER_AGENT_STATE_DIR, MUSTER_NATS_CREDS,
MUSTER_NATS_CA, MUSTER_NATS_CERT, MUSTER_NATS_KEY, MUSTER_RUN_AS, MUSTER_JOB_UIDS,
MUSTER_CGROUPS, MUSTER_CGROUP_NAME, MUSTER_AGENT_WORK_DIR, MUSTER_GPU_IDLE_AFTER,
MUSTER_MIN_FREE_DISK_MB (and MUSTER_FAULT_FILE, read by the simulated and NVML GPU
backends); logging follows MUSTER_LOG_FORMAT
(text or json) and MUSTER_LOG_LEVEL. Exit codes: 0 stopped, 1 error (bad options,
labels or settings), 130 interrupted before the agent ran.

Imports: `agent` and `wire` only; never `server`, `web` or `bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

from agent.isolation import CGROUP_MODES, DEFAULT_PIDS_MAX
from wire.errors import MusterError
from wire.logs import setup as setup_logging


def add_arguments(a: argparse.ArgumentParser) -> None:
    a.add_argument("--nats", default=None)
    a.add_argument("--host-id", default=None)
    a.add_argument("--labels", default=None, help="rack=r1,zone=z1")
    a.add_argument("--simulate-gpus", default=None,
                   help="e.g. 8xH100; with MIG instances: 8xH100,mig=0-1:7*1g.10gb (GPUs 0 and 1 in MIG mode)")
    a.add_argument("--heartbeat-interval", type=float, default=5.0)
    a.add_argument("--ttl-intervals", type=int, default=3,
                   help="the heartbeat key's TTL in heartbeat intervals (the control plane counts the host lost "
                        "when it expires)")
    a.add_argument("--fence-after", type=float, default=0.0,
                   help="seconds without a stored heartbeat before the agent freezes its attempts "
                        "(default: two heartbeat intervals; less than the TTL)")
    a.add_argument("--kill-grace", type=float, default=10.0)
    a.add_argument("--gpu-idle-after", type=float, default=float(os.environ.get("MUSTER_GPU_IDLE_AFTER", "1800")),
                   help="seconds a running attempt's GPUs may all stay idle (under 5 %% at every heartbeat) "
                        "before its heartbeat names it and the control plane alerts job.gpus_idle "
                        "(MUSTER_GPU_IDLE_AFTER; 0: never)")
    a.add_argument("--min-free-disk-mb", type=int, default=int(os.environ.get("MUSTER_MIN_FREE_DISK_MB", "256")),
                   help="below this much free space where attempts' directories are made, or in the state "
                        "directory, the host asks for no new work (MUSTER_MIN_FREE_DISK_MB; 0: never)")
    a.add_argument("--cpus", type=int, default=None)
    a.add_argument("--memory-mb", type=int, default=None)
    a.add_argument("--state-dir", default=os.environ.get("MUSTER_AGENT_STATE_DIR"))
    a.add_argument("--fault-file", default=None)
    a.add_argument("--creds", default=None, help="this agent's NATS credentials (MUSTER_NATS_CREDS)")
    a.add_argument("--nats-ca", default=None, help="CA of the NATS servers' certificates (MUSTER_NATS_CA)")
    a.add_argument("--nats-cert", default=None, help="NATS client certificate (MUSTER_NATS_CERT)")
    a.add_argument("--nats-key", default=None, help="NATS client key (MUSTER_NATS_KEY)")
    a.add_argument("--run-as", default=os.environ.get("MUSTER_RUN_AS") or None,
                   help="user tasks run as (default, as root: muster-task, created if missing, else nobody; "
                        "not root: the agent's own user)")
    a.add_argument("--job-uids", default=os.environ.get("MUSTER_JOB_UIDS") or None, metavar="START:COUNT",
                   help="with the default task user, each job's tasks run as a uid of its own, START + a hash of "
                        "the job's id modulo COUNT (default 3000000:1000000; off: all as the task user)")
    a.add_argument("--cgroups", default=os.environ.get("MUSTER_CGROUPS", "auto"), choices=CGROUP_MODES,
                   help="cgroup version for attempts (auto: v2 if it has the memory controller, else v1)")
    a.add_argument("--cgroup-name", default=os.environ.get("MUSTER_CGROUP_NAME") or None,
                   help="the cgroup attempts' cgroups are made under (default muster-<host id>)")
    a.add_argument("--pids-max", type=int, default=DEFAULT_PIDS_MAX,
                   help="processes and threads per attempt (0: no limit)")
    a.add_argument("--work-dir", default=os.environ.get("MUSTER_AGENT_WORK_DIR") or None,
                   help="where attempts' working directories are made (default: a new temporary directory)")
    a.add_argument("--gpu-dev-dir", default="/dev", help="where the nvidia<N> device files are (for tests)")


def build_parser(prog: str = "muster-agent") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Run a Muster host agent.")
    add_arguments(p)
    return p


def main(argv: list[str] | None = None, prog: str = "muster-agent") -> int:
    args = build_parser(prog).parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        run(args)
    except MusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def run(args: argparse.Namespace) -> None:
    from agent.agent import Agent, AgentConfig, parse_labels

    setup_logging(component="agent")
    cfg = AgentConfig(
        nats_url=args.nats or os.environ.get("MUSTER_NATS_URL", "nats://127.0.0.1:4222"),
        host_id=args.host_id or os.environ.get("MUSTER_HOST_ID") or os.uname().nodename,
        labels=parse_labels(args.labels if args.labels is not None else os.environ.get("MUSTER_LABELS")),
        simulate_gpus=args.simulate_gpus or os.environ.get("MUSTER_SIMULATE_GPUS") or None,
        heartbeat_interval_s=args.heartbeat_interval,
        ttl_intervals=args.ttl_intervals,
        fence_after_s=args.fence_after,
        kill_grace_s=args.kill_grace,
        gpu_idle_after_s=args.gpu_idle_after,
        min_free_disk_mb=args.min_free_disk_mb,
        cpus=args.cpus,
        memory_mb=args.memory_mb,
        state_dir=Path(args.state_dir) if args.state_dir else None,
        fault_file=args.fault_file,
        nats_creds=args.creds or os.environ.get("MUSTER_NATS_CREDS") or None,
        nats_ca=args.nats_ca or os.environ.get("MUSTER_NATS_CA") or None,
        nats_cert=args.nats_cert or os.environ.get("MUSTER_NATS_CERT") or None,
        nats_key=args.nats_key or os.environ.get("MUSTER_NATS_KEY") or None,
        run_as=args.run_as,
        cgroups=args.cgroups,
        cgroup_name=args.cgroup_name,
        job_uids=args.job_uids,
        pids_max=args.pids_max,
        work_dir=Path(args.work_dir) if args.work_dir else None,
        gpu_dev_dir=args.gpu_dev_dir,
    )
    agent = Agent(cfg)

    async def until_stopped() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await agent.run(stop)

    asyncio.run(until_stopped())


if __name__ == "__main__":
    sys.exit(main())
