"""Jobs that share a worker process (handlers declared shared=True), under real supervisors: many at
once in one process, and no job paying for a neighbour's crash, timeout or blocked event loop.

Every run writes its start and end to `wait_runs` (tests/apps/waiting.py), so what ran, how often and
at once is counted from the records.
"""

from __future__ import annotations

import signal

import psutil
import psycopg
import pytest

from jobsup import JobSpec, enqueue_many
from jobsup.worker.sharing import culprit_of_fault
from tests.apps.waiting import setup

from .helpers import jobsup, refused_all, wait_for
from .supervisor_helpers import status_counts

APP = "tests.apps.waiting:app"

pytestmark = pytest.mark.slow


@pytest.fixture
def runs(conn: psycopg.Connection, dsn: str) -> psycopg.Connection:
    setup(dsn)
    return conn


def _enqueue(conn: psycopg.Connection, specs: list[JobSpec]) -> list[int]:
    return enqueue_many(conn, specs)


def _finished(conn: psycopg.Connection, count: int, timeout: float = 60) -> None:
    wait_for(
        lambda: (
            conn.execute("SELECT count(*) FROM jobsup.jobs WHERE status IN ('done', 'dead', 'cancelled')").fetchone()[0]
            >= count
        ),
        timeout,
        message=lambda: f"{count} jobs finished: {status_counts(conn)}",
    )


def _most_at_once(conn: psycopg.Connection, kind: str | None = None) -> int:
    """The most runs (of `kind`) that overlapped at any instant, from the records."""
    row = conn.execute(
        """
        SELECT coalesce(max(n), 0) FROM (
            SELECT sum(d) OVER (ORDER BY at, d) AS n FROM (
                SELECT started AS at, 1 AS d FROM wait_runs WHERE %(kind)s::text IS NULL OR kind = %(kind)s
                UNION ALL
                SELECT ended, -1 FROM wait_runs WHERE ended IS NOT NULL AND (%(kind)s::text IS NULL OR kind = %(kind)s)
            ) edges
        ) running
        """,
        {"kind": kind},
    ).fetchone()
    return int(row[0])


def test_shared_jobs_run_many_at_once_in_one_process(runs, start):
    ids = _enqueue(runs, [JobSpec("wait", {"seconds": 1.0}) for _ in range(100)])
    sup = start("--capacity", "200", app=APP, procs=1)
    _finished(runs, len(ids))
    assert status_counts(runs) == {"done": 100}
    # One process ran them, most of them at once: 100 one-second jobs, not one after another.
    assert runs.execute("SELECT count(DISTINCT pid) FROM wait_runs").fetchone()[0] == 1
    assert _most_at_once(runs) >= 50
    span = runs.execute("SELECT extract(epoch FROM max(ended) - min(started)) FROM wait_runs").fetchone()[0]
    assert span < 20, span
    sup.stop()


def test_a_segfault_and_an_exit_cost_their_own_attempts_never_a_neighbours(runs, start):
    specs = [JobSpec("wait", {"seconds": 1.0}) for _ in range(100)]
    specs.insert(40, JobSpec("wait", {"seconds": 1.0, "crash": "segfault"}))
    specs.insert(70, JobSpec("wait", {"seconds": 1.0, "crash": "exit"}))
    ids = _enqueue(runs, specs)
    culprits = {ids[40], ids[70]}
    sup = start("--capacity", "200", app=APP, procs=1)
    _finished(runs, len(ids), timeout=90)
    rows = runs.execute("SELECT id, status, attempts, last_error FROM jobsup.jobs").fetchall()
    for job_id, status, attempts, error in rows:
        if job_id in culprits:
            assert (status, attempts) == ("dead", 3), (job_id, status, attempts, error)
        else:  # innocent: done on its first attempt, whatever crashed beside it
            assert (status, attempts, error) == ("done", 1, None), (job_id, status, attempts, error)
    log = sup.log()
    assert "jobs.rerun" in log and f"by={ids[40]}" in log and f"by={ids[70]}" in log
    # Never two runs of one job at once: each run of a job began after the one before it ended (or
    # after its process died, which ends no record: those are the unfinished ones).
    overlapping = runs.execute(
        """
        SELECT count(*) FROM wait_runs a JOIN wait_runs b
          ON a.job_id = b.job_id AND a.run < b.run AND a.ended IS NOT NULL AND b.started < a.ended
        """
    ).fetchone()[0]
    assert overlapping == 0
    sup.stop()


