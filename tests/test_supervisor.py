"""`jobsup start` against a real PostgreSQL, with real worker processes and real signals."""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime

import psycopg
import pytest

from jobsup import client

from .helpers import jobsup, wait_for
from .supervisor_helpers import alive, enqueue_kinds, make_calls_table, status_counts


def workers_in_state(conn, state: str) -> int:
    """Workers in `state` as the supervisor's heartbeat says (a claimed job may be only prefetched)."""
    row = conn.execute("SELECT workers FROM jobsup.supervisors").fetchone()
    return sum(w["state"] == state for w in row[0]) if row else 0


def busy_workers(conn) -> int:
    return workers_in_state(conn, "busy")


def idle_workers(conn) -> int:
    return workers_in_state(conn, "idle")


def calls_per_job(conn) -> dict[int, int]:
    return dict(conn.execute("SELECT job_id, count(*) FROM calls GROUP BY job_id").fetchall())


def test_eight_workers_handle_each_of_1000_jobs_exactly_once(conn, start):
    make_calls_table(conn)
    sup = start(procs=8)
    # Every worker ready first: else the first to import the app could, on a loaded machine, run all
    # of them, and whether the work was spread would depend on which process the scheduler ran first.
    wait_for(lambda: idle_workers(conn) == 8, timeout=60, message="eight idle workers")
    ids = enqueue_kinds(conn, ["record"] * 900 + ["async_ok"] * 100)  # async handlers run the same way
    wait_for(lambda: status_counts(conn).get("done") == 1000, timeout=60, message="1000 done")
    calls = calls_per_job(conn)
    assert sorted(calls) == sorted(ids)
    assert set(calls.values()) == {1}
    pids = {row[0] for row in conn.execute("SELECT DISTINCT pid FROM calls")}
    assert len(pids) > 1  # the work was spread over workers
    assert sup.stop() == 0
    totals = dict(conn.execute("SELECT kind, sum(done) FROM jobsup.kind_totals GROUP BY kind").fetchall())
    assert totals == {"record": 900, "async_ok": 100}


MISBEHAVIOUR = {
    "raise": "RuntimeError: raised on attempt 2",
    "exit": "worker exited with code 3",
    "segfault": "worker exited with signal SIGSEGV",
    "sigkill": "worker killed (SIGKILL; out of memory?)",
    "hang": "timed out after 1s",
    "sysexit": "handler called sys.exit(3)",
    "interrupt": "KeyboardInterrupt",
    "hog": "over twice --max-memory 100 MB",
}


def test_each_misbehaving_handler_costs_one_attempt_and_never_the_pool(conn, start):
    make_calls_table(conn)
    ids = dict(zip(MISBEHAVIOUR, enqueue_kinds(conn, list(MISBEHAVIOUR), max_attempts=2), strict=True))
    sup = start("--max-memory", "100", "--heartbeat-interval", "100ms", procs=3)
    wait_for(lambda: status_counts(conn).get("dead") == len(ids), timeout=60, message="every misbehaving job dead")
    for kind, job_id in ids.items():
        attempts, last_error, errors = conn.execute(
            "SELECT attempts, last_error, errors FROM jobsup.jobs WHERE id = %s", (job_id,)
        ).fetchone()
        assert attempts == 2, kind
        assert MISBEHAVIOUR[kind] in last_error, (kind, last_error)
        assert [e["attempt"] for e in errors] == [1, 2], kind
    # The pool is still whole and working.
    [after] = enqueue_kinds(conn, ["record"])
    wait_for(lambda: calls_per_job(conn).get(after) == 1, message="a job after the carnage")
    wait_for(lambda: len(sup.workers()) == 3, message="three workers")  # the last replaced may be starting
    log = sup.log()
    assert "worker.died" in log and "job.timed_out" in log
    assert sup.stop() == 0
    dead = conn.execute("SELECT sum(dead) FROM jobsup.kind_totals").fetchone()[0]
    assert dead == len(ids)


def test_unknown_kind_waits_and_unusable_payload_ends_dead_with_a_clear_error(conn, start):
    unknown = client.enqueue(conn, "no_such_kind", max_attempts=2)
    unusable = client.enqueue(conn, "needs_field", {"nothing": 1}, max_attempts=1)
    start()
    wait_for(lambda: status_counts(conn).get("dead") == 1, message="the unusable one dead")
    errors = dict(conn.execute("SELECT id, last_error FROM jobsup.jobs").fetchall())
    assert errors[unusable] == "KeyError: 'count'"
    # no handler here: never claimed, left for a supervisor whose app handles it
    assert conn.execute("SELECT status, attempts FROM jobsup.jobs WHERE id = %s", [unknown]).fetchone() == (
        "queued",
        0,
    )
    [ok] = enqueue_kinds(conn, ["ok"])
    wait_for(lambda: status_counts(conn).get("done") == 1, message="the pool still works")


