"""How busy a run keeps its GPUs (agent.runner.Run.sample_gpus): one sample per heartbeat
while its process runs, their mean reported with its end (StatusReport.gpu_util_pct), and
since when all of them have been idle (Heartbeat.gpu_idle)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from agent.runner import Run
from tests.factories import task


async def _noop(*_: Any) -> None:
    return None


def run_of(**fields: Any) -> Run:
    r = Run(task("j", **fields), on_state=_noop)
    r.proc = SimpleNamespace(returncode=None)  # type: ignore[assignment]  # its process runs
    return r


def test_a_runs_gpus_are_sampled_while_it_runs_and_their_mean_reported() -> None:
    r = run_of(gpu_indices=[0, 2])
    assert r.gpu_util_pct is None  # no sample yet
    r.sample_gpus({0: 50.0, 1: 0.0, 2: 100.0}, 1.0)  # its GPUs' mean: 75
    r.sample_gpus({0: 10.0, 1: 99.0, 2: 30.0}, 2.0)  # 20
    r.sample_gpus({0: 10.0}, 3.0)  # GPU 2 not reported: no sample
    assert (r.gpu_util_samples, r.gpu_util_pct) == (2, 47.5)
    r.proc = SimpleNamespace(returncode=0)  # type: ignore[assignment]  # it has exited
    r.sample_gpus({0: 0.0, 2: 0.0}, 4.0)
    assert r.gpu_util_pct == 47.5


def test_no_sample_without_gpus_on_mig_or_before_its_process_starts() -> None:
    for r in (run_of(), run_of(gpu_indices=[0], mig=["MIG-1"])):
        r.sample_gpus({0: 80.0}, 1.0)
        assert r.gpu_util_samples == 0 and r.gpu_util_pct is None
    waiting = Run(task("j", gpu_indices=[0]), on_state=_noop)  # not started: no process
    waiting.sample_gpus({0: 80.0}, 1.0)
    assert waiting.gpu_util_pct is None


def test_a_run_is_idle_since_the_first_of_the_samples_that_found_all_its_gpus_idle() -> None:
    r = run_of(gpu_indices=[0, 1])
    r.sample_gpus({0: 1.0, 1: 4.9}, 10.0)
    r.sample_gpus({0: 0.0, 1: 0.0}, 15.0)
    assert r.gpu_idle_since == 10.0  # idle since the first idle sample
    r.sample_gpus({0: 0.0, 1: 5.0}, 20.0)  # one of them busy: no longer idle
    assert r.gpu_idle_since is None
    r.sample_gpus({0: 0.0, 1: 0.0}, 25.0)
    r.sample_gpus({0: 0.0}, 30.0)  # GPU 1 not read: no sample, and the stretch ends (unknown is not idle)
    assert r.gpu_idle_since is None and r.gpu_util_samples == 4
    r.sample_gpus({0: 0.0, 1: 0.0}, 35.0)
    assert r.gpu_idle_since == 35.0
