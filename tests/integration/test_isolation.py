"""Hostile jobs against real agents (agent.isolation, agent.cgroups): a job hunting for the
cluster's secrets finds none, a daemon a job forked dies with its cancel, a job over its
memory limit is OOM-killed and reported so, a job sees only its own GPU's device, and a
host whose agent cannot isolate tasks is shown NOT ISOLATED. Real processes, signals and
cgroups (the ones this machine lets the agent use)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent import cgroups
from tests.conftest import wait_until
from tests.integration.conftest import Api, Cluster, process_gone

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="tasks run as another user only under a root agent")
# The task user cannot run the checkout's interpreter (it may live in a private home).
SYSTEM_PY = "/usr/bin/python3"


def hierarchy(version: str) -> cgroups.Hierarchy | None:
    h, _ = cgroups.detect(version, "muster-probe")
    if h is not None:
        cgroups.remove_paths(h.bases.values())
    return h


def needs(version: str, *controllers: str) -> Any:
    h = hierarchy(version)
    ok = h is not None and all(c in h.controllers for c in controllers)
    return pytest.mark.skipif(not ok, reason=f"no usable cgroup {version} with {', '.join(controllers) or 'tracking'}")


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    """A directory every user may write to, outside the test's private tmp_path."""
    d = Path(tempfile.mkdtemp(prefix="muster-test-shared-"))
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def attempt(api: Api, job_id: str) -> dict[str, Any]:
    q = """query($id: ID!) { job(id: $id) { state attempts { state exitCode reason outputTail } } }"""
    return api.q(q, {"id": job_id})["job"]["attempts"][-1]  # type: ignore[no-any-return]


def host(api: Api, host_id: str) -> dict[str, Any]:
    return api.q('query($id: ID!) { host(id: $id) { isolated isolation } }', {"id": host_id})["host"]  # type: ignore


HUNT = r"""
found=0
say() { echo "$1"; found=1; }
env | grep -E 'NATS|TOKEN|CREDS|SECRET|SEED' && found=1
for d in "$AGENT_STATE" "$AGENT_STATE"/* "$AGENT_STATE"/*/*; do
  [ -r "$d" ] && [ -f "$d" ] && head -c 100 "$d" >/dev/null 2>&1 && say "READ $d"
  [ -d "$d" ] && ls "$d" >/dev/null 2>&1 && say "LISTED $d"
done
touch "$AGENT_STATE/planted" 2>/dev/null && say "WROTE $AGENT_STATE"
for p in /proc/[0-9]*; do
  { tr '\0' '\n' < "$p/environ"; } 2>/dev/null | grep -q -E 'TOPSECRET|MUSTER_NATS' && say "ENVIRON $p"
done
for f in $(find "$HUNT_DIR" /tmp/muster-work-* -xdev -type f 2>/dev/null); do
  grep -q -E 'TOPSECRET|SUA[A-Z0-9]{20}|mst_' "$f" 2>/dev/null && say "SECRET IN $f"
done
echo "hunt over: found=$found uid=$(id -u)"
exit $found
"""


@ROOT_ONLY
def test_a_job_hunting_for_secrets_finds_none(cluster: Cluster, shared: Path) -> None:
    """The agent has a secret in its environment and private files in its state directory
    (in a directory anyone may enter, as /var/lib is); a job looks through its own
    environment, the agent's files, every process's environment and the readable files
    near it: it finds nothing, and runs as the task user."""
    state = shared / "agents"
    srv = cluster.server()
    cluster.agent("iso-a", gpus="1xH100", isolate=True, state_dir=str(state),
                  env={"MUSTER_TOKEN": "mst_TOPSECRET", "X_SECRET": "TOPSECRET"})
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    (state / "operator-notes").write_text("TOPSECRET\n")
    assert state.stat().st_mode & 0o777 == 0o700
    res = api.submit(name="hunter", command=["sh", "-c", HUNT],
                     env={"AGENT_STATE": str(state), "HUNT_DIR": str(shared)}, gpus=1, cpus=1, memoryMb=64)
    job = api.wait_job(res["job"]["id"], {"SUCCEEDED", "FAILED"})
    a = attempt(api, job["id"])
    assert "hunt over: found=0" in a["outputTail"], a["outputTail"]
    assert job["state"] == "SUCCEEDED", a
    uid = int(a["outputTail"].rsplit("uid=", 1)[1].split()[0])
    assert uid not in (0, os.geteuid())
    assert host(api, "iso-a")["isolated"] is True