def test_a_slow_job_on_a_short_lease_and_the_jobs_prefetched_behind_it_run_once(conn, start):
    make_calls_table(conn)
    slow = client.enqueue(conn, "sleep", {"seconds": 3}, priority=1)
    behind = enqueue_kinds(conn, ["record"] * 3)
    # One worker, so the prefetched jobs wait behind the slow one for three times their lease. A lease
    # of 1 s (renewed every 333 ms), not less: on a loaded machine a renewal can be late by a few
    # hundred milliseconds, and that would be the machine's fault, not the renewal's.
    start("--lease", "1s", "--prefetch", "3", procs=1)
    wait_for(lambda: status_counts(conn).get("done") == 4, message="all four done")
    rows = conn.execute("SELECT id, attempts FROM jobsup.jobs ORDER BY id").fetchall()
    assert rows == [(slow, 1)] + [(job_id, 1) for job_id in behind]
    assert set(calls_per_job(conn).values()) == {1}


def test_a_delayed_retry_starts_on_time_not_at_the_next_poll(conn, start):
    job_id = client.enqueue(conn, "flaky")
    start("--backoff-base", "300ms", "--poll-interval", "30s")
    wait_for(lambda: status_counts(conn).get("done") == 1, timeout=15, message="the retry")
    [(errors, retry_started)] = conn.execute(
        "SELECT errors, started_at FROM jobsup.jobs WHERE id = %s", (job_id,)
    ).fetchall()
    assert len(errors) == 1
    failed_at = datetime.fromisoformat(errors[0]["at"])
    # The backoff is 300 ms (jitter 0); the poll would be 30 s late. 10 s leaves room for a loaded machine.
    assert 0.25 < (retry_started - failed_at).total_seconds() < 10, (failed_at, retry_started)


def test_notify_wakes_an_idle_supervisor_at_once(conn, start):
    sup = start("--poll-interval", "30s")
    sup.wait_ready()
    wait_for(lambda: conn.execute("SELECT count(*) FROM jobsup.supervisors").fetchone()[0] == 1)
    enqueued = time.monotonic()
    client.enqueue(conn, "ok")
    wait_for(lambda: status_counts(conn).get("done") == 1, timeout=15, message="done after NOTIFY")
    assert time.monotonic() - enqueued < 10  # the poll is 30 s; a loaded machine may take seconds


def test_heartbeat_describes_workers_and_a_clean_stop_removes_it(conn, start):
    sup = start(procs=2)

    def beat():
        row = conn.execute("SELECT pid, queues, procs, workers FROM jobsup.supervisors").fetchone()
        return row if row and all(w["state"] == "idle" for w in row[3]) and len(row[3]) == 2 else None

    pid, queues, procs, workers = wait_for(beat, message="a heartbeat with two idle workers")
    assert (pid, queues, procs) == (sup.pid, ["default"], 2)
    assert {w["pid"] for w in workers} == {p.pid for p in sup.workers()}
    assert all(w["rss"] > 0 for w in workers)
    assert sup.stop() == 0
    assert conn.execute("SELECT count(*) FROM jobsup.supervisors").fetchone()[0] == 0


def test_workers_are_recycled_after_max_jobs_per_proc(conn, start):
    make_calls_table(conn)
    enqueue_kinds(conn, ["record"] * 40)
    sup = start("--max-jobs-per-proc", "5", procs=1)
    wait_for(lambda: status_counts(conn).get("done") == 40, timeout=60, message="40 done")
    pids = conn.execute("SELECT count(DISTINCT pid) FROM calls").fetchone()[0]
    assert pids >= 4  # 5 to 5.5 jobs each, so about 7 workers
    # Short jobs go to a worker many at a time: never more than it may run before it is recycled.
    most = conn.execute("SELECT max(n) FROM (SELECT count(*) AS n FROM calls GROUP BY pid) AS per_pid").fetchone()[0]
    assert most <= 5
    assert "worker.recycled" in sup.log()


