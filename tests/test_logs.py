"""What the supervisor's log says about the events it caused itself: its own kills, a server that went
away under it, a job's last failed attempt. Each line must say what happened, once, in the log's format."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import warnings

import psycopg
import pytest

from jobsup import client
from jobsup.db import embedded
from jobsup.supervisor.log import EventLog, capture_warnings, route

from .helpers import ROOT, wait_for
from .supervisor_helpers import enqueue_kinds, status_counts

pytestmark = pytest.mark.slow  # every test runs a real supervisor


def records(log: str) -> list[dict]:
    """Every line of a --log-format json log, each a JSON object; a line that is not fails the test."""
    parsed = []
    for line in log.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise AssertionError(f"a line outside the log format: {line!r}\n{log[-3000:]}") from None
        assert isinstance(record, dict) and "action" in record, line
        parsed.append(record)
    return parsed


def busy_workers(conn) -> int:
    row = conn.execute("SELECT workers FROM jobsup.supervisors").fetchone()
    return sum(w["state"] == "busy" for w in row[0]) if row else 0


def test_workers_killed_by_a_second_ctrl_c_are_logged_as_stopped_not_as_a_possible_oom(conn, start):
    ids = client.enqueue_many(conn, [dict(kind="sleep", payload={"seconds": 30})] * 2)
    sup = start("--log-format", "json", procs=2)
    wait_for(lambda: busy_workers(conn) == 2, message="both jobs running in a worker")
    pids = sorted(w.pid for w in sup.workers())
    sup.signal(signal.SIGINT)
    sup.wait_log("shutdown.started")
    sup.signal(signal.SIGINT)
    assert sup.process.wait(20) == 130, sup.log()
    lines = records(sup.log())
    assert "out of memory" not in sup.log(), sup.log()
    assert not [r for r in lines if r["action"] in ("worker.died", "worker.start_failed")], sup.log()
    stopped = [r for r in lines if r["action"] == "worker.stopped"]
    assert sorted(r["pid"] for r in stopped) == pids, sup.log()  # each worker it killed, and why
    assert {r["cause"] for r in stopped} == {"stopped at once (second Ctrl-C)"}, stopped
    interrupted = [r for r in lines if r["action"] == "job.interrupted"]
    assert sorted(r["job"] for r in interrupted) == sorted(ids)
    assert {r["reason"] for r in interrupted} == {"interrupted: stopped at once (second Ctrl-C)"}
    rows = conn.execute("SELECT status, attempts FROM jobsup.jobs").fetchall()
    assert rows == [("queued", 0), ("queued", 0)]  # handed back, attempt given back


@pytest.mark.parametrize("pooler", ["none", "transaction"])
def test_every_line_keeps_the_log_format_when_the_server_stops_under_the_supervisor(conn, start, pg_data_dir, pooler):
    # psycopg logs through `logging` on its own ("error ignored terminating <AsyncPipeline [BAD]>");
    # those lines must come through the supervisor's log, not as raw lines on stderr. The claims go
    # through a pipeline behind a pooler, the latency figures ride one with an outcome write.
    if pg_data_dir is None:
        pytest.skip("stops the embedded server; JOBSUP_TEST_DSN names another")
    dsn = conn.info.dsn
    enqueue_kinds(conn, ["ok"] * 30_000)
    sup = start("--log-format", "json", "--log-level", "debug", "--pooler", pooler, procs=2)
    wait_for(lambda: status_counts(conn).get("done", 0) > 500, timeout=30, message="work under way")
    conn.close()
    embedded.restart(pg_data_dir)  # a fast stop ends every connection; then it starts again
    sup.wait_log("db.lost")
    sup.wait_log("db.reconnected")
    with psycopg.connect(dsn, autocommit=True) as fresh:
        before = status_counts(fresh).get("done", 0)
        wait_for(lambda: status_counts(fresh).get("done", 0) > before, timeout=30, message="work resumes")
    assert sup.stop() == 0, sup.log()[-3000:]
    lines = records(sup.log())
    assert lines[-1]["action"] == "shutdown.done"
    # Whether a claim's pipeline was in flight when the server closed it is a race, so driver lines may
    # or may not be there; those that are come from psycopg, and what it ignored while a lost connection
    # went on up to the supervisor adds nothing to db.lost. The routing itself is tested in-process below.
    driver = [r for r in lines if r["action"] == "db.driver"]
    assert all(r["logger"].startswith("psycopg") for r in driver), driver
    assert all(r["level"] == "debug" for r in driver if r["message"].startswith("error ignored")), driver


def test_the_drivers_logging_comes_out_as_lines_of_the_supervisors_log():
    stream = io.StringIO()
    route(EventLog("json", "debug", stream), "psycopg", "db.driver")
    try:
        logging.getLogger("psycopg.pool").warning("pool %s is full", "claims")
        logging.getLogger("psycopg").warning("error ignored terminating %r: the connection is lost", "pipe")
        logging.getLogger("psycopg").warning("bad %d format", "x")  # arguments that do not fit
    finally:
        logging.getLogger("psycopg").handlers.clear()
        logging.getLogger("psycopg").propagate = True
    lines = records(stream.getvalue())
    assert [(r["action"], r["level"], r["logger"]) for r in lines] == [
        ("db.driver", "warning", "psycopg.pool"),
        ("db.driver", "debug", "psycopg"),  # a second error while cleaning up after the first
        ("db.driver", "warning", "psycopg"),
    ]
    assert [r["message"] for r in lines] == [
        "pool claims is full",
        "error ignored terminating 'pipe': the connection is lost",
        "bad %d format",
    ]


def test_the_last_attempt_of_a_job_is_logged_dead_and_not_also_failed(conn, start):
    # The same error on each attempt, so job.failed folds them into one run of its own.
    job_id = client.enqueue(conn, "needs_field", {}, max_attempts=3)
    sup = start("--log-format", "json")
    wait_for(lambda: status_counts(conn).get("dead") == 1, timeout=30, message="the job dead")
    assert sup.stop() == 0
    lines = [r for r in records(sup.log()) if r.get("kind") == "needs_field"]
    failed = [r for r in lines if r["action"] == "job.failed"]
    dead = [r for r in lines if r["action"] == "job.dead"]
    # Attempts 1 and 2 failed, and the job retried; attempt 3 made it dead: one line each way.
    assert sum(r.get("more", 1) for r in failed) == 2, lines
    assert [(r["job"], r["attempt"]) for r in dead] == [(job_id, 3)], lines
    assert all(r["attempt"] < 3 for r in failed if "attempt" in r), lines


def test_tracing_asked_for_without_opentelemetry_is_one_line_of_the_log(conn, start, tmp_path):
    # A stand-in package first on the path: `import opentelemetry` fails, as where it is not installed.
    shim = tmp_path / "opentelemetry"
    shim.mkdir()
    (shim / "__init__.py").write_text("raise ImportError(\"No module named 'opentelemetry'\")\n")
    path = os.pathsep.join([str(tmp_path), str(ROOT)])
    sup = start("--log-format", "json", env={"JOBSUP_OTEL": "1", "PYTHONPATH": path})
    sup.wait_ready()
    enqueue_kinds(conn, ["ok"] * 4)  # each worker runs a job: where tracing would start
    wait_for(lambda: status_counts(conn).get("done") == 4, 30, message=f"4 jobs done\n{sup.log()}")
    assert sup.stop() == 0
    lines = [r for r in records(sup.log()) if r["action"] == "otel.unavailable"]
    assert len(lines) == 1 and lines[0]["level"] == "warning", sup.log()
    assert "opentelemetry-api" in lines[0]["reason"] and lines[0]["variable"] == "JOBSUP_OTEL"
    assert "RuntimeWarning" not in sup.log()


def test_a_python_warning_of_the_supervisor_is_a_line_of_its_log():
    out = io.StringIO()
    log = EventLog("json", stream=out)
    before = warnings.showwarning
    try:
        capture_warnings(log)
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("a library's deprecation", DeprecationWarning, stacklevel=1)
    finally:
        warnings.showwarning = before
    [record] = records(out.getvalue())
    assert (record["action"], record["level"], record["category"]) == (
        "python.warning",
        "warning",
        "DeprecationWarning",
    )
    assert record["message"] == "a library's deprecation" and record["at"].startswith(__file__), record
