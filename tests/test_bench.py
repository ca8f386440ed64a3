"""`jobsup bench`: it measures, prints its table, and leaves nothing behind; it refuses to run among jobs."""

from __future__ import annotations

import json

import psycopg
import pytest

from .helpers import jobsup, with_dbname


def schemas_and_tables(dsn: str) -> tuple[list, list]:
    with psycopg.connect(dsn) as conn:
        schemas = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%%' "
            "AND nspname NOT IN ('information_schema', 'public') ORDER BY 1"
        ).fetchall()
        tables = conn.execute(
            "SELECT schemaname, tablename FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
        ).fetchall()
    return schemas, tables


@pytest.mark.slow  # a whole `jobsup bench` run
def test_bench_in_a_schema_of_its_own_prints_its_table_and_drops_it(empty_dsn):
    before = schemas_and_tables(empty_dsn)
    result = jobsup("bench", "--dsn", empty_dsn, "--procs", "2", timeout=300)
    assert result.returncode == 0, result.stderr
    for label in (
        "bulk enqueue",
        "no-op jobs",
        "1 ms jobs",
        "100 ms async jobs, shared",
        "pickup latency p50",
        "pickup latency p99",
    ):
        assert label in result.stdout
    assert "created schema jobsup for the bench and dropped it again" in result.stdout
    assert schemas_and_tables(empty_dsn) == before


@pytest.mark.slow  # a whole `jobsup bench` run
def test_bench_in_a_scratch_database_drops_it(server_dsn):
    with psycopg.connect(server_dsn) as conn:
        databases = conn.execute("SELECT datname FROM pg_database ORDER BY 1").fetchall()
    result = jobsup(
        "bench", "--dsn", server_dsn, "--procs", "2", "--database", "jobsup_bench_scratch", "--json", timeout=300
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)["median"]
    assert figures["noop_jobs_per_s"] > 0 and figures["pickup_p50_ms"] > 0
    with psycopg.connect(server_dsn) as conn:
        assert conn.execute("SELECT datname FROM pg_database ORDER BY 1").fetchall() == databases


def test_bench_refuses_an_existing_database_name(dsn, server_dsn):
    name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    result = jobsup("bench", "--dsn", server_dsn, "--database", name)
    assert result.returncode == 2 and "exists" in result.stderr
    with psycopg.connect(with_dbname(server_dsn, name)) as conn:  # still there, untouched
        assert conn.execute("SELECT count(*) FROM jobsup.jobs").fetchone()[0] == 0
