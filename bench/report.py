"""The report of one `muster bench` run: what the arrivals the simulators recorded, the
observer's records, the server's metrics and the process samples add up to;
`correctness.ok` is the run's verdict (bench.cli adds `plot` and `series`).

Dispatch = a simulated host received its assignment (the first sighting of the attempt on
the host); a job's latency runs from just before its submission to that moment, and a
gang's to the moment the last task of one complete try arrived (bench.verdict).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections import Counter, defaultdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psutil

from bench.leaders import failover_figures
from bench.preload import PREFIX as PRELOAD_PREFIX
from bench.stats import SUSPECT_GAUGE, histogram_quantiles, histogram_window, max_in, summary_ms
from bench.verdict import Verdict, judge, undispatched

if TYPE_CHECKING:
    from bench.run import Bench


def queue_figures(names: list[str], samples: list[tuple[float, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per queue, from the server's gauges scraped in the window: the most GPUs it held
    at once (every model together), its nominal GPUs, and the most it borrowed."""
    def most(gauge: str, q: str) -> float:
        prefix = f'{gauge}{{queue="{q}",resource="gpu:'
        return max((sum(v for k, v in m.items() if k.startswith(prefix)) for _, m in samples), default=0.0)

    return {q: {"max_gpus_held": most("muster_queue_allocated", q), "nominal_gpus": most("muster_queue_nominal", q),
                "max_gpus_borrowed": most("muster_queue_borrowed", q)} for q in names}


