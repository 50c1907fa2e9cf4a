"""Placement: feasibility reasons, GPU choice, bin-packing, explain, reserve/release."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.scheduling.placement import (
    CORDONED,
    EXCLUDED,
    MAX_TASKS_PER_HOST,
    NO_FREE_CPU,
    NO_FREE_GPU_MEMORY,
    NO_FREE_GPUS,
    NO_FREE_MEMORY,
    NO_FREE_MIG,
    NO_FREE_SHARE,
    NO_LABELS,
    NO_MIG,
    NOT_HEALTHY,
    REASONS,
    RECORD_FULL,
    TOO_FEW_CPUS,
    TOO_FEW_GPUS,
    TOO_LITTLE_GPU_MEMORY,
    TOO_LITTLE_MEMORY,
    TOO_MANY_TASKS,
    UNDER_PRESSURE,
    WRONG_MODEL,
    Choice,
    HostCapacity,
    Rejection,
    check,
    explain,
    place,
)
from tests.factories import host_capacity as host
from tests.factories import job_spec as spec
from wire.messages import JobSpec

# ---------------------------------------------------------------- check: reasons in order


def test_reason_constants_are_listed_in_check_order() -> None:
    assert REASONS == (NOT_HEALTHY, CORDONED, UNDER_PRESSURE, EXCLUDED, NO_LABELS, WRONG_MODEL, TOO_FEW_GPUS,
                       NO_FREE_GPUS, NO_FREE_SHARE, TOO_LITTLE_GPU_MEMORY, NO_FREE_GPU_MEMORY, NO_MIG, NO_FREE_MIG,
                       TOO_FEW_CPUS, NO_FREE_CPU, TOO_LITTLE_MEMORY, NO_FREE_MEMORY, TOO_MANY_TASKS, RECORD_FULL)
    assert len(set(REASONS)) == len(REASONS)


def test_a_job_runs_only_on_hosts_with_every_label_it_requires() -> None:
    from server.scheduling.capacity import CapacityIndex, Placer

    hosts = [host("h1", labels={"zone": "a"}), host("h2", labels={"zone": "b", "net": "ib"})]
    wants = spec("t", command=["x"], gpus=1, host_labels={"zone": "b", "net": "ib"})
    assert check(wants, hosts[0])[0] == NO_LABELS and check(wants, hosts[1])[0] is None
    assert explain(spec("t", command=["x"], gpus=1, host_labels={"zone": "c"}), hosts) == Counter({NO_LABELS: 2})
    index = CapacityIndex()
    for h in hosts:
        index.put(h)
    placer = Placer(index, healthy=lambda host_id: True)
    choice = placer.place(wants)
    assert choice is not None and choice.host_id == "h2"
    # A job whose labels no host has finds none; that says nothing of a job without them.
    assert placer.place(spec("u", command=["x"], gpus=1, host_labels={"zone": "c"})) is None
    assert placer.place(spec("v", command=["x"], gpus=1)) is not None
    # The index files hosts by label (a job that requires labels looks only at those hosts);
    # a host whose labels change is filed anew, and a host gone is gone from it.
    assert index.with_labels({"zone": "b", "net": "ib"}) == {"h2"} and index.with_labels({}) is None
    index.put(host("h1", labels={"zone": "b", "net": "ib"}))
    index.put(host("h2", labels={"zone": "a"}))
    assert index.with_labels({"zone": "b", "net": "ib"}) == {"h1"} and index.with_labels({"zone": "a"}) == {"h2"}
    choice = Placer(index, healthy=lambda host_id: True).place(wants)
    assert choice is not None and choice.host_id == "h1"
    index.remove("h1")
    assert index.with_labels({"net": "ib"}) == set() and ("net", "ib") not in index.labelled
    assert Placer(index, healthy=lambda host_id: True).place(wants) is None


def test_a_host_takes_at_most_max_tasks() -> None:
    h = host("h", gpus=0, cpus=10_000.0, memory_mb=10**9)
    s = spec("t", command=["x"], cpus=0.01, memory_mb=1)
    for _ in range(MAX_TASKS_PER_HOST):
        assert check(s, h)[0] is None
        h.reserve([], s.cpus, s.memory_mb)
    assert check(s, h)[:2] == (TOO_MANY_TASKS, [])
    h.release([], s.cpus, s.memory_mb)
    assert check(s, h)[0] is None


def test_first_failing_reason_counts_fixing_one_at_a_time() -> None:
    s = spec(gpus=2, gpu_model="H100", cpus=8, memory_mb=1000)
    h = host(models={0: "A100"}, schedulable=False, cordoned=True, cpus=4, memory_mb=500)
    assert check(s, h)[:2] == (NOT_HEALTHY, [])
    h.schedulable = True
    assert check(s, h)[:2] == (CORDONED, [])
    h.cordoned = False
    assert check(s, h)[:2] == (WRONG_MODEL, [])
    h.gpu_models = {0: "A100", 1: "H100"}
    assert check(s, h)[:2] == (TOO_FEW_GPUS, [])
    h.gpu_models = {0: "A100", 1: "H100", 2: "H100"}
    h.used_gpus = {2}
    assert check(s, h)[:2] == (NO_FREE_GPUS, [])
    h.used_gpus = set()
    assert check(s, h)[:2] == (TOO_FEW_CPUS, [])
    h.cpus = 8
    assert check(s, h)[:2] == (TOO_LITTLE_MEMORY, [])
    h.memory_mb = 1000
    assert check(s, h)[:2] == (None, [1, 2])


@pytest.mark.parametrize(
    "h, s, reason",
    [
        (host(schedulable=False), spec(), NOT_HEALTHY),
        (host(cordoned=True), spec(), CORDONED),
        (host(model="A100"), spec(gpus=1, gpu_model="H100"), WRONG_MODEL),
        (host(gpus=4), spec(gpus=8), TOO_FEW_GPUS),
        (host(models={0: "H100", 1: "H100", 2: "A100", 3: "A100"}), spec(gpus=3, gpu_model="H100"), TOO_FEW_GPUS),
        (host(gpus=4, used_gpus={0, 1}), spec(gpus=3), NO_FREE_GPUS),
        (host(gpus=4, unhealthy=frozenset({0, 1})), spec(gpus=3), NO_FREE_GPUS),
        (host(cpus=8, used_cpus=7.5), spec(cpus=1), NO_FREE_CPU),
        (host(cpus=8), spec(cpus=9), TOO_FEW_CPUS),
        (host(cpus=8, used_cpus=7.5), spec(cpus=9), TOO_FEW_CPUS),
        (host(memory_mb=1000, used_memory_mb=600), spec(memory_mb=500), NO_FREE_MEMORY),
        (host(memory_mb=1000), spec(memory_mb=1001), TOO_LITTLE_MEMORY),
    ],
)
def test_each_reason_alone(h: HostCapacity, s: JobSpec, reason: str) -> None:
    assert check(s, h)[:2] == (reason, [])
    res = place(s, [h])
    assert isinstance(res, Rejection)
    assert res.reasons == Counter({reason: 1})
    assert res.hosts_considered == 1


def test_unhealthy_host_wins_over_every_other_reason() -> None:
    h = host(schedulable=False, cordoned=True, gpus=0, cpus=0, memory_mb=0)
    assert check(spec(gpus=4, gpu_model="B200", cpus=99, memory_mb=10**9), h)[0] == NOT_HEALTHY


def test_gpu_less_job_fits_gpu_less_host() -> None:
    h = host(gpus=0, cpus=4, memory_mb=1024)
    assert check(spec(cpus=4, memory_mb=1024), h)[:2] == (None, [])


def test_exact_fit_of_cpu_and_memory_is_accepted_with_float_slack() -> None:
    # 0.1 + 0.2 > 0.3 in binary floating point; the EPS slack must still accept it.
    h = host(gpus=0, cpus=0.3, used_cpus=0.1, memory_mb=1000, used_memory_mb=500)
    assert check(spec(cpus=0.2, memory_mb=500), h)[:2] == (None, [])
    assert check(spec(cpus=0.2, memory_mb=501), h)[:2] == (NO_FREE_MEMORY, [])
    assert check(spec(cpus=0.21, memory_mb=500), h)[:2] == (NO_FREE_CPU, [])


def test_gpu_job_without_model_on_cpu_only_host_is_too_few_gpus() -> None:
    assert check(spec(gpus=1), host(gpus=0))[:2] == (TOO_FEW_GPUS, [])


# ---------------------------------------------------------------- GPU choice


def test_unhealthy_gpus_never_chosen_but_the_others_are() -> None:
    h = host(gpus=4, unhealthy=frozenset({0, 2}))
    assert check(spec(gpus=2), h)[:2] == (None, [1, 3])
    assert h.free_gpus(None) == [1, 3]
    res = place(spec(gpus=2), [h])
    assert res == Choice("h1", [1, 3])
    assert check(spec(gpus=3), h)[:2] == (NO_FREE_GPUS, [])


def test_gpus_of_the_requested_model_only() -> None:
    h = host(models={0: "A100", 1: "H100", 2: "A100", 3: "H100", 4: "H100"}, used_gpus={1})
    assert check(spec(gpus=2, gpu_model="H100"), h)[:2] == (None, [3, 4])
    assert check(spec(gpus=2, gpu_model="A100"), h)[:2] == (None, [0, 2])
    # No model named: GPUs of one model (the lowest free indices of the one with the fewest
    # free that are enough).
    assert check(spec(gpus=2), h)[:2] == (None, [0, 2])
    assert check(spec(gpus=3), h)[0] == NO_FREE_GPUS  # 2 A100s and 2 H100s free


def test_used_gpus_are_skipped() -> None:
    h = host(gpus=8, used_gpus={0, 1, 2, 5})
    assert check(spec(gpus=3), h)[:2] == (None, [3, 4, 6])


# ---------------------------------------------------------------- ranking


def test_bin_packing_picks_the_tightest_host() -> None:
    hosts = [
        host("empty", gpus=8),
        host("tight", gpus=8, used_gpus={0, 1, 2, 3, 4, 5}),
        host("half", gpus=8, used_gpus={0, 1, 2, 3}),
    ]
    assert place(spec(gpus=2), hosts) == Choice("tight", [6, 7])
    # Three GPUs do not fit the tight host: the half-full one is next.
    assert place(spec(gpus=3), hosts) == Choice("half", [4, 5, 6])
    # A full host's worth only fits the empty host.
    assert place(spec(gpus=8), hosts) == Choice("empty", list(range(8)))


def test_bin_packing_breaks_gpu_ties_by_cpu_then_memory_then_id() -> None:
    a = host("a", gpus=4, cpus=64)
    b = host("b", gpus=4, cpus=16)
    assert place(spec(gpus=1, cpus=2), [a, b]).host_id == "b"
    c = host("c", gpus=4, cpus=16, memory_mb=10_000)
    d = host("d", gpus=4, cpus=16, memory_mb=9_000)
    assert place(spec(gpus=1, cpus=2), [c, d]).host_id == "d"
    e = host("e", gpus=4, cpus=16, memory_mb=9_000)
    assert place(spec(gpus=1, cpus=2), [e, d]).host_id == "d"
    assert place(spec(gpus=1, cpus=2), [d, e]).host_id == "d"


def test_gpu_less_job_prefers_host_with_fewest_free_gpus() -> None:
    # Free GPUs rank first: a CPU job goes to the CPU-only host even though the GPU host
    # is tighter on CPU, keeping GPU hosts free for GPU jobs.
    gpu_host = host("gpu", gpus=8, cpus=8)
    cpu_host = host("cpu", gpus=0, cpus=128)
    assert place(spec(cpus=2), [gpu_host, cpu_host]) == Choice("cpu", [])
    # Among GPU hosts, the one with fewer free GPUs.
    busy = host("busy", gpus=8, used_gpus={0, 1, 2, 3, 4, 5, 6}, cpus=64)
    assert place(spec(cpus=2), [gpu_host, busy]) == Choice("busy", [])
    # Unhealthy GPUs do not count as free.
    sick = host("sick", gpus=8, unhealthy=frozenset(range(8)), cpus=64)
    assert place(spec(cpus=2), [gpu_host, sick]) == Choice("sick", [])


def test_infeasible_hosts_are_never_chosen_even_if_tighter() -> None:
    hosts = [host("cordoned", gpus=2, cordoned=True), host("sick", gpus=2, schedulable=False), host("ok", gpus=8)]
    assert place(spec(gpus=2), hosts) == Choice("ok", [0, 1])


def test_rejection_counts_every_host() -> None:
    res = place(
        spec(gpus=1, gpu_model="H100"),
        [host("a", model="A100"), host("b", cordoned=True), host("c", gpus=1, used_gpus={0})],
    )
    assert isinstance(res, Rejection)
    assert res.hosts_considered == 3
    assert res.reasons == Counter({WRONG_MODEL: 1, CORDONED: 1, NO_FREE_GPUS: 1})


def test_place_with_no_hosts_is_a_rejection() -> None:
    res = place(spec(), [])
    assert isinstance(res, Rejection)
    assert res.hosts_considered == 0
    assert not res.reasons


# ---------------------------------------------------------------- explain


def test_explain_counts_per_reason_across_many_hosts() -> None:
    hosts = [host(f"a{i}", model="A100") for i in range(48)]
    hosts += [host(f"h{i}", gpus=8, used_gpus=set(range(7))) for i in range(19)]
    hosts += [host(f"s{i}", schedulable=False) for i in range(5)]
    hosts += [host(f"c{i}", cordoned=True) for i in range(3)]
    hosts += [host(f"m{i}", gpus=8, memory_mb=100) for i in range(2)]  # 100 MB in all: never
    s = spec(gpus=2, gpu_model="H100")
    reasons = explain(s, hosts)
    assert reasons == Counter({WRONG_MODEL: 48, NO_FREE_GPUS: 19, NOT_HEALTHY: 5, CORDONED: 3, TOO_LITTLE_MEMORY: 2})
    assert sum(reasons.values()) == len(hosts)
    res = place(s, hosts)
    assert isinstance(res, Rejection)
    assert res.reasons == reasons
    assert res.hosts_considered == 77


def test_explain_does_not_count_fitting_hosts() -> None:
    hosts = [host("fits"), host("a", model="A100")]
    assert explain(spec(gpus=1, gpu_model="H100"), hosts) == Counter({WRONG_MODEL: 1})
    assert explain(spec(gpus=1), [host("fits")]) == Counter()


def test_explain_accepts_a_generator() -> None:
    reasons = explain(spec(gpus=1, gpu_model="H100"), (host(str(i), model="A100") for i in range(3)))
    assert reasons == Counter({WRONG_MODEL: 3})


# ---------------------------------------------------------------- reserve / release


def test_reserve_and_release_keep_counts_right() -> None:
    h = host(gpus=4, cpus=8, memory_mb=1000)
    h.reserve([0, 1], 2.5, 300)
    assert h.used_gpus == {0, 1}
    assert h.used_cpus == pytest.approx(2.5)
    assert h.used_memory_mb == 300
    assert h.free_gpus(None) == [2, 3]
    h.reserve([3], 1.0, 100)
    assert h.free_gpus(None) == [2]
    assert check(spec(gpus=2), h)[:2] == (NO_FREE_GPUS, [])
    h.release([0, 1], 2.5, 300)
    assert h.used_gpus == {3}
    assert h.used_cpus == pytest.approx(1.0)
    assert h.used_memory_mb == 100
    assert h.free_gpus(None) == [0, 1, 2]
    h.release([3], 1.0, 100)
    assert h.used_gpus == set()
    assert h.used_cpus == pytest.approx(0.0)
    assert h.used_memory_mb == 0


def test_release_never_goes_negative() -> None:
    h = host(gpus=2, cpus=8, memory_mb=1000)
    h.reserve([0], 1.0, 100)
    h.release([0, 1], 5.0, 5000)
    assert h.used_cpus == 0.0
    assert h.used_memory_mb == 0
    assert h.used_gpus == set()


def test_placing_one_after_another_with_reserve_fills_hosts() -> None:
    hosts = [host("a", gpus=4, cpus=64), host("b", gpus=4, cpus=64)]
    chosen: list[Choice] = []
    for _ in range(4):
        res = place(spec(gpus=2, cpus=1), hosts)
        assert isinstance(res, Choice)
        by_id = {h.id: h for h in hosts}
        by_id[res.host_id].reserve(res.gpu_indices, 1, 512)
        chosen.append(res)
    # Bin-packing fills one host before starting the other.
    assert [c.host_id for c in chosen] == ["a", "a", "b", "b"]
    assert [c.gpu_indices for c in chosen] == [[0, 1], [2, 3], [0, 1], [2, 3]]
    res = place(spec(gpus=1), hosts)
    assert isinstance(res, Rejection)
    assert res.reasons == Counter({NO_FREE_GPUS: 2})


def test_a_job_never_runs_on_a_host_it_excludes() -> None:
    """`excludeHosts`, as Slurm's --exclude: the host is passed over even where it fits
    best, the job waits when every other host is full, and its reason counts it."""
    from server.scheduling.capacity import CapacityIndex, Placer, as_hard, placement_size

    # h1 has one free GPU, the tightest fit for a one-GPU job; h2 has eight.
    hosts = [host("h1", models={0: "H100"}), host("h2")]
    avoid = spec("t", command=["x"], gpus=1, exclude_hosts=["h1"])
    assert check(avoid, hosts[0])[0] == EXCLUDED and check(avoid, hosts[1])[0] is None
    assert explain(spec("t", command=["x"], gpus=1, exclude_hosts=["h1", "h2"]), hosts) == Counter({EXCLUDED: 2})
    index = CapacityIndex()
    for h in hosts:
        index.put(h)
    placer = Placer(index, healthy=lambda host_id: True)
    plain = placer.place(spec("u", command=["x"], gpus=1))
    assert plain is not None and plain.host_id == "h1"  # where the job would go without it
    got = placer.place(avoid)
    assert got is not None and got.host_id == "h2"
    # Eight GPUs fit only on h2: a job that excludes it finds none, and that failure says
    # nothing of a job that does not (the exclusion is part of what a failure is kept by).
    assert placer.place(spec("v", command=["x"], gpus=8, exclude_hosts=["h2"])) is None
    assert placer.place(spec("w", command=["x"], gpus=8)) is not None
    assert not as_hard(placement_size(spec("w", command=["x"], gpus=8), None),
                       placement_size(spec("v", command=["x"], gpus=8, exclude_hosts=["h2"]), None))


# ---------------------------------------------------------------- property

MODELS = ["H100", "A100", "L4"]


# Hosts' labels, and the labels a job requires: none most often, else a zone and a network.
LABEL_SETS = st.sampled_from([{}, {}, {}, {"zone": "a"}, {"zone": "b"}, {"zone": "a", "net": "ib"}])


@st.composite
def host_caps(draw: st.DrawFn, i: int) -> HostCapacity:
    n = draw(st.integers(0, 8))
    models = {g: draw(st.sampled_from(MODELS)) for g in range(n)}
    unhealthy = draw(st.frozensets(st.integers(0, max(0, n - 1)), max_size=n)) if n else frozenset()
    return host(
        f"h{i}",
        schedulable=draw(st.sampled_from([True, True, True, False])),
        cordoned=draw(st.sampled_from([False, False, False, True])),
        models=models,
        unhealthy=unhealthy,
        cpus=float(draw(st.integers(0, 64))) + draw(st.sampled_from([0.0, 0.5, 0.3])),
        memory_mb=draw(st.integers(0, 65536)),
        labels=draw(LABEL_SETS),
    )


@st.composite
def host_lists(draw: st.DrawFn) -> list[HostCapacity]:
    n = draw(st.integers(1, 6))
    return [draw(host_caps(i)) for i in range(n)]


specs = st.builds(
    spec,
    host_labels=LABEL_SETS,
    exclude_hosts=st.sampled_from([[], [], [], ["h0"], ["h1", "h3"], ["h0", "h1", "h2", "h3", "h4", "h5"]]),
    gpus=st.integers(0, 9),
    gpu_model=st.none() | st.sampled_from(MODELS + ["B200"]),
    cpus=st.sampled_from([0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 7.5, 16.0, 33.0]),
    memory_mb=st.integers(0, 40000),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hosts=host_lists(), job_specs=st.lists(specs, min_size=1, max_size=40))
def test_property_reserve_never_overcommits(hosts: list[HostCapacity], job_specs: list[JobSpec]) -> None:
    by_id = {h.id: h for h in hosts}
    assigned: dict[str, list[int]] = {h.id: [] for h in hosts}
    for s in job_specs:
        res = place(s, hosts)
        if isinstance(res, Rejection):
            assert res.hosts_considered == len(hosts)
            assert sum(res.reasons.values()) == len(hosts)
            assert res.reasons == explain(s, hosts)
            continue
        h = by_id[res.host_id]
        assert check(s, h)[:2] == (None, res.gpu_indices)
        assert h.schedulable and not h.cordoned
        assert len(res.gpu_indices) == s.gpus
        for g in res.gpu_indices:
            assert g in h.gpu_models
            assert g not in h.unhealthy_gpus
            assert g not in h.used_gpus
            if s.gpu_model is not None:
                assert h.gpu_models[g] == s.gpu_model
        h.reserve(res.gpu_indices, s.cpus, s.memory_mb)
        assigned[h.id].extend(res.gpu_indices)
        for hh in hosts:
            assert len(hh.used_gpus) <= len(hh.gpu_models)
            assert hh.used_gpus <= set(hh.gpu_models)
            assert not (hh.used_gpus & hh.unhealthy_gpus)
            assert hh.used_cpus <= hh.cpus + 1e-6
            assert hh.used_memory_mb <= hh.memory_mb
    for hid, gpus in assigned.items():
        assert len(gpus) == len(set(gpus)), f"GPU assigned twice on {hid}: {gpus}"
        assert set(gpus) == by_id[hid].used_gpus


# ---------------------------------------------------------------- the capacity index's Placer


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hosts=host_lists(), job_specs=st.lists(specs, min_size=1, max_size=40),
       releases=st.lists(st.booleans(), min_size=40, max_size=40))
def test_property_placer_matches_a_full_scan(hosts: list[HostCapacity], job_specs: list[JobSpec],
                                             releases: list[bool]) -> None:
    """The index-backed Placer (buckets for untouched hosts, an overlay for the hosts this
    cycle changed) finds a host exactly when a scan of every host's current capacity
    does, a feasible one, and one left with the fewest free GPUs of the job's kind. A job
    that requires labels finds the same host when the hosts its labels allow are looked at
    one by one (`direct`, as for a label few hosts have) as along the buckets."""
    from server.scheduling.capacity import CapacityIndex, Placer

    index = CapacityIndex()
    for h in hosts:
        index.put(h)
    placer = Placer(index, healthy=lambda host_id: True, direct_share=0.0)
    direct = Placer(index, healthy=lambda host_id: True, direct_share=1.0)
    done: list[tuple[str, JobSpec, list[int]]] = []
    for s, release in zip(job_specs, releases, strict=False):
        if s.gpus == 0 and s.gpu_model is not None:
            s = s.model_copy(update={"gpu_model": None})  # validation refuses a model without GPUs
        if release and done:
            # What a cycle's status reports do: change a touched host's copy directly.
            host_id, old, gpus = done.pop(0)
            for p in (placer, direct):
                cap = p.cap(host_id)
                assert cap is not None
                cap.release(gpus, old.cpus, old.memory_mb)
                p.failed.clear()  # capacity grew: earlier failures say nothing now
        views = [placer.touched.get(h.id, index.caps[h.id]) for h in hosts]
        feasible = [v for v in views if check(s, v)[0] is None]
        got = placer.place(s)
        same = direct.place(s)
        assert same == got, (s.host_labels, same, got)
        if same is not None:
            direct.reserve(same, s)
        if not feasible:
            assert got is None
            continue
        assert got is not None, f"{s} fits on {[v.id for v in feasible]} but the Placer found nothing"
        view = next(v for v in views if v.id == got.host_id)
        assert check(s, view)[:2] == (None, got.gpu_indices)
        assert len(view.free_gpus(s.gpu_model)) == min(len(v.free_gpus(s.gpu_model)) for v in feasible)
        placer.reserve(got, s)
        done.append((got.host_id, s, got.gpu_indices))
    for h in hosts:  # the index itself is never changed by a cycle
        assert index.caps[h.id] is h


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 8), min_size=300, max_size=400), st.integers(0, 2**30),
       st.lists(st.integers(1, 8), min_size=1, max_size=30))
def test_a_large_set_held_back_places_as_a_walk_host_by_host_does(used: list[int], seed: int,
                                                                  jobs: list[int]) -> None:
    """Past LARGE_EXCLUDE hosts held back, the placer reads each bucket without them (as far
    as placements read it, once per bucket and set): the same hosts chosen, job after job,
    as skipping them one by one, with the set held back changing between jobs as the
    planner's does; and a placement `within` some hosts as one with all others held back."""
    import functools
    import random

    from server.scheduling import capacity
    from server.scheduling.capacity import CapacityIndex, Placer

    index = CapacityIndex()
    for i, n in enumerate(used):
        index.put(host(f"h{i:03d}", used_gpus=range(n)))
    rng = random.Random(seed)
    ids = [f"h{i:03d}" for i in range(len(used))]
    sets = [frozenset(rng.sample(ids, rng.randint(capacity.LARGE_EXCLUDE, len(ids) - 10))) for _ in range(3)]
    placers = [Placer(index, healthy=lambda host_id: True, policy="binpack") for _ in range(2)]
    chosen: list[list[str | None]] = [[], []]
    large = capacity.LARGE_EXCLUDE
    for k, placer in enumerate(placers):
        capacity.LARGE_EXCLUDE = large if k == 0 else 10**9  # the second walks host by host
        try:
            for j, gpus in enumerate(jobs):
                placer.exclude = sets[j % len(sets)]
                s = spec(f"j{j}", command=["x"], gpus=gpus)
                if j % 4 == 3:  # within the hosts of another set, those of this one held back
                    only = sets[(j + 1) % len(sets)]
                    if k == 0:
                        choice = placer.within(only, functools.partial(placer.place, s))
                    else:
                        placer.exclude = frozenset(set(ids) - only) | placer.exclude
                        choice = placer.place(s)
                else:
                    choice = placer.place(s)
                if choice is not None:
                    placer.reserve(choice, s)
                chosen[k].append(choice.host_id if choice is not None else None)
        finally:
            capacity.LARGE_EXCLUDE = large
    assert chosen[0] == chosen[1]
    assert all(h is None or h not in sets[j % len(sets)] for j, h in enumerate(chosen[0]))
    assert all(h is None or h in sets[(j + 1) % len(sets)] for j, h in enumerate(chosen[0]) if j % 4 == 3)


