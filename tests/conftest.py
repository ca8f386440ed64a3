"""A real PostgreSQL for every test: the embedded server started once per session, or JOBSUP_TEST_DSN.

Each test gets its own database, cloned from a migrated template, so tests never see each other's jobs.

Tests that start a supervisor or another long-running process, or take more than about a second, are
marked `slow`, which `make test-fast` (pytest -m "not slow") leaves out. A test that uses a fixture of
SLOW_FIXTURES below is marked here; a module whose tests are all slow says so with `pytestmark`, and
any other slow test with `@pytest.mark.slow`.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from jobsup.db import embedded
from jobsup.db.migrate import migrate

from .helpers import TEMPLATE, with_dbname

_counter = itertools.count()

# The apps the tests start supervisors on hold no doctests, and importing one fails (broken) or waits
# (slow) on purpose: --doctest-modules leaves them alone.
collect_ignore = ["apps"]

# Fixtures that start long-running processes: a test that uses one (directly or through another
# fixture) is marked slow.
SLOW_FIXTURES = {
    "start": "real `jobsup start` supervisors",
    "bouncer": "a real PgBouncer",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not item.get_closest_marker("slow") and SLOW_FIXTURES.keys() & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def pg_data_dir() -> Iterator[Path | None]:
    """The embedded server's data directory, or None when the tests use JOBSUP_TEST_DSN.

    A directory of its own under /tmp rather than pytest's tmp_path: pytest prunes old session
    directories when a new session starts, which would pull the data from under a running server, and
    a short path keeps the server's Unix socket within its length limit.
    """
    if os.environ.get("JOBSUP_TEST_DSN"):
        yield None
        return
    base = Path(tempfile.mkdtemp(prefix="jobsup-test-"))
    try:
        yield base / "pgdata"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def server_dsn(pg_data_dir: Path | None) -> Iterator[str]:
    if pg_data_dir is None:
        yield os.environ["JOBSUP_TEST_DSN"]
        return
    dsn = embedded.ensure_running(pg_data_dir)
    try:
        yield dsn
    finally:
        embedded.stop(pg_data_dir)


@pytest.fixture(scope="session")
def template_dsn(server_dsn: str) -> str:
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {TEMPLATE}")
    dsn = with_dbname(server_dsn, TEMPLATE)
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
    return dsn


@contextmanager
def scratch_database(server_dsn: str, prefix: str, create: str) -> Iterator[str]:
    """A database made for one test by `create` (CREATE DATABASE {name} ...), dropped afterwards."""
    name = f"{prefix}_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(create.format(name=name))
    try:
        yield with_dbname(server_dsn, name)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def dsn(server_dsn: str, template_dsn: str) -> Iterator[str]:
    """A fresh, migrated database of this test's own."""
    # WAL_LOG copies the small template through the WAL: about half the time of FILE_COPY, whose two
    # checkpoints flush whatever the tests before wrote.
    with scratch_database(
        server_dsn, "jobsup_test", f"CREATE DATABASE {{name}} TEMPLATE {TEMPLATE} STRATEGY WAL_LOG"
    ) as url:
        yield url


@pytest.fixture
def empty_dsn(server_dsn: str) -> Iterator[str]:
    """A fresh database without the jobsup schema."""
    with scratch_database(server_dsn, "jobsup_empty", "CREATE DATABASE {name}") as url:
        yield url


@pytest.fixture
def start(dsn: str) -> Iterator:
    """start(*flags, procs=2) runs `jobsup start` on this test's database; all are killed at the end."""
    from .supervisor_helpers import Supervisor

    started: list[Supervisor] = []

    def _start(*args: str, **kwargs) -> Supervisor:
        sup = Supervisor(dsn, *args, **kwargs)
        started.append(sup)
        return sup

    yield _start
    for sup in started:
        sup.close()


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(dsn, autocommit=True) as connection:
        yield connection


@pytest.fixture(scope="session")
def bouncer(server_dsn: str) -> Iterator[str]:
    """A real PgBouncer in transaction pooling mode in front of the test server, one per run."""
    from . import pgbouncer

    if pgbouncer.binary() is None:
        pytest.skip(
            "pgbouncer is not installed (`make test` installs Debian's pgbouncer package when run "
            "as root; otherwise: apt-get install pgbouncer)"
        )
    with pgbouncer.running(server_dsn) as url:
        yield url


@pytest.fixture
def pooled_dsn(bouncer: str, dsn: str) -> str:
    """This test's database, through PgBouncer."""
    return with_dbname(bouncer, psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])
