"""`jobsup bench` where a jobsup schema exists (right after the quick start, it holds jobs): it runs in
a scratch database it makes and drops when the role may create one, refuses when it may not, and
drops what it made after a failure or a Ctrl-C too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psycopg
import pytest

from jobsup import client
from jobsup.cli.bench import place
from jobsup.db import dsn as dsns
from jobsup.errors import BadInput

from .helpers import ROOT, cli_env, jobsup, wait_for, with_dbname


def connect(dsn: str) -> psycopg.Connection:
    return dsns.connect(dsn)


def scratch_databases(server_dsn: str) -> list[str]:
    with psycopg.connect(server_dsn) as conn:
        return [r[0] for r in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'jobsup\\_bench\\_%'")]


def held(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute("SELECT id, status, attempts FROM jobsup.jobs ORDER BY id").fetchall()


class Boom(Exception):
    pass


@pytest.mark.slow  # three scratch databases made and dropped
def test_a_schema_with_jobs_gets_a_scratch_database_dropped_whatever_happens(conn, dsn, server_dsn):
    client.enqueue(conn, "email", {"to": "a@example.com"})
    before = held(conn)
    assert scratch_databases(server_dsn) == []
    with place(dsn, None, connect) as where:
        assert where.database is not None and where.database.startswith("jobsup_bench_")
        assert where.made == f"database {where.database}"
        assert scratch_databases(server_dsn) == [where.database]
        with psycopg.connect(where.dsn) as scratch:  # migrated, with the pickup table, and empty
            assert scratch.execute("SELECT count(*) FROM jobsup.jobs").fetchone() == (0,)
            assert scratch.execute("SELECT to_regclass('jobsup.bench_pickup')").fetchone()[0] is not None
    assert scratch_databases(server_dsn) == []
    for interruption in (Boom("the bench failed"), KeyboardInterrupt()):
        with pytest.raises(type(interruption)):
            with place(dsn, None, connect) as where:
                assert scratch_databases(server_dsn) == [where.database]
                raise interruption
        assert scratch_databases(server_dsn) == []
    assert held(conn) == before  # the target's jobs: never touched
    assert conn.execute("SELECT to_regclass('jobsup.bench_pickup')").fetchone()[0] is None


def test_a_schema_of_its_own_is_dropped_after_a_failure(empty_dsn):
    with pytest.raises(Boom):
        with place(empty_dsn, None, connect) as where:
            assert (where.dsn, where.made, where.database) == (empty_dsn, "schema jobsup", None)
            raise Boom
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'jobsup'").fetchone() == (0,)


@pytest.mark.slow  # a role of its own, and the refusal through the CLI in a subprocess
def test_a_role_that_may_not_create_databases_is_refused_and_nothing_is_made(conn, dsn, server_dsn):
    client.enqueue(conn, "email")
    before = held(conn)
    role = f"jobsup_bench_nocreate_{os.getpid()}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f"DROP ROLE IF EXISTS {role}")
        admin.execute(f"CREATE ROLE {role} LOGIN NOCREATEDB NOSUPERUSER")
    try:
        limited = psycopg.conninfo.make_conninfo(dsn, user=role)
        with pytest.raises(BadInput, match="may not create a scratch database") as caught:
            with place(limited, None, connect):
                pytest.fail("it ran")
        assert "CREATEDB" in str(caught.value) and "--database" in str(caught.value)
        result = jobsup("bench", "--dsn", limited)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "may not create a scratch database" in lines[0] and "--database" in lines[0]
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(f"DROP ROLE IF EXISTS {role}")
    assert scratch_databases(server_dsn) == []
    assert held(conn) == before


@pytest.mark.slow  # `jobsup bench` in a subprocess, interrupted mid-run
def test_ctrl_c_mid_run_drops_the_scratch_database(conn, dsn, server_dsn, tmp_path):
    client.enqueue(conn, "email")
    before = held(conn)
    bench = subprocess.Popen(
        [sys.executable, "-m", "jobsup", "bench", "--dsn", dsn, "--procs", "1"],
        cwd=ROOT,
        env=cli_env(TMPDIR=str(tmp_path)),  # the supervisor's log, kept after an interrupted run
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        [name] = wait_for(lambda: scratch_databases(server_dsn), timeout=60, message="the scratch database")

        def supervisor_started() -> bool:
            try:
                with psycopg.connect(with_dbname(server_dsn, name)) as scratch:
                    return scratch.execute("SELECT count(*) FROM jobsup.supervisors").fetchone()[0] > 0
            except psycopg.Error:  # not migrated yet
                return False

        wait_for(supervisor_started, timeout=60, message="the bench's supervisor")
        bench.send_signal(signal.SIGINT)
        out, err = bench.communicate(timeout=120)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode == 130, (out, err)
    assert "the supervisor's log is" in err  # where to look, since the run did not finish
    assert scratch_databases(server_dsn) == []
    assert held(conn) == before


@pytest.mark.slow  # a whole `jobsup bench` run
def test_bench_right_after_the_quick_start_runs_in_a_scratch_database(conn, dsn, server_dsn):
    client.enqueue_many(conn, [{"kind": "flaky"}, {"kind": "segfault", "max_attempts": 2}])  # the quick start's
    before = held(conn)
    result = jobsup("bench", "--dsn", dsn, "--procs", "2", timeout=300)
    assert result.returncode == 0, result.stderr
    assert "no-op jobs" in result.stdout and "pickup latency p50" in result.stdout
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("created database jobsup_bench_") and "and dropped it again" in last
    assert scratch_databases(server_dsn) == []
    assert held(conn) == before


# --- the demos' logs: like the bench's scratch database, a place of each run's own ---------------------


def test_each_demo_run_logs_to_a_directory_of_its_own(tmp_path, monkeypatch):
    import tempfile

    from examples import demo

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # TMPDIR, as tempfile reads it
    first, second = demo.log_dir("demo"), demo.log_dir("demo-django")
    assert first != second and first.parent == second.parent == tmp_path
    assert first.name.startswith("jobsup-demo-") and second.name.startswith("jobsup-demo-django-")
    assert first.stat().st_mode & 0o777 == 0o700  # not shared with other users of /tmp
