"""A fresh, migrated database for a benchmark: on --dsn's server, or on an embedded one in a temporary
directory that is stopped and removed afterwards."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import conninfo

from jobsup.db import embedded
from jobsup.db.migrate import migrate


@contextmanager
def database(server: str | None, name: str) -> Iterator[str]:
    """Yields the DSN of database `name` (dropped first if left by an earlier run), migrated."""
    tmp = None
    if server is None:
        tmp = Path(tempfile.mkdtemp(prefix=f"{name}-"))
        server = embedded.ensure_running(tmp / "pgdata")
    try:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {name}")
        dsn = conninfo.make_conninfo(server, dbname=name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
        yield dsn
    finally:
        if tmp is not None:
            embedded.stop(tmp / "pgdata")
            shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def empty(dsn: str | None, prefix: str) -> Iterator[str]:
    """Yields `dsn` (a database to fill) or, without one, an embedded server's in a temporary directory,
    stopped and removed afterwards; migrated either way. A database whose jobs table holds rows is
    refused (SystemExit, exit 1): a benchmark that loads a million rows must not land in a real one."""
    tmp = None if dsn else Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        dsn = dsn or embedded.ensure_running(tmp / "pg")
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
            if conn.execute("SELECT EXISTS (SELECT 1 FROM jobsup.jobs)").fetchone()[0]:
                raise SystemExit("the database already holds jobs: give an empty scratch database")
        yield dsn
    finally:
        if tmp is not None:
            embedded.stop(tmp / "pg")
            shutil.rmtree(tmp, ignore_errors=True)