NEIGHBOUR = r"""
found=0
for p in /proc/[0-9]*; do
  { tr '\0' '\n' < "$p/environ"; } 2>/dev/null | grep -q TOPSECRET && { echo "ENVIRON $p"; found=1; }
  grep -rqs TOPSECRET "$p/cwd/" 2>/dev/null && { echo "CWD $p"; found=1; }
  kill -0 "$(basename $p)" 2>/dev/null && [ "$(stat -c %u $p)" != "$(id -u)" ] && { echo "SIGNAL $p"; found=1; }
done
echo "hunt over: found=$found uid=$(id -u)"
exit $found
"""


@ROOT_ONLY
def test_a_job_cannot_read_or_signal_another_jobs_tasks(cluster: Cluster, shared: Path) -> None:
    """Found by exploring: all tasks of a host ran as one task user, so a job read another
    job's `env` (/proc/<pid>/environ) and its working directory (/proc/<pid>/cwd), and
    could signal its processes. Each job now runs as a uid of its own."""
    srv = cluster.server()
    cluster.agent("iso-n", gpus="2xH100", isolate=True)
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    ready = shared / "victim-ready"
    victim = api.submit(name="victim", command=["sh", "-c", f"echo TOPSECRET > notes; touch {ready}; sleep 600"],
                        env={"API_KEY": "TOPSECRET"}, gpus=1, cpus=1, memoryMb=64)
    wait_until(ready.exists, timeout=60, what="the victim running")
    res = api.submit(name="neighbour", command=["sh", "-c", NEIGHBOUR], gpus=1, cpus=1, memoryMb=64)
    job = api.wait_job(res["job"]["id"], {"SUCCEEDED", "FAILED"})
    out = attempt(api, job["id"])["outputTail"]
    assert "hunt over: found=0" in out and job["state"] == "SUCCEEDED", out
    neighbour_uid = int(out.rsplit("uid=", 1)[1].split()[0])
    victim_uid = os.stat(ready).st_uid
    assert neighbour_uid != victim_uid and 0 not in (neighbour_uid, victim_uid)
    api.q('mutation($id: ID!) { cancelJob(id: $id, reason: "test") { userErrors { code } } }',
          {"id": victim["job"]["id"]})
    api.wait_job(victim["job"]["id"], {"CANCELLED"})


@ROOT_ONLY
@pytest.mark.parametrize("version", [
    pytest.param("v1", marks=needs("v1")),
    pytest.param("v2", marks=needs("v2")),
])
def test_cancel_stops_a_daemon_the_job_forked(cluster: Cluster, shared: Path, version: str) -> None:
    """The job double-forks a child into a session of its own (a daemon, out of the job's
    process group, holding nothing of it) and waits; cancel stops all of it."""
    srv = cluster.server()
    cluster.agent("iso-d", gpus="1xH100", isolate=True, cgroups=version, kill_grace=1)
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    pids = shared / "pids"
    script = (f"(setsid sh -c 'echo $$ >> {pids}; exec sleep 600' < /dev/null > /dev/null 2>&1 &); "
              f"echo $$ >> {pids}; exec sleep 600")
    res = api.submit(name="daemon", command=["sh", "-c", script], gpus=1, cpus=1, memoryMb=64)
    api.wait_job(res["job"]["id"], {"RUNNING"})
    wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 2, what="both processes started")
    started = [int(p) for p in pids.read_text().split()]
    assert all(not process_gone(p) for p in started)
    r = api.q('mutation($id: ID!) { cancelJob(id: $id, reason: "test") { userErrors { code } } }',
              {"id": res["job"]["id"]})
    assert r["cancelJob"]["userErrors"] == []
    api.wait_job(res["job"]["id"], {"CANCELLED"})
    wait_until(lambda: attempt(api, res["job"]["id"])["state"] == "KILLED", what="attempt killed")
    # The attempt is reported stopped only once all of it is gone: the daemon too.
    assert [p for p in started if not process_gone(p)] == []


