"""The benchmark's history lag waits for rows the historian has not written yet, and says
which never came, instead of leaving them out of its figures."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from bench.historylag import HistoryLag, ended_jobs
from tests.conftest import eventually


def _jobs_table(path: Path) -> str:
    url = f"sqlite:///{path}"
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE jobs (id TEXT PRIMARY KEY, state TEXT, updated_at FLOAT)"))
        conn.execute(text("CREATE INDEX jobs_state_updated ON jobs (state, updated_at)"))
    engine.dispose()
    return url


def _write(url: str, rows: list[tuple[str, str, float]]) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        for job_id, state, updated in rows:
            conn.execute(text("INSERT INTO jobs VALUES (:i, :s, :u)"), {"i": job_id, "s": state, "u": updated})
    engine.dispose()


def test_ended_jobs_sums_the_terminal_states_of_the_gauge() -> None:
    scrape = {'muster_jobs{state="SUCCEEDED"}': 7.0, 'muster_jobs{state="FAILED"}': 2.0,
              'muster_jobs{state="RUNNING"}': 40.0, 'muster_jobs{state="QUEUED"}': 3.0, "muster_leader": 1.0}
    assert ended_jobs(scrape) == 9
    assert ended_jobs({"muster_leader": 1.0}) is None


async def test_catch_up_waits_for_rows_written_late_and_reports_those_never_written(tmp_path: Path) -> None:
    url = _jobs_table(tmp_path / "h.db")
    since = time.time() - 10
    _write(url, [("early", "SUCCEEDED", since + 1), ("before", "SUCCEEDED", since - 5), ("live", "RUNNING", since + 2)])
    lag = HistoryLag(url, since=since, every_s=0.05)
    stop = asyncio.Event()
    poller = asyncio.create_task(lag.run(stop))
    waiting = asyncio.create_task(lag.catch_up(3, timeout=120))
    await eventually(lambda: lag.lag, timeout=60, what="the first poll")
    # The row older than the window and the live one are not counted: one of three read.
    assert not waiting.done() and set(lag.lag) == {"early"}
    await asyncio.to_thread(_write, url, [("late1", "FAILED", since + 3), ("late2", "SUCCEEDED", since + 4)])
    await asyncio.wait_for(waiting, timeout=60)
    assert set(lag.lag) == {"early", "late1", "late2"}
    await lag.catch_up(4, timeout=0.2)  # a fourth row never comes
    stop.set()
    await poller
    rep = lag.finish()
    assert rep["rows"] == 3 and rep["expected_rows"] == 4 and rep["missing_at_end"] == 1
    assert rep["seen_only_at_the_end"] == 0 and rep["query_errors"] == 0 and rep["late_rows"] == 0
    assert rep["ms"]["n"] == 3


async def test_a_row_written_older_than_the_window_gets_its_lag(tmp_path: Path) -> None:
    """A historian that resumes after a failover may write a row that ended long before the
    newest one read: the poll's count finds it and it is measured, with its whole lag."""
    url = _jobs_table(tmp_path / "h.db")
    since = time.time() - 100
    _write(url, [("new", "SUCCEEDED", since + 90)])
    lag = HistoryLag(url, since=since, every_s=0.05, margin_s=30)
    assert lag.poll_once() == 1 and lag.late_rows == 0
    _write(url, [("old", "FAILED", since + 10)])  # 80 s older than the newest: outside the window
    assert lag.poll_once() == 1
    assert set(lag.lag) == {"new", "old"} and lag.late_rows == 1 and lag.late_reads == 1
    assert lag.lag["old"] >= 80  # its end, 90 s ago, to now
    assert lag.poll_once() == 0 and lag.late_reads == 1  # nothing new: the count matches, no full read
    rep = lag.finish()
    assert rep["rows"] == 2 and rep["late_rows"] == 1 and rep["seen_only_at_the_end"] == 0


async def test_without_a_count_from_the_leader_nothing_is_waited_for(tmp_path: Path) -> None:
    url = _jobs_table(tmp_path / "h.db")
    lag = HistoryLag(url, since=time.time())
    await lag.catch_up(None, timeout=120)
    rep = lag.finish()
    assert rep["expected_rows"] is None and rep["missing_at_end"] is None and rep["caught_up_wait_s"] is None
