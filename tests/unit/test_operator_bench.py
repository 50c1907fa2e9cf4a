"""The operator benchmark's history, without running it: the rows it bulk-inserts are the
rows `History` itself writes for the same jobs, and the filled database keeps the schema
Alembic made (SQLite files). Then what the benchmark found at 50,000 hosts (see
docs/benchmarks.md, "Operator latency at 50,000 hosts and 500,000 jobs")."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import text

from bench.operator.fleet import build_fleet
from bench.operator.history import HistoryMaker, fill_history, job_rows
from server.history.database import History


def test_bulk_rows_are_the_rows_history_writes(tmp_path: Path) -> None:
    fleet = build_fleet(300, seed=3)
    maker = HistoryMaker(fleet.hosts, seed=4)
    now = time.time()
    jobs = [maker.job(now - 86400 + i * 60, now) for i in range(300)]
    assert {j.state.value for j in jobs} == {"SUCCEEDED", "FAILED", "CANCELLED"}
    assert any(j.spec.replicas > 1 for j in jobs) and any(len(j.attempts) > 1 for j in jobs)
    h = History(f"sqlite:///{tmp_path / 'real.db'}")
    for i, j in enumerate(jobs):
        h.record(j, 100 + i)
    h.flush()
    with h.engine.connect() as conn:
        for i, j in enumerate(jobs):
            row, attempts, events = job_rows(j, 100 + i)
            assert dict(conn.execute(text("SELECT * FROM jobs WHERE id = :id"), {"id": j.id}).mappings().one()) == row
            got = conn.execute(text("SELECT * FROM attempts WHERE job_id = :id ORDER BY id"), {"id": j.id}).mappings()
            assert [dict(r) for r in got] == sorted(attempts, key=lambda a: str(a["id"]))
            got = conn.execute(text("SELECT * FROM events WHERE job_id = :id ORDER BY id"), {"id": j.id}).mappings()
            assert [dict(r) for r in got] == sorted(events, key=lambda e: str(e["id"]))
    h.close()


def test_filled_database_keeps_the_alembic_schema(tmp_path: Path) -> None:
    fresh = History(f"sqlite:///{tmp_path / 'fresh.db'}")
    fleet = build_fleet(200, seed=5)
    filled = fill_history(f"sqlite:///{tmp_path / 'filled.db'}", fleet.hosts, 2000, seed=6, days=3, now=time.time(),
                          chunk=500, progress=lambda _msg: None)
    assert filled.jobs == 2000 and sum(filled.by_state.values()) == 2000
    assert filled.in_window > 0 and filled.retried_attempts >= 2
    filled_h = History(f"sqlite:///{tmp_path / 'filled.db'}")  # already at head: nothing to migrate
    schema = "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
    with fresh.engine.connect() as a, filled_h.engine.connect() as b:
        assert a.execute(text(schema)).all() == b.execute(text(schema)).all()
        assert b.execute(text("SELECT count(*) FROM jobs")).scalar() == 2000
        assert b.execute(text("SELECT count(*) FROM events WHERE kind LIKE 'alert.%'")).scalar() == filled.alerts
    jobs, total = filled_h.list_jobs(user=max(filled.by_user, key=lambda u: filled.by_user[u]))
    assert total == max(filled.by_user.values()) and jobs
    fresh.close()
    filled_h.close()


# ---------------------------------------------------------------- what the benchmark found


def test_alert_count_matches_the_alert_kinds_only(tmp_path: Path) -> None:
    """The alerts count is a range on `kind` (index-friendly) and means `kind LIKE 'alert.%'`."""
    from server.history.models import EventRow

    h = History(f"sqlite:///{tmp_path / 'h.db'}")
    kinds = ["alert.host.lost", "alert.gpu.xid", "alert.", "alert", "alerts.x", "alert/x", "alertz", "job.placed",
             "host.lost", "alert.host.lost"]
    with h.engine.begin() as conn:
        conn.execute(EventRow.__table__.insert(),  # type: ignore[attr-defined]
                     [dict(id=f"e{i}", ts=float(i), kind=k, message="") for i, k in enumerate(kinds)])
    rows, total = h.list_alerts()
    assert total == 4 == len(rows)
    assert sorted(r.kind for r in rows) == sorted(k for k in kinds if k.startswith("alert."))
    assert h.list_alerts(kind="host.lost")[1] == 2
    h.close()