@ROOT_ONLY
def test_a_job_that_ends_leaves_nothing_running(cluster: Cluster, shared: Path) -> None:
    """A job that starts a background child holding its output and exits: it is reported
    (the pipe it held is not waited for) and the child is gone. (And an empty attempt
    cgroup a killed agent left is removed when the agent starts.)"""
    h, _ = cgroups.detect("auto", "muster-iso-b")
    left = h.create("jleftover00.1", cgroups.Limits()) if h is not None else None
    srv = cluster.server()
    cluster.agent("iso-b", gpus="1xH100", isolate=True)
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    if left is not None:
        assert not any(os.path.exists(p) for p in left.paths)
    pid = shared / "pid"
    res = api.submit(name="bg", command=["sh", "-c", f"sh -c 'echo $$ > {pid}; exec sleep 600' & sleep 0.5; echo bye"],
                     gpus=1, cpus=1, memoryMb=64)
    job = api.wait_job(res["job"]["id"], {"SUCCEEDED", "FAILED"}, timeout=60)
    assert job["state"] == "SUCCEEDED"
    assert "bye" in attempt(api, job["id"])["outputTail"]
    assert process_gone(int(pid.read_text()))


@ROOT_ONLY
@needs("auto", "memory")
@pytest.mark.skipif(not os.path.exists(SYSTEM_PY), reason=f"no {SYSTEM_PY}")
def test_a_job_over_its_memory_limit_is_oom_killed_and_reported_so(cluster: Cluster) -> None:
    srv = cluster.server()
    cluster.agent("iso-m", gpus="1xH100", isolate=True)
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    grab = "x = bytearray(512 * 1024 * 1024); print('still here')"
    res = api.submit(name="hog", command=[SYSTEM_PY, "-c", grab], gpus=1, cpus=1, memoryMb=64, maxAttempts=1)
    job = api.wait_job(res["job"]["id"], {"SUCCEEDED", "FAILED"}, timeout=60)
    a = attempt(api, job["id"])
    assert job["state"] == "FAILED" and a["state"] == "FAILED", a
    assert a["exitCode"] == -9 and a["reason"].startswith("oom-killed:") and "64 MB" in a["reason"], a
    assert "still here" not in a["outputTail"]
    # A job within its limit is left alone.
    ok = api.submit(name="fits", command=[SYSTEM_PY, "-c", "x = bytearray(8 * 1024 * 1024); print('fine')"],
                    gpus=1, cpus=1, memoryMb=256)
    assert api.wait_job(ok["job"]["id"], {"SUCCEEDED", "FAILED"}, timeout=60)["state"] == "SUCCEEDED"


@ROOT_ONLY
@pytest.mark.parametrize("version", [
    pytest.param("v1", marks=needs("v1", "devices")),
    pytest.param("v2", marks=needs("v2", "devices")),
])
def test_a_job_opens_only_its_own_gpus_device(cluster: Cluster, tmp_path: Path, version: str) -> None:
    """cgroup v1's devices controller, or on cgroup v2 a BPF device program: the agent
    denies the device files of the GPUs an attempt was not given (nvidia0 and nvidia1
    stand in here for /dev/null and /dev/zero)."""
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidia0").symlink_to("/dev/null")
    (dev / "nvidia1").symlink_to("/dev/zero")
    srv = cluster.server()
    cluster.agent("iso-g", gpus="2xH100", isolate=True, cgroups=version, gpu_dev_dir=str(dev))
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    probe = ("for d in /dev/null /dev/zero; do if head -c 1 $d > /dev/null 2>&1; then echo \"open $d\"; "
             "else echo \"denied $d\"; fi; done; echo \"gpus=$CUDA_VISIBLE_DEVICES\"")
    res = api.submit(name="gpu", command=["sh", "-c", probe], gpus=1, cpus=1, memoryMb=64)
    job = api.wait_job(res["job"]["id"], {"SUCCEEDED", "FAILED"}, timeout=60)
    out = attempt(api, job["id"])["outputTail"]
    mine, other = ("/dev/null", "/dev/zero") if "gpus=0" in out else ("/dev/zero", "/dev/null")
    assert f"open {mine}" in out and f"denied {other}" in out, out


def test_a_host_that_cannot_isolate_is_shown_not_isolated(cluster: Cluster) -> None:
    """No cgroups and tasks as the agent's own user: the agent says so at start, and the
    host is NOT ISOLATED in GraphQL and on the console."""
    srv = cluster.server()
    agent = cluster.agent("iso-n", gpus="1xH100", cgroups="off")
    api = Api(srv.url, cluster.token)
    api.wait_hosts(1)
    h = wait_until(lambda: host(api, "iso-n")["isolation"] and host(api, "iso-n"), what="isolation reported")
    assert h["isolated"] is False and "no cgroups" in h["isolation"], h
    assert "THIS HOST DOES NOT ISOLATE TASKS" in agent.output()
    console = httpx.Client(base_url=srv.url, timeout=30)
    assert console.post("/login", data={"token": cluster.token}).status_code == 303
    page = console.get("/hosts/iso-n")
    assert page.status_code == 200 and "NOT ISOLATED" in page.text, page.text[:500]


