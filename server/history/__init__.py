"""Job history in SQL (SQLite by default, PostgreSQL in production).

    models       the tables (SQLModel)
    database     History: idempotent writes of job records, queries for the API and
                 console, retention; the Alembic schema upgrade
    recorder     copies host events and alerts from their streams into the database
    historian    the process that writes history beside a server
    migrations/  Alembic scripts (the schema is owned by them)

May import: `wire`, `server.state` (what a record means), SQLModel/SQLAlchemy, Alembic
and psycopg. Never the API, the console or the scheduler.
"""
