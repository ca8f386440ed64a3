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
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from jobsup.db.sql import STATEMENTS as SQL
from jobsup.errors import DatabaseUnavailable, JobsupError
from jobsup.ops import schedules as schedule_ops
from jobsup.ops.health import health_line
from jobsup.ops.latency import summarize
from jobsup.ops.schedules import ScheduleState
from jobsup.ops.snapshot import (
    THROTTLED_COUNTED,
    KindCounts,
    Snapshot,
    WorkflowCounts,
    counts_by_kind,
    limited_kinds,
)
from jobsup.ops.unserved import STALE_AFTER, Unserved
from jobsup.ops.workflows import Progress
from jobsup.web.database import Database

REFRESH = 1.0  # seconds a board is served before it is read again
DEAD_LISTED = 50  # dead jobs and dead groups on the board
WORKFLOWS_LISTED = 20
EVENTS_LISTED = 20  # reaper passes


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


# The board's statements, in the order _read takes them: those of jobsup.ops.snapshot that the pages show
# (not the attempts' histogram nor the expiring leases, which read every dead job, and no page shows),
# and those of the console's header, the unserved jobs, the schedules and the newest workflows.
def _statements() -> list[tuple[str, dict[str, Any]]]:
    return [
        ("live_counts", {}),
        ("kind_totals", {}),
        ("dead_jobs", {"limit": DEAD_LISTED, "match": None}),
        ("dead_groups", {"limit": DEAD_LISTED, "match": None}),
        ("supervisors", {}),
        ("recent_events", {"limit": EVENTS_LISTED}),
        ("queue_pauses", {}),
        ("latency_read", {}),
        ("limited_kinds", {"counted": THROTTLED_COUNTED + 1}),
        ("workflow_counts", {}),
        ("console_done_last_minute", {}),
        ("health", {}),
        ("unserved", {"stale_after": STALE_AFTER}),
        ("schedule_list", {"orphan_after": schedule_ops.ORPHAN_AFTER}),
        ("workflows_recent", {"limit": WORKFLOWS_LISTED}),
    ]


def _oldest_ready(live: list[dict[str, Any]]) -> dict[str, float]:
    """Each queue's oldest ready job's age, from live_counts' `oldest` (the console reads it so too).

    >>> _oldest_ready([{"queue": "a", "oldest": 3.0}, {"queue": "a", "oldest": 9.0}, {"queue": "b", "oldest": None}])
    {'a': 9.0}
    """
    ages: dict[str, float] = {}
    for row in live:
        if row.get("oldest") is not None:
            ages[row["queue"]] = max(ages.get(row["queue"], 0.0), row["oldest"])
    return ages


async def _read(conn: psycopg.AsyncConnection) -> Board:
    # One transaction, so the figures agree with each other and the server counts one commit a read;
    # sent as a pipeline, so it costs one round trip.
    cursors = []
    async with conn.pipeline(), conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        for name, params in _statements():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(SQL[name], params)
            cursors.append(cur)
    (
        live,
        totals,
        dead_jobs,
        dead_groups,
        supervisors,
        events,
        paused,
        latency,
        limits,
        (workflow_counts,),
        (done,),
        (health,),
        unserved,
        schedules,
        workflows,
    ) = [await cur.fetchall() for cur in cursors]
    kinds = [KindCounts(kind, **counts) for kind, counts in sorted(counts_by_kind(live, totals).items())]
    snap = Snapshot(
        taken_at=datetime.now(UTC),
        kinds=kinds,
        oldest_ready=_oldest_ready(live),
        dead_jobs=dead_jobs,
        dead_groups=dead_groups,
        supervisors=supervisors,
        events=events,
        paused_queues=paused,
        latency=summarize(latency),
        limits=limited_kinds(limits),
        workflows=WorkflowCounts(**workflow_counts),
    )
    states = [schedule_ops.ScheduleState(*row.values()) for row in schedules]
    progress = [Progress(*row.values()) for row in workflows]
    return Board(
        snapshot=snap,
        done_last_minute=done["count"],
        health=health_line(health),
        unserved=[Unserved(**row) for row in unserved],
        schedules=states,
        workflows=progress,
        read_at=time.monotonic(),
        version=_version(snap, states, progress),
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
