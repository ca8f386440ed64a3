"""Controlling jobs with real supervisors and real processes: the handler verbs (Snooze, RetryAfter,
Discard), `jobsup cancel`, `pause` / `resume`, `retry`, and migration 0005."""

from __future__ import annotations

import json
import time
from itertools import pairwise

import psycopg
import pytest

from jobsup import client

from .helpers import jobsup, wait_for
from .supervisor_helpers import alive, make_calls_table, went_on_past

APP = "tests.apps.control:app"


def job(conn, job_id: int) -> dict:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    return cur.execute("SELECT * FROM jobsup.jobs WHERE id = %s", (job_id,)).fetchone()


def calls(conn, job_id: int) -> list[tuple]:
    return conn.execute("SELECT attempt, pid, at FROM calls WHERE job_id = %s ORDER BY at", (job_id,)).fetchall()


def finished(conn, ids) -> bool:
    return conn.execute(
        "SELECT count(*) FROM jobsup.jobs WHERE id = ANY(%s) AND status IN ('done', 'dead', 'cancelled')", (list(ids),)
    ).fetchone()[0] == len(ids)


# --- migration 0005 --------------------------------------------------------------------------------


def test_the_status_check_takes_cancelled_refuses_the_rest_and_was_added_without_a_scan(conn):
    [job_id] = client.enqueue_many(conn, [{"kind": "k"}])
    conn.execute("UPDATE jobsup.jobs SET status = 'cancelled', done_at = now() WHERE id = %s", (job_id,))
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("UPDATE jobsup.jobs SET status = 'paused' WHERE id = %s", (job_id,))
    # NOT VALID: the migration did not read the table to validate it (every row met the narrower check)
    validated = conn.execute(
        "SELECT convalidated FROM pg_constraint WHERE conname = 'jobs_status_check' "
        "AND conrelid = 'jobsup.jobs'::regclass"
    ).fetchone()
    assert validated == (False,)
    conn.execute("ALTER TABLE jobsup.jobs VALIDATE CONSTRAINT jobs_status_check")  # as the comment says


def test_cancelled_jobs_are_pruned_with_the_dead_and_counted(conn):
    import asyncio

    from jobsup.ops.prune import Retention, aprunable, aprune

    ids = client.enqueue_many(conn, [{"kind": "k"}] * 3)
    conn.execute(
        "UPDATE jobsup.jobs SET status = 'cancelled', done_at = now() - interval '8 days' WHERE id = ANY(%s)",
        (ids[:2],),
    )
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
    snoozer, limited, discarded, bad = client.enqueue_many(
        conn,
        [
            {"kind": "snoozer", "payload": {"times": 2, "seconds": 0.3}},
            {"kind": "rate_limited", "payload": {"seconds": 0.6}},
            {"kind": "discarded"},
            {"kind": "bad_snooze", "max_attempts": 1},
        ],
    )
    start(app=APP)  # --backoff-base 20ms: a retry that waits 0.6 s waited for RetryAfter
    wait_for(lambda: finished(conn, [snoozer, limited, discarded, bad]), 60, 0.05, "every job to finish")

    s = job(conn, snoozer)
    assert (s["status"], s["attempts"], s["snoozes"]) == ("done", 1, 2)  # attempts unchanged by snoozes
    assert [(e["attempt"], e["snooze"], e["error"]) for e in s["errors"]] == [
        (1, 1, "Snooze: snoozed for 0.3s"),
        (1, 2, "Snooze: snoozed for 0.3s"),
    ]
    assert s["return_value"] == {"snoozes": 2, "errors": 2, "attempts": 1}  # what the handler read from job
    runs = calls(conn, snoozer)
    assert [r[0] for r in runs] == [1, 1, 1]
    assert all((b[2] - a[2]).total_seconds() >= 0.3 for a, b in pairwise(runs))

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
    [capped] = client.enqueue_many(conn, [{"kind": "capped", "max_attempts": 2}])
    start(app=APP)
    wait_for(lambda: finished(conn, [capped]), 60, 0.05, "the capped job to die")
    c = job(conn, capped)
    assert (c["status"], c["attempts"], c["snoozes"]) == ("dead", 2, 2)
    assert [e["error"] for e in c["errors"]] == [
        "Snooze: snoozed for 0.01s",
        "Snooze: snoozed for 0.01s",
        "Snooze: snoozed 2 times, the most a 'capped' job may (max_snoozes=2)",
        "Snooze: snoozed 2 times, the most a 'capped' job may (max_snoozes=2)",
    ]


# --- jobsup cancel ---------------------------------------------------------------------------------

KILL_GRACE = 2.0  # the supervisor's (Config.kill_grace)


