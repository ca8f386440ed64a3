"""The handler of the chaos run (tests/chaos.py): each run writes its start and its finish to the table
`chaos_runs`, through a connection of its own (JOBSUP_CHAOS_DSN), so the run can count handler runs
against attempts and look for runs of one job that overlapped.

A database that is down (a killed backend, a server restart) is waited for: the handler's bookkeeping
must not turn chaos into failed attempts, which would hide what the run is after.
"""

from __future__ import annotations

import os
import random
import time
import uuid

import psycopg

from jobsup import App, Job

app = App()
_conn: psycopg.Connection | None = None
PATIENCE = 60.0  # seconds the handler waits for the database before it gives up (and fails the attempt)


def _write(sql: str, params: tuple) -> None:
    global _conn
    deadline = time.monotonic() + PATIENCE
    while True:
        try:
            if _conn is None or _conn.closed:
                _conn = psycopg.connect(os.environ["JOBSUP_CHAOS_DSN"], autocommit=True, connect_timeout=5)
            _conn.execute(sql, params)
            return
        except psycopg.OperationalError:
            _conn = None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@app.handler("chaos", max_attempts=1000)
def chaos(job: Job) -> None:
    run = str(uuid.uuid4())  # one per handler run: a retried write of the same run is not a second run
    # The supervisor is the leader of the process group its workers belong to.
    _write(
        "INSERT INTO chaos_runs (run, job_id, attempt, supervisor) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (run) DO NOTHING",
        (run, job.id, job.attempts, os.getpgrp()),
    )
    time.sleep(random.uniform(0.005, 0.05))
    _write("UPDATE chaos_runs SET finished = coalesce(finished, clock_timestamp()) WHERE run = %s", (run,))