def test_a_process_killed_from_outside_returns_every_job_it_ran_unpunished(runs, start):
    ids = _enqueue(runs, [JobSpec("wait", {"seconds": 3.0}) for _ in range(100)])
    sup = start("--capacity", "200", app=APP, procs=1)
    wait_for(lambda: runs.execute("SELECT count(*) FROM wait_runs").fetchone()[0] >= 100, 30)
    (worker,) = sup.workers()
    worker.send_signal(signal.SIGKILL)
    _finished(runs, len(ids), timeout=60)
    assert runs.execute("SELECT status, attempts, count(*) FROM jobsup.jobs GROUP BY 1, 2").fetchall() == [
        ("done", 1, 100)
    ]
    assert "jobs.rerun" in sup.log()
    sup.stop()


def test_one_job_past_its_timeout_is_cancelled_while_the_others_finish(runs, start):
    specs = [JobSpec("wait_short", {"seconds": 0.2}) for _ in range(99)]
    specs.insert(50, JobSpec("wait_short", {"seconds": 5.0}))  # its handler's timeout is 0.5 s
    ids = _enqueue(runs, specs)
    sup = start("--capacity", "200", app=APP, procs=1)
    wait_for(lambda: runs.execute("SELECT count(*) FROM jobsup.jobs WHERE status = 'done'").fetchone()[0] == 99, 30)
    wait_for(
        lambda: runs.execute(
            "SELECT attempts > 1 OR status <> 'running' FROM jobsup.jobs WHERE id = %s", (ids[50],)
        ).fetchone()[0],
        30,
    )
    overrun = runs.execute("SELECT status, last_error FROM jobsup.jobs WHERE id = %s", (ids[50],)).fetchone()
    assert overrun[1] is not None and overrun[1].startswith("timed out after 0.5s"), overrun
    # Cancelled as a task, not by killing the process: one process did all of it.
    assert "worker.died" not in sup.log()
    assert runs.execute("SELECT count(DISTINCT pid) FROM wait_runs").fetchone()[0] == 1
    sup.stop()


def test_a_job_that_ignores_its_cancel_has_its_process_recycled_and_its_neighbours_run_again(runs, start):
    # The neighbours (timeout 30 s) still run when the culprit (timeout 0.5 s) outlasts its kill grace.
    specs = [JobSpec("wait", {"seconds": 5.0}) for _ in range(20)]
    specs.insert(10, JobSpec("wait_short", {"seconds": 10.0, "crash": "ignore_cancel"}))
    ids = _enqueue(runs, specs)
    sup = start("--capacity", "200", "--backoff-base", "30s", app=APP, procs=1)
    wait_for(lambda: runs.execute("SELECT count(*) FROM jobsup.jobs WHERE status = 'done'").fetchone()[0] == 20, 40)
    row = runs.execute("SELECT status, attempts, last_error FROM jobsup.jobs WHERE id = %s", (ids[10],)).fetchone()
    assert row[0] == "queued" and "its process was recycled" in row[2], row  # its own failed attempt
    assert "jobs.rerun" in sup.log()
    assert runs.execute("SELECT max(attempts) FROM jobsup.jobs WHERE id <> %s", (ids[10],)).fetchone()[0] == 1
    sup.stop()


