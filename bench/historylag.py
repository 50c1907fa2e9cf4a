"""History lag: from a job's end, as the leader recorded it (the `updated_at` of its
terminal record), to its terminal row being readable in the history database.

The bench polls the `jobs` table every `every_s` for terminal rows it has not seen yet
(the (state, updated_at) index answers it) and takes the poll that first returns a row as
the moment it became readable: a lag is late by at most one poll interval plus the query.
Each poll reads rows whose `updated_at` is within `margin_s` of the newest one seen, so
the query stays small. The historian writes rows in the order of the state stream, but a
historian that resumes after a failover may write a row older than that margin: each poll
also counts the terminal rows since the start, and when the table holds more than were
seen it reads them all once, so such a row gets its lag (a large one) instead of being
missed (`late_rows`, `late_reads`). `finish` reads the table once more and counts any row
only that read found (`seen_only_at_the_end`) rather than assume there are none.

A row that is never written before the run ends would be missing from the figures, not
late in them (after a failover the historian may take a while to resume), so the run
ends with `catch_up`: it waits, up to a bound, until the table holds as many rows as the
leader counts jobs that ended in the window (`expected_rows`), and `finish` reports any
still missing (`missing_at_end`) and how long the wait took.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sqlalchemy import bindparam, create_engine, text

from bench.stats import summary_ms
from wire.messages import JobState
from wire.stopping import pause

TERMINAL = tuple(s.value for s in JobState if s.terminal)
_ROWS = text("SELECT id, updated_at FROM jobs WHERE state IN :states AND updated_at >= :lo").bindparams(
    bindparam("states", expanding=True))
_COUNT = text("SELECT count(*) FROM jobs WHERE state IN :states AND updated_at >= :lo").bindparams(
    bindparam("states", expanding=True))


def sqlite_read_only(path: str) -> str:
    """The SQLAlchemy URL that opens a SQLite file read only (never creates or locks it for writing)."""
    return f"sqlite:///file:{path}?mode=ro&uri=true"


def ended_jobs(metrics: dict[str, float]) -> int | None:
    """Jobs in a terminal state in a server's live state (its `muster_jobs` gauge), or None
    when the scrape has no such gauge."""
    found = [v for k, v in metrics.items() if k.startswith("muster_jobs{")
             and any(f'state="{s}"' in k for s in TERMINAL)]
    return int(sum(found)) if found else None


class HistoryLag:
    def __init__(self, url: str, since: float, every_s: float = 0.5, margin_s: float = 30.0) -> None:
        self.engine = create_engine(url, pool_size=1, max_overflow=0) if url.startswith("postgresql") \
            else create_engine(url)
        self.since = since
        self.every_s = every_s
        self.margin_s = margin_s
        self.lag: dict[str, float] = {}  # job -> seconds from its end to its row being read
        self.newest = since
        self.errors = 0
        self.expected: int | None = None  # jobs the leader counted as ended in the window (catch_up)
        self.waited_s: float | None = None
        self.late_reads = 0  # polls that found a row older than the window and read the whole table
        self.late_rows = 0  # rows those reads found (written older than the window)

    def _rows(self, lo: float) -> list[tuple[str, float]]:
        with self.engine.connect() as conn:
            return [(r[0], float(r[1])) for r in conn.execute(_ROWS, {"states": list(TERMINAL), "lo": lo})]

    def _count(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(_COUNT, {"states": list(TERMINAL), "lo": self.since}).scalar_one())

    def poll_once(self) -> int:
        """One poll: the rows not seen before get their lag. Returns how many. When the
        table holds more terminal rows than were seen (one written older than the
        window), all of them are read once."""
        lo = max(self.since, self.newest - self.margin_s)
        new = self._take(self._rows(lo))
        if self._count() > len(self.lag):
            self.late_reads += 1
            late = self._take(self._rows(self.since), older_than=lo)
            new += late
        return new

    def _take(self, rows: list[tuple[str, float]], older_than: float | None = None) -> int:
        """Give each row not seen before its lag; count those that ended before
        `older_than` (outside the window just read) as `late_rows`."""
        now = time.time()
        new = 0
        for job_id, updated in rows:
            if job_id not in self.lag:
                self.lag[job_id] = max(0.0, now - updated)
                self.newest = max(self.newest, updated)
                new += 1
                if older_than is not None and updated < older_than:
                    self.late_rows += 1
        return new

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.to_thread(self.poll_once)
            except Exception:  # noqa: BLE001 - the database not there yet, or busy: counted, polled again
                self.errors += 1
            await pause(stop, self.every_s)

    async def catch_up(self, expected: int | None, timeout: float) -> None:
        """Wait (while `run` polls) until at least `expected` rows have been read, or
        `timeout` seconds; `expected` None: the leader's count is not known, no wait."""
        self.expected = expected
        if expected is None:
            return
        t0 = time.monotonic()
        while len(self.lag) < expected and time.monotonic() - t0 < timeout:
            await asyncio.sleep(self.every_s)
        self.waited_s = round(time.monotonic() - t0, 1)

    def finish(self) -> dict[str, Any]:
        """The lag figures; one last full read counts the terminal rows the polls missed."""
        missed = None
        try:
            self.poll_once()  # rows written since the last poll
            rows = self._rows(self.since)
            missed = self._take(rows)  # written between that poll's two reads
        except Exception:  # noqa: BLE001
            self.errors += 1
        self.engine.dispose()
        return {"ms": summary_ms(list(self.lag.values())), "rows": len(self.lag), "seen_only_at_the_end": missed,
                "late_rows": self.late_rows, "late_reads": self.late_reads, "poll_every_s": self.every_s,
                "query_errors": self.errors,
                "expected_rows": self.expected,
                "missing_at_end": None if self.expected is None else max(0, self.expected - len(self.lag)),
                "caught_up_wait_s": self.waited_s,
                "note": "a job's end = updated_at of its terminal record (the leader's clock); read = the first "
                        "poll that returned its terminal row; late by at most one poll interval plus the query"}