def pid_gone(pid: int) -> bool:
    import psutil

    try:
        return not alive(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return True


def test_cancelling_a_running_job_stops_its_worker_and_leaves_the_rest_alone(conn, dsn, start):
    make_calls_table(conn)
    hour, other = client.enqueue_many(
        conn,
        [
            {"kind": "stubborn"},  # ignores SIGTERM: SIGKILL after the grace
            {"kind": "sleep", "payload": {"seconds": 4}},
        ],
    )
    sup = start(app=APP, procs=2)
    wait_for(lambda: len(calls(conn, hour)) == 1 and len(calls(conn, other)) == 1, 60, 0.02, "both jobs running")
    [(_, pid, _)] = calls(conn, hour)
    before = {p.pid for p in sup.workers()}

    result = jobsup("cancel", "--id", str(hour), "--dsn", dsn)
    returned = time.monotonic()
    assert result.returncode == 0, result.stderr
    assert f"job {hour} (stubborn): cancel requested; running under " in result.stdout
    assert "cancelled 0 jobs; cancel requested for 1 running; 0 not changed" in result.stdout
    wait_for(lambda: pid_gone(pid), KILL_GRACE + 5, 0.01, "the cancelled job's worker to go")
    took = time.monotonic() - returned
    assert took < KILL_GRACE + 1, took

    wait_for(lambda: job(conn, hour)["status"] == "cancelled", 30, 0.02, "the job to be recorded cancelled")
    h = job(conn, hour)
    assert h["attempts"] == 1 and h["cancelled_by"].count("@") == 1
    assert h["last_error"] == f"cancelled by {h['cancelled_by']}"
    assert h["errors"][-1]["error"] == h["last_error"]
    wait_for(lambda: len(sup.workers()) == 2, 30, 0.05, "the pool back to its size")
    assert pid not in {p.pid for p in sup.workers()} and len(before) == 2
    wait_for(lambda: job(conn, other)["status"] == "done", 30, 0.05, "the other job to finish")
    o = job(conn, other)
    assert (o["attempts"], o["cancelled_by"], len(calls(conn, other))) == (1, None, 1)  # untouched
    assert len(calls(conn, hour)) == 1  # not retried
    assert "job.cancelled" in sup.log()


def test_a_worker_stopped_for_its_job_takes_no_other(conn, start):
    # A handler that ignores SIGTERM and ends within the kill grace: the worker is killed as soon as it
    # answers, and the job queued behind it runs in the new worker; it used to be given to the doomed
    # worker and die at the kill time, failed with the first job's cause.
    make_calls_table(conn)
    slow, after = client.enqueue_many(
        conn, [{"kind": "lingering", "payload": {"seconds": 1.0}}, {"kind": "sleep", "payload": {"seconds": 3}}]
    )
    sup = start(app=APP, procs=1)
    wait_for(lambda: finished(conn, [slow, after]), 60, 0.05, "both jobs to finish")
    assert job(conn, slow)["status"] == "done"  # it ended within the grace: it is done
    a = job(conn, after)
    assert (a["status"], a["attempts"], a["errors"]) == ("done", 1, []), a
    [(_, slow_pid, _)] = calls(conn, slow)
    [(_, after_pid, _)] = calls(conn, after)
    assert after_pid != slow_pid  # not in the worker that was being stopped
    assert "job.timed_out" in sup.log()


@pytest.mark.slow  # the CLI in a subprocess, many times
def test_cancel_of_queued_scheduled_finished_and_unknown_jobs(conn, dsn):
    queued, scheduled, finished_ = client.enqueue_many(
        conn, [{"kind": "ok"}, {"kind": "ok", "delay": 3600}, {"kind": "ok"}]
    )
    conn.execute("UPDATE jobsup.jobs SET status = 'done', done_at = now() WHERE id = %s", (finished_,))

    missing = jobsup("cancel", "--id", str(queued), "999999", "--dsn", dsn)
    assert missing.returncode == 2
    assert missing.stderr.strip() == "jobsup: error: no job with id 999999; nothing was changed"
    assert job(conn, queued)["status"] == "queued"  # nothing changed

    result = jobsup("cancel", "--id", str(queued), str(scheduled), str(finished_), "--json", "--dsn", dsn)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert (answer["cancelled"], answer["requested"], answer["unchanged"]) == (2, 0, 1)
    assert [(j["id"], j["action"], j["status"], j["was"]) for j in answer["jobs"]] == [
        (queued, "cancelled", "cancelled", "queued"),
        (scheduled, "cancelled", "cancelled", "queued"),
        (finished_, "unchanged", "done", "done"),
    ]
    for job_id in (queued, scheduled):
        row = job(conn, job_id)
        assert row["status"] == "cancelled" and row["done_at"] is not None
        assert row["last_error"].startswith("cancelled by ")
    assert job(conn, finished_)["status"] == "done"

    again = jobsup("cancel", "--id", str(queued), "--dsn", dsn)
    assert f"job {queued} (ok): not changed: cancelled already" in again.stdout
    totals = conn.execute("SELECT sum(cancelled) FROM jobsup.kind_totals WHERE kind = 'ok'").fetchone()[0]
    assert totals == 2


@pytest.mark.slow  # the CLI in a subprocess, many times
def test_cancel_by_kind_and_queue(conn, dsn):
    a, b, c = client.enqueue_many(conn, [{"kind": "email"}, {"kind": "email", "queue": "bulk"}, {"kind": "sms"}])
    result = jobsup("cancel", "--kind", "email", "--queue", "bulk", "--dsn", dsn)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"job {b} (email): cancelled (was queued)",
        "cancelled 1 job; cancel requested for 0 running; 0 not changed",
    ]
    assert [job(conn, i)["status"] for i in (a, b, c)] == ["queued", "cancelled", "queued"]
    none = jobsup("cancel", "--kind", "fax", "--dsn", dsn)
    assert none.returncode == 0 and "no queued or running job of kind fax: nothing cancelled" in none.stdout


