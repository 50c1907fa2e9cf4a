"""A throwaway PostgreSQL server: what `muster bench --postgres` runs the history on, and
what the tests start once per session.

The server binaries (`initdb`, `pg_ctl`, `postgres`) are looked up in $MUSTER_PG_BIN, on
PATH, then in /usr/lib/postgresql/*/bin (newest first). PostgreSQL refuses to run as root,
so as root the server runs as the `postgres` system user (the Debian package creates it).

`durable=True` is how production runs it: every commit fsync'd before it is acknowledged
(`fsync` and `synchronous_commit` on, PostgreSQL's defaults). Without it the server trades
durability for speed (`fsync=off`, `synchronous_commit=off`), which only tests that never
crash it may do.
"""

from __future__ import annotations

import glob
import os
import pwd
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.errors import BenchError
from server.broker.natsd import free_port

_BINARIES = ("initdb", "pg_ctl", "postgres")
DATABASE = "muster_test"  # the database a new server is given


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


@dataclass
class PostgresServer:
    bindir: Path
    datadir: Path
    sockdir: Path
    port: int
    run_as: str | None  # system user the server runs as (when we are root)
    durable: bool = False  # commits fsync'd before they are acknowledged (synchronous_commit=on)
    url: str = ""  # SQLAlchemy URL of the database DATABASE

    def admin_url(self, db: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{db}"

    def url_for(self, db: str) -> str:
        return self.admin_url(db)

    def execute(self, sql: str, db: str = "postgres") -> None:
        """Run one statement in autocommit mode (CREATE/DROP DATABASE)."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=db,
                             autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql)

    def postmaster_pid(self) -> int | None:
        """The server's main process (for CPU accounting), from its postmaster.pid."""
        try:
            return int((self.datadir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None


def _cmd(run_as: str | None, argv: list[str]) -> list[str]:
    if run_as is None:
        return argv
    if shutil.which("runuser"):
        return ["runuser", "-u", run_as, "--", *argv]
    return ["su", run_as, "-s", "/bin/sh", "-c", shlex.join(argv)]


def _run(run_as: str | None, argv: list[str], timeout: float = 120) -> None:
    p = subprocess.run(_cmd(run_as, argv), capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise BenchError(f"{' '.join(argv)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")


def start_postgres(bindir: Path, durable: bool = False) -> PostgresServer:
    """A new cluster in a temporary directory, started on a free port, with the database
    DATABASE created. Raises BenchError when it cannot be started."""
    run_as: str | None = None
    root = tempfile.mkdtemp(prefix="muster-pg-")
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root, ignore_errors=True)
            raise BenchError("running PostgreSQL as root needs the `postgres` system user "
                             "(install the postgresql package, or run as a normal user)") from None
        run_as = "postgres"
        os.chown(root, pw.pw_uid, pw.pw_gid)
    datadir, sockdir = Path(root) / "data", Path(root) / "sock"
    _run(run_as, ["mkdir", "-p", str(sockdir)])
    _run(run_as, [str(bindir / "initdb"), "-D", str(datadir), "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--no-locale", "--no-sync"])
    last_err: Exception | None = None
    for _ in range(5):  # the free port may be taken before the server binds it
        srv = PostgresServer(bindir, datadir, sockdir, free_port(), run_as, durable=durable)
        try:
            _pg_start(srv)
        except BenchError as exc:
            last_err = exc
            time.sleep(0.2)
            continue
        srv.execute(f"CREATE DATABASE {DATABASE}")
        srv.url = srv.url_for(DATABASE)
        return srv
    log = (Path(root) / "server.log").read_text(errors="replace") if (Path(root) / "server.log").exists() else ""
    shutil.rmtree(root, ignore_errors=True)
    raise BenchError(f"PostgreSQL did not start: {last_err}\n{log[-4000:]}")


def _pg_start(srv: PostgresServer) -> None:
    opts = (f"-p {srv.port} -k {srv.sockdir} -c listen_addresses=127.0.0.1 -c max_connections=200 "
            + ("-c fsync=on -c synchronous_commit=on" if srv.durable else
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