def test_sigterm_releases_prefetched_jobs_and_lets_running_ones_finish(conn, start):
    make_calls_table(conn)
    ids = client.enqueue_many(conn, [dict(kind="sleep", payload={"seconds": 3}) for _ in range(8)])
    sup = start("--prefetch", "4", procs=2)
    wait_for(lambda: status_counts(conn).get("running") == 6, message="2 running, 4 prefetched")
    sup.signal(signal.SIGTERM)

    def stopping():  # the console sees it finishing its two jobs, not a stale heartbeat
        row = conn.execute("SELECT state, workers FROM jobsup.supervisors").fetchone()
        return row and row[0] == "stopping" and sum(w["state"] == "busy" for w in row[1]) == 2

    wait_for(stopping, message="the heartbeat saying stopping, with two busy workers")
    assert sup.process.wait(20) == 0
    assert conn.execute("SELECT count(*) FROM jobsup.supervisors").fetchone()[0] == 0
    rows = dict(conn.execute("SELECT id, status FROM jobsup.jobs").fetchall())
    done = [i for i in ids if rows[i] == "done"]
    assert len(done) == 2, sup.log()
    assert all(rows[i] == "queued" for i in ids if i not in done)
    attempts = dict(conn.execute("SELECT id, attempts FROM jobsup.jobs WHERE status = 'queued'").fetchall())
    assert set(attempts.values()) == {0}  # handed back without losing an attempt
    assert "shutdown.released" in sup.log()


def test_shutdown_timeout_interrupts_and_returns_running_jobs_to_the_queue(conn, start):
    client.enqueue_many(conn, [dict(kind="sleep", payload={"seconds": 30}, max_attempts=1)] * 2)
    sup = start("--shutdown-timeout", "300ms", procs=2)
    # Both in a worker, not prefetched (a prefetched job is handed back, not interrupted).
    wait_for(lambda: busy_workers(conn) == 2, message="both running in a worker")
    sup.signal(signal.SIGINT, group=True)  # Ctrl-C in the terminal reaches the workers too
    assert sup.process.wait(20) == 0
    rows = conn.execute("SELECT status, attempts, last_error FROM jobsup.jobs ORDER BY id").fetchall()
    assert [r[:2] for r in rows] == [("queued", 0), ("queued", 0)]  # never buried for it
    assert all("interrupted" in r[2] for r in rows)
    assert not sup.workers()


def test_sighup_from_a_closed_terminal_is_a_graceful_stop(conn, start):
    make_calls_table(conn)
    ids = client.enqueue_many(conn, [dict(kind="sleep", payload={"seconds": 2}) for _ in range(6)])
    sup = start("--prefetch", "2", procs=2)
    wait_for(
        lambda: busy_workers(conn) == 2 and status_counts(conn).get("running") == 4, message="2 running, 2 prefetched"
    )
    workers = sup.workers()
    sup.signal(signal.SIGHUP, group=True)  # a closed terminal hangs up its whole process group
    assert sup.process.wait(30) == 0, sup.log()
    log = sup.log()
    assert "shutdown.started" in log and "signal=SIGHUP" in log and "shutdown.done" in log, log
    assert conn.execute("SELECT count(*) FROM jobsup.supervisors").fetchone()[0] == 0
    rows = dict(conn.execute("SELECT id, status FROM jobsup.jobs").fetchall())
    # the running ones finished (the workers ignore the hangup), the rest went back unspent; how many
    # were done before the signal landed depends on the machine's load
    assert set(rows.values()) == {"done", "queued"} and list(rows.values()).count("done") >= 2, log
    assert {r[0] for r in conn.execute("SELECT attempts FROM jobsup.jobs WHERE status = 'queued'")} == {0}
    assert "worker.died" not in log and "SIGHUP" not in log.replace("signal=SIGHUP", "")
    wait_for(lambda: not any(alive(w) for w in workers), timeout=10, message="its workers gone")
    assert set(ids) == set(rows)


def test_a_hangup_during_a_shutdown_neither_cuts_it_short_nor_leaves_the_row(conn, start):
    make_calls_table(conn)
    client.enqueue_many(conn, [dict(kind="sleep", payload={"seconds": 2})] * 2)
    sup = start(procs=2)
    wait_for(lambda: busy_workers(conn) == 2, message="both running")
    sup.signal(signal.SIGTERM)
    wait_for(
        lambda: conn.execute("SELECT state FROM jobsup.supervisors").fetchone() == ("stopping",),
        message="the row saying stopping",
    )
    sup.signal(signal.SIGHUP, group=True)
    assert sup.process.wait(30) == 0, sup.log()
    assert conn.execute("SELECT count(*) FROM jobsup.supervisors").fetchone()[0] == 0
    assert status_counts(conn) == {"done": 2}, sup.log()


