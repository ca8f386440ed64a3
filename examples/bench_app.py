"""Handlers of the supervisor benchmark (benchmarks/bench_supervisor.py)."""

from __future__ import annotations

import os
import time

import psycopg

from jobsup import App, Job

app = App()
_conn: psycopg.Connection | None = None


@app.handler("noop")
def noop(job: Job) -> None:
    pass


@app.handler("sleep_1ms")
def sleep_1ms(job: Job) -> None:
    time.sleep(0.001)


@app.handler("pickup")
def pickup(job: Job) -> None:
    """Write when the handler started, for the pickup latency from the enqueuer's commit."""
    started = time.time()
    global _conn
    if _conn is None:
        _conn = psycopg.connect(os.environ["JOBSUP_BENCH_DSN"], autocommit=True)
    _conn.execute("INSERT INTO bench_pickup (job_id, started) VALUES (%s, %s)", (job.id, started))
