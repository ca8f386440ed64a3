"""Handlers for the control tests (tests/test_control.py, tests/test_testing.py): the handler verbs, a
job that fails twice, one that always fails, and jobs that record when they started."""

from __future__ import annotations

import os
import time

import psycopg

from jobsup import App, Discard, Job, RetryAfter, Snooze

app = App()

_conn: psycopg.Connection | None = None


def record(job: Job) -> None:
    """(job id, attempt, pid, clock) into the table `calls`, which the test creates."""
    global _conn
    dsn = os.environ.get("JOBSUP_RECORD_DSN")
    if not dsn:
        return
    if _conn is None or _conn.closed:
        _conn = psycopg.connect(dsn, autocommit=True)
    _conn.execute("INSERT INTO calls (job_id, attempt, pid) VALUES (%s, %s, %s)", (job.id, job.attempts, os.getpid()))


@app.handler("snoozer")
def snoozer(job: Job) -> None:
    """Snoozes `times` times for `seconds` each, then is done; saves what it saw in its return value."""
    record(job)
    payload = job.payload or {}
    if job.snoozes < int(payload.get("times", 1)):
        raise Snooze(float(payload.get("seconds", 0.05)))
    return {"snoozes": job.snoozes, "errors": len(job.errors), "attempts": job.attempts}


@app.handler("rate_limited")
def rate_limited(job: Job) -> None:
    record(job)
    if job.attempts == 1:
        raise RetryAfter(float((job.payload or {}).get("seconds", 0.3)), "HTTP 429")


@app.handler("discarded")
def discarded(job: Job) -> None:
    record(job)
    raise Discard("address bounced")


@app.handler("bad_snooze")
def bad_snooze(job: Job) -> None:
    raise Snooze(-1)


@app.handler("twice")
def twice(job: Job) -> None:
    """Fails its first two attempts, then is done; returns the errors it was shown."""
    if job.attempts <= 2:
        raise RuntimeError(f"twice: attempt {job.attempts} fails")
    return [e["error"] for e in job.errors]


@app.handler("broken")
def broken(job: Job) -> None:
    raise RuntimeError("broken: always fails")


@app.handler("ok")
def ok(job: Job) -> None:
    pass


@app.handler("sleep")
def sleep(job: Job) -> None:
    record(job)
    time.sleep(float((job.payload or {}).get("seconds", 1)))


@app.handler("tick")
def tick(job: Job) -> None:
    """A 1 ms job that records when it started."""
    record(job)
    time.sleep(0.001)


@app.handler("crash")
def crash(job: Job) -> None:
    os._exit(3)


@app.handler("capped", max_snoozes=2)
def capped(job: Job) -> None:
    raise Snooze(0.01)


@app.handler("stubborn")
def stubborn(job: Job) -> None:
    """Ignores SIGTERM and sleeps for an hour: only SIGKILL ends it."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    record(job)
    time.sleep(3600)


@app.handler("lingering", timeout=0.3)
def lingering(job: Job) -> None:
    """Ignores SIGTERM and outlives its timeout, but ends within the kill grace (2 s)."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    record(job)
    time.sleep(float(job.payload.get("seconds", 1.0)))
