"""PostgreSQL for the tests: one throwaway server for the test session
(bench.postgres starts it), and a fresh database per test.

Missing binaries fail the tests that need them (CI installs PostgreSQL; nothing is
skipped). Use from a test module or conftest:
``from tests.integration.postgres import postgres_server, postgres_url``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from bench.errors import BenchError
from bench.postgres import (  # noqa: F401 - re-exported for the tests that crash a server
    PostgresServer,
    crash_postgres,
    find_pg_bin,
    restart_postgres,
    start_postgres,
    stop_postgres,
)


def _admin_execute(url: str, sql: str) -> None:
    """Run one statement in autocommit mode on the `postgres` database of `url`'s server."""
    import psycopg
    from sqlalchemy.engine import make_url

    u = make_url(url)
    with psycopg.connect(host=u.host, port=u.port, user=u.username, dbname="postgres",
                         autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A PostgreSQL server for the whole session: yields the SQLAlchemy URL of its
    `muster_test` database (postgresql+psycopg://postgres@127.0.0.1:PORT/muster_test)."""
    bindir = find_pg_bin()
    if bindir is None:
        pytest.fail("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH, in "
                    "/usr/lib/postgresql/*/bin or $MUSTER_PG_BIN: install PostgreSQL "
                    "(Debian/Ubuntu: apt-get install postgresql) to run these tests")
    try:
        srv = start_postgres(bindir)
    except BenchError as exc:
        pytest.fail(str(exc))
    try:
        yield srv.url
    finally:
        stop_postgres(srv)


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """The SQLAlchemy URL of a fresh, empty database on the session server, dropped after the test."""
    from sqlalchemy.engine import make_url

    name = f"t_{uuid.uuid4().hex[:16]}"
    _admin_execute(postgres_server, f'CREATE DATABASE "{name}"')
    try:
        yield make_url(postgres_server).set(database=name).render_as_string(hide_password=False)
    finally:
        _admin_execute(postgres_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
