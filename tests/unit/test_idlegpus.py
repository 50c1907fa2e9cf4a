"""Jobs that hold GPUs they do not use: the agent names the attempts whose GPUs have all
been idle for its --gpu-idle-after in its heartbeat (Heartbeat.gpu_idle), the cluster
view keeps what the hosts say, and the leader alerts each such attempt once
(server.health.idlegpus)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from agent.agent import Agent, AgentConfig
from agent.gpu import SimulatedBackend
from agent.runner import Run
from server.health.alertsummary import ALERTS_ONE_BY_ONE
from server.health.idlegpus import IdleWatch
from server.state.cluster import ClusterState
from tests.factories import heartbeat, heartbeat_record, job, job_spec, task
from wire.messages import Attempt, AttemptState, JobState, shape_digest
from wire.records import Record
from wire.subjects import ALERT_JOB_GPUS_IDLE


def running(job_id: str, host: str = "h1", gpus: int = 2, state: AttemptState = AttemptState.RUNNING) -> Any:
    a = Attempt(id=f"{job_id}.1", number=1, host_id=host, gpu_indices=list(range(gpus)), state=state)
    return job(job_id, spec=job_spec(job_id, gpus=gpus, queue="vision", user="ann"), state=JobState.RUNNING,
               attempts=[a])


def test_each_idle_attempt_is_alerted_once_while_it_stays_idle() -> None:
    watch = IdleWatch()
    jobs = {j.id: j for j in (running("jobidle01"), running("jobbusy01"), running("jobdone01",
                                                                                   state=AttemptState.SUCCEEDED))}
    idle = {"jobidle01.1": ("h1", 1000.0), "jobdone01.1": ("h1", 1000.0), "jobgone01.1": ("h1", 1000.0),
            "jobbusy01.1": ("h9", 1000.0)}  # ended, unknown, and on another host than its try: not alerted
    [ev] = watch.check(5000.0, idle, jobs)
    assert ev.kind == ALERT_JOB_GPUS_IDLE and ev.job_id == "jobidle01" and ev.host_id == "h1"
    assert "holds 2 GPU(s) on h1 that have been idle" in ev.message and "queue vision, user ann" in ev.message
    assert ev.data["since"] == 1000.0 and ev.data["attempt"] == "jobidle01.1"
    assert watch.check(5001.0, idle, jobs) == []  # still idle: alerted already
    assert watch.check(5002.0, {}, jobs) == []  # busy again
    assert [e.job_id for e in watch.check(5003.0, idle, jobs)] == ["jobidle01"]  # idle again: alerted again


def test_many_idle_at_once_are_one_alert_by_queue() -> None:
    n = ALERTS_ONE_BY_ONE + 3
    jobs = {f"jobidle{i:02d}": running(f"jobidle{i:02d}") for i in range(n)}
    [ev] = IdleWatch().check(1.0, {f"{j}.1": ("h1", 0.0) for j in jobs}, jobs)
    assert ev.message.startswith(f"{n} jobs hold GPUs that have been idle: jobidle00, ")
    assert ev.data["jobs"] == n and ev.data["by_queue"] == {"vision": n}


def test_the_cluster_view_keeps_what_the_hosts_say_is_idle() -> None:
    """A change of the set of idle attempts changes the heartbeat's shape, so the view
    decodes it; heartbeats of the same shape (kept raw) keep it; an expiry forgets it."""
    st = ClusterState()
    calm = heartbeat("h1", seq=1)
    st.apply_host_record(heartbeat_record(calm, 1), now=1.0)
    assert st.idle_gpus() == {}
    idle = calm.model_copy(update={"seq": 2, "gpu_idle": {"jobidle01.1": 500.0}})
    assert shape_digest(idle) != shape_digest(calm)
    st.apply_host_record(heartbeat_record(idle, 2), now=2.0)
    again = idle.model_copy(update={"seq": 3})
    st.apply_host_record(heartbeat_record(again, 3), now=3.0)
    assert st.hosts["h1"].raw is not None  # same shape: not decoded
    assert st.idle_gpus() == {"jobidle01.1": ("h1", 500.0)} and st.gpu_idle_since("h1", "jobidle01.1") == 500.0
    st.apply_host_record(heartbeat_record(calm.model_copy(update={"seq": 4}), 4), now=4.0)
    assert st.idle_gpus() == {} and st.gpu_idle_since("h1", "jobidle01.1") is None
    st.apply_host_record(heartbeat_record(idle.model_copy(update={"seq": 5}), 5), now=5.0)
    st.apply_host_record(Record("h1", 6, None), now=6.0)  # its key expired
    assert st.idle_gpus() == {}


class _NeverBusy(SimulatedBackend):
    """Simulated GPUs that stay idle whatever runs on them (a job that holds GPUs and
    does not use them)."""

    def set_busy(self, indices: set[int]) -> None:
        super().set_busy(set())


def test_the_agent_names_an_attempt_once_its_gpus_have_been_idle_long_enough() -> None:
    agent = Agent(AgentConfig(nats_url="nats://127.0.0.1:4222", host_id="h1", gpu_idle_after_s=60.0),
                  gpus=_NeverBusy("2xH100"))

    async def noop(*_: Any) -> None:
        return None

    r = Run(task("jobidle01", gpu_indices=[0, 1]), on_state=noop)
    r.proc = SimpleNamespace(returncode=None)  # type: ignore[assignment]  # its process runs
    agent.runs[r.task.attempt_id] = r
    first = agent.heartbeat()
    assert first.gpu_idle == {} and r.gpu_idle_since is not None  # idle, not for long yet
    r.gpu_idle_since -= 61  # a minute of idle heartbeats later
    later = agent.heartbeat()
    assert later.gpu_idle == {"jobidle01.1": r.gpu_idle_since}
    off = Agent(AgentConfig(nats_url="nats://127.0.0.1:4222", host_id="h1", gpu_idle_after_s=0.0),
                gpus=_NeverBusy("2xH100"))
    off.runs[r.task.attempt_id] = r
    assert off.heartbeat().gpu_idle == {}  # 0: never
