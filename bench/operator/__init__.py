"""Operator latency at scale: console pages and GraphQL `hosts`/`jobs` queries with
50,000 hosts in the `hosts` bucket and 500,000 jobs in the history database.

    python -m bench.operator [--hosts 50000] [--jobs 500000] [--reps 30] [--warmup 3]
                             [--heartbeat-interval 30] [--live-jobs 300]
                             [--json bench/results/operator-50k-500k.json]

In order:
  1. Fills a fresh SQLite history database (schema at Alembic head, made by
     `server.history.database.History`) with --jobs finished jobs submitted over the last --days
     days: their rows, attempts and the events `job_events` derives, built exactly as
     `History._write` builds them, plus the host events and alerts the recorder would have
     written (one `job.failed` alert per failed job, host incidents, GPU faults). Rows go
     in with executemany, the secondary indexes dropped first and rebuilt after.
  2. Starts nats-server and one `muster server` on that database (bench.processes),
     the server's --heartbeat-interval set to the simulated hosts' interval.
  3. Publishes the fleet (bench.workload's synthetic fleet: H100/A100/L40S/CPU-only hosts,
     32 per rack, 1,000 per zone): a bench.simhosts simulator keeps 98.5 % of the hosts
     heartbeating, with varied GPU utilisation, temperature, power, memory and a few
     faulty GPUs; 1 % are published once with a long TTL (they turn SUSPECT) and 0.5 %
     once with a 2 s TTL (they turn LOST); 1 % are cordoned and 0.2 % drained through
     the API.
  4. Submits --live-jobs real jobs with `submitJobs` (60 % run on the simulated hosts for
     a day, 20 % wait for a GPU model no host has, 20 % finish at once) and waits until
     history holds them all.
  5. Signs in to the console and times --warmup + --reps sequential requests of every
     kind below, round-robin (wall time to the last byte of the body; each response is
     checked), sampling the server's CPU time and RSS throughout.

It prints a table, the same table as Markdown for the README, and writes the JSON
report. `python -m bench.operator simulate ...` is the simulator process it starts.

    fleet      the fleet plan and the simulated hosts with lifelike GPU usage
    history    the history filler (finished jobs, attempts, events, alerts)
    queries    the requests timed and the checks of their answers
    measure    the timing loop and the process sampler
    report     the report, the table and its Markdown
    run        the five steps in order, and the command line
"""
