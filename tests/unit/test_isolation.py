"""The agent's isolation in-process (agent.isolation, agent.cgroups): what an attempt's
environment holds, which GPU devices it is denied, how the cgroup hierarchies are read
from /proc, and the limits written for an attempt. Real cgroups, users and processes are
in tests/integration/test_isolation.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent import cgroups
from agent.isolation import DEFAULT_PATH, denied_devices, gpu_devices, resolve_user, task_facts
from agent.runner import Run
from wire.errors import ConfigError
from wire.messages import AttemptState, Task

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
CONTAINER_V2 = "30 25 0:26 /kubepods/pod1 /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
PROC_CGROUP = """\
8:pids:/
4:memory:/process_api/abc
1:cpu,cpuacct:/
0::/user.slice/agent.service
"""


def task(**kw: object) -> Task:
    base: dict[str, object] = {"attempt_id": "j1.1", "job_id": "j1", "number": 1, "command": ["true"]}
    return Task.model_validate({**base, **kw})


async def _nothing(t: Task, s: AttemptState, c: int | None, tail: str, r: str) -> None:
    return None


def test_mountinfo_and_proc_cgroup_are_read(tmp_path: Path) -> None:
    (tmp_path / "mountinfo").write_text(HYBRID)
    found = cgroups.mounts(str(tmp_path / "mountinfo"))
    assert [(m.point, m.fstype) for m in found] == [
        ("/sys/fs/cgroup/cpu,cpuacct", "cgroup"), ("/sys/fs/cgroup/memory", "cgroup"),
        ("/sys/fs/cgroup/pids", "cgroup"), ("/sys/fs/cgroup/unified", "cgroup2")]
    assert {"cpu", "cpuacct"} <= found[0].options
    (tmp_path / "cgroup").write_text(PROC_CGROUP)
    own = cgroups.own_cgroups(str(tmp_path / "cgroup"))
    assert own == {"pids": "/", "memory": "/process_api/abc", "cpu": "/", "cpuacct": "/",
                   "": "/user.slice/agent.service"}
    assert cgroups.under(found[1], own["memory"]) == "/sys/fs/cgroup/memory/process_api/abc"
    # A container sees its own part of the hierarchy mounted at /sys/fs/cgroup.
    (tmp_path / "mountinfo2").write_text(CONTAINER_V2)
    (v2,) = cgroups.mounts(str(tmp_path / "mountinfo2"))
    assert cgroups.under(v2, "/kubepods/pod1") == "/sys/fs/cgroup/"
    assert cgroups.under(v2, "/kubepods/pod1/agent") == "/sys/fs/cgroup/agent"


def test_only_an_attempt_cgroup_of_the_agents_bases_is_taken_from_a_run_record(tmp_path: Path) -> None:
    """What a run record names is killed only when it is right under a base named as the
    agent's, on a cgroup mount: not a base, not a deeper cgroup, not another agent's, not
    a directory off the cgroup mounts, nor one reached through `..`."""
    (tmp_path / "mountinfo").write_text(HYBRID)
    found = cgroups.mounts(str(tmp_path / "mountinfo"))
    ours = ["/sys/fs/cgroup/memory/muster-h1/j1.1", "/sys/fs/cgroup/pids/x/muster-h1/j1.1/",
            "/sys/fs/cgroup/unified/muster-h1/j2.1"]
    others = ["/sys/fs/cgroup/memory/muster-h1", "/sys/fs/cgroup/memory/muster-h2/j1.1",
              "/sys/fs/cgroup/memory/muster-h1/j1.1/deeper", "/tmp/muster-h1/j1.1", "muster-h1/j1.1",
              "/sys/fs/cgroup/memory/muster-h1/../system.slice", "/sys/fs/cgroup/blkio/muster-h1/j1.1"]
    assert cgroups.attempt_cgroups([*ours, *others], ["muster-h1"], found) == (ours, others)
    assert cgroups.attempt_cgroups(ours, [], found) == ([], ours)


def test_cgroups_off_is_said_so() -> None:
    h, why = cgroups.detect("off", "muster-x")
    assert h is None and "off" in why


def test_v1_limits_written_for_an_attempt(tmp_path: Path) -> None:
    """The files a v1 hierarchy gets for an attempt (plain directories stand in for the
    controllers' mounts)."""
    bases = {c: str(tmp_path / c / "muster-h") for c in ("cpu", "memory", "pids", "devices")}
    for b in bases.values():
        os.makedirs(b)
    (tmp_path / "memory" / "muster-h" / "j1.1").mkdir()
    (tmp_path / "memory" / "muster-h" / "j1.1" / "memory.memsw.limit_in_bytes").write_text("")
    h = cgroups.Hierarchy(1, bases, tuple(bases))
    g = h.create("j1.1", cgroups.Limits(cpus=2.5, memory_mb=64, pids=100, deny_devices=((195, 1),)))
    at = {c: Path(b) / "j1.1" for c, b in bases.items()}
    assert (at["cpu"] / "cpu.cfs_quota_us").read_text() == "250000"
    assert (at["cpu"] / "cpu.cfs_period_us").read_text() == "100000"
    assert (at["memory"] / "memory.limit_in_bytes").read_text() == str(64 * 1024 * 1024)
    assert (at["memory"] / "memory.memsw.limit_in_bytes").read_text() == str(64 * 1024 * 1024)
    assert (at["pids"] / "pids.max").read_text() == "100"
    assert (at["devices"] / "devices.deny").read_text() == "c 195:1 rwm"
    assert g.memory == str(at["memory"]) and len(g.procs_files()) == 4
    # No limit asked, none written; a tiny CPU share still gets the kernel's minimum quota.
    g2 = h.create("j2.1", cgroups.Limits(cpus=0.001))
    assert (Path(bases["cpu"]) / "j2.1" / "cpu.cfs_quota_us").read_text() == "1000"
    assert not (Path(bases["memory"]) / "j2.1" / "memory.limit_in_bytes").exists()
    assert {x.name for x in h.leftovers()} == {"j1.1", "j2.1"} and g2.oom_kills() == 0


def test_v2_limits_written_for_an_attempt(tmp_path: Path) -> None:
    base = tmp_path / "muster-h"
    base.mkdir()
    h = cgroups.Hierarchy(2, {"": str(base)}, ("cpu", "memory", "pids"))
    (base / "j1.1").mkdir()
    (base / "j1.1" / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    g = h.create("j1.1", cgroups.Limits(cpus=1, memory_mb=128, pids=50))
    d = base / "j1.1"
    assert (d / "cpu.max").read_text() == "100000 100000"
    assert (d / "memory.max").read_text() == str(128 * 1024 * 1024)
    assert (d / "memory.oom.group").read_text() == "1"
    assert (d / "pids.max").read_text() == "50"
    assert g.oom_kills() == 1
    assert cgroups.Hierarchy(2, {"": str(base)}, ()).limits_missing() == ["cpu", "memory", "pids", "devices"]
    assert h.limits_missing() == ["devices"]  # no BPF device program on this host


def test_gpu_device_files_are_found_and_the_others_denied(tmp_path: Path) -> None:
    for n, target in ((0, "/dev/null"), (1, "/dev/zero"), (2, "/dev/full")):
        (tmp_path / f"nvidia{n}").symlink_to(target)
    (tmp_path / "nvidiactl").symlink_to("/dev/null")  # a control device: never denied
    (tmp_path / "nvidia9").write_text("")  # not a device
    devices = gpu_devices(str(tmp_path))
    assert set(devices) == {0, 1, 2}
    null, zero, full = (os.stat(p).st_rdev for p in ("/dev/null", "/dev/zero", "/dev/full"))
    assert devices[1] == (os.major(zero), os.minor(zero))
    assert set(denied_devices([1], devices)) == {(os.major(null), os.minor(null)), (os.major(full), os.minor(full))}
    # With NVML's minor numbers: GPU index 1 is /dev/nvidia2.
    assert (os.major(full), os.minor(full)) not in denied_devices([1], devices, {0: 0, 1: 2, 2: 1})


class _Recording(cgroups.Hierarchy):
    """A v1 hierarchy with the devices controller that only records the limits asked."""

    def __init__(self) -> None:
        super().__init__(1, {}, ("devices",))
        self.limits: list[cgroups.Limits] = []

    def create(self, name: str, limits: cgroups.Limits) -> cgroups.Group:
        self.limits.append(limits)
        return cgroups.Group(name, 1, [], None)


def test_a_mig_task_may_open_its_instances_parent_gpu(tmp_path: Path) -> None:
    """Found by a review: a MIG task has no GPU index, only its instances, so every
    /dev/nvidiaN was denied to it, its instance's parent GPU's too, and CUDA saw no device
    (every MIG job failed where device files are limited). The parent of each of its
    instances (from the agent's GPU inventory) stays open, by its minor number where known;
    /dev/nvidia-caps is never denied."""
    from agent.isolation import Isolation

    dev = tmp_path / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    for n, target in ((0, "/dev/null"), (1, "/dev/zero"), (2, "/dev/full")):
        (dev / f"nvidia{n}").symlink_to(target)
    (dev / "nvidia-caps" / "nvidia-cap21").symlink_to("/dev/random")
    null, zero, full, rnd = (os.stat(p).st_rdev for p in ("/dev/null", "/dev/zero", "/dev/full", "/dev/random"))
    rdev = {n: (os.major(r), os.minor(r)) for n, r in enumerate((null, zero, full, rnd))}
    for minors, parent_dev in ((None, 1), ({0: 0, 1: 2, 2: 1}, 2)):
        iso = Isolation("mg", cgroup_mode="off", run_as=str(os.geteuid()), private_dir=tmp_path / "private",
                        work_root=tmp_path / "work", dev_dir=str(dev), gpu_minors=minors,
                        mig_parents={"MIG-a": 1, "MIG-b": 1, "MIG-c": 0})
        rec = iso.hierarchy = _Recording()
        launch = iso.prepare(task(mig=["MIG-a"]), {})
        Isolation.release(launch)
        denied = set(rec.limits[-1].deny_devices)
        assert rdev[parent_dev] not in denied and rdev[3] not in denied
        assert denied == {rdev[n] for n in (0, 1, 2) if n != parent_dev}
    # An instance of no GPU this host knows opens none.
    Isolation.release(iso.prepare(task(mig=["MIG-z"]), {}))
    assert set(rec.limits[-1].deny_devices) == {rdev[0], rdev[1], rdev[2]}


def test_the_agent_gives_its_isolation_the_parents_of_its_mig_instances(tmp_path: Path) -> None:
    """The agent tells its isolation which GPU each MIG instance of its inventory is on."""
    from agent.agent import Agent, AgentConfig

    agent = Agent(AgentConfig(nats_url="nats://127.0.0.1:4222", host_id="h1", state_dir=tmp_path / "state",
                              simulate_gpus="3xH100,mig=1-2:2*3g.40gb", cgroups="off", run_as=str(os.geteuid())))
    inv = agent.gpus.inventory()
    assert agent.isolation.mig_parents == {m.uuid: g.index for g in inv for m in g.mig}
    assert sorted(agent.isolation.mig_parents.values()) == [1, 1, 2, 2]
    agent.isolation.close()


@given(assigned=st.sets(st.integers(0, 15)), present=st.sets(st.integers(0, 15)))
def test_an_attempt_is_denied_exactly_the_gpus_it_was_not_given(assigned: set[int], present: set[int]) -> None:
    devices = {n: (195, n) for n in present}
    denied = denied_devices(sorted(assigned), devices)
    assert set(denied) == {(195, n) for n in present - assigned}


def test_an_attempts_environment_holds_nothing_of_the_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUSTER_NATS_CREDS", "/etc/muster/agent.nk")
    monkeypatch.setenv("MUSTER_TOKEN", "mst_secret")
    t = task(env={"MY_VAR": "1", "MUSTER_JOB_ID": "forged", "MUSTER_GANG_TASK": "2", "MUSTER_GANG_SIZE": "4",
                  "MUSTER_GANG_HOSTS": "a,b,c,d"}, gpu_indices=[3, 5])
    env = Run(t, _nothing, host_id="h7").env()
    assert env == {
        "PATH": DEFAULT_PATH, "MY_VAR": "1", "CUDA_VISIBLE_DEVICES": "3,5", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "MUSTER_JOB_ID": "j1", "MUSTER_ATTEMPT_ID": "j1.1", "MUSTER_ATTEMPT": "1", "MUSTER_TASK_INDEX": "2",
        "MUSTER_GANG_TASK": "2", "MUSTER_GANG_SIZE": "4", "MUSTER_GANG_HOSTS": "a,b,c,d", "MUSTER_HOST_ID": "h7",
        "MUSTER_PREEMPT_DEADLINE": "10",  # the agent's kill grace: the task's own grace_s is unset
    }
    # A job may set its own PATH.
    assert Run(task(env={"PATH": "/opt/bin"}), _nothing).env()["PATH"] == "/opt/bin"
    assert task_facts(task(), "h")["MUSTER_GANG_SIZE"] == "1"


def test_the_task_user_is_checked() -> None:
    with pytest.raises(ConfigError, match="no user"):
        resolve_user("no-such-user-here")
    if os.geteuid() == 0:
        user, warning = resolve_user("root")
        assert user.uid == 0 and "root" in warning
        user, warning = resolve_user("nobody")
        assert user.name == "nobody" and user.switches and warning == ""
    else:
        user, warning = resolve_user(None)
        assert user.uid == os.geteuid() and not user.switches and "own user" in warning
        with pytest.raises(ConfigError, match="root"):
            resolve_user("root")


def test_each_job_runs_as_a_uid_of_its_own() -> None:
    """A uid per job (found by exploring: every task of a host ran as one task user, so a
    job read another's `env` and working directory through /proc): the same for a job on
    every host and try, its own group, the task user's other groups kept."""
    from agent.isolation import DEFAULT_JOB_UIDS, Isolation, TaskUser, job_uid, parse_job_uids

    assert parse_job_uids(None) == parse_job_uids("") == DEFAULT_JOB_UIDS
    assert parse_job_uids("off") is None and parse_job_uids("5000000:10") == (5_000_000, 10)
    for bad in ("5000000", "x:1", "10:5", "5000000:0", f"{2**31 - 5}:10"):
        with pytest.raises(ConfigError, match="job-uids"):
            parse_job_uids(bad)
    uids = [job_uid(f"j{i}", DEFAULT_JOB_UIDS) for i in range(200)]
    assert all(3_000_000 <= u < 4_000_000 for u in uids) and len(set(uids)) == 200
    assert job_uid("j7", DEFAULT_JOB_UIDS) == job_uid("j7", DEFAULT_JOB_UIDS)
    iso = Isolation.__new__(Isolation)  # (only what ids_for reads)
    iso.user = TaskUser("muster-task", 999, 999, (44, 999))
    iso.job_uids = DEFAULT_JOB_UIDS
    t = task()
    u = job_uid(t.job_id, DEFAULT_JOB_UIDS)
    assert iso.ids_for(t) == (u, u, [u, 44])
    assert iso.ids_for(t, shared_user=True) == (999, 999, [44, 999])  # a GPU share under MPS
    iso.job_uids = None
    assert iso.ids_for(t) == (999, 999, [44, 999])


def test_a_job_whose_client_chose_its_id_runs_as_a_uid_the_leader_drew() -> None:
    """Over NATS a client chooses its jobs' ids: an id chosen so that its uid is another
    job's ran as that job, and read its env (found by exploring, with a million hashes
    tried in a second). The leader draws a nonce for each submission it reads (a client's
    own is replaced), the job's uid key is made from it, and its tasks run as the uid of
    that key: the same id in two submissions runs as two uids."""
    from agent.isolation import DEFAULT_JOB_UIDS, Isolation, TaskUser, job_uid
    from server.scheduling.planner import plan_cycle
    from server.scheduling.scheduler import Scheduler
    from tests.unit.test_ha import Lease, Msg
    from tests.unit.test_planner import NOW, TERM, World
    from wire.messages import SubmitRequest, encode

    sched = Scheduler(None, World().state, Lease())  # type: ignore[arg-type]

    def read(nonce: str) -> SubmitRequest:
        m = Msg(7, NOW)
        m.subject, m.data = "muster.submit.mallory", encode(SubmitRequest(  # type: ignore[attr-defined]
            user="mallory", nonce=nonce, jobs=[{"id": "mallory000000539495", "name": "m", "command": ["id"]}]))
        req = sched._decode_submission(m)  # type: ignore[arg-type]
        assert req is not None
        return req

    uids = set()
    for nonce in ("chosen", "chosen"):
        req = read(nonce)
        assert req.nonce not in ("", "chosen")
        w = World()
        w.host("h1")
        plan = plan_cycle(w.state, reports=[], commands=[], now=NOW, term=TERM, submissions=[req])
        job = plan.jobs["mallory000000539495"]
        [t] = [t for a in plan.allocs.values() for t in a.tasks]
        assert job.uid_key and t.uid_key == job.uid_key
        iso = Isolation.__new__(Isolation)  # (only what ids_for reads)
        iso.user, iso.job_uids = TaskUser("muster-task", 999, 999, (999,)), DEFAULT_JOB_UIDS
        uid = iso.ids_for(t)[0]
        assert uid == job_uid(job.uid_key, DEFAULT_JOB_UIDS) != job_uid(job.id, DEFAULT_JOB_UIDS)
        uids.add(uid)
    assert len(uids) == 2


def test_a_job_stored_through_the_api_runs_every_try_as_the_uid_of_a_secret_key() -> None:
    """Found by exploring: a job submitted through the API ran as the uid of its public id,
    so an operator could submit held jobs, reckon each one's uid offline, keep one that
    shared a running job's uid (one of 1,000 in 414 ids) and cancel the rest. The server
    draws a secret key for every job it stores; each try is placed with it, and runs as its
    uid, the same across retries (a checkpoint one try wrote, the next can read). A job
    stored before uid keys (none) runs as the uid of its id, as it did."""
    from agent.isolation import DEFAULT_JOB_UIDS, Isolation, TaskUser, job_uid
    from server.operations.submissions import new_uid_key
    from tests.factories import job as make_job
    from tests.factories import job_spec
    from tests.unit.test_planner import NOW, World, report
    from wire.messages import AttemptState, encode
    from wire.records import Record

    keys = {new_uid_key() for _ in range(100)}
    assert len(keys) == 100 and all(len(k) == 32 for k in keys)
    iso = Isolation.__new__(Isolation)  # (only what ids_for reads)
    iso.user, iso.job_uids = TaskUser("muster-task", 999, 999, (999,)), DEFAULT_JOB_UIDS
    w = World(interval_s=3600.0)  # (the host stays HEALTHY over these minutes)
    w.host("h1")
    key = new_uid_key()
    for job_id, uid_key in (("j1", key), ("old", "")):
        rec = make_job(job_id, spec=job_spec(job_id, gpus=1), submitted_at=NOW - 100, uid_key=uid_key)
        w.state.apply_state_record(Record(f"job.{job_id}", next(w.rev), encode(rec)))
    w.cycle(now=NOW)
    uids = []
    for n in (1, 2, 3):
        [t] = [t for t in w.tasks("h1") if t.job_id == "j1" and not t.stop]
        assert t.attempt_id == f"j1.{n}" and t.uid_key == key
        uids.append(iso.ids_for(t)[0])
        w.cycle(reports=[report(w, "j1", AttemptState.LOST)], now=NOW + 10 * n)
        w.cycle(now=NOW + 10 * n + 5)
    assert uids == [job_uid(key, DEFAULT_JOB_UIDS)] * 3 and uids[0] != job_uid("j1", DEFAULT_JOB_UIDS)
    [old] = [t for t in w.tasks("h1") if t.job_id == "old"]
    assert old.uid_key == "" and iso.ids_for(old)[0] == job_uid("old", DEFAULT_JOB_UIDS)


def test_an_attempts_directory_is_removed_however_deep_the_task_made_it(tmp_path: Path) -> None:
    """Python's rmtree raises RecursionError past about a thousand levels, which its
    ignore_errors does not catch (found by exploring: a task's deep directory left its try
    never reported, its GPUs held, and the agent unable to start again), or runs out of
    file handles first and leaves the tree (a review)."""
    import resource
    import shutil
    import subprocess

    from agent.isolation import Isolation, Launch, remove_tree

    def deep(root: Path) -> Path:
        root.mkdir()
        fd = os.open(root, os.O_RDONLY)
        try:
            for _ in range(1500):
                os.mkdir("d", dir_fd=fd)
                nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
                os.close(fd)
                fd = nxt
        finally:
            os.close(fd)
        return root

    try:
        with pytest.raises(RecursionError):
            shutil.rmtree(deep(tmp_path / "plain"), ignore_errors=True)
        remove_tree(tmp_path / "plain")
        assert not (tmp_path / "plain").exists()
        work = deep(tmp_path / "j1.1")
        Isolation.release(Launch(["x"], None, work))
        assert not work.exists()
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (600, hard))
        try:
            remove_tree(deep(tmp_path / "j2.1"))
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert not (tmp_path / "j2.1").exists()
    finally:  # (a deep tree left behind would break pytest's own removal of old temporary directories)
        subprocess.run(["rm", "-rf", "--", str(tmp_path)], check=False)


def test_output_that_is_not_utf8_keeps_its_byte_count_so_follow_shows_every_new_byte() -> None:
    """A byte that is not UTF-8 is one "?" in the tail (as U+FFFD it was three bytes for
    one, and `muster job logs -f` dropped that much real output before each: found by
    exploring)."""
    from server.cli.jobs import new_output

    run = Run(Task(attempt_id="j.1", job_id="j", number=1, command=["x"]), None)  # type: ignore[arg-type]
    first = b"line one\n"
    run._tail.extend(first)  # noqa: SLF001 - as the reader adds what the process wrote
    before, before_bytes = run.tail, len(first)
    more = b"IMPORTANT: checkpoint saved\n" + bytes(range(0x80, 0x8a)) + b"\n\xe2\x82"
    run._tail.extend(more)  # noqa: SLF001
    now = run.tail
    assert len(now.encode()) == len(first) + len(more)
    shown = new_output(before, now, before_bytes, len(first) + len(more))
    assert shown == "IMPORTANT: checkpoint saved\n" + "?" * 10 + "\n??"


def test_all_attempts_together_are_kept_below_the_hosts_process_ids(tmp_path: Path) -> None:
    """The attempts' base gets a pids.max of the kernel's pid_max less a quarter of it (at
    least 1,024 kept), so that several fork bombs, each within its attempt's limit, cannot
    take every process id of the host; nothing is written without the pids controller."""
    from agent.isolation import attempts_pids_cap

    pid_max = tmp_path / "pid_max"
    for have, cap in ((32768, 24576), (4194304, 3145728), (2000, 976)):
        pid_max.write_text(f"{have}\n")
        assert attempts_pids_cap(str(pid_max)) == cap
    assert attempts_pids_cap(str(tmp_path / "none")) == 0
    v1 = {c: str(tmp_path / "v1" / c / "muster-h") for c in ("cpu", "pids")}
    for b in v1.values():
        os.makedirs(b)
    cgroups.Hierarchy(1, v1, tuple(v1)).cap_pids(24576)
    assert (Path(v1["pids"]) / "pids.max").read_text() == "24576"
    assert not (Path(v1["cpu"]) / "pids.max").exists()
    v2 = tmp_path / "v2" / "muster-h"
    v2.mkdir(parents=True)
    cgroups.Hierarchy(2, {"": str(v2)}, ("cpu", "memory")).cap_pids(24576)
    assert not (v2 / "pids.max").exists()  # no pids controller there
    cgroups.Hierarchy(2, {"": str(v2)}, ("cpu", "memory", "pids")).cap_pids(24576)
    assert (v2 / "pids.max").read_text() == "24576"


def test_the_launcher_says_which_failures_are_the_hosts(tmp_path: Path) -> None:
    """A cgroup it cannot join is the host's want (the try is not the job's failure); a
    command that does not exist is the job's."""
    import json
    import subprocess
    import sys

    from agent.isolation import LAUNCHER
    from agent.runner import HOST_FAILURE

    def launch(spec: dict[str, object]) -> str:
        path = tmp_path / "spec.json"
        path.write_text(json.dumps(spec))
        r, w = os.pipe()
        p = subprocess.run([sys.executable, "-I", "-S", LAUNCHER, str(path), str(w)], pass_fds=(w,), check=False)
        os.close(w)
        try:
            return os.read(r, 4096).decode()
        finally:
            os.close(r)
            assert p.returncode == 127

    got = launch({"cgroup_procs": [str(tmp_path / "gone" / "cgroup.procs")], "command": ["true"], "env": {}})
    assert got.startswith(HOST_FAILURE + "cannot join cgroup "), got
    got = launch({"cgroup_procs": [], "command": ["/no/such/program"], "env": {}})
    assert got == "cannot start '/no/such/program': no such program", got
    # Said in words (found by exploring: "No such file or directory: b'/bin/x'", the last
    # directory of PATH tried; a script whose interpreter is missing said to be missing).
    got = launch({"cgroup_procs": [], "command": ["no-such-program-x"], "env": {"PATH": "/usr/bin:/bin"}})
    assert got == "cannot start 'no-such-program-x': no such program on its PATH (/usr/bin:/bin)", got
    script = tmp_path / "s.sh"
    script.write_text("#!/no/such/shell -e\necho hi\n")
    script.chmod(0o755)
    got = launch({"cgroup_procs": [], "command": [str(script)], "env": {}})
    assert got == f"cannot start {str(script)!r}: its interpreter '/no/such/shell' (its #! line) was not found", got
    script.chmod(0o644)
    got = launch({"cgroup_procs": [], "command": [str(script)], "env": {}})
    assert got == f"cannot start {str(script)!r}: Permission denied", got


def test_a_task_never_starts_in_the_agents_working_directory(tmp_path: Path) -> None:
    """Found by exploring: `/proc/self/cwd` as a job's `cwd` (an absolute path, which the
    validation takes) started the task in the agent's own working directory. The launcher
    leaves it before anything of the job's."""
    import json
    import subprocess
    import sys

    from agent.isolation import LAUNCHER

    agents = tmp_path / "agents-own"
    agents.mkdir()
    out = tmp_path / "cwd"
    spec = tmp_path / "spec.json"
    write_cwd = f"import os; open({str(out)!r}, 'w').write(os.getcwd())"
    spec.write_text(json.dumps({"cgroup_procs": [], "cwd": "/proc/self/cwd", "env": {},
                                "command": [sys.executable, "-c", write_cwd]}))
    r, w = os.pipe()
    p = subprocess.run([sys.executable, "-I", "-S", LAUNCHER, str(spec), str(w)], pass_fds=(w,), cwd=agents,
                       check=False)
    os.close(w)
    os.close(r)
    assert p.returncode == 0 and out.read_text() == "/"


def test_a_work_root_removed_under_the_agent_is_made_again(tmp_path: Path) -> None:
    """A temporary directory's cleaner removed the agent's work root: every try then failed
    to start (found by exploring); the next one makes it again."""
    import shutil

    from agent.isolation import Isolation

    root = tmp_path / "work"
    iso = Isolation("wr", cgroup_mode="off", private_dir=tmp_path / "private", work_root=root)
    shutil.rmtree(root)
    launch = iso.prepare(Task(attempt_id="j.1", job_id="j", number=1, command=["true"]), {})
    assert launch.work_dir is not None and launch.work_dir.is_dir() and launch.work_dir.parent == root
    assert root.stat().st_mode & 0o777 == 0o711
    Isolation.release(launch)


@pytest.mark.skipif(os.geteuid() != 0, reason="gives directories to another user")
def test_a_work_root_made_by_someone_else_is_never_taken_over(tmp_path: Path) -> None:
    """Found by exploring: once a cleaner removed the agent's work root, a job made it again
    at the same path (in every task's environment), open to all; the agent used it, and the
    job moved another user's attempt directory aside and put its own in its place. The
    agent's own temporary root is replaced by a new one of another name; a root the operator
    named fails the try when it is not the agent's, and is made again only where nothing is."""
    import shutil

    from agent.isolation import Isolation

    other = 65534  # nobody
    t = Task(attempt_id="j.1", job_id="j", number=1, command=["true"])
    own = Isolation("wr", cgroup_mode="off", private_dir=tmp_path / "private")
    try:
        first = own.work_root
        shutil.rmtree(first)
        first.mkdir(mode=0o777)
        os.chmod(first, 0o777)
        os.chown(first, other, other)  # a job's, open to all
        launch = own.prepare(t, {})
        assert own.work_root != first and launch.work_dir is not None and launch.work_dir.parent == own.work_root
        st = own.work_root.stat()
        assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o711 and os.listdir(first) == []
        Isolation.release(launch)
        # A link in its place, to a directory of the agent's own, is not taken either.
        second = own.work_root
        shutil.rmtree(second)
        (tmp_path / "elsewhere").mkdir(mode=0o711)
        second.symlink_to(tmp_path / "elsewhere")
        launch = own.prepare(t, {})
        assert own.work_root not in (first, second) and list((tmp_path / "elsewhere").iterdir()) == []
        Isolation.release(launch)
        second.unlink()
    finally:
        own.close()
        shutil.rmtree(first, ignore_errors=True)

    root = tmp_path / "work"
    named = Isolation("wr", cgroup_mode="off", private_dir=tmp_path / "private", work_root=root)
    os.chown(root, other, other)
    with pytest.raises(OSError, match="is not the agent's"):
        named.prepare(t, {})
    assert list(root.iterdir()) == []
    os.chown(root, os.geteuid(), os.getegid())
    os.chmod(root, 0o777)
    with pytest.raises(OSError, match="is not the agent's"):
        named.prepare(t, {})
    os.chmod(root, 0o711)
    Isolation.release(named.prepare(t, {}))
    # A link at its path: the operator's own is followed, one someone else made is not (a review).
    import shutil as _shutil

    _shutil.rmtree(root)
    target = tmp_path / "target"
    target.mkdir(mode=0o711)
    root.symlink_to(target)
    Isolation.release(named.prepare(t, {}))
    os.chown(root, other, other, follow_symlinks=False)
    with pytest.raises(OSError, match="is not the agent's"):
        named.prepare(t, {})
    # At the agent's start, a named root another user made (or may write to) is refused
    # (found by exploring: it was taken, made 0711, and then every try failed).
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, other, other)
    with pytest.raises(ConfigError, match="not this user's directory"):
        Isolation("wr", cgroup_mode="off", private_dir=tmp_path / "private", work_root=theirs)
    assert theirs.stat().st_mode & 0o777 != 0o711  # nothing changed of it