def test_a_placement_within_some_hosts_takes_only_them_and_its_failures_say_nothing_of_the_rest() -> None:
    from server.scheduling.capacity import CapacityIndex, Placer

    index = CapacityIndex()
    index.put(host("busy", used_gpus=range(7)))
    index.put(host("free"))
    placer = Placer(index, healthy=lambda host_id: True, policy="binpack")
    one = spec("one", command=["x"], gpus=1)
    got = placer.within(frozenset({"free"}), lambda: placer.place(one))
    assert got is not None and got.host_id == "free"  # bin-packing alone would take "busy"
    assert placer.place(one) is not None and placer.place(one).host_id == "busy"  # type: ignore[union-attr]
    two = spec("two", command=["x"], gpus=2)
    assert placer.within(frozenset({"busy"}), lambda: placer.place(two)) is None
    assert placer.within(frozenset({"busy"}), lambda: placer.place_gang(spec("g", command=["x"], gpus=1,
                                                                             replicas=2))) is None
    assert placer.only is None and not placer.failed and not placer.failed_gangs
    got = placer.place(two)
    assert got is not None and got.host_id == "free"


def test_a_host_under_pressure_takes_no_new_work_and_says_why() -> None:
    """An agent whose disk is nearly full (Heartbeat.pressure) is given nothing new: the
    planner passes it over in the capacity index, and why pending says so; idle, it could
    still take the job (it is no reason the job could never run)."""
    from server.scheduling.capacity import CapacityIndex, Placer
    from server.scheduling.placement import idle_room

    full = host("full")
    full.pressure = True
    hosts = [full, host("ok", gpus=1)]
    wants = spec("t", command=["x"], gpus=2)
    assert check(wants, full)[0] == UNDER_PRESSURE and check(wants, hosts[1])[0] == TOO_FEW_GPUS
    assert explain(wants, hosts) == Counter({UNDER_PRESSURE: 1, TOO_FEW_GPUS: 1})
    assert idle_room(wants, full) == (1, None)
    index = CapacityIndex()
    for h in hosts:
        index.put(h)
    assert Placer(index, lambda _h: True).place(wants) is None
    full.pressure = False
    index.put(full)
    got = Placer(index, lambda _h: True).place(wants)
    assert got is not None and got.host_id == "full"