def test_a_blocked_event_loop_is_reported_and_its_process_recycled(runs, start):
    specs = [JobSpec("wait", {"seconds": 8.0}) for _ in range(10)]
    specs.insert(5, JobSpec("wait", {"seconds": 30.0, "crash": "block"}))
    ids = _enqueue(runs, specs)
    sup = start("--capacity", "200", "--loop-block-limit", "3s", "--backoff-base", "60s", app=APP, procs=1)
    line = sup.wait_log("worker.blocked", timeout=30)
    assert f"by={ids[5]}" in line
    wait_for(lambda: runs.execute("SELECT count(*) FROM jobsup.jobs WHERE status = 'done'").fetchone()[0] == 10, 60)
    row = runs.execute("SELECT attempts, last_error FROM jobsup.jobs WHERE id = %s", (ids[5],)).fetchone()
    assert "blocked the event loop" in row[1], row
    assert runs.execute("SELECT max(attempts) FROM jobsup.jobs WHERE id <> %s", (ids[5],)).fetchone()[0] == 1
    sup.stop()


def test_cancel_of_one_running_shared_job_leaves_its_neighbours_running(runs, start, dsn):
    ids = _enqueue(runs, [JobSpec("wait", {"seconds": 4.0}) for _ in range(20)])
    sup = start("--capacity", "200", app=APP, procs=1)
    wait_for(lambda: runs.execute("SELECT count(*) FROM wait_runs").fetchone()[0] >= 20, 30)
    assert jobsup("cancel", "--id", str(ids[3]), "--dsn", dsn).returncode == 0
    wait_for(
        lambda: runs.execute("SELECT status FROM jobsup.jobs WHERE id = %s", (ids[3],)).fetchone()[0] == "cancelled", 20
    )
    _finished(runs, len(ids))
    assert dict(runs.execute("SELECT status, count(*) FROM jobsup.jobs GROUP BY 1").fetchall()) == {
        "done": 19,
        "cancelled": 1,
    }
    assert "worker.died" not in sup.log()
    sup.stop()


def test_sync_shared_jobs_run_in_threads(runs, start):
    ids = _enqueue(runs, [JobSpec("wait_sync", {"seconds": 1.0}) for _ in range(40)])
    sup = start("--capacity", "50", app=APP, procs=1)
    _finished(runs, len(ids))
    assert status_counts(runs) == {"done": 40}
    assert _most_at_once(runs) >= 20
    sup.stop()


def test_a_handler_caps_its_share_of_a_process(runs, start):
    ids = _enqueue(runs, [JobSpec("wait_capped", {"seconds": 0.3}) for _ in range(12)])
    sup = start("--capacity", "50", app=APP, procs=1)
    _finished(runs, len(ids))
    assert _most_at_once(runs, "wait_capped") == 3
    sup.stop()


def test_alone_jobs_are_not_starved_by_a_stream_of_shared_ones(runs, start):
    _enqueue(runs, [JobSpec("wait", {"seconds": 2.0}) for _ in range(300)])
    sup = start("--capacity", "100", app=APP, procs=2)
    wait_for(lambda: runs.execute("SELECT count(*) FROM wait_runs").fetchone()[0] >= 150, 30)
    (alone,) = _enqueue(runs, [JobSpec("alone", {"seconds": 0.1})])
    wait_for(lambda: runs.execute("SELECT status FROM jobsup.jobs WHERE id = %s", (alone,)).fetchone()[0] == "done", 30)
    # It ran in a process of its own: no shared job ran in that process while it did.
    sup.stop()


def test_graceful_stop_with_hundreds_of_shared_jobs_in_flight_loses_nothing(runs, start):
    ids = _enqueue(runs, [JobSpec("wait", {"seconds": 2.0}) for _ in range(500)])
    sup = start("--capacity", "300", app=APP, procs=2)
    wait_for(lambda: runs.execute("SELECT count(*) FROM wait_runs").fetchone()[0] >= 400, 40)
    assert sup.stop() == 0
    counts = status_counts(runs)
    assert sum(counts.values()) == len(ids)
    assert set(counts) <= {"done", "queued"}, counts  # finished, or handed back: none stuck running
    assert runs.execute("SELECT max(attempts) FROM jobsup.jobs WHERE status = 'done'").fetchone()[0] == 1


