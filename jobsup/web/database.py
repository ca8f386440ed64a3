"""The web console's connection to the database: one async connection per process, shared by the
refresh and the pages, one conversation at a time; lost, it is opened again on the next call after a
backoff, and meanwhile every call raises DatabaseUnavailable for the page to show as a banner."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeVar

import psycopg

from jobsup.db import dsn as dsns
from jobsup.errors import BadInput, DatabaseUnavailable, JobsupError, first_line

T = TypeVar("T")

APPLICATION_NAME = "jobsup web"  # how its sessions are named in pg_stat_activity
STATEMENT_TIMEOUT_MS = 5000  # a page waits no longer than this for a statement
CONNECT_TIMEOUT = 3  # seconds
MAX_BACKOFF = 5.0  # seconds between attempts to reconnect, doubling from 0.5 up to this


class Database:
    def __init__(self, dsn: str) -> None:
        dsns.check(dsn)
        self.dsn = dsn
        self._conn: psycopg.AsyncConnection | None = None
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failures = 0
        self._next_attempt = 0.0
        self._last_error = ""

    @property
    def label(self) -> str:
        """The database as a page may name it: never its password."""
        return dsns.redact(self.dsn)

    def _this_loop(self) -> asyncio.Lock:
        # A lock and a connection belong to one event loop; a test client may run each request on a
        # loop of its own, and then the connection of a loop that is gone is dropped, not reused.
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._lock is None:
            self._loop, self._lock, self._conn = loop, asyncio.Lock(), None
        return self._lock

    async def _connection(self) -> psycopg.AsyncConnection:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        if time.monotonic() < self._next_attempt:
            raise DatabaseUnavailable(self._last_error)
        try:
            self._conn = await psycopg.AsyncConnection.connect(
                self.dsn,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT,
                application_name=APPLICATION_NAME,
                # Custom plans: a generic plan cached while the queue was empty would serve it full too.
                options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c plan_cache_mode=force_custom_plan",
                prepare_threshold=dsns.prepare_threshold(),  # none through a transaction-mode pooler
            )
        except psycopg.OperationalError as exc:
            self._failed(dsns.describe_connect_error(self.dsn, exc))
        self._failures = 0
        assert self._conn is not None
        return self._conn

    def _failed(self, message: str) -> NoReturn:
        self._failures += 1
        self._next_attempt = time.monotonic() + min(MAX_BACKOFF, 0.5 * 2 ** (self._failures - 1))
        self._last_error = message
        raise DatabaseUnavailable(message)

    async def run(self, work: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T:
        """`work(conn)` on the shared connection; DatabaseUnavailable when the server cannot be reached,
        JobsupError for another database error (its first line, no password)."""
        async with self._this_loop():
            conn = await self._connection()
            try:
                return await work(conn)
            except (BadInput, JobsupError):
                raise
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                if conn.closed or conn.broken:
                    self._conn = None
                    try:
                        await conn.close()
                    except psycopg.Error:
                        pass
                    self._failed(f"lost the connection to {self.label}: {dsns.redact(first_line(exc))}")
                raise DatabaseUnavailable(f"{self.label}: {dsns.redact(first_line(exc))}") from None
            except psycopg.Error as exc:
                raise JobsupError(f"database error: {dsns.redact(first_line(exc))}") from None

    async def write(self, work: Callable[[psycopg.Connection], T]) -> T:
        """A synchronous operation (a change of limits may wait seconds for older writers) on a
        connection of its own, in a thread, so the pages are not held up."""
        return await dsns.in_thread(self.dsn, work, APPLICATION_NAME)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            await conn.close()
