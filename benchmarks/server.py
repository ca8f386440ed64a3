"""The server a benchmark runs on: `--dsn`, or an embedded PostgreSQL in a temporary directory."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import conninfo

from jobsup.db import embedded


@contextmanager
def fresh_database(server: str | None, name: str) -> Iterator[str]:
    """The DSN of database `name`, dropped and created anew on `server` (None: a temporary embedded
    server, stopped and removed afterwards)."""
    tmp = None
    if server is None:
        tmp = Path(tempfile.mkdtemp(prefix="jobsup-bench-"))
        server = embedded.ensure_running(tmp / "pgdata")
    try:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {name}")
        yield conninfo.make_conninfo(server, dbname=name)
    finally:
        if tmp is not None:
            embedded.stop(tmp / "pgdata")
            shutil.rmtree(tmp, ignore_errors=True)
