"""jobsup/db/schema.sql is the schema a fresh `jobsup migrate` makes, to the character, on the suite's
server (the embedded PostgreSQL 18, or JOBSUP_TEST_DSN: it is the same from PostgreSQL 15)."""

from __future__ import annotations

import difflib
import subprocess
import sys

import psycopg
import pytest

from jobsup.db.migrate import LATEST, migrate

from .helpers import ROOT, cli_env
from .schema_file import REGENERATE, SCHEMA_FILE, describe, main


def differences(made: str, kept: str) -> str:
    lines = difflib.unified_diff(
        kept.splitlines(), made.splitlines(), "jobsup/db/schema.sql", "a fresh migrate", lineterm="", n=1
    )
    return "\n".join(list(lines)[:80])


def migrated(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
        return describe(conn)


def test_the_schema_file_is_what_a_fresh_migrate_makes(empty_dsn):
    made, kept = migrated(empty_dsn), SCHEMA_FILE.read_text()
    assert made == kept, (
        f"jobsup/db/schema.sql differs from a fresh `jobsup migrate`: run `{REGENERATE}` and commit it\n"
        + differences(made, kept)
    )
    assert f"migrations 0001 to {LATEST:04d}" in kept.splitlines()[0]


def test_every_object_names_its_migrations():
    kept = SCHEMA_FILE.read_text()
    assert "(no migration names it)" not in kept
    # The limited claim, each layer with the migration that last wrote it.
    for origin, function in [
        ("-- migration 0008", "claim_limited("),
        ("-- migrations 0010, 0012", "claim_limited_with_meta("),
        ("-- migration 0008", "rate_room("),
    ]:
        assert f"{origin}\nCREATE OR REPLACE FUNCTION jobsup.{function}" in kept


@pytest.mark.parametrize(
    "change",
    [
        "CREATE INDEX jobs_kind_idx ON jobsup.jobs (kind)",
        "ALTER TABLE jobsup.jobs ADD COLUMN extra text",
        "CREATE OR REPLACE FUNCTION jobsup.rate_room(tat timestamptz, at timestamptz, rate integer,"
        " period float8, burst integer) RETURNS integer LANGUAGE sql IMMUTABLE AS $$ SELECT burst $$",
        "DROP TRIGGER jobs_claim_protocol ON jobsup.jobs",
        "UPDATE jobsup.compat SET oldest = 9",
        "CREATE TYPE jobsup.mood AS ENUM ('calm')",
        "CREATE VIEW jobsup.ready AS SELECT id FROM jobsup.jobs WHERE status = 'queued'",
    ],
    ids=["index", "column", "function", "trigger", "row", "type", "view"],
)
def test_a_change_to_the_schema_changes_the_file(empty_dsn, change):
    """What the test above would miss if the generator did not read it."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn)
        conn.execute(change)
        assert describe(conn) != SCHEMA_FILE.read_text()


def test_bad_arguments_are_one_line_and_exit_2(capsys):
    assert main(["--dsn"]) == 2
    assert main(["--verbose"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["usage: python -m tests.schema_file [--check] [--dsn DSN]"] * 2


@pytest.mark.slow  # the generator in a subprocess
def test_check_passes_on_a_fresh_migrate(server_dsn):
    ok = subprocess.run(
        [sys.executable, "-m", "tests.schema_file", "--check", "--dsn", server_dsn],
        cwd=ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "jobsup/db/schema.sql matches a fresh migrate\n", "")
