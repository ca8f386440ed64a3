"""The schema as a fresh `jobsup migrate` leaves it, read from PostgreSQL's catalogs: jobsup/db/schema.sql.

    python -m tests.schema_file            # (make schema) rewrite jobsup/db/schema.sql
    python -m tests.schema_file --check    # exit 1 if the file differs from a fresh migrate
    python -m tests.schema_file --dsn DSN  # on that server (a database of its own, dropped after)

Without --dsn it uses JOBSUP_TEST_DSN if set, else an embedded server of its own in a temporary
directory. The file is read from the catalogs rather than written by pg_dump: pg_dump must match the
server's version and prints settings and ownership that vary from one server to the next. Everything is
sorted by name, and what PostgreSQL 15 to 18 print differently is left out or normalised (`describe`),
so the file is the same from any of them: tests/test_schema_file.py holds the suite's server to it.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql

from jobsup.db import embedded
from jobsup.db import migrate as migrations

from .helpers import ROOT, with_dbname

SCHEMA_FILE = ROOT / "jobsup" / "db" / "schema.sql"
REGENERATE = "make schema"

HEADER = """\
-- The jobsup schema as a fresh `jobsup migrate` leaves it: migrations {first:04d} to {last:04d}, applied in order.
-- Generated from PostgreSQL's catalogs by `{regenerate}` (tests/schema_file.py); never edited by hand.
-- A change to the schema is a new migration in jobsup/db/migrations, then `{regenerate}`: commit both.
-- tests/test_schema_file.py fails while this file and a fresh migrate disagree.
--
-- Each object names the migrations that create or change it. Functions are as PostgreSQL keeps them
-- (their bodies with their comments); the comments on them in the migrations say why they are so.
-- Sorted by name within each section; owners, grants and server settings left out. The claim of limited
-- jobs, in the order a claim calls it: claim_limited_with_meta -> claim_limited -> rate_room, rate_next,
-- rate_after (docs/design/architecture.md, Limits).
"""

# Names of the objects of the schema, each with the migrations that name it in a statement that creates,
# alters, replaces or drops it (comment lines left out).
_COMMENT_LINE = re.compile(r"--[^\n]*")


def _migrations_naming(pattern: str) -> list[str]:
    found = []
    regex = re.compile(pattern, re.IGNORECASE)
    for migration in migrations.available():
        if regex.search(_COMMENT_LINE.sub("", migration.sql)):
            found.append(f"{migration.version:04d}")
    return found


def _origin(kind: str, name: str) -> str:
    """`-- migrations 0001, 0008` for an object: where a reader finds why it is as it is."""
    bare = re.escape(name)
    patterns = {
        "type": rf"TYPE\s+jobsup\.{bare}\b",
        "table": rf"TABLE\s+(IF\s+NOT\s+EXISTS\s+)?(ONLY\s+)?jobsup\.{bare}\b",
        "index": rf"INDEX\s+(CONCURRENTLY\s+)?(IF\s+(NOT\s+)?EXISTS\s+)?(jobsup\.)?{bare}\b",
        "function": rf"FUNCTION\s+jobsup\.{bare}\s*\(",
        "trigger": rf"TRIGGER\s+(IF\s+EXISTS\s+)?{bare}\b",
        "view": rf"VIEW\s+jobsup\.{bare}\b",
        "rows": rf"INSERT\s+INTO\s+jobsup\.{bare}\b",
    }
    found = _migrations_naming(patterns[kind])
    if kind == "table" and name == "migrations":
        return "-- made by `jobsup migrate` itself (migrations_table, jobsup/db/queries/migrate.sql)"
    if not found:
        return "-- (no migration names it)"
    return ("-- migration " if len(found) == 1 else "-- migrations ") + ", ".join(found)


def _types(conn: psycopg.Connection) -> Iterator[str]:
    """Composite types of their own (not a table's row type) and enums."""
    rows = conn.execute(
        """
        SELECT t.typname, t.typtype, t.typrelid
        FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = 'jobsup' AND t.typtype IN ('c', 'e', 'd')
          AND (t.typtype <> 'c' OR (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c')
        ORDER BY t.typname
        """
    ).fetchall()
    for name, kind, relid in rows:
        if kind == "c":
            fields = conn.execute(
                "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
                " WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                (relid,),
            ).fetchall()
            body = ",\n".join(f"    {field} {type_}" for field, type_ in fields)
            yield f"{_origin('type', name)}\nCREATE TYPE jobsup.{name} AS (\n{body}\n);"
        elif kind == "e":
            labels = conn.execute(
                "SELECT enumlabel FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid"
                " WHERE t.typname = %s AND t.typnamespace = 'jobsup'::regnamespace ORDER BY enumsortorder",
                (name,),
            ).fetchall()
            values = ", ".join("'" + label.replace("'", "''") + "'" for (label,) in labels)
            yield f"{_origin('type', name)}\nCREATE TYPE jobsup.{name} AS ENUM ({values});"
        else:
            (base,) = conn.execute(
                "SELECT format_type(typbasetype, typtypmod) FROM pg_type"
                " WHERE typname = %s AND typnamespace = 'jobsup'::regnamespace",
                (name,),
            ).fetchone() or ("?",)
            yield f"{_origin('type', name)}\nCREATE DOMAIN jobsup.{name} AS {base};"


def _tables(conn: psycopg.Connection) -> Iterator[str]:
    tables = conn.execute(
        "SELECT c.oid, c.relname FROM pg_class c WHERE c.relnamespace = 'jobsup'::regnamespace"
        " AND c.relkind IN ('r', 'p') ORDER BY c.relname"
    ).fetchall()
    for oid, name in tables:
        # A constraint trigger is listed with the triggers; a NOT NULL with its column (below).
        # Columns in their order in the row (a column added later comes last, in any database that ran
        # the same migrations); NOT NULL from the column itself, as PostgreSQL 18 also keeps it as a
        # constraint (contype 'n') and 15 does not.
        columns = conn.execute(
            """
            SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity,
                   a.attgenerated, pg_get_expr(d.adbin, d.adrelid)
            FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
            WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
            ORDER BY a.attnum
            """,
            (oid,),
        ).fetchall()
        lines = []
        for column, type_, not_null, identity, generated, default in columns:
            line = f"    {column} {type_}"
            if identity:
                line += " GENERATED " + ("ALWAYS" if identity == "a" else "BY DEFAULT") + " AS IDENTITY"
            elif generated:
                line += f" GENERATED ALWAYS AS ({default}) STORED"
            elif default is not None:
                line += f" DEFAULT {default}"
            if not_null:
                line += " NOT NULL"
            lines.append(line)
        constraints = conn.execute(
            "SELECT conname, pg_get_constraintdef(oid, true) FROM pg_constraint"
            " WHERE conrelid = %s AND contype NOT IN ('n', 't') ORDER BY conname",
            (oid,),
        ).fetchall()
        lines += [f"    CONSTRAINT {constraint} {definition}" for constraint, definition in constraints]
        body = ",\n".join(lines)
        yield f"{_origin('table', name)}\nCREATE TABLE jobsup.{name} (\n{body}\n);"


# The objects PostgreSQL prints whole: a query of (name, definition) rows for each, in the file's order.
_VIEWS = """
    SELECT c.relname, 'CREATE VIEW jobsup.' || c.relname || E' AS\n' || pg_get_viewdef(c.oid, true)
    FROM pg_class c WHERE c.relnamespace = 'jobsup'::regnamespace AND c.relkind IN ('v', 'm') ORDER BY 1
"""
# Every index, those behind primary keys and unique constraints too (the definition names the table).
_INDEXES = """
    SELECT c.relname, pg_get_indexdef(c.oid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE c.relnamespace = 'jobsup'::regnamespace ORDER BY 1
"""
_FUNCTIONS = """
    SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.pronamespace = 'jobsup'::regnamespace
    ORDER BY p.proname, pg_get_function_identity_arguments(p.oid)
"""
_TRIGGERS = """
    SELECT t.tgname, pg_get_triggerdef(t.oid, true) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
    WHERE c.relnamespace = 'jobsup'::regnamespace AND NOT t.tgisinternal ORDER BY t.tgname, c.relname
"""


def _whole(kind: str, query: str) -> Callable[[psycopg.Connection], Iterator[str]]:
    def read(conn: psycopg.Connection) -> Iterator[str]:
        for name, definition in conn.execute(query):
            origin = _origin(kind, name)
            if kind == "index" and origin.endswith("(no migration names it)"):
                origin = "-- made by its table's constraint"
            yield f"{origin}\n{definition.rstrip().rstrip(';')};"

    return read


def _rows(conn: psycopg.Connection) -> Iterator[str]:
    """The rows the migrations insert (jobsup.migrations left out: the header names its versions)."""
    tables = conn.execute(
        "SELECT c.oid, c.relname FROM pg_class c WHERE c.relnamespace = 'jobsup'::regnamespace"
        " AND c.relkind IN ('r', 'p') AND c.relname <> 'migrations' ORDER BY c.relname"
    ).fetchall()
    for oid, name in tables:
        columns = [
            column
            for (column,) in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped"
                " AND attgenerated = '' ORDER BY attnum",
                (oid,),
            )
        ]
        as_text = sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in columns)
        query = sql.SQL("SELECT {} FROM {} ORDER BY {}").format(
            as_text,
            sql.Identifier("jobsup", name),
            sql.SQL(", ").join(sql.Literal(n) for n in range(1, len(columns) + 1)),
        )
        for row in conn.execute(query):
            values = ", ".join("NULL" if v is None else "'" + v.replace("'", "''") + "'" for v in row)
            into = ", ".join(columns)
            yield f"{_origin('rows', name)}\nINSERT INTO jobsup.{name} ({into}) VALUES ({values});"


