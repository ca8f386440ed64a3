"""`jobsup check`: the design's three alerts without Prometheus. Each threshold crossed is one line; a
cron job or a Kubernetes probe pages on the exit code.

- the oldest ready job's age, per queue (a backlog nobody works, or too few workers);
- the number of dead jobs (handlers failing for good);
- jobs the reapers returned in the last minute (supervisors dying, or handlers outliving their lease).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from jobsup.db.sql import STATEMENTS as SQL
from jobsup.db.sql import one_row
from jobsup.durations import format_age, format_duration

MAX_OLDEST_AGE = 300.0  # seconds; the default of --max-oldest-age


@dataclass(frozen=True)
class Limits:
    """Where each alert fires; 0 (or None for the counts) turns it off."""

    max_oldest_age: float = MAX_OLDEST_AGE
    max_dead: int | None = None
    max_reaped_per_min: int | None = None
    queue: str | None = None  # narrows the oldest age and the dead count; reaping is counted for all queues


@dataclass(frozen=True)
class Crossed:
    check: str  # oldest_age, dead or reaped_per_min: the flag's name
    value: float
    threshold: float
    message: str
    queue: str | None = None


@dataclass(frozen=True)
class Result:
    crossed: list[Crossed]
    oldest_ready: dict[str, float]  # queue -> age (s) of its oldest ready job
    dead: int
    reaped_last_minute: int

    @property
    def exit_code(self) -> int:
        return 1 if self.crossed else 0

    def summary(self) -> str:
        oldest = max(self.oldest_ready.values(), default=None)
        return (
            f"ok: oldest ready job {format_age(oldest) if oldest is not None else '-'}, "
            f"{self.dead} dead, {self.reaped_last_minute} reaped in the last minute"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": not self.crossed,
            "crossed": [asdict(c) for c in self.crossed],
            "oldest_ready": self.oldest_ready,
            "dead": self.dead,
            "reaped_last_minute": self.reaped_last_minute,
        }


def shown(seconds: float) -> str:
    """A duration threshold as the user would write it.

    >>> shown(300.0), shown(90.0), shown(0.5), shown(7200.0)
    ('5m', '90s', '500ms', '2h')
    """
    if 60 <= seconds < 3600 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return format_duration(seconds)


def judge(limits: Limits, oldest_ready: dict[str, float], dead: int, reaped: int) -> Result:
    """The thresholds crossed by these figures.

    >>> r = judge(Limits(max_dead=10), {"default": 400.0, "mail": 3.0}, dead=12, reaped=0)
    >>> [c.message for c in r.crossed]
    ['queue default: oldest ready job is 6m40s old, over --max-oldest-age 5m', '12 dead jobs, over --max-dead 10']
    >>> judge(Limits(max_oldest_age=0, max_reaped_per_min=5), {"default": 1e6}, 0, 6).crossed[0].message
    '6 jobs reaped in the last minute, over --max-reaped-per-min 5'
    """
    crossed = []
    if limits.max_oldest_age:
        for queue, age in sorted(oldest_ready.items()):
            if age > limits.max_oldest_age:
                crossed.append(
                    Crossed(
                        "oldest_age",
                        age,
                        limits.max_oldest_age,
                        f"queue {queue}: oldest ready job is {format_age(age)} old, over "
                        f"--max-oldest-age {shown(limits.max_oldest_age)}",
                        queue,
                    )
                )
    where = f" in queue {limits.queue}" if limits.queue else ""
    if limits.max_dead is not None and dead > limits.max_dead:
        crossed.append(
            Crossed(
                "dead",
                dead,
                limits.max_dead,
                f"{dead} dead jobs{where}, over --max-dead {limits.max_dead}",
                limits.queue,
            )
        )
    if limits.max_reaped_per_min is not None and reaped > limits.max_reaped_per_min:
        crossed.append(
            Crossed(
                "reaped_per_min",
                reaped,
                limits.max_reaped_per_min,
                f"{reaped} jobs reaped in the last minute, over --max-reaped-per-min {limits.max_reaped_per_min}",
            )
        )
    return Result(crossed, oldest_ready, dead, reaped)


def check(conn: psycopg.Connection, limits: Limits) -> Result:
    """Read the three figures (a few index pages, whatever the jobs table holds) and judge them."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(SQL["oldest_ready"])
        oldest = {
            row["queue"]: row["age"] for row in cur.fetchall() if limits.queue is None or row["queue"] == limits.queue
        }
        cur.execute(SQL["check_figures"], {"queue": limits.queue})
        row = one_row(cur.fetchone(), "check_figures")
    return judge(limits, oldest, row["dead"], row["reaped_last_minute"])
