"""`muster bench placement` on a small made-up trace, for correctness only (the quality
figures are the benchmark's): every task placed or counted unplaced, no host overcommitted
(GPUs in integer thousandths), the allocated share read off the hosts themselves, the
curve and report complete for each policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import placement

NODES = """sn,cpu_milli,memory_mib,gpu,model
n0,32000,131072,8,G2
n1,32000,131072,8,G2
n2,16000,65536,2,T4
n3,16000,65536,2,V100M16
n4,8000,32768,0,
"""
PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p0,4000,8192,1,1000,,LS,Running,0,10,0
p1,2000,4096,1,500,,LS,Running,1,10,1
p2,2000,4096,1,250,,BE,Running,2,10,2
p3,8000,16384,2,1000,,LS,Running,3,10,3
p4,1000,2048,0,0,,BE,Running,4,10,4
p5,2000,4096,1,300,T4|V100M16,LS,Running,5,10,5
p6,6000,8192,4,1000,,LS,Running,6,10,6
p7,1000,1024,1,700,,BE,Running,7,10,7
"""


@pytest.mark.parametrize("order", ["shuffle", "creation"])
def test_a_small_replay_is_complete_and_never_overcommits(tmp_path: Path, order: str) -> None:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    out = tmp_path / "r.json"
    assert placement.main(["--pods", str(tmp_path / "pods.csv"), "--nodes", str(tmp_path / "nodes.csv"),
                           "--seeds", "2", "--order", order, "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert set(rep["policies"]) == {"fgd", "binpack"} and rep["order"] == order
    tasks = placement.read_pods(tmp_path / "pods.csv")
    assert [t.spec.gpu_share for t in tasks] == [0, 500, 250, 0, 0, 300, 0, 700]
    assert tasks[5].spec.models() == frozenset({"T4", "V100M16"})
    for r in rep["policies"].values():
        levels = [lv for lv, _ in r["allocated_pct_by_arrived"]]
        assert levels == list(range(0, 131, 5))
        values = [v for _, v in r["allocated_pct_by_arrived"]]
        assert all(0 <= v <= 100 for v in values)
        for run in r["runs"]:
            assert run["overcommitted_hosts"] == [] and run["allocated_matches_hosts"]
            assert sum(run["unplaced"].values()) <= run["tasks"] == sum(run["arrived"].values())
            assert run["capacity_gpus"] == 20 and 0 <= run["allocated_pct"] <= 100
            assert 0 <= run["fragmented_pct_of_free"] <= 100


def test_the_simulator_node_names_and_inflation(tmp_path: Path) -> None:
    """Nodes get the simulator's names (a seeded permutation's index before each sorted
    name: a random order of equal hosts, fixed for a run), and the inflation stops at
    the first drawn task that would pass the target, counting one GPU of a multi-GPU
    task as the simulator's tuning does."""
    import random

    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    names = placement.node_names(tmp_path / "nodes.csv", random.Random(7))
    assert names == placement.node_names(tmp_path / "nodes.csv", random.Random(7))
    assert sorted(n[5:] for n in names) == ["n0", "n1", "n2", "n3", "n4"]
    assert [n[5:] for n in names] == ["n0", "n1", "n2", "n3", "n4"]  # in the file's order
    assert sorted(int(n[:4]) for n in names) == [0, 1, 2, 3, 4]
    assert {tuple(placement.node_names(tmp_path / "nodes.csv", random.Random(s))) for s in range(8)} != {tuple(names)}
    caps = placement.read_nodes(tmp_path / "nodes.csv", names)
    assert [c.id for c in caps] == names and len(caps[0].gpu_models) == 8

    tasks = placement.read_pods(tmp_path / "pods.csv")
    asked = sum(t.gpu_milli for t in tasks)  # 9750 thousandths
    for seed in range(20):
        got = placement.arrivals(tasks, 20 * 1000, 1.3, "shuffle", random.Random(seed))
        assert sorted(t.name for t in got[:len(tasks)]) == sorted(t.name for t in tasks)
        # Every appended task passed the test with its per-GPU demand (a 4-GPU task may
        # take the total past the target), and the draw that failed it ended the list.
        running = asked
        for t in got[len(tasks):]:
            assert running + (1000 if t.spec.gpus else t.spec.gpu_share) <= 1.3 * 20 * 1000
            running += t.gpu_milli
        assert len(got) > len(tasks)  # 9,750 of 26,000 thousandths: room for more


def test_pod_lists_without_times_or_model_sets_are_read(tmp_path: Path) -> None:
    """Some openb variants (e.g. multigpu50) have only name, CPU, memory and GPUs."""
    (tmp_path / "pods.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nb,1000,10,2,1000\na,500,10,1,300\n")
    tasks = placement.read_pods(tmp_path / "pods.csv")
    assert [(t.name, t.spec.gpus, t.spec.gpu_share, t.spec.models()) for t in tasks] == [
        ("a", 0, 300, None), ("b", 2, 0, None)]