SECTIONS = [
    ("Types", _types),
    ("Tables", _tables),
    ("Views", _whole("view", _VIEWS)),
    ("Indexes", _whole("index", _INDEXES)),
    ("Functions", _whole("function", _FUNCTIONS)),
    ("Triggers", _whole("trigger", _TRIGGERS)),
    ("Rows", _rows),
]


def describe(conn: psycopg.Connection) -> str:
    """The text of jobsup/db/schema.sql for the database `conn` is on (migrated)."""
    available = migrations.available()
    parts = [HEADER.format(first=available[0].version, last=available[-1].version, regenerate=REGENERATE)]
    for title, read in SECTIONS:
        entries = list(read(conn))
        if not entries:
            continue
        parts.append(f"-- {title} {'-' * (96 - len(title))}\n")
        parts.extend(entry + "\n" for entry in entries)
    return "\n".join(parts)


def fresh(server_dsn: str) -> str:
    """describe() of a database of its own on `server_dsn` after a fresh `jobsup migrate`, dropped after."""
    name = f"jobsup_schema_{os.getpid()}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
    try:
        with psycopg.connect(with_dbname(server_dsn, name), autocommit=True) as conn:
            migrations.migrate(conn)
            return describe(conn)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextmanager
def _server(dsn: str | None) -> Iterator[str]:
    """`dsn`, JOBSUP_TEST_DSN, or an embedded server of this run's own."""
    dsn = dsn or os.environ.get("JOBSUP_TEST_DSN")
    if dsn:
        yield dsn
        return
    with tempfile.TemporaryDirectory(prefix="jobsup-schema-") as base:
        data_dir = Path(base) / "pgdata"
        try:
            yield embedded.ensure_running(data_dir)
        finally:
            embedded.stop(data_dir)


USAGE = "usage: python -m tests.schema_file [--check] [--dsn DSN]"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    rest = [a for a in argv if a != "--check"]
    dsn = None
    if rest[:1] == ["--dsn"] and len(rest) == 2:
        dsn = rest[1]
    elif rest:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        with _server(dsn) as server:
            text = fresh(server)
    except psycopg.Error as error:  # a server that is down, a role that may not create a database
        print(f"schema_file: {str(error).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    relative = SCHEMA_FILE.relative_to(ROOT)
    if check:
        if SCHEMA_FILE.exists() and SCHEMA_FILE.read_text() == text:
            print(f"{relative} matches a fresh migrate")
            return 0
        print(f"{relative} differs from a fresh migrate: run `{REGENERATE}` and commit it", file=sys.stderr)
        return 1
    SCHEMA_FILE.write_text(text)
    print(f"wrote {relative} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
