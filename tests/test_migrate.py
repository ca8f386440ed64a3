"""Migrations against a real PostgreSQL: idempotent, safe to run concurrently, required by the CLI."""

from __future__ import annotations

import subprocess
import sys
import threading

import psycopg
import pytest

from jobsup.db import migrate as migrations
from jobsup.db.migrate import LATEST, migrate, require_schema, schema_version

from .helpers import ROOT, cli_env, jobsup

TABLES = {
    "jobs",
    "kind_totals",
    "supervisors",
    "events",
    "migrations",
    "schedules",
    "queue_pauses",
    "latency",
    "workflows",
    "dependencies",
    "limits",
    "limit_keys",
    "compat",
    "audit",  # the web console's actions (0013)
}


def recorded(dsn: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT version, name FROM jobsup.migrations ORDER BY version").fetchall()


def tables(conn: psycopg.Connection) -> set[str]:
    return {
        r[0] for r in conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'jobsup'")
    }


def expected_records() -> list[tuple[int, str]]:
    return [(m.version, m.name) for m in migrations.available()]


def test_migrate_is_idempotent(empty_dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert schema_version(conn) == 0
        applied = migrate(conn)
        assert [m.version for m in applied] == [m.version for m in migrations.available()]
        assert applied[-1].version == LATEST
        assert tables(conn) == TABLES
        assert schema_version(conn) == LATEST
        require_schema(conn)
        assert migrate(conn) == []  # the second run changes nothing
        assert migrate(conn) == []
    assert recorded(empty_dsn) == expected_records()


def test_migrate_in_a_callers_transaction(empty_dsn):
    with psycopg.connect(empty_dsn) as conn:  # not autocommit
        assert len(migrate(conn)) == len(migrations.available())
        conn.rollback()  # migrate committed its own work; nothing is left to roll back
    assert recorded(empty_dsn) == expected_records()


@pytest.mark.parametrize("isolation", [None, "repeatable read"])
def test_concurrent_migrate_threads(empty_dsn, isolation):
    if isolation:  # a server whose transactions default to a snapshot taken at their first statement
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            db = conn.execute("SELECT current_database()").fetchone()[0]
            conn.execute(f"ALTER DATABASE {db} SET default_transaction_isolation = '{isolation}'")
    workers = 8
    barrier = threading.Barrier(workers, timeout=30)
    results: list[list[int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            with psycopg.connect(empty_dsn, autocommit=True) as conn:
                barrier.wait()
                applied = [m.version for m in migrate(conn)]
            with lock:
                results.append(applied)
        except BaseException as exc:  # reported below, with the test's own assertion
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(results) == workers
    applied = [r for r in results if r]
    assert applied == [[m.version for m in migrations.available()]]  # one thread applied, once
    assert recorded(empty_dsn) == expected_records()


@pytest.mark.slow  # the CLI in a subprocess, many at once
def test_concurrent_migrate_processes(empty_dsn):
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "jobsup", "migrate", "--dsn", empty_dsn],
            cwd=ROOT,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outputs
    assert all(err == "" for _, err in outputs), outputs
    outs = [out for out, _ in outputs]
    assert sum("applied migration 0001_initial" in out for out in outs) == 1
    assert sum(f"schema up to date (version {LATEST})" in out for out in outs) == 3
    assert recorded(empty_dsn) == expected_records()


@pytest.mark.slow  # the CLI in a subprocess, many times
def test_cli_migrate_on_an_empty_database(empty_dsn):
    first = jobsup("migrate", "--dsn", empty_dsn)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().splitlines() == [f"applied migration {v:04d}_{n}" for v, n in expected_records()]
    second = jobsup("migrate", "--dsn", empty_dsn)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == f"schema up to date (version {LATEST})"
    assert recorded(empty_dsn) == expected_records()
    # and the schema works: a job goes in
    done = jobsup("enqueue", "ping", "--dsn", empty_dsn)
    assert done.returncode == 0 and done.stdout.startswith("enqueued job "), done.stderr


@pytest.mark.slow  # the CLI in a subprocess, many times
def test_missing_schema_is_reported(empty_dsn):
    for args in (["enqueue", "ping", "{}"], ["stats"], ["stats", "--json"], ["requeue-dead"]):
        result = jobsup(*args, "--dsn", empty_dsn)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "run `jobsup migrate`" in result.stderr
        assert result.stdout == ""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT to_regnamespace('jobsup')").fetchone()[0] is None  # nothing was created


def test_outdated_schema_is_reported(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM jobsup.migrations WHERE version = %s", (LATEST,))
    result = jobsup("stats", "--dsn", dsn)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "run `jobsup migrate`" in result.stderr
