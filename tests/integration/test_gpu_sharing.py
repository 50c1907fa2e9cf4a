"""Shares of a GPU and MIG instances end to end: a real server and real agents with
simulated GPUs (one A10; two H100s, GPU 0 in MIG mode), tasks as real processes that
report the GPUs they were given and wait for the test to let them finish."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import Api, Cluster, assert_invariants

PY = sys.executable
JOB = """query($id: ID!) { job(id: $id) { id state gpuShare gpuMemoryMb gpuSharing migProfile
         pendingReasons { reason hosts } attempts { state host { id } gpuIndices gpuShare migInstances gpuSharing
         outputTail } } }"""
HOST = """query($id: ID!) { host(id: $id) { id gpuDevices { index model shareAllocated memAllocatedMb tasks sharing
          migInstances { uuid profile allocated } } } }"""


def waiting_task(flag: Path) -> list[str]:
    """A task that writes what it sees of its GPU to <flag's folder>/<job id>.json, then
    waits until `flag` exists."""
    code = ("import json, os, time; env = {k: os.environ.get(k) for k in "
            "('CUDA_VISIBLE_DEVICES', 'MUSTER_GPU_SHARE', 'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE')}\n"
            f"out = os.path.join({str(flag.parent)!r}, os.environ['MUSTER_JOB_ID'] + '.json')\n"
            "open(out + '.tmp', 'w').write(json.dumps(env)); os.rename(out + '.tmp', out)\n"
            f"while not os.path.exists({str(flag)!r}): time.sleep(0.05)")
    return [PY, "-c", code]


def wait_running(api: Api, job_id: str) -> None:
    api.wait_job(job_id, {"RUNNING"}, timeout=60)


def test_shared_gpu_and_mig_instances_end_to_end(cluster: Cluster, tmp_path: Path) -> None:
    srv = cluster.server()
    cluster.agent("share-host", gpus="1xA10")
    cluster.agent("mig-host", gpus="2xH100,mig=0:2*1g.10gb")
    api = Api(srv.url, cluster.token)
    api.wait_hosts(2)
    flag = tmp_path / "go"

    # Two tasks of 400 thousandths share the A10; each sees the same GPU.
    shared = [api.submit(name=f"share-{i}", command=waiting_task(flag), gpuShare=400, gpuMemoryMb=8000,
                         gpuModel="A10", cpus=0.5, memoryMb=64) for i in range(2)]
    assert all(not s["userErrors"] for s in shared), shared
    ids = [s["job"]["id"] for s in shared]
    for i in ids:
        wait_running(api, i)
    envs = []
    for i in ids:
        job = api.q(JOB, {"id": i})["job"]
        a = job["attempts"][0]
        assert (job["gpuShare"], job["gpuSharing"]) == (400, "shared, not isolated")
        assert (a["host"]["id"], a["gpuIndices"], a["gpuShare"], a["gpuSharing"]) == \
            ("share-host", [0], 400, "shared, not isolated")
        envs.append(_wait_seen(tmp_path, i))
    assert envs[0]["CUDA_VISIBLE_DEVICES"] == envs[1]["CUDA_VISIBLE_DEVICES"] == "0"
    assert envs[0]["MUSTER_GPU_SHARE"] == "400"
    assert envs[0]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] is None  # no MPS on this machine: time-sliced
    gpu = api.q(HOST, {"id": "share-host"})["host"]["gpuDevices"][0]
    assert (gpu["shareAllocated"], gpu["memAllocatedMb"], gpu["tasks"], gpu["sharing"]) == \
        (800, 16000, 2, "shared, not isolated")

    # A third does not fit (1,200 thousandths): it waits, and says why.
    third = api.submit(name="share-2", command=waiting_task(flag), gpuShare=400, gpuModel="A10", cpus=0.5,
                       memoryMb=64)["job"]["id"]
    _wait_reason(api, third, "no GPU with enough free share")
    assert api.job(third)["state"] == "QUEUED"

    # MIG: each task gets an instance of its own, named by its UUID.
    mig = [api.submit(name=f"mig-{i}", command=waiting_task(flag), migProfile="1g.10gb", cpus=0.5,
                      memoryMb=64)["job"]["id"] for i in range(2)]
    for i in mig:
        wait_running(api, i)
    host = api.q(HOST, {"id": "mig-host"})["host"]
    instances = {m["uuid"] for m in host["gpuDevices"][0]["migInstances"]}
    assert len(instances) == 2 and all(m["allocated"] for m in host["gpuDevices"][0]["migInstances"])
    assert host["gpuDevices"][0]["sharing"] == "MIG instance"
    given = set()
    for i in mig:
        a = api.q(JOB, {"id": i})["job"]["attempts"][0]
        assert a["gpuIndices"] == [] and len(a["migInstances"]) == 1 and a["gpuSharing"] == "MIG instance"
        visible = _wait_seen(tmp_path, i)["CUDA_VISIBLE_DEVICES"]
        assert visible == a["migInstances"][0] and visible.startswith("MIG-")
        given.add(visible)
    assert given == instances
    extra = api.submit(name="mig-2", command=waiting_task(flag), migProfile="1g.10gb", cpus=0.5,
                       memoryMb=64)["job"]["id"]
    _wait_reason(api, extra, "no free MIG instance of that profile")

    # The CLI: a model set, a share; `job show` and `host show` say what is shared.
    r = muster_cli(cluster, srv.url, "job", "submit", "--gpu-model", "T4,A10", "--gpu-share", "150",
                   "--gpu-memory-mb", "1000", "--cpus", "0.5", "--memory-mb", "64", "-o", "json", "cli-share", "--",
                   "true")
    assert r.returncode == 0, r.stderr
    cli_job = json.loads(r.stdout)
    assert (cli_job["gpuModels"], cli_job["gpuShare"], cli_job["gpuModel"]) == (["A10", "T4"], 150, None)
    r = muster_cli(cluster, srv.url, "job", "show", cli_job["id"])
    assert "150/1000 of one GPU A10|T4 (shared, not isolated), 1000 MB GPU memory" in r.stdout, r.stdout
    r = muster_cli(cluster, srv.url, "host", "show", "share-host")
    assert "GPU 0 A10" in r.stdout and "shared, not isolated" in r.stdout, r.stdout
    r = muster_cli(cluster, srv.url, "job", "submit", "--gpus", "1", "--gpu-model", "A10", "--gpu-share", "100",
                   "both", "--", "true")
    assert r.returncode != 0 and "--gpu-share" in r.stderr

    # Let them finish: the waiting ones run once the GPU and the instances are free.
    flag.touch()
    for i in [*ids, third, *mig, extra, cli_job["id"]]:
        assert api.wait_job(i, {"SUCCEEDED", "FAILED"}, timeout=90)["state"] == "SUCCEEDED"
    assert_invariants(cluster.nats_url)


def muster_cli(c: Cluster, url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MUSTER_URL": url, "MUSTER_TOKEN": c.token}
    return subprocess.run([PY, "-m", "server.cli", *argv], capture_output=True, text=True, env=env, timeout=60)


def _wait_seen(folder: Path, job_id: str) -> dict[str, str | None]:
    """What the job's process wrote of its GPU environment, once it has."""
    import time

    path = folder / f"{job_id}.json"
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, f"{job_id} never wrote {path}"
        time.sleep(0.05)
    env: dict[str, str | None] = json.loads(path.read_text())
    return env


def _wait_reason(api: Api, job_id: str, reason: str) -> None:
    import time

    deadline = time.monotonic() + 30
    while True:
        reasons = {r["reason"] for r in api.q(JOB, {"id": job_id})["job"]["pendingReasons"]}
        if reason in reasons:
            return
        assert time.monotonic() < deadline, f"{job_id} pending for {reasons}, not {reason!r}"
        time.sleep(0.1)
