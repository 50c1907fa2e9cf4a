"""Alembic environment for Muster's history database.

`History` runs it programmatically and hands over an open connection in
``config.attributes["connection"]``; the ``alembic`` command line (with the repository's
``alembic.ini``) builds an engine from ``sqlalchemy.url`` / ``MUSTER_DB_URL`` instead.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import engine_from_config, pool

from server.history.models import SQLModel  # registers the tables on SQLModel.metadata

config = context.config
if config.config_file_name is not None and config.attributes.get("connection") is None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = SQLModel.metadata


def _configure(**kw: object) -> None:
    context.configure(target_metadata=target_metadata, compare_type=True, **kw)  # type: ignore[arg-type]


def run_offline() -> None:
    url = os.environ.get("MUSTER_DB_URL") or config.get_main_option("sqlalchemy.url")
    _configure(url=url, literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    conn = config.attributes.get("connection")
    if conn is not None:
        _configure(connection=conn)
        with context.begin_transaction():
            context.run_migrations()
        return
    section = config.get_section(config.config_ini_section, {})
    if os.environ.get("MUSTER_DB_URL"):
        section["sqlalchemy.url"] = os.environ["MUSTER_DB_URL"]
    engine = engine_from_config(section, prefix="sqlalchemy.", poolclass=pool.NullPool)
    with engine.connect() as connection:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