def test_rows_of_supervisors_that_are_gone_are_removed_sooner_than_stale_ones_elsewhere(conn, start):
    import socket
    import subprocess
    import sys

    from jobsup.supervisor.roster import FORGET_GONE_AFTER, FORGET_STALE_AFTER

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # a pid of this host that no longer runs (reused within a test: astronomically rare)
    here = socket.gethostname()
    rows = [  # id, host, pid, seconds since its heartbeat
        ("here-ended", here, ended.pid, FORGET_GONE_AFTER + 1),  # certainly gone: removed
        # its pid gone, but it beat "just now" (ahead of the clock, however slowly the supervisor starts)
        ("here-ended-just-now", here, ended.pid, -600),
        ("here-alive", here, os.getpid(), FORGET_GONE_AFTER + 100),  # its process runs: kept, for now
        ("elsewhere-silent", "other-host", 1, FORGET_STALE_AFTER - 60),  # cannot be checked: kept
        ("elsewhere-stale", "other-host", 1, FORGET_STALE_AFTER + 1),  # silent past the window: removed
    ]
    for sup_id, host, pid, age in rows:
        conn.execute(
            "INSERT INTO jobsup.supervisors (id, host, pid, version, queues, procs, heartbeat_at) "
            "VALUES (%s, %s, %s, '0', '{default}', 1, now() - make_interval(secs => %s))",
            (sup_id, host, pid, age),
        )
    sup = start()
    sup.wait_log("supervisors.forgotten")
    left = {r[0] for r in conn.execute("SELECT id FROM jobsup.supervisors WHERE pid <> %s", [sup.pid])}
    assert left == {"here-ended-just-now", "here-alive", "elsewhere-silent"}, (left, sup.log())
    assert "count=2" in sup.log() and "here-ended" in sup.log()
    assert sup.stop() == 0


def test_a_second_ctrl_c_stops_at_once(conn, start):
    client.enqueue_many(conn, [dict(kind="sleep", payload={"seconds": 30})] * 2)
    sup = start("--shutdown-timeout", "60s", procs=2)
    wait_for(lambda: busy_workers(conn) == 2, message="both running in a worker")
    sup.signal(signal.SIGINT, group=True)
    sup.wait_log("shutdown.started")
    stopped = time.monotonic()
    sup.signal(signal.SIGINT, group=True)
    assert sup.process.wait(30) == 130
    assert time.monotonic() - stopped < 20  # the shutdown timeout is 60 s
    assert status_counts(conn) == {"queued": 2}
    wait_for(lambda: not sup.workers(), timeout=5, message="no worker left")


@pytest.mark.slow  # `jobsup start` in a subprocess
@pytest.mark.parametrize(
    "target, words",
    [
        ("tests.apps.broken:app", "tests.apps.broken is broken on purpose"),
        ("examples.misbehave:nope", "has no attribute 'nope'"),
        ("no_such_module_anywhere:app", "cannot import 'no_such_module_anywhere'"),
        ("examples.misbehave", "must look like module:attribute"),
    ],
)
def test_an_app_that_does_not_load_is_one_clear_error(dsn, target, words):
    result = jobsup("start", "--dsn", dsn, "--app", target, "--procs", "2", timeout=60)
    # a malformed --app is bad input, refused before anything starts; one that does not import is exit 3
    assert result.returncode == (3 if ":" in target else 2), result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("jobsup: error:") and words in last, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # `jobsup start` in a subprocess
def test_start_on_a_database_without_the_schema_says_to_migrate(empty_dsn):
    result = jobsup("start", "--dsn", empty_dsn, "--app", "examples.misbehave:app", "--procs", "1")
    assert result.returncode == 1
    assert "jobsup migrate" in result.stderr and "Traceback" not in result.stderr


def test_delayed_jobs_start_on_time_without_a_poll(conn, start):
    sup = start("--poll-interval", "30s")
    sup.wait_ready()
    wait_for(lambda: conn.execute("SELECT count(*) FROM jobsup.supervisors").fetchone()[0] == 1)
    first = client.enqueue(conn, "ok", delay=0.3)
    second = client.enqueue(conn, "ok", delay=0.8)  # a later wake-up, learned from its own NOTIFY
    wait_for(lambda: status_counts(conn).get("done") == 2, timeout=15, message="both delayed jobs done")
    late = dict(conn.execute("SELECT id, extract(epoch FROM started_at - run_at) FROM jobsup.jobs").fetchall())
    assert 0 <= late[first] < 10 and 0 <= late[second] < 10, late  # the poll would be up to 30 s late


