"""Control (issue 9) with real supervisors and real processes: the handler verbs (Snooze, RetryAfter,
Discard), `jobsup cancel`, `pause` / `resume`, `retry`, and migration 0005."""

from __future__ import annotations

import json
import statistics
import time

import psycopg
import pytest

from jobsup import queue

from .helpers import jobsup, wait_for
from .supervisor_helpers import alive, make_calls_table

APP = "tests.control_app:app"


def job(conn, job_id: int) -> dict:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    return cur.execute("SELECT * FROM jobsup.jobs WHERE id = %s", (job_id,)).fetchone()


def calls(conn, job_id: int) -> list[tuple]:
    return conn.execute("SELECT attempt, pid, at FROM calls WHERE job_id = %s ORDER BY at", (job_id,)).fetchall()


def finished(conn, ids) -> bool:
    return conn.execute("SELECT count(*) FROM jobsup.jobs WHERE id = ANY(%s) AND status IN "
                        "('done', 'dead', 'cancelled')", (list(ids),)).fetchone()[0] == len(ids)


# --- migration 0005 --------------------------------------------------------------------------------


def test_the_status_check_takes_cancelled_refuses_the_rest_and_was_added_without_a_scan(conn):
    [job_id] = queue.enqueue_many(conn, [{"kind": "k"}])
    conn.execute("UPDATE jobsup.jobs SET status = 'cancelled', done_at = now() WHERE id = %s", (job_id,))
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("UPDATE jobsup.jobs SET status = 'paused' WHERE id = %s", (job_id,))
    # NOT VALID: the migration did not read the table to validate it (every row met the narrower check)
    validated = conn.execute("SELECT convalidated FROM pg_constraint WHERE conname = 'jobs_status_check' "
                             "AND conrelid = 'jobsup.jobs'::regclass").fetchone()
    assert validated == (False,)
    conn.execute("ALTER TABLE jobsup.jobs VALIDATE CONSTRAINT jobs_status_check")  # as the comment says


def test_cancelled_jobs_are_pruned_with_the_dead_and_counted(conn):
    from jobsup.retention import Retention, aprunable, aprune
    import asyncio

    ids = queue.enqueue_many(conn, [{"kind": "k"}] * 3)
    conn.execute("UPDATE jobsup.jobs SET status = 'cancelled', done_at = now() - interval '8 days' "
                 "WHERE id = ANY(%s)", (ids[:2],))
    conn.execute("UPDATE jobsup.jobs SET status = 'cancelled', done_at = now() WHERE id = %s", (ids[2],))

    async def prune():
        aconn = await psycopg.AsyncConnection.connect(conn.info.dsn, autocommit=True)
        try:
            retention = Retention(keep_done=0, keep_dead=7 * 24 * 3600)
            return await aprunable(aconn, retention), await aprune(aconn, retention)
        finally:
            await aconn.close()

    would, pruned = asyncio.run(prune())
    assert (would.dead, pruned.dead) == (2, 2)
    assert [r[0] for r in conn.execute("SELECT id FROM jobsup.jobs")] == [ids[2]]  # inside the window: kept


# --- the handler verbs -----------------------------------------------------------------------------


def test_snooze_retry_after_and_discard_through_a_real_supervisor(conn, dsn, start):
    make_calls_table(conn)
    snoozer, limited, discarded, bad = queue.enqueue_many(conn, [
        {"kind": "snoozer", "payload": {"times": 2, "seconds": 0.3}},
        {"kind": "rate_limited", "payload": {"seconds": 0.6}},
        {"kind": "discarded"},
        {"kind": "bad_snooze", "max_attempts": 1},
    ])
    start(app=APP)  # --backoff-base 20ms: a retry that waits 0.6 s waited for RetryAfter
    wait_for(lambda: finished(conn, [snoozer, limited, discarded, bad]), 60, 0.05, "every job to finish")

    s = job(conn, snoozer)
    assert (s["status"], s["attempts"], s["snoozes"]) == ("done", 1, 2)  # attempts unchanged by snoozes
    assert [(e["attempt"], e["snooze"], e["error"]) for e in s["errors"]] == [
        (1, 1, "Snooze: snoozed for 0.3s"), (1, 2, "Snooze: snoozed for 0.3s")]
    assert s["return_value"] == {"snoozes": 2, "errors": 2, "attempts": 1}  # what the handler read from job
    runs = calls(conn, snoozer)
    assert [r[0] for r in runs] == [1, 1, 1]
    assert all((b[2] - a[2]).total_seconds() >= 0.3 for a, b in zip(runs, runs[1:]))

    r = job(conn, limited)
    assert (r["status"], r["attempts"]) == ("done", 2)
    assert [e["error"] for e in r["errors"]] == ["RetryAfter: retry after 0.6s: HTTP 429"]
    assert r["errors"][0]["traceback"]
    first, second = calls(conn, limited)
    assert (second[2] - first[2]).total_seconds() >= 0.6

    d = job(conn, discarded)
    assert (d["status"], d["attempts"], d["cancelled_by"]) == ("cancelled", 1, "handler")
    assert d["last_error"] == "Discard: address bounced" and len(d["errors"]) == 1
    assert len(calls(conn, discarded)) == 1

    b = job(conn, bad)
    assert b["status"] == "dead"
    assert b["last_error"].startswith("BadInput: Snooze(seconds) takes a number of seconds from 0 to")
    assert "not -1" in b["last_error"]
    totals = dict(conn.execute("SELECT kind, sum(cancelled) FROM jobsup.kind_totals GROUP BY kind").fetchall())
    assert totals["discarded"] == 1 and totals["snoozer"] == 0


def test_a_job_cannot_snooze_for_ever(conn, start):
    [capped] = queue.enqueue_many(conn, [{"kind": "capped", "max_attempts": 2}])
    start(app=APP)
    wait_for(lambda: finished(conn, [capped]), 60, 0.05, "the capped job to die")
    c = job(conn, capped)
    assert (c["status"], c["attempts"], c["snoozes"]) == ("dead", 2, 2)
    assert [e["error"] for e in c["errors"]] == [
        "Snooze: snoozed for 0.01s", "Snooze: snoozed for 0.01s",
        "Snooze: snoozed 2 times, the most a 'capped' job may (max_snoozes=2)",
        "Snooze: snoozed 2 times, the most a 'capped' job may (max_snoozes=2)"]
