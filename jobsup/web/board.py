"""The shared refresh: the figures every page of the overview kind shows, read at most once per
interval per process, whatever the number of open pages. A page, or a live poll, asks for the board;
the first to find it older than the interval reads it again (one read-only transaction), and everyone
asking meanwhile waits for that same read. Nobody asking: no query at all.

The figures are those of `jobsup top`, read through the same functions of jobsup.ops."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from jobsup.errors import DatabaseUnavailable, JobsupError
from jobsup.ops import cron
from jobsup.ops.cron import ScheduleState
from jobsup.ops.health import ahealth_warning
from jobsup.ops.snapshot import Snapshot, arows, asnapshot
from jobsup.ops.unserved import STALE_AFTER, Unserved
from jobsup.ops.workflows import Progress, arecent
from jobsup.web.database import Database

REFRESH = 1.0  # seconds a board is served before it is read again
DEAD_LISTED = 50  # dead jobs and dead groups on the board
WORKFLOWS_LISTED = 20


@dataclass(frozen=True)
class Board:
    snapshot: Snapshot
    done_last_minute: int
    health: str | None
    unserved: list[Unserved]
    schedules: list[ScheduleState]
    workflows: list[Progress]
    read_at: float  # time.monotonic() of the read
    # Changes when a count, a pause, a limit, a schedule or a workflow's progress does (not with the
    # ages alone): the pages of one job or one workflow read again only then.
    version: str


def _version(snap: Snapshot, schedules: list[ScheduleState], workflows: list[Progress]) -> str:
    facts: dict[str, Any] = {
        "kinds": [vars(k) for k in snap.kinds],
        "paused": [row["queue"] for row in snap.paused_queues],
        "limits": [k.to_json() for k in snap.limits],
        "dead": [row.get("id") for row in snap.dead_jobs],
        "schedules": [(s.name, s.paused, s.last_job_id) for s in schedules],
        "workflows": [tuple(p) for p in workflows],
    }
    text = json.dumps(facts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


async def _read(conn: psycopg.AsyncConnection) -> Board:
    # One transaction, so the figures agree with each other, and the server counts one commit a read.
    async with conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        snap = await asnapshot(conn, dead_limit=DEAD_LISTED)
        (done,) = await arows(conn, "console_done_last_minute")
        health = await ahealth_warning(conn)
        unserved = [Unserved(**row) for row in await arows(conn, "unserved", stale_after=STALE_AFTER)]
        schedules = await cron.alist_schedules(conn)
        workflows = await arecent(conn, WORKFLOWS_LISTED)
    return Board(
        snapshot=snap,
        done_last_minute=done["count"],
        health=health,
        unserved=unserved,
        schedules=schedules,
        workflows=workflows,
        read_at=time.monotonic(),
        version=_version(snap, schedules, workflows),
    )


class Boards:
    """The one board of a process, and the one read that renews it."""

    def __init__(self, db: Database, refresh: float = REFRESH) -> None:
        self.db = db
        self.refresh = refresh
        self.board: Board | None = None
        self.error: str | None = None  # why the last read failed; None once one succeeds again
        self.reads = 0  # how many reads this process made: the tests and the benchmark count them
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _fresh(self) -> bool:
        return self.board is not None and time.monotonic() - self.board.read_at < self.refresh

    async def current(self) -> Board:
        """The board, read again if it is older than the interval; DatabaseUnavailable (or JobsupError)
        when it cannot be read, `self.board` keeping the last one read."""
        if self._fresh() and self.error is None:
            assert self.board is not None
            return self.board
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._lock is None:
            self._loop, self._lock = loop, asyncio.Lock()
        async with self._lock:
            if self._fresh() and self.error is None:  # read by whoever held the lock before us
                assert self.board is not None
                return self.board
            try:
                self.reads += 1
                self.board = await self.db.run(_read)
            except (DatabaseUnavailable, JobsupError) as exc:
                self.error = str(exc)
                raise
            self.error = None
            return self.board