@pytest.mark.skipif(os.geteuid() != 0, reason="loading a BPF program needs root")
def test_a_bpf_device_program_refuses_exactly_the_devices_it_lists(tmp_path: Path) -> None:
    """agent.cgroups' cgroup v2 device program, loaded into the kernel and attached to a
    real cgroup v2: a process in it cannot open /dev/zero (listed) and can open /dev/null
    and /dev/full (not listed)."""
    h, why = cgroups.detect_v2(f"muster-test-bpf-{os.getpid()}")
    if h is None or "devices" not in h.controllers:
        pytest.skip(f"no cgroup v2 with BPF device programs: {why or h.notes if h else why}")
    zero = os.stat("/dev/zero").st_rdev
    group = h.create("a1", cgroups.Limits(deny_devices=((os.major(zero), os.minor(zero)),)))
    try:
        out = tmp_path / "out"
        joins = "; ".join(f"echo $$ > {f}" for f in group.procs_files())
        probe = (f"{joins}; for d in /dev/null /dev/zero /dev/full; do "
                 f"if head -c 1 $d > /dev/null 2>&1; then echo open $d; else echo denied $d; fi; done > {out}")
        subprocess.run(["sh", "-c", probe], check=True, timeout=30)
        assert out.read_text().split("\n")[:3] == ["open /dev/null", "denied /dev/zero", "open /dev/full"]
    finally:
        group.kill()
        group.remove()
        cgroups.remove_paths(h.bases.values())


@needs("v1")
def test_an_agent_removes_empty_attempt_cgroups_left_behind_only_once_it_runs(tmp_path: Path) -> None:
    """Empty attempt cgroups a killed agent left are removed, but not when the agent is
    only set up (`Isolation()`): a second agent of a host that still runs, refused at its
    state directory's lock, removed the first one's attempt cgroup made but not yet holding
    its task."""
    from agent.isolation import Isolation

    name = f"muster-test-sweep-{os.getpid()}"
    h, why = cgroups.detect("v1", name)
    assert h is not None, why
    try:
        made = h.create("j1.1", cgroups.Limits(memory_mb=64))
        assert all(os.path.isdir(p) for p in made.paths)
        iso = Isolation("sweep", cgroup_mode="v1", private_dir=tmp_path / "private", cgroup_name=name)
        assert all(os.path.isdir(p) for p in made.paths)  # set up: nothing removed
        iso.remove_empty_leftovers()
        assert not any(os.path.isdir(p) for p in made.paths)
        assert [g.name for g in h.leftovers()] == []
    finally:
        cgroups.remove_paths([p for g in h.leftovers() for p in g.paths])
        cgroups.remove_paths(h.bases.values())


@ROOT_ONLY
@needs("v1", "pids")
def test_a_restarted_agent_kills_by_its_run_records_only_attempt_cgroups_of_its_own_bases(tmp_path: Path) -> None:
    """A run record's cgroups are killed and removed when they are an attempt cgroup of a
    base named as the agent's (also one made from another login session, its base
    elsewhere in the hierarchy), and left alone otherwise (found by exploring: a record a
    job had planted named any cgroup, and a restarted agent killed what was in it)."""
    import subprocess

    from agent.isolation import Isolation

    name = f"muster-test-rec-{os.getpid()}"
    h, why = cgroups.detect("v1", name)
    assert h is not None, why
    pids_base = h.bases["pids"]
    elsewhere = os.path.join(os.path.dirname(pids_base), f"muster-test-session-{os.getpid()}")
    earlier = os.path.join(elsewhere, name, "j1.1")  # an earlier agent's base, from another session
    foreign = os.path.join(elsewhere, "system-service")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for d in (earlier, foreign):
            os.makedirs(d)
            p = subprocess.Popen(["sleep", "600"])
            procs.append(p)
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(p.pid))
        iso = Isolation("rec", cgroup_mode="v1", private_dir=tmp_path / "private", cgroup_name=name)
        iso.kill_leftover([earlier, foreign])
        assert procs[0].wait(timeout=30) == -9 and not os.path.isdir(earlier)
        assert procs[1].poll() is None and os.path.isdir(foreign)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        cgroups.remove_paths([foreign, earlier, os.path.join(elsewhere, name), elsewhere])
        cgroups.remove_paths([p for g in h.leftovers() for p in g.paths])
        cgroups.remove_paths(h.bases.values())