def test_a_delay_enqueued_before_the_supervisor_started_is_kept(conn, start):
    # Its NOTIFY went out to nobody: the supervisor learns its run_at when it starts listening.
    job_id = client.enqueue(conn, "ok", delay=1.5)
    sup = start("--poll-interval", "30s")
    sup.wait_ready()
    wait_for(lambda: status_counts(conn).get("done") == 1, timeout=15, message="the delayed job done")
    [late] = conn.execute(
        "SELECT extract(epoch FROM started_at - run_at) FROM jobsup.jobs WHERE id = %s", [job_id]
    ).fetchone()
    assert 0 <= late < 10, late  # the poll would be up to 30 s late


def test_json_logs_are_one_object_per_line_with_an_action(conn, start):
    import json

    client.enqueue(conn, "raise", max_attempts=1)
    sup = start("--log-format", "json")
    wait_for(lambda: status_counts(conn).get("dead") == 1, message="the job dead")
    assert sup.stop() == 0
    records = [json.loads(line) for line in sup.log().splitlines() if line.strip()]
    actions = [r["action"] for r in records]
    assert actions[0] == "worker.spawned" and "supervisor.started" in actions and actions[-1] == "shutdown.done"
    dead = next(r for r in records if r["action"] == "job.dead")
    assert dead["kind"] == "raise" and dead["attempt"] == 1 and "raised on attempt 1" in dead["error"]
    started = next(r for r in records if r["action"] == "supervisor.started")
    assert started["version"] and started["queues"] == ["default"] and "dsn" in started


def test_a_shutdown_waits_for_the_outcome_write_in_flight(conn, dsn, start):
    """The shutdown lets the write in flight end and reads its answer, which says what it wrote and
    logs the dead. Cancelled mid-write, a write the database had already committed was sent again by
    the shutdown, found its jobs no longer held and logged lease.lost in place of job.dead (the test
    below lost lines so, once, under load). That moment cannot be caught from outside; this holds the
    write up with a lock on the totals its trigger counts, and the shutdown must wait for it and end
    cleanly once the lock is let go."""
    import json

    sup = start("--log-format", "json")
    sup.wait_ready()
    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE jobsup.kind_totals IN EXCLUSIVE MODE")
        (job_id,) = client.enqueue_many(conn, [dict(kind="raise", max_attempts=1)])
        blocked = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        wait_for(lambda: conn.execute(blocked).fetchone()[0] >= 1, message="the outcome write waiting for the lock")
        sup.signal(signal.SIGTERM)
        sup.wait_log("shutdown.started")
        assert status_counts(conn) == {"running": 1}
    assert sup.process.wait(20) == 0  # the lock let go with the transaction
    records = [json.loads(line) for line in sup.log().splitlines() if line.strip()]
    assert [r.get("job") for r in records if r["action"] == "job.dead"] == [job_id]
    assert not [r for r in records if r["action"] == "lease.lost"]
    assert conn.execute("SELECT status, attempts FROM jobsup.jobs WHERE id = %s", (job_id,)).fetchone() == ("dead", 1)


def test_repeated_identical_failures_are_logged_once_with_a_count(conn, start):
    import json

    n = 3000
    # A kind of the app that fails each attempt with the same error: once to retry, once to die.
    client.enqueue_many(conn, [dict(kind="needs_field", payload={}, max_attempts=2)] * n)
    sup = start("--log-format", "json")
    wait_for(lambda: status_counts(conn).get("dead") == n, timeout=60, message="every job dead")
    assert sup.stop() == 0
    records = [json.loads(line) for line in sup.log().splitlines() if line.strip()]
    for action, attempt in (("job.failed", 1), ("job.dead", 2)):
        lines = [r for r in records if r["action"] == action and r["kind"] == "needs_field"]
        full = [r for r in lines if "job" in r]
        counted = [r for r in lines if "more" in r]
        assert len(full) + sum(r["more"] for r in counted) == n, (action, lines)  # every one accounted for
        assert len(lines) < 20, (action, len(lines))  # not one line each
        assert full[0]["error"] and full[0]["attempt"] == attempt  # the first in full
        assert all(r["error"] and r["over"] > 0 for r in counted)


