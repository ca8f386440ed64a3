"""Operating schedules from outside the supervisor: list, run now, pause, resume (`jobsup cron`, the
console). Each in a sync and an asyncio form that share one statement, like the supervisor's (jobsup.db.lifecycle)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import psycopg

from jobsup.db.sql import Op, arun, run
from jobsup.errors import BadInput

# A schedule no supervisor has fired or touched for this long is shown as orphaned: no running app
# declares it (each running scheduler touches its schedules every second).
ORPHAN_AFTER = 10.0


class UnknownSchedule(BadInput):
    """No schedule of that name is in the database."""


@dataclass(frozen=True)
class ScheduleState:
    """A schedule as `jobsup cron` and the console show it."""

    name: str
    kind: str
    expression: str
    tz: str
    queue: str
    priority: int
    max_attempts: int
    missed: str
    paused: bool
    next_fire: datetime | None
    last_fire: datetime | None
    last_job_id: int | None
    last_status: str | None  # the status of the last fire's job, None when it is gone (pruned)
    seen_at: datetime | None
    seen_by: str | None
    state: str  # active, paused, orphaned
    now: datetime  # the database's clock when read

    def to_json(self) -> dict[str, Any]:
        fields = asdict(self)
        fields.pop("now")
        return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in fields.items()}


def _list_op() -> Op:
    return Op("schedule_list", {"orphan_after": ORPHAN_AFTER}, lambda rows: [ScheduleState(*row) for row in rows])


def list_schedules(conn: psycopg.Connection) -> list[ScheduleState]:
    return run(conn, _list_op())


async def alist_schedules(conn: psycopg.AsyncConnection) -> list[ScheduleState]:
    return await arun(conn, _list_op())


def _one(name: str) -> Callable[[list[tuple]], Any]:
    def parse(rows: list[tuple]) -> Any:
        if not rows:
            raise UnknownSchedule(f"no schedule named {name!r} (jobsup cron lists them)")
        return rows[0][0]

    return parse


def _run_op(name: str) -> Op:
    return Op("schedule_run", {"name": name}, _one(name))


def run_now(conn: psycopg.Connection, name: str) -> int:
    """Enqueue one job of the schedule now, outside its fire times; its id."""
    return run(conn, _run_op(name))


async def arun_now(conn: psycopg.AsyncConnection, name: str) -> int:
    return await arun(conn, _run_op(name))


def _pause_op(name: str, paused: bool) -> Op:
    return Op("schedule_pause", {"name": name, "paused": paused}, lambda rows: bool(_one(name)(rows)))


def set_paused(conn: psycopg.Connection, name: str, paused: bool) -> bool:
    """Pause or resume a schedule; False when it already was so. Every supervisor obeys at its next
    fire, which reads the flag in the transaction that would enqueue it."""
    return run(conn, _pause_op(name, paused))


async def aset_paused(conn: psycopg.AsyncConnection, name: str, paused: bool) -> bool:
    return await arun(conn, _pause_op(name, paused))
