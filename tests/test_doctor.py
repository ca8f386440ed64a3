"""`jobsup doctor` and the console's health line against a real PostgreSQL: each problem is made by
the test (a held snapshot, a session idle in a transaction, a dead supervisor, dead tuples) and must be
named, with the exit code a cron job or a probe acts on."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import conninfo

from jobsup import client
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.job import JobSpec
from jobsup.ops.doctor import SUPERVISOR_LINKS, Thresholds, check_prepared, check_table, run_checks
from jobsup.ops.health import ahealth_warning, health_warning

from .helpers import cli_env, jobsup, refused_all, wait_for

# Thresholds a test can cross within its patience.
QUICK = Thresholds(max_xmin_age=0.1, max_idle_in_transaction=0.1)


def doctor(dsn: str, *args: str, **env: str):
    result = jobsup("doctor", "--dsn", dsn, *args, env=cli_env(**env) if env else None)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def line_of(stdout: str, name: str) -> str:
    """The line of check `name` in the text output."""
    (line,) = [
        line for line in stdout.splitlines() if line[:4] in ("ok  ", "WARN", "FAIL") and line[6:].startswith(name + " ")
    ]
    return line


def check(report, name: str):
    (found,) = [c for c in report.checks if c.name == name]
    return found


@pytest.fixture
def holder(dsn: str) -> Iterator[psycopg.Connection]:
    """A second session of the test's database, for the test to leave in a transaction."""
    with psycopg.connect(dsn, autocommit=True, application_name="doctor test holder") as conn:
        yield conn


def pid_of(conn: psycopg.Connection) -> int:
    return conn.info.backend_pid