def test_a_count_of_repeats_reads_as_a_sentence_in_text():
    import io

    from jobsup.supervisor.log import EventLog

    stream = io.StringIO()
    log = EventLog("text", stream=stream)
    for job in range(1, 1236):
        log.alike("job.failed", "warning", like=("kind", "error"), job=job, kind="k", attempt=1, error="boom")
    log.alike("job.failed", "warning", like=("kind", "error"), job=9, kind="k", attempt=1, error="other")
    log.flush_repeats(force=True)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert lines[0].endswith("WARNING job.failed         job=1 kind=k attempt=1 error=boom"), lines[0]
    assert "job=9" in lines[1] and "error=other" in lines[1]
    assert (
        lines[2]
        .split(" ", 1)[1]
        .startswith("WARNING job.failed         kind=k error=boom (and 1,234 more like it in the last ")
    ), lines[2]


def test_the_worker_builds_each_job_in_the_order_of_jobs_fields():
    # The worker builds a Job from a tuple in its fields' order: a field added or moved must not shift
    # what a handler sees. What the supervisor sends (JSON as text) comes back as the handler's Job.
    from datetime import UTC, datetime

    from jobsup.job import Claimed, Job
    from jobsup.worker.messages import job_fields, job_of

    now = datetime.now(UTC)
    sent = Claimed(7, "k", '{"a": 1}', "q", 2, 5, 3, now, now, 1, '[{"attempt": 1}]', now, "acct", '{"t": "x"}')
    assert job_of(job_fields(sent)) == Job(
        id=7,
        kind="k",
        payload={"a": 1},
        queue="q",
        attempts=2,
        max_attempts=5,
        priority=3,
        snoozes=1,
        errors=[{"attempt": 1}],
        key="acct",
        meta={"t": "x"},
    )


def test_a_worker_reports_how_long_each_handler_ran_not_the_trip_through_the_pipes():
    """The dispatcher sends short jobs several at a time by the run time the worker reports: a time
    measured from the supervisor's side would count the pipes, milliseconds on a loaded machine."""
    import multiprocessing

    from jobsup.outcomes import Answer
    from jobsup.worker.main import worker_main
    from jobsup.worker.wire import Reader, send

    ctx = multiprocessing.get_context("spawn")
    their_inbox, inbox = ctx.Pipe(duplex=False)
    outbox, their_outbox = ctx.Pipe(duplex=False)
    env = os.environ.pop("JOBSUP_RECORD_DSN", None)  # the sleep handler records nothing here
    try:
        process = ctx.Process(
            target=worker_main, args=(their_inbox, their_outbox, "examples.misbehave:app", os.getpid(), os.getcwd())
        )
        process.start()
    finally:
        if env is not None:
            os.environ["JOBSUP_RECORD_DSN"] = env
    their_inbox.close()
    their_outbox.close()
    reader = Reader(outbox.fileno())
    try:
        assert reader.read_one()[0] == "ready"
        jobs = [
            (1, "sleep", '{"seconds": 0.3}', "default", 1, 3, 0, 0, None, None, None),
            (2, "ok", None, "default", 1, 3, 0, 0, None, None, None),
            (3, "raise", None, "default", 1, 3, 0, 0, None, None, None),
        ]  # fields as job_fields() gives them
        send(inbox.fileno(), ("jobs", jobs))
        answers = [reader.read_one() for _ in jobs]
        send(inbox.fileno(), ("stop",))
    finally:
        process.join(30)
        if process.is_alive():
            process.kill()
    answers = [Answer(*a[1:]) for a in answers]
    assert [(a.id, a.error is None) for a in answers] == [(1, True), (2, True), (3, False)]
    ran = [a.ran for a in answers]
    assert all(isinstance(r, float) for r in ran), answers
    assert ran[0] >= 0.3, ran  # the sleep itself
    # The job after it waited in the worker's hand-out while the first ran: not counted as its time.
    assert ran[1] < 0.3, ran
    assert answers[2].error.startswith("RuntimeError: raised on attempt 1"), answers[2]


def test_the_worker_reads_a_jsonb_columns_text_as_json_loads_does():
    import json

    from jobsup.worker.messages import column_json

    texts = ["{}", "[]", '{"a": 1}', '{"k": "é\\u00e9\\n", "n": [1, -2.5e3, 12345678901234567890, null, true]}', '"s"']
    texts += [" {} ", "1 ", "\t[1]\n"]  # not what PostgreSQL writes: json.loads reads them
    for text in texts:
        assert column_json(text) == json.loads(text), text
    for bad in ["", "{", "{} x", "nope", "[1,]"]:
        with pytest.raises(json.JSONDecodeError):
            column_json(bad)
