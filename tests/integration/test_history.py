"""History on a real PostgreSQL server (a throwaway server per session, a fresh database
per test): every test of tests/unit/test_history.py that takes a `db_url`, run again here
on PostgreSQL; and three processes upgrading one database at once (SQLite and
PostgreSQL)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from server.history.database import History
from tests.conftest import ROOT
from tests.integration.postgres import postgres_server, postgres_url  # noqa: F401 - fixtures

# Collected here again, each with this module's `db_url` (PostgreSQL); `hist` is the fixture.
from tests.unit.test_history import (  # noqa: F401
    _schema_diff,
    hist,
    test_a_database_a_newer_release_migrated_is_used_as_it_is,
    test_a_job_settled_as_ended_is_charged_no_longer,
    test_adopts_pre_alembic_database,
    test_filters_and_sorting,
    test_five_thousand_jobs,
    test_keyset_pages_neither_repeat_nor_skip_while_rows_are_added,
    test_lifecycle_one_row_and_full_timeline,
    test_list_events_and_attempts,
    test_migrations_apply_and_match_models,
    test_older_revision_never_overwrites_newer,
    test_raw_records_decoded_only_when_newest,
    test_records_of_a_stream_numbered_anew_replace_rows_of_the_old_numbering,
    test_replicas_write_concurrently_once,
    test_retention_prunes_old_events_of_no_job,
    test_retention_prunes_only_old_finished_jobs,
    test_retry_keeps_every_attempt,
    test_the_group_column_is_filled_from_the_documents_of_rows_written_before_it,
    test_the_stream_position_moves_only_once_what_came_before_it_is_written,
    test_usage_of_adjacent_periods_adds_up_to_the_whole,
    test_usage_sums_attempts_per_queue_user_and_model,
)


@pytest.fixture(params=["postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_concurrent_processes_upgrade_once(db_url: str) -> None:
    code = "import sys; from server.history.database import History; History(sys.argv[1]).close()"
    procs = [subprocess.Popen([sys.executable, "-c", code, db_url], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(3)]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out.decode()
    h = History(db_url)
    try:
        assert _schema_diff(h) == []
    finally:
        h.close()
