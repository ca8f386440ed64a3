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

from jobsup import embedded
from jobsup.migrate import migrate


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