def hold_snapshot(conn: psycopg.Connection) -> int:
    """Leave `conn` holding a snapshot, as a forgotten psql session does; its backend's pid."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    conn.execute("SELECT 1")
    return pid_of(conn)


def until_warns(conn: psycopg.Connection, name: str, thresholds: Thresholds = QUICK):
    """Check `name` of the report once it warns (its problem has aged past the thresholds)."""

    def warned():
        found = check(run_checks(conn, thresholds), name)
        return found if found.level == "warn" else None

    return wait_for(warned, timeout=30, message=f"{name} to warn")


@pytest.mark.slow  # the CLI in a subprocess, many times
def test_a_healthy_database_exits_0_and_its_json_parses(dsn, conn):
    result = doctor(dsn)
    assert result.returncode == 0, result.stdout
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "healthy"
    assert all(line.startswith("ok") for line in lines[:-1]), result.stdout
    assert health_warning(conn) is None

    result = doctor(dsn, "--json")
    assert result.returncode == 0
    report = json.loads(result.stdout)
    assert report["healthy"] is True and report["exit_code"] == 0
    names = [c["name"] for c in report["checks"]]
    assert names[:6] == [
        "server",
        "schema",
        "xmin_horizon",
        "idle_in_transaction",
        "prepared_transactions",
        "replication_slots",
    ]
    assert {
        "table jobsup.jobs",
        "table jobsup.supervisors",
        "notify_queue",
        "connections",
        "supervisors",
        "orphaned_jobs",
    } <= set(names)
    assert {c["level"] for c in report["checks"]} == {"ok"}
    jobs = next(c for c in report["checks"] if c["name"] == "table jobsup.jobs")
    assert jobs["figures"]["table_bytes"] > 0 and jobs["figures"]["index_bytes"] > 0
    schema = next(c for c in report["checks"] if c["name"] == "schema")
    assert schema["figures"]["version"] == schema["figures"]["package_version"]


@pytest.mark.slow  # the CLI in a subprocess, many times
def test_a_held_snapshot_is_named_by_doctor_and_by_the_health_line(dsn, conn, holder):
    pid = hold_snapshot(holder)
    found = until_warns(conn, "xmin_horizon")
    assert f"by pid {pid} (idle in transaction, application 'doctor test holder'" in found.message
    assert f"pg_terminate_backend({pid})" in found.action
    assert found.figures["oldest"]["pid"] == pid and found.figures["oldest"]["idle_in_transaction"]
    assert re.fullmatch(
        rf"vacuum held back [0-9.ms]+ by pid {pid} \(idle in transaction\)", health_warning(conn, QUICK) or ""
    )
    assert health_warning(conn) is None  # the default 5 minutes have not passed

    # The real CLI: exit 1, the holder on the xmin_horizon line, the same in --json.
    result = doctor(dsn, "--max-xmin-age", "100ms")
    assert result.returncode == 1, result.stdout
    line = line_of(result.stdout, "xmin_horizon")
    assert line.startswith("WARN") and f"by pid {pid}" in line
    assert "xmin_horizon" in result.stdout.strip().splitlines()[-1]
    report = json.loads(doctor(dsn, "--json", "--max-xmin-age", "100ms").stdout)
    assert report["exit_code"] == 1
    assert [c["figures"]["oldest"]["pid"] for c in report["checks"] if c["name"] == "xmin_horizon"] == [pid]
    # The variable sets the threshold as the flag does; 0 turns the warning off.
    assert doctor(dsn, JOBSUP_DOCTOR_MAX_XMIN_AGE="100ms").returncode == 1
    assert doctor(dsn, "--max-xmin-age", "0", "--max-idle-in-transaction", "0").returncode == 0

    holder.execute("COMMIT")
    assert check(run_checks(conn, QUICK), "xmin_horizon").level == "ok"
    assert health_warning(conn, QUICK) is None


def test_a_session_idle_in_a_transaction_is_named(dsn, conn):
    # Read committed: idle in a transaction, but without a snapshot once its statement ended.
    with psycopg.connect(dsn, application_name="doctor test idle") as idle:
        idle.execute("SELECT 1")
        pid = pid_of(idle)
        found = until_warns(conn, "idle_in_transaction")
        assert "1 session idle in a transaction" in found.message and f"pid {pid}" in found.message
        assert "application 'doctor test idle'" in found.message
        assert f"pid {pid}" in found.action and "idle_in_transaction_session_timeout" in found.action
        assert check(run_checks(conn, QUICK), "xmin_horizon").level == "ok"  # it holds no snapshot

        result = doctor(dsn, "--max-idle-in-transaction", "100ms")
        assert result.returncode == 1
        line = line_of(result.stdout, "idle_in_transaction")
        assert line.startswith("WARN") and f"pid {pid}" in line
        idle.rollback()
    assert check(run_checks(conn, QUICK), "idle_in_transaction").level == "ok"


@pytest.mark.slow  # the CLI in a subprocess, many times
def test_a_stale_supervisor_and_its_running_jobs_are_named(dsn, conn):
    conn.execute(
        "INSERT INTO jobsup.supervisors (id, host, pid, version, queues, procs, heartbeat_at) "
        "VALUES ('gone:4211:ab', 'gone', 4211, '0', '{default}', 2, now() - interval '2 hours')"
    )
    (job_id,) = conn.execute(
        "INSERT INTO jobsup.jobs (kind, status, attempts, locked_by, locked_until) "
        "VALUES ('email', 'running', 1, 'gone:4211:ab', now() + interval '1 minute') "
        "RETURNING id"
    ).fetchone()
    result = doctor(dsn)  # the defaults warn about both
    assert result.returncode == 1, result.stdout
    lines = result.stdout.splitlines()
    sup = line_of(result.stdout, "supervisors")
    assert sup.startswith("WARN") and "gone:4211:ab (pid 4211 on gone), last beat 2h00m ago" in sup
    orphans = line_of(result.stdout, "orphaned_jobs")
    assert orphans.startswith("WARN")
    assert f"1 running job under no live supervisor; 1 of gone:4211:ab (first id {job_id}, lease expires in" in orphans
    assert "no live supervisor runs a reaper: start one" in result.stdout
    assert lines[-1] == "2 problems: supervisors, orphaned_jobs"

    report = json.loads(doctor(dsn, "--json").stdout)
    by_name = {c["name"]: c for c in report["checks"]}
    assert by_name["supervisors"]["figures"]["stale"][0]["id"] == "gone:4211:ab"
    assert by_name["orphaned_jobs"]["figures"]["jobs"] == 1
    # A supervisor is stale only past --stale-after.
    assert doctor(dsn, "--stale-after", "3h").returncode == 0
    assert doctor(dsn, "--stale-after", "0").returncode == 0  # 0: no supervisor counts as stale


def test_a_running_supervisor_holds_the_connections_doctor_counts(dsn, conn, start):
    sup = start(procs=2)
    sup.wait_ready()
    client.enqueue(conn, JobSpec("ok"))  # its first outcome opens the writes connection
    wait_for(
        lambda: conn.execute("SELECT count(*) FROM jobsup.jobs WHERE status = 'done'").fetchone()[0] == 1,
        timeout=60,
        message="the job done",
    )

    def counted():
        found = check(run_checks(conn), "connections")
        expected = {link: 0 if link == "schedules" else 1 for link in SUPERVISOR_LINKS}  # the app has none
        return found if found.figures["supervisor_connections"] == expected else None

    found = wait_for(counted, timeout=30, message="one connection per link")
    assert found.level == "ok" and found.figures["live_supervisors"] == 1
    assert "1 supervisor x 6 = 6 at most, 5 open" in found.message
    opened = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'jobsup %'"
    ).fetchone()[0]
    assert opened == len(SUPERVISOR_LINKS) - 1  # no schedules; the worker processes hold none
    assert run_checks(conn).exit_code == 0
    assert sup.stop() == 0


@pytest.mark.slow  # 20,000 rows written, then the statistics waited for
def test_dead_tuples_of_the_jobs_table_are_counted_from_the_statistics(dsn, conn):
    conn.execute("ALTER TABLE jobsup.jobs SET (autovacuum_enabled = false)")  # so nothing removes them
    conn.execute("INSERT INTO jobsup.jobs (kind) SELECT 'x' FROM generate_series(1, 20000)")
    conn.execute("DELETE FROM jobsup.jobs")
    lots = Thresholds(max_dead_tuples=15_000)

    def counted():
        found = check(run_checks(conn, lots), "table jobsup.jobs")
        return found if found.figures["dead_tuples"] >= 20_000 else None

    found = wait_for(counted, timeout=30, message="the statistics to count the dead tuples")
    assert found.level == "warn" and "autovacuum is off for jobsup.jobs (autovacuum_enabled = false)" in found.message
    assert "RESET (autovacuum_enabled)" in found.action
    assert health_warning(conn, lots) == "jobsup.jobs: 20,000 dead tuples (100%)"
    assert health_warning(conn) == "jobsup.jobs: 20,000 dead tuples (100%)"  # the share passes 0.5
    assert health_warning(conn, Thresholds(max_dead_tuples=0, max_dead_ratio=0)) is None


def test_dead_tuples_warn_with_what_to_do():
    server = {"autovacuum": True}
    table = {
        "name": "jobsup.jobs",
        "tables": 1,
        "live_tuples": 1_000,
        "dead_tuples": 2_000_000,
        "vacuum_at": 250,
        "autovacuum_enabled": True,
        "vacuum_age": 7200.0,
        "vacuums": 3,
        "table_bytes": 300 * 2**20,
        "index_bytes": 40 * 2**20,
    }
    found = check_table(table, server, Thresholds(), held_back=False)
    assert found.level == "warn"
    assert found.message == (
        "1,000 live, 2,000,000 dead (100%), autovacuum at 250 dead, last vacuum 2h00m ago; 300.0 MB + 40.0 MB indexes"
    )
    assert "VACUUM (VERBOSE) jobsup.jobs" in found.action and "autovacuum_vacuum_scale_factor" in found.action
    assert "xmin_horizon" in check_table(table, server, Thresholds(), held_back=True).action
    assert check_table(table, server, Thresholds(max_dead_tuples=0, max_dead_ratio=0), False).level == "ok"


def test_an_old_prepared_transaction_says_which_to_commit_or_roll_back():
    prepared = [{"gid": "order-17", "owner": "app", "xmin_xids": 5000, "age": 900.0}]
    found = check_prepared(prepared, Thresholds())
    assert found.level == "warn" and "'order-17' of app, 15m00s old (5,000 transactions)" in found.message
    assert "COMMIT PREPARED 'order-17' or ROLLBACK PREPARED 'order-17'" in found.action
    assert check_prepared(prepared, Thresholds(max_xmin_age=3600)).level == "ok"


def test_the_health_line_reads_no_table_of_jobsup(conn):
    conn.execute("INSERT INTO jobsup.jobs (kind) SELECT 'x' FROM generate_series(1, 1000)")
    conn.execute("ANALYZE jobsup.jobs")
    (plan,) = conn.execute(f"EXPLAIN (VERBOSE, FORMAT JSON) {SQL['health']}").fetchone()[0]
    relations = []

    def walk(node):
        if "Relation Name" in node:
            relations.append((node.get("Schema"), node["Relation Name"]))
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"])
    assert not [r for r in relations if r[0] == "jobsup"], relations
    assert {name for _, name in relations} <= {"pg_database", "pg_authid"}, relations


def test_the_async_health_line_is_the_same(dsn, holder):
    pid = hold_snapshot(holder)
    with psycopg.connect(dsn, autocommit=True) as conn:
        wait_for(lambda: health_warning(conn, QUICK), timeout=30, message="the holder to age")

    async def lines() -> tuple[str | None, str | None]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            return await ahealth_warning(aconn), await ahealth_warning(aconn, QUICK)

    default, quick = asyncio.run(lines())
    assert default is None
    assert quick is not None and quick.endswith(f"by pid {pid} (idle in transaction)")


@pytest.fixture
def monitor_role(server_dsn: str, dsn: str) -> Iterator[tuple[str, str]]:
    """A role that may read the jobsup tables and nothing more; (its DSN, its name)."""
    role = f"jobsup_doctor_{os.getpid()}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f"DROP ROLE IF EXISTS {role}")
        admin.execute(f"CREATE ROLE {role} LOGIN")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"GRANT USAGE ON SCHEMA jobsup TO {role}")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA jobsup TO {role}")
    try:
        yield conninfo.make_conninfo(dsn, user=role), role
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(f"DROP ROLE IF EXISTS {role}")


def test_without_pg_monitor_a_holder_is_found_but_its_age_is_not(dsn, holder, monitor_role):
    role_dsn, role = monitor_role
    pid = hold_snapshot(holder)
    with psycopg.connect(role_dsn, autocommit=True) as limited:
        report = run_checks(limited, QUICK)
        assert "grant it pg_monitor" in check(report, "server").message
        found = check(report, "xmin_horizon")
        assert found.level == "ok" and f"pid {pid}" in found.message
        assert "its age is hidden from this role" in found.message
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"GRANT pg_monitor TO {role}")
        assert f"by pid {pid} (idle in transaction" in until_warns(limited, "xmin_horizon").message


@pytest.mark.slow  # the CLI in a subprocess, many times
def test_bad_thresholds_are_refused_with_one_line_and_exit_2(dsn):
    refused_all(
        dsn,
        [
            (["doctor", "--max-xmin-age", "-5m"], "--max-xmin-age"),
            (["doctor", "--max-xmin-age", "soon"], "not a duration: 'soon'"),
            (["doctor", "--max-notify-usage", "2"], "must be between 0 and 1"),
            (["doctor", "--max-connections-used", "most"], "not a number: 'most'"),
            (["doctor", "--max-dead-tuples", "many"], "not a whole number"),
            (["doctor", "--max-dead-tuples", "-1"], "--max-dead-tuples cannot be negative"),
            (["doctor", "--stale-after", "1x"], "--stale-after"),
        ],
    )
    result = doctor(dsn, JOBSUP_DOCTOR_MAX_DEAD_RATIO="1.5")
    assert result.returncode == 2 and "must be between 0 and 1" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_database_without_the_schema_fails_the_schema_check(empty_dsn):
    result = doctor(empty_dsn)
    assert result.returncode == 1
    line = line_of(result.stdout, "schema")
    assert line.startswith("FAIL") and "the jobsup schema is not in this database" in line
    assert "run `jobsup migrate`" in result.stdout
    assert "xmin_horizon" in result.stdout  # the server's checks still run


@pytest.mark.slow  # waits out the check's 2 s lock timeout
def test_a_locked_jobsup_table_is_reported_not_waited_for(conn, holder):
    holder.execute("BEGIN")
    holder.execute("LOCK TABLE jobsup.events IN ACCESS EXCLUSIVE MODE")  # as a long ALTER TABLE would
    report = run_checks(conn)
    found = check(report, "tables")
    assert found.level == "warn" and "stayed locked for 2s" in found.message and "pg_locks" in found.action
    assert check(report, "supervisors").level == "ok"  # the checks after it still ran
    holder.execute("ROLLBACK")
    assert "tables" not in [c.name for c in run_checks(conn).checks]
