"""Faults from outside the supervisor: killed connections, a restarted server, a SIGKILLed supervisor,
a claimer that dies holding jobs, and two supervisors on one database."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import time

import psutil
import psycopg
import pytest

from jobsup import client
from jobsup.db import embedded, lifecycle

from .helpers import wait_for
from .supervisor_helpers import alive, enqueue_kinds, make_calls_table, status_counts

pytestmark = pytest.mark.slow  # every test runs real supervisors or a claimer process


def calls(conn) -> dict[int, int]:
    return dict(conn.execute("SELECT job_id, count(*) FROM calls GROUP BY job_id").fetchall())


def done_count(conn) -> int:
    return status_counts(conn).get("done", 0)


def _claim_and_die(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        lifecycle.claim(conn, ["default"], 3, "doomed-worker", 0.3)
    os._exit(1)


def test_a_claimer_that_dies_holding_jobs_has_them_returned_by_the_reaper(conn, start):
    make_calls_table(conn)
    ids = enqueue_kinds(conn, ["record"] * 3)
    process = multiprocessing.get_context("spawn").Process(target=_claim_and_die, args=(conn.info.dsn,))
    process.start()
    process.join(30)
    assert status_counts(conn) == {"running": 3}
    sup = start()
    wait_for(lambda: done_count(conn) == 3, message="the reaped jobs done")
    assert calls(conn) == {i: 1 for i in ids}
    attempts = {r[0] for r in conn.execute("SELECT attempts FROM jobsup.jobs")}
    assert attempts == {2}  # the lost attempt counts
    assert "reaped" in sup.log()
    event = conn.execute("SELECT action, count, job_ids, detail FROM jobsup.events").fetchone()
    assert event[:3] == ("reaped", 3, ids) and event[3]["from"] == ["doomed-worker"]


def test_killed_connections_lose_no_job(conn, start):
    make_calls_table(conn)
    ids = enqueue_kinds(conn, ["record"] * 6000)
    sup = start(procs=4)
    wait_for(lambda: done_count(conn) > 300, message="work under way")
    # The two connections that do the work; the others reconnect when their duty next runs (the
    # pruner's every 30 s), so they may not be there to kill again.
    working = {"jobsup claims", "jobsup writes"}

    def connected() -> set[str]:
        return {
            r[0]
            for r in conn.execute("SELECT application_name FROM pg_stat_activity WHERE datname = current_database()")
        }

    rounds = 0
    for _ in range(3):
        wait_for(
            lambda: working <= connected() or done_count(conn) == len(ids), message="claims and writes connected again"
        )
        before = done_count(conn)
        if before == len(ids):
            break
        killed = {
            name
            for name, ended in conn.execute(
                "SELECT application_name, pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name LIKE 'jobsup %%' AND datname = current_database()"
            )
            if ended
        }
        assert working <= killed, killed
        rounds += 1
        wait_for(
            lambda before=before: done_count(conn) > before + 100 or done_count(conn) == len(ids),
            message="work resumes after the kill",
        )
    assert rounds >= 2  # the work outlasted at least two rounds of kills
    wait_for(lambda: done_count(conn) == len(ids), timeout=60, message="every job done")
    assert calls(conn) == {i: 1 for i in ids}
    assert "db.reconnected" in sup.log()
    assert sup.stop() == 0


def test_a_restarted_server_loses_no_job(conn, start, pg_data_dir):
    if pg_data_dir is None:
        pytest.skip("restarts the embedded server; JOBSUP_TEST_DSN names another")
    make_calls_table(conn)
    ids = enqueue_kinds(conn, ["record"] * 2000)
    sup = start(procs=4)
    wait_for(lambda: done_count(conn) > 200, message="work under way")
    embedded.restart(pg_data_dir)
    with psycopg.connect(conn.info.dsn, autocommit=True) as fresh:
        wait_for(lambda: done_count(fresh) == len(ids), timeout=60, message="every job done after restart")
        assert set(calls(fresh)) == set(ids)
        # A result written by a worker but not yet by the supervisor can be run again after a restart
        # only if its lease lapsed; with the default 30 s lease, nothing runs twice.
        assert set(calls(fresh).values()) == {1}
    assert "db.reconnected" in sup.log()
    assert sup.stop() == 0


def test_sigkill_of_the_supervisor_leaves_no_worker_and_another_recovers_its_jobs(conn, start):
    make_calls_table(conn)
    ids = client.enqueue_many(conn, [dict(kind="sleep", payload={"seconds": 30})] * 2)
    first = start("--lease", "1s", procs=2)
    wait_for(lambda: status_counts(conn).get("running") == 2, message="both running")
    wait_for(lambda: len(first.workers()) == 2)
    # The workers, and the fork server and resource tracker multiprocessing started with them.
    descendants = psutil.Process(first.pid).children(recursive=True)
    assert len(descendants) >= 3
    os.kill(first.pid, signal.SIGKILL)
    first.process.wait(10)
    wait_for(
        lambda: not any(alive(p) for p in descendants),
        timeout=10,
        message="every process of the supervisor dies with it",
    )
    conn.execute("UPDATE jobsup.jobs SET payload = '{\"seconds\": 0}'")  # so the second run is quick
    second = start(procs=2)
    wait_for(lambda: done_count(conn) == 2, timeout=20, message="recovered by the second supervisor")
    assert set(calls(conn)) == set(ids)
    assert {r[0] for r in conn.execute("SELECT attempts FROM jobsup.jobs")} == {2}
    assert "reaped" in second.log()


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group: a supervisor's session holds it, its fork server and workers."""
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and alive(process):
                members.append(process.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return members


def _importing(sup) -> bool:
    """The supervisor's interpreter is loading the CLI's modules (psycopg's binary is mapped). Its
    command line first: until it execs, the child is a copy of this process, psycopg and all, and a
    signal sent then dies with that copy."""
    try:
        with open(f"/proc/{sup.pid}/cmdline", "rb") as cmdline:
            if b"jobsup\0start" not in cmdline.read():
                return False
        with open(f"/proc/{sup.pid}/maps") as maps:
            return "psycopg" in maps.read()
    except OSError:
        return False


def _starting_fork_server(sup) -> bool:
    """The supervisor's fork server is a process: a new interpreter, importing its preload."""
    try:
        return any("forkserver" in " ".join(child.cmdline()) for child in psutil.Process(sup.pid).children())
    except psutil.Error:
        return False


# Moments of the first second of `jobsup start`, each a condition: a Ctrl-C at any of them exits quietly.
MOMENTS = {
    "importing": _importing,  # KeyboardInterrupt while the CLI's modules import
    "fork server starting": _starting_fork_server,  # it and its preload import with SIGINT blocked
    "worker.spawned": lambda sup: "worker.spawned" in sup.log(),  # still spawning, no loop yet
    "supervisor.started": lambda sup: "supervisor.started" in sup.log(),  # the loop runs; workers import
}


@pytest.mark.parametrize(
    "app, moment",
    [
        ("examples.misbehave:app", "importing"),
        ("examples.misbehave:app", "fork server starting"),
        ("examples.misbehave:app", "worker.spawned"),
        ("tests.apps.slow:app", "supervisor.started"),
    ],
)
def test_ctrl_c_while_starting_stops_quietly_and_leaves_nothing(conn, start, app, moment):
    job_id = client.enqueue(conn, "ok")
    sup = start(app=app, procs=2)
    wait_for(lambda: MOMENTS[moment](sup), interval=0.001, message=moment)
    sup.signal(signal.SIGINT, group=True)  # as from the terminal: the workers get it too
    assert sup.process.wait(20) in (0, 130), sup.log()
    assert "Traceback" not in sup.log() and "Fatal Python error" not in sup.log(), sup.log()
    wait_for(lambda: not group_members(sup.pid), timeout=10, message="every process of the supervisor gone")
    status = conn.execute("SELECT status FROM jobsup.jobs WHERE id = %s", [job_id]).fetchone()[0]
    assert status in ("queued", "done")  # never left running, never lost


def test_two_supervisors_share_the_work_without_duplicates(conn, start):
    make_calls_table(conn)
    a = start(procs=3)
    b = start(procs=3)
    # Both ready before any job exists: else the first to start could do them all before the other
    # has imported its app, and the share would depend on which the scheduler ran first.
    a.wait_ready()
    b.wait_ready()
    wait_for(lambda: conn.execute("SELECT count(*) FROM jobsup.supervisors").fetchone()[0] == 2)
    ids = enqueue_kinds(conn, ["record"] * 2000)
    wait_for(lambda: done_count(conn) == len(ids), timeout=60, message="every job done")
    assert calls(conn) == {i: 1 for i in ids}
    by = dict(conn.execute("SELECT locked_by, count(*) FROM jobsup.jobs GROUP BY locked_by").fetchall())
    assert len(by) == 2 and min(by.values()) > 100  # both took a real share
    assert a.stop() == 0 and b.stop() == 0


def test_a_shutdown_with_the_database_gone_gives_up_in_time_and_the_jobs_come_back(conn, start, server_dsn):
    make_calls_table(conn)
    ids = client.enqueue_many(conn, [dict(kind="sleep", payload={"seconds": 1})] * 2)
    sup = start("--shutdown-timeout", "300ms", "--lease", "1s", procs=2)
    wait_for(lambda: status_counts(conn).get("running") == 2, message="both running")
    name = conn.info.dbname
    conn.close()
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        sup.signal(signal.SIGTERM)
        code = sup.process.wait(30)
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    assert code == 1
    assert "the reaper returns unwritten jobs" in sup.log()
    with psycopg.connect(sup_dsn(server_dsn, name), autocommit=True) as fresh:
        second = start(procs=2)
        wait_for(lambda: status_counts(fresh).get("done") == 2, timeout=20, message="jobs recovered")
        assert set(calls(fresh)) == set(ids)
    assert second.stop() == 0


def test_an_idle_supervisor_stops_at_once_with_the_database_gone(conn, start, server_dsn):
    # Nothing held, nothing to write back: only its own row is left, which the console shows as stale.
    sup = start(procs=2)
    sup.wait_ready()
    wait_for(lambda: conn.execute("SELECT count(*) FROM jobsup.supervisors").fetchone()[0] == 1)
    name = conn.info.dbname
    conn.close()
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        sup.wait_log("db.unavailable")
        stopped = time.monotonic()
        sup.signal(signal.SIGTERM)
        code = sup.process.wait(30)
        took = time.monotonic() - stopped
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    assert code == 0, sup.log()
    assert took < 10, (took, sup.log())  # it used to wait out the outcome deadline: 47 s by default
    assert "shutdown.row_left" in sup.log()


def test_a_loop_that_fails_stops_the_supervisor_instead_of_leaving_it_half_alive(conn, start):
    # A table the claim statement cannot find is no lost connection: the claim loop ends with the error.
    sup = start(procs=2)
    sup.wait_ready()
    workers = sup.workers()
    conn.execute("ALTER TABLE jobsup.jobs RENAME TO jobs_elsewhere")
    try:
        code = sup.process.wait(30)  # the poll (500 ms here) runs the claim that fails, at the latest
    finally:
        conn.execute("ALTER TABLE jobsup.jobs_elsewhere RENAME TO jobs")
    assert code == 1, sup.log()
    # Which loop meets the missing table first (the claim, the listener's look at upcoming jobs, the
    # reaper) is up to the scheduler; the promise is that one failed, is named, and stops it all.
    failed = [line for line in sup.log().splitlines() if "supervisor.failed" in line]
    assert len(failed) == 1 and re.search(r"the \w+ loop failed: ", failed[0]), sup.log()
    assert "does not exist" in failed[0], sup.log()
    wait_for(lambda: not any(alive(w) for w in workers), timeout=10, message="its workers gone with it")


def sup_dsn(server_dsn: str, name: str) -> str:
    from psycopg import conninfo

    return conninfo.make_conninfo(server_dsn, dbname=name)


def test_a_table_that_grows_a_thousandfold_under_stale_statistics_keeps_its_leases(conn, start):
    # A table never analyzed, statements prepared while it was tiny (psycopg prepares after five runs),
    # and a supervisor whose locked_by no statistics have seen: the plans that once read the whole
    # table per outcome written.
    sup = start("--lease", "2s", procs=4)
    sup.wait_ready()
    for n in range(1, 41):
        client.enqueue(conn, "ok")
        wait_for(lambda n=n: done_count(conn) == n, message=f"job {n}")
    enqueue_kinds(conn, ["ok"] * 20_000)
    wait_for(lambda: done_count(conn) == 20_040, timeout=90, message="20,000 more")
    log = sup.log()
    assert "lease.lost" not in log and "reaped" not in log, log[-2000:]
    assert {r[0] for r in conn.execute("SELECT attempts FROM jobsup.jobs")} == {1}