def build_report(b: Bench, fleet: list, k: int, startup_s: float) -> dict:
    """The run's report from what `b` collected: the simulators' and the observer's
    files in its work directory, the scraped metrics, the ticks and the process samples.
    Its `_series` (raw ticks, dispatch and running times, observer samples) is for the plot
    and is taken out before the report is written."""
    a = b.args
    sims = []
    for i in range(k):
        p = b.work / f"sim{i}.json"
        if p.exists():
            sims.append(json.loads(p.read_text()))
    obs_p = b.work / "observer.json"
    obs = json.loads(obs_p.read_text()) if obs_p.exists() else {}
    per_job: dict[str, list[tuple[str, str, float, int]]] = defaultdict(list)
    fenced: dict[str, float] = {}  # attempt id -> when its simulator's fence stopped it
    host_ends: dict[str, list] = {}  # attempt id -> [state, when, when its report was stored] on its host
    for s in sims:
        for job_id, aid, host, ts, task in s["arrivals"]:
            per_job[job_id].append((aid, host, ts, task))
        fenced.update(s.get("fenced", {}))
        host_ends.update(s.get("host_ends", {}))
    window = b.window_end - b.window_start
    dispatch, running, never, twice, partial, shared = [], [], [], [], [], []
    by_class: dict[str, list[float]] = defaultdict(list)
    gang_waits: list[float] = []
    ojobs = obs.get("jobs", {})
    lost_host = (b.lost or {}).get("host")
    max_host_gpus = max((h.gpus for h in fleet), default=0)
    verdicts: dict[str, Verdict] = {}
    for job_id, (ts, req) in b.submitted.items():
        oj = ojobs.get(job_id) or {}
        v = verdicts[job_id] = judge(job_id, req.replicas, per_job.get(job_id, []), oj.get("placed") or {},
                                     lost_host, exclusive=req.gang and 2 * req.gpus > max_host_gpus,
                                     ended=oj.get("ended") or {}, fenced=fenced, host_ends=host_ends)
        if v.dispatched_at is None:
            never.append(job_id)
        else:
            dispatch.append(v.dispatched_at - ts)
            by_class[req.qos].append(v.dispatched_at - ts)
            if req.gang:
                gang_waits.append(v.dispatched_at - ts)
        if v.twice:
            twice.append(job_id)
        if v.partial:
            partial.append(job_id)
        if v.shared_host:
            shared.append(job_id)
        ra = (ojobs.get(job_id) or {}).get("running_at")
        if ra is not None:
            running.append(ra - ts)
    # Preloaded jobs rerun after their host was lost are expected; anything else
    # that reached a host without being submitted is a fault.
    reruns = sorted(j for j in set(per_job) - set(b.submitted) if j.startswith(PRELOAD_PREFIX))
    # A job whose submission was given up in doubt may still have been stored and run.
    unknown = sorted(set(per_job) - set(b.submitted) - set(reruns) - b.in_doubt)
    gangs = [j for j, (_, r) in b.submitted.items() if r.gang]
    tasks_dispatched = sum(v.tasks_seen for v in verdicts.values())
    # Rates over the measured window, each from its own first and last sample inside it.
    m_in = [(t, m) for t, m in b.metrics if b.window_start <= t <= b.window_end + 0.5]
    (mt0, m_first), (mt1, m_end) = (m_in[0], m_in[-1]) if len(m_in) > 1 else ((0.0, {}), (1.0, {}))
    m_dt = max(1e-6, mt1 - mt0)
    m_final = b.metrics[-1][1] if b.metrics else {}
    # For the histograms of the window: the last scrape before it and the first after
    # it, so a window shorter than the scrape interval (a burst) is covered too.
    # Both from one replica: after a change of leader the histograms are the new
    # leader's, from the start of the window or, if it led none of it, since it started.
    end_i = next((i for i, (t, _) in enumerate(b.metrics) if t >= b.window_end), len(b.metrics) - 1)
    h_end = b.metrics[end_i][1] if b.metrics else {}
    src = b.metrics_from[end_i] if b.metrics_from else None
    h_first = next((m for (t, m), f in zip(reversed(b.metrics), reversed(b.metrics_from), strict=True)
                    if t <= b.window_start and f == src), {})
    hb = "muster_heartbeats_received_total"
    hb_recv_rate = (m_end.get(hb, 0) - m_first.get(hb, 0)) / m_dt
    t_in = [r for r in b.ticks if r["phase"] == "run"]
    hb_sent_rate = (t_in[-1]["hb_sent"] - t_in[0]["hb_sent"]) / max(1e-6, t_in[-1]["t"] - t_in[0]["t"]) \
        if len(t_in) > 1 else 0.0
    backlog = [r["hb_sent"] - r["hb_received"] for r in b.ticks]
    sent_total = sum(s["counters"]["hb_sent"] for s in sims)
    placements_window = m_end.get("muster_placements_total", 0) - m_first.get("muster_placements_total", 0)
    samples = obs.get("samples", [])
    waiting = [s for s in samples if s.get("queued_gpus", 0) > 0 and b.window_start <= s["t"]]
    free_share = [1 - s["gpus_allocated"] / s["gpus_total"] for s in waiting if s["gpus_total"]]
    counters: defaultdict[str, int] = defaultdict(int)
    for s in sims:
        for key, v in s["counters"].items():
            counters[key] += v
    overcommitted = obs.get("overcommitted_hosts", [])
    gang_tasks = sum(r.replicas for _, r in b.submitted.values() if r.gang)
    frac = sum(1 for _, r in b.submitted.values() if r.fractional_gpu)
    procs = {}
    for c in b.children:
        procs[c.name] = {"cpu_s": round(c.cpu, 2), "peak_rss_mb": round(c.peak_rss / 2**20, 1),
                         "cpu_s_in_window": round(c.cpu_at_end - c.cpu_at_start, 2)
                         if c.cpu_at_start is not None and c.cpu_at_end is not None else None,
                         "cpu_pct_in_window": round(100 * (c.cpu_at_end - c.cpu_at_start) / window, 1)
                         if c.cpu_at_start is not None and c.cpu_at_end is not None and window > 0 else None}
    queued_at_end, in_stream, placed_at_end, lost = undispatched(never, ojobs, b.submissions_waiting)
    correct = {
        "ok": not lost and not placed_at_end and not twice and not partial and not shared and not unknown
              and not overcommitted and counters["gpu_collisions"] == 0 and bool(obs)
              and obs.get("read_every_record") is True,
        "jobs_never_dispatched": len(never),
        # Of those, the backlog at the end: queued, or their submissions still in the SUBMIT
        # stream (not taken in yet); and the rest, lost (no record, or one ended otherwise).
        "jobs_queued_at_end": len(queued_at_end),
        "jobs_in_submit_stream_at_end": len(in_stream),
        # Placed (or running) by the leader, the assignment seen on no host by the end:
        # delivery behind, or stuck; judged incorrect either way.
        "jobs_placed_not_delivered_at_end": len(placed_at_end),
        "jobs_lost": len(lost),
        "jobs_dispatched_more_than_once": len(twice),
        # Tried again after a simulator fenced itself (no heartbeat stored for an agent's
        # fence_after_s: its NATS node lost, say) and stopped the try before: not twice.
        "jobs_retried_after_fence": sum(1 for v in verdicts.values() if v.retried_after_fence),
        "simulator_fences": counters["fences"],
        "tasks_stopped_by_fences": counters["fenced_kills"],
        # Frozen by a fence and continued: their host's key was stored again before it could
        # expire (agent.agent's freeze).
        "tasks_continued_after_fences": counters["fenced_thawed"],
        "gangs_partially_dispatched": len(partial),
        "gangs_with_tasks_sharing_a_host": len(shared),
        "dispatches_of_unknown_jobs": len(unknown),
        "preloaded_jobs_rerun": len(reruns),
        "overcommitted_hosts": len(overcommitted),
        "overcommit_examples": obs.get("overcommit_examples", [])[:10],
        "simulator_gpu_collisions": counters["gpu_collisions"],
        "alloc_revisions_checked": obs.get("alloc_revisions_checked", 0),
        "final_alloc_records_checked": obs.get("final_alloc_records_checked", 0),
        "observer_ran": bool(obs),
        # Every state record stored until the end was checked (not a report from part of them).
        "observer_read_every_record": obs.get("read_every_record"),
        "examples_never_dispatched": never[:5],
        "examples_lost": lost[:5],
        "examples_placed_not_delivered": placed_at_end[:5],
        "examples_dispatched_twice": {j: verdicts[j].problems for j in twice[:5]},
        "examples_gang_problems": {j: verdicts[j].problems for j in (partial + shared)[:5]},
    }
    gpus_total = sum(h.gpus for h in fleet)
    # Submissions per second over the time spent submitting (a burst is over long before the window).
    submit_s = window
    if a.burst and b.burst_started and b.burst_submitted:
        submit_s = b.burst_submitted - b.burst_started
    rep = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python -m bench " + " ".join(sys.argv[1:])
        if a.argv is None
        else "python -m bench " + " ".join(a.argv),
        "machine": f"{os.cpu_count()} CPUs, {round(psutil.virtual_memory().total / 2**30)} GiB; "
                   "every process on one machine",
        "machine_speed": b.machine_speed,
        "config": {
            "hosts": a.hosts,
            "gpus": gpus_total,
            "rate": None if a.burst else a.rate,
            "duration_s": None if a.burst else a.duration,
            "burst": a.burst or None,
            "submit_via": a.submit_via,
            "one_per_request_clients": a.clients if a.one_per_request else None,
            "queues": {"queues": a.queues, "cohorts": a.cohorts} if a.queues else None,
            "workload": "trace" if a.trace else "synthetic",
            "nats_cluster": a.nats_cluster,
            "muster_replicas": a.replicas,
            "nats_sync": a.nats_sync,
            "servers": a.servers,
            "follower_heartbeats_every_s": a.follower_heartbeats_every,
            "history_database": "PostgreSQL (fsync, synchronous_commit on), started by the bench" if a.postgres
            else (a.db_url.split(":", 1)[0] if a.db_url else "SQLite in each server's data directory"),
            "kill_leader_at_s": a.kill_leader_at,
            "kill_nats_leader_at_s": a.kill_nats_leader_at,
            "simulator_processes": k,
            "seed": a.seed,
            "batch_window_s": a.batch_window,
            "assign_subscription": "wildcard muster.assign.>" if a.wildcard else "one per host",
        },
        "replication": b.replication,
        "startup_s": round(startup_s, 1),
        "window_s": round(window, 2),
        "jobs_submitted": len(b.submitted),
        "jobs_dispatched": len(b.submitted) - len(never),
        "tasks_submitted": b.tasks_submitted,
        "tasks_dispatched": tasks_dispatched,
        "submit_errors": b.submit_errors,
        # NATS submissions accepted only when sent again (bench.run.submit_again), and
        # jobs given up with the outcome unknown (of which some reached a host).
        "submit_retried_ok": b.submit_retried_ok,
        "submissions_in_doubt": len(b.in_doubt),
        "in_doubt_dispatched": len(b.in_doubt & set(per_job)),
        "submit_requests": b.submit_requests,
        "submit_request_ms": summary_ms(b.request_s) if a.one_per_request else None,
        "queues": queue_figures(b.queue_names, m_in) if b.queue_names else None,
        "submissions_per_s": round(len(b.submitted) / submit_s, 1) if submit_s else None,
        "placements_per_s": round(placements_window / m_dt, 1),
        "placements_per_s_source": "server metric muster_placements_total (jobs placed; a gang counts "
        "once) over the measured window, sampled once a second",
        "placements_total": m_final.get("muster_placements_total"),
        # Assignment records the leader at the end sent again to agents that had not
        # started a task in time (server.scheduling.delivery), over its whole term.
        "assignments_sent_again": m_final.get("muster_assignments_redelivered_total"),
        "dispatch_latency_ms": summary_ms(dispatch),
        "running_latency_ms": summary_ms(running),
        "server_placement_latency": histogram_quantiles(m_final, "muster_placement_latency_seconds"),
        # A commit, from sending its batch until the leader has read the acknowledgement.
        "server_commit_seconds": histogram_quantiles(m_final, "muster_commit_seconds"),
        # How late the server's event loop woke for a 0.1 s timer, in the window.
        "server_loop_lag": histogram_window(h_first, h_end, "muster_event_loop_lag_seconds"),
        "server_gc_pauses": histogram_window(h_first, h_end, "muster_gc_pause_seconds"),
        # Each scheduling cycle's planning (decisions and encoding), in the window.
        "server_plan_seconds": histogram_window(h_first, h_end, "muster_plan_seconds"),
        "server_commits_in_window": histogram_window(h_first, h_end, "muster_commit_seconds"),
        "heartbeats_per_s": round(hb_recv_rate, 1),
        "heartbeats_sent_per_s": round(hb_sent_rate, 1),
        "heartbeats": {
            "sent_total": sent_total,
            "received_total_at_end": m_final.get(hb),
            "backlog_at_end": sent_total - m_final.get(hb, 0) if m_final else None,
            "backlog_max_during_run": max(backlog) if backlog else None,
            # The server's heartbeat ingest process (server.health.ingest): how old
            # the newest batch was when the server applied it.
            "ingest_lag_s_max_in_window": max_in(m_in, "muster_heartbeat_ingest_lag_seconds"),
            # Hosts the server saw as SUSPECT (no heartbeat applied for two
            # intervals, so unschedulable) at the worst sample in the window.
            # Heartbeat records the server had not applied yet (unread in
            # the stream or waiting in the ingest process), its own count.
            "pending_max_in_window": max_in(m_in, "muster_heartbeats_pending"),
            "suspect_hosts_max_in_window": max_in(m_in, SUSPECT_GAUGE),
            "note": "received counts every record the server's hosts watch saw (expiry markers "
            "included); backlog_* = sent - received, sampled once a second (a rough "
            "figure: expiry markers count as received, and heartbeats sent before the "
            "server started never are); pending_max_in_window is the server's own count "
            "of records not yet applied",
        },
        "max_concurrent_tasks": max((r["running"] for r in b.ticks), default=0),
        "max_concurrent_tasks_upper_bound": sum(s["max_running"] for s in sims),
        # What the control plane itself tracked: live (PLACED or RUNNING) jobs in its
        # state, preloaded ones included, the most seen in any one-second sample.
        "max_live_jobs_tracked_by_server": max(
            (
                sum(
                    v
                    for k, v in m.items()
                    if k.startswith("muster_jobs{") and ('state="RUNNING"' in k or 'state="PLACED"' in k)
                )
                for _, m in b.metrics
            ),
            default=0,
        ),
        "preloaded": b.preloaded or None,
        "backlog": b.backlogged or None,
        "server_state_load": b.state_load(),
        # The server's own count of queued jobs, less the --backlog queue's (which never moves).
        "max_queue_depth": max((r["queue_depth"] for r in b.ticks), default=0) - b.backlogged.get("jobs", 0),
        "min_queue_depth_with_backlog": min((r["queue_depth"] for r in b.ticks if r["phase"] == "run"), default=0)
        if b.backlogged else None,
        "overcommitted_hosts": len(overcommitted),
        "lost_host_detection": b.lost or {"skipped": True},
        "processes": procs,
        "machine_cpu_busy_pct_in_window": b.machine_busy_pct(),
        "simulators": {
            "counters": dict(counters),
            "reports_pending_at_end": sum(s["reports_pending_at_end"] for s in sims),
            "loop_lag_max_ms": max((s["loop_lag_max_ms"] for s in sims), default=None),
            "gc_pause_max_ms": max((s.get("gc_pause_max_ms", 0.0) for s in sims), default=None),
            "gc_full_pauses": sum(s.get("gc_full_pauses", 0) for s in sims),
        },
        "observer": {
            "records_behind_at_start": b.observer_behind_at_start,
            "watch_lag_s_at_end": obs.get("watch_lag_s_at_end"),
            "max_watch_lag_s": max((s.get("lag_s", 0) for s in samples), default=None),
        },
        "quality": {
            "gpus_unallocated_share_while_gpu_jobs_wait": {
                "seconds_with_gpu_jobs_waiting": len(waiting),
                "mean": round(statistics.fmean(free_share), 4) if free_share else None,
                "max": round(max(free_share), 4) if free_share else None,
            },
            "wait_ms_by_priority_class": {q: summary_ms(v) for q, v in sorted(by_class.items())},
            "gangs_submitted": len(gangs),
            "gang_tasks_submitted": gang_tasks,
            "gang_sizes": dict(sorted(Counter(b.submitted[j][1].replicas for j in gangs).items())),
            "gang_wait_ms": summary_ms(gang_waits),
            "gangs_not_fully_dispatched": len(gangs) - len(gang_waits),
            "gpu_share_jobs": frac,
        },
        "correctness": correct,
        "reads": b.reads,
        "notes": b.notes
        + [
            "dispatch = a simulated host received its assignment (first sighting of the attempt on the host); "
            "submit time = just before the "
            f"{'NATS publish on muster.submit' if a.submit_via == 'nats' else 'submitJobs request'}; "
            "wait per priority class uses dispatch latency",
            "running = the store's timestamp of the job record's first RUNNING (or later) revision",
            "a gang is one job with replicas = ceil(n/8) tasks of 8 GPUs (jobs_* count it once, tasks_* "
            "count its tasks); it is dispatched when every task of one try has reached its host, and its "
            "dispatch latency (= gang wait) runs from its submit time to that moment; its running time is "
            "when every task of one try had reported RUNNING",
        ]
        + (
            [
                "trace: a fraction of one GPU is asked as that share of a GPU (gpuShare, thousandths), a "
                "gpu_spec model set as gpuModels; durations capped at 7 days "
                "and divided by 80; qos -> priority LS 300, Guaranteed 200, Burstable 100, BE 0"
            ]
            if a.trace
            else []
        ),
        "work_dir": str(b.work),
    }
    submitted_at = {j: ts for j, (ts, _) in b.submitted.items()}
    dispatched_at = {j: v.dispatched_at for j, v in verdicts.items() if v.dispatched_at is not None}
    placed_at = {j: d["placed_at"] for j, d in ojobs.items() if d.get("placed_at") is not None}
    rep["failover"] = [{**failover_figures(k["at"], f"{k['what']} ({k['process']})", submitted_at, dispatched_at,
                                           placed_at), **({"streams_led": k["led"]} if "led" in k else {})}
                       for k in b.kills] or None
    rep["fence_alerts"] = {"alerts": len(b.fence_alerts), "hosts": sum(h for h, _, _ in b.fence_alerts),
                           "continued": sum(c for _, c, _ in b.fence_alerts),
                           "stopped": sum(x for _, _, x in b.fence_alerts)}
    rep["leader_changes"] = [{"t_in_window_s": round(t - b.window_start, 2), "from": f, "to": to}
                             for t, f, to in b.scrapes.changes]
    rep["history_lag"] = b.history_lag
    if a.burst:
        rep["burst"] = burst_report(b, verdicts, ojobs, gpus_total)
        if rep["burst"]["placements_per_s"] is not None:
            rep["placements_per_s"] = rep["burst"]["placements_per_s"]
            rep["placements_per_s_source"] = "burst: jobs / (last job fully dispatched - first submit)"
    rep["_series"] = {"ticks": b.ticks, "dispatch": [(b.submitted[j][0], v.dispatched_at)
                                                        for j, v in verdicts.items()
                                                        if v.dispatched_at is not None],
                      "running": [(b.submitted[j][0], ojobs[j]["running_at"]) for j in b.submitted
                                  if (ojobs.get(j) or {}).get("running_at") is not None],
                      "samples": samples, "t0": b.window_start}
    return rep