@pytest.mark.skipif(os.geteuid() != 0, reason="gives the attempt's directory to the job's uid")
def test_a_task_under_a_uid_of_its_jobs_own_is_told_a_name_of_its_own(tmp_path: Path) -> None:
    """Found by exploring: every job's tasks were told they were the task user (`USER`,
    `LOGNAME`), so a cache a tool keys by the user's name (`/tmp/<tool>_<user>`) was one
    for all jobs, and what one job planted there another ran. Under a uid of its job's own
    a task is told a name of that uid's own; the task user's own tasks keep its name."""
    import json

    from agent.isolation import DEFAULT_JOB_UIDS, Isolation, TaskUser, job_uid

    iso = Isolation("nm", cgroup_mode="off", private_dir=tmp_path / "private", work_root=tmp_path / "work")
    iso.user, iso.job_uids = TaskUser("muster-task", 999, 999, (999,)), DEFAULT_JOB_UIDS

    def told(t: Task, shared_user: bool = False) -> tuple[str, str]:
        launch = iso.prepare(t, {}, shared_user=shared_user)
        try:
            assert launch.spec is not None
            env = json.loads(launch.spec.read_text())["env"]
        finally:
            Isolation.release(launch)
        return env["USER"], env["LOGNAME"]

    a, b = (Task(attempt_id=f"{j}.1", job_id=j, number=1, command=["true"]) for j in ("ja", "jb"))
    ua, ub = job_uid("ja", DEFAULT_JOB_UIDS), job_uid("jb", DEFAULT_JOB_UIDS)
    assert told(a) == (f"muster-task-{ua}", f"muster-task-{ua}") and told(b) == (f"muster-task-{ub}",) * 2
    assert told(a, shared_user=True) == ("muster-task", "muster-task")
    iso.job_uids = None
    assert told(a) == ("muster-task", "muster-task")


