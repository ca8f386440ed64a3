"""Handlers of the supervisor benchmark (`jobsup bench` and benchmarks/bench_supervisor.py)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import time

import psycopg

from jobsup.app import App
from jobsup.db import dsn as dsns
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.job import Job

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
        _conn = dsns.connect(os.environ["JOBSUP_BENCH_DSN"])  # JOBSUP_POOLER says whether it may prepare
    _conn.execute(SQL["bench_pickup_started"], {"job_id": job.id, "started": started})


# Jobs that wait (an HTTP call, a mail provider) share their worker processes: `jobsup bench` and
# benchmarks/bench_wait.py run them on a supervisor of their own, so the app of the figures above stays
# one whose every job runs alone.
wait_app = App()


@wait_app.handler("wait_100ms", shared=True)
async def wait_100ms(job: Job) -> None:
    await asyncio.sleep(0.05)
    if job.payload and job.payload.get("crash"):  # benchmarks/bench_wait.py: the stream with crashes
        ctypes.string_at(0)
    await asyncio.sleep(0.05)


@wait_app.handler("wait_100ms_sync", shared=True)
def wait_100ms_sync(job: Job) -> None:
    time.sleep(0.1)


# An app of both classes: its no-op jobs run alone beside the shared ones (benchmarks/bench_wait.py's
# mixed run), each class claimed in a statement of its own.
mixed_app = App()
mixed_app.handler("noop")(noop)
mixed_app.handler("wait_100ms", shared=True)(wait_100ms)
