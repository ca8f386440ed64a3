"""`jobsup check`: the design's three alerts without Prometheus. Each threshold crossed is one line; a
cron job or a Kubernetes probe pages on the exit code.

- the oldest ready job's age, per queue (a backlog nobody works, or too few workers);
- the number of dead jobs (handlers failing for good);
- jobs the reapers returned in the last minute (supervisors dying, or handlers outliving their lease);
- ready jobs that no live supervisor can run (their kind handled by no app serving their queue);
- ready jobs of a limited kind throttled too long (its limits hold them back longer than expected).

A paused queue's backlog is paused on purpose: its line says so, and `skip_paused` leaves it out.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from jobsup.db.sql import STATEMENTS as SQL
from jobsup.db.sql import one_row
from jobsup.durations import format_age, format_duration
from jobsup.ops.snapshot import THROTTLED_COUNTED, LimitedKind, limited_kinds
from jobsup.ops.unserved import Unserved, unserved

MAX_OLDEST_AGE = 300.0  # seconds; the default of --max-oldest-age
MAX_UNSERVED_AGE = 300.0  # seconds; the default of --max-unserved-age


@dataclass(frozen=True)
class Limits:
    """Where each alert fires; 0 (or None for the counts) turns it off."""

    max_oldest_age: float = MAX_OLDEST_AGE
    max_dead: int | None = None
    max_reaped_per_min: int | None = None
    max_unserved_age: float = MAX_UNSERVED_AGE
    max_throttled_age: float | None = None  # per limited kind, whatever the queue
    queue: str | None = None  # narrows the oldest age, the dead count and unserved jobs; reaping is counted for all
    skip_paused: bool = False  # leave paused queues out of the oldest age


@dataclass(frozen=True)
class Crossed:
    check: str  # oldest_age, dead, reaped_per_min, unserved_age or throttled_age: the flag's name
    value: float
    threshold: float
    message: str
    queue: str | None = None
    kind: str | None = None  # throttled_age's: the limited kind


@dataclass(frozen=True)
class Result:
    crossed: list[Crossed]
    oldest_ready: dict[str, float]  # queue -> age (s) of its oldest ready job
    dead: int
    reaped_last_minute: int
    unserved: list[Unserved] = field(default_factory=list)
    paused: list[str] = field(default_factory=list)
    limited: list[LimitedKind] = field(default_factory=list)  # the kinds with a limit in force

    @property
    def exit_code(self) -> int:
        return 1 if self.crossed else 0

    def summary(self) -> str:
        oldest = max(self.oldest_ready.values(), default=None)
        return (
            f"ok: oldest ready job {format_age(oldest) if oldest is not None else '-'}, "
            f"{self.dead} dead, {self.reaped_last_minute} reaped in the last minute"
        ) + self._throttled_summary()

    def _throttled_summary(self) -> str:
        ages = [k.throttled_age for k in self.limited if k.throttled_age is not None]
        return f", oldest throttled job {format_age(max(ages))}" if ages else ""

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": not self.crossed,
            "crossed": [asdict(c) for c in self.crossed],
            "oldest_ready": self.oldest_ready,
            "dead": self.dead,
            "reaped_last_minute": self.reaped_last_minute,
            "unserved": [u.to_json() for u in self.unserved],
            "paused": self.paused,
            "limits": [k.to_json() for k in self.limited],
        }


def shown(seconds: float) -> str:
    """A duration threshold as the user would write it.

    >>> shown(300.0), shown(90.0), shown(0.5), shown(7200.0)
    ('5m', '90s', '500ms', '2h')
    """
    if 60 <= seconds < 3600 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return format_duration(seconds)


def judge(
    limits: Limits,
    oldest_ready: dict[str, float],
    dead: int,
    reaped: int,
    unserved: Sequence[Unserved] = (),
    paused: Collection[str] = (),
    limited: Sequence[LimitedKind] = (),
) -> Result:
    """The thresholds crossed by these figures.

    >>> r = judge(Limits(max_dead=10), {"default": 400.0, "mail": 3.0}, dead=12, reaped=0)
    >>> [c.message for c in r.crossed]
    ['queue default: oldest ready job is 6m40s old, over --max-oldest-age 5m', '12 dead jobs, over --max-dead 10']
    >>> judge(Limits(max_oldest_age=0, max_reaped_per_min=5), {"default": 1e6}, 0, 6).crossed[0].message
    '6 jobs reaped in the last minute, over --max-reaped-per-min 5'
    >>> judge(Limits(), {"other": 720.0}, 0, 0, paused=["other"]).crossed[0].message
    'queue other (paused): oldest ready job is 12m00s old, over --max-oldest-age 5m'
    >>> judge(Limits(skip_paused=True), {"other": 720.0}, 0, 0, paused=["other"]).crossed
    []
    >>> print(judge(Limits(max_oldest_age=0), {}, 0, 0, [Unserved("mix", "c", 3, 400.0)]).crossed[0].message)
    queue mix: 3 ready jobs of kind c that no live supervisor can run, the oldest for 6m40s, over --max-unserved-age 5m
    >>> from jobsup import limits as kind_limits
    >>> charge = LimitedKind("charge", kind_limits.Limits(concurrency=3), held=3, throttled=1204, throttled_age=400.0)
    >>> [line] = [c.message for c in judge(Limits(max_throttled_age=60.0), {}, 0, 0, limited=[charge]).crossed]
    >>> print(line.replace(", the", ",\\nthe"))
    kind charge: 1,204 jobs throttled by its limits (concurrency 3, 3 held),
    the oldest for 6m40s, over --max-throttled-age 1m
    """
    crossed = []
    if limits.max_oldest_age:
        for queue, age in sorted(oldest_ready.items()):
            if queue in paused and limits.skip_paused:
                continue
            if age > limits.max_oldest_age:
                note = " (paused)" if queue in paused else ""
                crossed.append(
                    Crossed(
                        "oldest_age",
                        age,
                        limits.max_oldest_age,
                        f"queue {queue}{note}: oldest ready job is {format_age(age)} old, over "
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
    if limits.max_unserved_age:
        for u in unserved:
            if u.age > limits.max_unserved_age:
                message = f"{u.describe()}, over --max-unserved-age {shown(limits.max_unserved_age)}"
                crossed.append(Crossed("unserved_age", u.age, limits.max_unserved_age, message, u.queue))
    most = limits.max_throttled_age
    if most:
        crossed += [throttled(k, most) for k in limited if k.throttled_age is not None and k.throttled_age > most]
    return Result(crossed, oldest_ready, dead, reaped, list(unserved), sorted(paused), list(limited))


def throttled(kind: LimitedKind, threshold: float) -> Crossed:
    """The line of a limited kind whose oldest throttled job has waited longer than `threshold`."""
    age = kind.throttled_age or 0.0
    jobs = "job" if kind.throttled == 1 and not kind.throttled_capped else "jobs"
    message = (
        f"kind {kind.kind}: {kind.throttled_text} {jobs} throttled by its limits ({kind.limits}, {kind.held} held), "
        f"the oldest for {format_age(age)}, over --max-throttled-age {shown(threshold)}"
    )
    return Crossed("throttled_age", age, threshold, message, kind=kind.kind)


def check(conn: psycopg.Connection, limits: Limits) -> Result:
    """Read the figures and judge them. The unserved jobs read every ready job once; the others a few
    index pages, whatever the jobs table holds."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(SQL["oldest_ready"])
        oldest = {
            row["queue"]: row["age"] for row in cur.fetchall() if limits.queue is None or row["queue"] == limits.queue
        }
        cur.execute(SQL["check_figures"], {"queue": limits.queue})
        row = one_row(cur.fetchone(), "check_figures")
        cur.execute(SQL["queue_pauses"])
        paused = [r["queue"] for r in cur.fetchall()]
        cur.execute(SQL["limited_kinds"], {"counted": THROTTLED_COUNTED + 1})
        limited = limited_kinds(cur.fetchall())
    stranded = [u for u in unserved(conn) if limits.queue is None or u.queue == limits.queue]
    return judge(limits, oldest, row["dead"], row["reaped_last_minute"], stranded, paused, limited)
