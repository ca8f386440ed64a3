"""The supervisor's connection (jobsup/supervisor/link.py) against a real server: a statement the server
rolls back for a deadlock is run again on the same connection, so many times, then on a new one."""

from __future__ import annotations

import asyncio
import io

import psycopg

from jobsup.supervisor.link import ROLLBACK_RETRIES, Link
from jobsup.supervisor.log import EventLog

# Raised by the server with a deadlock's SQLSTATE, as a real deadlock reaches the client.
DEADLOCK = "DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END $$"


def run_with_deadlocks(dsn: str, deadlocks: int) -> tuple[list[int], str, object]:
    stream = io.StringIO()
    link = Link(dsn, "writes", EventLog(stream=stream), {})
    backends: list[int] = []

    async def op(conn: psycopg.AsyncConnection) -> str:
        backends.append(conn.info.backend_pid)
        if len(backends) <= deadlocks:
            await conn.execute(DEADLOCK)
        return "written"

    async def main() -> object:
        try:
            return await link.run(op)
        except psycopg.errors.DeadlockDetected as exc:
            return exc
        finally:
            await link.close()

    result = asyncio.run(main())
    return backends, stream.getvalue(), result


def test_a_deadlocked_write_runs_again_on_the_same_connection(dsn):
    backends, log, result = run_with_deadlocks(dsn, 2)
    assert result == "written"
    assert len(backends) == 3 and len(set(backends)) == 1  # not reconnected: the connection was sound
    assert log.count("db.rolled_back") == 2 and "db.lost" not in log


def test_a_write_that_keeps_deadlocking_is_run_on_a_new_connection_after_the_retries(dsn):
    backends, log, result = run_with_deadlocks(dsn, ROLLBACK_RETRIES + 1)
    assert result == "written"
    assert len(set(backends[: ROLLBACK_RETRIES + 1])) == 1 and backends[-1] != backends[0]
    assert log.count("db.rolled_back") == ROLLBACK_RETRIES and log.count("db.lost") == 1