@pytest.mark.slow  # the CLI in a subprocess
@pytest.mark.parametrize(
    "argv, message",
    [
        (["cancel"], "cancel needs one of --id N ..., --kind K or --workflow ID"),
        (["cancel", "--id", "1", "--kind", "x"], "cancel needs one of --id N ..., --kind K or --workflow ID"),
        (["cancel", "--id", "1", "--queue", "q"], "--queue narrows --kind; with --id the ids say which jobs"),
        (["cancel", "--kind", " "], "--kind cannot be empty"),
        (["pause", ""], "a queue name cannot be empty"),
        (["resume", " "], "a queue name cannot be empty"),
        (["retry", "--id", "424242"], "no job with id 424242; nothing was changed"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(dsn, argv, message):
    result = jobsup(*argv, "--dsn", dsn)
    assert result.returncode == 2
    assert result.stderr.strip() == f"jobsup: error: {message}"
    assert result.stdout == ""


def test_a_cancel_whose_notify_was_missed_is_found_by_the_lease_renewal(conn, start):
    make_calls_table(conn)
    [hour] = client.enqueue_many(conn, [{"kind": "sleep", "payload": {"seconds": 3600}}])
    start("--lease", "900ms", app=APP, procs=1)  # renewed every 300 ms
    wait_for(lambda: calls(conn, hour), 60, 0.02, "the job to run")
    # The request without its NOTIFY (as if the listener was reconnecting when it was sent).
    conn.execute("UPDATE jobsup.jobs SET cancelled_by = 'someone@elsewhere' WHERE id = %s", (hour,))
    wait_for(lambda: job(conn, hour)["status"] == "cancelled", 20, 0.05, "the renewal to find the request")
    assert job(conn, hour)["last_error"] == "cancelled by someone@elsewhere"


# --- jobsup pause / resume -------------------------------------------------------------------------


class Feed:
    """A steady stream of 1 ms `tick` jobs into some queues, from a thread of its own."""

    def __init__(self, dsn: str, queues: list[str], per_second: int = 100) -> None:
        import threading

        self.dsn, self.queues, self.per_second = dsn, queues, per_second
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            per_round = max(1, self.per_second // 50)
            while not self.stop.wait(0.02):
                client.enqueue_many(conn, [{"kind": "tick", "queue": q} for q in self.queues for _ in range(per_round)])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def started_by_queue(conn, since, until) -> dict[str, int]:
    return dict(
        conn.execute(
            "SELECT j.queue, count(*) FROM calls c JOIN jobsup.jobs j ON j.id = c.job_id "
            "WHERE c.at >= %s AND c.at < %s GROUP BY j.queue",
            (since, until),
        ).fetchall()
    )


def db_now(conn):
    return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def test_pausing_a_queue_under_load_on_two_supervisors(conn, dsn, start):
    from datetime import timedelta

    make_calls_table(conn)
    sups = [start("--queues", "a,b", app=APP, procs=2) for _ in range(2)]
    for sup in sups:
        sup.wait_ready()
    feed = Feed(dsn, ["a", "b"])
    try:
        wait_for(
            lambda: len(started_by_queue(conn, db_now(conn) - timedelta(seconds=1), db_now(conn))) == 2,
            30,
            0.05,
            "both queues running",
        )
        # A steady state to compare with: the stream running into both queues for 2 s by the database's
        # clock, which the spans compared below are read by.
        steady = db_now(conn)
        wait_for(lambda: db_now(conn) >= steady + timedelta(seconds=2), 10, 0.05, "2 s of the stream")
        result = jobsup("pause", "a", "--dsn", dsn)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "paused queue a: no supervisor claims from it; running jobs finish"
        (paused_at,) = conn.execute("SELECT paused_at FROM jobsup.queue_pauses WHERE queue = 'a'").fetchone()
        for sup in sups:
            sup.wait_log("queue.paused")
        # The stream goes on into both queues until the spans compared below (up to 3 s after the pause)
        # have passed, by the database's clock.
        wait_for(lambda: db_now(conn) >= paused_at + timedelta(seconds=3.5), 15, 0.05, "3.5 s of the pause")
        during_end = db_now(conn)
        late = started_by_queue(conn, paused_at + timedelta(seconds=2), during_end)
        assert late.get("a", 0) == 0, late  # nothing of `a` started more than 2 s after the pause
        before = started_by_queue(conn, paused_at - timedelta(seconds=2), paused_at).get("b", 0)
        during = started_by_queue(conn, paused_at + timedelta(seconds=1), paused_at + timedelta(seconds=3)).get("b", 0)
        assert before > 0 and during >= 0.6 * before, (before, during)  # `b` kept its pace (fed at 100/s)
        again = jobsup("pause", "a", "--dsn", dsn)
        assert again.stdout.strip() == "queue a was paused already: nothing changed"

        resumed = jobsup("resume", "a", "--json", "--dsn", dsn)
        assert json.loads(resumed.stdout) == {"queue": "a", "paused": False, "changed": True}
        (resumed_at,) = conn.execute("SELECT clock_timestamp()").fetchone()
        wait_for(
            lambda: started_by_queue(conn, resumed_at, db_now(conn)).get("a", 0) > 0, 10, 0.05, "queue a claimed again"
        )
    finally:
        feed.close()
    wait_for(
        lambda: conn.execute("SELECT count(*) FROM jobsup.jobs WHERE status <> 'done'").fetchone()[0] == 0,
        60,
        0.1,
        "the backlog of a to drain",
    )
    for sup in sups:
        assert "queue.resumed" in sup.log()


def test_a_pause_whose_notify_was_missed_is_read_by_the_heartbeat(conn, dsn, start):
    from datetime import timedelta

    make_calls_table(conn)
    sup = start(app=APP, procs=1)  # --heartbeat-interval 200ms
    sup.wait_ready()
    conn.execute("INSERT INTO jobsup.queue_pauses (queue) VALUES ('default')")  # no NOTIFY
    sup.wait_log("queue.paused", 10)
    (since,) = conn.execute("SELECT clock_timestamp()").fetchone()
    ids = client.enqueue_many(conn, [{"kind": "tick"}] * 5)
    went_on_past(conn, sup, 1.0)  # a span in which nothing may start, the supervisor looping through it
    assert started_by_queue(conn, since, db_now(conn)) == {}
    stats = jobsup("stats", "--json", "--dsn", dsn)
    assert [q["queue"] for q in json.loads(stats.stdout)["paused_queues"]] == ["default"]
    assert "paused queues" in jobsup("stats", "--dsn", dsn).stdout
    conn.execute("DELETE FROM jobsup.queue_pauses")
    wait_for(lambda: finished(conn, ids), 20, 0.05, "the jobs to run once the pause is gone")
    assert started_by_queue(conn, since, db_now(conn) + timedelta(seconds=1)) == {"default": 5}


# --- jobsup retry ----------------------------------------------------------------------------------


def test_retry_runs_a_job_waiting_for_its_backoff_now_and_reports_the_others(conn, dsn, start):
    make_calls_table(conn)
    waiting, scheduled, due, done = client.enqueue_many(
        conn,
        [
            {"kind": "rate_limited", "payload": {"seconds": 3600}},  # RetryAfter(3600) on its first attempt
            {"kind": "ok", "delay": 3600, "queue": "later"},
            {"kind": "ok", "queue": "later"},
            {"kind": "ok", "queue": "later"},
        ],
    )
    conn.execute("UPDATE jobsup.jobs SET status = 'done', done_at = now() WHERE id = %s", (done,))
    start(app=APP, procs=1)
    wait_for(
        lambda: job(conn, waiting)["attempts"] == 1 and job(conn, waiting)["status"] == "queued",
        30,
        0.05,
        "the first attempt to fail",
    )
    assert job(conn, waiting)["run_at"] > db_now(conn)  # an hour away

    result = jobsup("retry", "--id", str(waiting), str(scheduled), str(due), str(done), "--dsn", dsn)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"job {waiting} (rate_limited): retried: attempt 2 is due now",
        f"job {scheduled} (ok): not changed: scheduled, not waiting for a retry (it never ran)",
        f"job {due} (ok): not changed: due already",
        f"job {done} (ok): not changed: done, not waiting for a retry",
        "retried 1 job now; 3 not changed",
    ]
    wait_for(lambda: job(conn, waiting)["status"] == "done", 20, 0.05, "the retry to run at once")
    assert job(conn, waiting)["attempts"] == 2
    assert job(conn, scheduled)["run_at"] > db_now(conn)