def test_a_supervisor_sigkilled_with_shared_jobs_loses_nothing(runs, start):
    ids = _enqueue(runs, [JobSpec("wait", {"seconds": 2.0}) for _ in range(200)])
    sup = start("--capacity", "200", "--lease", "1s", app=APP, procs=1)
    wait_for(lambda: runs.execute("SELECT count(*) FROM wait_runs").fetchone()[0] >= 100, 30)
    pids = [w.pid for w in sup.workers()]
    sup.kill()
    wait_for(
        lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids), 10
    )
    second = start("--capacity", "200", "--lease", "1s", app=APP, procs=1)
    _finished(runs, len(ids), timeout=90)
    # The reaper returned what the dead supervisor held: each such job lost the attempt it was on, as
    # an alone job's does (no one can tell which job, if any, was at fault).
    assert status_counts(runs) == {"done": 200}
    second.stop()


def test_the_culprit_of_a_fault_report_is_the_job_of_the_thread_that_crashed():
    assert culprit_of_fault("Current thread 0x1 (most recent call first):\n  File 'x', line 1 in jobsup_job_12\n") == 12


def test_a_capacity_that_is_not_a_positive_whole_number_is_refused(dsn):
    refused_all(dsn, [(["start", "--app", APP, f"--capacity={value}"], "--capacity") for value in ("0", "-1", "x")])


def test_a_job_enqueued_into_a_nearly_full_process_starts_at_once(runs, start):
    """Claims of shared jobs behind a backlog wait for a share of the room, so that one claim starts
    many; a job announced once the queue has run dry is claimed at once, whatever room is left."""
    _enqueue(runs, [JobSpec("wait", {"seconds": 20.0}) for _ in range(195)])
    sup = start("--capacity", "200", app=APP, procs=1)
    wait_for(lambda: runs.execute("SELECT count(*) FROM wait_runs").fetchone()[0] == 195, 30)
    (late,) = _enqueue(runs, [JobSpec("wait", {"seconds": 0.1})])
    wait_for(lambda: runs.execute("SELECT status FROM jobsup.jobs WHERE id = %s", (late,)).fetchone()[0] == "done", 5)
    sup.stop(timeout=60)


def test_an_app_of_alone_and_shared_kinds_drains_a_backlog_of_alone_jobs_at_full_speed(runs, start):
    """Its two classes are claimed in statements of their own, so a claim of one comes back shorter than
    the room it was sized by: that is no sign the queues have run dry. (A backlog of alone jobs once
    drained at the prefetch's few jobs per --poll-interval: 400 in minutes.) The poll is an hour here,
    so every claim is one the NOTIFYs and the claims' own answers lead to."""
    sup = start("--poll-interval", "1h", app=APP, procs=2)
    _enqueue(runs, [JobSpec("alone", {"seconds": 0}) for _ in range(400)])
    _finished(runs, 400, timeout=20)
    # and beside a backlog of shared jobs, each class at once
    alone = [JobSpec("alone", {"seconds": 0}) for _ in range(400)]
    _enqueue(runs, alone + [JobSpec("wait", {"seconds": 0.05}) for _ in range(400)])
    _finished(runs, 1200, timeout=20)
    # Both classes ran dry: one more job of each is claimed when its NOTIFY comes.
    _enqueue(runs, [JobSpec("alone", {"seconds": 0})])
    _finished(runs, 1201, timeout=5)
    _enqueue(runs, [JobSpec("wait", {"seconds": 0})])
    _finished(runs, 1202, timeout=5)
    assert status_counts(runs) == {"done": 1202}
    sup.stop()
