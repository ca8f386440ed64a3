"""Handlers with limits for the tests of limits across supervisors: each run writes its start and its
end to the table `limit_runs` through a connection of its own (JOBSUP_LIMITS_DSN), with the database's
clock, so a test counts overlapping runs and starts per window from the records, never from logs.

A handler's run lies inside its job's hold (from the claim to the outcome write), so runs that overlap
more than a limit would mean holds that did.
"""

from __future__ import annotations

import os
import time

import psycopg

from jobsup import App, Job

app = App()
_conn: psycopg.Connection | None = None

SCHEMA = """
CREATE TABLE IF NOT EXISTS limit_runs (
    job_id    bigint      NOT NULL,
    attempt   integer     NOT NULL,
    kind      text        NOT NULL,
    key       text,
    pid       integer     NOT NULL,
    started   timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended     timestamptz,
    PRIMARY KEY (job_id, attempt)
)
"""


def _conn_() -> psycopg.Connection:
    global _conn
    if _conn is None or _conn.closed:
        _conn = psycopg.connect(os.environ["JOBSUP_LIMITS_DSN"], autocommit=True)
    return _conn


def _run(job: Job) -> None:
    conn = _conn_()
    conn.execute(
        "INSERT INTO limit_runs (job_id, attempt, kind, key, pid) VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
        (job.id, job.attempts, job.kind, job.key, os.getpid()),
    )
    time.sleep(float(job.payload.get("seconds", 0.05)))
    conn.execute(
        "UPDATE limit_runs SET ended = clock_timestamp() WHERE job_id = %s AND attempt = %s", (job.id, job.attempts)
    )


@app.handler("three", concurrency=3, max_attempts=100)
def three(job: Job) -> None:
    _run(job)


@app.handler("per_key", key_concurrency=1, max_attempts=100)
def per_key(job: Job) -> None:
    _run(job)


@app.handler("account", key_concurrency=1, key=lambda payload: payload["account"], max_attempts=100)
def account(job: Job) -> None:
    _run(job)


@app.handler("wide", concurrency=50, max_attempts=100)  # a limit far above what the workers can hold
def wide(job: Job) -> None:
    _run(job)


@app.handler("rated", rate="100/s", max_attempts=100)
def rated(job: Job) -> None:
    _run(job)


@app.handler("key_rated", key_rate="10/s", max_attempts=100)
def key_rated(job: Job) -> None:
    _run(job)


@app.handler("free", max_attempts=100)
def free(job: Job) -> None:
    _run(job)


@app.handler("fair", concurrency=8, max_attempts=100)
def fair(job: Job) -> None:
    """Limited only so that keys take turns in claim_limited: 8 is every worker of the fairness test."""
    _run(job)
