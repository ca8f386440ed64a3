"""A limited kind whose jobs share worker processes, for the tests of limits with shared jobs: each run
writes its start and end to `limit_runs` (tests/apps/limited.py's table, JOBSUP_LIMITS_DSN) with the
database's clock, through a small pool of each worker, so a test counts overlapping runs."""

from __future__ import annotations

import asyncio
import os

from psycopg_pool import AsyncConnectionPool

from jobsup import App, Job

app = App()
_pool: AsyncConnectionPool | None = None


@app.on_worker_start
async def open_pool() -> None:
    global _pool
    _pool = AsyncConnectionPool(
        os.environ["JOBSUP_LIMITS_DSN"], min_size=1, max_size=12, kwargs={"autocommit": True}, open=False
    )
    await _pool.open()


@app.handler("ten_shared", shared=True, concurrency=10, max_attempts=100)
async def ten_shared(job: Job) -> None:
    assert _pool is not None
    async with _pool.connection() as conn:
        await conn.execute(
            "INSERT INTO limit_runs (job_id, attempt, kind, key, pid) VALUES (%s, %s, %s, %s, %s)"
            " ON CONFLICT DO NOTHING",
            (job.id, job.attempts, job.kind, job.key, os.getpid()),
        )
    await asyncio.sleep(float(job.payload.get("seconds", 0.05)))
    async with _pool.connection() as conn:
        await conn.execute(
            "UPDATE limit_runs SET ended = clock_timestamp() WHERE job_id = %s AND attempt = %s",
            (job.id, job.attempts),
        )
