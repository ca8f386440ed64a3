"""jobsup through a real PgBouncer in transaction pooling mode: enqueue, the supervisor, retries,
shutdown and the console; and the refusals of --pooler and --listen-dsn, which need no pooler."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from jobsup import Queue, client
from jobsup.monitor.figures import Scope
from jobsup.monitor.source import Source

from .helpers import jobsup, wait_for
from .supervisor_helpers import enqueue_kinds, make_calls_table, status_counts

POOLED = {"JOBSUP_POOLER": "transaction"}


@pytest.fixture
def pooled_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in POOLED.items():
        monkeypatch.setenv(key, value)


def backend_pids(conn: psycopg.Connection, application_name: str) -> set[int]:
    return {
        r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,))
    }


def test_enqueue_through_the_pooler(conn, pooled_dsn, pooled_env):
    # Many times the same statement: psycopg would prepare it after five, on whichever server
    # connection PgBouncer lent that transaction.
    with Queue(pooled_dsn, max_size=3) as q:
        ids = [q.enqueue("ok", {"n": n}) for n in range(30)]
        ids += q.enqueue_many([{"kind": "ok"}] * 50)
    assert len(set(ids)) == 80
    assert status_counts(conn) == {"queued": 80}


def running_in_workers(conn) -> set[int]:
    row = conn.execute("SELECT workers FROM jobsup.supervisors").fetchone()
    return {w.get("job_id") for w in row[0] if w["state"] == "busy"} if row else set()


def test_supervisor_through_the_pooler_works_retries_and_stops(conn, dsn, pooled_dsn, start):
    make_calls_table(conn)
    ids = enqueue_kinds(conn, ["record"] * 300)
    [flaky] = enqueue_kinds(conn, ["flaky"], max_attempts=3)
    sup = start("--dsn", pooled_dsn, "--pooler", "transaction", procs=3, env=POOLED)
    sup.wait_log("listener.off")  # no --listen-dsn: said at start, and it polls
    wait_for(lambda: status_counts(conn).get("done") == 301, timeout=60, message="301 done")
    calls = dict(conn.execute("SELECT job_id, count(*) FROM calls GROUP BY job_id").fetchall())
    assert sorted(calls) == sorted(ids) and set(calls.values()) == {1}
    attempts, errors = conn.execute("SELECT attempts, errors FROM jobsup.jobs WHERE id = %s", (flaky,)).fetchone()
    assert attempts == 2 and errors[0]["error"].startswith("RuntimeError: flaky")
    # Its sessions came through PgBouncer, not straight from the supervisor.
    clients = {
        r[0]
        for r in conn.execute(
            "SELECT DISTINCT client_addr::text FROM pg_stat_activity WHERE application_name LIKE 'jobsup %%'"
        )
    }
    assert clients <= {None, "127.0.0.1/32"}
    # Shutdown through the pooler: the running job finishes, the row goes.
    [slow] = client.enqueue_many(conn, [{"kind": "sleep", "payload": {"seconds": 3}}])
    # Running in a worker, as the heartbeat says: `running` in the table is also a job claimed and not
    # started yet, which a stop rightly hands back unstarted.
    wait_for(lambda: slow in running_in_workers(conn), message="the slow job running in a worker")
    assert sup.stop() == 0
    assert conn.execute("SELECT status FROM jobsup.jobs WHERE id = %s", (slow,)).fetchone()[0] == "done"
    assert conn.execute("SELECT count(*) FROM jobsup.supervisors").fetchone()[0] == 0
    assert "db.lost" not in sup.log() and " ERROR " not in sup.log()  # e.g. a prepared statement gone


def test_listen_dsn_gives_notify_through_the_pooler(conn, dsn, pooled_dsn, start):
    make_calls_table(conn)
    # A 60 s poll: only a NOTIFY can make the job start within the test's patience.
    sup = start(
        "--dsn",
        pooled_dsn,
        "--pooler",
        "transaction",
        "--listen-dsn",
        dsn,
        "--poll-interval",
        "60s",
        procs=1,
        env=POOLED,
    )
    sup.wait_ready()
    wait_for(lambda: backend_pids(conn, "jobsup listen"), message="the listener on its direct connection")
    [job] = enqueue_kinds(conn, ["record"])
    wait_for(lambda: status_counts(conn).get("done") == 1, timeout=20, message="picked up on NOTIFY")
    assert "listener.off" not in sup.log()
    assert sup.stop() == 0


def test_console_figures_through_the_pooler(conn, pooled_dsn, pooled_env, start):
    enqueue_kinds(conn, ["ok"] * 20)
    [dead] = enqueue_kinds(conn, ["raise"], max_attempts=1)
    start("--dsn", pooled_dsn, "--pooler", "transaction", procs=2, env=POOLED)
    wait_for(
        lambda: status_counts(conn).get("done") == 20 and status_counts(conn).get("dead") == 1,
        timeout=60,
        message="20 done, 1 dead",
    )

    async def scenario() -> None:
        source = Source(pooled_dsn)
        try:
            for _ in range(12):  # past psycopg's prepare threshold of five, had it one
                figures = await source.refresh()
            assert figures.total.done == 20 and [d.id for d in figures.dead_jobs] == [dead]
            assert len(figures.live_supervisors()) == 1
            assert (await source.job(dead))["status"] == "dead"
            assert await source.requeue(await source.dead_ids(Scope())) == [dead]
        finally:
            await source.close()

    asyncio.run(scenario())
    wait_for(
        lambda: (
            status_counts(conn).get("dead") == 1
            and conn.execute("SELECT attempts FROM jobsup.jobs WHERE id = %s", (dead,)).fetchone()[0] == 1
        ),
        timeout=30,
        message="the requeued job ran (and died) again",
    )


# --- refusals: no pooler needed ----------------------------------------------------------------------


@pytest.mark.slow  # `jobsup start` in a subprocess
def test_unreachable_listen_dsn_is_one_line_and_exit_1_before_any_worker(dsn):
    result = jobsup(
        "start",
        "--dsn",
        dsn,
        "--app",
        "examples.misbehave:app",
        "--pooler",
        "transaction",
        "--listen-dsn",
        "postgresql://nobody:s3cret@127.0.0.1:1/none",
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--listen-dsn" in lines[0] and "s3cret" not in lines[0], lines
    assert "app.loaded" not in result.stdout + result.stderr  # no worker started


@pytest.mark.slow  # `jobsup start` in a subprocess
@pytest.mark.parametrize("how", ["flag", "env"])
def test_unknown_pooler_mode_is_exit_2(dsn, how):
    from .helpers import cli_env

    args = ["start", "--dsn", dsn, "--app", "examples.misbehave:app"]
    env = cli_env()
    if how == "flag":
        args += ["--pooler", "session"]
    else:
        env["JOBSUP_POOLER"] = "session"
    result = jobsup(*args, env=env)
    assert result.returncode == 2
    assert "pooler" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "app.loaded" not in result.stdout + result.stderr


def test_the_pooler_setting_turns_prepared_statements_off(monkeypatch):
    from jobsup.db import dsn as dsns

    monkeypatch.delenv("JOBSUP_POOLER", raising=False)
    assert dsns.prepare_threshold() == 5
    monkeypatch.setenv("JOBSUP_POOLER", "transaction")
    assert dsns.prepare_threshold() is None
