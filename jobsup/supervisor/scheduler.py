"""The scheduler duty: enqueues the fires of the app's schedules (app.every), on time, exactly once.

Every supervisor of the app runs one, and none leads. A schedule is fired in one transaction that locks
its row: the fires in (fired_through, now()] are enqueued and fired_through moves to now(), so whichever
supervisor takes the lock next finds them done (docs/design/architecture.md: work identified by the database needs no
turn-taking). Every decision uses the database's clock: the scheduler sleeps until the next fire as that
clock tells it, measured at each pass, so hosts whose clocks disagree still fire together.

Missed fires: on a scheduler's first pass (and its first after the database came back), fires that fell
due while no supervisor watched the schedule are handled by its policy (latest, none, all). If another
live supervisor fired or watched it lately, the fires due are that supervisor's on-time ones, which this
one reached first, and are all enqueued.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from jobsup import client
from jobsup.db.notify import SchedulePaused
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.errors import first_line
from jobsup.job import JobSpec
from jobsup.schedule import Schedule
from jobsup.supervisor.config import Config
from jobsup.supervisor.keeper import Keeper
from jobsup.supervisor.link import Link
from jobsup.supervisor.log import EventLog
from jobsup.supervisor.wakeup import Wakeup

# Most fires one pass enqueues when it is on time (a supervisor stalled by a long database outage).
ON_TIME_CAP = 1000
# The scheduler wakes a little after a fire's time by the database's clock, so the pass that wakes finds
# it due rather than a fraction of a millisecond early.
WAKE_MARGIN = 0.002
# Another supervisor counts as watching a schedule when it touched it and beat within this many seconds
# (or three of this supervisor's heartbeats, if longer).
ALIVE_AFTER = 5.0


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


def unique_key(name: str, fire: datetime) -> str:
    """The unique key of a fire's job.

    >>> unique_key("report", datetime(2026, 3, 29, 1, 0, tzinfo=UTC))
    'cron:report:2026-03-29T01:00:00+00:00'
    """
    return f"cron:{name}:{_iso(fire)}"


def choose(schedule: Schedule, due: list[datetime], catch_up: bool) -> list[datetime]:
    """The fires to enqueue of those due: all when on time, else what the missed-fire policy says."""
    if not catch_up:
        return due
    if schedule.missed == "none":
        return []
    if schedule.missed == "latest":
        return due[-1:]
    return due[-schedule.missed_limit :]


class Scheduler:
    name = "schedule"

    def __init__(self, config: Config, log: EventLog, me: str, keeper: Keeper, link: Link) -> None:
        self.config = config
        self.log = log
        self.me = me
        self.keeper = keeper
        self.link = link
        self.wakeup = Wakeup()
        self.offset = 0.0  # database clock minus the loop's clock, in seconds
        self.alive = max(ALIVE_AFTER, 3 * config.heartbeat_interval)
        self.touch_every = min(1.0, config.heartbeat_interval)
        self._conn: psycopg.AsyncConnection | None = None  # the connection of the last pass
        # Per schedule, (a watermark it has reached, the next fire after it): no fire lies between, so
        # when that fire is due it alone is, and one statement can take it (schedule_fire_next).
        self.expected: dict[str, tuple[datetime, datetime]] = {}

    def notified(self, message: SchedulePaused) -> None:
        """A schedule was paused or resumed: a pass over every schedule now."""
        self.wakeup.set()

    def _db_now(self) -> float:
        return asyncio.get_running_loop().time() + self.offset

    def _clock(self, clock: datetime, sent: float) -> None:
        received = asyncio.get_running_loop().time()
        self.offset = clock.timestamp() - (sent + received) / 2

    async def run(self) -> None:
        while not self.keeper.ever_ready:  # the schedules come with the first worker that loaded the app
            await asyncio.sleep(0.05)
        schedules = {s.name: s for s in self.keeper.schedules}
        if not schedules:
            return
        await self.link.run(lambda c: self._declare(c, list(schedules.values())))
        self.log("scheduler.started", schedules=sorted(schedules))
        due_at: dict[str, float | None] = {name: None for name in schedules}  # None: a pass at once
        catch_up = set(schedules)
        next_touch = 0.0
        loop = asyncio.get_running_loop()
        while True:
            if self._conn is not None and (self._conn.closed or self._conn is not self.link.conn):
                catch_up = set(schedules)  # the database came back: what fell due meanwhile was missed
            for name, schedule in schedules.items():
                at = due_at[name]
                if at is None or at <= self._db_now():
                    due_at[name] = await self._fire_safely(schedule, catch_up)
            if loop.time() >= next_touch:
                await self._touch(list(schedules))
                next_touch = loop.time() + self.touch_every
            soonest = min([at for at in due_at.values() if at is not None], default=self._db_now() + 60)
            wait = min(soonest - self._db_now() + WAKE_MARGIN, next_touch - loop.time())
            if await self.wakeup.wait(max(0.0, wait)):
                due_at = dict.fromkeys(due_at)  # a pause or resume: look at every schedule now

    async def _declare(self, conn: psycopg.AsyncConnection, schedules: list[Schedule]) -> None:
        async with conn.transaction():
            for s in schedules:
                await conn.execute(
                    SQL["schedule_declare"],
                    {
                        "name": s.name,
                        "kind": s.kind,
                        "expression": s.expression,
                        "tz": s.tz,
                        "payload": Jsonb(s.payload or {}),
                        "queue": s.queue,
                        "priority": s.priority,
                        "max_attempts": s.max_attempts,
                        "missed": s.missed,
                    },
                )

    async def _touch(self, names: list[str]) -> None:
        sent = asyncio.get_running_loop().time()
        try:
            rows = await self.link.run(lambda c: self._fetch(c, "schedule_touch", {"me": self.me, "names": names}))
        except psycopg.Error as exc:
            self.log("scheduler.error", "error", error=first_line(exc))
            return
        if rows:
            self._clock(rows[0][0], sent)

    @staticmethod
    async def _fetch(conn: psycopg.AsyncConnection, name: str, params: dict[str, Any]) -> list[tuple]:
        cur = await conn.execute(SQL[name], params)
        return await cur.fetchall()

    async def _fire_safely(self, schedule: Schedule, catch_up: set[str]) -> float:
        """One pass; the next fire's time by the database's clock (epoch seconds). A pass that fails is
        tried again a second later, still as a catch-up pass if it was one."""
        try:
            next_fire = await self.link.run(lambda c: self._fire(c, schedule, schedule.name in catch_up))
            catch_up.discard(schedule.name)
            return next_fire
        except psycopg.Error as exc:
            self.log("scheduler.error", "error", schedule=schedule.name, error=first_line(exc))
            return self._db_now() + 1.0

    def _payload(self, schedule: Schedule, fire: datetime) -> dict[str, Any]:
        return {**(schedule.payload or {}), "schedule": schedule.name, "fire_at": _iso(fire)}

    async def _fire(self, conn: psycopg.AsyncConnection, schedule: Schedule, catch_up: bool) -> float:
        self._conn = conn
        loop = asyncio.get_running_loop()
        expected = self.expected.get(schedule.name)
        if expected is not None and not catch_up:
            reached, fire = expected
            next_fire = schedule.next_fire(fire)
            sent = loop.time()
            cur = await conn.execute(
                SQL["schedule_fire_next"],
                {
                    "name": schedule.name,
                    "prev": reached,
                    "fire": fire,
                    "next_fire": next_fire,
                    "me": self.me,
                    "kind": schedule.kind,
                    "payload": json.dumps(self._payload(schedule, fire)),
                    "queue": schedule.queue,
                    "priority": schedule.priority,
                    "max_attempts": schedule.max_attempts,
                    "unique_key": unique_key(schedule.name, fire),
                },
            )
            row = await cur.fetchone()
            if row is not None:
                job_id, clock = row
                self._clock(clock, sent)
                self.expected[schedule.name] = (fire, next_fire)
                self.log("schedule.fired", "debug", schedule=schedule.name, fire_at=_iso(fire), job=job_id)
                return next_fire.timestamp()
            # Not ours to take (another supervisor did, or it is paused, or not yet due): the full pass.
        async with conn.transaction():
            sent = loop.time()
            cur = await conn.execute(SQL["schedule_lock"], {"name": schedule.name, "me": self.me, "alive": self.alive})
            row = await cur.fetchone()
            if row is None:  # removed by hand while we ran: declared again, fired at the next pass
                await self._declare(conn, [schedule])
                return self._db_now()
            fired_through, paused, now, clock, watched = row
            self._clock(clock, sent)
            due, _ = schedule.due(fired_through, now, ON_TIME_CAP)
            late = catch_up and not watched
            fires = [] if paused else choose(schedule, due, late)
            ids = await client.aenqueue_many(
                conn,
                [
                    JobSpec(
                        schedule.kind,
                        self._payload(schedule, fire),
                        queue=schedule.queue,
                        priority=schedule.priority,
                        max_attempts=schedule.max_attempts,
                        unique_key=unique_key(schedule.name, fire),
                    )
                    for fire in fires
                ],
            )
            next_fire = schedule.next_fire(now)
            enqueued = [(fire, job_id) for fire, job_id in zip(fires, ids, strict=True) if job_id is not None]
            await conn.execute(
                SQL["schedule_fired"],
                {
                    "name": schedule.name,
                    "me": self.me,
                    "through": now,
                    "next_fire": next_fire,
                    "last_fire": enqueued[-1][0] if enqueued else None,
                    "last_job_id": enqueued[-1][1] if enqueued else None,
                },
            )
        self.expected[schedule.name] = (now, next_fire)
        if late and due:
            self.log(
                "schedule.missed",
                schedule=schedule.name,
                policy=schedule.missed,
                missed=len(due),
                enqueued=len(enqueued),
                through=_iso(now),
            )
        for fire, job_id in enqueued:
            self.log("schedule.fired", "debug", schedule=schedule.name, fire_at=_iso(fire), job=job_id)
        if paused and due:
            self.log("schedule.paused", "debug", schedule=schedule.name, skipped=len(due))
        return next_fire.timestamp()