def burst_report(b: Bench, verdicts: dict[str, Verdict], ojobs: dict[str, dict], gpus_total: int) -> dict[str, Any]:
    """--burst: how long the whole burst took to reach its hosts, and the rate that makes."""
    t0 = b.burst_started or b.window_start
    n = len(b.submitted)
    done = [v.dispatched_at for v in verdicts.values() if v.dispatched_at is not None]
    all_done = bool(n) and len(done) == n
    span = max(done) - t0 if all_done else None
    placed = [p for j in b.submitted if (p := (ojobs.get(j) or {}).get("placed_at"))]
    placed_span = max(placed) - t0 if n and len(placed) == n else None
    r = lambda v, k=3: None if v is None else round(v, k)  # noqa: E731
    gpus = sum((q.gpus + q.gpu_share / 1000) * q.replicas for _, q in b.submitted.values())
    return {
        "jobs": n, "tasks": b.tasks_submitted, "jobs_dispatched": len(done),
        "gpus_requested": gpus, "gpus_total": gpus_total,
        "submit_s": r(b.burst_submitted - t0) if b.burst_submitted else None,
        "time_to_dispatch_all_s": r(span),
        "placements_per_s": r(n / span, 1) if span else None,
        "tasks_per_s": r(b.tasks_submitted / span, 1) if span else None,
        "server_placed_all_s": r(placed_span),
        "server_placements_per_s": r(n / placed_span, 1) if placed_span else None,
        "note": ("the burst asks for more GPUs than the fleet has, so part of it waited for others to "
                 "finish; " if gpus > gpus_total else "") +
                "t=0 just before the first batch was published; time_to_dispatch_all = until the last task "
                "of the last job reached its simulated host; server_placed_all = until the leader planned "
                "the last placement (the job record's placed_at, the same machine's clock)",
    }
