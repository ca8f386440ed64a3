"""Handlers whose jobs share worker processes, for the tests of jobs that wait: each run writes its start
and its end to the table `wait_runs` (JOBSUP_RECORD_DSN) with the database's clock, through a pool each
worker opens once in its start function, so a test counts runs and overlaps from the records.

Payload: {"seconds": how long it waits, "crash": "segfault" | "exit" | "block" | "ignore_cancel"}.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import time
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from jobsup import App, Job

app = App()

SCHEMA = """
CREATE TABLE IF NOT EXISTS wait_runs (
    run      bigserial   PRIMARY KEY,
    job_id   bigint      NOT NULL,
    attempt  integer     NOT NULL,
    kind     text        NOT NULL,
    pid      integer     NOT NULL,
    started  timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended    timestamptz
)
"""

_pool: AsyncConnectionPool | None = None
_sync_pool: ConnectionPool | None = None
STARTED: list[str] = []  # what the start functions did in this process, for the tests of the hooks


@app.on_worker_start
async def open_pool() -> None:
    global _pool, _sync_pool
    dsn = os.environ.get("JOBSUP_RECORD_DSN")
    if dsn:
        # Small: 4 connections serve hundreds of jobs a process, each holding one for a statement.
        _pool = AsyncConnectionPool(dsn, min_size=1, max_size=4, kwargs={"autocommit": True}, open=False)
        await _pool.open()
        _sync_pool = ConnectionPool(dsn, min_size=1, max_size=4, kwargs={"autocommit": True}, open=True)
    STARTED.append("async")


@app.on_worker_stop
async def close_pool() -> None:
    if _pool is not None:
        await _pool.close()
    if _sync_pool is not None:
        _sync_pool.close()


async def _record(job: Job, seconds: float, action: Any) -> None:
    run = None
    if _pool is not None:
        async with _pool.connection() as conn:
            cur = await conn.execute(
                "INSERT INTO wait_runs (job_id, attempt, kind, pid) VALUES (%s, %s, %s, %s) RETURNING run",
                (job.id, job.attempts, job.kind, os.getpid()),
            )
            row = await cur.fetchone()
            run = row[0] if row else None
    await action(seconds)
    if _pool is not None and run is not None:
        async with _pool.connection() as conn:
            await conn.execute("UPDATE wait_runs SET ended = clock_timestamp() WHERE run = %s", (run,))


def _crash(how: str | None) -> None:
    if how == "segfault":
        ctypes.string_at(0)
    elif how == "exit":
        os._exit(9)


async def _wait(job: Job) -> None:
    payload = job.payload or {}
    seconds = float(payload.get("seconds", 0.1))
    how = payload.get("crash")

    async def action(seconds: float) -> None:
        if how == "block":
            time.sleep(seconds)  # a sync call inside an async def: the whole loop stops
            return
        if how == "ignore_cancel":
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                try:
                    await asyncio.sleep(end - time.monotonic())
                except asyncio.CancelledError:
                    continue
            return
        await asyncio.sleep(seconds / 2)
        _crash(how)
        await asyncio.sleep(seconds / 2)

    await _record(job, seconds, action)


@app.handler("wait", shared=True, max_attempts=3, timeout=30)
async def wait(job: Job) -> None:
    await _wait(job)


@app.handler("wait_short", shared=True, max_attempts=3, timeout=0.5)
async def wait_short(job: Job) -> None:
    await _wait(job)


@app.handler("wait_limited", shared=True, concurrency=10, max_attempts=100)
async def wait_limited(job: Job) -> None:
    await _wait(job)


@app.handler("wait_capped", shared=True, per_process=3)
async def wait_capped(job: Job) -> None:
    await _wait(job)


@app.handler("wait_sync", shared=True, max_attempts=3)
def wait_sync(job: Job) -> None:
    seconds = float((job.payload or {}).get("seconds", 0.1))
    run = None
    if _sync_pool is not None:
        with _sync_pool.connection() as conn:
            row = conn.execute(
                "INSERT INTO wait_runs (job_id, attempt, kind, pid) VALUES (%s, %s, %s, %s) RETURNING run",
                (job.id, job.attempts, job.kind, os.getpid()),
            ).fetchone()
            run = row[0] if row else None
    time.sleep(seconds)
    if _sync_pool is not None and run is not None:
        with _sync_pool.connection() as conn:
            conn.execute("UPDATE wait_runs SET ended = clock_timestamp() WHERE run = %s", (run,))


@app.handler("alone")
def alone(job: Job) -> None:
    time.sleep(float((job.payload or {}).get("seconds", 0.05)))
    if _sync_pool is not None:
        with _sync_pool.connection() as conn:
            conn.execute(
                "INSERT INTO wait_runs (job_id, attempt, kind, pid, ended) VALUES (%s, %s, %s, %s, clock_timestamp())",
                (job.id, job.attempts, job.kind, os.getpid()),
            )


def setup(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