def test_a_launcher_that_stays_the_tasks_parent_keeps_its_end_and_leaves_it_its_own_group(tmp_path: Path) -> None:
    """With an exit file the launcher forks and stays the task's parent, to keep its wait
    status for an agent that died meanwhile. The task still leads a session and process
    group of its own (a review: `kill -- -$$` in its script found no such group), the
    launcher names it first on the status pipe, ignores what the task (of the same user)
    sends it (a review: SIGUSR1 to the group killed the launcher, and the try with it),
    ends as the task did, and the task starts with SIGPIPE and SIGXFSZ as the system has
    them (Python's launcher ignored both, and an exec passed that on)."""
    import json
    import subprocess
    import sys

    from agent.isolation import LAUNCHER

    out, exit_file = tmp_path / "out", tmp_path / "exit"
    script = ("import os, signal; os.kill(os.getppid(), signal.SIGUSR1); os.kill(os.getppid(), signal.SIGHUP); "
              f"open({str(out)!r}, 'w').write(f'{{os.getpid()}} {{os.getpgid(0)}} {{os.getsid(0)}}'); "
              "raise SystemExit(3)")

    def launch(command: list[str]) -> tuple[int, str]:
        spec = tmp_path / "spec.json"
        spec.write_text(json.dumps({"cgroup_procs": [], "cwd": "/", "env": {}, "command": command,
                                    "exit_file": str(exit_file)}))
        r, w = os.pipe()
        p = subprocess.Popen([sys.executable, "-I", "-S", LAUNCHER, str(spec), str(w)], pass_fds=(w,),
                             start_new_session=True)
        os.close(w)
        said = b""
        while chunk := os.read(r, 4096):
            said += chunk
        os.close(r)
        return p.wait(30), said.decode()

    code, said = launch([sys.executable, "-c", script])
    pid, pgid, sid = (int(x) for x in out.read_text().split())
    assert said == f"pid: {pid}\n" and pgid == sid == pid, (said, pid, pgid, sid)
    assert code == 3 and int(exit_file.read_text()) == 3 << 8
    code, _ = launch(["sh", "-c", f"grep SigIgn /proc/$$/status > {out}"])
    ignored = int(out.read_text().split()[1], 16)
    assert code == 0 and ignored & ((1 << (13 - 1)) | (1 << (25 - 1))) == 0, hex(ignored)  # SIGPIPE, SIGXFSZ
    # Killed by a signal: the launcher ends by the same one, and says so in its file.
    code, _ = launch([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
    assert code == -15 and os.WIFSIGNALED(int(exit_file.read_text()))
    # A command that cannot start: the failure after the task's pid, exit 127, as before.
    code, said = launch(["/no/such/program"])
    assert code == 127 and said.startswith("pid: ") and "cannot start '/no/such/program'" in said, said


def test_the_launcher_records_the_try_before_anything_of_the_job_runs(tmp_path: Path) -> None:
    """Found by exploring: an agent killed (or frozen) after it started a try's launcher and
    before its own record of the running try left the task running unknown to its
    watchdog and to the next agent, beside its replacement. The launcher writes the record
    (the task's pid and start, its own, the cgroups and work directory, paths with spaces
    read back whole) before the task goes on; one it cannot write stops the try before it
    runs, as the host's want; and a task whose launcher dies before saying go never runs."""
    import json
    import signal
    import subprocess
    import sys
    import time

    from agent.isolation import LAUNCHER
    from agent.watchdog import read_run, run_record, start_time
    from tests.conftest import proc_stat

    fifo, ran, exit_file = tmp_path / "procs", tmp_path / "ran", tmp_path / "exit"
    os.mkfifo(fifo)
    work = tmp_path / "work dir" / "a.1"

    def launch(record_path: Path, procs: list[str]) -> tuple[subprocess.Popen[bytes], int]:
        spec = tmp_path / "spec.json"
        line = run_record("%PID%", "%START%", False, "%SUP%", "%SUPSTART%", ["/sys/fs/cgroup/x y/a.1"], str(work))
        spec.write_text(json.dumps({"cgroup_procs": procs, "cwd": "/", "env": {}, "command": ["touch", str(ran)],
                                    "exit_file": str(exit_file),
                                    "run_record": {"path": str(record_path), "line": line}}))
        r, w = os.pipe()
        p = subprocess.Popen([sys.executable, "-I", "-S", LAUNCHER, str(spec), str(w)], pass_fds=(w,),
                             start_new_session=True)
        os.close(w)
        return p, r

    record = tmp_path / "runs" / "a.1"
    record.parent.mkdir()
    p, r = launch(record, [str(fifo)])  # the task is held where it joins its cgroup
    deadline = time.monotonic() + 30
    while not record.exists() or not record.read_text().endswith("\n"):
        assert time.monotonic() < deadline and p.poll() is None, "no record"
        time.sleep(0.01)
    rec = read_run(record.read_text())
    assert rec.launcher == (p.pid, start_time(p.pid)) and rec.pid != p.pid and rec.start == start_time(rec.pid)
    assert rec.cgroups == ["/sys/fs/cgroup/x y/a.1"] and rec.work_dir == str(work) and not rec.keep
    assert not ran.exists()
    with open(fifo) as f:  # it goes on
        assert f.read() == str(rec.pid)
    assert p.wait(30) == 0 and ran.exists()
    while os.read(r, 4096):
        pass
    os.close(r)
    # Its record cannot be written: the task never runs, and the failure is the host's.
    ran.unlink()
    p, r = launch(tmp_path / "gone" / "a.1", [])
    said = b""
    while chunk := os.read(r, 4096):
        said += chunk
    os.close(r)
    assert p.wait(30) == 127 and said.decode().startswith("host: cannot record the try"), said
    assert not ran.exists()
    # Its launcher dies before it says go (held here writing the record, into a FIFO): the
    # task ends without running anything.
    held = tmp_path / "held"
    os.mkfifo(held)
    p, r = launch(held, [])

    def children() -> list[int]:
        out = []
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and int(proc_stat(int(d.name))[1]) == p.pid:
                    out.append(int(d.name))
            except (OSError, ValueError, IndexError):
                pass
        return out

    while not (kids := children()):
        assert time.monotonic() < deadline + 30 and p.poll() is None, "no task process"
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait(30)
    while any(Path(f"/proc/{k}").exists() and proc_stat(k)[0] != "Z" for k in kids):
        assert time.monotonic() < deadline + 60, "the task's process goes on"
        time.sleep(0.01)
    os.close(r)
    assert not ran.exists()


def test_a_cpu_share_under_a_hundredth_of_a_core_gets_a_longer_period() -> None:
    """Found by exploring: 0.001 core (the least a job may ask) got the kernel's least
    quota, 1 ms in 100 ms: a hundredth of a core. The period grows up to a second."""
    from agent.cgroups import cpu_quota

    assert cpu_quota(0) == (0, 0)
    assert cpu_quota(1.5) == (150_000, 100_000) and cpu_quota(0.01) == (1_000, 100_000)
    assert cpu_quota(0.001) == (1_000, 1_000_000)  # a thousandth
    quota, period = cpu_quota(0.004)
    assert quota / period == 0.004 and quota >= 1_000


def test_whether_a_cgroup_reached_its_own_memory_limit(tmp_path: Path) -> None:
    """What tells an OOM kill by the task's own limit from one by an enclosing group's or
    the host's (agent.cgroups.Group.reached_limit), from the counters as the kernel keeps
    them; when they cannot tell, the task's own limit is blamed, as before."""
    from agent.cgroups import MB, Group

    def v1(failcnt: int, peak: int, limit: int) -> bool:
        for k, v in (("memory.failcnt", failcnt), ("memory.max_usage_in_bytes", peak),
                     ("memory.limit_in_bytes", limit)):
            (tmp_path / k).write_text(f"{v}\n")
        return Group("a", 1, [str(tmp_path)], str(tmp_path)).reached_limit()

    assert v1(3, 10 * MB, 500 * MB) and v1(0, 500 * MB, 500 * MB)
    assert not v1(0, 150 * MB, 500 * MB)  # the peak well under its limit: not its own
    v2dir = tmp_path / "v2"
    v2dir.mkdir()

    def v2(events_max: int, peak: int | None, limit: str) -> bool:
        (v2dir / "memory.events").write_text(f"low 0\nhigh 0\nmax {events_max}\noom 1\noom_kill 1\n")
        (v2dir / "memory.max").write_text(limit + "\n")
        if peak is None:
            (v2dir / "memory.peak").unlink(missing_ok=True)
        else:
            (v2dir / "memory.peak").write_text(f"{peak}\n")
        return Group("a", 2, [str(v2dir)], str(v2dir)).reached_limit()

    assert v2(2, None, str(500 * MB)) and v2(0, 500 * MB, str(500 * MB))
    assert not v2(0, 150 * MB, str(500 * MB))
    assert v2(0, None, str(500 * MB))  # no peak to tell by: its own, as before


def test_the_launcher_runs_only_a_spec_that_is_the_agents_own(tmp_path: Path) -> None:
    """Its spec runs as root until the switch of user: a link, or a file others may write
    to, is refused as the host's failure, and nothing of it runs (found by exploring: a
    job that had made the launchers' directory put its own spec in place of another job's,
    and its command ran as root)."""
    import json
    import subprocess
    import sys

    from agent.isolation import LAUNCHER
    from agent.runner import HOST_FAILURE

    mark = tmp_path / "ran"
    spec = {"cgroup_procs": [], "command": ["touch", str(mark)], "env": {"PATH": "/usr/bin:/bin"}}

    def launch(path: Path) -> str:
        r, w = os.pipe()
        subprocess.run([sys.executable, "-I", "-S", LAUNCHER, str(path), str(w)], pass_fds=(w,), check=False)
        os.close(w)
        try:
            return os.read(r, 4096).decode()
        finally:
            os.close(r)

    real = tmp_path / "real.json"
    real.write_text(json.dumps(spec))
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert launch(link).startswith(HOST_FAILURE + "cannot read the launch spec")
    os.chmod(real, 0o666)
    assert launch(real).startswith(HOST_FAILURE + "cannot read the launch spec")
    assert not mark.exists()
    os.chmod(real, 0o600)
    assert launch(real) == "" and mark.exists()  # the agent's own: it runs


def test_a_run_record_touches_only_the_agents_attempt_directories_and_cgroups(tmp_path: Path) -> None:
    """What a restarted agent removes and kills by its run records: attempt directories in
    its work root or the host's earlier temporary ones, cgroups under its bases; a record
    naming anything else leaves it alone."""
    import tempfile

    from agent.isolation import Isolation

    iso = Isolation("rr", cgroup_mode="off", private_dir=tmp_path / "private", work_root=tmp_path / "work")
    victim = tmp_path / "elsewhere" / "j.1"
    victim.mkdir(parents=True)
    iso.remove_leftover_dir(victim, "j.1")
    assert victim.is_dir()
    mine = iso.work_root / "j.1"
    mine.mkdir()
    iso.remove_leftover_dir(mine, "j.1")
    assert not mine.exists()
    earlier = Path(tempfile.mkdtemp(prefix="muster-work-rr-"))
    (earlier / "j.2").mkdir()
    iso.remove_leftover_dir(earlier / "j.2", "j.2")
    assert not earlier.exists()  # removed, and the earlier root with it once empty
    # No cgroup hierarchy here: no cgroup named by a record is the agent's.
    elsewhere = tmp_path / "cg"
    elsewhere.mkdir()
    iso.kill_leftover([str(elsewhere)])
    assert elsewhere.is_dir()
