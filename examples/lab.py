"""The lab: the original design's experiment, rebuilt on jobsup and run through the real supervisor.

    python examples/lab.py            # the embedded PostgreSQL, no setup; or JOBSUP_DSN=...

It works in a database of its own (`jobsup_lab`, made anew each run, JOBSUP_LAB_DB to rename it) on the
server jobsup would use, and prints five numbered results. It exits non-zero if any is not as jobsup
promises, so it doubles as a test.

Why exactly 518 handler calls: 485 email + 10 flaky x 2 + 4 broken x 3 + 1 slow. The original run made
522: four jobs were claimed in the same batch as the slow job, waited behind it past their 400 ms lease,
were reaped and run a second time. jobsup renews the lease of every job its supervisor holds - running,
prefetched, or waiting for its outcome to be written - so nothing a live supervisor holds is reaped.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg
from psycopg import conninfo

from jobsup import App, Job, client
from jobsup.db import dsn as dsns
from jobsup.db import lifecycle
from jobsup.db.migrate import migrate

app = App()

SLOW_SECONDS = 0.9
LEASE_MS = 400
_conn: psycopg.Connection | None = None


def _count(job: Job) -> None:
    """Every handler call is a row of lab_calls, written by the worker itself."""
    global _conn
    if _conn is None:
        _conn = psycopg.connect(os.environ["JOBSUP_LAB_DSN"], autocommit=True)
    _conn.execute("INSERT INTO lab_calls (job_id, kind, attempt) VALUES (%s, %s, %s)", (job.id, job.kind, job.attempts))


@app.handler("email")
def email(job: Job) -> None:
    _count(job)
    time.sleep(0.001)


@app.handler("flaky")
def flaky(job: Job) -> None:
    _count(job)
    if job.attempts == 1:
        raise RuntimeError("flaky: fails on its first attempt")


@app.handler("broken")
def broken(job: Job) -> None:
    _count(job)
    raise RuntimeError("broken: always fails")


@app.handler("slow")
def slow(job: Job) -> None:
    _count(job)
    time.sleep(SLOW_SECONDS)


# --- the run ---------------------------------------------------------------------------------------


def wait_until(what: str, condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            sys.exit(f"lab: gave up waiting for {what}")
        time.sleep(0.02)


def lab_database() -> str:
    server = dsns.resolve()
    name = os.environ.get("JOBSUP_LAB_DB", "jobsup_lab")
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    dsn = conninfo.make_conninfo(server, dbname=name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
        conn.execute("CREATE TABLE lab_calls (job_id bigint, kind text, attempt int)")
    return dsn


def one(conn: psycopg.Connection, sql: str, *params):
    return conn.execute(sql, params).fetchone()[0]


def main() -> int:
    dsn = lab_database()
    conn = psycopg.connect(dsn, autocommit=True)
    env = {**os.environ, "JOBSUP_LAB_DSN": dsn, "PYTHONPATH": str(ROOT)}
    supervisor = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobsup",
            "start",
            "--dsn",
            dsn,
            "--app",
            "examples.lab:app",
            "--procs",
            "4",
            "--batch",
            "10",
            "--prefetch",
            "6",
            "--lease",
            f"{LEASE_MS}ms",
            "--reap-interval",
            "200ms",
            "--backoff-base",
            "50ms",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    ok = True

    # 1. 500 jobs in one batch; the slow one lands inside a claimed batch of ten.
    kinds = ["email"] * 485 + ["flaky"] * 10 + ["broken"] * 4
    random.Random(7).shuffle(kinds)
    kinds.insert(3, "slow")
    started = time.monotonic()
    client.enqueue_many(conn, [{"kind": k} for k in kinds])
    wait_until(
        "the 500 jobs", lambda: one(conn, "SELECT count(*) FROM jobsup.jobs WHERE status IN ('done', 'dead')") == 500
    )
    elapsed = time.monotonic() - started
    calls = dict(conn.execute("SELECT kind, count(*) FROM lab_calls GROUP BY kind").fetchall())
    done = one(conn, "SELECT count(*) FROM jobsup.jobs WHERE status = 'done'")
    dead = one(conn, "SELECT count(*) FROM jobsup.jobs WHERE status = 'dead'")
    total = sum(calls.values())
    print(
        f"1. 500 jobs enqueued in one batch, 4 worker processes claiming 10 at a time: {done} done, "
        f"{dead} dead in {elapsed:.1f}s, {total} handler calls ({calls.get('email', 0)} email, "
        f"{calls.get('flaky', 0)} flaky, {calls.get('broken', 0)} broken, {calls.get('slow', 0)} slow)."
    )
    ok &= (done, dead, total) == (496, 4, 518)

    # 2. Retries and burial.
    flaky_ok = one(
        conn,
        "SELECT count(*) FROM jobsup.jobs WHERE kind = 'flaky' AND status = 'done' "
        "AND attempts = 2 AND jsonb_array_length(errors) = 1",
    )
    errors = [r[0] for r in conn.execute("SELECT last_error FROM jobsup.jobs WHERE status = 'dead'")]
    print(
        f"2. Retries: {flaky_ok} of 10 flaky jobs failed once and were done on attempt 2; the 4 broken "
        f"jobs are dead after 3 attempts, each with its last error kept ({errors[0]!r})."
    )
    ok &= flaky_ok == 10 and errors == ["RuntimeError: broken: always fails"] * 4

    # 3. The slow job and the jobs that waited behind it.
    slow_runs = calls.get("slow", 0)
    repeats = one(
        conn,
        "SELECT count(*) FROM (SELECT job_id FROM lab_calls WHERE kind = 'email' "
        "GROUP BY job_id HAVING count(*) > 1) twice",
    )
    print(
        f"3. Leases: the slow job ({SLOW_SECONDS * 1000:.0f} ms on a {LEASE_MS} ms lease) ran {slow_runs} time, "
        f"and {repeats} of the jobs claimed with it ran twice: exactly 518 calls, where the original "
        "made 522 (its leases lapsed behind the slow job; jobsup renews every held job's lease)."
    )
    ok &= slow_runs == 1 and repeats == 0

    # 4. A worker that claims 3 jobs and dies: in one transaction, so no one else sees them queued.
    with psycopg.connect(dsn) as doomed:
        ids = [client.enqueue(doomed, "email") for _ in range(3)]
        lifecycle.claim(doomed, ["default"], 3, "lab-doomed-worker", 0.4)
        doomed.commit()
    wait_until(
        "the reaper",
        lambda: one(conn, "SELECT count(*) FROM jobsup.jobs WHERE id = ANY(%s) AND status = 'done'", ids) == 3,
    )
    attempts = sorted(r[0] for r in conn.execute("SELECT attempts FROM jobsup.jobs WHERE id = ANY(%s)", (ids,)))
    event = conn.execute(
        "SELECT count, job_ids FROM jobsup.events WHERE action = 'reaped' ORDER BY at DESC LIMIT 1"
    ).fetchone()
    print(
        f"4. Reaper: a worker claimed 3 jobs and died; the reaper returned {event[0] if event else 0} "
        f"(jobs {', '.join(map(str, event[1])) if event else '-'}), counting the lost attempt, and "
        f"they were done on attempt {attempts[0]}."
    )
    ok &= attempts == [2, 2, 2] and event is not None and sorted(event[1]) == sorted(ids)

    # 5. Shutdown with four slow jobs running and more waiting.
    slow_ids = client.enqueue_many(conn, [{"kind": "slow", "priority": 1}] * 4)
    waiting = client.enqueue_many(conn, [{"kind": "email"}] * 20)
    wait_until(
        "four slow jobs running",
        lambda: one(conn, "SELECT count(*) FROM jobsup.jobs WHERE id = ANY(%s) AND status = 'running'", slow_ids) == 4,
    )
    wait_until(
        "their handlers", lambda: one(conn, "SELECT count(*) FROM lab_calls WHERE job_id = ANY(%s)", slow_ids) == 4
    )
    supervisor.send_signal(signal.SIGTERM)
    code = supervisor.wait(60)
    slow_done = one(conn, "SELECT count(*) FROM jobsup.jobs WHERE id = ANY(%s) AND status = 'done'", slow_ids)
    back = one(
        conn, "SELECT count(*) FROM jobsup.jobs WHERE id = ANY(%s) AND status = 'queued' AND attempts = 0", waiting
    )
    print(
        f"5. Shutdown: SIGTERM with 4 slow jobs running; {slow_done} finished and were done, "
        f"{back} waiting jobs went back to the queue without losing an attempt, exit code {code}."
    )
    ok &= slow_done == 4 and back == 20 and code == 0

    conn.close()
    if not ok:
        print(
            "lab: a result is not what jobsup promises; the supervisor said:\n" + supervisor.stderr.read(),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
