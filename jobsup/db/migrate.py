"""Numbered schema migrations, shipped in jobsup/db/migrations as NNNN_name.sql.

Applied in order, each in the transaction that records it in jobsup.migrations, under an advisory lock:
two `jobsup migrate` at once apply each migration once, and running it again changes nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import psycopg

from jobsup.db.sql import STATEMENTS as SQL
from jobsup.db.sql import one_row
from jobsup.errors import SchemaMissing

# Key of the advisory lock that serialises migrations ("jobsupmg" as a 64-bit integer).
MIGRATION_LOCK = 0x6A6F627375706D67

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def available() -> list[Migration]:
    found = []
    for entry in resources.files("jobsup.db").joinpath("migrations").iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text()))
    return sorted(found, key=lambda m: m.version)


LATEST = available()[-1].version


def migrate(conn: psycopg.Connection) -> list[Migration]:
    """Apply what is missing; return what was applied now (empty when up to date)."""
    applied_now = []
    outermost = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with conn.transaction():
        if outermost:  # inside a caller's transaction, its isolation level is the caller's choice
            conn.execute(SQL["migration_isolation"])
        conn.execute(SQL["migration_lock"], {"key": MIGRATION_LOCK})
        # CREATE SCHEMA IF NOT EXISTS is not safe against itself; under the lock it runs alone.
        conn.execute("CREATE SCHEMA IF NOT EXISTS jobsup")
        conn.execute(SQL["migrations_table"])
        done = {row[0] for row in conn.execute(SQL["migrations_applied"])}
        for migration in available():
            if migration.version in done:
                continue
            conn.execute(migration.sql.encode())  # no parameters: sent as one simple query
            conn.execute(SQL["migration_done"], {"version": migration.version, "name": migration.name})
            applied_now.append(migration)
    return applied_now


def schema_version(conn: psycopg.Connection) -> int:
    """The applied version, 0 when the schema is absent."""
    if not one_row(conn.execute(SQL["schema_exists"]).fetchone(), "schema_exists")[0]:
        return 0
    return one_row(conn.execute(SQL["schema_version"]).fetchone(), "schema_version")[0]


def describe_server(conn: psycopg.Connection) -> str:
    """Which database `conn` is on, as an error names it: the database and its server (the embedded
    server by its data directory, whose Unix socket is the directory itself), never the password."""
    info = conn.info
    host = info.host or "localhost"
    if host.startswith("/") and (Path(host) / "PG_VERSION").is_file():
        return f"database {info.dbname!r} of the embedded PostgreSQL in {host}"
    if host.startswith("/"):
        return f"database {info.dbname!r} on the Unix socket in {host} (port {info.port}), user {info.user!r}"
    return f"database {info.dbname!r} on {host}:{info.port}, user {info.user!r}"


# A command that reaches a database without the schema has most often reached the wrong one: a
# forgotten JOBSUP_DATA_DIR starts a second, empty embedded server rather than failing.
_WHICH_SERVER = "--data-dir or JOBSUP_DATA_DIR for an embedded server, --dsn or JOBSUP_DSN for your own"


def require_schema(conn: psycopg.Connection) -> None:
    """SchemaMissing, telling the user which database it looked in, to run `jobsup migrate` there, or
    to name the server that has the schema, unless the schema is current."""
    version = schema_version(conn)
    if version == 0:
        raise SchemaMissing(
            f"the jobsup schema is not in this database ({describe_server(conn)}): run `jobsup migrate` "
            f"first, or name the server that has it ({_WHICH_SERVER})"
        )
    if version < LATEST:
        raise SchemaMissing(
            f"the jobsup schema of {describe_server(conn)} is at version {version}, this jobsup needs "
            f"{LATEST}: run `jobsup migrate`"
        )
