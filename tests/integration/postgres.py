"""A throwaway PostgreSQL server for the test session, and a fresh database per test.

The server binaries (`initdb`, `pg_ctl`, `postgres`) are looked up on PATH, then in
/usr/lib/postgresql/*/bin (newest first), or in $MUSTER_PG_BIN. Missing binaries fail the
tests that need them (CI installs PostgreSQL; nothing is skipped). PostgreSQL refuses to run
as root, so as root the server runs as the `postgres` system user.

Use from a test module or conftest: ``from tests.integration.postgres import postgres_server, postgres_url``
(or ``pytest_plugins = ["tests.postgres"]`` in the top-level conftest).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from server.broker.natsd import free_port

_BINARIES = ("initdb", "pg_ctl", "postgres")


def find_pg_bin() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres, or None."""
    candidates: list[str] = []
    if os.environ.get("MUSTER_PG_BIN"):
        candidates.append(os.environ["MUSTER_PG_BIN"])
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(str(Path(on_path).resolve().parent))
    def _ver(p: str) -> float:
        try:
            return float(Path(p).parent.name)
        except ValueError:
            return 0.0
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_ver, reverse=True)
    for c in candidates:
        d = Path(c)
        if all((d / b).is_file() and os.access(d / b, os.X_OK) for b in _BINARIES):
            return d
    return None


def _free_port() -> int:
    return free_port()  # outside the ephemeral range (server.broker.natsd)


@dataclass
class PostgresServer:
    bindir: Path
    datadir: Path
    sockdir: Path
    port: int
    run_as: str | None  # system user the server runs as (when we are root)
    url: str = ""
    # Commits durable before they are acknowledged (synchronous_commit=on): needed by tests
    # that crash the server; the shared test server trades that for speed.
    durable: bool = False  # SQLAlchemy URL of the session database muster_test

    def admin_url(self, db: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{db}"

    def url_for(self, db: str) -> str:
        return self.admin_url(db)

    def execute(self, sql: str, db: str = "postgres") -> None:
        """Run one statement in autocommit mode (CREATE/DROP DATABASE)."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=db,
                             autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql)  # type: ignore[arg-type]


def _cmd(run_as: str | None, argv: list[str]) -> list[str]:
    if run_as is None:
        return argv
    if shutil.which("runuser"):
        return ["runuser", "-u", run_as, "--", *argv]
    import shlex

    return ["su", run_as, "-s", "/bin/sh", "-c", shlex.join(argv)]


def _run(run_as: str | None, argv: list[str], timeout: float = 120) -> None:
    p = subprocess.run(_cmd(run_as, argv), capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")


def start_postgres(bindir: Path, durable: bool = False) -> PostgresServer:
    run_as: str | None = None
    root = tempfile.mkdtemp(prefix="muster-pg-")
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root, ignore_errors=True)
            pytest.fail("running tests as root needs the `postgres` system user to run PostgreSQL "
                        "(install the postgresql package, or run the tests as a normal user)")
        run_as = "postgres"
        os.chown(root, pw.pw_uid, pw.pw_gid)
    datadir, sockdir = Path(root) / "data", Path(root) / "sock"
    _run(run_as, ["mkdir", "-p", str(sockdir)])
    _run(run_as, [str(bindir / "initdb"), "-D", str(datadir), "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--no-locale", "--no-sync"])
    last_err: Exception | None = None
    for _ in range(5):  # the free port may be taken before the server binds it
        srv = PostgresServer(bindir, datadir, sockdir, _free_port(), run_as, durable=durable)
        try:
            _pg_start(srv)
        except RuntimeError as exc:
            last_err = exc
            time.sleep(0.2)
            continue
        srv.execute("CREATE DATABASE muster_test")
        srv.url = srv.url_for("muster_test")
        return srv
    log = (Path(root) / "server.log").read_text(errors="replace") if (Path(root) / "server.log").exists() else ""
    shutil.rmtree(root, ignore_errors=True)
    raise RuntimeError(f"PostgreSQL did not start: {last_err}\n{log[-4000:]}")


def _pg_start(srv: PostgresServer) -> None:
    opts = (f"-p {srv.port} -k {srv.sockdir} -c listen_addresses=127.0.0.1 -c max_connections=200 "
            + ("-c synchronous_commit=on" if srv.durable else
               "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"))
    _run(srv.run_as, [str(srv.bindir / "pg_ctl"), "-D", str(srv.datadir), "-l",
                      str(srv.datadir.parent / "server.log"), "-o", opts, "-w", "-t", "60", "start"])


def crash_postgres(srv: PostgresServer) -> None:
    """Stop the server the way a crash does (`pg_ctl stop -m immediate`: every backend
    quits at once, no checkpoint), keeping its data for `restart_postgres`."""
    _run(srv.run_as, [str(srv.bindir / "pg_ctl"), "-D", str(srv.datadir), "-m", "immediate", "-w", "stop"],
         timeout=60)


def restart_postgres(srv: PostgresServer) -> None:
    """Start a crashed server again on the same port (it recovers from its WAL)."""
    _pg_start(srv)


def stop_postgres(srv: PostgresServer) -> None:
    try:
        _run(srv.run_as, [str(srv.bindir / "pg_ctl"), "-D", str(srv.datadir), "-m", "immediate", "-w", "stop"],
             timeout=60)
    finally:
        shutil.rmtree(srv.datadir.parent, ignore_errors=True)


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
    srv = start_postgres(bindir)
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
