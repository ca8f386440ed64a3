"""A supervisor's connection that survives the database going away: it reconnects with backoff.

Each task of the supervisor (claims, outcome writes, housekeeping, the listener) has its own, so a slow
reaper pass never delays an outcome write, and a statement in flight is never shared.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg
from psycopg.types.string import TextLoader

from jobsup.db.dsn import describe_connect_error
from jobsup.errors import first_line
from jobsup.supervisor.log import EventLog

T = TypeVar("T")

# Reconnect delays grow from the first to the last, doubling.
RECONNECT_FIRST = 0.05
RECONNECT_MAX = 2.0

LOST = (psycopg.OperationalError, psycopg.InterfaceError)
# A statement the server rolled back for a deadlock is run again on its connection this many times, then
# on a new one as after any error of the connection: each time the server picks one of the writes in
# the cycle, so the next run rarely meets it.
ROLLBACK_RETRIES = 5


def _rolled_back(exc: BaseException) -> bool:
    """A deadlock or a serialization failure (SQLSTATE class 40): psycopg files these under
    OperationalError, which otherwise means a broken connection."""
    return (getattr(exc, "sqlstate", None) or "").startswith("40")


class Link:
    def __init__(
        self,
        dsn: str,
        name: str,
        log: EventLog,
        settings: dict[str, str],
        *,
        pooled: bool = False,
        json_as_text: bool = False,
    ) -> None:
        self.dsn = dsn
        self.name = name
        self.log = log
        # Through a transaction pooler a connection has no session of its own: nothing is prepared
        # on the server and no setting is sent (PgBouncer refuses the `options` startup parameter).
        self.pooled = pooled
        # Server settings of every connection this link opens, sent with the connection request.
        self.options = "" if pooled else " ".join(f"-c {key}={value}" for key, value in settings.items())
        self.conn: psycopg.AsyncConnection | None = None
        self.lost = False  # the previous connection broke; cleared by the next successful connect
        self.failed_tries = 0  # connection attempts failed in a row
        self.reconnects = 0  # connections opened after a lost one (jobsup_db_reconnects_total)
        self.lock = asyncio.Lock()  # one statement at a time on this connection
        # json and jsonb columns come back as their text, unparsed: the claims' payloads go through
        # the supervisor to the workers, which parse them in parallel (a fifth of a drain's claim time
        # in the supervisor's one thread was the parsing of payloads it never reads).
        self.json_as_text = json_as_text

    async def connect(self, *, deadline: float | None = None) -> psycopg.AsyncConnection:
        """The live connection, reconnecting (with backoff, until `deadline` on the loop's clock)."""
        if self.conn is not None and not self.conn.closed:
            return self.conn
        delay = RECONNECT_FIRST
        loop = asyncio.get_running_loop()
        while True:
            try:
                self.conn = await psycopg.AsyncConnection.connect(
                    self.dsn,
                    autocommit=True,
                    connect_timeout=5,
                    application_name=f"jobsup {self.name}",
                    options=self.options,
                    prepare_threshold=None if self.pooled else 5,
                )
                if self.json_as_text:
                    for name in ("json", "jsonb"):
                        self.conn.adapters.register_loader(name, TextLoader)
                self.failed_tries = 0
                if self.lost:
                    self.lost = False
                    self.reconnects += 1
                    self.log("db.reconnected", link=self.name)
                return self.conn
            except LOST as exc:
                self.lost = True
                self.failed_tries += 1
                # Said at once, then about once a minute while it lasts, not at every try.
                if self.failed_tries == 1 or self.failed_tries % 30 == 0:
                    self.log(
                        "db.unavailable",
                        "warning",
                        link=self.name,
                        tries=self.failed_tries,
                        error=describe_connect_error(self.dsn, exc),
                    )
                if deadline is not None and loop.time() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX)

    async def run(self, op: Callable[[psycopg.AsyncConnection], Awaitable[T]], *, deadline: float | None = None) -> T:
        """`op(conn)`, again on a new connection if the old one broke. Only for idempotent work:
        every outcome write is fenced, so applying it twice changes nothing the second time."""
        async with self.lock:
            rolled_back = 0
            while True:
                conn = await self.connect(deadline=deadline)
                try:
                    return await op(conn)
                except LOST as exc:
                    if not _rolled_back(exc) or rolled_back >= ROLLBACK_RETRIES:
                        self.drop(exc)
                        continue
                    # A deadlock (or serialization failure) rolled the statement back; the connection
                    # is sound. Outcome writes release the children of workflows, and two writes that
                    # finish parents of the same children can lock them crosswise: the server picks
                    # one to fail, and running it again completes it.
                    rolled_back += 1
                    self.log("db.rolled_back", "warning", link=self.name, tries=rolled_back, error=first_line(exc))

    def drop(self, exc: BaseException | None = None) -> None:
        if exc is not None and not self.lost:
            self.log("db.lost", "warning", link=self.name, error=first_line(exc))
        self.lost = True
        conn, self.conn = self.conn, None
        if conn is not None and not conn.closed:
            # close() of a broken async connection needs no round trip
            asyncio.get_running_loop().create_task(_close_quietly(conn))

    async def close(self) -> None:
        if self.conn is not None:
            await _close_quietly(self.conn)
            self.conn = None


async def _close_quietly(conn: psycopg.AsyncConnection) -> None:
    try:
        await conn.close()
    except Exception:
        pass
